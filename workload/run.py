"""The benchmark pipeline: setup -> meta -> warmup -> measure -> reduce -> summary.

See :mod:`workload.metrics` for the metric definitions and :mod:`workload.timing` for how
iterations are timed.
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from workload import compat, inject
from workload import data as data_mod
from workload.device import (
    Dist,
    cuda_uuids,
    dist_from_env,
    environment,
    habana_installed,
    hpu_mode,
    init_distributed,
    resolve_device,
    resolve_precision,
    synchronize,
    torch_device,
)
from workload.errors import ConfigError
from workload.metrics import figure_prefix, global_batch, images_per_second, mean, summarize
from workload.models import build_model, check_arch
from workload.output import (
    Reporter,
    write_iterations_csv,
    write_json,
    write_rank_iterations_csv,
)
from workload.profiling import Profiler
from workload.steps import Step, build_step, compile_model, effective_compile
from workload.telemetry import (
    Sampler,
    make_sampler,
    per_gpu_telemetry,
    summarize_telemetry,
    write_csv,
)
from workload.timing import CudaEventTimer, HostTimer, Timings

log = logging.getLogger(__name__)

PROGRESS_EVERY = 10


def run(args: argparse.Namespace, reporter: Reporter) -> dict[str, Any]:
    """Run one benchmark described by ``args``; returns the summary object (rank 0)."""
    started = time.time()
    check_arch(args.arch)  # fail fast, before any device or process-group setup
    dist = dist_from_env()
    # Gaudi's mode is an environment variable that habana_frameworks reads when it is imported
    # (by resolve_device): settle it first wherever a Gaudi may be what runs.
    maybe_gaudi = args.device == "hpu" or (args.device == "auto" and habana_installed())
    gaudi_mode = hpu_mode(args.hpu_mode, args.compile) if maybe_gaudi else None
    device = resolve_device(args.device)
    if device != "hpu":
        if args.hpu_mode is not None:
            raise ConfigError(f"--hpu-mode {args.hpu_mode} applies to Gaudi; this run is on "
                              f"{device}")
        gaudi_mode = None
    compile_mode = effective_compile(args.compile, device, gaudi_mode)
    dev = torch_device(device, dist)
    init_distributed(device, dist, dev)
    torch.manual_seed(args.seed + dist.rank)
    if device == "cuda":
        torch.backends.cudnn.benchmark = True
    precision = resolve_precision(args.precision, device, log.warning)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    output_dir = Path(args.output_dir) if args.output_dir else None
    if output_dir is not None:
        output_dir.mkdir(parents=True, exist_ok=True)

    batches = _batches(args, dev, memory_format, dist)  # a bad --data fails before the model
    try:
        model = build_model(args.arch, args.num_classes, args.pretrained, args.checkpoint_dir)
        # nn.Module.to takes a device and memory_format together; torch types them apart
        model = model.to(dev, memory_format=memory_format)  # type: ignore[call-overload]
        model = _wrap_ddp(model, device, dev, dist)
        use_graphs = _want_cuda_graphs(args, device, dist)
        model = compile_model(model, compile_mode, device)
        step, use_graphs = build_step(
            model, args.mode, device, precision, use_graphs, next(batches), gaudi_mode
        )
        env = environment(device, dist) | {
            "precision": precision,
            "memory_format": "channels_last" if args.channels_last else "contiguous",
            "compile": compile_mode,
            "cuda_graphs": use_graphs,
            "arch": args.arch,
            "mode": args.mode,
            "batch_size": args.batch_size,
            "global_batch_size": global_batch(args.batch_size, dist.world_size),
            "image_size": args.image_size,
            "data": args.data,
            "decoder": batches.decoder,
            "num_classes": args.num_classes,
            "pretrained": args.pretrained,
            "seed": args.seed,
            "profiler": args.profiler,
            **({"hpu_mode": gaudi_mode} if device == "hpu" else {}),
            **_window(args),
            "api": compat.describe(
                device=device,
                mode=args.mode,
                precision=precision,
                compile_mode=compile_mode,
                cuda_graphs_used=use_graphs,
                decode=batches.decode_api,
                distributed=dist.enabled,
                pretrained=args.pretrained,
                profiler=args.profiler,
            ),
        }
        reporter.emit({"type": "meta", "env": env})
        sampler = None
        if dist.is_main:
            sampler = make_sampler(
                device,
                args.telemetry_interval,
                cuda_uuids(dist.local_world_size) if device == "cuda" else [],
            )
        if sampler is not None:
            sampler.start()
        try:
            timings, last = _measure(args, step, batches, device, dist, reporter, output_dir)
        finally:
            samples = sampler.stop() if sampler is not None else []
    finally:
        batches.close()
    return _report(
        args, env, dist, device, timings, last, samples, sampler, output_dir, reporter, started
    )


def _window(args: argparse.Namespace) -> dict[str, Any]:
    """``profile_window``: the measured iterations the profiler covers (first, last)."""
    if args.profiler == "none":
        return {}
    last = args.profile_start + args.profile_iterations - 1
    return {"profile_window": [args.profile_start, last]}


def _batches(
    args: argparse.Namespace, dev: torch.device, memory_format: torch.memory_format, dist: Dist
) -> Any:
    if args.data == "synthetic":
        return data_mod.SyntheticBatches(
            args.batch_size,
            args.image_size,
            args.num_classes,
            dev,
            memory_format,
            args.seed + dist.rank,
        )
    return data_mod.image_folder_batches(
        args.data,
        args.batch_size,
        args.image_size,
        args.mode == "train",
        dev,
        memory_format,
        args.workers,
        args.seed + dist.rank,
        shard=dist.rank,
        shards=dist.world_size,
    )


def _wrap_ddp(model: nn.Module, device: str, dev: torch.device, dist: Dist) -> nn.Module:
    """DDP with gradient buckets as views and 25 MB buckets; BN buffers not broadcast
    (per-rank BN statistics: no per-step broadcast); see :data:`workload.compat.DDP_OPTIONS`."""
    if not dist.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(
        model, device_ids=[dev.index] if device == "cuda" else None, **compat.ddp_kwargs()
    )


def _want_cuda_graphs(args: argparse.Namespace, device: str, dist: Dist) -> bool:
    if not args.cuda_graphs:
        return False
    if device != "cuda":
        log.warning("--cuda-graphs needs CUDA; running eagerly on %s", device)
        return False
    if dist.enabled:
        log.warning("--cuda-graphs is not combined with DDP here; running eagerly")
        return False
    if args.compile != "none":
        log.warning(
            "--cuda-graphs ignored with --compile %s (compile manages graphs itself)", args.compile
        )
        return False
    return True


def _timer(device: str, iterations: int) -> CudaEventTimer | HostTimer:
    if device == "cuda":
        return CudaEventTimer(iterations)
    if device == "hpu":
        return HostTimer(sync=lambda: synchronize("hpu"))
    return HostTimer()


class _Progress:
    """Periodic ``iter`` lines, read without waiting on the device (rank 0 only)."""

    def __init__(
        self,
        args: argparse.Namespace,
        timer: Any,
        reporter: Reporter,
        global_batch: int,
        device: str,
    ) -> None:
        self.prefix = figure_prefix(args.mode)
        self.timer = timer
        self.reporter = reporter
        self.global_batch = global_batch
        self.device = device
        # (iteration, loss on the host or None, event after the loss's copy or None)
        self.pending: list[tuple[int, torch.Tensor | None, Any]] = []
        # CUDA: pinned slots and events for the losses, made before the measured window
        lines = args.iterations // PROGRESS_EVERY
        copies = reporter.enabled and self.prefix == "train" and device == "cuda" and lines
        self._host = torch.empty(lines, pin_memory=True) if copies else None
        self._copied = [torch.cuda.Event() for _ in range(lines)] if copies else []
        for event in self._copied:
            event.record()  # created now (torch creates a CUDA event at its first record)

    def after(self, index: int, out: torch.Tensor) -> None:
        """Called after measured iteration ``index``; emits whatever has completed."""
        if not self.reporter.enabled:
            return
        if (index + 1) % PROGRESS_EVERY == 0:
            loss, copied = None, None
            if self.prefix == "train":
                loss = out.detach().float().reshape(-1)[:1]
                if self._host is not None:
                    k = (index + 1) // PROGRESS_EVERY - 1
                    host = self._host[k : k + 1]
                    host.copy_(loss, non_blocking=True)
                    copied = self._copied[k]
                    copied.record()  # the loss is readable once this event has completed
                    loss = host
                else:
                    loss = loss.cpu()
            self.pending.append((index, loss, copied))
        self.flush(wait=False)

    def flush(self, wait: bool) -> None:
        """Emit completed pending lines (all of them with ``wait``)."""
        while self.pending:
            index, loss, copied = self.pending[0]
            ready = self.timer.completed(index) and (copied is None or copied.query())
            if not (wait or ready):
                return
            if copied is not None:
                copied.synchronize()
            self.pending.pop(0)
            first = max(0, index + 1 - PROGRESS_EVERY)
            t = self.timer.times(first, index + 1)
            data = {
                f"{self.prefix}.total_ips": images_per_second(self.global_batch, t.iteration),
                f"{self.prefix}.compute_ips": images_per_second(self.global_batch, t.compute),
            }
            if loss is not None:
                data[f"{self.prefix}.loss"] = float(loss[0])
            self.reporter.emit({"type": "iter", "step": index + 1, "data": data})


def _measure(
    args: argparse.Namespace,
    step: Step,
    batches: Any,
    device: str,
    dist: Dist,
    reporter: Reporter,
    output_dir: Path | None,
) -> tuple[Timings, torch.Tensor]:
    """Warmup, then the timed window; returns this rank's timings and the last step output."""
    out = torch.zeros(1)
    for _ in range(args.warmup):
        x, y = next(batches)
        out = step(x, y)
    synchronize(device)
    timer = _timer(device, args.iterations)
    progress = _Progress(args, timer, reporter, global_batch(args.batch_size, dist.world_size),
                         device)
    profiler = Profiler(args.profiler, device, output_dir, dist.rank, args.iterations,
                        args.profile_start, args.profile_iterations)
    profiler.begin()
    step = inject.slowed(step, device)  # off unless WORKLOAD_INJECT_SLOWDOWN is set
    timer.start()
    for i in range(args.iterations):
        profiler.iteration_start(i)
        x, y = next(batches)
        timer.ready()
        out = step(x, y)
        timer.end()
        profiler.iteration_end(i)
        progress.after(i, out)
    timings = timer.finish()
    profiler.finish()
    progress.flush(wait=True)
    return timings, out


def _collective_tensor(values: Any, device: str) -> torch.Tensor:
    """``values`` as a tensor on this rank's device, for a collective (float64; float32 on
    Gaudi)."""
    dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else (
        torch.device(device))
    dtype = torch.float32 if device == "hpu" else torch.float64
    return torch.tensor(values, dtype=dtype, device=dev)


def _gather_ranks(timings: Timings, device: str, dist: Dist) -> list[list[float]]:
    """Every rank's own iteration times, by rank (one list for a single process): the per-GPU
    series seed 002 is about, kept beside the per-step maximum the throughput uses."""
    if not dist.enabled:
        return [list(timings.iteration)]
    mine = _collective_tensor(timings.iteration, device)
    every = [torch.empty_like(mine) for _ in range(dist.world_size)]
    torch.distributed.all_gather(every, mine)
    return [t.cpu().tolist() for t in every]


def per_rank_figures(series: list[list[float]]) -> dict[str, Any]:
    """Figures of every rank's series: ``gpu<rank>.iteration_median_s`` / ``_mean_s`` (the GPU
    of that rank), the spread of the medians across ranks, (max - min) / min in %
    (``per_gpu.spread_pct``), and the series themselves (``per_gpu.iteration_times``)."""
    out: dict[str, Any] = {"per_gpu.iteration_times": {str(r): s for r, s in enumerate(series)},
                           "per_gpu.gpus": len(series)}
    medians = []
    for rank, times in enumerate(series):
        if not times:
            continue
        median = statistics.median(times)
        medians.append(median)
        out[f"gpu{rank}.iteration_median_s"] = median
        out[f"gpu{rank}.iteration_mean_s"] = mean(times)
    if len(medians) > 1 and min(medians) > 0:
        out["per_gpu.spread_pct"] = 100.0 * (max(medians) - min(medians)) / min(medians)
    return out


def _reduce(
    timings: Timings, last: torch.Tensor, mode: str, device: str, dist: Dist
) -> tuple[list[float], list[float], list[float], float | None]:
    """Per-step max over ranks of (data, compute, iteration); mean final loss over ranks."""
    loss = float(last.detach().float().reshape(-1)[0]) if mode == "train" else None
    if not dist.enabled:
        return timings.data, timings.compute, timings.iteration, loss
    t = _collective_tensor([timings.data, timings.compute, timings.iteration], device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    if loss is not None:
        lt = _collective_tensor([loss], device)
        torch.distributed.all_reduce(lt, op=torch.distributed.ReduceOp.SUM)
        loss = float(lt[0]) / dist.world_size
    rows = t.cpu().tolist()
    return rows[0], rows[1], rows[2], loss


def _report(
    args: argparse.Namespace,
    env: dict[str, Any],
    dist: Dist,
    device: str,
    timings: Timings,
    last: torch.Tensor,
    samples: list[Any],
    sampler: Sampler | None,
    output_dir: Path | None,
    reporter: Reporter,
    started: float,
) -> dict[str, Any]:
    data_t, compute_t, iter_t, loss = _reduce(timings, last, args.mode, device, dist)
    ranks = _gather_ranks(timings, device, dist)
    prefix = figure_prefix(args.mode)
    gbs = global_batch(args.batch_size, dist.world_size)
    data: dict[str, Any] = summarize(prefix, data_t, compute_t, gbs, iter_t)
    data |= per_rank_figures(ranks)
    if loss is not None:
        data["train.loss"] = loss
    data |= {
        "iterations": args.iterations,
        "warmup": args.warmup,
        "world_size": dist.world_size,
        "global_batch_size": gbs,
        "duration_s": math.fsum(iter_t),
        "wall_time_s": time.time() - started,
    }
    window_start = timings.start_wall[0]
    window_end = timings.start_wall[-1] + timings.iteration[-1]
    if sampler is not None:
        images = args.batch_size * args.iterations * dist.local_world_size
        data |= summarize_telemetry(samples, window_start, window_end, images,
                                    sampler.reports_throttle)
        data |= per_gpu_telemetry(samples, window_start, window_end)
        env = env | {"telemetry": sampler.name}
    summary = {
        "type": "summary",
        "status": "ok",
        "data": data,
        "iteration_times": iter_t,
        "env": env,
    }
    if dist.is_main and output_dir is not None:
        write_iterations_csv(
            output_dir / "iterations.csv", timings.start_wall, data_t, compute_t, iter_t
        )
        write_rank_iterations_csv(output_dir / "iterations_per_rank.csv", ranks)
        if sampler is not None:
            write_csv(samples, output_dir / "telemetry.csv")
        write_json(output_dir / "summary.json", summary)
    reporter.emit(summary)
    return summary
