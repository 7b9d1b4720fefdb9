"""The order a sweep tries its cells in, and its ETA, from earlier runs' durations. Pure: no I/O,
no clocks.

**Order** (:func:`order_cells`): repeats stay interleaved (every cell of repeat *k* before any
of repeat *k+1*, so a machine's slow drift spreads over the whole matrix); within a repeat, the
longest expected cells first (longest processing time first: the short ones fill the gaps at
the end), more GPUs first among equals, then matrix order. A cell whose configuration has no
expected duration (new, or never ended ok) is treated as longer than every known one: it goes
first in its repeat, so a long unknown never ends up alone at the end of the sweep, and its
duration is learned early. With no durations at all the order is the matrix order.

**Expected durations** come from the results store:
:meth:`orchestrator.store.Store.expected_durations` (median duration of each configuration's ok
cells over the last runs of the matrix), keyed by the cell's content hash (``Cell.hash``).

**ETA** (:class:`Eta`): the expected seconds of work left (cells not started, plus what is left
of running ones), scaled by how today's finished cells compare with their expectation (median
of actual / expected), divided by the number of cells the sweep runs at once, and never less
than the longest single cell left.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.matrix import Cell


def order_cells(cells: Sequence[Cell], expected: Mapping[str, float]) -> list[Cell]:
    """``cells`` in the order to try them: by repeat, then longest expected first."""
    index = {id(c): i for i, c in enumerate(cells)}

    def key(cell: Cell) -> tuple[int, int, float, int, int]:
        if cell.hash not in expected:  # unknown: first, in matrix order
            return (cell.repeat, 0, 0.0, 0, index[id(cell)])
        return (cell.repeat, 1, -float(expected[cell.hash]), -cell.params.gpus,
                index[id(cell)])

    return sorted(cells, key=key)


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

    @property
    def pace(self) -> float:
        """Actual / expected duration of today's finished cells (median; 1.0 before any)."""
        return statistics.median(self._ratios) if self._ratios else 1.0

    def _guess(self, cell: Cell) -> float | None:
        """Expected seconds of ``cell`` today."""
        if cell.hash in self.expected:
            return float(self.expected[cell.hash]) * self.pace
        known = list(self.expected.values())
        if known:  # an unknown configuration: a typical cell of this matrix
            return statistics.median(known) * self.pace
        return statistics.median(self._actual) if self._actual else None

    def remaining_s(self, elapsed: Mapping[str, float] | None = None) -> float | None:
        """Seconds until the sweep ends, or None while nothing is known to estimate from.

        ``elapsed``: seconds each running cell has run so far (missing: 0).
        """
        elapsed = elapsed or {}
        left = []
        for cell in self._pending.values():
            guess = self._guess(cell)
            if guess is None:
                return None
            left.append(guess)
        for cell_id, cell in self._running.items():
            guess = self._guess(cell)
            if guess is None:
                return None
            left.append(max(0.0, guess - elapsed.get(cell_id, 0.0)))
        # cells run side by side, but no sooner than the longest one left can end
        return max(sum(left) / self.concurrency, max(left, default=0.0))

    @property
    def pending(self) -> Iterable[str]:
        return tuple(self._pending)
