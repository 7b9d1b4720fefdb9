"""The workload's Gaudi modes: eager, lazy (graph) and compile, each chosen per cell.

No Gaudi exists on the project's machines, and Habana's ``habana_frameworks`` cannot be
installed here: these tests put a **stand-in** ``habana_frameworks`` package on ``sys.path`` (it
records the ``PT_HPU_LAZY_MODE`` it saw when it was imported -- the real one reads the variable
then, once -- and counts ``mark_step`` calls). They check the workload's side of the contract on
the CPU: which mode a command line and environment select, that the variable is set before
``habana_frameworks`` is imported, that ``mark_step`` runs only in lazy mode, that compiled mode
is ``torch.compile(backend="hpu_backend")``, and that the result records the mode. Whether the
real Gaudi software then behaves is untested here (it needs a Gaudi machine).
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from workload_support import workload_module

from workload.cli import main, parse_args
from workload.errors import ConfigError
from workload.output import Reporter

STAND_IN = {
    "habana_frameworks/__init__.py": "",
    "habana_frameworks/torch/__init__.py": "__version__ = '1.18.0-stand-in'\n",
    "habana_frameworks/torch/core/__init__.py": (
        "import os\n"
        "lazy_at_import = os.environ.get('PT_HPU_LAZY_MODE')\n"
        "steps = []\n"
        "def mark_step():\n"
        "    steps.append(1)\n"
    ),
}


def _forget_habana() -> None:
    for name in [m for m in sys.modules if m.split(".")[0] == "habana_frameworks"]:
        del sys.modules[name]


@pytest.fixture
def habana(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The stand-in ``habana_frameworks`` on sys.path, PT_HPU_LAZY_MODE unset."""
    for rel, text in STAND_IN.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("PT_HPU_LAZY_MODE", raising=False)
    _forget_habana()
    yield tmp_path
    _forget_habana()


device = workload_module("device")
steps = workload_module("steps")
compat = workload_module("compat")


def _core() -> ModuleType:
    import habana_frameworks.torch.core as core  # the stand-in

    return core


# --------------------------------------------------------------------------- which mode


@pytest.mark.parametrize(("requested", "compile_mode", "before", "mode", "after"), [
    ("eager", "none", None, "eager", "0"),
    ("lazy", "none", None, "lazy", "1"),
    ("compile", "none", None, "compile", "0"),
    ("compile", "default", None, "compile", "0"),
    (None, "none", None, "lazy", "1"),          # nothing said: lazy, and said explicitly
    (None, "default", None, "compile", "0"),    # --compile alone on Gaudi: compiled mode
    (None, "none", "0", "eager", "0"),          # the environment's choice is kept
    (None, "none", "1", "lazy", "1"),
    ("eager", "none", "0", "eager", "0"),
])
def test_mode_and_its_environment(device: Any, requested: str | None, compile_mode: str,
                                  before: str | None,
                                  mode: str, after: str) -> None:
    environ = {} if before is None else {"PT_HPU_LAZY_MODE": before}
    assert device.hpu_mode(requested, compile_mode, environ) == mode
    assert environ["PT_HPU_LAZY_MODE"] == after


@pytest.mark.parametrize(("requested", "compile_mode", "before", "message"), [
    ("eager", "default", None, "on Gaudi torch.compile is --hpu-mode compile"),
    ("lazy", "max-autotune", None, "--hpu-mode compile"),
    ("eager", "none", "1", "contradicts --hpu-mode eager"),
    ("lazy", "none", "0", "needs PT_HPU_LAZY_MODE=1"),
    ("compile", "none", "1", "contradicts --hpu-mode compile"),
])
def test_contradictions_are_refused(device: Any, requested: str, compile_mode: str,
                                    before: str | None,
                                    message: str) -> None:
    environ = {} if before is None else {"PT_HPU_LAZY_MODE": before}
    with pytest.raises(ConfigError, match=message):
        device.hpu_mode(requested, compile_mode, environ)


def test_hpu_mode_only_with_a_gaudi_device(torch: Any) -> None:
    with pytest.raises(ConfigError, match="--hpu-mode applies to --device hpu"):
        parse_args(["--device", "cpu", "--hpu-mode", "lazy"])
    out = io.StringIO()
    assert main(["--device", "cuda", "--hpu-mode", "eager"], stdout=out) == 2
    assert '"kind": "config"' in out.getvalue()


def test_compiled_mode_is_torch_compile_with_the_hpu_backend(torch: Any, steps: Any,
                                                             compat: Any) -> None:
    assert steps.effective_compile("none", "hpu", "compile") == "default"
    assert steps.effective_compile("default", "hpu", "compile") == "default"
    for mode in ("eager", "lazy"):
        assert steps.effective_compile("none", "hpu", mode) == "none"
    assert steps.effective_compile("max-autotune", "cuda", None) == "max-autotune"
    choice = compat.compiler("default", "hpu")
    if choice.available:  # torch.compile usable on this Python
        assert choice.factory is torch.compile
        assert dict(choice.kwargs) == {"backend": "hpu_backend"}
        assert choice.label == "torch.compile(backend=hpu_backend)"


# --------------------------------------------------------------------------- mark_step


def _train_step(mode: str | None) -> Any:
    import torch

    from workload import steps

    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return steps.eager_train_step(model, torch.nn.CrossEntropyLoss(), optimizer, None, "hpu",
                                  "fp32", mode)


@pytest.mark.parametrize(("mode", "per_train_step", "per_infer_step"), [
    ("lazy", 2, 1), ("eager", 0, 0), ("compile", 0, 0),
])
def test_mark_step_only_in_lazy_mode(torch: Any, steps: Any, habana: Path, mode: str,
                                     per_train_step: int,
                                     per_infer_step: int) -> None:
    """The steps run on CPU tensors labelled ``hpu`` (fp32: no autocast), so only the
    stand-in's mark_step is Gaudi's."""
    x, y = torch.randn(2, 4), torch.tensor([0, 2])
    step = _train_step(mode)
    step(x, y)
    step(x, y)
    assert len(_core().steps) == 2 * per_train_step
    _core().steps.clear()
    steps.eager_infer_step(torch.nn.Linear(4, 3), "hpu", "fp32", mode)(x, y)
    assert len(_core().steps) == per_infer_step


def test_no_mark_step_off_gaudi(device: Any, habana: Path) -> None:
    device.mark_step("cpu", "lazy")
    device.mark_step("cuda", "lazy")
    assert "habana_frameworks.torch.core" not in sys.modules


# --------------------------------------------------------------------------- the run


def _args(*extra: str) -> argparse.Namespace:
    return parse_args(["--arch", "resnet18", "--image-size", "32", "--batch-size", "2",
                       "--warmup", "0", "--iterations", "1", "--telemetry-interval", "0",
                       "--device", "hpu", *extra])


@pytest.mark.parametrize(("extra", "lazy"), [
    (["--hpu-mode", "eager"], "0"), (["--hpu-mode", "lazy"], "1"),
    (["--hpu-mode", "compile"], "0"), ([], "1"), (["--compile", "default"], "0"),
])
def test_the_mode_is_set_before_habana_is_imported(torch: Any, habana: Path, extra: list[str],
                                                   lazy: str) -> None:
    """The run stops where the CPU-only torch has no ``hpu`` tensors (after device setup); by
    then the stand-in has been imported and saw the mode's PT_HPU_LAZY_MODE."""
    from workload.run import run

    with pytest.raises(Exception):  # noqa: B017 - whatever this torch raises for an hpu tensor
        run(_args(*extra), Reporter(io.StringIO(), enabled=True))
    assert "habana_frameworks.torch.core" in sys.modules  # imported by the run, not by the test
    assert _core().lazy_at_import == lazy


def test_environment_records_the_gaudi_stack(device: Any, habana: Path,
                                             monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    env = device.environment("hpu", device.Dist())
    assert env["pt_hpu_lazy_mode"] == "0"
    assert env["habana_version"] == "1.18.0-stand-in"
    assert "container_release" not in env


def test_environment_records_the_ngc_release(device: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVIDIA_PYTORCH_VERSION", "23.10")
    assert device.environment("cpu", device.Dist())["container_release"] == "23.10"
