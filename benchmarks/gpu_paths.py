"""Every GPU-only path of the workload, in one run, with what each one measured.

The workload's CPU test suite cannot reach CUDA graphs, ``torch.compile`` on CUDA, nvJPEG
decoding, NCCL DDP, CUDA-event timing, NVML telemetry or the profilers on a GPU.  This script
runs each of them as ``python -m workload`` on the GPU(s) of this machine and prints one table:

    case | total img/s | compute img/s | total/compute | p50/p99 ms | vs eager | checks

* ``vs eager``: throughput (latency cases: eager p50 / this p50) against the eager case of the
  same mode, precision and batch, so CUDA graphs and compile show their gain side by side; for
  DDP, per GPU (the scaling efficiency).
* ``total/compute``: with real JPEGs, how much the input pipeline costs (1.00 = fully hidden).
* ``checks``: what the summary must say for the path to count as exercised (``cuda_graphs``
  really on, the decoder really nvJPEG, telemetry samples in the window, a profiler trace
  written, ...).  A failed check or a failed run makes the exit status 1.

    python benchmarks/gpu_paths.py                     # all cases (split with --cases if needed)
    python benchmarks/gpu_paths.py --cases train-amp-bs256 train-amp-bs256-graphs
    python benchmarks/gpu_paths.py --json gpu_paths.json
    python benchmarks/gpu_paths.py --allow-cpu         # plumbing smoke without a GPU

The JPEG cases generate a dataset first (``workload.make_dataset``, real JPEGs, no download).
DDP runs under torchrun on every visible GPU and is skipped with fewer than two (NCCL refuses
two ranks on one GPU).  Without a GPU it exits 3 (``cannot run here``) unless ``--allow-cpu``,
which runs the cases that can run on a CPU (tiny model, fp32, gloo DDP) to check the script
itself.
"""

from __future__ import annotations

import argparse
import json
import os
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
from workload.make_dataset import make_dataset


@dataclass(frozen=True)
class Case:
    """One workload run and what its summary must show."""

    name: str
    mode: str = "train"
    precision: str = "amp"
    batch_size: int = 256
    flags: tuple[str, ...] = ()
    decoder: str | None = None  # WORKLOAD_DECODER; also implies --data <generated JPEGs>
    ddp: bool = False
    cuda_only: bool = False
    iterations: int | None = None  # on a GPU, instead of --iterations (latency percentiles)
    expect: tuple[tuple[str, Any], ...] = ()  # (summary env key, value) pairs
    files: tuple[str, ...] = ()  # files the run must leave in its output directory

    @property
    def latency(self) -> bool:
        """Batch-1 inference reports latency percentiles."""
        return self.mode == "infer" and self.batch_size == 1

    @property
    def baseline(self) -> str:
        """The eager case this one is compared with."""
        return f"{self.mode}-{self.precision}-bs{self.batch_size}"


def _eager(mode: str, precision: str, batch: int) -> Case:
    return Case(f"{mode}-{precision}-bs{batch}", mode, precision, batch)


CASES = (
    _eager("train", "amp", 256),
    Case(
        "train-amp-bs256-graphs",
        flags=("--cuda-graphs",),
        cuda_only=True,
        expect=(("cuda_graphs", True),),
    ),
    Case(
        "train-amp-bs256-compile",
        flags=("--compile", "default"),
        cuda_only=True,
        expect=(("compile", "default"),),
    ),
    _eager("train", "bf16", 256),
    Case(
        "train-bf16-bs256-graphs",
        precision="bf16",
        flags=("--cuda-graphs",),
        cuda_only=True,
        expect=(("cuda_graphs", True),),
    ),
    _eager("infer", "amp", 256),
    Case("infer-amp-bs1", "infer", batch_size=1, iterations=2000),
    Case(
        "infer-amp-bs1-graphs",
        mode="infer",
        batch_size=1,
        iterations=2000,
        flags=("--cuda-graphs",),
        cuda_only=True,
        expect=(("cuda_graphs", True),),
    ),
    Case(
        "train-amp-bs256-jpeg-nvjpeg",
        decoder="nvjpeg",
        cuda_only=True,
        expect=(("decoder", "nvjpeg"),),
    ),
    Case("train-amp-bs256-jpeg-cpu", decoder="cpu", expect=(("decoder", "cpu"),)),
    Case("train-amp-bs256-ddp", ddp=True, expect=(("world_size", "gpus"),)),
    Case(
        "train-amp-bs256-torch-profiler",
        flags=("--profiler", "torch"),
        files=("trace_rank0.json",),
    ),
)


@dataclass
class Outcome:
    """What one run gave."""

    total_ips: float | None = None
    compute_ips: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    failed: list[str] = field(default_factory=list)  # checks that did not hold
    note: str = ""
    env: dict[str, Any] = field(default_factory=dict)  # the run's recorded environment


@dataclass(frozen=True)
class Setup:
    """Where and how the cases run."""

    python: str
    device: str
    arch: str
    image_size: int
    iterations: int
    warmup: int
    gpus: int
    workers: int
    dataset: Path | None = None

    def precision(self, case: Case) -> str:
        """amp on a GPU; fp32 on the CPU smoke (bf16 stays, the CPU has it)."""
        return "fp32" if self.device == "cpu" and case.precision == "amp" else case.precision

    def batch_size(self, case: Case) -> int:
        """The case's batch, or 4 on the CPU smoke (1 stays 1)."""
        return min(case.batch_size, 4) if self.device == "cpu" else case.batch_size


#: Telemetry sampling period on a GPU (the workload's default, 0.5 s, would leave short
#: windows, such as batch-1 latency under CUDA graphs, without a sample).
TELEMETRY_INTERVAL_S = 0.05


def command(case: Case, setup: Setup, output_dir: Path) -> list[str]:
    """The command line of one case."""
    iterations = setup.iterations
    if case.iterations and setup.device == "cuda":
        iterations = case.iterations
    if "--profiler" in case.flags:  # a trace of a few steps is what a lab looks at
        iterations = min(iterations, 20)
    argv = [
        "-m",
        "workload",
        "--arch",
        setup.arch,
        "--mode",
        case.mode,
        "--batch-size",
        str(setup.batch_size(case)),
        "--precision",
        setup.precision(case),
        "--image-size",
        str(setup.image_size),
        "--warmup",
        str(setup.warmup),
        "--iterations",
        str(iterations),
        "--device",
        setup.device,
        "--workers",
        str(setup.workers if case.decoder else 0),
        "--output-dir",
        str(output_dir),
        "--telemetry-interval",
        str(TELEMETRY_INTERVAL_S if setup.device == "cuda" else 0),
        *case.flags,
    ]
    if case.decoder:
        argv += ["--data", str(setup.dataset)]
    if "--profiler" in case.flags:  # the window (default 5 iterations) must fit a CPU smoke
        argv += ["--profile-iterations", str(min(5, iterations))]
    if case.ddp:
        nproc = setup.gpus if setup.device == "cuda" else 2
        return [setup.python, "-m", "torch.distributed.run", "--standalone",
                f"--nproc_per_node={nproc}", *argv]  # fmt: skip
    return [setup.python, *argv]


def skip_reason(case: Case, setup: Setup) -> str | None:
    """Why ``case`` cannot run on this machine, or None."""
    if case.cuda_only and setup.device != "cuda":
        return "needs CUDA"
    if case.ddp and setup.device == "cuda" and setup.gpus < 2:
        return f"DDP needs 2+ GPUs, {setup.gpus} visible"
    return None


def evaluate(case: Case, summary: dict[str, Any], output_dir: Path, setup: Setup) -> Outcome:
    """Numbers and checks from one run's summary line and output directory."""
    data, env = summary["data"], summary["env"]
    prefix = "train" if case.mode == "train" else "val"
    out = Outcome(data.get(f"{prefix}.total_ips"), data.get(f"{prefix}.compute_ips"), env=env)
    if case.latency:
        p50, p99 = (data.get(f"{prefix}.compute_latency_at{q}") for q in (50, 99))
        out.p50_ms = None if p50 is None else 1000 * p50
        out.p99_ms = None if p99 is None else 1000 * p99
    for key, want in case.expect:
        want = (setup.gpus if setup.device == "cuda" else 2) if want == "gpus" else want
        if env.get(key) != want:
            out.failed.append(f"{key}={env.get(key)!r}, wanted {want!r}")
    if env.get("precision") != setup.precision(case):
        out.failed.append(f"precision={env.get('precision')!r}")
    for name in case.files:
        if not (output_dir / name).is_file():
            out.failed.append(f"no {name}")
    # telemetry on every GPU case whose window holds a few samples
    if setup.device == "cuda" and data.get("duration_s", 0) >= 4 * TELEMETRY_INTERVAL_S:
        if "telemetry.power_mean_w" not in data:
            out.failed.append("no telemetry in the measured window")
        if not (output_dir / "telemetry.csv").is_file():
            out.failed.append("no telemetry.csv")
    return out


def run_case(case: Case, setup: Setup, output_dir: Path, timeout: int) -> Outcome:
    """Run one case and evaluate it."""
    env = {"WORKLOAD_DECODER": case.decoder} if case.decoder else None
    run = run_workload(command(case, setup, output_dir), timeout=timeout, env=env)
    if run.summary is None:
        return Outcome(failed=["run"], note=run.failure(timeout))
    return evaluate(case, run.summary, output_dir, setup)


def table_rows(results: list[tuple[Case, Outcome]]) -> list[list[str]]:
    """One row per case; ratios against the eager case of the same mode/precision/batch."""
    eager = {case.name: out for case, out in results}
    rows = []
    for case, out in results:
        base = eager.get(case.baseline)
        if base is None or base is out:
            vs = None
        elif case.latency:
            vs = base.p50_ms / out.p50_ms if base.p50_ms and out.p50_ms else None
        elif base.total_ips and out.total_ips:
            vs = out.total_ips / (base.total_ips * (out.env.get("world_size") or 1))
        else:
            vs = None
        ratio = out.total_ips / out.compute_ips if out.total_ips and out.compute_ips else None
        lat = f"{fmt(out.p50_ms, 2)} / {fmt(out.p99_ms, 2)}" if case.latency else ""
        checks = "ok" if not out.failed else "FAILED: " + "; ".join(out.failed)
        if out.note:
            checks = f"{checks} ({out.note})" if out.failed else out.note
        rows.append([case.name, fmt(out.total_ips), fmt(out.compute_ips), fmt(ratio, 2), lat,
                     fmt(vs, 3), checks])  # fmt: skip
    return rows


HEADER = ("case", "total img/s", "compute img/s", "total/compute", "p50/p99 ms", "vs eager",
          "checks")  # fmt: skip


def describe(setup: Setup, results: list[tuple[Case, Outcome]]) -> str:
    """One line saying what ran (case names keep their GPU meaning on the CPU smoke)."""
    env = next((o.env for _, o in results if o.env), {})
    if setup.device == "cuda":
        name, driver = env.get("device_name", "GPU"), env.get("driver_version")
        where = f"{setup.gpus} x {name}, driver {driver}"
    else:
        where = "CPU smoke: fp32 for amp, batch <= 4"
    return (
        f"{setup.arch}, {setup.image_size} px, {setup.warmup} warmup + {setup.iterations} "
        f"measured iterations; {where}; torch {env.get('torch_version')}, "
        f"CUDA {env.get('cuda_version')}, cuDNN {env.get('cudnn_version')}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the cases; returns the exit status."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    names = [c.name for c in CASES]
    p.add_argument("--cases", nargs="*", choices=names, default=names)
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--images", type=int, default=2048, help="JPEGs in the generated dataset")
    p.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 12))
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--timeout", type=int, default=900, help="seconds per case")
    p.add_argument("--json", default=None, metavar="PATH")
    p.add_argument("--allow-cpu", action="store_true", help="without a GPU, a tiny CPU smoke")
    dry_option(p, "the GPU looked for (no torch) and the cases listed, nothing run")
    args = p.parse_args(argv)
    if args.dry:
        if not nvidia_gpus():
            return cannot_run("no NVIDIA GPU (nvidia-smi lists none); --allow-cpu runs a CPU "
                              "smoke of the script")
        print("would run the cases: " + " ".join(args.cases))
        return 0
    gpus = gpu_count()
    if not gpus and not args.allow_cpu:
        return cannot_run("no CUDA GPU visible to torch: run this on a GPU machine, or pass "
                          "--allow-cpu for a CPU smoke of the script")
    stop_on_sigterm()
    cases = [c for c in CASES if c.name in args.cases]
    with tempfile.TemporaryDirectory(prefix="gpu-paths-") as tmp:
        root = Path(tmp)
        if gpus:
            setup = Setup(args.python, "cuda", "resnet50", 224, args.iterations, args.warmup,
                          gpus, args.workers)  # fmt: skip
        else:
            setup = Setup(args.python, "cpu", "resnet18", 32, 2, 1, 0, 1)
        if any(c.decoder for c in cases):
            classes = 8
            per_class = max(1, (args.images if gpus else 16) // classes)
            size = 320 if gpus else 48
            print(f"generating {classes * per_class} JPEGs ({size} px) ...", file=sys.stderr)
            make_dataset(root / "jpegs", classes=classes, per_class=per_class, size=size)
            setup = Setup(**{**setup.__dict__, "dataset": root / "jpegs"})
        results = []
        for case in cases:
            reason = skip_reason(case, setup)
            if reason:
                results.append((case, Outcome(note=f"skipped: {reason}")))
                continue
            print(f"running {case.name} ...", file=sys.stderr, flush=True)
            outcome = run_case(case, setup, root / case.name, args.timeout)
            results.append((case, outcome))
            # one line per case as it ends, so a run cut short still says what it measured
            print(f"  {case.name}: total {fmt(outcome.total_ips)} img/s, compute "
                  f"{fmt(outcome.compute_ips)} img/s, p50 {fmt(outcome.p50_ms, 3)} ms, "
                  f"failed checks: {outcome.failed or 'none'} {outcome.note}",
                  file=sys.stderr, flush=True)
    print(describe(setup, results))
    print(table(HEADER, table_rows(results)))
    if args.json:
        Path(args.json).write_text(
            json.dumps([{"case": c.name, **o.__dict__} for c, o in results], indent=2)
        )
    return 1 if any(o.failed for _, o in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
