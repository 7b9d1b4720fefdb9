"""The workload on the oldest and the newest supported torch/torchvision (CPU, tiny runs).

Two interpreters: the one running the tests (the newest stack, what ``make venv`` installs) and
the floor one, ``ORCHESTRATE_FLOOR_PYTHON`` (torch 2.1.0 + torchvision 0.16.0, created by
``.ci/run``; a missing floor interpreter skips these tests, or fails them under ``CI=true``).
Under each: train and infer, fp32 and bf16, a few iterations of a tiny model, inference on a
real JPEG folder; and under the floor interpreter also the feature-detection unit tests
(``tests/test_compat_unit.py``), the DeepLearningExamples model shapes
(``tests/test_dle_models.py``) and the Gaudi mode logic (``tests/test_workload_gaudi.py``), so the
API choice of every GPU path is checked on both stacks.
The GPU paths themselves cannot run here: ``benchmarks/gpu_paths.py`` runs them on a GPU.
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from workload_support import FLOOR_ENV, REPO, TINY, Launched, Result, env, floor_python

from orchestrator.catalog import stacks

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.filterwarnings("ignore:The image decoding and encoding:DeprecationWarning"),
]

CASES = {
    "train-fp32": ["--precision", "fp32"],
    "train-bf16": ["--precision", "bf16"],
    "infer-fp32": ["--mode", "infer", "--precision", "fp32"],
    "infer-bf16": ["--mode", "infer", "--precision", "bf16"],
}
STACKS = ("running", "floor")


def _python(name: str) -> str:
    return sys.executable if name == "running" else floor_python()


@pytest.fixture(scope="module")
def jpegs(workload_python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from workload.make_dataset import make_dataset  # imports torch

    root = tmp_path_factory.mktemp("compat") / "jpegs"
    make_dataset(root, classes=3, per_class=3, size=40)
    return root


@pytest.fixture(scope="module")
def runs(jpegs: Path) -> Iterator[dict[tuple[str, str], Launched]]:
    """Every (stack, case) run, started together so their start-up overlaps."""
    started: dict[tuple[str, str], Launched] = {}
    pythons = {"running": sys.executable}
    floor = _floor_or_none()
    if floor:
        pythons["floor"] = floor
    for stack, python in pythons.items():
        for case, extra in CASES.items():
            data = ["--data", str(jpegs)] if case.startswith("infer") else []
            args = [*TINY, "--num-classes", "3", *extra, *data]
            started[(stack, case)] = Launched(args, python=python)
    yield started
    for launched in started.values():
        if launched.proc.poll() is None:
            launched.proc.kill()
            launched.proc.wait()


def _floor_or_none() -> str | None:
    try:
        return floor_python()
    except (pytest.skip.Exception, pytest.fail.Exception):
        return None


def _ok(result: Result) -> dict:
    assert result.returncode == 0, result.describe()
    assert [line["type"] for line in result.lines][-1] == "summary", result.describe()
    summary = result.summary
    assert summary["status"] == "ok"
    return summary


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("stack", STACKS)
def test_workload_runs(stack: str, case: str, runs: dict[tuple[str, str], Launched]) -> None:
    _python(stack)  # skips (fails under CI=true) without a floor interpreter
    summary = _ok(runs[(stack, case)].result(timeout=480))
    env_ = summary["env"]
    mode, precision = case.split("-")
    if stack == "floor":
        floor = stacks.floor()
        assert stacks.series(env_["torch_version"]) == stacks.series(floor["torch"])
        assert stacks.series(env_["torchvision_version"]) == stacks.series(floor["torchvision"])
    api = env_["api"]
    assert api["autocast"] == (
        "none (fp32)" if precision == "fp32" else "torch.autocast(cpu, bfloat16)"
    )
    assert api["transforms"].startswith("torchvision.transforms")
    assert api["oom_errors"] and api["compile"] == "none"
    if mode == "train":
        assert api["optimizer"] == "sgd(foreach)"
        assert math.isfinite(summary["data"]["train.loss"])
        assert summary["data"]["train.total_ips"] > 0
    else:
        assert "optimizer" not in api
        assert api["decode"] == "decode_jpeg(cpu)" and env_["decoder"] == "cpu"
        assert summary["data"]["val.total_ips"] > 0


def test_the_two_stacks_differ(floor_python: str) -> None:
    """The floor interpreter really is another stack (else the floor runs prove nothing)."""
    floor = floor_python
    code = "import torch, torchvision; print(torch.__version__, torchvision.__version__)"
    out = subprocess.run([floor, "-c", code], capture_output=True, text=True, env=env(),
                         timeout=300, check=True).stdout.split()  # fmt: skip
    import torch

    assert stacks.series(out[0]) < stacks.series(torch.__version__)
    assert stacks.series(out[0]) == stacks.series(stacks.floor()["torch"])


def test_compat_and_model_unit_tests_under_the_floor_torch(floor_python: str) -> None:
    floor = floor_python
    proc = subprocess.run(
        [floor, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/test_compat_unit.py", "tests/test_dle_models.py", "tests/test_workload_gaudi.py",
         "tests/test_workload_profiling.py"],
        cwd=REPO, capture_output=True, text=True, env=env(), timeout=540, check=False,
    )  # fmt: skip
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, f"{FLOOR_ENV}={floor}:\n{tail}"
    assert " passed" in tail and "skipped" not in tail, tail
