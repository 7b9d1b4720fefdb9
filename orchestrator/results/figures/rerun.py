"""Whether a cell that ended runs once more: the throttle re-run rule. Pure: a function of the
result and the matrix settings.

A cell whose GPU throttled during its measured window (``telemetry.throttled``: NVML's
clock-event reasons SW power cap, HW slowdown, SW/HW thermal or HW power brake, in any sample of
the window) measured a slower machine than the one it names. With ``[matrix] rerun_throttled =
N`` such a cell runs again, up to N times; the sweep keeps the throttled attempt under
``superseded/`` and queues the re-run after the cells already waiting (the GPU gets the most
time to cool down). A cell still throttled after its last re-run is recorded as it is, and the
table marks it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.results.folders.run_folder import CellResult, Status

if TYPE_CHECKING:  # reports read THROTTLED without loading the matrix models (slow to import)
    from orchestrator.config.matrix_file import MatrixSettings

#: The figure (from the workload's telemetry) that says the clocks were held down.
THROTTLED = "telemetry.throttled"


def throttled(result: CellResult) -> bool:
    """True when the cell ended ok and its telemetry says the GPU throttled while measuring."""
    return result.status is Status.OK and result.metrics.get(THROTTLED) is True


def should_rerun(result: CellResult, settings: MatrixSettings, reruns: int = 0) -> bool:
    """Run the cell of ``result`` again? It throttled and has been re-run ``reruns`` times,
    fewer than ``[matrix] rerun_throttled``."""
    return throttled(result) and reruns < settings.rerun_throttled
