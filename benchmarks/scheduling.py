"""Makespan of GPU-aware placement vs a serial bash loop, on a simulated mixed sweep.

A seeded sweep of 1/2/4/8-GPU cells with known durations runs (in simulation) on two 8-GPU hosts:

* ``serial``: one cell after another in matrix order, as ``for cell in ...; do run; done`` would;
* ``fifo, plan order (today)``: our pool and event loop, cells tried in plan order (repeat 1 of
  every cell, then repeat 2: what the sweep does without history);
* ``fifo, repeats adjacent``: the same with a cell's repeats next to each other (the order this
  benchmark used before the plan order was modelled; kept to compare with its earlier 1.077);
* ``lpt``: our scheduler, longest cells first (the default of ``list_scheduling.schedule``);
* ``area``: our scheduler, largest GPU-seconds first;
* ``shipped``: the order the sweep ships (:func:`orchestrator.plan.ordering.order_cells` with a
  seed, as a sweep that can run several cells at once uses it: repeats interleaved, each round
  shuffled, then sorted by *expected*-duration class, longest first; cells within a factor
  1.25 of each other keep their random order), tried in that order by the same pool;
* ``before issue 25``: exactly longest expected first within a repeat, no shuffle.

The expected durations are what the results store would give: the median duration of each
configuration over 3 earlier simulated runs (same noise model, other seeds), not the true
durations of this run. Every makespan is set against the lower bound
``max(total GPU-seconds / total GPUs, longest cell)``. ``lpt`` and ``area`` know every true
duration and ignore repeats: they are references, not shippable.

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

from benchmarks.common import dry_option
from benchmarks.list_scheduling import lower_bound, schedule
from orchestrator.config.matrix_file import CellParams
from orchestrator.plan.matrix import Cell
from orchestrator.plan.ordering import order_cells
from orchestrator.plan.placement import GpuPool, HostSpec, Request

MODELS = {"resnet50": 240.0, "vit-b16": 420.0, "bert-large": 600.0, "gpt2-medium": 900.0}
BATCH = {"bs-small": 0.6, "bs-large": 1.0}
GPUS = (1, 2, 4, 8)


def make_sweep(seed: int, repeats: int) -> tuple[list[Request], dict[str, float]]:
    """Cells in plan order (repeat k of all cells before repeat k+1, as the matrix expands
    them: what the sweep tries today) and their durations in seconds."""
    rng = random.Random(seed)
    requests, durations = [], {}
    for model, gpus, batch, rep in product(MODELS, GPUS, BATCH, range(1, repeats + 1)):
        cell = f"{model}-g{gpus}-{batch}-r{rep}"
        # Fixed iterations per GPU: time grows slowly with GPU count (communication), plus noise.
        seconds = MODELS[model] * BATCH[batch] * (1 + 0.08 * math.log2(gpus))
        durations[cell] = round(seconds * rng.uniform(0.7, 1.3), 1)
        requests.append(Request(cell, "a100", gpus))
    plan_order = sorted(range(len(requests)), key=lambda i: (i % repeats, i))
    return [requests[i] for i in plan_order], durations


def config_of(cell_id: str) -> str:
    """The configuration of a cell id (its content hash stand-in): the id without its repeat."""
    return cell_id.rsplit("-r", 1)[0]


def as_cells(requests: list[Request]) -> list[Cell]:
    """The sweep's cells as the matrix would give them (hash: the configuration)."""
    return [Cell(r.cell_id, config_of(r.cell_id), int(r.cell_id.rsplit("-r", 1)[1]),
                 CellParams(hardware="a100", gpus=r.gpus), config_of(r.cell_id))
            for r in requests]


def expected_durations(seed: int, repeats: int, earlier: int = 3) -> dict[str, float]:
    """What the store gives: each configuration's median duration over ``earlier`` earlier
    runs (same sweep, other noise draws)."""
    seen: dict[str, list[float]] = {}
    for k in range(1, earlier + 1):
        _, durations = make_sweep(seed * 1000 + k, repeats)
        for cell, seconds in durations.items():
            seen.setdefault(config_of(cell), []).append(seconds)
    return {config: statistics.median(v) for config, v in seen.items()}


def shipped(requests: list[Request], seed: int, repeats: int) -> list[Request]:
    """``requests`` in the order the sweep ships: :func:`orchestrator.plan.ordering.order_cells`
    with a seed (each round of repeats shuffled, then sorted by expected-duration class,
    longest first: the sweep's order when several cells run at once)."""
    by_id = {r.cell_id: r for r in requests}
    ordered = order_cells(as_cells(requests), expected_durations(seed, repeats), seed=seed,
                          parallel=True)
    return [by_id[c.id] for c in ordered]


def exact_lpt(requests: list[Request], seed: int, repeats: int) -> list[Request]:
    """The order before issue 25: within a repeat, exactly longest expected first (ties: more
    GPUs, then plan order), no shuffle."""
    expected = expected_durations(seed, repeats)
    index = {r.cell_id: i for i, r in enumerate(requests)}

    def key(r: Request) -> tuple[int, float, int, int]:
        return (int(r.cell_id.rsplit("-r", 1)[1]), -expected[config_of(r.cell_id)], -r.gpus,
                index[r.cell_id])

    return sorted(requests, key=key)


def pool() -> GpuPool:
    """Two simulated 8-GPU hosts."""
    return GpuPool([HostSpec(f"dgx-{c}", frozenset({"a100"}), tuple(range(8))) for c in "ab"])


def makespans(requests: list[Request], durations: dict[str, float], seed: int, repeats: int
              ) -> dict[str, float]:
    """Makespan of every strategy, plus the lower bound."""
    out = {"serial (bash loop)": sum(durations.values())}
    by_id = {r.cell_id: r for r in requests}
    adjacent = [by_id[cell] for cell in durations]  # drawn with a cell's repeats together
    out["fifo, repeats adjacent"] = schedule(adjacent, durations, pool(), order="fifo").makespan
    out["fifo, plan order (today)"] = schedule(requests, durations, pool(),
                                               order="fifo").makespan
    for order in ("lpt", "area"):
        out[f"{order} (GpuPool)"] = schedule(requests, durations, pool(), order=order).makespan
    out["before issue 25 (exact LPT)"] = schedule(exact_lpt(requests, seed, repeats), durations,
                                                  pool(), order="fifo").makespan
    out["shipped (order_cells)"] = schedule(shipped(requests, seed, repeats), durations, pool(),
                                            order="fifo").makespan
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
    dry_option(parser, "the summary over 2 seeds")
    args = parser.parse_args()
    if args.dry:
        args.seeds = 2

    requests, durations = make_sweep(args.seed, args.repeats)
    counts = {g: sum(r.gpus == g for r in requests) for g in GPUS}
    gpu_s = sum(durations[r.cell_id] * r.gpus for r in requests)
    print(
        f"sweep: {len(requests)} cells ({', '.join(f'{n}x {g}-GPU' for g, n in counts.items())}),"
        f" {gpu_s / 3600:.1f} GPU-hours, seed {args.seed}; hosts: 2 x 8 GPUs"
    )
    result = makespans(requests, durations, args.seed, args.repeats)
    bound, serial = result["lower bound"], result["serial (bash loop)"]
    rows = [
        [name, f"{value:.0f}", hms(value), f"{value / bound:.3f}", f"{serial / value:.2f}x"]
        for name, value in result.items()
    ]
    headers = ["strategy", "makespan s", "h:mm:ss", "/ lower bound", "speedup vs serial"]
    print(tabulate(rows, headers=headers, tablefmt="simple"))

    ratios: dict[str, list[float]] = {}
    for seed in range(args.seeds):
        res = makespans(*make_sweep(seed, args.repeats), seed, args.repeats)
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
