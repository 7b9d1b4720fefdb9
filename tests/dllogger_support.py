"""A small real program that logs through NVIDIA DLLogger the way DLE's ConvNets ``main.py`` does.

Run as a script (``python tests/dllogger_support.py --raport R.json --truth T.json ...``), it
times real (sleeping) iterations and logs them with the real ``dllogger`` package: a PARAMETER
record of its arguments, METADATA with units, per-iteration records (step ``(epoch,
iteration)``, iterations numbered from 1, every ``--print-freq`` with the mean of the interval;
each step logged twice, once per verbosity level, as DLE does), validation records (step
``(epoch, iteration, val_iteration)``), epoch records and a run summary (step ``()``) holding
the program's own figures: mean of per-iteration ips, warmup included, and nearest-rank
latency quantiles over every validation iteration. ``StdOutBackend`` prints to stdout,
``JSONStreamBackend`` writes the raport. ``--truth`` gets the raw per-iteration times, so tests
can check the parsers against what really happened. The program is our own; nothing of DLE is
copied.

``--dle-logger`` drives DLE's own logger module instead (``image_classification/logger.py``
of the DeepLearningExamples ConvNets snapshot in the peers folder, loaded by path, used the way
DLE's ``train()`` uses it): training only, because its validation quantile meters call
``numpy.quantile(interpolation=...)``, which numpy 2 removed.

For tests: :func:`dllogger_available`, :func:`dle_logger_path` and :func:`run_program`.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def dllogger_available() -> None:
    """Skip (fail under CI=true) when the real DLLogger is not installed."""
    import importlib.util

    if importlib.util.find_spec("dllogger") is None:
        from service_support import unavailable

        unavailable("NVIDIA DLLogger is not installed (pip install ../shared/peers/dllogger; "
                    ".ci/run does it)")


def dle_logger_path() -> Path:
    """DLE ConvNets' ``image_classification/logger.py`` in the peers folder (first of
    $ORCHESTRATE_PEERS, ../shared/peers beside the checkout, /work/shared/peers); skip (fail
    under CI=true) when there is none."""
    import os

    for base in (os.environ.get("ORCHESTRATE_PEERS"), HERE.parents[2] / "shared" / "peers",
                 "/work/shared/peers"):
        if base:
            path = Path(base) / "dle-convnets" / "image_classification" / "logger.py"
            if path.is_file():
                return path
    from service_support import unavailable

    unavailable("no peers folder with dle-convnets (set ORCHESTRATE_PEERS)")
    raise AssertionError("unreachable")


def run_program(workdir: Path, *args: str, check: bool = True, name: str = "run"
                ) -> tuple[Path, Path, Path, subprocess.CompletedProcess[str]]:
    """Run the program in ``workdir``; return (raport, stdout log, truth, process)."""
    dllogger_available()
    workdir.mkdir(parents=True, exist_ok=True)
    raport, out, truth = (workdir / f"{name}.json", workdir / f"{name}.log",
                          workdir / f"{name}.truth.json")
    proc = subprocess.run(
        [sys.executable, str(HERE), "--raport", str(raport), "--truth", str(truth), *args],
        capture_output=True, text=True, timeout=120,
    )
    out.write_text(proc.stdout, encoding="utf-8")
    if check and proc.returncode != 0:
        raise AssertionError(f"program failed ({proc.returncode}): {proc.stderr}")
    return raport, out, truth, proc


# --- the program ---------------------------------------------------------------------------


def _step_text(step: object) -> str:
    """How DLE prints a step: 'Epoch: 0 Iteration: 3 ', 'Summary:', 'PARAMETER'."""
    if isinstance(step, str):
        return step
    assert isinstance(step, tuple)
    if not step:
        return "Summary:"
    names = ("Epoch", "Iteration", "Validation Iteration")
    return "".join(f"{n}: {v} " for n, v in zip(names, step, strict=False))


def _nearest(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[round(q * (len(ordered) - 1))]


class _Interval:
    """Values recorded since the last logged record, and over the epoch and the run."""

    def __init__(self) -> None:
        self.now: dict[str, list[float]] = {}
        self.epoch: dict[str, list[float]] = {}
        self.run: dict[str, list[float]] = {}

    def add(self, **values: float) -> None:
        for key, value in values.items():
            for bucket in (self.now, self.epoch, self.run):
                bucket.setdefault(key, []).append(value)

    @staticmethod
    def means(bucket: dict[str, list[float]]) -> dict[str, float]:
        return {k: math.fsum(v) / len(v) for k, v in bucket.items() if v}


def _sleep_iteration(data_s: float, compute_s: float) -> tuple[float, float]:
    t0 = time.perf_counter()
    time.sleep(data_s)
    t1 = time.perf_counter()
    time.sleep(compute_s)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--raport", required=True)
    p.add_argument("--truth", required=True)
    p.add_argument("--arch", default="resnet50")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--amp", action="store_true")
    p.add_argument("--evaluate", action="store_true", help="inference only (DLE --evaluate)")
    p.add_argument("--training-only", action="store_true", help="no validation pass")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--iterations", type=int, default=30, help="train iterations per epoch")
    p.add_argument("--val-iterations", type=int, default=20)
    p.add_argument("--print-freq", type=int, default=1)
    p.add_argument("--slow-warmup", type=int, default=5, help="slow first train iterations")
    p.add_argument("--step-ms", type=float, default=2.0)
    p.add_argument("--stop-after", type=int, default=0,
                   help="exit 3 after this many train iterations, without a run summary")
    p.add_argument("--default-steps", action="store_true",
                   help="print steps as DLLogger's default str(step)")
    p.add_argument("--json-to-stdout", action="store_true",
                   help="JSONStreamBackend to stdout, no StdOutBackend, no raport")
    p.add_argument("--nan-loss", action="store_true")
    p.add_argument("--dle-logger", help="DLE's image_classification/logger.py: log through it")
    args = p.parse_args(argv)
    if args.dle_logger:
        return _dle_main(args)

    import dllogger
    from dllogger import JSONStreamBackend, StdOutBackend, Verbosity

    if args.json_to_stdout:
        print("program starting (not a DLLogger line)", flush=True)
        backends = [JSONStreamBackend(Verbosity.VERBOSE, "/dev/stdout", append=True)]
    else:
        stdout = (StdOutBackend(Verbosity.DEFAULT) if args.default_steps
                  else StdOutBackend(Verbosity.DEFAULT, step_format=_step_text))
        backends = [stdout, JSONStreamBackend(Verbosity.VERBOSE, args.raport)]
    dllogger.init(backends=backends)
    dllogger.log(step="PARAMETER", data=dict(vars(args)), verbosity=Verbosity.DEFAULT)
    ips_meta = {"unit": "images/s", "format": ":.2f"}
    time_meta = {"unit": "s", "format": ":.5f"}
    for prefix in ("train", "val"):
        for name in ("compute_ips", "total_ips"):
            dllogger.metadata(f"{prefix}.{name}", ips_meta)
        for name in ("data_time", "compute_time", "compute_latency", "compute_latency_at99",
                     "compute_latency_at95", "compute_latency_at100"):
            dllogger.metadata(f"{prefix}.{name}", time_meta)
        dllogger.metadata(f"{prefix}.loss", {"unit": None, "format": ":.5f"})
    dllogger.metadata("val.top1", {"unit": "%", "format": ":.2f"})

    tbs = args.batch_size * args.world_size
    step_s = args.step_ms / 1000.0
    truth: dict[str, object] = {"global_batch": tbs, "train": {"data": [], "compute": []},
                                "val": {"data": [], "compute": []}}
    train, val = _Interval(), _Interval()
    done = 0
    for epoch in range(args.epochs):
        train.epoch, val.epoch = {}, {}
        if not args.evaluate:
            for it in range(1, args.iterations + 1):
                slow = done < args.slow_warmup
                d, c = _sleep_iteration(step_s / 4, step_s * (5 if slow else 1))
                truth["train"]["data"].append(d)  # type: ignore[index]
                truth["train"]["compute"].append(c)  # type: ignore[index]
                loss = math.nan if args.nan_loss else 7.0 / (1 + 0.1 * done)
                train.add(loss=loss, compute_ips=tbs / c, total_ips=tbs / (d + c),
                          data_time=d, compute_time=c, lr=0.1)
                done += 1
                if it % args.print_freq == 0:
                    m = train.means(train.now)
                    dllogger.log(step=(epoch, it), data={
                        f"train.{k}": m[k] for k in ("loss", "compute_ips", "total_ips", "lr")},
                        verbosity=Verbosity.DEFAULT)
                    dllogger.log(step=(epoch, it), data={
                        f"train.{k}": m[k] for k in ("data_time", "compute_time")},
                        verbosity=Verbosity.VERBOSE)
                    train.now = {}
                    dllogger.flush()
                if args.stop_after and done >= args.stop_after:
                    dllogger.flush()
                    return 3
        if args.evaluate or not args.training_only:
            _validate(args, epoch, val, truth, tbs, step_s)
        em = {f"train.{k}": v for k, v in train.means(train.epoch).items()}
        em |= {f"val.{k}": v for k, v in val.means(val.epoch).items()}
        dllogger.log(step=(epoch,), data=em, verbosity=Verbosity.DEFAULT)
    summary = {f"train.{k}": v for k, v in train.means(train.run).items()}
    summary |= {f"val.{k}": v for k, v in val.means(val.run).items()}
    lat = val.run.get("compute_latency", [])
    if lat:
        summary |= {"val.compute_latency_at99": _nearest(lat, 0.99),
                    "val.compute_latency_at100": max(lat)}
    dllogger.log(step=(), data=summary, verbosity=Verbosity.DEFAULT)
    dllogger.flush()
    Path(args.truth).write_text(json.dumps(truth), encoding="utf-8")
    return 0


def _validate(args: argparse.Namespace, epoch: int, val: _Interval,
              truth: dict[str, object], tbs: int, step_s: float) -> None:
    import dllogger
    from dllogger import Verbosity

    it = 0 if args.evaluate else args.iterations
    for vit in range(1, args.val_iterations + 1):
        d, c = _sleep_iteration(step_s / 8, step_s / 2 * (1 + (vit % 3)))
        truth["val"]["data"].append(d)  # type: ignore[index]
        truth["val"]["compute"].append(c)  # type: ignore[index]
        val.add(top1=75.0, loss=1.5, compute_ips=tbs / c, total_ips=tbs / (d + c),
                data_time=d, compute_latency=c)
        if vit % args.print_freq == 0:
            m = val.means(val.now)
            lat = val.now["compute_latency"]
            dllogger.log(step=(epoch, it, vit), data={
                f"val.{k}": m[k]
                for k in ("top1", "loss", "compute_ips", "total_ips", "compute_latency")},
                verbosity=Verbosity.DEFAULT)
            dllogger.log(step=(epoch, it, vit), data={
                "val.data_time": m["data_time"],
                "val.compute_latency_at99": _nearest(lat, 0.99),
                "val.compute_latency_at95": _nearest(lat, 0.95),
                "val.compute_latency_at100": max(lat)}, verbosity=Verbosity.VERBOSE)
            val.now = {}
            dllogger.flush()


def _dle_main(args: argparse.Namespace) -> int:
    """Training epochs logged through DLE's own Logger and TrainingMetrics, as its train()
    loop does: one log call per iteration, the Logger printing every --print-freq."""
    import importlib.util

    from dllogger import JSONStreamBackend, StdOutBackend, Verbosity

    spec = importlib.util.spec_from_file_location("dle_logger", args.dle_logger)
    assert spec is not None and spec.loader is not None
    dle = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dle)
    logger = dle.Logger(args.print_freq, [
        StdOutBackend(Verbosity.DEFAULT, step_format=dle.format_step),
        JSONStreamBackend(Verbosity.VERBOSE, args.raport),
    ], start_epoch=-1)
    logger.log_parameter(dict(vars(args)), verbosity=Verbosity.DEFAULT)
    metrics = dle.TrainingMetrics(logger)
    tbs = args.batch_size * args.world_size
    step_s = args.step_ms / 1000.0
    data: list[float] = []
    compute: list[float] = []
    for _ in range(args.epochs):
        logger.start_epoch()
        for _ in logger.iteration_generator_wrapper(range(args.iterations), mode="train"):
            slow = len(data) < args.slow_warmup
            d, c = _sleep_iteration(step_s / 4, step_s * (5 if slow else 1))
            data.append(d)
            compute.append(c)
            metrics.log(compute_ips=tbs / c, total_ips=tbs / (d + c), data_time=d,
                        compute_time=c, lr=0.1, loss=7.0 / len(data), grad_scale=1.0)
        logger.end_epoch()
    logger.end()
    truth = {"global_batch": tbs, "train": {"data": data, "compute": compute},
             "val": {"data": [], "compute": []}}
    Path(args.truth).write_text(json.dumps(truth), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
