"""The order a sweep tries its cells in, from earlier runs' durations. Pure: no I/O, no clocks.

**Order** (:func:`order_cells`): repeats stay interleaved (every cell of repeat *k* before any
of repeat *k+1*, so a machine's slow drift spreads over the whole matrix); within a repeat, the
longest expected cells first (longest processing time first: the short ones fill the gaps at
the end), more GPUs first among equals, then matrix order. A cell whose configuration has no
expected duration (new, or never ended ok) is treated as longer than every known one: it goes
first in its repeat, so a long unknown never ends up alone at the end of the sweep, and its
duration is learned early. With no durations at all the order is the matrix order.

**Expected durations** come from the results store:
:meth:`orchestrator.results.store.Store.expected_durations` (median duration of each
configuration's ok
cells over the last runs of the matrix), keyed by the cell's content hash (``Cell.hash``).

The same expected durations make the sweep's ETA (:class:`orchestrator.plan.eta.Eta`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from orchestrator.plan.matrix import Cell


def order_cells(cells: Sequence[Cell], expected: Mapping[str, float]) -> list[Cell]:
    """``cells`` in the order to try them: by repeat, then longest expected first."""
    index = {id(c): i for i, c in enumerate(cells)}

    def key(cell: Cell) -> tuple[int, int, float, int, int]:
        if cell.hash not in expected:  # unknown: first, in matrix order
            return (cell.repeat, 0, 0.0, 0, index[id(cell)])
        return (cell.repeat, 1, -float(expected[cell.hash]), -cell.params.gpus,
                index[id(cell)])

    return sorted(cells, key=key)
