"""Per-iteration timers.

Each measured iteration has three marks: the end of the previous iteration (for the first
one, the start of the measured window), the moment the batch is ready on the device, and the
end of the step.  ``data_time`` is mark 1 -> 2, ``compute_time`` mark 2 -> 3.

* :class:`CudaEventTimer` records CUDA events on the current stream, so the times are on the
  GPU's timeline; it never synchronises per iteration (only :meth:`finish`, once, and
  :meth:`completed`, which only *queries* an event).  The GPU idling while the host waits for
  data shows up as data time, which is what total_ips must see.
* :class:`HostTimer` uses ``time.perf_counter``; on devices that execute asynchronously
  (Gaudi) it synchronises at each mark, which timing needs there.

Wall-clock timestamps (``time.time()``, the telemetry clock) of each iteration's start are
derived from one synchronised reference point at the start of the window.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Timings:
    """The measured window of one rank."""

    data: list[float]
    compute: list[float]
    start_wall: list[float]

    @property
    def iteration(self) -> list[float]:
        """data + compute per iteration."""
        return [d + c for d, c in zip(self.data, self.compute, strict=True)]


class HostTimer:
    """perf_counter timer; ``sync`` (e.g. a device synchronize) runs before each mark."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self._sync = sync
        self._marks: list[float] = []  # start, then (ready, end) per iteration
        self._wall0 = 0.0

    def _now(self) -> float:
        if self._sync is not None:
            self._sync()
        return time.perf_counter()

    def start(self) -> None:
        """Mark the start of the measured window."""
        self._marks = [self._now()]
        self._wall0 = time.time() - (time.perf_counter() - self._marks[0])

    def ready(self) -> None:
        """Mark: the batch is on the device."""
        self._marks.append(self._now())

    def end(self) -> None:
        """Mark: the step has finished."""
        self._marks.append(self._now())

    def completed(self, index: int) -> bool:
        """Whether iteration ``index`` (0-based) is complete (always, on the host clock)."""
        return len(self._marks) >= 2 * index + 3

    def times(self, first: int, last: int) -> Timings:
        """Timings of iterations ``first..last-1`` (all must be completed)."""
        m = self._marks
        data, compute, starts = [], [], []
        for i in range(first, last):
            prev, ready, end = m[2 * i], m[2 * i + 1], m[2 * i + 2]
            data.append(ready - prev)
            compute.append(end - ready)
            starts.append(self._wall0 + (prev - m[0]))
        return Timings(data, compute, starts)

    def finish(self) -> Timings:
        """All measured iterations."""
        return self.times(0, (len(self._marks) - 1) // 2)


class CudaEventTimer:
    """CUDA-event timer (GPU timeline, no per-iteration synchronisation).

    The events for ``iterations`` iterations are created up front and recorded once (torch
    creates the CUDA event lazily, at its first record), so the measured loop only re-records
    existing events; a window longer than that grows the pool as it goes.
    """

    def __init__(self, iterations: int = 0) -> None:
        self._pool = [torch.cuda.Event(enable_timing=True) for _ in range(2 * iterations + 1)]
        for event in self._pool:
            event.record()
        self._events: list[torch.cuda.Event] = []
        self._wall0 = 0.0

    def _record(self) -> None:
        n = len(self._events)
        if n == len(self._pool):
            self._pool.append(torch.cuda.Event(enable_timing=True))
        event = self._pool[n]
        event.record()
        self._events.append(event)

    def start(self) -> None:
        """Synchronise once, then mark the start of the measured window."""
        torch.cuda.synchronize()
        self._wall0 = time.time()
        self._events = []
        self._record()

    def ready(self) -> None:
        """Record: the batch is on the device (in stream order)."""
        self._record()

    def end(self) -> None:
        """Record: the step has finished (in stream order)."""
        self._record()

    def completed(self, index: int) -> bool:
        """Whether iteration ``index`` has finished on the GPU (queries, never waits)."""
        k = 2 * index + 2
        return k < len(self._events) and self._events[k].query()

    def times(self, first: int, last: int) -> Timings:
        """Timings of iterations ``first..last-1`` (all must be completed)."""
        ev = self._events
        data, compute, starts = [], [], []
        # One query for the offset of ``first`` (not one per earlier iteration: the progress
        # lines call this during the measured loop).
        elapsed = ev[0].elapsed_time(ev[2 * first]) / 1000.0 if first else 0.0
        for i in range(first, last):
            prev, ready, end = ev[2 * i], ev[2 * i + 1], ev[2 * i + 2]
            d = prev.elapsed_time(ready) / 1000.0
            c = ready.elapsed_time(end) / 1000.0
            starts.append(self._wall0 + elapsed)
            data.append(d)
            compute.append(c)
            elapsed += d + c
        return Timings(data, compute, starts)

    def finish(self) -> Timings:
        """Synchronise once and return all measured iterations."""
        torch.cuda.synchronize()
        return self.times(0, (len(self._events) - 1) // 2)
