"""workload/compat.py under the running torch: every version-dependent choice, GPU paths too.

Runs on the CPU, with nothing but torch, torchvision and pytest, so that
``tests/test_workload_compat.py`` can run this same module under the floor interpreter: each
API choice the workload makes is then checked under the oldest and the newest supported torch.

The CUDA choices (fused optimizer, GradScaler, CUDA autocast, CUDA graphs, nvJPEG decode,
``init_process_group(device_id=...)``) cannot *run* here (no GPU): each test checks that the
chosen callable exists and accepts the chosen arguments, by binding its signature or by
constructing it where that works without a GPU, and runs the same call on the CPU where the API
allows it.  The GPU itself is exercised by ``benchmarks/gpu_paths.py``.
"""

from __future__ import annotations

import datetime
import inspect
import warnings
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.filterwarnings(
    "ignore::UserWarning",
    "ignore::FutureWarning",
    "ignore:The image decoding and encoding:DeprecationWarning",
)


@pytest.fixture(scope="module")
def compat(torch: Any) -> Any:
    """``workload.compat`` (it imports torch, so the tests that take it are workload-tier)."""
    from workload import compat

    return compat


def _params() -> list[Any]:
    import torch

    return list(torch.nn.Linear(4, 3).parameters())


# --------------------------------------------------------------------------- optimizer


@pytest.mark.parametrize("device", ["cuda", "cpu", "hpu"])
def test_optimizer_choice_binds_and_matches_the_signature(torch: Any, compat: Any,
                                                          device: str) -> None:
    choice = compat.optimizer(device)
    assert choice.factory is torch.optim.SGD
    assert compat.accepts(choice.factory, _params(), **choice.kwargs)
    has = compat.parameters(torch.optim.SGD)
    expected = {
        "cuda": "sgd(fused)" if "fused" in has else "sgd(foreach)" if "foreach" in has else "sgd",
        "cpu": "sgd(foreach)" if "foreach" in has else "sgd",
        "hpu": "sgd",
    }[device]
    assert choice.label == expected
    assert {k: choice.kwargs[k] for k in ("lr", "momentum", "weight_decay")} == dict(
        compat.SGD_HYPER
    )


@pytest.mark.parametrize("device", ["cpu", "hpu"])
def test_optimizer_choice_steps_on_the_cpu(torch: Any, compat: Any, device: str) -> None:
    params = _params()
    opt = compat.optimizer(device)(params)
    for p in params:
        p.grad = torch.ones_like(p)
    before = [p.detach().clone() for p in params]
    opt.step()
    assert all(not torch.equal(a, p) for a, p in zip(before, params, strict=True))


# --------------------------------------------------------------------------- precision


def test_cuda_grad_scaler_choice_constructs_without_a_gpu(compat: Any) -> None:
    choice = compat.grad_scaler("cuda")
    assert choice.available
    assert choice.label in ("torch.amp.GradScaler", "torch.cuda.amp.GradScaler")
    if choice.label == "torch.amp.GradScaler":
        assert choice.kwargs == {"device": "cuda"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "CUDA is not available. Disabling."
        scaler = choice()
    for method in ("scale", "step", "update", "unscale_"):
        assert callable(getattr(scaler, method))


def test_cpu_grad_scaler_choice_scales_a_real_step_or_is_none(compat: Any) -> None:
    choice = compat.grad_scaler("cpu")
    if not choice.available:
        assert choice.label.startswith("none")
        return
    params = _params()
    opt = compat.optimizer("cpu")(params)
    scaler = choice()
    loss = sum(p.sum() for p in params)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert all(p.grad is not None for p in params)


@pytest.mark.parametrize("precision", ["amp", "bf16"])
def test_cuda_autocast_choice_constructs_without_a_gpu(torch: Any, compat: Any,
                                                       precision: str) -> None:
    choice = compat.autocast("cuda", precision)
    assert choice.factory is torch.autocast
    dtype = torch.float16 if precision == "amp" else torch.bfloat16
    assert choice.kwargs == {"device_type": "cuda", "dtype": dtype}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "CUDA is not available. Disabling autocast."
        context = choice()
    assert hasattr(context, "__enter__") and hasattr(context, "__exit__")


def test_cpu_bf16_autocast_really_runs_bf16(torch: Any, compat: Any) -> None:
    choice = compat.autocast("cpu", "bf16")
    assert choice.available
    x = torch.ones(4, 4)
    with choice():
        assert (x @ x).dtype == torch.bfloat16


def test_cpu_fp16_autocast_choice_agrees_with_the_probe(torch: Any, compat: Any) -> None:
    choice = compat.autocast("cpu", "amp")
    assert choice.available == compat.cpu_autocast_works(torch.float16)
    if choice.available:
        with choice():
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float16
    else:
        assert choice.label.startswith("unsupported")


def test_fp32_needs_no_autocast(compat: Any) -> None:
    with compat.autocast("cuda", "fp32")():
        pass
    assert compat.autocast("cpu", "fp32").label == "none (fp32)"


# --------------------------------------------------------------------------- graphs, compile


def test_cuda_graph_choice_takes_a_graph(torch: Any, compat: Any) -> None:
    choice = compat.cuda_graphs()
    assert choice.available and choice.factory is torch.cuda.graph
    assert compat.accepts(torch.cuda.graph, object())  # torch.cuda.graph(cuda_graph)
    assert hasattr(torch.cuda, "CUDAGraph") and hasattr(torch.cuda, "Stream")


COMPILE_CASES = [("default", "cuda"), ("max-autotune", "cuda"), ("reduce-overhead", "cuda"),
                 ("default", "hpu")]  # fmt: skip


@pytest.mark.parametrize(("mode", "device"), COMPILE_CASES)
def test_compile_choice_binds_to_torch_compile(torch: Any, compat: Any, mode: str,
                                               device: str) -> None:
    ok, why = compat.compile_available()
    choice = compat.compiler(mode, device)
    assert choice.available == ok
    if not ok:
        assert "unavailable" in choice.label and why
        return
    assert choice.factory is torch.compile
    assert compat.accepts(torch.compile, torch.nn.Identity(), **choice.kwargs)
    expected = {"backend": "hpu_backend"} if device == "hpu" else {
        "mode": None if mode == "default" else mode}  # fmt: skip
    assert dict(choice.kwargs) == expected


def test_compile_none_is_no_choice(compat: Any) -> None:
    assert compat.compiler("none", "cuda").label == "none"


# --------------------------------------------------------------------------- errors


def test_oom_error_types(torch: Any, compat: Any) -> None:
    types = compat.oom_errors()
    assert types and all(issubclass(t, Exception) for t in types)
    assert torch.cuda.OutOfMemoryError in types  # in every torch from the floor (2.1) on
    if hasattr(torch, "OutOfMemoryError"):  # the newer name (the same class where both exist)
        assert torch.OutOfMemoryError in types
    for t in types:
        assert compat.is_oom(t("CUDA error"))
    assert compat.is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not compat.is_oom(ValueError("bad value"))


# --------------------------------------------------------------------------- distributed


def test_process_group_kwargs_bind_to_init_process_group(torch: Any, compat: Any) -> None:
    dev = torch.device("cuda", 0)
    extra = compat.process_group_kwargs("cuda", dev)
    assert extra == ({"device_id": dev} if compat.process_group_device_id() else {})
    assert compat.accepts(
        torch.distributed.init_process_group,
        backend="nccl",
        timeout=datetime.timedelta(minutes=10),
        **extra,
    )
    assert compat.process_group_kwargs("cpu", torch.device("cpu")) == {}


def test_ddp_kwargs_are_accepted_by_ddp(torch: Any, compat: Any) -> None:
    from torch.nn.parallel import DistributedDataParallel

    kwargs = compat.ddp_kwargs()
    assert set(kwargs) == set(compat.DDP_OPTIONS)  # all three exist from the floor on
    assert compat.accepts(DistributedDataParallel, torch.nn.Linear(2, 2), device_ids=[0], **kwargs)


# --------------------------------------------------------------------------- data


def test_transforms_choice_crops_a_uint8_tensor(torch: Any, compat: Any) -> None:
    module, label = compat.transforms()
    assert label in ("torchvision.transforms.v2", "torchvision.transforms")
    image = torch.randint(0, 255, (3, 40, 50), dtype=torch.uint8)
    train = module.Compose(
        [module.RandomResizedCrop(32, antialias=True), module.RandomHorizontalFlip()]
    )
    infer = module.Compose([module.Resize(37, antialias=True), module.CenterCrop(32)])
    for transform in (train, infer):
        out = transform(image)
        assert out.shape == (3, 32, 32) and out.dtype == torch.uint8


def test_jpeg_decode_choice_decodes_a_batch_on_the_cpu(torch: Any, compat: Any) -> None:
    """The same call the nvJPEG path makes, with device="cpu" (which every version takes)."""
    from torchvision.io import ImageReadMode, decode_jpeg, encode_jpeg

    choice = compat.jpeg_decode()
    assert choice.available, choice.label
    assert choice.label in ("decode_jpeg(list)", "decode_jpeg(per image)")
    assert compat.accepts(decode_jpeg, torch.zeros(1, dtype=torch.uint8), mode=ImageReadMode.RGB,
                          device="cuda:0")  # fmt: skip
    raw = [encode_jpeg(torch.full((3, 8, 8 + i), 100, dtype=torch.uint8)) for i in range(3)]
    images = choice(raw, ImageReadMode.RGB, "cpu")
    assert [tuple(img.shape) for img in images] == [(3, 8, 8), (3, 8, 9), (3, 8, 10)]


# --------------------------------------------------------------------------- weights, device


def test_weights_loader_loads_a_state_dict(torch: Any, compat: Any, tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    path = tmp_path / "w.pth"
    torch.save(model.state_dict(), path)
    state = compat.weights_loader()(path, map_location="cpu")
    assert torch.equal(state["weight"], model.weight)
    if "weights_only" in inspect.signature(torch.load).parameters:
        assert compat.weights_loader().kwargs == {"weights_only": True}


def test_device_uuid(compat: Any) -> None:
    class Props:
        uuid = "1234-abcd"

    assert compat.device_uuid(Props()) == "1234-abcd"
    assert compat.device_uuid(object()) is None


# --------------------------------------------------------------------------- profiler


def test_torch_profiler_schedule_writes_a_trace(torch: Any, tmp_path: Path) -> None:
    """The ``--profiler torch`` path (torch.profiler with a schedule) on the CPU."""
    from workload.profiling import Profiler

    prof = Profiler("torch", "cpu", tmp_path, rank=0, iterations=3)
    prof.begin()
    for i in range(3):
        prof.iteration_start(i)
        torch.ones(8, 8) @ torch.ones(8, 8)
        prof.iteration_end(i)
    prof.finish()
    assert (tmp_path / "trace_rank0.json").stat().st_size > 0


# --------------------------------------------------------------------------- the api block


def test_describe_names_only_the_paths_a_run_uses(compat: Any) -> None:
    gpu_train = compat.describe(device="cuda", mode="train", precision="amp", compile_mode="none",
                                cuda_graphs_used=True, decode="decode_jpeg(list)",
                                distributed=True, pretrained=False)  # fmt: skip
    assert gpu_train["optimizer"] == compat.optimizer("cuda").label
    assert gpu_train["grad_scaler"] == compat.grad_scaler("cuda").label
    assert gpu_train["autocast"] == "torch.autocast(cuda, float16)"
    assert gpu_train["cuda_graphs"] == "torch.cuda.graph" and gpu_train["compile"] == "none"
    assert gpu_train["process_group"].startswith("init_process_group")
    assert gpu_train["oom_errors"] and gpu_train["decode"] == "decode_jpeg(list)"
    cpu_infer = compat.describe(device="cpu", mode="infer", precision="bf16", compile_mode="none",
                                cuda_graphs_used=False, decode=None, distributed=False,
                                pretrained=True)  # fmt: skip
    assert not {"optimizer", "grad_scaler", "cuda_graphs", "decode", "process_group"} & set(
        cpu_infer
    )
    assert cpu_infer["weights"].startswith("torch.load")


def test_versions_are_in_the_supported_range(torch: Any) -> None:
    """The floor is torch 2.1 / torchvision 0.16 (docs/workload.md, "Supported stacks")."""
    import torchvision

    torch_series = tuple(int(p) for p in torch.__version__.split(".")[:2])
    vision_series = tuple(int(p) for p in torchvision.__version__.split(".")[:2])
    assert torch_series >= (2, 1) and vision_series >= (0, 16)
