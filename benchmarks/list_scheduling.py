"""List scheduling of a simulated sweep on a :class:`~orchestrator.plan.placement.GpuPool`.

The benchmark's model of a sweep (``benchmarks/scheduling.py``): cells with known durations are
started greedily, in a chosen order, whenever the pool can place them, in a time-ordered event
loop. The real sweep (``orchestrator/sweep.py``) places cells with the same pool as they come,
without knowing their durations; this simulation measures how close such greedy placement gets
to the lower bound, and what the order of the cells changes.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from orchestrator.plan.placement import Allocation, GpuPool, Request

Order = Literal["lpt", "area", "fifo"]


@dataclass(frozen=True)
class ScheduledCell:
    """One cell of a simulated schedule."""

    cell_id: str
    start: float
    end: float
    allocation: Allocation


@dataclass(frozen=True)
class Schedule:
    """A simulated run: when each cell ran where, and the cells that could not run."""

    cells: tuple[ScheduledCell, ...]
    unplaceable: dict[str, str] = field(default_factory=dict)

    @property
    def makespan(self) -> float:
        """End of the last cell (0 when nothing ran)."""
        return max((c.end for c in self.cells), default=0.0)


def _sorted(
    requests: Sequence[Request], durations: Mapping[str, float], order: Order
) -> list[Request]:
    indexed = list(enumerate(requests))
    if order == "fifo":
        return [r for _, r in indexed]

    def lpt(p: tuple[int, Request]) -> tuple[float, ...]:
        return (-durations[p[1].cell_id], -p[1].gpus, p[0])

    def area(p: tuple[int, Request]) -> tuple[float, ...]:
        return (-durations[p[1].cell_id] * max(1, p[1].gpus), p[0])

    keys = {"lpt": lpt, "area": area}
    if order not in keys:
        raise ValueError(f"unknown order {order!r}")
    return [r for _, r in sorted(indexed, key=keys[order])]


def schedule(
    requests: Sequence[Request],
    durations: Mapping[str, float],
    pool: GpuPool,
    order: Order = "lpt",
) -> Schedule:
    """Simulate running ``requests`` on ``pool``; ``durations[cell_id]`` in any time unit.

    ``order="lpt"`` (default) tries the longest cells first, ``"area"`` the largest
    GPU-seconds first, ``"fifo"`` the given order. At time 0 and whenever a cell ends, every
    waiting cell that fits is started, in that order. Cells that can never be placed are
    reported in ``unplaceable`` with the reason. The pool is left as it was found.
    """
    unplaceable = pool.check_placeable(requests)
    pending = [r for r in _sorted(requests, durations, order) if r.cell_id not in unplaceable]
    running: list[tuple[float, int, Allocation]] = []
    done: list[ScheduledCell] = []
    now, seq = 0.0, 0
    while pending or running:
        waiting = []
        for req in pending:
            alloc = pool.try_acquire(req)
            if alloc is None:
                waiting.append(req)
                continue
            end = now + float(durations[req.cell_id])
            heapq.heappush(running, (end, seq, alloc))
            seq += 1
            done.append(ScheduledCell(req.cell_id, now, end, alloc))
        pending = waiting
        if not running:
            for req in pending:  # nothing runs and nothing fits: can never start
                unplaceable[req.cell_id] = "never fit on the pool as it is (hosts lost?)"
            break
        now = running[0][0]
        while running and running[0][0] == now:
            _, _, alloc = heapq.heappop(running)
            pool.release(alloc)
    done.sort(key=lambda c: (c.start, c.cell_id))
    return Schedule(tuple(done), unplaceable)


def lower_bound(
    requests: Sequence[Request], durations: Mapping[str, float], total_gpus: int
) -> float:
    """``max(GPU-seconds / GPUs, longest cell)``: no schedule can finish sooner."""
    if not requests:
        return 0.0
    work = sum(durations[r.cell_id] * r.gpus for r in requests)
    longest = max(durations[r.cell_id] for r in requests)
    return max(work / total_gpus if total_gpus else 0.0, longest)
