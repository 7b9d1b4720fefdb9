"""The measured step: training (forward, backward, optimizer) or inference (forward).

Performance features: channels-last (applied by the caller), AMP fp16 with
``torch.amp.GradScaler``, bf16 autocast without a scaler, fused SGD with momentum on CUDA
(foreach elsewhere), optional ``torch.compile`` and optional CUDA graphs.

CUDA graphs (CUDA only; untested on the CPU-only CI machines): the whole training step is
captured with a static input batch (fp32/bf16: forward + backward + ``optimizer.step()``;
amp: forward + scaled backward are captured and ``scaler.step``/``update`` run eagerly after
the replay, which with the fused SGD needs no host synchronisation).  Inference captures the
forward pass.  If capture fails the step runs eagerly and a note goes to stderr.  CUDA graphs
are not combined with DDP or torch.compile here (``reduce-overhead``/``max-autotune`` already
use CUDA graphs); those combinations run without the manual capture, with a note.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from workload.device import autocast, mark_step

log = logging.getLogger("workload")

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def make_optimizer(model: nn.Module, device: str) -> torch.optim.Optimizer:
    """SGD with momentum (lr 0.1, wd 1e-4 as in DeepLearningExamples); fused on CUDA."""
    params = [p for p in model.parameters() if p.requires_grad]
    kwargs: dict[str, Any] = {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}
    if device == "cuda":
        return torch.optim.SGD(params, fused=True, **kwargs)
    if device == "cpu":
        return torch.optim.SGD(params, foreach=True, **kwargs)
    return torch.optim.SGD(params, **kwargs)


def make_scaler(device: str, precision: str) -> torch.amp.GradScaler | None:
    """A GradScaler for fp16 AMP, else None (bf16 and fp32 need none)."""
    if precision != "amp":
        return None
    return torch.amp.GradScaler(device)


def compile_model(model: nn.Module, mode: str, device: str) -> nn.Module:
    """Apply ``torch.compile`` (``hpu_backend`` on Gaudi, where the mode is not passed)."""
    if mode == "none":
        return model
    if device == "hpu":
        return torch.compile(model, backend="hpu_backend")  # type: ignore[return-value]
    return torch.compile(model, mode=None if mode == "default" else mode)  # type: ignore[return-value]


def eager_train_step(
    model: nn.Module,
    criterion: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    device: str,
    precision: str,
) -> Step:
    """One training step; returns the detached loss."""

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with autocast(device, precision):
            loss = criterion(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            mark_step(device)
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            mark_step(device)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mark_step(device)
        return loss.detach()

    return step


def eager_infer_step(model: nn.Module, device: str, precision: str) -> Step:
    """One inference step under ``torch.inference_mode``; returns the logits."""

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode(), autocast(device, precision):
            out = model(x)
        mark_step(device)
        return out

    return step


def cuda_graph_train_step(  # CUDA only
    model: nn.Module,
    criterion: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    precision: str,
    example: tuple[torch.Tensor, torch.Tensor],
    warmup: int = 3,
) -> Step:
    """Capture the training step into a CUDA graph (see the module docstring).

    The graph reads the example batch's own tensors: synthetic data hands those same tensors
    every step (no copy in the measured step); any other batch is copied into them.
    """
    static_x, static_y = example
    eager = eager_train_step(model, criterion, optimizer, scaler, "cuda", precision)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):  # lazily created state (momentum, scaler) exists before capture
            eager(static_x, static_y)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        with autocast("cuda", precision):
            static_loss = criterion(model(static_x), static_y)
        if scaler is not None:
            scaler.scale(static_loss).backward()
        else:
            static_loss.backward()
            optimizer.step()

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if x is not static_x:
            static_x.copy_(x, non_blocking=True)
            static_y.copy_(y, non_blocking=True)
        graph.replay()
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        return static_loss.detach()

    return step


def cuda_graph_infer_step(  # CUDA only
    model: nn.Module, precision: str, example: torch.Tensor, warmup: int = 3
) -> Step:
    """Capture the forward pass into a CUDA graph (reading ``example`` itself, as above)."""
    static_x = example
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.inference_mode():
        with torch.cuda.stream(side), autocast("cuda", precision):
            for _ in range(warmup):
                model(static_x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), autocast("cuda", precision):
            static_out = model(static_x)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if x is not static_x:
            static_x.copy_(x, non_blocking=True)
        graph.replay()
        return static_out

    return step


def build_step(
    model: nn.Module,
    mode: str,
    device: str,
    precision: str,
    use_cuda_graphs: bool,
    example: tuple[torch.Tensor, torch.Tensor],
) -> tuple[Step, bool]:
    """The step for ``mode``; returns (step, whether CUDA graphs are in use)."""
    if mode == "train":
        model.train()
        criterion = nn.CrossEntropyLoss()
        optimizer = make_optimizer(model, device)
        scaler = make_scaler(device, precision)
        if use_cuda_graphs:
            try:
                return (
                    cuda_graph_train_step(model, criterion, optimizer, scaler, precision, example),
                    True,
                )
            except Exception as exc:
                _capture_failed(exc)
                optimizer.zero_grad(set_to_none=True)
        return eager_train_step(model, criterion, optimizer, scaler, device, precision), False
    model.eval()
    if use_cuda_graphs:
        try:
            return cuda_graph_infer_step(model, precision, example[0]), True
        except Exception as exc:
            _capture_failed(exc)
    return eager_infer_step(model, device, precision), False


def _capture_failed(exc: BaseException) -> None:
    log.warning(
        "CUDA graph capture failed (%s: %s); running the step eagerly", type(exc).__name__, exc
    )
    with contextlib.suppress(Exception):
        torch.cuda.synchronize()
