"""Makespan of GPU-aware placement vs a serial bash loop, on a simulated mixed sweep.

A seeded sweep of 1/2/4/8-GPU cells with known durations runs (in simulation) on two 8-GPU hosts:

* ``serial``: one cell after another in matrix order, as ``for cell in ...; do run; done`` would;
* ``fifo``: our pool and event loop, cells tried in matrix order;
* ``lpt``: our scheduler, longest cells first (the default of ``list_scheduling.schedule``);
* ``area``: our scheduler, largest GPU-seconds first;

against the lower bound ``max(total GPU-seconds / total GPUs, longest cell)``.

    python benchmarks/scheduling.py [--seed 7] [--repeats 2] [--seeds 20]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from itertools import product
from pathlib import Path

from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.list_scheduling import lower_bound, schedule  # noqa: E402
from orchestrator.placement import GpuPool, HostSpec, Request  # noqa: E402

MODELS = {"resnet50": 240.0, "vit-b16": 420.0, "bert-large": 600.0, "gpt2-medium": 900.0}
BATCH = {"bs-small": 0.6, "bs-large": 1.0}
GPUS = (1, 2, 4, 8)


def make_sweep(seed: int, repeats: int) -> tuple[list[Request], dict[str, float]]:
    """Cells in matrix order (model x gpus x batch x repeat) and their durations in seconds."""
    rng = random.Random(seed)
    requests, durations = [], {}
    for model, gpus, batch, rep in product(MODELS, GPUS, BATCH, range(1, repeats + 1)):
        cell = f"{model}-g{gpus}-{batch}-r{rep}"
        # Fixed iterations per GPU: time grows slowly with GPU count (communication), plus noise.
        seconds = MODELS[model] * BATCH[batch] * (1 + 0.08 * math.log2(gpus))
        durations[cell] = round(seconds * rng.uniform(0.7, 1.3), 1)
        requests.append(Request(cell, "a100", gpus))
    return requests, durations


def pool() -> GpuPool:
    """Two simulated 8-GPU hosts."""
    return GpuPool([HostSpec(f"dgx-{c}", frozenset({"a100"}), tuple(range(8))) for c in "ab"])


def makespans(requests: list[Request], durations: dict[str, float]) -> dict[str, float]:
    """Makespan of every strategy, plus the lower bound."""
    out = {"serial (bash loop)": sum(durations.values())}
    for order in ("fifo", "lpt", "area"):
        out[f"{order} (GpuPool)"] = schedule(requests, durations, pool(), order=order).makespan
    out["lower bound"] = lower_bound(requests, durations, pool().total_gpus())
    return out


def hms(seconds: float) -> str:
    minutes, sec = divmod(round(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{sec:02d}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=2, help="repeats per cell (default 2)")
    parser.add_argument("--seeds", type=int, default=20, help="seeds for the summary (default 20)")
    args = parser.parse_args()

    requests, durations = make_sweep(args.seed, args.repeats)
    counts = {g: sum(r.gpus == g for r in requests) for g in GPUS}
    gpu_s = sum(durations[r.cell_id] * r.gpus for r in requests)
    print(
        f"sweep: {len(requests)} cells ({', '.join(f'{n}x {g}-GPU' for g, n in counts.items())}),"
        f" {gpu_s / 3600:.1f} GPU-hours, seed {args.seed}; hosts: 2 x 8 GPUs"
    )
    result = makespans(requests, durations)
    bound, serial = result["lower bound"], result["serial (bash loop)"]
    rows = [
        [name, f"{value:.0f}", hms(value), f"{value / bound:.3f}", f"{serial / value:.2f}x"]
        for name, value in result.items()
    ]
    headers = ["strategy", "makespan s", "h:mm:ss", "/ lower bound", "speedup vs serial"]
    print(tabulate(rows, headers=headers, tablefmt="simple"))

    ratios: dict[str, list[float]] = {}
    for seed in range(args.seeds):
        res = makespans(*make_sweep(seed, args.repeats))
        for name, value in res.items():
            ratios.setdefault(name, []).append(value / res["lower bound"])
    print(f"\nover seeds 0..{args.seeds - 1}: makespan / lower bound")
    summary = [
        [name, f"{statistics.mean(v):.3f}", f"{min(v):.3f}", f"{max(v):.3f}"]
        for name, v in ratios.items()
        if name != "lower bound"
    ]
    print(tabulate(summary, headers=["strategy", "mean", "best", "worst"], tablefmt="simple"))


if __name__ == "__main__":
    main()
