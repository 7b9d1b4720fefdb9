"""Stand-in GPUs (tests only: no machine of this project's CI has one).

What a check needs to know of "the GPU a cell will get" on the backends that run cells here
(process, docker) comes from ``nvidia-smi``: :func:`facts` builds the parsed facts for the pure
checks (``check_matrix(..., machine=...)``), and the :func:`gpu_machine` fixture puts a STAND-IN
``nvidia-smi`` first on ``PATH`` that prints what a real one prints (the query CSV and banner
formats of ``tests/data/nvidia-smi-*``), for tests that go through the CLI or a sweep.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.catalog import gpus

#: model name as nvidia-smi prints it, memory (MiB) and a driver such a machine runs
MACHINES: dict[str, tuple[str, int, str]] = {
    "H100": ("NVIDIA H100 80GB HBM3", 81559, "580.159.04"),
    "A100": ("NVIDIA A100-SXM4-80GB", 81920, "580.159.04"),
    "V100": ("Tesla V100-SXM2-32GB", 32768, "535.104.05"),
}

_SCRIPT = """#!/bin/sh
# STAND-IN for nvidia-smi (tests only: this machine has no GPU): {count} x {name}, driver {driver}
case "$*" in
  *--query-gpu=*) {rows} ;;
  *) echo "| NVIDIA-SMI {driver}   Driver Version: {driver}   CUDA Version: {cuda}     |" ;;
esac
"""


def facts(model: str = "H100", count: int = 1, driver: str | None = None) -> gpus.HostFacts:
    """This machine's facts as ``nvidia-smi`` would give them: ``count`` GPUs of ``model``."""
    name, memory, default_driver = MACHINES[model]
    return gpus.HostFacts(
        name="localhost", reachable=True, accelerator="nvidia", driver=driver or default_driver,
        gpus=tuple(gpus.GpuInfo(i, name, memory) for i in range(count)))


#: A machine without an accelerator.
NO_GPU = gpus.HostFacts(name="localhost", reachable=True)
#: A Gaudi2 machine as hl-smi reports it (tests/data/hl-smi-query-8xgaudi2.csv).
GAUDI = gpus.HostFacts(name="localhost", reachable=True, accelerator="gaudi",
                       driver="1.18.0-524", gpus=(gpus.GpuInfo(0, "HL-225", 98304),))


def write_standin(folder: Path, model: str = "H100", count: int = 1,
                  driver: str | None = None) -> Path:
    """A STAND-IN ``nvidia-smi`` in ``folder`` (made): ``count`` GPUs of ``model`` (``Gaudi2``:
    an ``hl-smi`` with Gaudi2 cards)."""
    if model == "Gaudi2":
        driver = driver or "1.18.0-524"
        rows = "; ".join(f"echo '{i}, HL-225, 98304 MiB, {driver}'" for i in range(count))
        folder.mkdir(parents=True, exist_ok=True)
        tool = folder / "hl-smi"
        tool.write_text(f"#!/bin/sh\n# STAND-IN for hl-smi (tests only: no Gaudi here)\n{rows}\n")
        tool.chmod(0o755)
        return tool
    name, memory, default_driver = MACHINES[model]
    driver = driver or default_driver
    rows = "; ".join(f"echo '{i}, {name}, {memory}, {driver}'" for i in range(count))
    cuda = "13.0" if int(driver.split(".")[0]) >= 580 else "12.2"
    folder.mkdir(parents=True, exist_ok=True)
    tool = folder / "nvidia-smi"
    tool.write_text(_SCRIPT.format(count=count, name=name, driver=driver, rows=rows, cuda=cuda))
    tool.chmod(0o755)
    return tool


@pytest.fixture
def gpu_machine(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
                ) -> Iterator[Callable[..., Path]]:
    """``gpu_machine("V100", count=2)``: from then on this machine "has" those GPUs (a stand-in
    ``nvidia-smi`` first on PATH; the probe's cache is cleared before and after)."""

    def install(model: str = "H100", count: int = 1, driver: str | None = None) -> Path:
        folder = tmp_path_factory.mktemp("gpu-bin")
        write_standin(folder, model, count, driver)
        monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
        gpus.local_facts.cache_clear()
        return folder

    yield install
    gpus.local_facts.cache_clear()


def shipped_machine(matrix: str) -> gpus.HostFacts:
    """The machine a shipped matrix (``matrices/NAME.toml``) is meant to run on with its own
    backend, as far as the backends that run cells here ask: its GPUs (eight, as the matrices'
    largest cells need) and driver."""
    if "h100" in matrix or matrix in ("dle_vs_workload", "ngc_releases"):
        return facts("H100", count=8)
    if matrix.startswith("v100") or matrix in ("dle_vs_workload_v100", "bitfusion_vs_native"):
        return facts("V100", count=8)
    if matrix == "gaudi":
        return dataclasses.replace(GAUDI, gpus=tuple(gpus.GpuInfo(i, "HL-225", 98304)
                                                     for i in range(8)))
    return NO_GPU
