"""Optional profiling of the measured iterations.

* ``torch``: ``torch.profiler`` over a few measured iterations (1 warmup + up to 5 active);
  writes ``trace_rank<R>.json`` (Chrome trace) into ``--output-dir``.  Timings of a profiled
  run are perturbed by the profiler.
* ``nsys`` / ``ncu``: a program cannot wrap itself in these tools, so the orchestrator wraps the
  command (e.g. ``nsys profile --capture-range=cudaProfilerApi python -m workload ...``).  The
  workload marks the measured window with ``cudaProfilerStart/Stop`` and NVTX ranges
  (``measure`` around the window, ``iteration N`` around each iteration).  CUDA only.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("workload")


class Profiler:
    """Hooks the measured loop calls; every hook is a no-op for ``none``."""

    def __init__(
        self, kind: str, device: str, output_dir: Path | None, rank: int, iterations: int
    ) -> None:
        self.kind = kind
        self.device = device
        self._prof: Any = None
        self._nvtx = kind in ("nsys", "ncu") and device == "cuda"
        if kind in ("nsys", "ncu") and device != "cuda":
            log.warning("--profiler %s needs CUDA; no NVTX ranges on %s", kind, device)
        if kind == "torch":
            assert output_dir is not None
            activities = [torch.profiler.ProfilerActivity.CPU]
            if device == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            trace = output_dir / f"trace_rank{rank}.json"
            active = max(1, min(5, iterations - 1))
            self._prof = torch.profiler.profile(
                activities=activities,
                schedule=torch.profiler.schedule(
                    wait=0, warmup=1 if iterations > 1 else 0, active=active, repeat=1
                ),
                on_trace_ready=lambda p: p.export_chrome_trace(str(trace)),
            )

    def begin(self) -> None:
        """Before the first measured iteration."""
        if self._prof is not None:
            self._prof.start()
        if self._nvtx:
            torch.cuda.profiler.start()
            torch.cuda.nvtx.range_push("measure")

    def iteration_start(self, index: int) -> None:
        """Before measured iteration ``index``."""
        if self._nvtx:
            torch.cuda.nvtx.range_push(f"iteration {index + 1}")

    def iteration_end(self, index: int) -> None:
        """After measured iteration ``index``."""
        if self._nvtx:
            torch.cuda.nvtx.range_pop()
        if self._prof is not None:
            self._prof.step()

    def finish(self) -> None:
        """After the measured window."""
        if self._nvtx:
            torch.cuda.nvtx.range_pop()
            torch.cuda.profiler.stop()
        if self._prof is not None:
            self._prof.stop()
            self._prof = None
