"""A fake backend for the run loop's tests: ``FakeExecution`` replays a :class:`Script` (the
output a workload would print, then how it ends) in place of a backend's real execution (a
subprocess, a container, a remote channel, a Slurm job); everything else is the real base class.

A FAKE, on purpose: the tests that use it check the base backend's run loop (log pump, timeout,
cancellation, results on disk); the backends' own tests check their real executions.
Used by tests/test_backend_contract.py, test_run_loop.py and test_telemetry_tables.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from orchestrator.backends.base import Backend, Execution, ExitInfo
from orchestrator.plan.launch import LaunchSpec
from orchestrator.plan.matrix import Cell
from orchestrator.plan.placement import Allocation

META = {"type": "meta", "env": {"device": "cpu", "torch": "2.x"}}
SUMMARY = {"type": "summary", "data": {"train.total_ips": 123.4, "world_size": 1},
           "env": {"device": "cpu", "torch": "2.x"}, "iteration_times": [0.1, 0.1]}


def line(obj: dict) -> bytes:
    """One JSON line of workload output."""
    return (json.dumps(obj) + "\n").encode()


@dataclass
class Script:
    """What the fake execution prints and how it ends (None: it runs until killed)."""

    chunks: list[bytes]
    end: ExitInfo | None


class FakeExecution(Execution):
    """Stands in for a backend's execution: replays ``script``."""

    def __init__(self, script: Script):
        self.script = script
        self.killed = False
        self.closed = False
        self._ended = threading.Event()
        if script.end is not None:
            self._ended.set()

    def output(self) -> Iterator[bytes]:
        yield from self.script.chunks
        self._ended.wait()  # the output ends when the cell does

    def wait(self, timeout: float) -> bool:
        return self._ended.wait(timeout)

    def kill(self) -> None:
        self.killed = True
        self._ended.set()

    def exit_info(self) -> ExitInfo:
        return self.script.end or ExitInfo(code=-15)  # what a killed process reports

    def close(self) -> None:
        self.closed = True


class FakeBackend(Backend):
    """A backend whose launch returns a :class:`FakeExecution` of the script it is given."""

    name = "fake"

    def __init__(self, *args, script: Script, **kwargs):
        super().__init__(*args, **kwargs)
        self.script = script
        self.executions: list[FakeExecution] = []

    def spec(self, cell: Cell, allocation: Allocation, attempt: int = 1) -> LaunchSpec:
        return LaunchSpec(cell_id=cell.id, argv=("fake-workload", "--seed", "1"), env={},
                          device="cpu", gpu_ids=allocation.gpu_ids, attempt=attempt)

    def launch(self, spec: LaunchSpec) -> Execution:
        execution = FakeExecution(self.script)
        self.executions.append(execution)
        return execution
