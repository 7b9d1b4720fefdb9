"""The measured step: training (forward, backward, optimizer) or inference (forward).

Performance features: channels-last (applied by the caller), AMP fp16 with a GradScaler, bf16
autocast without a scaler, SGD with momentum (fused on CUDA where torch has it, else foreach),
optional ``torch.compile`` and optional CUDA graphs.  Which API each of these calls on the
installed torch is decided in :mod:`workload.compat`.

Gaudi (``hpu``) runs in one of four modes (:func:`workload.device.hpu_mode`): eager, lazy
(``mark_step`` flushes the accumulated graph after backward and after the optimizer step, only in
this mode), compile (eager with ``torch.compile(backend="hpu_backend")``) or graph (the model
traced by ``torch.jit.trace(check_trace=False)``, as Habana's 0.13 software ran "graph mode";
the orchestrator refuses it on Gaudi software without that mode, :func:`trace_model` runs
anywhere torch does).

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

from workload import compat
from workload.device import autocast, mark_step
from workload.errors import ConfigError

log = logging.getLogger(__name__)

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def make_optimizer(model: nn.Module, device: str) -> torch.optim.Optimizer:
    """SGD with momentum (lr 0.1, wd 1e-4 as in DeepLearningExamples); see
    :func:`workload.compat.optimizer` for fused / foreach."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer: torch.optim.Optimizer = compat.optimizer(device)(params)
    return optimizer


def make_scaler(device: str, precision: str) -> Any:
    """A GradScaler for fp16 AMP, else None (bf16 and fp32 need none, and so does fp16 on a CPU
    whose torch has no CPU scaler)."""
    if precision != "amp":
        return None
    choice = compat.grad_scaler(device)
    return choice() if choice.available else None


def effective_compile(mode: str, device: str, hpu_mode: str | None) -> str:
    """The ``--compile`` mode that really applies: on Gaudi, compiled mode (``--hpu-mode
    compile``) is torch.compile with the hpu_backend (its own mode ignored), else none."""
    if device == "hpu":
        return (mode if mode != "none" else "default") if hpu_mode == "compile" else "none"
    return mode


def compile_model(model: nn.Module, mode: str, device: str) -> nn.Module:
    """Apply ``torch.compile`` (``hpu_backend`` on Gaudi, where the mode is not passed).

    Raises ConfigError where this torch cannot compile (e.g. dynamo on an unsupported Python).
    """
    choice = compat.compiler(mode, device)
    if mode == "none":
        return model
    if not choice.available:
        raise ConfigError(f"--compile {mode}: {choice.label.removeprefix('unavailable: ')}; "
                          "use --compile none")
    compiled: nn.Module = choice(model)
    return compiled


def eager_train_step(
    model: nn.Module,
    criterion: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: Any,
    device: str,
    precision: str,
    hpu_mode: str | None = None,
) -> Step:
    """One training step; returns the detached loss.  On Gaudi in lazy mode the accumulated
    graph is flushed after the backward pass and after the optimizer step (Habana's recipe)."""
    amp = compat.autocast(device, precision)  # chosen once; entered afresh each step

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with amp():
            loss = criterion(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            mark_step(device, hpu_mode)
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            mark_step(device, hpu_mode)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mark_step(device, hpu_mode)
        return loss.detach()

    return step


def eager_infer_step(
    model: nn.Module, device: str, precision: str, hpu_mode: str | None = None
) -> Step:
    """One inference step under ``torch.inference_mode``; returns the logits."""
    amp = compat.autocast(device, precision)  # chosen once; entered afresh each step

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode(), amp():
            out = model(x)
        mark_step(device, hpu_mode)
        return out

    return step


def cuda_graph_train_step(  # CUDA only
    model: nn.Module,
    criterion: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: Any,
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
    with compat.cuda_graphs()(graph):
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
        with compat.cuda_graphs()(graph), autocast("cuda", precision):
            static_out = model(static_x)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if x is not static_x:
            static_x.copy_(x, non_blocking=True)
        graph.replay()
        return static_out

    return step


def trace_model(model: nn.Module, example: torch.Tensor) -> nn.Module:
    """``model`` traced by ``torch.jit.trace`` on ``example`` (``check_trace=False``, as Habana's
    ResNet demo traced it): the graph mode of seed 004. The traced module shares the model's
    parameters, so the optimizer built on ``model`` trains it."""
    traced: nn.Module = torch.jit.trace(model, example, check_trace=False)
    return traced


def build_step(
    model: nn.Module,
    mode: str,
    device: str,
    precision: str,
    use_cuda_graphs: bool,
    example: tuple[torch.Tensor, torch.Tensor],
    hpu_mode: str | None = None,
) -> tuple[Step, bool]:
    """The step for ``mode``; returns (step, whether CUDA graphs are in use).  ``hpu_mode``:
    the Gaudi execution mode (``mark_step`` only in lazy mode; ``graph``: the model traced)."""
    if mode == "train":
        model.train()
        if hpu_mode == "graph":
            base, model = model, trace_model(model, example[0])
            criterion = nn.CrossEntropyLoss()
            optimizer = make_optimizer(base, device)
            scaler = make_scaler(device, precision)
            return (eager_train_step(model, criterion, optimizer, scaler, device, precision,
                                     hpu_mode), False)
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
        return (
            eager_train_step(model, criterion, optimizer, scaler, device, precision, hpu_mode),
            False,
        )
    model.eval()
    if hpu_mode == "graph":
        with torch.no_grad():
            model = trace_model(model, example[0])
    if use_cuda_graphs:
        try:
            return cuda_graph_infer_step(model, precision, example[0]), True
        except Exception as exc:
            _capture_failed(exc)
    return eager_infer_step(model, device, precision, hpu_mode), False


def _capture_failed(exc: BaseException) -> None:
    log.warning(
        "CUDA graph capture failed (%s: %s); running the step eagerly", type(exc).__name__, exc
    )
    with contextlib.suppress(Exception):
        torch.cuda.synchronize()
