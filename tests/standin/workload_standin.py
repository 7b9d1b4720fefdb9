"""STAND-IN for the benchmark workload (``python -m workload``), for the orchestrator's plumbing
tests: stdlib only, no model, no torch; it starts in milliseconds.

It is **not** the workload. It speaks the workload's contract with the orchestrator exactly,
so that sweeps, resume, interrupts, timeouts and the Docker, SSH and Slurm backends can be
tested without running torch in every cell:

* the workload's command line (every flag of ``workload.cli.build_parser``, same choices);
* stdout carries only JSON lines: ``meta`` first, an ``iter`` line every 10 measured
  iterations, ``summary`` last (``status``, ``data``, ``iteration_times``, ``env``), or one
  ``error`` line (``kind``, ``rank``, ``message``); notes go to stderr;
* exit status 0 ok, 2 a handled error, 3 out of memory, 1 a bug (traceback on stderr);
* ``--output-dir``: ``iterations.csv``, ``iterations_per_rank.csv`` and ``summary.json`` as the
  workload writes them;
* ranks: ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_WORLD_SIZE`` from the environment (torchrun's);
  only rank 0 prints. The ranks do not talk to each other (no process group): the per-rank
  figures (``per_gpu.*``, ``gpu<rank>.*``) are rank 0's own;
* a missing ``--data`` folder is the workload's data error (same message), ``--device cuda``
  or ``hpu`` its device error (no accelerator here).

Its ``env`` has every key the workload's has (the versions say ``+standin``) plus
``"standin"``, so every result it produces says where it came from. Its timings are real
(each iteration sleeps ``--standin-step-s``); its throughput and loss mean nothing.

``tests/test_standin.py`` checks it against the real workload's output (same line types, same
keys, same files, same exit codes) so that it cannot drift silently.

Knobs for the plumbing tests (all ``--standin-*``; the workload has none of them):

``--standin-step-s S``      seconds each iteration takes (default 0.01)
``--standin-fail KIND``     end with the workload's error ``KIND`` (config, arch, data, device,
                            weights, oom: error line, exit 2 or 3; internal: traceback, error
                            line, exit 1; abort: no line at all, exit 1)
``--standin-fail-at N``     ... after N measured iterations (default 0: before the meta line)
``--standin-ignore-sigterm``  ignore SIGTERM (so must its children): only SIGKILL ends it
``--standin-children N``    start N child processes that sleep until killed (a launcher's
                            ranks, a leaked data loader); ``--standin-detach``: each in a
                            session of its own, double-forked (a daemon)
``--standin-lines N``       write N lines of noise to stderr first (log volume)
``--standin-allocate-mb M`` allocate and touch M MiB first (memory limits, OOM kills)
``--standin-env NAMES``     for each comma-separated variable, print ``NAME <sha256> value:
                            <value>`` to stderr (secrets arrive; the log is scrubbed)
``--standin-write-env F``   write a JSON file F (in the output dir) with the rank variables,
                            ``CUDA_VISIBLE_DEVICES`` and the working directory (what the
                            backend gave the process)
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, TextIO

STANDIN_VERSION = "0.0.0+standin"
PROGRESS_EVERY = 10  # as workload.run.PROGRESS_EVERY
ERRORS = {  # kind -> (exit status, message), as workload.errors defines them
    "config": (2, "bad command line: (stand-in) a configuration error"),
    "arch": (2, "unknown --arch (stand-in): an architecture error"),
    "weights": (2, "pretrained weights not found (stand-in)"),
    "data": (2, "--data (stand-in): a dataset error"),
    "device": (2, "--device (stand-in): the requested device is not available"),
    "oom": (3, "out of memory (stand-in): lower --batch-size"),
}
ITERATION_FIELDS = ("step", "start_s", "data_time_s", "compute_time_s", "iteration_time_s")


class HandledError(Exception):
    """One of the workload's handled errors (an ``error`` line, exit 2 or 3)."""

    def __init__(self, kind: str, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.kind = kind
        self.exit_code = exit_code


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        raise HandledError("config", f"bad command line: {message}")


def _positive(value: str) -> int:
    n = int(value)
    if n <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return n


def _non_negative(value: str) -> int:
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return n


def build_parser() -> argparse.ArgumentParser:
    """The workload's flags (``workload.cli.build_parser``) and the stand-in's knobs."""
    p = _Parser(prog="workload_standin.py", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    flag = argparse.BooleanOptionalAction
    p.add_argument("--arch", default="resnet50")
    p.add_argument("--mode", choices=("train", "infer"), default="train")
    p.add_argument("--batch-size", type=_positive, default=64)
    p.add_argument("--precision", choices=("fp32", "amp", "bf16"), default="fp32")
    p.add_argument("--image-size", type=_positive, default=224)
    p.add_argument("--warmup", type=_non_negative, default=20)
    p.add_argument("--iterations", type=_positive, default=100)
    p.add_argument("--data", default="synthetic")
    p.add_argument("--channels-last", action=flag, default=True)
    p.add_argument("--compile", choices=("none", "default", "reduce-overhead", "max-autotune"),
                   default="none")
    p.add_argument("--cuda-graphs", action=flag, default=False)
    p.add_argument("--pretrained", action=flag, default=False)
    p.add_argument("--num-classes", type=_positive, default=1000)
    p.add_argument("--workers", type=_non_negative, default=4)
    p.add_argument("--device", choices=("auto", "cuda", "cpu", "hpu"), default="auto")
    p.add_argument("--hpu-mode", choices=("eager", "lazy", "compile", "graph"), default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", default=None)
    p.add_argument("--telemetry-interval", type=float, default=0.5)
    p.add_argument("--profiler", choices=("none", "torch", "nsys", "ncu", "nvprof"),
                   default="none")
    p.add_argument("--profile-start", type=_non_negative, default=0)
    p.add_argument("--profile-iterations", type=_positive, default=5)
    p.add_argument("--checkpoint-dir", default=None)
    knobs = p.add_argument_group("stand-in knobs (not the workload's)")
    knobs.add_argument("--standin-step-s", type=float, default=0.01)
    knobs.add_argument("--standin-fail", choices=(*ERRORS, "internal", "abort"), default=None)
    knobs.add_argument("--standin-fail-at", type=_non_negative, default=0)
    knobs.add_argument("--standin-ignore-sigterm", action="store_true")
    knobs.add_argument("--standin-children", type=_non_negative, default=0)
    knobs.add_argument("--standin-detach", action="store_true")
    knobs.add_argument("--standin-lines", type=_non_negative, default=0)
    knobs.add_argument("--standin-allocate-mb", type=_non_negative, default=0)
    knobs.add_argument("--standin-env", default="")
    knobs.add_argument("--standin-write-env", default=None)
    knobs.add_argument("--standin-child", action="store_true", help=argparse.SUPPRESS)
    return p


# --- what the workload reports ------------------------------------------------------------


class Reporter:
    """One JSON object per line on the real stdout (rank 0 only, unless forced)."""

    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self.stream = stream
        self.enabled = enabled

    def emit(self, obj: dict[str, Any], force: bool = False) -> None:
        if self.enabled or force:
            self.stream.write(json.dumps(_clean(obj)) + "\n")
            self.stream.flush()


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _ranks() -> tuple[int, int, int]:
    env = os.environ
    world = int(env.get("WORLD_SIZE", "1"))
    return int(env.get("RANK", "0")), world, int(env.get("LOCAL_WORLD_SIZE", str(world)))


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _device(requested: str) -> str:
    if requested in ("cuda", "hpu"):
        raise HandledError("device", f"--device {requested} was requested but this is the "
                                     "stand-in workload: it runs on the CPU only")
    return "cpu"


def _check_data(data: str) -> None:
    """The workload's dataset checks, as far as the orchestrator can see them."""
    if data == "synthetic":
        return
    path = Path(data)
    if not path.is_dir():
        if path.exists():
            raise HandledError("data", f"--data {data} is a file, expected an ImageFolder "
                                       "directory")
        raise HandledError("data", f"--data {data}: no such directory; pass an ImageFolder "
                                   "directory (DIR/<class>/<image>.jpg) or --data synthetic")


def _environment(args: argparse.Namespace, device: str, world: int) -> dict[str, Any]:
    """Every key of the workload's ``env`` (workload.device.environment and workload.run),
    the values of a CPU run, the library versions marked ``+standin``."""
    cpu = _cpu_model()
    env: dict[str, Any] = {
        "torch_version": STANDIN_VERSION, "torchvision_version": STANDIN_VERSION,
        "cuda_version": None, "cudnn_version": None, "device": device, "device_name": cpu,
        "driver_version": None, "device_count": 1, "world_size": world,
        "hostname": socket.gethostname(), "python_version": platform.python_version(),
        "cpu_model": cpu, "cpu_count": os.cpu_count(), "torch_threads": 1,
        "precision": args.precision,
        "memory_format": "channels_last" if args.channels_last else "contiguous",
        "compile": args.compile, "cuda_graphs": False, "arch": args.arch, "mode": args.mode,
        "batch_size": args.batch_size, "global_batch_size": args.batch_size * world,
        "image_size": args.image_size, "data": args.data,
        "decoder": "synthetic" if args.data == "synthetic" else "cpu",
        "num_classes": args.num_classes, "pretrained": args.pretrained, "seed": args.seed,
        "profiler": args.profiler,
    }
    if args.profiler != "none":
        env["profile_window"] = [args.profile_start,
                                 args.profile_start + args.profile_iterations - 1]
    api: dict[str, Any] = {"autocast": "stand-in", "oom_errors": ["standin.OutOfMemory"],
                           "transforms": "stand-in"}
    if args.mode == "train":
        api["optimizer"] = "stand-in"
        if args.precision == "amp":
            api["grad_scaler"] = "stand-in"
    api["compile"] = "none" if args.compile == "none" else "stand-in"
    if args.data != "synthetic":
        api["decode"] = "stand-in"
    if world > 1:
        api["process_group"] = "stand-in"
        api["ddp"] = []
    if args.pretrained:
        api["weights"] = "stand-in"
    if args.profiler != "none":
        api["profiler"] = "stand-in"
    env["api"] = api
    release = os.environ.get("NVIDIA_PYTORCH_VERSION")  # set by NGC PyTorch containers
    if release:
        env["container_release"] = release
    env["standin"] = "tests/standin/workload_standin.py: not the workload, no model ran"
    return env


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return float(ordered[round(q / 100.0 * (len(ordered) - 1))])


def _summarize(prefix: str, data: list[float], compute: list[float], iteration: list[float],
               global_batch: int) -> dict[str, float]:
    """The summary's throughput and latency block (workload.metrics.summarize)."""
    def ips(times: list[float]) -> float:
        total = math.fsum(times)
        return global_batch * len(times) / total if total > 0 else float("inf")

    out = {f"{prefix}.total_ips": ips(iteration), f"{prefix}.compute_ips": ips(compute),
           f"{prefix}.data_time": math.fsum(data) / len(data),
           f"{prefix}.compute_time": math.fsum(compute) / len(compute)}
    for q in (50, 90, 95, 99):
        out[f"{prefix}.compute_latency_at{q}"] = _percentile(compute, q)
    for q in (50, 90, 95, 99):
        out[f"{prefix}.total_latency_at{q}"] = _percentile(iteration, q)
    return out


def _per_rank(series: list[float]) -> dict[str, Any]:
    """The per-rank figures (workload.run.per_rank_figures) of this process's own series."""
    return {"per_gpu.iteration_times": {"0": series}, "per_gpu.gpus": 1,
            "gpu0.iteration_median_s": statistics.median(series),
            "gpu0.iteration_mean_s": math.fsum(series) / len(series)}


def _write_outputs(output_dir: Path, starts: list[float], data: list[float],
                   compute: list[float], iteration: list[float], summary: dict) -> None:
    with (output_dir / "iterations.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(ITERATION_FIELDS)
        for i, row in enumerate(zip(starts, data, compute, iteration, strict=True), start=1):
            writer.writerow([i, f"{row[0]:.6f}", *(f"{v:.9f}" for v in row[1:])])
    with (output_dir / "iterations_per_rank.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(("step", "rank", "iteration_time_s"))
        for step, value in enumerate(iteration, start=1):
            writer.writerow([step, 0, f"{value:.9f}"])
    (output_dir / "summary.json").write_text(json.dumps(_clean(summary), indent=2) + "\n")


# --- misbehaviour on request ---------------------------------------------------------------


def _start_children(args: argparse.Namespace) -> None:
    """Children that sleep until killed; their command lines repeat ours (so they name the
    output folder, as a launcher's ranks do)."""
    argv = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--standin-child"]
    for _ in range(args.standin_children):
        if args.standin_detach:
            _daemon(argv)
        else:
            subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    print(f"[standin] started {args.standin_children} children", file=sys.stderr, flush=True)


def _daemon(argv: list[str]) -> None:
    """Double-fork and ``setsid``: a process that has left the cell's session and group."""
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(argv[0], argv)
        os._exit(0)
    os.waitpid(pid, 0)


def _child(args: argparse.Namespace) -> int:
    if args.standin_ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(3600)


def _allocate(mib: int) -> bytearray:
    block = bytearray(mib * 2**20)
    for i in range(0, len(block), 4096):  # touch every page: resident, not just reserved
        block[i] = 1
    return block


def _show_env(names: str) -> None:
    for name in filter(None, names.split(",")):
        value = os.environ.get(name, "")
        digest = hashlib.sha256(value.encode()).hexdigest()
        print(f"{name} {digest} value: {value}", file=sys.stderr, flush=True)


def _write_env(args: argparse.Namespace, rank: int) -> None:
    target = Path(args.output_dir or ".") / args.standin_write_env.replace("{rank}", str(rank))
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES",
            "ORCHESTRATE_CELL")
    target.write_text(json.dumps({"env": {k: os.environ.get(k) for k in keys},
                                  "cwd": os.getcwd(), "argv": sys.argv}))


def _fail(kind: str) -> None:
    if kind == "abort":
        os._exit(1)
    if kind == "internal":
        raise RuntimeError("stand-in internal error (--standin-fail internal)")
    code, message = ERRORS[kind]
    raise HandledError(kind, message, code)


# --- the run -------------------------------------------------------------------------------


def run(args: argparse.Namespace, reporter: Reporter) -> None:
    rank, world, _ = _ranks()
    device = _device(args.device)
    _check_data(args.data)
    if args.standin_lines:
        for i in range(args.standin_lines):
            print(f"[standin] noise line {i + 1} of {args.standin_lines}", file=sys.stderr)
        sys.stderr.flush()
    ballast = _allocate(args.standin_allocate_mb) if args.standin_allocate_mb else None
    if args.standin_env:
        _show_env(args.standin_env)
    if args.standin_write_env:
        _write_env(args, rank)
    if args.standin_children:
        _start_children(args)
    if args.standin_fail and args.standin_fail_at == 0:
        _fail(args.standin_fail)
    output_dir = Path(args.output_dir) if args.output_dir else None
    if output_dir is not None:
        output_dir.mkdir(parents=True, exist_ok=True)
    env = _environment(args, device, world)
    reporter.emit({"type": "meta", "env": env})
    prefix = "train" if args.mode == "train" else "val"
    gbs = args.batch_size * world
    for _ in range(args.warmup):
        time.sleep(args.standin_step_s)
    starts: list[float] = []
    data: list[float] = []
    compute: list[float] = []
    for i in range(args.iterations):
        if args.standin_fail and i == args.standin_fail_at:
            _fail(args.standin_fail)
        starts.append(time.time())
        t0 = time.perf_counter()
        t1 = time.perf_counter()  # the "batch" is ready at once
        time.sleep(args.standin_step_s)
        data.append(t1 - t0)
        compute.append(time.perf_counter() - t1)
        if (i + 1) % PROGRESS_EVERY == 0:
            window = slice(i + 1 - PROGRESS_EVERY, i + 1)
            totals = [d + c for d, c in zip(data[window], compute[window], strict=True)]
            block = _summarize(prefix, data[window], compute[window], totals, gbs)
            line = {f"{prefix}.total_ips": block[f"{prefix}.total_ips"],
                    f"{prefix}.compute_ips": block[f"{prefix}.compute_ips"]}
            if prefix == "train":
                line["train.loss"] = _loss(i)
            reporter.emit({"type": "iter", "step": i + 1, "data": line})
    iteration = [d + c for d, c in zip(data, compute, strict=True)]
    summary_data: dict[str, Any] = _summarize(prefix, data, compute, iteration, gbs)
    summary_data |= _per_rank(iteration)
    if prefix == "train":
        summary_data["train.loss"] = _loss(args.iterations - 1)
    summary_data.update(iterations=args.iterations, warmup=args.warmup, world_size=world,
                        global_batch_size=gbs, duration_s=math.fsum(iteration),
                        wall_time_s=time.time() - STARTED)
    summary = {"type": "summary", "status": "ok", "data": summary_data,
               "iteration_times": iteration, "env": env}
    if rank == 0 and output_dir is not None:
        _write_outputs(output_dir, starts, data, compute, iteration, summary)
    reporter.emit(summary)
    del ballast


def _loss(step: int) -> float:
    return 2.3 * 0.99**step


def main(argv: list[str] | None = None, stdout: TextIO | None = None) -> int:
    out = stdout if stdout is not None else sys.stdout
    rank = int(os.environ.get("RANK", "0"))
    reporter = Reporter(out, enabled=rank == 0)
    try:
        args = build_parser().parse_args(argv)
        if args.standin_ignore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if args.standin_child:
            return _child(args)
        run(args, reporter)
        return 0
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except HandledError as exc:
        print(f"[workload] error: {exc}", file=sys.stderr, flush=True)
        reporter.emit({"type": "error", "kind": exc.kind, "rank": rank, "message": str(exc)},
                      force=True)
        return exc.exit_code
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        reporter.emit({"type": "error", "kind": "internal", "rank": rank,
                       "message": f"internal error {type(exc).__name__}: {exc} (traceback on "
                                  "stderr)"}, force=True)
        return 1


def run_cli() -> int:
    """Keep stdout for JSON lines only, as ``workload.cli.run_cli`` does."""
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        return main()
    json_out = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    try:
        return main(stdout=json_out)
    finally:
        json_out.flush()


STARTED = time.time()

if __name__ == "__main__":
    raise SystemExit(run_cli())
