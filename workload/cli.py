"""Command line of the in-image benchmark: ``python -m workload [options]``.

stdout carries only JSON lines (``meta`` first, optional ``iter`` lines, ``summary`` last, or
one ``error`` line); notes and warnings go to stderr.  Exit status: 0 ok, 2 a handled error
(bad option, unknown arch, missing weights, bad dataset, missing device), 3 out of memory,
1 a bug (the traceback is on stderr).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from typing import TextIO

from workload.errors import ConfigError, OutOfMemory, WorkloadError
from workload.output import Reporter

log = logging.getLogger(__name__)

ARCH_DEFAULT = "resnet50"


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors become ConfigError (so they print as JSON)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        raise ConfigError(f"bad command line: {message}")


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
    """The argument parser (every flag of the orchestrator's command-line contract)."""
    p = _Parser(
        prog="python -m workload",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bool_flag = argparse.BooleanOptionalAction
    p.add_argument(
        "--arch",
        default=ARCH_DEFAULT,
        help="torchvision classification model name, or resnext101_32x4d / se_resnext101_32x4d "
        "(NVIDIA DeepLearningExamples' models) (default: %(default)s)",
    )
    p.add_argument("--mode", choices=("train", "infer"), default="train")
    p.add_argument("--batch-size", type=_positive, default=64, help="per rank")
    p.add_argument("--precision", choices=("fp32", "amp", "bf16"), default="fp32")
    p.add_argument("--image-size", type=_positive, default=224, metavar="PX")
    p.add_argument("--warmup", type=_non_negative, default=20, help="untimed iterations")
    p.add_argument("--iterations", type=_positive, default=100, help="measured iterations")
    p.add_argument(
        "--data", default="synthetic", help="'synthetic' or an ImageFolder directory of JPEGs"
    )
    p.add_argument("--channels-last", action=bool_flag, default=True)
    p.add_argument(
        "--compile", choices=("none", "default", "reduce-overhead", "max-autotune"), default="none"
    )
    p.add_argument("--cuda-graphs", action=bool_flag, default=False)
    p.add_argument(
        "--pretrained",
        action=bool_flag,
        default=False,
        help="load torchvision's weights file from --checkpoint-dir (never downloads)",
    )
    p.add_argument("--num-classes", type=_positive, default=1000)
    p.add_argument("--workers", type=_non_negative, default=4, help="data loader processes")
    p.add_argument("--device", choices=("auto", "cuda", "cpu", "hpu"), default="auto")
    p.add_argument(
        "--hpu-mode",
        choices=("eager", "lazy", "compile", "graph"),
        default=None,
        help="Gaudi execution mode: eager (PT_HPU_LAZY_MODE=0), lazy (PT_HPU_LAZY_MODE=1, "
        "mark_step), compile (eager + torch.compile(backend=hpu_backend)) or graph "
        "(torch.jit.trace, Habana's 0.13 graph mode); default: compile with --compile, else "
        "PT_HPU_LAZY_MODE's mode, else lazy",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", default=None, metavar="DIR")
    p.add_argument(
        "--telemetry-interval",
        type=float,
        default=0.5,
        metavar="SECONDS",
        help="sampling period; 0 disables the sampler",
    )
    p.add_argument(
        "--profiler",
        choices=("none", "torch", "nsys", "ncu", "nvprof"),
        default="none",
        help="torch: torch.profiler trace of the profile window; nsys/ncu/nvprof: mark the "
        "window with cudaProfilerStart/Stop and NVTX for the tool the command runs under",
    )
    p.add_argument(
        "--profile-start",
        type=_non_negative,
        default=0,
        metavar="I",
        help="first profiled measured iteration (0 = the first after the warmup)",
    )
    p.add_argument(
        "--profile-iterations",
        type=_positive,
        default=5,
        metavar="N",
        help="measured iterations the profiler covers (the window must fit in --iterations)",
    )
    p.add_argument(
        "--checkpoint-dir",
        default=None,
        metavar="DIR",
        help="pretrained weights directory (default: $TORCH_HOME/hub/checkpoints)",
    )
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and cross-check the command line; raises ConfigError."""
    args = build_parser().parse_args(argv)
    if args.profiler == "torch" and not args.output_dir:
        raise ConfigError("--profiler torch writes a trace file: also pass --output-dir DIR")
    if args.telemetry_interval < 0:
        raise ConfigError("--telemetry-interval must be >= 0 (0 disables telemetry)")
    if args.hpu_mode is not None and args.device not in ("hpu", "auto"):
        raise ConfigError(f"--hpu-mode applies to --device hpu, not --device {args.device}")
    if args.profiler != "none":
        from workload.profiling import window_problem

        problem = window_problem(args.iterations, args.profile_start, args.profile_iterations)
        if problem:
            raise ConfigError(problem)
    return args


def _setup_logging() -> None:
    """``[workload] message`` on stderr for the package's loggers (every module's is a child)."""
    package = logging.getLogger(__name__.partition(".")[0])
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[workload] %(message)s"))
    package.handlers[:] = [handler]
    package.setLevel(logging.INFO)
    package.propagate = False


def _is_oom(exc: BaseException) -> bool:
    """Out of memory? Asked only once torch is imported (no torch: it cannot be torch's OOM)."""
    if "torch" not in sys.modules:
        return "out of memory" in str(exc).lower()
    from workload.compat import is_oom

    return is_oom(exc)


def main(argv: Sequence[str] | None = None, stdout: TextIO | None = None) -> int:
    """Run the benchmark; returns the exit status.  JSON lines go to ``stdout``."""
    _setup_logging()
    out = stdout if stdout is not None else sys.stdout
    rank = int(os.environ.get("RANK", "0"))
    reporter = Reporter(out, enabled=rank == 0)
    args = None
    try:
        args = parse_args(argv)
        from workload.run import run  # heavy imports (torch) only after parsing

        run(args, reporter)
        return 0
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except WorkloadError as exc:
        return _fail(reporter, exc, rank)
    except Exception as exc:
        if _is_oom(exc) and args is not None:
            oom = OutOfMemory(
                f"out of memory with --arch {args.arch} --batch-size {args.batch_size} "
                f"--image-size {args.image_size} --precision {args.precision} "
                f"--mode {args.mode}: lower --batch-size ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''})"
            )
            return _fail(reporter, oom, rank)
        traceback.print_exc(file=sys.stderr)
        reporter.emit(
            {
                "type": "error",
                "kind": "internal",
                "rank": rank,
                "message": f"internal error {type(exc).__name__}: {exc} (traceback on stderr)",
            },
            force=True,
        )
        return 1
    finally:
        from workload.device import shutdown_distributed

        if "torch" in sys.modules:
            shutdown_distributed()


def _fail(reporter: Reporter, exc: WorkloadError, rank: int) -> int:
    log.error("error: %s", exc)
    reporter.emit(
        {"type": "error", "kind": exc.kind, "rank": rank, "message": str(exc)}, force=True
    )
    return exc.exit_code


def run_cli() -> int:
    """Entry point of ``python -m workload``: keeps stdout for JSON lines only.

    The real stdout is kept for the reporter and file descriptor 1 is pointed at stderr, so
    anything a library prints (including from C++) cannot corrupt the JSON stream.
    """
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
