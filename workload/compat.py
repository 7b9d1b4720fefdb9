"""Every torch/torchvision API choice that depends on the installed version, in one place.

The workload runs on every stack an image of the project ships, from the oldest offered NGC
release (torch 2.1 / torchvision 0.16, the floor; see "Supported stacks" in docs/workload.md) to the
newest.  Where those versions differ, the calling code asks this module what to call, and this
module decides by **feature detection** -- a signature, an attribute, or a tiny CPU probe --
never by comparing version strings.  Each decision is a :class:`Choice`: the callable to use,
the keyword arguments it will be given, and a short label.  The labels of the paths a run
really used go into the ``meta``/``summary`` ``env`` as the ``api`` block (:func:`describe`).

GPU-only paths (fused optimizer, GradScaler, CUDA autocast, CUDA graphs, nvJPEG decode,
``init_process_group(device_id=...)``) make their choice here too, and the choice itself needs
no GPU: ``tests/test_compat_unit.py`` asks for the CUDA choices on the CPU and checks that each
chosen callable exists and accepts the chosen arguments (by binding its signature, or by
constructing it where that works without a GPU), under the newest torch and under the floor
interpreter CI installs.  A GPU-only call therefore cannot hide an incompatibility.

Rules: imports only the standard library, torch and torchvision; every function here is cheap
after its first call (results are cached per process); no function here needs a GPU.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
from torch import nn

#: Hyper-parameters of the benchmark's SGD (DeepLearningExamples' values).
SGD_HYPER: Mapping[str, float] = {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}


@dataclass(frozen=True)
class Choice:
    """What to call for one version-dependent path, and its label for the ``api`` block.

    ``factory`` is None when the path is unavailable on this stack (``label`` then says why).
    Calling the choice calls ``factory(*args, **kwargs, **self.kwargs)``.
    """

    label: str
    factory: Callable[..., Any] | None
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def available(self) -> bool:
        """True when there is something to call."""
        return self.factory is not None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.factory is None:
            raise RuntimeError(f"not available on this stack: {self.label}")
        return self.factory(*args, **kwargs, **self.kwargs)


def parameters(fn: Callable[..., Any]) -> set[str]:
    """Names of the parameters ``fn`` (or a class's ``__init__``) accepts; empty if unknown."""
    target = fn.__init__ if inspect.isclass(fn) else fn
    try:
        return set(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return set()


def accepts(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
    """True when ``fn``'s signature binds these arguments (``self`` filled in for a class)."""
    try:
        if inspect.isclass(fn):
            inspect.signature(fn.__init__).bind(None, *args, **kwargs)
        else:
            inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:
        return False
    return True


# --------------------------------------------------------------------------- training step


@functools.cache
def optimizer(device: str) -> Choice:
    """SGD with momentum: fused on CUDA where SGD has ``fused``, else multi-tensor ``foreach``
    (CUDA and CPU), else the per-parameter loop (Gaudi and anything else)."""
    sgd = torch.optim.SGD
    accepted = parameters(sgd)
    if device == "cuda" and "fused" in accepted:
        return Choice("sgd(fused)", sgd, {**SGD_HYPER, "fused": True})
    if device in ("cuda", "cpu") and "foreach" in accepted:
        return Choice("sgd(foreach)", sgd, {**SGD_HYPER, "foreach": True})
    return Choice("sgd", sgd, dict(SGD_HYPER))


@functools.cache
def grad_scaler(device: str) -> Choice:
    """The fp16 loss scaler: ``torch.amp.GradScaler(device)`` where it takes a device, else the
    per-device class (``torch.cuda.amp.GradScaler``, ``torch.cpu.amp.GradScaler``), else none
    (fp16 then runs without loss scaling; only possible on a CPU whose torch has no scaler)."""
    amp_scaler = getattr(torch.amp, "GradScaler", None)
    if amp_scaler is not None and "device" in parameters(amp_scaler):
        return Choice("torch.amp.GradScaler", amp_scaler, {"device": device})
    per_device = getattr(getattr(getattr(torch, device, None), "amp", None), "GradScaler", None)
    if per_device is not None:
        return Choice(f"torch.{device}.amp.GradScaler", per_device)
    return Choice(f"none (this torch has no GradScaler for {device})", None)


def _dtype(precision: str) -> torch.dtype:
    return torch.float16 if precision == "amp" else torch.bfloat16


@functools.cache
def cpu_autocast_works(dtype: torch.dtype) -> bool:
    """Probe: does CPU autocast to ``dtype`` really produce ``dtype`` (older torch: bf16 only)."""
    x = torch.ones(2, 2)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autocast(device_type="cpu", dtype=dtype):
                return (x @ x).dtype == dtype
    except RuntimeError:
        return False


@functools.cache
def autocast(device: str, precision: str) -> Choice:
    """The autocast context for a precision: ``torch.autocast(device_type, dtype)``, a
    no-op for fp32, unavailable where the CPU probe shows the dtype is not supported."""
    if precision == "fp32":
        return Choice("none (fp32)", contextlib.nullcontext)
    dtype = _dtype(precision)
    label = f"torch.autocast({device}, {str(dtype).replace('torch.', '')})"
    if device == "cpu" and not cpu_autocast_works(dtype):
        return Choice(f"unsupported: {label} (this torch's CPU autocast lacks the dtype)", None)
    return Choice(label, torch.autocast, {"device_type": device, "dtype": dtype})


@functools.cache
def cuda_graphs() -> Choice:
    """Whole-step capture: ``torch.cuda.CUDAGraph`` + the ``torch.cuda.graph`` context."""
    graph_ctx = getattr(torch.cuda, "graph", None)
    if graph_ctx is None or getattr(torch.cuda, "CUDAGraph", None) is None:
        return Choice("unavailable (no torch.cuda.graph)", None)
    return Choice("torch.cuda.graph", graph_ctx)


@functools.cache
def compile_available() -> tuple[bool, str]:
    """Whether ``torch.compile`` can be used here, and why not (e.g. dynamo on this Python)."""
    fn = getattr(torch, "compile", None)
    if fn is None:
        return False, "this torch has no torch.compile"
    try:
        fn(nn.Identity())  # wraps lazily; raises where dynamo cannot run on this Python
    except Exception as exc:  # any failure means: not usable here
        return False, f"torch.compile unusable here ({type(exc).__name__}: {exc})"
    return True, ""


def compiler(mode: str, device: str) -> Choice:
    """``torch.compile`` for ``--compile MODE`` (Gaudi: ``backend="hpu_backend"``, no mode)."""
    if mode == "none":
        return Choice("none", None)
    ok, why = compile_available()
    if not ok:
        return Choice(f"unavailable: {why}", None)
    if device == "hpu":
        return Choice(
            "torch.compile(backend=hpu_backend)", torch.compile, {"backend": "hpu_backend"}
        )
    return Choice(
        f"torch.compile(mode={mode})", torch.compile, {"mode": None if mode == "default" else mode}
    )


@functools.cache
def oom_errors() -> tuple[type[BaseException], ...]:
    """The out-of-memory exception types this torch has (``torch.OutOfMemoryError`` is newer
    than ``torch.cuda.OutOfMemoryError``; where both exist they may be the same class)."""
    found: list[type[BaseException]] = []
    for owner in (torch, torch.cuda):
        cls = getattr(owner, "OutOfMemoryError", None)
        if isinstance(cls, type) and issubclass(cls, BaseException) and cls not in found:
            found.append(cls)
    return tuple(found)


def is_oom(exc: BaseException) -> bool:
    """An out-of-memory error of any accelerator (by type where torch has one, else message)."""
    types = oom_errors()
    return (bool(types) and isinstance(exc, types)) or "out of memory" in str(exc).lower()


# --------------------------------------------------------------------------- distributed


@functools.cache
def process_group_device_id() -> bool:
    """Whether ``init_process_group`` takes ``device_id`` (binds NCCL to the rank's GPU)."""
    return "device_id" in parameters(torch.distributed.init_process_group)


def process_group_kwargs(device: str, dev: torch.device) -> dict[str, Any]:
    """Extra ``init_process_group`` arguments for this device, as far as this torch has them."""
    if device == "cuda" and process_group_device_id():
        return {"device_id": dev}
    return {}


#: DDP options of the benchmark (gradient buckets as views, 25 MB buckets, per-rank BN stats).
DDP_OPTIONS: Mapping[str, Any] = {
    "gradient_as_bucket_view": True,
    "bucket_cap_mb": 25,
    "broadcast_buffers": False,
}


@functools.cache
def ddp_kwargs() -> dict[str, Any]:
    """:data:`DDP_OPTIONS` this torch's ``DistributedDataParallel`` accepts."""
    from torch.nn.parallel import DistributedDataParallel

    accepted = parameters(DistributedDataParallel)
    return {k: v for k, v in DDP_OPTIONS.items() if k in accepted}


# --------------------------------------------------------------------------- data


@functools.cache
def transforms() -> tuple[ModuleType, str]:
    """``torchvision.transforms.v2`` where it exists (its beta warning silenced on versions that
    still print one), else the v1 ``torchvision.transforms``; both work on uint8 tensors."""
    import torchvision

    silence = getattr(torchvision, "disable_beta_transforms_warning", None)
    if silence is not None:
        silence()
    try:
        from torchvision.transforms import v2
    except ImportError:
        from torchvision import transforms as v1

        return v1, "torchvision.transforms"
    return v2, "torchvision.transforms.v2"


def _tiny_jpeg() -> torch.Tensor:
    from torchvision.io import encode_jpeg

    return encode_jpeg(torch.zeros(3, 8, 8, dtype=torch.uint8))


@functools.cache
def jpeg_decode() -> Choice:
    """How a batch of JPEG byte tensors is decoded: one ``decode_jpeg(list, ...)`` call where
    torchvision takes a list (probed on the CPU with a tiny JPEG), else one call per image.
    The chosen callable takes ``(raw: list[Tensor], mode, device)`` and returns a list."""
    from torchvision.io import decode_jpeg

    if "device" not in parameters(decode_jpeg):
        return Choice("unavailable (decode_jpeg has no device argument)", None)
    try:
        batched = isinstance(decode_jpeg([_tiny_jpeg()]), list)
    except (RuntimeError, TypeError):
        batched = False
    if batched:
        return Choice("decode_jpeg(list)", _decode_batched)
    return Choice("decode_jpeg(per image)", _decode_each)


def _decode_batched(raw: list[torch.Tensor], mode: Any, device: Any) -> list[torch.Tensor]:
    from torchvision.io import decode_jpeg

    return list(decode_jpeg(raw, mode=mode, device=device))


def _decode_each(raw: list[torch.Tensor], mode: Any, device: Any) -> list[torch.Tensor]:
    from torchvision.io import decode_jpeg

    return [decode_jpeg(r, mode=mode, device=device) for r in raw]


# --------------------------------------------------------------------------- weights, device


@functools.cache
def weights_loader() -> Choice:
    """``torch.load(..., weights_only=True)`` where supported (no pickled code runs)."""
    if "weights_only" in parameters(torch.load):
        return Choice("torch.load(weights_only=True)", torch.load, {"weights_only": True})
    return Choice("torch.load", torch.load)


def device_uuid(props: Any) -> str | None:
    """A CUDA device's UUID from ``get_device_properties`` (newer torch only), else None."""
    uuid = getattr(props, "uuid", None)
    return None if uuid is None else str(uuid)


# --------------------------------------------------------------------------- profilers


class CudaMarkers:
    """What the workload calls around its profile window for an outside profiler (nsys, ncu,
    nvprof): cudaProfilerStart/Stop (``torch.cuda.profiler``), NVTX push/pop
    (``torch.cuda.nvtx``) and a device synchronize."""

    def __init__(self, profiler: Any, nvtx: Any) -> None:
        self._profiler = profiler
        self._nvtx = nvtx

    def start(self) -> None:
        """cudaProfilerStart."""
        self._profiler.start()

    def stop(self) -> None:
        """cudaProfilerStop."""
        self._profiler.stop()

    def push(self, name: str) -> None:
        """Open NVTX range ``name``."""
        self._nvtx.range_push(name)

    def pop(self) -> None:
        """Close the innermost NVTX range."""
        self._nvtx.range_pop()

    def synchronize(self) -> None:
        """Wait for the device (the window's last kernels end inside the capture)."""
        torch.cuda.synchronize()


@functools.cache
def cuda_markers() -> Choice:
    """The capture-range markers: ``torch.cuda.profiler.start/stop`` (cudaProfilerStart/Stop)
    and ``torch.cuda.nvtx.range_push/pop``; unavailable on a torch without them."""
    prof = getattr(torch.cuda, "profiler", None)
    nvtx = getattr(torch.cuda, "nvtx", None)
    needed = [(prof, "start"), (prof, "stop"), (nvtx, "range_push"), (nvtx, "range_pop")]
    if all(mod is not None and callable(getattr(mod, name, None)) for mod, name in needed):
        return Choice("torch.cuda.profiler.start/stop+torch.cuda.nvtx.range_push/pop",
                      lambda: CudaMarkers(prof, nvtx))
    return Choice("unavailable: torch.cuda.profiler or torch.cuda.nvtx missing", None)


@functools.cache
def profiler_schedule() -> Choice:
    """``torch.profiler.schedule`` for one cycle (``repeat=1``); call it with ``wait``,
    ``warmup`` and ``active`` step counts. ``warmup=0`` is accepted silently (torch warns that
    it may skew the first active step; the workload says so in its own docs)."""
    fn = torch.profiler.schedule

    def make(*, wait: int, warmup: int, active: int, **kwargs: Any) -> Any:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Profiler won.t be using warmup")
            return fn(wait=wait, warmup=warmup, active=active, **kwargs)

    return Choice("torch.profiler.schedule(repeat=1)", make, {"repeat": 1})


# --------------------------------------------------------------------------- the api block


def describe(
    *,
    device: str,
    mode: str,
    precision: str,
    compile_mode: str,
    cuda_graphs_used: bool,
    decode: str | None,
    distributed: bool,
    pretrained: bool,
    profiler: str = "none",
) -> dict[str, Any]:
    """The ``api`` block of ``env``: the label of every version-dependent path this run uses."""
    api: dict[str, Any] = {
        "autocast": autocast(device, precision).label,
        "oom_errors": [f"{c.__module__}.{c.__qualname__}" for c in oom_errors()],
        "transforms": transforms()[1],
    }
    if mode == "train":
        api["optimizer"] = optimizer(device).label
        if precision == "amp":
            api["grad_scaler"] = grad_scaler(device).label
    api["compile"] = compiler(compile_mode, device).label  # probes torch.compile only if asked
    if cuda_graphs_used:
        api["cuda_graphs"] = cuda_graphs().label
    if decode is not None:
        api["decode"] = decode
    if distributed:
        api["process_group"] = (
            "init_process_group(device_id)"
            if device == "cuda" and process_group_device_id()
            else "init_process_group"
        )
        api["ddp"] = sorted(ddp_kwargs())
    if pretrained:
        api["weights"] = weights_loader().label
    if profiler == "torch":
        api["profiler"] = profiler_schedule().label
    elif profiler != "none" and device == "cuda":
        api["profiler"] = cuda_markers().label
    return api
