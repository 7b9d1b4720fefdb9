"""When a sweep measures its control, and where. Pure: no I/O, no clocks, no threads.

A matrix's ``[control]`` (:class:`~orchestrator.config.matrix_file.ControlSpec`) is a pinned
measurement: its figures move only with the machine (clocks, thermals, neighbours), never with
the code under test, so a configuration's figure divided by the control's measured beside it
cancels the machine's drift (:mod:`orchestrator.results.statistics.normalise`). For that the control
must share the cell's host, GPUs and time, so it runs *in the cells' own allocations*:

* a **slot** is where a configuration cell ran: its hosts and the exact GPU ids it was given;
* **before** the first configuration cell on a slot, a control measurement runs on it (the
  cell waits for it, holding its allocation);
* **after** every ``every``-th configuration cell on a slot, and after any cell that ends when
  no cell is waiting any more (the sweep's last cells), a control measurement runs on the same
  allocation before it is given back;
* the control runs on the first host of the slot, on the first ``gpus`` of its GPU ids (the
  matrix refuses a control that needs more GPUs than a cell it calibrates has).

So on one slot the sequence is ``C x x C x x C ... x C`` (``every = 2``): every configuration
cell has a control measurement on its own host and GPUs at most ``every - 1`` cells before it
and after it. A cell that ends while others still wait, on a slot no later cell takes, keeps
only the control before it (the ratio then uses that one alone).

Control measurements are numbered per control group (``control-<hardware>-c1``, ``-c2`` ...);
a resumed run continues the numbers it finds on disk.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from orchestrator.plan.matrix import Cell
from orchestrator.plan.placement import Allocation, Slot

SlotKey = tuple[Slot, ...]


def slot_of(allocation: Allocation) -> SlotKey:
    """The slot an allocation stands for: its hosts and GPU ids (not the cell it was for)."""
    return allocation.slots


def control_allocation(control: Cell, allocation: Allocation) -> Allocation:
    """Where a control measurement runs inside a configuration cell's allocation: its first
    host, the first ``control.params.gpus`` GPU ids there (none where the slot has none)."""
    first = allocation.slots[0]
    return Allocation(control.id, (Slot(first.host, first.gpu_ids[: control.params.gpus]),))


@dataclass
class ControlSchedule:
    """The control measurements of one sweep: which to run, before or after which cell.

    ``template_for`` gives a configuration cell's control template (None: not calibrated);
    ``every``: a control after every N configuration cells on a slot; ``numbers``: the highest
    measurement number already used per control group (a resumed run)."""

    template_for: Callable[[Cell], Cell | None]
    every: int
    numbers: dict[str, int] = field(default_factory=dict)
    #: slot -> configuration cells ended there since its last control measurement
    _since: dict[SlotKey, int] = field(default_factory=dict)

    @classmethod
    def of(cls, controls: Mapping[str, Cell], every: int,
           numbers: Mapping[str, int] | None = None) -> ControlSchedule | None:
        """The schedule of a matrix's control templates (hardware -> template); None when the
        matrix has none."""
        if not controls:
            return None
        return cls(lambda cell: controls.get(cell.hardware), max(1, every), dict(numbers or {}))

    def _next(self, template: Cell) -> Cell:
        number = self.numbers.get(template.group, 0) + 1
        self.numbers[template.group] = number
        return template.measurement(number)

    def before(self, cell: Cell, allocation: Allocation) -> Cell | None:
        """The control measurement to run on ``allocation`` before ``cell`` starts there: one
        when no control has run on that slot yet."""
        template = self.template_for(cell)
        if template is None or cell.is_control or slot_of(allocation) in self._since:
            return None
        self._since[slot_of(allocation)] = 0
        return self._next(template)

    def after(self, cell: Cell, allocation: Allocation, last: bool) -> Cell | None:
        """The control measurement to run on ``allocation`` now that ``cell`` ended there: one
        after every ``every``-th cell of the slot, and after any cell when ``last`` (no cell
        waits to start any more)."""
        template = self.template_for(cell)
        if template is None or cell.is_control:
            return None
        key = slot_of(allocation)
        self._since[key] = self._since.get(key, 0) + 1
        if self._since[key] < self.every and not last:
            return None
        self._since[key] = 0
        return self._next(template)


def highest_numbers(cell_ids: list[str], controls: Mapping[str, Cell]) -> dict[str, int]:
    """The highest measurement number per control group among ``cell_ids`` (a run folder's
    cells): where a resumed run continues."""
    out: dict[str, int] = {}
    for template in controls.values():
        prefix = f"{template.group}-c"
        numbers = [int(cid[len(prefix):]) for cid in cell_ids
                   if cid.startswith(prefix) and cid[len(prefix):].isdigit()]
        if numbers:
            out[template.group] = max(numbers)
    return out
