"""How a cell's end becomes its result (``Backend`` in backends/base.py), table-driven.

``FakeExecution`` (tests/backend_support.py) stands in for a backend's execution (a subprocess,
a container, a remote channel, a Slurm job): it replays the output a workload would print and
reports the :class:`ExitInfo` its backend would, or runs until it is killed. Everything else is
the real base class: the run loop, the log pump, the per-cell timeout, cancellation, and the
result, log and metrics written into the cell folder. No Docker, no torch: the backends' own
tests check that their executions report these ExitInfo values for real (exit codes, OOM
kills, lost hosts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from backend_support import META, SUMMARY, FakeBackend, Script, line

from orchestrator.backends.base import ExitInfo, RunOptions
from orchestrator.plan.matrix import Cell, load_matrix
from orchestrator.plan.placement import Allocation
from orchestrator.results.folders.run_folder import RunPaths, Status


@dataclass
class Case:
    name: str
    script: Script
    status: Status
    reason: str  # a fragment of the reason ("" : the reason is empty)
    timeout_s: float = 60.0
    cancel: bool = False
    metrics: dict = field(default_factory=dict)


CASES = [
    Case("ok", Script([line(META), b"a note on stderr\n", line(SUMMARY)], ExitInfo(code=0)),
         Status.OK, "", metrics={"train.total_ips": 123.4, "world_size": 1,
                                 "iteration_times": [0.1, 0.1]}),
    Case("non-zero exit, the workload's error line",
         Script([line(META), line({"type": "error", "message": "unknown arch 'x'"})],
                ExitInfo(code=2)),
         Status.FAILED, "exit code 2: unknown arch 'x'"),
    Case("non-zero exit, the log's last line",
         Script([b"Traceback (most recent call last):\n", b"RuntimeError: boom\n", b"\n"],
                ExitInfo(code=1)),
         Status.FAILED, "exit code 1: RuntimeError: boom"),
    Case("killed by a signal", Script([line(META)], ExitInfo(code=-9)),
         Status.FAILED, "killed by SIGKILL"),
    Case("out of memory", Script([line(META)], ExitInfo(code=137, oom=True)),
         Status.OOM, "killed by the out-of-memory killer"),
    Case("host lost", Script([line(META)], ExitInfo(code=None, host_lost=True,
                                                     detail="host a stopped answering")),
         Status.HOST_LOST, "host a stopped answering"),
    Case("no summary line", Script([line(META)], ExitInfo(code=0)),
         Status.FAILED, "exited 0 but printed no summary line"),
    Case("timeout", Script([line(META)], None), Status.TIMEOUT, "timed out after 0.3 s",
         timeout_s=0.3),
    Case("cancel", Script([line(META)], None), Status.CANCELLED, "the sweep was interrupted",
         cancel=True),
]


@pytest.fixture
def cell_and_paths(write_matrix, tmp_path: Path) -> tuple[Cell, object, RunPaths]:
    matrix = load_matrix(write_matrix("[workload]\nhardware = \"cpu\"\n"))
    return matrix.cells[0], matrix, RunPaths.create(tmp_path / "results", matrix.name)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_end_of_a_cell_becomes_its_result(case: Case, cell_and_paths) -> None:
    cell, matrix, paths = cell_and_paths
    options = RunOptions(timeout_s=case.timeout_s, poll_interval_s=0.05)
    if case.cancel:
        options.cancel.set()
    seen: list[str] = []
    options.output_hook = lambda cell_id, text: seen.append(text)
    backend = FakeBackend(matrix, paths, options, script=case.script)

    result = backend.run_cell(cell, Allocation.local(cell.id))

    assert result.status is case.status, result.reason
    assert case.reason in result.reason if case.reason else result.reason == ""
    assert result.metrics == case.metrics
    (execution,) = backend.executions
    assert execution.closed
    assert execution.killed == (case.status in (Status.TIMEOUT, Status.CANCELLED))
    if case.status is Status.OK:
        assert result.log_tail == [] and result.env == SUMMARY["env"]
    else:
        assert result.log_tail, "a failed cell keeps the end of its log"
    # Everything is on disk: the command, the whole log, the structured lines, the result.
    on_disk = json.loads(paths.cell_result(cell.id).read_text())
    assert on_disk["status"] == case.status.value and on_disk["reason"] == result.reason
    assert json.loads(paths.cell_command(cell.id).read_text())["argv"][0] == "fake-workload"
    log_text = paths.cell_log(cell.id).read_text()
    assert log_text.startswith("# fake-workload --seed 1\n")
    assert log_text.endswith(b"".join(case.script.chunks).decode())
    assert seen == b"".join(case.script.chunks).decode().splitlines()
    structured = [x for x in log_text.splitlines()[1:] if x.startswith("{")]
    if structured:
        assert paths.cell_metrics(cell.id).read_text().splitlines() == structured
    else:
        assert not paths.cell_metrics(cell.id).exists()
    assert result.duration_s is not None and result.exit_code == execution.exit_info().code
