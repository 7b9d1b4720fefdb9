"""Profiler overhead outside the profile window: non-profiled iterations vs an unprofiled run.

A cell's profiler must cost nothing outside the iterations it covers (issue 15): warmup and
the iterations before and after the window run at full speed. This script runs the same
``python -m workload`` case unprofiled and under each profiler with a window in the middle of
the measured iterations, exactly as a matrix cell would be started (the command lines come
from ``orchestrator.plan.profilers.wrap``, so nsys/ncu/nvprof run with their capture ranges and the
``workload.profile_run`` helper), and prints side by side:

    profiler | before img/s | after img/s | vs none | first after ms | window img/s | files

* ``before`` / ``after``: throughput (global batch x iterations / summed iteration time, the
  rule of workload/metrics.py) of the measured iterations before the window and after it, the
  first iteration after the window left out (it carries the tool's stop: the synchronize before
  cudaProfilerStop, torch's trace collection); ``vs none`` is the mean of the two against the
  same iterations of the unprofiled run (1.000 = no overhead; the unprofiled runs' own spread,
  shown in its row, is the noise).
* ``first after ms``: that left-out iteration, against the unprofiled run's median iteration.
* ``window``: the profiled iterations (slow by design under ncu's kernel replay).
* ``files``: whether the tool left what the orchestrator parses (trace, ncu.csv, nsys CSVs).

Each configuration runs ``--repeats`` times, interleaved (none, torch, nsys, ncu, none, ...) so
drift of the machine spreads over all of them; the table shows medians.

    python benchmarks/profiler_overhead.py                      # ResNet-50 amp bs256, 1 GPU
    python benchmarks/profiler_overhead.py --profilers none torch nsys --repeats 5
    python benchmarks/profiler_overhead.py --json overhead.json
    python benchmarks/profiler_overhead.py --allow-cpu          # plumbing smoke, no GPU

A tool that is not on PATH is skipped with the reason (nvprof also on compute capability 8.0 and
later). Without a GPU it exits 3 (``cannot run here``) unless ``--allow-cpu`` (resnet18 at 32
px, the torch profiler only). NOT RUN YET: no GPU was lent when this was written; its figures
are unmeasured.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
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
from orchestrator.config.matrix_file import NcuOptions, NsysOptions, NvprofOptions
from orchestrator.plan import profilers
from workload.metrics import images_per_second
from workload.profile_run import NCU_CSV, NSYS_REPORTS
from workload.profiling import tool_problem

TOOLS: dict[str, NsysOptions | NcuOptions | NvprofOptions] = {
    "nsys": NsysOptions(), "ncu": NcuOptions(), "nvprof": NvprofOptions()}
#: What each profiler leaves for the orchestrator's figures.
FILES = {"torch": ("trace_rank0.json",), "nsys": tuple(NSYS_REPORTS), "ncu": (NCU_CSV,),
         "nvprof": ()}


@dataclass(frozen=True)
class Setup:
    python: str
    device: str
    arch: str
    image_size: int
    batch: int
    precision: str
    warmup: int
    iterations: int
    start: int
    count: int


@dataclass
class Split:
    """One run's iteration times split around the window."""

    before: list[float] = field(default_factory=list)
    first_after: float | None = None
    after: list[float] = field(default_factory=list)
    window: list[float] = field(default_factory=list)
    files: bool = True
    failure: str = ""


def workload_argv(setup: Setup, profiler: str, out: Path) -> list[str]:
    argv = [setup.python, "-m", "workload", "--arch", setup.arch, "--device", setup.device,
            "--image-size", str(setup.image_size), "--batch-size", str(setup.batch),
            "--precision", setup.precision, "--warmup", str(setup.warmup), "--iterations",
            str(setup.iterations), "--workers", "0", "--telemetry-interval", "0",
            "--output-dir", str(out), "--profiler", profiler,
            "--profile-start", str(setup.start), "--profile-iterations", str(setup.count)]
    if profiler in TOOLS:
        return profilers.wrap(profiler, TOOLS[profiler], str(out), argv, python=setup.python)
    return argv


def skip_reason(profiler: str, setup: Setup) -> str | None:
    if profiler in TOOLS and setup.device != "cuda":
        return "needs CUDA"
    if profiler in TOOLS and shutil.which(profiler) is None:
        return f"{profiler} not on PATH"
    if profiler == "nvprof":
        import torch

        return tool_problem(profiler, torch.cuda.get_device_capability()) or None
    return None


def iteration_times(path: Path) -> list[float]:
    with path.open() as fh:
        return [float(row["iteration_time_s"]) for row in csv.DictReader(fh)]


def split(times: Sequence[float], setup: Setup) -> Split:
    end = setup.start + setup.count
    return Split(list(times[:setup.start]), times[end] if end < len(times) else None,
                 list(times[end + 1:]), list(times[setup.start:end]))


def run_one(profiler: str, setup: Setup, out: Path, timeout: int) -> Split:
    out.mkdir(parents=True)
    run = run_workload(workload_argv(setup, profiler, out), timeout=timeout)
    if run.summary is None or not (out / "iterations.csv").exists():
        return Split(failure=run.failure(timeout))
    result = split(iteration_times(out / "iterations.csv"), setup)
    result.files = all((out / name).is_file() for name in FILES.get(profiler, ()))
    return result


def ips(batch: int, times: Sequence[float]) -> float | None:
    """Throughput by workload/metrics.py's rule; None without iterations to measure."""
    return images_per_second(batch, times) if times and sum(times) > 0 else None


def _median(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def summarize(runs: dict[str, list[Split]], setup: Setup) -> list[dict[str, Any]]:
    """One row per profiler: medians over its repeats."""
    base = runs.get("none", [])
    base_before = _median([ips(setup.batch, r.before) for r in base])
    base_after = _median([ips(setup.batch, r.after) for r in base])
    base_iter = _median([statistics.median(r.before + r.after) for r in base
                         if r.before or r.after])
    rows = []
    for profiler, splits in runs.items():
        ok = [s for s in splits if not s.failure]
        before = _median([ips(setup.batch, s.before) for s in ok])
        after = _median([ips(setup.batch, s.after) for s in ok])
        ratios = [x / b for x, b in ((before, base_before), (after, base_after)) if x and b]
        first = _median([s.first_after for s in ok])
        spread = [ips(setup.batch, s.before + s.after) for s in ok]
        rows.append({
            "profiler": profiler, "runs": f"{len(ok)}/{len(splits)}",
            "before_ips": before, "after_ips": after,
            "vs_none": statistics.mean(ratios) if ratios else None,
            "first_after_ms": None if first is None else 1000 * first,
            "none_iteration_ms": None if base_iter is None else 1000 * base_iter,
            "window_ips": _median([ips(setup.batch, s.window) for s in ok]),
            "spread_ips": [min(v for v in spread if v), max(v for v in spread if v)]
            if any(spread) else None,
            "files": all(s.files for s in ok) if ok else None,
            "failures": [s.failure for s in splits if s.failure],
        })
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    header = ("profiler", "runs", "before img/s", "after img/s", "vs none", "first after ms",
              "window img/s", "min..max img/s", "files")
    lines = []
    for r in rows:
        spread = r["spread_ips"]
        lines.append([
            r["profiler"], r["runs"], fmt(r["before_ips"]), fmt(r["after_ips"]),
            fmt(r["vs_none"], 3),
            f"{fmt(r['first_after_ms'], 2)} (none {fmt(r['none_iteration_ms'], 2)})",
            fmt(r["window_ips"]), f"{fmt(spread[0])}..{fmt(spread[1])}" if spread else "-",
            {True: "yes", False: "MISSING", None: "-"}[r["files"]],
        ])
    return table(header, lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profilers", nargs="*", default=["none", "torch", "nsys", "ncu", "nvprof"],
                   choices=["none", "torch", "nsys", "ncu", "nvprof"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--start", type=int, default=100, help="first profiled measured iteration")
    p.add_argument("--count", type=int, default=3, help="profiled iterations")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--precision", default="amp")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--timeout", type=int, default=1800, help="seconds per run")
    p.add_argument("--json", default=None, metavar="PATH")
    p.add_argument("--allow-cpu", action="store_true")
    p.add_argument("--ncu-metrics", nargs="+", default=None, metavar="METRIC",
                   help="ncu --metrics instead of the default pipe metrics (e.g. both the "
                   "_active set and TBD's _elapsed set with gpc__cycles_elapsed.max)")
    p.add_argument("--keep", default=None, metavar="DIR",
                   help="keep every run's output folder (iterations.csv, ncu.csv, traces) here")
    dry_option(p, "the GPU looked for (no torch) and the profilers listed, nothing run")
    args = p.parse_args(argv)
    if args.dry:
        if not nvidia_gpus():
            return cannot_run("no NVIDIA GPU (nvidia-smi lists none); --allow-cpu runs a CPU "
                              "smoke with the torch profiler")
        print("would run the profilers: " + " ".join(args.profilers))
        return 0
    if args.ncu_metrics:
        TOOLS["ncu"] = NcuOptions(metrics=args.ncu_metrics)

    if gpu_count():
        setup = Setup(args.python, "cuda", "resnet50", 224, args.batch_size, args.precision,
                      args.warmup, args.iterations, args.start, args.count)
    elif args.allow_cpu:
        setup = Setup(args.python, "cpu", "resnet18", 32, 4, "fp32", 1, 8, 3, 2)
    else:
        return cannot_run("no CUDA GPU visible to torch: run this on a GPU machine, or pass "
                          "--allow-cpu for a CPU smoke of the script")
    stop_on_sigterm()
    if "none" not in args.profilers:
        args.profilers.insert(0, "none")
    active, skipped = [], {}
    for prof in args.profilers:
        reason = skip_reason(prof, setup)
        if reason:
            skipped[prof] = reason
        else:
            active.append(prof)
    runs: dict[str, list[Split]] = {prof: [] for prof in active}
    with tempfile.TemporaryDirectory(prefix="profiler-overhead-") as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        for repeat in range(args.repeats):
            for prof in active:
                out = root / f"{prof}-{repeat}"
                runs[prof].append(run_one(prof, setup, out, args.timeout))
    rows = summarize(runs, setup)
    print(f"{setup.arch} {setup.precision} bs{setup.batch}, {setup.warmup} warmup + "
          f"{setup.iterations} measured iterations, window {setup.start}.."
          f"{setup.start + setup.count - 1}, {args.repeats} repeats, device {setup.device}")
    print(render(rows))
    for prof, reason in skipped.items():
        print(f"skipped {prof}: {reason}")
    for r in rows:
        for failure in r["failures"]:
            print(f"{r['profiler']} failed: {failure}")
    if args.json:
        Path(args.json).write_text(json.dumps({"setup": setup.__dict__, "rows": rows,
                                               "skipped": skipped}, indent=2) + "\n")
    return 1 if any(r["failures"] or r["files"] is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
