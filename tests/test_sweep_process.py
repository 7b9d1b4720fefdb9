"""Sweeps on the local process backend.

One true end-to-end sweep runs the real workload (CPU, a tiny model; workload tier): the run
folder's layout, real metrics in the table and summary.csv, a crashing cell recorded with its
reason while the sweep goes on. The plumbing (a timeout that kills the whole process group, an
interrupt (SIGINT / SIGTERM) that records every cell and leaves no process behind, resume) runs
the STAND-IN workload (tests/standin/, integration tier): the same lines, files and exit codes,
no torch in every cell.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from service_support import communicate_or_dump
from workload_support import tiny_matrix

from orchestrator.plan.matrix import load_matrix
from orchestrator.results.folders.run_folder import RunPaths, Status
from orchestrator.sweep import run_sweep

ROOT = Path(__file__).resolve().parents[1]

TINY = tiny_matrix("tiny", timeout_s=240)  # the real workload


def processes_mentioning(marker: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if marker in line and "ps -eo" not in line]


def test_sweep_end_to_end_with_a_failing_cell(write_matrix, tmp_path, workload_python):
    path = write_matrix(TINY + """
        [axes]
        precision = ["fp32", "bf16"]
        [[include]]
        data = "/no/such_dataset"
    """)
    matrix = load_matrix(path)
    outcome = run_sweep(matrix, results_root=tmp_path / "results")
    by_id = {r.cell_id: r for r in outcome.results}
    assert set(by_id) == {c.id for c in matrix.cells}

    ok = [r for r in outcome.results if r.status is Status.OK]
    assert len(ok) == 2
    for r in ok:
        assert r.metrics["train.total_ips"] > 0
        assert r.metrics["train.compute_ips"] >= r.metrics["train.total_ips"] * 0.5
        assert len(r.metrics["iteration_times"]) == 2
        assert r.env["torch_version"].startswith("2.")
        assert r.provenance["backend"] == "process" and r.provenance["host"]
        assert r.provenance["python"] == workload_python and r.provenance["python_version"]
        assert r.duration_s and r.duration_s > 0
        assert r.config_hash == next(c.hash for c in matrix.cells if c.id == r.cell_id)

    (bad,) = [r for r in outcome.results if r.status is not Status.OK]
    assert bad.status is Status.FAILED
    assert "/no/such_dataset" in bad.reason and "exit code" in bad.reason
    assert bad.log_tail, "a failed cell keeps the end of its log"
    assert outcome.exit_code == 1

    # the run folder is complete and self-describing
    paths = outcome.paths
    assert paths.root.parent == tmp_path / "results" / "tiny"
    for f in ("matrix.toml", "plan.json", "run.json", "summary.csv", "summary.txt"):
        assert (paths.root / f).is_file(), f
    if importlib.util.find_spec("matplotlib"):
        assert (paths.root / "summary.png").is_file()
    run = json.loads(paths.run_meta.read_text())
    assert run["counts"] == {"ok": 2, "failed": 1} and run["finished_at"]
    for r in ok:
        cell = paths.cell_dir(r.cell_id)
        for f in ("command.json", "log.txt", "metrics.jsonl", "result.json", "iterations.csv"):
            assert (cell / f).is_file(), f
        command = json.loads((cell / "command.json").read_text())
        assert command["argv"][1:3] == ["-m", "workload"]
        assert "--precision" in command["argv"]

    rows = list(csv.DictReader(paths.summary_csv.open()))
    assert len(rows) == 3
    fp32 = next(row for row in rows if row["precision"] == "fp32" and row["arch"] == "resnet18")
    assert float(fp32["images_per_s"]) == pytest.approx(
        by_id[f"{fp32['group']}-r1"].metrics["train.total_ips"])
    assert "images/s (median)" in outcome.table

    # a report rebuilt from disk alone gives the same table
    from orchestrator.results.reports.summary import write_summary

    _, table = write_summary(RunPaths(paths.root))
    assert table == outcome.table


def test_timeout_kills_the_cell_and_its_children(write_matrix, tmp_path, standin):
    """A hung cell with two children (as torchrun's ranks): all end at the timeout."""
    path = write_matrix(standin.matrix("tiny", timeout_s=6, knobs="--standin-children=2")
                        .replace("iterations = 2", "iterations = 1000000") + """
        [axes]
        gpus = [2]
    """)
    matrix = load_matrix(path)
    started = time.monotonic()
    outcome = run_sweep(matrix, results_root=tmp_path)
    (res,) = outcome.results
    assert res.status is Status.TIMEOUT
    assert "timed out after 6 s" in res.reason
    assert time.monotonic() - started < 60
    log_text = outcome.paths.cell_log(res.cell_id).read_text()
    assert "started 2 children" in log_text, "the setup is what it claims"
    time.sleep(0.5)
    assert processes_mentioning(str(outcome.paths.root)) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pattern", [r"(?P<value>)", r"(?P<value>[a-z]+)"])
def test_a_figure_pattern_matching_everywhere_still_records_the_cell(write_matrix, tmp_path,
                                                                    standin, pattern):
    """Issue 34, item 1: a [figures] regex matching at every position (or every word) of a
    cell's 1.3 MiB log held the sweep after the cell had ended, longer than its timeout, with
    no result written. Now the cell is recorded failed within seconds, its reason naming the
    first match that is no number, and the sweep ends."""
    path = write_matrix(standin.matrix("tiny", timeout_s=60, knobs="--standin-lines=40000") + f"""
        [[commands.standin.figures.regex]]
        name = "x"
        pattern = '{pattern}'
    """)
    started = time.monotonic()
    outcome = run_sweep(load_matrix(path), results_root=tmp_path)
    (res,) = outcome.results
    assert res.status is Status.FAILED and "is not a number" in res.reason, res.reason
    assert outcome.paths.cell_result(res.cell_id).is_file()
    assert outcome.paths.cell_log(res.cell_id).stat().st_size > 2**20
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_interrupt_records_every_cell_and_leaves_nothing_running(write_matrix, tmp_path, sig,
                                                                  standin):
    """SIGHUP too (a closed terminal or ssh session; it comes twice, from the kernel and the
    shell): stopped as SIGTERM stops it, not killed at once with its cell orphaned."""
    path = write_matrix(standin.matrix("tiny", timeout_s=240).replace(
        "iterations = 2", "iterations = 1000000") + """
        [axes]
        seed = [1, 2, 3]
    """)
    results = tmp_path / "results"
    proc = subprocess.Popen(  # started the way a script's `orchestrate ... &` is: SIGINT ignored
        [sys.executable, "-m", "orchestrator", "matrix", str(path), "--results", str(results)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    deadline = time.monotonic() + 60
    logs: list[Path] = []
    while time.monotonic() < deadline and not logs:
        logs = list(results.glob("tiny/*/cells/*/log.txt"))
        time.sleep(0.2)
    assert logs, "the first cell never started"
    time.sleep(2.0)
    proc.send_signal(signal.SIGUSR1)  # every thread's stack, and the sweep goes on
    time.sleep(0.5)
    proc.send_signal(sig)
    if sig == signal.SIGHUP:
        time.sleep(0.2)
        proc.send_signal(sig)
    out, err = communicate_or_dump(proc, 90)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "most recent call first" in err and "run_cells" in err
    (run_dir,) = results.glob("tiny/*")
    statuses = {p.parent.name: json.loads(p.read_text())["status"]
                for p in run_dir.glob("cells/*/result.json")}
    assert len(statuses) == 3 and set(statuses.values()) == {"cancelled"}
    assert json.loads((run_dir / "run.json").read_text())["interrupted"] is True
    time.sleep(0.5)
    assert processes_mentioning(str(run_dir)) == []
    assert os.path.exists(run_dir / "summary.csv")


def test_after_a_hangup_the_terminals_second_sighup_cannot_kill_the_stopped_sweep() -> None:
    """The handlers the sweep replaced are put back when it ends, except SIGHUP after a
    hang-up: the terminal's second SIGHUP may come after the sweep has stopped (a fast cell
    stops within the 0.2 s above), and the default handler would kill the process before its
    summary and exit 130. No signal is sent: the handler is called as Python would call it."""
    from orchestrator.cli.sweep_commands import STOP_SIGNALS, _Stopper

    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    stopper = _Stopper()
    previous = {sig: signal.signal(sig, stopper) for sig in STOP_SIGNALS}
    try:
        with pytest.raises(KeyboardInterrupt):
            stopper(signal.SIGHUP, None)
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN  # the second one, while stopping
        stopper.restore(previous)
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN  # and after the sweep ended
        assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS
                if sig != signal.SIGHUP} == {sig: h for sig, h in before.items()
                                             if sig != signal.SIGHUP}
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)

    calm = _Stopper()  # no hang-up: every handler is put back as it was
    previous = {sig: signal.signal(sig, calm) for sig in STOP_SIGNALS}
    try:
        with pytest.raises(KeyboardInterrupt):
            calm(signal.SIGTERM, None)
        calm.restore(previous)
        assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == before
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_resume_runs_only_what_did_not_end_ok(write_matrix, tmp_path, standin):
    import threading

    from orchestrator.errors import ConfigError
    from orchestrator.sweep import NullEvents

    path = write_matrix(standin.matrix("tiny", timeout_s=240) + """
        [axes]
        seed = [1, 2, 3]
    """)
    matrix = load_matrix(path)
    cancel = threading.Event()

    class StopAfterFirst(NullEvents):
        def cell_finished(self, cell, result) -> None:
            cancel.set()  # as if Ctrl-C came right after the first cell

    first = run_sweep(matrix, results_root=tmp_path, events=StopAfterFirst(), cancel=cancel)
    assert first.interrupted and first.exit_code == 130
    assert sorted(r.status.value for r in first.results) == ["cancelled", "cancelled", "ok"]
    (done,) = [r for r in first.results if r.status is Status.OK]

    again = run_sweep(matrix, results_root=tmp_path, resume="")
    assert again.paths.root == first.paths.root  # the same run folder
    assert again.exit_code == 0 and [r.status for r in again.results] == [Status.OK] * 3
    kept = next(r for r in again.results if r.cell_id == done.cell_id)
    assert kept.started_at == done.started_at  # the ok cell was not run again
    assert len(list((first.paths.root / "superseded").iterdir())) == 2  # old attempts kept
    meta = json.loads(first.paths.run_meta.read_text())
    assert meta["counts"] == {"ok": 3} and len(meta["resumed"]) == 1

    path.write_text(path.read_text().replace("iterations = 2", "iterations = 3"))
    with pytest.raises(ConfigError, match="the matrix changed since run"):
        run_sweep(load_matrix(path), results_root=tmp_path, resume=first.paths.run_id)


@pytest.mark.subprocess  # runs the nvidia-smi stand-in
def test_cells_needing_more_gpus_than_the_machine_has_are_unplaceable(
    write_matrix, tmp_path, monkeypatch, request
):
    """This machine has no GPU: a stand-in `nvidia-smi` on PATH reports two (its query format)."""
    from orchestrator.catalog import gpus

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/sh\n"
                    "echo '0, NVIDIA H100 80GB HBM3, 81559, 580.159.04'\n"
                    "echo '1, NVIDIA H100 80GB HBM3, 81559, 580.159.04'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    gpus.local_facts.cache_clear()
    request.addfinalizer(gpus.local_facts.cache_clear)  # later tests probe the real machine
    assert gpus.local_accelerator_ids("cuda") == [0, 1]

    path = write_matrix("""
        [matrix]
        name = "big"
        [workload]
        hardware = "h100"
        gpus = 4
        [hardware.h100]
        device = "cuda"
    """)
    outcome = run_sweep(load_matrix(path), results_root=tmp_path / "results")
    (res,) = outcome.results
    assert res.status is Status.UNPLACEABLE
    assert res.reason == "needs 4 GPUs but this machine has 2"
    assert outcome.exit_code == 1


def test_a_backend_that_cannot_prepare_leaves_no_run_folder_behind(write_matrix, tmp_path,
                                                                    monkeypatch):
    """Preparing failed (an image build, an unreachable inventory): nothing ran, so neither the
    run folder nor the matrix folder it made are left as an empty run."""
    from orchestrator.backends.process import ProcessBackend
    from orchestrator.errors import BuildError

    def refuse(self, cells, on_log=None):
        raise BuildError("the image could not be built")

    monkeypatch.setattr(ProcessBackend, "prepare", refuse)
    path = write_matrix(TINY)
    results = tmp_path / "results"
    with pytest.raises(BuildError):
        run_sweep(load_matrix(path), results_root=results)
    assert not (results / "tiny").exists()  # (the results index may exist: it is not a run)
