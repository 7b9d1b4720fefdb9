"""Fault injection for the regression-check benchmark; off unless its variable is set.

``WORKLOAD_INJECT_SLOWDOWN=0.10`` makes every *measured* step sleep 10 % of its own duration
right after it (on an accelerator after a synchronize, so the duration is the device's): the
step's throughput drops to ``1 / 1.10`` of what it would be. Unset, empty or ``0``: the step is
returned as it is (no wrapper, no cost). ``benchmarks/regression.py`` uses it to check that
``orchestrate history --fail-on-regression`` catches a real 10 % slowdown.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

from workload.device import synchronize
from workload.errors import ConfigError

VARIABLE = "WORKLOAD_INJECT_SLOWDOWN"

F = TypeVar("F", bound=Callable)


def fraction() -> float:
    """The injected slowdown as a fraction of each step (0.0 when off)."""
    text = os.environ.get(VARIABLE, "").strip()
    if not text:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 10.0:
        raise ConfigError(f"{VARIABLE}={text!r}: expected a fraction from 0 to 10, e.g. 0.10")
    return value


def slowed(step: F, device: str) -> F:
    """``step``, or ``step`` followed by a sleep of the injected fraction of its duration."""
    frac = fraction()
    if not frac:
        return step

    def wrapped(*args: object, **kwargs: object) -> object:
        t0 = time.perf_counter()
        out = step(*args, **kwargs)
        synchronize(device)
        time.sleep(frac * (time.perf_counter() - t0))
        return out

    return wrapped  # type: ignore[return-value]
