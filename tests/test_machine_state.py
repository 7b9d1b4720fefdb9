"""The machine's state at each cell's start and end (issue 23, item 6).

No GPU and no cpufreq here: a fake sysfs tree (tmp_path) stands in for /sys, and a STAND-IN
runner for ``nvidia-smi`` answers with rows in the real tool's format (clock values and reason
masks taken from an H100's samples, tests/data/h100-2026-11-25/telemetry/nvidia-smi-samples.csv).
The run loop is the real one; a fake backend (tests/backend_support.py) stands in for the
execution, as in tests/test_run_loop.py.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path

import pytest
from backend_support import META, SUMMARY, FakeBackend, Script, line
from workload_support import tiny_matrix

from orchestrator.backends.base import ExitInfo, RunOptions
from orchestrator.backends.docker import DockerBackend
from orchestrator.backends.process import ProcessBackend
from orchestrator.backends.slurm import SlurmBackend
from orchestrator.backends.ssh import SshDockerBackend
from orchestrator.local import machine_state
from orchestrator.plan.matrix import load_matrix
from orchestrator.results.folders.run_folder import CellResult, RunPaths, Status
from orchestrator.sweep import NullEvents, run_cells, run_sweep

SAMPLES = (Path(__file__).parent / "data" / "h100-2026-11-25" / "telemetry"
           / "nvidia-smi-samples.csv")


def fake_sys(root: Path, cpus: dict[int, tuple[str | None, str | None]]) -> Path:
    """A sysfs tree: cpu N -> (scaling_cur_freq in kHz, scaling_governor); None: no file."""
    for n, (freq, governor) in cpus.items():
        folder = root / "devices" / "system" / "cpu" / f"cpu{n}" / "cpufreq"
        folder.mkdir(parents=True)
        if freq is not None:
            (folder / "scaling_cur_freq").write_text(freq + "\n")
        if governor is not None:
            (folder / "scaling_governor").write_text(governor + "\n")
    (root / "devices" / "system" / "cpu" / "cpufreq").mkdir(exist_ok=True)  # not a CPU
    (root / "devices" / "system" / "cpu" / "cpu9").mkdir()  # a CPU without cpufreq
    return root


class StandInSmi:
    """Answers ``nvidia-smi --query-gpu=...`` as a driver does; ``refuses``: the fields it
    does not know (an older driver), ``raises``: what running it raises."""

    def __init__(self, rows: str, refuses: tuple[str, ...] = (),
                 raises: BaseException | None = None):
        self.rows, self.refuses, self.raises = rows, refuses, raises
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], timeout: float) -> tuple[int, str]:
        self.calls.append(argv)
        assert timeout <= 10, "a sample must not wait long for nvidia-smi"
        if self.raises is not None:
            raise self.raises
        query = next(a for a in argv if a.startswith("--query-gpu="))
        if any(f in query for f in self.refuses):
            return 2, ""
        return 0, self.rows


def h100_rows() -> str:
    """Rows as the query prints them, from an H100's recorded samples (SM clock and reason
    mask as recorded; the memory clock is the 2619 MHz that card's `nvidia-smi -q` showed, in
    tests/data/h100-2026-11-25/nvidia-smi-q.txt)."""
    with SAMPLES.open() as fh:
        rows = list(csv.DictReader(fh))
    idle = next(r for r in rows if r["clocks_event_reasons.active"].endswith("1"))
    busy = next(r for r in rows if r["clocks_event_reasons.active"].endswith("0"))
    return "".join(f"{i}, {r['clocks.sm']}, 2619, {r['clocks_event_reasons.active']}\n"
                   for i, r in enumerate((busy, idle)))


def test_cpu_frequencies_and_governors_are_summarised_from_sysfs(tmp_path):
    root = fake_sys(tmp_path, {0: ("3400000", "performance"), 1: ("1200000", "powersave"),
                               2: ("3600000", "performance"), 3: (None, "performance")})
    state = machine_state.cpu_state(root)
    assert state == {"cpus": 4, "freq_mhz": {"min": 1200.0, "median": 3400.0, "max": 3600.0},
                     "governors": {"performance": 3, "powersave": 1}}


def test_a_machine_without_cpufreq_or_nvidia_smi_records_only_the_load(tmp_path):
    state = machine_state.sample(sys_root=tmp_path / "no-sys", smi="")
    assert set(state) == {"at", "loadavg"}
    assert len(state["loadavg"]) == 3


def test_gpu_clocks_and_reasons_are_read_with_the_new_field_name():
    smi = StandInSmi(h100_rows())
    gpus = machine_state.gpu_state(smi, "/usr/bin/nvidia-smi")
    assert gpus == [
        {"index": 0, "sm_mhz": 1980, "mem_mhz": 2619,
         "clock_event_reasons": "0x0000000000000000", "reasons": []},
        {"index": 1, "sm_mhz": 1980, "mem_mhz": 2619,
         "clock_event_reasons": "0x0000000000000001", "reasons": ["gpu_idle"]},
    ]
    (argv,) = smi.calls
    assert argv == ["/usr/bin/nvidia-smi",
                    "--query-gpu=index,clocks.sm,clocks.mem,clocks_event_reasons.active",
                    "--format=csv,noheader,nounits"]


def test_an_older_driver_is_asked_for_the_throttle_reasons_field():
    smi = StandInSmi("0, 1245, 877, 0x0000000000000044\n", refuses=("clocks_event_reasons",))
    (gpu,) = machine_state.gpu_state(smi, "nvidia-smi")
    assert gpu["reasons"] == ["sw_power_cap", "hw_thermal_slowdown"]
    assert "clocks_throttle_reasons.active" in smi.calls[-1][1] and len(smi.calls) == 2


@pytest.mark.parametrize("smi", [
    StandInSmi("", raises=subprocess.TimeoutExpired(["nvidia-smi"], 5.0)),
    StandInSmi("", raises=PermissionError(13, "Permission denied")),
    StandInSmi("", refuses=("clocks",)),  # refuses both queries: a broken driver
], ids=["timeout", "not-executable", "fails"])
def test_a_failing_nvidia_smi_leaves_the_gpus_out(smi):
    assert machine_state.gpu_state(smi, "nvidia-smi") == []


def test_fields_a_gpu_does_not_report_are_left_out_and_odd_rows_skipped():
    rows = "0, [N/A], 1593, [Not Supported]\nno, such, row, here\n1, 1410, 1593, 0x100000\n"
    assert machine_state.parse_gpu_clocks(rows) == [
        {"index": 0, "mem_mhz": 1593},
        {"index": 1, "sm_mhz": 1410, "mem_mhz": 1593, "clock_event_reasons": "0x100000",
         "reasons": ["0x100000"]},
    ]


# --- the run loop records it --------------------------------------------------------------

OK_SCRIPT = Script([line(META), line(SUMMARY)], ExitInfo(code=0))


class LocalFake(FakeBackend):
    """A fake backend whose cells "run on this machine", as the process backend's do."""

    records_machine = True


def backend(write_matrix, tmp_path: Path, cls: type[FakeBackend]) -> FakeBackend:
    matrix = load_matrix(write_matrix(tiny_matrix("machine", timeout_s=60)))
    made = cls(matrix, RunPaths.create(tmp_path / "results", matrix.name),
               RunOptions(timeout_s=30, poll_interval_s=0.05), script=OK_SCRIPT)
    return made


def test_each_cell_records_the_machine_at_its_start_and_end(write_matrix, tmp_path):
    root = fake_sys(tmp_path / "sys", {0: ("2000000", "performance")})
    smi = StandInSmi(h100_rows())
    local = backend(write_matrix, tmp_path, LocalFake)
    local.sample_machine = lambda: machine_state.sample(root, smi, smi="nvidia-smi")
    (result,) = run_cells(local, local.matrix.cells[:1], NullEvents())
    assert result.status is Status.OK
    written = json.loads(local.paths.cell_result(result.cell_id).read_text())["machine"]
    assert set(written) == {"start", "end"}
    start, end = written["start"], written["end"]
    assert start["at"] <= result.started_at and end["at"] >= result.finished_at
    for state in (start, end):
        assert state["cpu"]["governors"] == {"performance": 1}
        assert [g["sm_mhz"] for g in state["gpus"]] == [1980, 1980]
        assert len(state["loadavg"]) == 3
    assert CellResult.from_json(json.loads(
        local.paths.cell_result(result.cell_id).read_text())).machine == written


def test_a_sample_that_fails_never_fails_the_cell(write_matrix, tmp_path):
    local = backend(write_matrix, tmp_path, LocalFake)

    def broken() -> dict:
        raise RuntimeError("a bug in the sampler")

    local.sample_machine = broken
    (result,) = run_cells(local, local.matrix.cells[:1], NullEvents())
    assert result.status is Status.OK and result.machine == {}


def test_backends_running_cells_elsewhere_record_no_machine(write_matrix, tmp_path):
    remote = backend(write_matrix, tmp_path, FakeBackend)
    remote.sample_machine = lambda: pytest.fail("sampled the controller for a remote cell")
    (result,) = run_cells(remote, remote.matrix.cells[:1], NullEvents())
    assert result.status is Status.OK and result.machine == {}
    assert ProcessBackend.records_machine and DockerBackend.records_machine
    assert not SshDockerBackend.records_machine and not SlurmBackend.records_machine


def test_run_json_records_the_load_at_start_and_end_and_report_says_it(write_matrix, tmp_path,
                                                                       monkeypatch, capsys):
    """A run says what else shared its machine: the load averages when it started and ended
    (run.json's ``load``), printed under the table by the sweep and by ``report``."""
    from orchestrator import sweep
    from orchestrator.cli import main
    from orchestrator.results.reports.summary import load_line

    loads = iter([[0.5, 0.42, 0.3], [2.0, 1.0, 0.55]])
    monkeypatch.setattr(sweep, "load_average", lambda: next(loads))
    monkeypatch.setattr(sweep, "git_revision", lambda: "0" * 40)  # no git process here
    matrix = load_matrix(write_matrix(tiny_matrix("machine", timeout_s=60)))
    run = sweep.open_run(matrix, "process", tmp_path / "results", None)
    try:
        outcome = sweep.finish_run(matrix, run, [], interrupted=True)
    finally:
        run.release()
    meta = json.loads(run.paths.run_meta.read_text())
    assert meta["load"] == outcome.load == {"start": [0.5, 0.42, 0.3], "end": [2.0, 1.0, 0.55]}
    line_ = ("load of the machine the sweep ran on (1, 5, 15 min averages): 0.50 0.42 0.30 at "
             "start, 2.00 1.00 0.55 at end")
    assert load_line(meta["load"]) == line_
    assert load_line(None) is None and load_line({"start": "x"}) is None  # older runs
    assert main(["report", "machine", "--results", str(tmp_path / "results")]) == 0
    assert line_ in capsys.readouterr().out


def test_result_json_machine_is_read_back_and_checked():
    base = {"cell_id": "c", "group": "g", "repeat": 1, "status": "ok"}
    assert CellResult.from_json(base).machine == {}  # written before it was recorded
    with pytest.raises(ValueError, match="machine"):
        CellResult.from_json({**base, "machine": [1, 2]})


# --- a real process-backend sweep (integration tier: it starts processes) ---------------------

#: A STAND-IN nvidia-smi (no GPU here): answers the machine-state query as the H100 of
#: tests/data/h100-2026-11-25 did (idle: gpu_idle), refuses everything else.
STANDIN_SMI = """#!/bin/sh
# STAND-IN for nvidia-smi (tests only: this machine has no GPU)
case "$*" in
  *--query-gpu=index,clocks.sm,clocks.mem,clocks_event_reasons.active*)
    echo "0, 1980, 2619, 0x0000000000000001" ;;
  *) exit 2 ;;
esac
"""


def test_a_process_sweep_records_this_machine(standin, write_matrix, tmp_path, monkeypatch):
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "nvidia-smi").write_text(STANDIN_SMI)
    (tools / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")

    matrix = load_matrix(write_matrix(standin.matrix("machine", timeout_s=60)))
    outcome = run_sweep(matrix, results_root=tmp_path / "results")
    (result,) = outcome.results
    assert result.status is Status.OK, result.reason
    written = json.loads(outcome.paths.cell_result(result.cell_id).read_text())["machine"]
    for state in (written["start"], written["end"]):
        assert len(state["loadavg"]) == 3
        assert state["gpus"] == [{"index": 0, "sm_mhz": 1980, "mem_mhz": 2619,
                                  "clock_event_reasons": "0x0000000000000001",
                                  "reasons": ["gpu_idle"]}]
        has_cpufreq = any(Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq"))
        assert ("cpu" in state) is has_cpufreq
