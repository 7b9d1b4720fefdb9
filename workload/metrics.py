"""Pure metric helpers: percentiles, throughput and the summary ``data`` block.

Definitions (DLLogger names as in NVIDIA DeepLearningExamples ConvNets):

* per iteration, ``data_time`` runs from the end of the previous iteration until the batch
  is ready on the device, ``compute_time`` is the step itself, and the iteration time is
  their sum;
* warmup iterations are never included;
* under DDP every rank times its own steps; per step the *maximum* over ranks is kept
  (the slowest rank sets the pace) and the global batch is ``world_size * batch_size``.

Throughput uses **totals**: ``total_ips = global_batch * N / sum(iteration_time)`` and
``compute_ips = global_batch * N / sum(compute_time)`` over the N measured iterations, i.e.
global batch divided by the *mean* time. DeepLearningExamples instead averages the
per-iteration ips (mean of ratios), which over-weights unusually fast iterations; the
benchmark script applies the totals rule to both programs so they compare like for like.
Latency percentiles (``*_latency_atXX``, seconds per batch) use the nearest-rank rule of
``numpy.quantile(..., method="nearest")``, the rule DeepLearningExamples uses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

LATENCY_PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)


def figure_prefix(mode: str) -> str:
    """The prefix of a run's figures by its mode: ``train`` for training, ``val`` for
    inference (DeepLearningExamples' names: ``train.total_ips``, ``val.total_ips``). The
    orchestrator names the figures it reads by the same rule."""
    return "train" if mode == "train" else "val"


def global_batch(batch_size: int, world_size: int) -> int:
    """The images one step takes over every rank: ``batch_size x world_size``."""
    return batch_size * world_size


def percentile(values: Sequence[float], q: float) -> float:
    """Return the ``q``-th percentile (0..100) of ``values`` by the nearest-rank rule.

    Matches ``numpy.quantile(values, q / 100, method="nearest")`` (ties round half to even).
    """
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    ordered = sorted(values)
    index = round(q / 100.0 * (len(ordered) - 1))
    return float(ordered[index])


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean; raises on an empty sequence."""
    if not values:
        raise ValueError("mean of an empty sequence")
    return float(math.fsum(values) / len(values))


def images_per_second(images_per_iteration: int, times: Sequence[float]) -> float:
    """Throughput over a run: ``images_per_iteration * len(times) / sum(times)``."""
    total = math.fsum(times)
    if total <= 0.0:
        return float("inf") if times else 0.0
    return images_per_iteration * len(times) / total


def summarize(
    prefix: str,
    data_times: Sequence[float],
    compute_times: Sequence[float],
    global_batch_size: int,
    iteration_times: Sequence[float] | None = None,
) -> dict[str, float]:
    """Build the throughput/latency part of the summary for ``prefix`` (``train``/``val``).

    ``iteration_times`` defaults to ``data + compute`` per step; pass it explicitly when the
    per-step values were reduced across ranks separately.
    """
    if len(data_times) != len(compute_times):
        raise ValueError("data_times and compute_times differ in length")
    if not compute_times:
        raise ValueError("no measured iterations")
    totals = (
        list(iteration_times)
        if iteration_times is not None
        else [d + c for d, c in zip(data_times, compute_times, strict=True)]
    )
    out: dict[str, float] = {
        f"{prefix}.total_ips": images_per_second(global_batch_size, totals),
        f"{prefix}.compute_ips": images_per_second(global_batch_size, compute_times),
        f"{prefix}.data_time": mean(data_times),
        f"{prefix}.compute_time": mean(compute_times),
    }
    for q in LATENCY_PERCENTILES:
        out[f"{prefix}.compute_latency_at{q}"] = percentile(compute_times, q)
    for q in LATENCY_PERCENTILES:
        out[f"{prefix}.total_latency_at{q}"] = percentile(totals, q)
    return out
