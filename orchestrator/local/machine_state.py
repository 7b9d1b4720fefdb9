"""This machine's state at an instant: load, CPU clocks, GPU clocks and why they are held down.

A cell's figure is only as steady as the machine it ran on: a CPU repeat set going 8 -> 37
images/s says nothing until the load average beside it says another job shared the cores. The
backends that run cells on this machine (process, docker) record :func:`sample` at each cell's
start and end into its ``result.json`` (``machine``: ``{"start": ..., "end": ...}``). The ssh
and slurm backends run cells on other machines and do not record it (the controller's state
would be the wrong machine's).

A sample (every part is left out when this machine does not expose it; nothing here raises)::

    {"at": 1795649396.67,                       # time.time() of the sample
     "loadavg": [1.02, 0.87, 0.55],             # os.getloadavg(): 1, 5, 15 minutes
     "cpu": {"cpus": 16,                        # CPUs exposing cpufreq
             "freq_mhz": {"min": 1200.0, "median": 3400.0, "max": 3600.0},
             "governors": {"performance": 16}}, # scaling_governor -> how many CPUs
     "gpus": [{"index": 0, "sm_mhz": 1980, "mem_mhz": 2619,
               "clock_event_reasons": "0x0000000000000001", "reasons": ["gpu_idle"]}]}

The GPUs come from ``nvidia-smi --query-gpu=index,clocks.sm,clocks.mem,
clocks_event_reasons.active`` (a short timeout); a driver older than 535 that refuses the
``clocks_event_reasons`` field is asked for ``clocks_throttle_reasons.active`` (the same
bitmask, NVML's older name). The mask's bits are NVML's ``nvmlClocksEventReason*`` constants
(:data:`CLOCK_EVENT_REASONS`).
"""

from __future__ import annotations

import logging
import os
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: How long one ``nvidia-smi`` query may take before the GPU part is left out (seconds).
SMI_TIMEOUT_S = 5.0
#: The GPU fields asked for; the second list is the fallback for drivers before 535.
SMI_FIELDS = ("index", "clocks.sm", "clocks.mem", "clocks_event_reasons.active")
SMI_FIELDS_OLD = ("index", "clocks.sm", "clocks.mem", "clocks_throttle_reasons.active")

#: NVML's clock event (throttle) reason bits (nvml.h ``nvmlClocksEventReason*``).
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

#: Runs an argv with a timeout: (exit code, stdout). Raises OSError or TimeoutExpired.
Runner = Callable[[list[str], float], tuple[int, str]]

_NA = {"", "[n/a]", "n/a", "[not supported]", "[unknown error]"}


def _run(argv: list[str], timeout: float) -> tuple[int, str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    return proc.returncode, proc.stdout


def sample(sys_root: Path = Path("/sys"), run: Runner | None = None,
           smi: str | None = None) -> dict[str, Any]:
    """This machine's state now (the module docstring's layout). ``sys_root``: where sysfs is
    (tests give a fake tree); ``run``: how ``nvidia-smi`` is run (tests give a stand-in);
    ``smi``: its path (default: ``nvidia-smi`` on PATH; none there: no GPU part)."""
    out: dict[str, Any] = {"at": time.time()}
    loadavg = load_average()
    if loadavg is not None:
        out["loadavg"] = loadavg
    cpu = cpu_state(sys_root)
    if cpu:
        out["cpu"] = cpu
    gpus = gpu_state(run or _run, smi if smi is not None else shutil.which("nvidia-smi"))
    if gpus:
        out["gpus"] = gpus
    return out


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages; None where the OS has none."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:  # missing, unreadable (EACCES, EBUSY on some drivers)
        return None


def cpu_state(sys_root: Path = Path("/sys")) -> dict[str, Any]:
    """The CPUs' current frequency (min, median, max in MHz) and governors, from
    ``<sys_root>/devices/system/cpu/cpu*/cpufreq``; empty when no CPU exposes cpufreq (a
    container without it, a VM)."""
    freqs: list[float] = []
    governors: dict[str, int] = {}
    cpus = 0
    base = sys_root / "devices" / "system" / "cpu"
    try:
        folders = sorted(base.glob("cpu[0-9]*/cpufreq"))
    except OSError:
        return {}
    for folder in folders:
        freq = _read(folder / "scaling_cur_freq")
        governor = _read(folder / "scaling_governor")
        if freq is None and governor is None:
            continue
        cpus += 1
        if freq is not None and freq.isdigit():
            freqs.append(int(freq) / 1000.0)  # kHz
        if governor:
            governors[governor] = governors.get(governor, 0) + 1
    out: dict[str, Any] = {}
    if cpus:
        out["cpus"] = cpus
    if freqs:
        out["freq_mhz"] = {"min": min(freqs), "median": statistics.median(freqs),
                           "max": max(freqs)}
    if governors:
        out["governors"] = dict(sorted(governors.items()))
    return out


def reasons(mask: int) -> list[str]:
    """The names of the clock event reasons set in ``mask`` (unknown bits as hex)."""
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    rest = mask & ~sum(CLOCK_EVENT_REASONS)
    if rest:
        names.append(hex(rest))
    return names


def _number(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None


def parse_gpu_clocks(text: str) -> list[dict[str, Any]]:
    """``index, clocks.sm, clocks.mem, reasons`` rows (``--format=csv,noheader,nounits``)
    into one dict per GPU; a field the GPU does not report (``[N/A]``) is left out, a row that
    does not parse is skipped."""
    gpus = []
    for line in text.splitlines():
        row = [c.strip() for c in line.split(",")]
        if len(row) != 4 or not row[0].isdigit():
            continue
        gpu: dict[str, Any] = {"index": int(row[0])}
        for key, value in (("sm_mhz", row[1]), ("mem_mhz", row[2])):
            number = None if value.lower() in _NA else _number(value)
            if number is not None:
                gpu[key] = number
        if row[3].lower() not in _NA:
            try:
                mask = int(row[3], 16)
            except ValueError:
                mask = None
            if mask is not None:
                gpu["clock_event_reasons"] = row[3]
                gpu["reasons"] = reasons(mask)
        gpus.append(gpu)
    return gpus


def gpu_state(run: Runner, smi: str | None) -> list[dict[str, Any]]:
    """The GPUs' clocks and clock event reasons from ``smi`` (an ``nvidia-smi``); empty when
    there is none, it fails, or it takes longer than :data:`SMI_TIMEOUT_S`."""
    if not smi:
        return []
    for fields in (SMI_FIELDS, SMI_FIELDS_OLD):
        argv = [smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
        try:
            code, stdout = run(argv, SMI_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as exc:
            log.debug("%s: %s; GPU clocks not recorded", smi, exc)
            return []
        if code == 0:
            return parse_gpu_clocks(stdout)
        log.debug("%s exited %s for %s", smi, code, fields[-1])
    return []
