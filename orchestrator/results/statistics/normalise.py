"""Normalised figures: a configuration's figure as a ratio to the control measured beside it.
Pure: no I/O.

**Model.** A cell's throughput is ``true speed x machine factor x noise``: the machine factor
is what the host was worth while the cell ran (clocks, thermals, neighbours, a hypervisor's
other tenants), the same for every program on that host and GPUs at that time; the noise is the
cell's own. A control (:mod:`orchestrator.plan.controls`) is a pinned program whose true speed
never changes, run on the same host and GPUs just before and after the cell, so its figure is
``control speed x machine factor x its noise``. Their ratio no longer has the machine factor:
a slowdown of the whole machine over the night (or from one night to the next) moves both and
cancels, while a change in the code under test moves only the cell. The control must therefore
not share the code under test (a change to it must not reach the control) and must share the
host, the GPUs and the time.

**Nearest controls** of a configuration cell: among the run's ok control measurements of the
cell's hardware profile, on the cell's host with GPUs among the cell's (the control runs on the
first GPUs of the cell's allocation), the last one that ended before the cell started and the
first one that started after the cell ended. The reference is their geometric interpolation at
the cell's midpoint in time (log-linear in time: a steady drift between the two cancels
exactly); with one of them only, that one. A cell with neither has no normalised figure.

**Which figures.** Every throughput figure ``F`` of the cell (``*_ips``: images/s, higher is
better) gets ``norm.F`` = F / the control's F, or / the control's headline figure when the
control has no F (a foreign control program). A ratio is a plain number: 1.0 is the control's
speed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

#: Figure-name prefix of normalised figures in the results store: ``norm.train.total_ips``.
PREFIX = "norm."


@dataclass(frozen=True)
class Measured:
    """What normalisation needs of one cell result."""

    key: int  # the caller's index of the cell
    role: str  # config | control
    hardware: str
    host: str | None
    gpus: tuple[int, ...]
    started: float | None
    finished: float | None
    ok: bool
    headline: str  # the name of the cell's headline figure (train.total_ips / val.total_ips)
    figures: dict[str, float] = field(default_factory=dict)

    @property
    def midpoint(self) -> float | None:
        if self.started is None or self.finished is None:
            return None
        return (self.started + self.finished) / 2


@dataclass(frozen=True)
class Normalised:
    """A configuration cell's ratios to its nearest controls."""

    figures: dict[str, float]  # norm.F -> F / control reference
    controls: tuple[int, ...]  # keys of the control measurements used (before, after)


def _usable_control(control: Measured, cell: Measured) -> bool:
    return (control.role == "control" and control.ok and control.hardware == cell.hardware
            and control.host == cell.host and set(control.gpus) <= set(cell.gpus)
            and control.started is not None and control.finished is not None)


def nearest_controls(cell: Measured, controls: Sequence[Measured]
                     ) -> tuple[Measured | None, Measured | None]:
    """The last usable control that ended before ``cell`` started and the first that started
    after it ended (either None when there is none)."""
    if cell.started is None or cell.finished is None:
        return None, None
    usable = [c for c in controls if _usable_control(c, cell)]
    before = [c for c in usable if c.finished is not None and c.finished <= cell.started]
    after = [c for c in usable if c.started is not None and c.started >= cell.finished]
    return (max(before, key=lambda c: c.finished or 0.0, default=None),
            min(after, key=lambda c: c.started or 0.0, default=None))


def _control_value(control: Measured, name: str) -> float | None:
    value = control.figures.get(name, control.figures.get(control.headline))
    return value if value is not None and value > 0 and math.isfinite(value) else None


def reference(cell: Measured, before: Measured | None, after: Measured | None, name: str
              ) -> float | None:
    """The control's figure ``name`` at the cell's midpoint: log-linear between the two
    nearest measurements, or the one there is."""
    vb = _control_value(before, name) if before else None
    va = _control_value(after, name) if after else None
    if vb is None or va is None:
        return vb if va is None else va
    assert before is not None and after is not None
    tb, ta, t = before.midpoint, after.midpoint, cell.midpoint
    if tb is None or ta is None or t is None or ta <= tb:
        return math.sqrt(vb * va)
    w = min(1.0, max(0.0, (t - tb) / (ta - tb)))
    return math.exp((1 - w) * math.log(vb) + w * math.log(va))


def normalise(cells: Sequence[Measured], is_throughput: Callable[[str], bool]
              ) -> dict[int, Normalised]:
    """The normalised figures of every ok configuration cell of one run that has a nearest
    control, keyed as the cells are; ``is_throughput`` says which figures are throughputs."""
    controls = [c for c in cells if c.role == "control" and c.ok]
    out: dict[int, Normalised] = {}
    if not controls:
        return out
    for cell in cells:
        if cell.role == "control" or not cell.ok:
            continue
        before, after = nearest_controls(cell, controls)
        if before is None and after is None:
            continue
        ratios = {}
        for name, value in cell.figures.items():
            if not is_throughput(name) or name.startswith(PREFIX):
                continue
            ref = reference(cell, before, after, name)
            if ref is not None and math.isfinite(value):
                ratios[PREFIX + name] = value / ref
        if ratios:
            out[cell.key] = Normalised(ratios, tuple(c.key for c in (before, after) if c))
    return out
