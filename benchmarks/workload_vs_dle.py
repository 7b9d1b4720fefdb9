"""Our in-image workload vs NVIDIA DeepLearningExamples' PyTorch ConvNets, on one GPU.

Runs ``python -m workload`` and DeepLearningExamples' ``PyTorch/Classification/ConvNets/main.py``
(path from ``--dle-dir`` or ``$DLE_CONVNETS_DIR``; obtained separately, never committed) on
synthetic data with the same arch, batch size and precision, and prints:

    case | ours img/s | DLE img/s | ours/DLE

Cases (ResNet-50, 224 px, channels-last / ``--memory-format nhwc``, 1 GPU):

* ``train-amp-bs256``: training, fp16 AMP (DLE: ``--amp --static-loss-scale 256``);
* ``train-bf16-bs256``: training, bf16 autocast (DLE has no bf16 option: ours only);
* ``infer-amp-bs256``: inference throughput, fp16 AMP (DLE: ``--evaluate --amp``);
* ``infer-amp-bs1``: inference latency, p50 and p99 of the per-batch compute time, in ms.

Both programs are measured with the same rule (see ``workload/metrics.py``): the first
``--warmup`` iterations are dropped and throughput is global batch x iterations / total time.
DLE logs one line per iteration with ``--print-freq 1`` to its ``--raport-file`` (DLLogger
JSON, lines prefixed ``DLLL``); its per-iteration ``*.total_ips`` become times
``batch / ips`` and are summed the same way.  (DLE's own summary averages per-iteration ips
and includes its warmup; it is not used.)  DLE's validation step also computes the loss and
top-1/top-5 accuracy and synchronises each iteration, so its inference numbers carry that
overhead; ours runs the forward pass only. Its training step also synchronises every iteration
and is timed on the host, while ours is timed with CUDA events on the GPU timeline: the training
comparison carries that difference too.

    python benchmarks/workload_vs_dle.py [--dle-dir DIR] [--iterations 200] [--warmup 50]
    python benchmarks/workload_vs_dle.py --allow-cpu      # tiny smoke without a GPU

Without DLE the table has our numbers only and says so; without a GPU it exits with a
message unless ``--allow-cpu``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
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
from orchestrator.results.folders.run_folder import parse_metric_lines

# The rules of workload/metrics.py itself (stdlib only), so both sides are measured alike by
# construction: nearest-rank percentiles, throughput = batch x iterations / total time.
from workload.metrics import images_per_second as throughput
from workload.metrics import percentile as nearest_percentile


@dataclass(frozen=True)
class Case:
    """One comparison: what both programs run."""

    name: str
    mode: str  # train | infer
    batch_size: int
    precision: str  # amp | bf16 | fp32
    latency: bool = False  # report p50/p99 latency instead of throughput


CASES = (
    Case("train-amp-bs256", "train", 256, "amp"),
    Case("train-bf16-bs256", "train", 256, "bf16"),
    Case("infer-amp-bs256", "infer", 256, "amp"),
    Case("infer-amp-bs1", "infer", 1, "amp", latency=True),
)


@dataclass
class Outcome:
    """One program's result for one case (None where it did not run)."""

    ips: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


# ---- DeepLearningExamples ---------------------------------------------------------------------

_STDOUT_METRIC = re.compile(r"((?:train|val)\.[\w]+)\s*:\s*([-+0-9.eE]+)")


def parse_dllogger(text: str) -> list[dict[str, Any]]:
    """Per-iteration records from a DLLogger JSON raport (``DLLL {...}`` lines).

    Each record is ``{"step": [...], "data": {...}}``; parameter and summary lines (whose step
    is ``"PARAMETER"`` or ``[]``/``[epoch]``) are skipped.
    """
    lines = "\n".join(line.strip().removeprefix("DLLL ") for line in text.splitlines())
    return [
        {"step": obj["step"], "data": obj["data"]}
        for obj in parse_metric_lines(lines)
        if isinstance(obj.get("step"), list)
        and len(obj["step"]) >= 2
        and isinstance(obj.get("data"), dict)
    ]


def parse_dle_stdout(text: str) -> list[dict[str, Any]]:
    """Fallback: per-iteration records from DLE's stdout (``Epoch: 0 Iteration: 5 ...``)."""
    out = []
    for line in text.splitlines():
        if "Iteration:" not in line:
            continue
        data = {k: float(v) for k, v in _STDOUT_METRIC.findall(line)}
        if data:
            out.append({"step": line.split("train.")[0].split("val.")[0].strip(), "data": data})
    return out


def dle_outcome(records: list[dict[str, Any]], case: Case, warmup: int) -> Outcome:
    """Apply our measurement rule to DLE's per-iteration records."""
    prefix = "train" if case.mode == "train" else "val"
    rows = [r["data"] for r in records if f"{prefix}.total_ips" in r["data"]]
    rows = rows[warmup:]
    if not rows:
        return Outcome(note="DLE logged no measured iterations")
    ips = [row[f"{prefix}.total_ips"] for row in rows]
    times = [case.batch_size / v for v in ips if v and v > 0]
    outcome = Outcome(ips=throughput(case.batch_size, times))
    if case.latency:
        lat = [row.get(f"{prefix}.compute_latency") for row in rows]
        if any(v is None for v in lat):  # older DLE: derive from compute_ips
            lat = [case.batch_size / row[f"{prefix}.compute_ips"] for row in rows]
        outcome.p50_ms = 1000 * nearest_percentile(lat, 50)
        outcome.p99_ms = 1000 * nearest_percentile(lat, 99)
    return outcome


def dle_command(
    dle_dir: Path, case: Case, iterations: int, warmup: int, workspace: Path, python: str
) -> list[str] | None:
    """DLE's command line for ``case``, or None when DLE cannot run it (bf16)."""
    if case.precision == "bf16":
        return None
    cmd = [
        python,
        str(dle_dir / "main.py"),
        "--arch",
        "resnet50",
        "--data-backend",
        "synthetic",
        "--batch-size",
        str(case.batch_size),
        "--image-size",
        "224",
        "--memory-format",
        "nhwc",
        "--epochs",
        "1",
        "--prof",
        str(iterations + warmup),
        "--print-freq",
        "1",
        "--no-checkpoints",
        "--workspace",
        str(workspace),
        "--raport-file",
        "raport.json",
        "--seed",
        "0",
    ]
    if case.precision == "amp":
        cmd += ["--amp", "--static-loss-scale", "256"]
    cmd += ["--training-only"] if case.mode == "train" else ["--evaluate"]
    return [*cmd, str(workspace)]  # the DATA positional (unused with synthetic data)


#: An empty stand-in for DALI: DLE defines its DALI pipelines at import and fails without it.
NO_DALI = Path(__file__).resolve().parent / "dle_nodali"


@functools.cache
def _has_dali(python: str) -> bool:
    """Whether ``python`` imports DALI (asked once per interpreter, not once per DLE run)."""
    return subprocess.run([python, "-c", "import nvidia.dali"], capture_output=True).returncode == 0


def dle_environment(python: str) -> dict[str, str]:
    """This environment, with the DALI stand-in on the path where ``python`` has no DALI."""
    env = dict(os.environ)
    if not _has_dali(python):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(NO_DALI)) if p)
    return env


def run_dle(
    dle_dir: Path, case: Case, iterations: int, warmup: int, python: str, timeout: int
) -> Outcome:
    """Run DLE for one case and measure it."""
    with tempfile.TemporaryDirectory(prefix="dle-") as tmp:
        workspace = Path(tmp)
        cmd = dle_command(dle_dir, case, iterations, warmup, workspace, python)
        if cmd is None:
            return Outcome(note="DLE has no bf16 mode")
        proc = subprocess.run(cmd, cwd=dle_dir, capture_output=True, text=True, timeout=timeout,
                              env=dle_environment(python))
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return Outcome(note=f"DLE failed (rc {proc.returncode}): {' | '.join(tail)}")
        raport = workspace / "raport.json"
        records = parse_dllogger(raport.read_text()) if raport.exists() else []
        if not records:
            records = parse_dle_stdout(proc.stdout)
        return dle_outcome(records, case, warmup)


# ---- ours -------------------------------------------------------------------------------------


def ours_command(
    case: Case,
    iterations: int,
    warmup: int,
    python: str,
    device: str,
    arch: str,
    image_size: int,
    output_dir: Path,
) -> list[str]:
    """Our workload's command line for ``case``."""
    return [
        python,
        "-m",
        "workload",
        "--arch",
        arch,
        "--mode",
        case.mode,
        "--batch-size",
        str(case.batch_size),
        "--precision",
        case.precision,
        "--image-size",
        str(image_size),
        "--warmup",
        str(warmup),
        "--iterations",
        str(iterations),
        "--data",
        "synthetic",
        "--channels-last",
        "--device",
        device,
        "--output-dir",
        str(output_dir),
    ]


def ours_outcome(summary: dict[str, Any], case: Case) -> Outcome:
    """Read our summary line."""
    prefix = "train" if case.mode == "train" else "val"
    data = summary["data"]
    outcome = Outcome(
        ips=data[f"{prefix}.total_ips"],
        extra={
            "compute_ips": data[f"{prefix}.compute_ips"],
            "power_w": data.get("telemetry.power_mean_w"),
            "throttled": data.get("telemetry.throttled"),
        },
    )
    if case.latency:
        outcome.p50_ms = 1000 * data[f"{prefix}.compute_latency_at50"]
        outcome.p99_ms = 1000 * data[f"{prefix}.compute_latency_at99"]
    return outcome


def run_ours(cmd: list[str], case: Case, timeout: int) -> Outcome:
    """Run our workload and read its summary line."""
    run = run_workload(cmd, timeout=timeout)
    if run.summary is None:
        return Outcome(note=f"ours failed ({run.failure(timeout)})")
    return ours_outcome(run.summary, case)


# ---- report -----------------------------------------------------------------------------------


def table_rows(results: list[tuple[Case, Outcome, Outcome]]) -> list[list[str]]:
    """Rows of the report: case, ours, theirs, ratio (>1 means ours is faster), notes."""
    rows = []
    for case, ours, theirs in results:
        notes = "; ".join(n for n in (ours.note, theirs.note) if n)
        if case.latency:
            o = f"p50 {fmt(ours.p50_ms, 2)} / p99 {fmt(ours.p99_ms, 2)} ms"
            t = f"p50 {fmt(theirs.p50_ms, 2)} / p99 {fmt(theirs.p99_ms, 2)} ms"
            ratio = (theirs.p50_ms / ours.p50_ms) if ours.p50_ms and theirs.p50_ms else None
        else:
            o, t = fmt(ours.ips), fmt(theirs.ips)
            ratio = (ours.ips / theirs.ips) if ours.ips and theirs.ips else None
        rows.append([case.name, o, t, fmt(ratio, 3), notes])
    return rows


HEADER = ("case", "ours img/s", "DLE img/s", "ours/DLE", "notes")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison; returns the exit status."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--dle-dir",
        default=os.environ.get("DLE_CONVNETS_DIR"),
        help="DeepLearningExamples PyTorch/Classification/ConvNets directory "
        "(default: $DLE_CONVNETS_DIR)",
    )
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument(
        "--cases", nargs="*", choices=[c.name for c in CASES], default=[c.name for c in CASES]
    )
    p.add_argument("--python", default=sys.executable, help="interpreter for both programs")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per run")
    p.add_argument("--json", default=None, metavar="PATH", help="also write results as JSON")
    p.add_argument(
        "--allow-cpu",
        action="store_true",
        help="without a GPU, run a tiny smoke of ours only (resnet18, 64 px, bs 8)",
    )
    dry_option(p, "the GPU and DeepLearningExamples looked for (no torch), nothing run")
    args = p.parse_args(argv)
    if args.dry:
        if not nvidia_gpus():
            return cannot_run("no NVIDIA GPU (nvidia-smi lists none): this benchmark compares "
                              "GPU throughput; --allow-cpu runs a tiny CPU smoke of ours")
        print(f"would compare {' '.join(args.cases)} with DLE from {args.dle_dir or '(none)'}")
        return 0
    gpu = gpu_count() > 0
    if not gpu and not args.allow_cpu:
        return cannot_run("no CUDA GPU visible to torch: this benchmark compares GPU "
                          "throughput. Run it on a GPU machine, or pass --allow-cpu for a tiny "
                          "CPU smoke of our workload.")
    stop_on_sigterm()
    dle_dir = Path(args.dle_dir) if args.dle_dir else None
    if dle_dir is not None and not (dle_dir / "main.py").is_file():
        print(
            f"--dle-dir {dle_dir} has no main.py (expected DeepLearningExamples' "
            "PyTorch/Classification/ConvNets)",
            file=sys.stderr,
        )
        return 2
    if not gpu:
        dle_dir = None
    cases = [c for c in CASES if c.name in args.cases]
    device, arch, size = ("cuda", "resnet50", 224) if gpu else ("cpu", "resnet18", 64)
    iterations, warmup = (args.iterations, args.warmup) if gpu else (3, 1)
    if not gpu:
        cases = [
            Case(
                c.name.replace("bs256", "bs8").replace("amp", "fp32"),
                c.mode,
                8 if c.batch_size > 1 else 1,
                "bf16" if c.precision == "bf16" else "fp32",
                c.latency,
            )
            for c in cases
        ]
        print("CPU smoke: resnet18, 64 px, fp32 instead of amp, ours only", file=sys.stderr)
    if dle_dir is None:
        print(
            "DeepLearningExamples not given (--dle-dir / $DLE_CONVNETS_DIR): ours only",
            file=sys.stderr,
        )

    results = []
    with tempfile.TemporaryDirectory(prefix="ours-") as tmp:
        for case in cases:
            print(f"running {case.name} ...", file=sys.stderr, flush=True)
            cmd = ours_command(
                case, iterations, warmup, args.python, device, arch, size, Path(tmp) / case.name
            )
            ours = run_ours(cmd, case, args.timeout)
            if dle_dir is not None:
                theirs = run_dle(dle_dir, case, iterations, warmup, args.python, args.timeout)
            else:
                theirs = Outcome(note="DLE not run")
            results.append((case, ours, theirs))
    print(table(HEADER, table_rows(results)))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                [{"case": c.name, "ours": o.__dict__, "dle": t.__dict__} for c, o, t in results],
                indent=2,
            )
        )
    return 0 if all(o.ips is not None for _, o, _ in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
