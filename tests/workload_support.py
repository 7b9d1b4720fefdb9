"""Helpers for the workload tests: run ``python -m workload`` and parse its JSON lines.

``floor_python()`` is the interpreter of the oldest supported torch/torchvision pair
(``ORCHESTRATE_FLOOR_PYTHON``; ``.ci/run`` creates that venv and exports the variable).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from service_support import unavailable

REPO = Path(__file__).resolve().parents[1]

#: Environment variable naming the floor interpreter (a venv with the floor torch/torchvision).
FLOOR_ENV = "ORCHESTRATE_FLOOR_PYTHON"

# Small and fast on a 2-core CPU: resnet18 at 32 px, batch 4.
TINY = [
    "--arch",
    "resnet18",
    "--image-size",
    "32",
    "--batch-size",
    "4",
    "--device",
    "cpu",
    "--warmup",
    "1",
    "--iterations",
    "3",
    "--workers",
    "0",
    "--telemetry-interval",
    "0",
]


@dataclass
class Result:
    """A finished run: exit status, parsed stdout lines and stderr."""

    returncode: int
    stdout: str
    stderr: str
    lines: list[dict[str, Any]] = field(default_factory=list)

    @property
    def meta(self) -> dict[str, Any]:
        """The first line, which must be the meta line."""
        assert self.lines and self.lines[0]["type"] == "meta", self.describe()
        return self.lines[0]

    @property
    def summary(self) -> dict[str, Any]:
        """The last line, which must be the summary line."""
        assert self.lines and self.lines[-1]["type"] == "summary", self.describe()
        return self.lines[-1]

    def describe(self) -> str:
        """Everything, for assertion messages."""
        return f"rc={self.returncode}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr[-4000:]}"


def workload_module(name: str) -> Any:
    """A module-scoped fixture named ``name`` that gives ``workload.<name>``, for a test module:
    ``models = workload_module("models")``. It takes the ``torch`` fixture: the module (which
    imports torch) is imported when a test first asks, never at collection, and the tests that
    take it are workload-tier."""

    @pytest.fixture(scope="module", name=name)
    def fixture(torch: Any) -> ModuleType:
        return importlib.import_module(f"workload.{name}")

    return fixture


def parse_lines(stdout: str) -> list[dict[str, Any]]:
    """Every stdout line must be a JSON object with a ``type``."""
    lines = []
    for raw in stdout.splitlines():
        obj = json.loads(raw)
        assert isinstance(obj, dict) and "type" in obj, raw
        lines.append(obj)
    return lines


def env() -> dict[str, str]:
    """Subprocess environment: one intra-op thread each (the runs share 2 cores)."""
    out = dict(os.environ)
    out["OMP_NUM_THREADS"] = "1"
    out["PYTHONPATH"] = str(REPO) + os.pathsep + out.get("PYTHONPATH", "")
    return out


def floor_python() -> str:
    """The floor interpreter; skips (fails under CI=true) when it is not set up."""
    path = os.environ.get(FLOOR_ENV, "")
    if not path:
        unavailable(
            f"{FLOOR_ENV} is not set: the floor torch/torchvision venv is missing "
            "(.ci/run creates it; see its floor_venv function)"
        )
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        unavailable(f"{FLOOR_ENV}={path} is not an executable interpreter")
    return path


class Launched:
    """A started ``python -m workload`` (or torchrun) process, by default under this
    interpreter (``python`` picks another, e.g. the floor one)."""

    def __init__(self, args: list[str], torchrun: int = 0, python: str | None = None) -> None:
        prefix = [python or sys.executable]
        if torchrun:
            prefix += [
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                str(torchrun),
            ]
        self.proc = subprocess.Popen(
            [*prefix, "-m", "workload", *args],
            cwd=REPO,
            env=env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._result: Result | None = None

    def result(self, timeout: float = 240) -> Result:
        """Wait for the process and parse its output."""
        if self._result is None:
            out, err = self.proc.communicate(timeout=timeout)
            self._result = Result(self.proc.returncode, out, err)
            self._result.lines = parse_lines(out)
        return self._result


#: The smallest real training cell, for sweeps that exercise a backend rather than the model:
#: resnet18 at 32 px, batch 2, 1 warmup + 2 iterations. Goes under
#: a matrix's [workload] table.
TINY_WORKLOAD = """\
arch = "resnet18"
image_size = 32
batch_size = 2
warmup = 1
iterations = 2
workers = 0
num_classes = 10
"""

#: :data:`TINY_WORKLOAD` with no warmup and one iteration: for sweeps whose cells only need to
#: start, run and end.
ONE_STEP_WORKLOAD = TINY_WORKLOAD.replace("warmup = 1\niterations = 2\n",
                                          "warmup = 0\niterations = 1\n")



def tiny_matrix(name: str, *, timeout_s: int | None = None) -> str:
    """A matrix named ``name`` of one :data:`TINY_WORKLOAD` cell on the ``cpu`` profile (the
    caller appends axes or a profile table)."""
    timeout = f"timeout_s = {timeout_s}\n" if timeout_s is not None else ""
    return f'[matrix]\nname = "{name}"\n{timeout}[workload]\nhardware = "cpu"\n{TINY_WORKLOAD}'
