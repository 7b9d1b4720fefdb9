"""Accelerator telemetry: a background sampler thread and its summary.

* NVIDIA: ``pynvml`` (package ``nvidia-ml-py``) when importable; per GPU it samples power,
  temperature, SM clock, utilisation, memory used and the clock-throttle reasons.
* Gaudi: ``hl-smi`` when it is on ``PATH`` (polled as a subprocess each interval) with the
  query fields hl-smi's documentation lists (``index, power.draw, temperature.aip,
  utilization.aip, memory.used``); the SoC clock (``clocks.current.soc``, not in that list) is
  asked too and dropped for good if hl-smi refuses it. hl-smi reports no clock-throttle reason,
  so Gaudi results carry no ``telemetry.throttled`` (unknown is not "not throttled").
* Anything else (CPU, no NVML, no hl-smi): no sampler, and the summary has no telemetry keys.

Samples carry ``time.time()`` timestamps, the clock ``iterations.csv`` uses too.
"""

from __future__ import annotations

import contextlib
import csv
import logging
import math
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from workload.metrics import mean

log = logging.getLogger(__name__)

# NVML clock-throttle reason bits that mean "the clocks were held down" (not idle, not an
# application-clock setting): SW power cap, HW slowdown, SW thermal, HW thermal, HW power brake.
_THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


@dataclass(frozen=True)
class Sample:
    """One reading of one device."""

    timestamp: float
    gpu: int
    power_w: float
    temp_c: float
    sm_clock_mhz: float
    util_pct: float
    mem_used_mib: float
    throttled: bool = False


CSV_FIELDS = [f.name for f in fields(Sample)]


def summarize_telemetry(
    samples: Sequence[Sample], start: float, end: float, images: int,
    reports_throttle: bool = True,
) -> dict[str, Any]:
    """Summarise the samples taken in ``[start, end]``; none inside (a window shorter than the
    sampling interval): no summary, rather than figures from idle or start-up samples.
    ``reports_throttle`` False (a sampler that cannot see throttling): no
    ``telemetry.throttled``; a clock no sample read: no ``telemetry.sm_clock_mean_mhz``.

    ``telemetry.power_mean_w`` is the mean over sampling instants of the power summed over
    the sampled devices; ``telemetry.energy_per_image_j`` is that mean power times the window
    length divided by ``images`` (the images those devices processed in the window).
    """
    window = [s for s in samples if start <= s.timestamp <= end]
    if not window:
        return {}
    by_instant: dict[float, float] = {}
    for s in window:
        by_instant[s.timestamp] = by_instant.get(s.timestamp, 0.0) + s.power_w
    power_mean = mean(list(by_instant.values()))
    duration = max(end - start, 0.0)
    clocks = [s.sm_clock_mhz for s in window if not math.isnan(s.sm_clock_mhz)]
    out: dict[str, Any] = {
        "telemetry.power_mean_w": power_mean,
        "telemetry.temp_max_c": max(s.temp_c for s in window),
        "telemetry.util_mean_pct": mean([s.util_pct for s in window]),
        "telemetry.mem_used_max_mib": max(s.mem_used_mib for s in window),
        "telemetry.samples": len(window),
    }
    if clocks:
        out["telemetry.sm_clock_mean_mhz"] = mean(clocks)
    if reports_throttle:
        out["telemetry.throttled"] = any(s.throttled for s in window)
    if images > 0 and duration > 0:
        out["telemetry.energy_per_image_j"] = power_mean * duration / images
    return out


def per_gpu_telemetry(samples: Sequence[Sample], start: float, end: float) -> dict[str, Any]:
    """Per sampled device (its ``gpu`` index: the local rank's GPU), over ``[start, end]``: mean
    power, mean SM clock, max temperature (``gpu<N>.power_w_mean``, ``gpu<N>.sm_clock_mhz_mean``,
    ``gpu<N>.temp_c_max``): the per-GPU view of seed 002."""
    out: dict[str, Any] = {}
    by_gpu: dict[int, list[Sample]] = {}
    for s in samples:
        if start <= s.timestamp <= end:
            by_gpu.setdefault(s.gpu, []).append(s)
    for gpu, window in sorted(by_gpu.items()):
        out[f"gpu{gpu}.power_w_mean"] = mean([s.power_w for s in window])
        out[f"gpu{gpu}.temp_c_max"] = max(s.temp_c for s in window)
        clocks = [s.sm_clock_mhz for s in window if not math.isnan(s.sm_clock_mhz)]
        if clocks:
            out[f"gpu{gpu}.sm_clock_mhz_mean"] = mean(clocks)
    return out


def write_csv(samples: Sequence[Sample], path: Path) -> None:
    """Write ``telemetry.csv``."""
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for s in samples:
            writer.writerow(asdict(s))


def parse_hl_smi_csv(text: str, timestamp: float) -> list[Sample]:
    """Parse ``hl-smi -Q <HlSmiSampler.QUERY> -f csv,noheader,nounits`` output.

    Columns: index, power (W), temperature (C), utilisation (%), memory used (MiB), SoC clock
    (MHz, optional).  Unparsable lines are skipped.
    """
    out: list[Sample] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5:
            continue
        try:
            values = [float(p) for p in parts[:6]]
        except ValueError:
            continue
        clock = values[5] if len(values) > 5 else float("nan")
        out.append(
            Sample(timestamp, int(values[0]), values[1], values[2], clock, values[3], values[4])
        )
    return out


class Sampler:
    """Base sampler thread: subclasses implement :meth:`read` (one reading per device)."""

    name = "none"
    #: Whether its samples say when the clocks were held down (throttling).
    reports_throttle = True

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="telemetry", daemon=True)

    def read(self, timestamp: float) -> list[Sample]:
        """Return one reading per device."""
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.extend(self.read(time.time()))
            except Exception as exc:  # a flaky reading must never kill the run
                log.warning("telemetry: reading failed (%s); sampler stops", exc)
                return
            self._stop.wait(self.interval)

    def start(self) -> Sampler:
        """Start sampling in the background."""
        self._thread.start()
        return self

    def stop(self) -> list[Sample]:
        """Stop sampling and return the samples."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0 + self.interval)
        return list(self.samples)


class NvmlSampler(Sampler):
    """Samples NVIDIA GPUs through NVML (GPU-only; untested on the CPU-only CI machines)."""

    name = "nvml"

    def __init__(self, interval: float, nvml: Any, handles: list[tuple[int, Any]]) -> None:
        super().__init__(interval)
        self._nvml = nvml
        self._handles = handles

    def read(self, timestamp: float) -> list[Sample]:
        """Read every sampled GPU once."""
        nv = self._nvml
        # nvidia-ml-py 12.535 renamed ThrottleReasons to EventReasons (the old name is kept as
        # a deprecated alias in some releases only)
        get_reasons = (getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
                       or nv.nvmlDeviceGetCurrentClocksThrottleReasons)
        out = []
        for index, h in self._handles:
            try:
                reasons = get_reasons(h)
            except Exception:
                reasons = 0
            out.append(
                Sample(
                    timestamp=timestamp,
                    gpu=index,
                    power_w=nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
                    temp_c=float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
                    sm_clock_mhz=float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                    util_pct=float(nv.nvmlDeviceGetUtilizationRates(h).gpu),
                    mem_used_mib=nv.nvmlDeviceGetMemoryInfo(h).used / 2**20,
                    throttled=bool(reasons & _THROTTLE_MASK),
                )
            )
        return out

    def stop(self) -> list[Sample]:
        """Stop sampling and shut NVML down."""
        samples = super().stop()
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()
        return samples


class HlSmiSampler(Sampler):
    """Samples Gaudi devices by polling ``hl-smi`` (untested here: no Gaudi on CI)."""

    name = "hl-smi"
    reports_throttle = False
    #: The fields hl-smi's documentation lists for -Q (System Management Interface Tool).
    QUERY = "index,power.draw,temperature.aip,utilization.aip,memory.used"
    #: Asked as well while hl-smi accepts it (not in the documented list).
    CLOCK = "clocks.current.soc"

    def __init__(self, interval: float, exe: str) -> None:
        super().__init__(max(interval, 0.2))
        self._exe = exe
        self._clock = True

    def read(self, timestamp: float) -> list[Sample]:
        """Run ``hl-smi`` once and parse its CSV (without the clock once hl-smi refused it)."""
        if self._clock:
            try:
                return parse_hl_smi_csv(self._query(f"{self.QUERY},{self.CLOCK}"), timestamp)
            except subprocess.CalledProcessError:
                log.info("telemetry: hl-smi refuses %s; sampling without the clock", self.CLOCK)
                self._clock = False
        return parse_hl_smi_csv(self._query(self.QUERY), timestamp)

    def _query(self, fields: str) -> str:
        proc = subprocess.run(
            [self._exe, "-Q", fields, "-f", "csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return proc.stdout


def nvml_device_driver_version() -> str | None:
    """The NVIDIA driver version via NVML, or None when NVML is unavailable."""
    try:
        import pynvml  # optional extra: nvidia-ml-py

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None
    return version.decode() if isinstance(version, bytes) else str(version)


def make_sampler(device: str, interval: float, cuda_uuids: Sequence[str | None]) -> Sampler | None:
    """Create (not start) the sampler for ``device``, or None when none can run here.

    ``cuda_uuids`` are the UUIDs of the CUDA devices this node's ranks use (index = local rank);
    they map torch's device numbering (after ``CUDA_VISIBLE_DEVICES``) onto NVML handles.
    """
    if interval <= 0:
        return None
    if device == "cuda":
        try:
            import pynvml  # optional extra: nvidia-ml-py

            pynvml.nvmlInit()
        except Exception:
            log.info("telemetry: pynvml not importable or NVML unavailable; no sampler")
            return None
        handles = []
        for index, uuid in enumerate(cuda_uuids):
            handle = None
            if uuid:
                try:
                    handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                except Exception:
                    handle = None
            if handle is None:
                try:
                    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                except Exception:
                    continue
            handles.append((index, handle))
        if not handles:
            pynvml.nvmlShutdown()
            return None
        return NvmlSampler(interval, pynvml, handles)
    if device == "hpu":
        exe = shutil.which("hl-smi")
        return HlSmiSampler(interval, exe) if exe else None
    return None
