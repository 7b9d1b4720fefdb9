"""How often does ``orchestrate compare`` call two runs of the same code faster or slower, and
how often does it see a real change, by the number of repeats a side?

Simulated repeats (seeded, so the figures print the same every time) go through the verdict
rule of ``compare`` (:func:`orchestrator.results.statistics.stats.compare_samples`), and, for
comparison, through the rule before issue 31 (the bootstrap interval alone). Two kinds of
machine:

* ``steady``: each repeat is 100 images/s times a normal error of 5 % (the run-to-run noise
  measured on this project's shared VM, benchmarks/README.md);
* ``contended``: as steady, but each repeat has a 20 % chance of landing at 30-70 % of its
  value (another job took the cores: the issue's 2.9..16.9 images/s spread).

A false alarm is a ``faster``/``slower`` verdict when both runs come from the same machine and
code; detection is the share of ``faster`` verdicts when run B is 10 % (or 25 %) faster.

    python benchmarks/compare_false_alarms.py [--trials 1000] [--confidence 0.95]
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import dry_option
from orchestrator.results.statistics.stats import (
    TOO_FEW_REPEATS,
    compare_samples,
    median_bootstrap,
    quantile,
)

SIZES = (2, 3, 4, 5, 6, 8, 10)


def steady(rng: random.Random, scale: float) -> float:
    return 100.0 * scale * max(0.05, rng.gauss(1.0, 0.05))


def contended(rng: random.Random, scale: float) -> float:
    value = steady(rng, scale)
    return value * rng.uniform(0.3, 0.7) if rng.random() < 0.2 else value


def bootstrap_only(a: Sequence[float], b: Sequence[float], confidence: float) -> str:
    """The verdict before issue 31: the bootstrap interval alone (a single repeat: none)."""
    if len(a) < 2 or len(b) < 2:
        return TOO_FEW_REPEATS
    import statistics

    dist_a, dist_b = median_bootstrap(a), median_bootstrap(b)
    pairs = sorted((vb / va - 1.0, pa * pb) for va, pa in dist_a for vb, pb in dist_b)
    tail = (1.0 - confidence) / 2.0
    low, high = quantile(pairs, tail), quantile(pairs, 1.0 - tail)
    change = statistics.median(b) / statistics.median(a) - 1.0
    return "faster" if low > 0 and change > 0 else "slower" if high < 0 and change < 0 else "no"


def rates(machine: Callable[[random.Random, float], float], n: int, change: float,
          confidence: float, trials: int, seed: int) -> tuple[float, float, float]:
    """(share called faster or slower by the rule before, by compare now, share too few)."""
    rng = random.Random(seed)
    before = now = few = 0
    for _ in range(trials):
        a = [machine(rng, 1.0) for _ in range(n)]
        b = [machine(rng, 1.0 + change) for _ in range(n)]
        wanted = ("faster", "slower") if change == 0 else ("faster",)
        before += bootstrap_only(a, b, confidence) in wanted
        verdict = compare_samples(a, b, confidence).verdict
        now += verdict in wanted
        few += verdict == TOO_FEW_REPEATS
    return before / trials, now / trials, few / trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=31)
    dry_option(parser, "20 trials per line")
    args = parser.parse_args()
    if args.dry:
        args.trials = 20
    rows = []
    for name, machine in (("steady", steady), ("contended", contended)):
        for n in SIZES:
            row: list[object] = [name, n]
            for change in (0.0, 0.10, 0.25):
                before, now, few = rates(machine, n, change, args.confidence, args.trials,
                                         args.seed + n)
                row += [f"{before:.1%}", f"{now:.1%}"]
                if change == 0.0:
                    row.append(f"{few:.0%}")
            rows.append(row)
    print(f"compare verdicts at {args.confidence:.0%} confidence, {args.trials} trials per "
          f"line (seed {args.seed}): bootstrap interval alone (before) vs compare now")
    print(tabulate(rows, headers=[
        "machine", "repeats a side", "false alarms before", "now", "too few repeats",
        "+10 % found before", "now", "+25 % found before", "now"], tablefmt="github"))


if __name__ == "__main__":
    main()
