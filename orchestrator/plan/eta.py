"""When a sweep will be done: the estimate its progress display and lines show. Pure: no I/O,
no clocks (the caller says how long running cells have run).

:class:`Eta`: the expected seconds of work left (cells not started, plus what is left of running
ones) from the durations of earlier runs of the same matrix (the results store's
:meth:`~orchestrator.results.folders.store.Store.expected_durations`, by content hash), scaled by
how today's
finished cells compare with their expectation (median of actual / expected), divided by the
number of cells the sweep runs at once, and never less than the longest single cell left. With
no history it learns from today's finished cells (their median duration). A matrix's control
measurements (:mod:`orchestrator.plan.controls`) are not cells of the plan: the time they took
so far per finished cell (:meth:`Eta.control_finished`) is added for each cell left.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.plan.matrix import Cell


@dataclass
class Eta:
    """Time left in a sweep, from expected durations (seconds) per content hash.

    ``concurrency``: how many cells run at once on average (1 for a serial backend; for a GPU
    pool about total GPUs / GPUs per cell). Feed it :meth:`started` and :meth:`finished` as
    cells go, and ask :meth:`remaining_s` with the running cells' elapsed seconds.
    """

    cells: Sequence[Cell]
    expected: Mapping[str, float]
    concurrency: float = 1.0
    _pending: dict[str, Cell] = field(init=False)
    _running: dict[str, Cell] = field(init=False)
    _ratios: list[float] = field(init=False, default_factory=list)
    _actual: list[float] = field(init=False, default_factory=list)
    _control_s: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        if self.concurrency <= 0:
            raise ValueError("concurrency must be positive")
        self._pending = {c.id: c for c in self.cells}
        self._running = {}

    def started(self, cell_id: str) -> None:
        """A cell started."""
        cell = self._pending.pop(cell_id, None)
        if cell is not None:
            self._running[cell_id] = cell

    def finished(self, cell_id: str, duration_s: float | None) -> None:
        """A cell ended (any status); ``duration_s``: how long it ran, if it ran."""
        cell = self._running.pop(cell_id, None) or self._pending.pop(cell_id, None)
        if cell is None or duration_s is None or duration_s <= 0:
            return
        self._actual.append(duration_s)
        guess = self.expected.get(cell.hash)
        if guess:
            self._ratios.append(duration_s / guess)

    def control_finished(self, duration_s: float | None) -> None:
        """A control measurement ended: its time counts as overhead of the cells."""
        if duration_s is not None and duration_s > 0:
            self._control_s += duration_s

    @property
    def pace(self) -> float:
        """Actual / expected duration of today's finished cells (median; 1.0 before any)."""
        return statistics.median(self._ratios) if self._ratios else 1.0

    def _typical(self, pace: float) -> float | None:
        """Expected seconds today of a cell whose configuration has no history: a typical cell
        of this matrix, else the median of today's finished cells (None: nothing known)."""
        known = list(self.expected.values())
        if known:
            return statistics.median(known) * pace
        return statistics.median(self._actual) if self._actual else None

    def remaining_s(self, elapsed: Mapping[str, float] | None = None) -> float | None:
        """Seconds until the sweep ends, or None while nothing is known to estimate from.

        ``elapsed``: seconds each running cell has run so far (missing: 0). The pace and the
        typical cell are computed once per call, not per cell (the display asks on every
        progress line of every running cell).
        """
        elapsed = elapsed or {}
        pace = self.pace
        typical = self._typical(pace)

        def guess_of(cell: Cell) -> float | None:  # expected seconds of ``cell`` today
            if cell.hash in self.expected:
                return float(self.expected[cell.hash]) * pace
            return typical

        left = []
        for cell in self._pending.values():
            guess = guess_of(cell)
            if guess is None:
                return None
            left.append(guess)
        for cell_id, cell in self._running.items():
            guess = guess_of(cell)
            if guess is None:
                return None
            left.append(max(0.0, guess - elapsed.get(cell_id, 0.0)))
        if self._control_s and self._actual:  # controls so far, per cell ended, for each left
            left = [v + self._control_s / len(self._actual) for v in left]
        # cells run side by side, but no sooner than the longest one left can end
        return max(sum(left) / self.concurrency, max(left, default=0.0))

    @property
    def pending(self) -> Iterable[str]:
        return tuple(self._pending)


def format_duration(seconds: float | None) -> str:
    """``1:02:03``, ``2:03``, or ``?`` when unknown."""
    if seconds is None:
        return "?"
    total = int(round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
