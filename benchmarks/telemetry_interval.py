"""Telemetry against the real tools: the finest NVML interval, its cost, and nvidia-smi beside it.

Runs the same ``python -m workload`` training case with ``--telemetry-interval`` 0 (no
sampler) and each given interval, and prints per run:

    interval | total img/s | vs off | samples | achieved median / max gap ms | power W | ...

* ``achieved``: the median and largest gap between consecutive samples of ``telemetry.csv``
  (the sampler thread's real period: an interval the loop cannot keep shows here);
* ``vs off``: throughput against the run without a sampler (1.000 = free);
* during the finest run, ``nvidia-smi --query-gpu`` is polled from this script (a second,
  independent reader: power, temperature, SM clock, utilisation and the clock event reasons),
  ``nvidia-smi -q`` is captured once mid-window, and NVML's total energy counter is read
  before and after; the comparison table puts the workload's summary figures (mean power,
  max temperature, mean SM clock, throttled, energy per image) beside the same figures from
  nvidia-smi's samples and the energy counter, over the same measured window.

    python benchmarks/telemetry_interval.py --intervals 0.1 0.01 0.005 --keep DIR

``--keep`` keeps every run folder and the nvidia-smi files (the real samples the parsers are
checked against). Needs a CUDA GPU, nvidia-smi and nvidia-ml-py; it exits 3 without them
(``cannot run here``).
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, not an install

from benchmarks.common import (
    cannot_run,
    dry_option,
    fmt,
    gpu_count,
    nvidia_gpus,
    run_workload,
    stop_on_sigterm,
    table,
)

#: What this script asks nvidia-smi for; fields an older driver does not know are dropped.
SMI_FIELDS = ("timestamp", "index", "power.draw", "power.draw.instant", "temperature.gpu",
              "clocks.sm", "utilization.gpu", "memory.used", "clocks_event_reasons.active",
              "clocks_throttle_reasons.active")


def smi_fields(exe: str) -> list[str]:
    """The fields of SMI_FIELDS this nvidia-smi accepts."""
    ok = []
    for name in SMI_FIELDS:
        proc = subprocess.run([exe, f"--query-gpu={name}", "--format=csv,noheader", "-i", "0"],
                              capture_output=True, text=True, timeout=30)
        if proc.returncode == 0 and "not a valid field" not in proc.stdout + proc.stderr:
            ok.append(name)
    return ok


class SmiPoller:
    """Polls ``nvidia-smi --query-gpu`` in a thread; each row tagged with time.time()."""

    def __init__(self, exe: str, fields: list[str], period: float) -> None:
        self.exe, self.fields, self.period = exe, fields, period
        self.rows: list[dict[str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.time()
            proc = subprocess.run(
                [self.exe, f"--query-gpu={','.join(self.fields)}", "--format=csv,noheader,nounits",
                 "-i", "0"], capture_output=True, text=True, timeout=30)
            t1 = time.time()
            if proc.returncode == 0 and proc.stdout.strip():
                values = [v.strip() for v in proc.stdout.strip().splitlines()[0].split(",")]
                row = dict(zip(self.fields, values, strict=False))
                row["host_time"] = f"{(t0 + t1) / 2:.6f}"
                self.rows.append(row)
            self._stop.wait(max(0.0, self.period - (time.time() - t0)))

    def __enter__(self) -> SmiPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def energy_mj() -> float | None:
    """NVML's total energy counter of GPU 0 (mJ since the driver loaded), or None."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return float(pynvml.nvmlDeviceGetTotalEnergyConsumption(
                pynvml.nvmlDeviceGetHandleByIndex(0)))
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


def window(out: Path) -> tuple[float, float, int]:
    """The measured window (first measured iteration's start, last one's end) and iterations
    (``iterations.csv`` holds the measured iterations only)."""
    with (out / "iterations.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    start = float(rows[0]["start_s"])
    end = float(rows[-1]["start_s"]) + float(rows[-1]["iteration_time_s"])
    return start, end, len(rows)


def gaps_ms(out: Path) -> tuple[float | None, float | None, int]:
    """Median and largest gap between telemetry samples (ms), and the number of samples."""
    path = out / "telemetry.csv"
    if not path.is_file():
        return None, None, 0
    with path.open() as fh:
        stamps = sorted({float(r["timestamp"]) for r in csv.DictReader(fh)})
    gaps = [(b - a) * 1000 for a, b in zip(stamps, stamps[1:], strict=False)]
    if not gaps:
        return None, None, len(stamps)
    return statistics.median(gaps), max(gaps), len(stamps)


def _num(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def smi_figures(rows: list[dict[str, str]], start: float, end: float,
                images: int) -> dict[str, Any]:
    """nvidia-smi's samples inside [start, end], summarised like the workload's telemetry."""
    inside = [r for r in rows if start <= float(r["host_time"]) <= end]
    out: dict[str, Any] = {"samples": len(inside)}
    for key, field, agg in (("power_mean_w", "power.draw", statistics.mean),
                            ("power_instant_mean_w", "power.draw.instant", statistics.mean),
                            ("temp_max_c", "temperature.gpu", max),
                            ("sm_clock_mean_mhz", "clocks.sm", statistics.mean),
                            ("util_mean_pct", "utilization.gpu", statistics.mean)):
        values = [v for v in (_num(r.get(field)) for r in inside) if v is not None]
        if values:
            out[key] = agg(values)
    reasons = [r.get("clocks_event_reasons.active") or r.get("clocks_throttle_reasons.active")
               for r in inside]
    out["reasons_seen"] = sorted({r for r in reasons if r})
    if "power_mean_w" in out and images:
        out["energy_per_image_j"] = out["power_mean_w"] * (end - start) / images
    return out


def run(python: str, interval: float, args: argparse.Namespace, out: Path,
        poller: SmiPoller | None) -> dict[str, Any]:
    out.mkdir(parents=True)
    argv = [python, "-m", "workload", "--arch", "resnet50", "--device", "cuda", "--batch-size",
            str(args.batch_size), "--precision", args.precision, "--warmup", str(args.warmup),
            "--iterations", str(args.iterations), "--workers", "0", "--telemetry-interval",
            str(interval), "--output-dir", str(out)]
    e0 = energy_mj()
    result = run_workload(argv, timeout=args.timeout)
    e1 = energy_mj()
    row: dict[str, Any] = {"interval_s": interval, "failure": "" if result.summary else
                           result.failure(args.timeout), "summary": {}}
    if not result.summary:
        return row
    if e0 is not None and e1 is not None:
        row["nvml_energy_whole_run_j"] = (e1 - e0) / 1000
    return analyse(row, out, args.batch_size, poller.rows if poller else None)


def analyse(row: dict[str, Any], out: Path, batch: int,
            smi_rows: list[dict[str, str]] | None) -> dict[str, Any]:
    """A finished run's figures, from its folder (and nvidia-smi's rows during it)."""
    data = json.loads((out / "summary.json").read_text())["data"]
    row["summary"] = {("total_ips" if k.endswith(".total_ips") else k): v
                      for k, v in data.items()}
    start, end, n = window(out)
    row["window_s"] = end - start
    row["gap_median_ms"], row["gap_max_ms"], row["samples_total"] = gaps_ms(out)
    if smi_rows is not None:
        row["smi"] = smi_figures(smi_rows, start, end, n * batch)
    return row


def reanalyse(root: Path, batch: int) -> list[dict[str, Any]]:
    """The rows of a kept session (``--keep DIR`` of an earlier run), from its files: the run
    without a sampler first, then the intervals from the longest; nvidia-smi beside the finest."""
    smi_path = root / "nvidia-smi-samples.csv"
    smi_rows = None
    if smi_path.is_file():
        with smi_path.open() as fh:
            smi_rows = list(csv.DictReader(fh))
    runs = {float(p.name.split("-", 1)[1]): p for p in root.glob("interval-*")}
    order = sorted(runs, key=lambda interval: (interval != 0, -interval))
    return [analyse({"interval_s": interval, "failure": "", "summary": {}}, runs[interval], batch,
                    smi_rows if interval == order[-1] else None) for interval in order]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--intervals", nargs="+", type=float, default=[0.1, 0.01, 0.005])
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--precision", default="amp")
    p.add_argument("--smi-period", type=float, default=0.2, help="nvidia-smi polling period")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--timeout", type=int, default=600)
    p.add_argument("--keep", default=None, metavar="DIR")
    p.add_argument("--json", default=None, metavar="PATH")
    p.add_argument("--reanalyse", default=None, metavar="DIR",
                   help="print the table of an earlier run's --keep DIR (no GPU needed)")
    dry_option(p, "the GPU and nvidia-smi looked for (no torch), nothing run")
    args = p.parse_args(argv)
    if args.dry:
        if not nvidia_gpus():
            return cannot_run("no NVIDIA GPU (nvidia-smi lists none); --reanalyse DIR reads "
                              "an earlier run's files without one")
        print("would run the intervals: " + " ".join(f"{i:g}" for i in args.intervals))
        return 0
    if args.reanalyse:
        return report(reanalyse(Path(args.reanalyse), args.batch_size), args,
                      "(reanalysed from the kept files)")
    exe = shutil.which("nvidia-smi")
    if not gpu_count() or exe is None:
        return cannot_run("needs a CUDA GPU and nvidia-smi (--reanalyse DIR reads an earlier "
                          "run's files without them)")
    stop_on_sigterm()
    fields = smi_fields(exe)
    intervals = [0.0, *sorted((i for i in args.intervals if i > 0), reverse=True)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="telemetry-") as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        for interval in intervals:
            finest = interval == intervals[-1] and interval > 0
            if finest:
                with SmiPoller(exe, fields, args.smi_period) as poller:
                    threading.Timer(8.0, lambda: (root / "nvidia-smi-q.txt").write_text(
                        subprocess.run([exe, "-q", "-d", "POWER,TEMPERATURE,CLOCK,PERFORMANCE"],
                                       capture_output=True, text=True).stdout)).start()
                    rows.append(run(args.python, interval, args, root / f"interval-{interval:g}",
                                    poller))
                with (root / "nvidia-smi-samples.csv").open("w", newline="") as fh:
                    writer = csv.DictWriter(fh, fieldnames=[*fields, "host_time"])
                    writer.writeheader()
                    writer.writerows(poller.rows)
            else:
                rows.append(run(args.python, interval, args, root / f"interval-{interval:g}",
                                None))
    return report(rows, args, f"nvidia-smi fields: {','.join(fields)}")


def report(rows: list[dict[str, Any]], args: argparse.Namespace, note: str) -> int:
    """Print the table (and --json); the exit status."""
    off = next((r["summary"].get("total_ips") for r in rows if r["interval_s"] == 0), None)
    header = ("interval s", "total img/s", "vs off", "samples", "gap median/max ms",
              "power W", "temp max C", "SM MHz", "throttled", "J/image")
    body = []
    for r in rows:
        s = r["summary"]
        ips = s.get("total_ips")
        body.append([f"{r['interval_s']:g}", fmt(ips), fmt(ips / off if ips and off else None, 3),
                     str(s.get("telemetry.samples", 0)),
                     f"{fmt(r.get('gap_median_ms'), 2)}/{fmt(r.get('gap_max_ms'), 2)}",
                     fmt(s.get("telemetry.power_mean_w")), fmt(s.get("telemetry.temp_max_c")),
                     fmt(s.get("telemetry.sm_clock_mean_mhz")), str(s.get("telemetry.throttled")),
                     fmt(s.get("telemetry.energy_per_image_j"), 4)])
        if "smi" in r:
            m = r["smi"]
            power = f"{fmt(m.get('power_mean_w'))} (inst {fmt(m.get('power_instant_mean_w'))})"
            body.append([" nvidia-smi", "", "", str(m["samples"]), "", power,
                         fmt(m.get("temp_max_c")), fmt(m.get("sm_clock_mean_mhz")),
                         " ".join(m["reasons_seen"]) or "-", fmt(m.get("energy_per_image_j"), 4)])
        if r["failure"]:
            body.append([f"{r['interval_s']:g} failed", r["failure"][:60]] + [""] * 8)
    print(f"resnet50 {args.precision} bs{args.batch_size}, {args.warmup} warmup + "
          f"{args.iterations} measured iterations; {note}")
    print(table(header, body))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2, default=str) + "\n")
    return 0 if all(not r["failure"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
