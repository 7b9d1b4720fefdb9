"""The order a sweep tries its cells in. Pure: no I/O, no clocks.

**Rounds.** Repeats stay interleaved: every cell of repeat *k* comes before any of repeat
*k+1* (a round), so a machine's slow drift over the night spreads over every configuration.

**A seeded random order within each round** (:func:`order_cells` with ``seed``): each round is
shuffled by its own draw from ``random.Random(seed)``, so a configuration takes another place
in every round and every night, and drift within a night does not line up with one
configuration. The seed is recorded in the run's ``plan.json`` and ``run.json``
(``order_seed``); ``orchestrate matrix --order-seed N`` gives the same order again (for the same
cells, and the same expected durations when the sweep can run several cells at once: see below).

**Longest first where it matters.** When a sweep can run several cells at once (a pool of GPUs
or hosts), the order decides how long the sweep takes: a long cell started last keeps the
machine busy alone at the end. There the shuffled round is then sorted, stably, by *duration
class*, longest first: cells whose expected durations are within a factor of
:data:`SIMILAR` of each other share a class and keep their random order; a cell whose
configuration has no expected duration (new, or never ended ok) comes first, with the other
unknown ones, so a long unknown never ends up alone at the end and its duration is learned
early; among equal classes, more GPUs first. When only one cell runs at a time (one GPU, the
CPU, a serial backend) the order cannot change the sweep's length, and the shuffle stands
alone. (Without a seed the round keeps the matrix order before that sort: the order of
orchestrate before issue 25.)

**Expected durations** come from the results store:
:meth:`orchestrator.results.folders.store.Store.expected_durations` (median duration of each
configuration's ok cells over the last runs of the matrix), keyed by the cell's content hash
(``Cell.hash``). The same expected durations make the sweep's ETA
(:class:`orchestrator.plan.eta.Eta`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

from orchestrator.plan.matrix import Cell

#: Expected durations within this factor of each other are one duration class (their order
#: within a round stays random). benchmarks/scheduling.py measures what it costs in makespan.
SIMILAR = 1.25

#: The order's rule in words, recorded in plan.json beside the seed.
RULE = ("rounds of repeats (repeat k of every cell before repeat k+1); within a round a "
        "seeded random order; when several cells can run at once, sorted stably by expected "
        f"duration class (factor {SIMILAR}), longest first, unknown durations first")


def duration_class(seconds: float) -> int:
    """The class of an expected duration: equal for durations within about :data:`SIMILAR`."""
    return math.floor(math.log(max(seconds, 1e-3)) / math.log(SIMILAR))


def order_cells(cells: Sequence[Cell], expected: Mapping[str, float], seed: int | None = None,
                parallel: bool = True) -> list[Cell]:
    """``cells`` in the order to try them: by round (repeat); within a round shuffled by
    ``seed`` (None: matrix order); when ``parallel``, then by duration class, longest first."""
    rounds: dict[int, list[Cell]] = {}
    for cell in cells:
        rounds.setdefault(cell.repeat, []).append(cell)
    rng = random.Random(seed) if seed is not None else None
    out: list[Cell] = []
    for repeat in sorted(rounds):
        members = list(rounds[repeat])
        if rng is not None:
            rng.shuffle(members)
        if parallel:
            members.sort(key=lambda c: _class_key(c, expected))
        out += members
    return out


def _class_key(cell: Cell, expected: Mapping[str, float]) -> tuple[int, int, int]:
    if cell.hash not in expected:  # unknown: first
        return (0, 0, 0)
    return (1, -duration_class(float(expected[cell.hash])), -cell.params.gpus)


def recorded_order(cells: Sequence[Cell], order: Sequence[str]) -> list[Cell]:
    """``cells`` in a recorded order (plan.json's ``order``: cell ids); cells it does not list
    keep their order, after those it does (``--resume`` keeps the run's order)."""
    position = {cid: i for i, cid in enumerate(order)}
    return sorted(cells, key=lambda c: position.get(c.id, len(position)))
