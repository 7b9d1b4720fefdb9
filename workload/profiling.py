"""Profiling of a window of the measured iterations.

The window is measured iterations ``start`` .. ``start + count - 1`` (``--profile-start``,
``--profile-iterations``; index 0 is the first iteration after the warmup, the index the NVTX
ranges and the torch trace carry too). Nothing of a profiler runs outside it, except where
stated below.

* ``torch``: ``torch.profiler`` with a schedule of one cycle whose active steps are exactly the
  window (``wait = start``, ``warmup = 0``, ``active = count``), each window iteration labelled
  ``iteration I`` (a ``record_function``: torch's own ``ProfilerStep#N`` labels are numbered
  differently on torch 2.1 than on newer torch); the trace is written as
  ``trace_rank<R>.json`` (Chrome trace) into ``--output-dir`` after the measured loop, not inside
  it. With no warmup step, the first profiled iteration carries the profiler's start-up (torch
  warns about that; the warning is silenced here, the choice is deliberate: a warmup step would
  be an iteration outside the window with profiler overhead). Collecting the trace at the end of
  the window lands on the iteration after it.
* ``nsys`` / ``ncu`` / ``nvprof``: a program cannot wrap itself in these tools: the orchestrator
  starts the tool with its capture range (``orchestrator/plan/profilers.py``). The workload calls
  ``cudaProfilerStart`` before the window's first iteration and, after a device synchronize (so
  the window's last kernels end inside the capture), ``cudaProfilerStop`` after its last; it
  pushes NVTX ranges ``profile`` around the window and ``iteration I`` around each of its
  iterations. The synchronize drains the launch queue, so the iteration after the window starts
  with an idle GPU. CUDA only; nvprof not on compute capability 8.0 and later
  (:func:`tool_problem`).

The markers (cudaProfilerStart/Stop, NVTX, synchronize) come from
:func:`workload.compat.cuda_markers`; tests pass a stand-in that records the calls (no CUDA on
the CI machines).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

from workload.errors import ConfigError

# torch (and workload.compat, which imports it) are imported where used: the command line
# checks the window with window_problem before anything heavy is loaded.

log = logging.getLogger(__name__)

#: Profilers the orchestrator wraps around the command (they read the CUDA markers).
OUTSIDE_TOOLS = ("nsys", "ncu", "nvprof")
#: NVTX range around the whole window (``nsys --nvtx-capture=profile``, ``ncu --nvtx-include``).
WINDOW_RANGE = "profile"


class Markers(Protocol):
    """cudaProfilerStart/Stop, NVTX push/pop and a device synchronize."""

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def push(self, name: str) -> None: ...
    def pop(self) -> None: ...
    def synchronize(self) -> None: ...


def tool_problem(kind: str, capability: tuple[int, int] | None) -> str:
    """Why profiler ``kind`` cannot profile a GPU of compute ``capability`` ('' if it can)."""
    if kind == "nvprof" and capability is not None and tuple(capability) >= (8, 0):
        return (f"nvprof does not support this GPU (compute capability {capability[0]}."
                f"{capability[1]}: Ampere and later): use --profiler ncu for the pipe "
                "utilisation metrics or --profiler nsys for a timeline")
    return ""


def window_problem(iterations: int, start: int, count: int) -> str:
    """Why the window does not fit the measured iterations ('' when it does)."""
    if start < 0 or count < 1:
        return f"--profile-start must be >= 0 and --profile-iterations >= 1 (got {start}, {count})"
    if start + count > iterations:
        return (f"the profile window (measured iterations {start}..{start + count - 1}) ends "
                f"after the {iterations} measured iterations: lower --profile-start or "
                "--profile-iterations, or raise --iterations")
    return ""


class Profiler:
    """Hooks the measured loop calls; every hook is a no-op for ``none`` and outside the window."""

    def __init__(
        self,
        kind: str,
        device: str,
        output_dir: Path | None,
        rank: int,
        iterations: int,
        start: int = 0,
        count: int | None = None,
        markers: Markers | None = None,
        capability: tuple[int, int] | None = None,
    ) -> None:
        count = iterations - start if count is None else count
        problem = window_problem(iterations, start, count)
        if problem and kind != "none":
            raise ConfigError(problem)
        self.kind = kind
        self.device = device
        self.window = range(start, start + count)
        self._prof: Any = None
        self._trace: Path | None = None
        self._collected: Any = None
        self._markers: Markers | None = None
        self._open = False
        self._label: Any = None
        if kind in OUTSIDE_TOOLS:
            self._markers = self._outside_tool(kind, device, markers, capability)
        if kind == "torch":
            assert output_dir is not None
            self._trace = output_dir / f"trace_rank{rank}.json"
            self._prof = self._torch_profiler(device)

    def _outside_tool(self, kind: str, device: str, markers: Markers | None,
                      capability: tuple[int, int] | None) -> Markers | None:
        if device != "cuda":
            log.warning("--profiler %s needs CUDA; no capture range on %s", kind, device)
            return None
        if capability is None and markers is None:
            import torch

            capability = torch.cuda.get_device_capability()
        problem = tool_problem(kind, capability)
        if problem:
            raise ConfigError(problem)
        if markers is not None:
            return markers
        from workload import compat

        choice = compat.cuda_markers()
        if not choice.available:
            log.warning("--profiler %s: %s; the tool records nothing", kind, choice.label)
            return None
        made: Markers = choice()
        return made

    def _torch_profiler(self, device: str) -> Any:
        import torch

        from workload import compat

        activities = [torch.profiler.ProfilerActivity.CPU]
        if device == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        schedule = compat.profiler_schedule()(
            wait=self.window.start, warmup=0, active=len(self.window))
        return torch.profiler.profile(
            activities=activities, schedule=schedule, on_trace_ready=self._keep)

    def _keep(self, prof: Any) -> None:
        """on_trace_ready: keep the results; the file is written after the loop (finish)."""
        self._collected = prof

    @property
    def active(self) -> bool:
        """True when a profiler runs (torch, or markers for an outside tool)."""
        return self._prof is not None or self._markers is not None

    def begin(self) -> None:
        """Before the first measured iteration."""
        if self._prof is not None:
            self._prof.start()

    def iteration_start(self, index: int) -> None:
        """Before measured iteration ``index``."""
        if self._prof is not None and index in self.window:
            import torch

            self._label = torch.profiler.record_function(f"iteration {index}")
            self._label.__enter__()
        m = self._markers
        if m is None or index not in self.window:
            return
        if index == self.window.start:
            m.start()
            m.push(WINDOW_RANGE)
            self._open = True
        m.push(f"iteration {index}")

    def iteration_end(self, index: int) -> None:
        """After measured iteration ``index``."""
        if self._label is not None:
            self._label.__exit__(None, None, None)
            self._label = None
        m = self._markers
        if m is not None and index in self.window:
            m.pop()
            if index == self.window[-1]:
                self._close(m)
        if self._prof is not None:
            self._prof.step()

    def _close(self, m: Markers) -> None:
        m.pop()
        m.synchronize()
        m.stop()
        self._open = False

    def finish(self) -> None:
        """After the measured window: close a window left open (the loop stopped early) and
        write the torch trace."""
        if self._markers is not None and self._open:
            self._close(self._markers)
        if self._prof is not None:
            self._prof.stop()  # a window cut short is collected now (on_trace_ready)
            self._prof = None
            if self._collected is None:
                log.warning("--profiler torch: the profile window was never reached; no trace")
                return
            assert self._trace is not None
            self._collected.export_chrome_trace(str(self._trace))
