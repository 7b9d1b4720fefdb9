"""The machine's truth in the checks (orchestrator/backends/gpu_checks.py, catalog/torch_builds.py):
the torch that runs a cell against the GPU it gets, decided before the sweep.

This machine has no GPU: the GPUs here are stand-ins (tests/gpu_support.py: the parsed facts of
an ``nvidia-smi`` that reports them). The torch builds are real: this venv's torch 2.14.1+cu130
and, where CI made it, the floor venv's torch 2.1.0+cu121, read from their files and compared
with what an imported torch says of itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpu_support import GAUDI, NO_GPU, facts

from orchestrator.backends.checks import check_matrix
from orchestrator.catalog import torch_builds
from orchestrator.catalog.torch_builds import TorchBuild, arch_runs, read_build
from orchestrator.errors import Requirement
from orchestrator.plan import software
from orchestrator.plan.matrix import load_matrix

#: torch 2.14.1+cu130's list, as torch.cuda.get_arch_list() gives it (measured here)
NEW = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")
#: torch 2.1.0+cu121's list (the floor venv)
FLOOR = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90")


# --- reading a build without importing it ----------------------------------------------------


def fake_torch(root: Path, version: str, cuda: str | None, flags: bytes | None) -> Path:
    """A torch package folder as a wheel lays it out: version.py and the Python extension
    library, which carries the arch flags among other bytes."""
    pkg = root / "torch"
    (pkg / "lib").mkdir(parents=True)
    (pkg / "version.py").write_text(
        "from typing import Optional\n"
        f"__version__ = {version!r}\ndebug = False\ncuda: Optional[str] = {cuda!r}\n"
        "hip: Optional[str] = None\n")
    body = b"\x7fELF" + os.urandom(4096) + b"\x00" + (flags or b"") + b"\x00" + os.urandom(512)
    (pkg / "lib" / "libtorch_python.so").write_bytes(body)
    return pkg


@pytest.mark.parametrize("start", [0, 100, (1 << 20) - 30, (1 << 20) - 3, 1 << 20,
                                   (1 << 20) + 7, 2 * (1 << 20) - 5])
def test_an_arch_list_is_read_whole_wherever_the_chunks_cut_the_library(tmp_path: Path,
                                                                       start: int) -> None:
    """The library is read a chunk (1 MiB) at a time, not mapped (a mapping of its tens of MB
    counted in the planning process's resident memory): a list that starts near a chunk's end,
    or runs over into the next, is read whole, after a word that starts no list."""
    flags = b"sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90 compute_90"
    body = bytearray(b"\x00" * (start + len(flags) + 3 * (1 << 20)))
    body[1:6] = b"sm_8\x00"  # not a list: one word
    body[start + 8:start + 8 + len(flags)] = flags
    pkg = tmp_path / "torch"
    (pkg / "lib").mkdir(parents=True)
    (pkg / "lib" / "libtorch_python.so").write_bytes(bytes(body))
    assert torch_builds.read_archs(pkg) == tuple(flags.decode().split())


def test_a_build_is_read_from_its_files(tmp_path: Path) -> None:
    pkg = fake_torch(tmp_path, "2.5.1+cu121", "12.1", b"sm_50 sm_60 sm_70 sm_75 sm_80 compute_90")
    assert read_build(pkg) == TorchBuild("2.5.1+cu121", "12.1", None,
                                         ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80",
                                          "compute_90"))
    cpu = fake_torch(tmp_path / "cpu", "2.5.1+cpu", None, None)
    assert read_build(cpu) == TorchBuild("2.5.1+cpu", None, None, None)
    assert "CPU-only build" in read_build(cpu).label
    unread = fake_torch(tmp_path / "odd", "2.5.1", "12.4", b"no flags here")
    assert read_build(unread).archs is None  # not read: said so, nothing assumed


@pytest.mark.subprocess  # a fresh interpreter shows torch was not imported
def test_this_venvs_torch_is_read_without_importing_it() -> None:
    build = torch_builds.installed()
    assert build is not None and build.version.startswith("2.14.1") and build.cuda == "13.0"
    assert build.archs == NEW
    code = "import sys; from orchestrator.catalog import torch_builds as t; t.installed(); " \
           "print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=Path(__file__).resolve().parents[1])
    assert proc.stdout.strip() == "False"


def _venvs() -> Iterator[str]:
    yield sys.executable
    floor = os.environ.get("ORCHESTRATE_FLOOR_PYTHON")
    if floor:
        yield floor


@pytest.mark.torch  # each venv's torch imported in its own process
@pytest.mark.parametrize("python", list(_venvs()), ids=lambda p: Path(p).parents[1].name)
def test_what_is_read_is_what_the_imported_torch_says(python: str) -> None:
    """The reader against torch itself: version, CUDA and arch list, per venv we claim."""
    code = ("import json, torch; print(json.dumps([torch.__version__, torch.version.cuda, "
            "torch.cuda.get_arch_list() or torch._C._cuda_getArchFlags().split()]))")
    said = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    version, cuda, archs = json.loads(said.stdout)
    where = subprocess.run([python, "-c", "import importlib.util as u; print(u.find_spec("
                            "'torch').submodule_search_locations[0])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert read_build(Path(where)) == TorchBuild(version, cuda, None, tuple(archs))


# --- the rules --------------------------------------------------------------------------------


@pytest.mark.parametrize(("archs", "capability", "runs"), [
    (NEW, (7, 0), False),     # a V100 under a CUDA 13 wheel: no sm_70, and sm_75 does not run
    (FLOOR, (7, 0), True),
    (NEW, (8, 9), True),      # an L4 runs sm_86 cubins (same major, older minor)
    (NEW, (9, 0), True),
    (("sm_80", "sm_90"), (8, 0), True),
    (("sm_86",), (8, 0), False),  # a cubin never runs on an older minor
    (("sm_90", "compute_90"), (10, 0), True),  # PTX is compiled for newer GPUs
    (("sm_80", "sm_90"), (10, 0), False),
    (NEW, (12, 1), True),
])
def test_which_arch_runs_which_gpu(archs: tuple[str, ...], capability: tuple[int, int],
                                   runs: bool) -> None:
    assert arch_runs(archs, capability) is runs


def test_drivers_and_what_to_install() -> None:
    assert torch_builds.driver_runs("575.57.08", "13.0") is False
    assert torch_builds.driver_runs("580.65.06", "13.0") is True
    assert torch_builds.driver_runs("525.60.13", "12.8") is True
    assert torch_builds.driver_runs("470.223.02", "12.1") is False
    assert "cu126" in torch_builds.gpu_advice((7, 0))
    assert "cu128" in torch_builds.driver_advice("550.54.15", (9, 0))
    assert "older stack" in torch_builds.gpu_advice((3, 7))


# --- the checks ---------------------------------------------------------------------------------


def matrix(tmp_path: Path, backend: str, profile: str, workload: str = "") -> Path:
    path = tmp_path / "m.toml"
    path.write_text(f'[matrix]\nbackend = "{backend}"\n[workload]\nhardware = "g"\n{workload}'
                    f'[axes]\nprecision = ["fp32", "amp"]\n[hardware.g]\n{profile}\n')
    return path


def errors(path: Path, machine: object = None, backend: str | None = None) -> list[str]:
    found = check_matrix(load_matrix(path), backend, machine=machine)  # type: ignore[arg-type]
    return [str(p) for p in found.errors]


def test_a_cuda_cell_on_a_machine_without_a_gpu_is_refused(tmp_path: Path) -> None:
    """A requirement of the machine (GPUs), not a problem of the file: it names the GPU the
    profile names and where such GPUs are, never "set device = cpu" for a named GPU."""
    path = matrix(tmp_path, "process", 'device = "cuda"\ngpu = "H100"')
    (problem,) = errors(path, NO_GPU)
    assert "m.toml: hardware.g.device: 2 cells (g-g1-bs64-fp32-r1, g-g1-bs64-amp-r1)" in problem
    assert "an NVIDIA GPU (H100, compute capability 9.0; 1 per cell" in problem
    assert "this machine has none" in problem and "--backend ssh" in problem
    assert "--backend slurm" in problem and "device = \"cpu\"" not in problem.split("none")[1]
    found = check_matrix(load_matrix(path), machine=NO_GPU)
    (requirement,) = found.errors
    assert isinstance(requirement, Requirement) and requirement.kind == "GPUs"
    assert requirement.cells == ("g-g1-bs64-fp32-r1", "g-g1-bs64-amp-r1")
    assert errors(path, facts("H100")) == []
    docker = matrix(tmp_path, "docker", 'device = "cuda"\nimage = "ngc-pytorch"')
    (problem,) = errors(docker, NO_GPU)
    assert "where the docker backend runs them" in problem
    assert 'or set device = "cpu"' in problem  # the profile names no GPU: the CPU may do
    # a Bitfusion profile's GPUs are the servers': nothing of this machine is asked
    bitfusion = matrix(tmp_path, "docker", 'device = "cuda"\nimage = "bitfusion"\n'
                                           'wrapper = "bitfusion"')
    assert errors(bitfusion, NO_GPU) == []


def test_a_gaudi_cell_needs_a_gaudi_card_here(tmp_path: Path) -> None:
    path = matrix(tmp_path, "docker", 'device = "hpu"\nimage = "habana"',
                  workload='hpu_mode = "lazy"\n')
    path.write_text(path.read_text().replace('"fp32", "amp"', '"fp32", "bf16"'))
    (problem,) = errors(path, facts("H100"))
    assert "hardware.g.device" in problem and "need a Gaudi card" in problem
    assert errors(path, GAUDI) == []


def test_the_venvs_torch_against_a_v100(tmp_path: Path) -> None:
    """The issue's case: torch 2.14.1+cu130 (sm_75..sm_120) cannot run a V100 (sm_70)."""
    slurm = matrix(tmp_path, "slurm", 'device = "cuda"\ngpu = "V100"')
    (problem,) = errors(slurm)  # slurm: the profile's GPU; this machine is not asked
    assert problem.startswith(f"{slurm}: hardware.g.gpu: 2 cells (g-g1-bs64-fp32-r1")
    assert "V100 (compute capability 7.0)" in problem and "no sm_70" in problem
    assert "--index-url https://download.pytorch.org/whl/cu126" in problem
    process = matrix(tmp_path, "process", 'device = "cuda"')
    (problem,) = errors(process, facts("V100", driver="580.159.04"))  # this machine's GPU
    assert "hardware.g: 2 cells" in problem and "Tesla V100-SXM2-32GB" in problem
    assert errors(process, facts("H100")) == []


def test_a_driver_older_than_the_builds_cuda(tmp_path: Path) -> None:
    process = matrix(tmp_path, "process", 'device = "cuda"')
    (problem,) = errors(process, facts("H100", driver="550.54.15"))
    assert "driver 550.54.15 is older than torch 2.14.1+cu130 (CUDA 13.0) needs" in problem
    assert "cu128" in problem
    found = check_matrix(load_matrix(matrix(tmp_path, "slurm", 'device = "cuda"\ngpu = "H100"')))
    assert found.errors == []
    assert any("needs driver 580.65.06 or newer there" in p.message for p in found.notes)


def test_a_cpu_build_of_torch_refuses_cuda_cells(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = read_build(fake_torch(tmp_path / "site", "2.14.1+cpu", None, None))
    monkeypatch.setattr(torch_builds, "installed", lambda: cpu)
    software.host_stack.cache_clear()
    try:
        path = matrix(tmp_path, "process", 'device = "cuda"')
        (problem,) = errors(path, facts("H100"))
        assert "this Python's torch 2.14.1+cpu is not a CUDA build" in problem
        assert "check a build with" in problem
        cpu_cells = matrix(tmp_path, "process", 'device = "cpu"')
        cpu_cells.write_text(cpu_cells.read_text().replace('"fp32", "amp"', '"fp32", "bf16"'))
        assert errors(cpu_cells, NO_GPU) == []
    finally:
        software.host_stack.cache_clear()


def test_an_images_release_against_the_gpu_and_driver(tmp_path: Path) -> None:
    new = matrix(tmp_path, "docker", 'device = "cuda"\nimage = "ngc-pytorch"\n'
                                     'image_vars = { base_tag = "25.01-py3" }')
    (problem,) = errors(new, facts("V100", driver="580.159.04"))
    assert problem.startswith(f"{new}: hardware.g.image_vars.base_tag: 2 cells")
    assert "NGC PyTorch 25.01, which supports compute capability 7.5 and newer" in problem
    assert 'pick NGC 24.12 or older (base_tag = "24.12-py3")' in problem
    old = matrix(tmp_path, "docker", 'device = "cuda"\nimage = "ngc-pytorch"\n'
                                     'image_vars = { base_tag = "23.10-py3" }')
    (problem,) = errors(old, facts("V100", driver="470.223.02"))
    assert "driver 470.223.02 is older than NGC PyTorch 23.10 needs (535.104.05" in problem
    assert errors(old, facts("V100")) == []
    # ssh: the hosts are not asked; the profile's GPU is checked, the driver noted
    ssh = matrix(tmp_path, "ssh", 'device = "cuda"\ngpu = "V100"\nimage = "ngc-pytorch"\n'
                                  'image_vars = { base_tag = "25.01-py3" }')
    (problem,) = errors(ssh)
    assert "hardware.g.image_vars.base_tag" in problem and "NGC PyTorch 25.01" in problem


def test_a_pinned_release_is_named_where_it_is_set(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text('[matrix]\nbackend = "docker"\n[workload]\nhardware = "g"\n[axes]\n'
                    'ngc_release = ["24.10", "25.01"]\n[hardware.g]\ndevice = "cuda"\n'
                    'image = "ngc-pytorch"\n')
    (problem,) = errors(path, facts("V100", driver="580.159.04"))
    assert problem.startswith(f"{path}: axes.ngc_release[1]: cell g-g1-bs64-fp32-ngc25.01-r1")


def test_validate_says_which_gpu_the_cells_get(tmp_path: Path, gpu_machine,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli import main

    gpu_machine("H100", count=2)
    path = matrix(tmp_path, "process", 'device = "cuda"\ngpu = "H100"')
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "on this machine's NVIDIA H100 80GB HBM3 (compute capability 9.0), driver " \
           "580.159.04" in out
