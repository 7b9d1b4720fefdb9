"""What a torch build can run on: its CUDA version, its GPU architectures, the driver it needs.

A torch wheel is built for one CUDA toolkit (``torch.version.cuda``, ``None`` on a CPU build)
and carries GPU code for a list of architectures (``torch.cuda.get_arch_list()``: ``sm_75``
cubins, ``compute_90`` PTX). It runs a GPU only if that list covers the GPU's compute
capability, and only under a driver new enough for its CUDA major version. This module reads
both facts of an installed torch **without importing it** (importing torch takes seconds and
may fail where the checks run): ``torch/version.py`` is read as text, and the architecture list
is the build's ``CUDA_ARCH_FLAGS`` string, which ``libtorch_python.so`` carries verbatim (the
same string ``torch._C._cuda_getArchFlags()`` returns; measured on torch 2.1.0+cu121 and
2.14.1+cu130, whose lists are ``sm_50 .. sm_90`` and ``sm_75 .. sm_120``).

The rules (pure functions):

* :func:`arch_runs`: a cubin for ``sm_XY`` runs on compute capability ``X.Z`` with ``Z >= Y``
  (binary compatibility holds within a major version only); PTX for ``compute_XY`` is compiled
  by the driver for any capability ``>= X.Y``. This is stricter than torch's own warning, which
  accepts any cubin of the same major version (``sm_75`` for a 7.0 V100), and is what the GPU
  does: ``no kernel image is available for execution on the device``.
* :func:`min_driver`: the oldest driver of the CUDA major version's *minor version
  compatibility* (NVIDIA's CUDA compatibility guide: 11.x needs 450.80.02, 12.x 525.60.13,
  13.x 580.65.06), which is what a pip wheel needs: it ships its own CUDA runtime.
* :func:`gpu_advice`, :func:`driver_advice`: what to install instead, from PyTorch's published
  support matrix (``RELEASE.md``, "PyTorch CUDA support matrix"): the CUDA 12.6 wheels carry
  Maxwell to Hopper (5.0, 6.0, 7.0, 7.5, 8.0, 8.6, 9.0), the CUDA 12.8 and 13.0 wheels Turing to
  Blackwell (7.5 .. 12.0). Those wheels cannot be downloaded here (no access to
  download.pytorch.org), so the advice is not tested against them: it names the index and says
  how to verify the arch list.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
from dataclasses import dataclass
from pathlib import Path

#: The build's ``CUDA_ARCH_FLAGS``: ``sm_75 sm_80 ... compute_120``, at least two words.
_ARCH_FLAGS = re.compile(rb"(?:sm|compute)_\d{2,3}[af]?(?: (?:sm|compute)_\d{2,3}[af]?)+")
_ARCH = re.compile(r"^(sm|compute)_(\d{2,3})[af]?$")

#: CUDA major version -> the oldest driver that runs its toolkits (minor version compatibility).
MIN_DRIVER: dict[int, str] = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}

#: The wheel index that carries kernels for older GPUs (Maxwell .. Hopper), and its driver.
LEGACY_INDEX = "https://download.pytorch.org/whl/cu126"
#: The wheel index of CUDA 12.8 builds (Turing .. Blackwell) for drivers older than CUDA 13's.
CUDA12_INDEX = "https://download.pytorch.org/whl/cu128"
#: How to see what a build carries.
VERIFY = "python -c 'import torch; print(torch.version.cuda, torch.cuda.get_arch_list())'"


@dataclass(frozen=True)
class TorchBuild:
    """An installed torch as its files tell, torch never imported."""

    #: ``torch.__version__``: ``2.14.1+cu130``.
    version: str
    #: ``torch.version.cuda``: ``13.0``; None for a CPU (or ROCm) build.
    cuda: str | None
    #: ``torch.version.hip``: set on a ROCm build.
    hip: str | None = None
    #: The GPU architectures it carries (``sm_75``, ``compute_120``); None where they could not
    #: be read (a layout this reader does not know).
    archs: tuple[str, ...] | None = None

    @property
    def label(self) -> str:
        """``torch 2.14.1+cu130 (CUDA 13.0, sm_75 sm_80 ...)``."""
        if self.cuda is None:
            kind = f"ROCm {self.hip}" if self.hip else "a CPU-only build"
            return f"torch {self.version} ({kind})"
        archs = " ".join(self.archs) if self.archs else "architectures not read"
        return f"torch {self.version} (CUDA {self.cuda}, {archs})"


def installed(distribution: str = "torch") -> TorchBuild | None:
    """The torch installed in this interpreter's environment, read from its files; None when
    there is none (or its files are not where a torch wheel puts them)."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    root = Path(str(dist.locate_file("torch")))
    if not (root / "version.py").is_file():
        return None
    return read_build(root, fallback_version=dist.version)


def read_build(root: Path, fallback_version: str = "") -> TorchBuild:
    """The build of the torch package folder ``root`` (``.../site-packages/torch``)."""
    values = _version_values(root / "version.py")
    version = values.get("__version__") or fallback_version
    cuda, hip = values.get("cuda"), values.get("hip")
    archs = read_archs(root) if cuda else None
    return TorchBuild(version=version, cuda=cuda, hip=hip, archs=archs)


def _version_values(path: Path) -> dict[str, str | None]:
    """The string (or None) assignments of ``torch/version.py``, parsed, never executed."""
    found: dict[str, str | None] = {}
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return found
    for node in tree.body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if not isinstance(target, ast.Name) or not isinstance(value, ast.Constant):
            continue
        if value.value is None or isinstance(value.value, str):
            found[target.id] = value.value
    return found


def read_archs(root: Path) -> tuple[str, ...] | None:
    """The ``CUDA_ARCH_FLAGS`` a CUDA build of torch carries, from its Python extension library
    (None when no library of the folder has them)."""
    lib = root / "lib"
    for name in ("libtorch_python.so", "libtorch_cuda.so"):
        flags = _flags_in(lib / name)
        if flags:
            return flags
    return None


#: How much of a library is read at a time, and longer than any arch list (which a match that
#: ends this close to a chunk's end may go on past).
_CHUNK = 1 << 20
_LONGEST = 4096


def _flags_in(path: Path) -> tuple[str, ...] | None:
    """The first arch list in the library ``path``, read a chunk at a time: a library is tens
    of MB, which a mapping of it would add to the planning process's resident memory."""
    data = b""
    try:
        with path.open("rb") as handle:
            while True:
                chunk = handle.read(_CHUNK)
                data += chunk
                # the regex only where a word of one can start (a few places in 30 MB)
                match = (_ARCH_FLAGS.search(data) if b"sm_" in data or b"compute_" in data
                         else None)
                if match and (not chunk or match.end() < len(data) - _LONGEST):
                    return tuple(match[0].decode().split())
                if not chunk:
                    return None
                data = data[match.start() if match else max(0, len(data) - _LONGEST):]
    except (OSError, ValueError):
        return None


def _arch_number(arch: str) -> tuple[str, int, int] | None:
    """``sm_86`` -> ``("sm", 8, 6)``; ``compute_120`` -> ``("compute", 12, 0)``."""
    match = _ARCH.match(arch)
    if match is None:
        return None
    number = int(match[2])
    return match[1], number // 10, number % 10


def arch_runs(archs: tuple[str, ...], capability: tuple[int, int]) -> bool:
    """Whether a build carrying ``archs`` runs a GPU of compute ``capability``."""
    for arch in archs:
        parsed = _arch_number(arch)
        if parsed is None:
            continue
        kind, major, minor = parsed
        if kind == "sm" and major == capability[0] and minor <= capability[1]:
            return True
        if kind == "compute" and (major, minor) <= capability:
            return True
    return False


def sm(capability: tuple[int, int]) -> str:
    """``(7, 0)`` -> ``sm_70``."""
    return f"sm_{capability[0]}{capability[1]}"


def cuda_major(cuda: str) -> int | None:
    head = cuda.split(".")[0]
    return int(head) if head.isdigit() else None


def min_driver(cuda: str) -> str | None:
    """The oldest driver a pip wheel built for CUDA ``cuda`` runs under (None: not known)."""
    major = cuda_major(cuda)
    return MIN_DRIVER.get(major) if major is not None else None


def _install(index: str, why: str) -> str:
    return (f"install another build: `pip install torch torchvision --index-url {index}` "
            f"({why}); check a build with `{VERIFY}`")


def gpu_advice(capability: tuple[int, int]) -> str:
    """What to install for a GPU of ``capability`` that a build does not carry."""
    if capability < (5, 0):
        return (f"no torch of the supported range (torch 2.1 and newer) carries {sm(capability)}: "
                "run this GPU with an older stack, or use another GPU")
    if capability < (7, 5):
        return _install(LEGACY_INDEX, f"PyTorch's CUDA 12.6 wheels carry sm_50 .. sm_90, "
                                      f"{sm(capability)} included")
    return _install(CUDA12_INDEX, "PyTorch's CUDA 12.8 and 13.0 wheels carry sm_75 .. sm_120")


def driver_advice(driver: str, capability: tuple[int, int] | None) -> str:
    """What to do when ``driver`` is too old for a build's CUDA: a build of an older CUDA that
    still carries the GPU, or a newer driver."""
    if capability is not None and capability < (7, 5):
        return (f"upgrade the driver, or {gpu_advice(capability)} (they run under driver "
                f"{MIN_DRIVER[12]} or newer)")
    why = f"CUDA 12.8 wheels run under driver {MIN_DRIVER[12]} or newer"
    return f"upgrade the driver, or {_install(CUDA12_INDEX, why)}"


def cpu_build_advice() -> str:
    """What to install when a CUDA cell meets a CPU-only torch."""
    return (f"install a CUDA build (on Linux `pip install torch torchvision` gives one; for an "
            f"older GPU or driver `--index-url {LEGACY_INDEX}`); check a build with `{VERIFY}`")


def _driver_key(driver: str) -> tuple[int, ...]:
    parts = tuple(int(p) for p in re.findall(r"\d+", driver)[:3])
    return parts + (0,) * (3 - len(parts))


def driver_runs(driver: str, cuda: str) -> bool | None:
    """Whether ``driver`` runs a pip wheel of CUDA ``cuda`` (None: not known)."""
    need = min_driver(cuda)
    if need is None or not re.match(r"^\d+(\.\d+){0,2}$", driver.strip()):
        return None
    return _driver_key(driver) >= _driver_key(need)
