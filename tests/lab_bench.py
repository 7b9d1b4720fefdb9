"""A lab's own benchmark program, for the tests of foreign commands: it stands in for NVIDIA's
DeepLearningExamples ConvNets ``main.py``, which needs CUDA and cannot run on these machines.

It behaves the way ``main.py`` does where the orchestrator can tell: DLE-style arguments
(``--arch``, ``-b``, ``--amp``, ``--prof N``, ``--workspace``, ``--raport-file``, a positional
DATA), ranks from torchrun's environment (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, as
``main.py`` reads them) with a real ``torch.distributed`` process group (gloo on the CPU), and
the real NVIDIA ``dllogger`` package: rank 0 logs a PARAMETER record, METADATA, one record per
iteration (``train.total_ips`` / ``compute_ips`` / ``loss`` at DEFAULT verbosity,
``data_time`` / ``compute_time`` at VERBOSE), an epoch record and the run summary (step
``()``), to stdout (``DLL ...`` lines) and to the JSON raport (``DLLL {json}`` lines) in the
workspace. Each iteration is real work (a small linear model's forward and backward pass on
the CPU), its time the slowest rank's (an all-reduce), its throughput global.

``--spawn N`` makes it a program that starts its own ranks (``launcher = "self"``): it spawns
N processes and forms the process group itself. Every rank writes ``rank<R>.json`` into the
workspace (its rank, world size, ``CUDA_VISIBLE_DEVICES``, working directory, argv and
``LAB_BENCH_*`` variables) so tests can check what the orchestrator gave each process; rank 0
writes ``truth.json`` (the iteration times it logged). ``--fail-after K`` exits 3 after K
iterations without a run summary; ``--nan`` logs NaN throughput. Nothing of DLE is copied.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="lab benchmark (stand-in for DLE's main.py)")
    p.add_argument("data", metavar="DIR")
    p.add_argument("--data-backend", default="synthetic")
    p.add_argument("--arch", "-a", default="resnet50")
    p.add_argument("-b", "--batch-size", type=int, default=32)
    p.add_argument("--amp", action="store_true")
    p.add_argument("--static-loss-scale", type=float, default=1.0)
    p.add_argument("--prof", type=int, default=10, help="iterations to run (warmup included)")
    p.add_argument("--print-freq", type=int, default=1)
    p.add_argument("--training-only", action="store_true")
    p.add_argument("--workspace", default="./")
    p.add_argument("--raport-file", default="experiment_raport.json")
    p.add_argument("--spawn", type=int, default=0, help="start this many ranks itself")
    p.add_argument("--fail-after", type=int, default=0)
    p.add_argument("--nan", action="store_true")
    return p.parse_args(argv)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.spawn > 1:
        return _spawn(args)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    return _run(args, rank, world)


def _spawn(args: argparse.Namespace) -> int:
    """Start ``--spawn`` ranks (this program's own launcher, as self-launching programs do)."""
    import multiprocessing as mp

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_spawned, args=(args, r, args.spawn)) for r in
             range(args.spawn)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    return max(abs(proc.exitcode or 0) for proc in procs)


def _spawned(args: argparse.Namespace, rank: int, world: int) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    code = _run(args, rank, world)
    if code:
        sys.exit(code)


def _run(args: argparse.Namespace, rank: int, world: int) -> int:
    import torch
    import torch.distributed as dist

    workspace = Path(args.workspace)
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "world_size": world, "local_rank": os.environ.get("LOCAL_RANK"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "cwd": os.getcwd(),
        "argv": sys.argv, "master_addr": os.environ.get("MASTER_ADDR"),
        "env": {k: v for k, v in os.environ.items() if k.startswith("LAB_BENCH_")},
    }), encoding="utf-8")
    if world > 1:
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    torch.manual_seed(rank)
    model = torch.nn.Linear(64, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    logger = _logger(args, world) if rank == 0 else None
    times: list[tuple[float, float]] = []
    for it in range(1, args.prof + 1):
        t0 = time.perf_counter()
        x = torch.randn(args.batch_size, 64)  # "data"
        t1 = time.perf_counter()
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        compute = torch.tensor([time.perf_counter() - t1])
        if world > 1:
            dist.all_reduce(compute, op=dist.ReduceOp.MAX)  # the slowest rank's step
        d, c = t1 - t0, float(compute.item())
        times.append((d, c))
        if logger is not None:
            _log_iteration(logger, args, it, world, d, c, float(loss.item()))
        if args.fail_after and it >= args.fail_after:
            return 3
    if logger is not None:
        _log_end(logger, args, world, times)
        (workspace / "truth.json").write_text(json.dumps({
            "global_batch": args.batch_size * world, "data": [d for d, _ in times],
            "compute": [c for _, c in times]}), encoding="utf-8")
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


def _logger(args: argparse.Namespace, world: int) -> Any:
    import dllogger
    from dllogger import JSONStreamBackend, StdOutBackend, Verbosity

    dllogger.init(backends=[
        StdOutBackend(Verbosity.DEFAULT),
        JSONStreamBackend(Verbosity.VERBOSE, str(Path(args.workspace) / args.raport_file)),
    ])
    params = {k: v for k, v in vars(args).items() if k not in ("spawn", "fail_after", "nan")}
    dllogger.log(step="PARAMETER", data={**params, "world_size": world},
                 verbosity=Verbosity.DEFAULT)
    for name in ("compute_ips", "total_ips"):
        dllogger.metadata(f"train.{name}", {"unit": "images/s", "format": ":.2f"})
    for name in ("data_time", "compute_time"):
        dllogger.metadata(f"train.{name}", {"unit": "s", "format": ":.5f"})
    dllogger.metadata("train.loss", {"unit": None, "format": ":.5f"})
    return dllogger


def _log_iteration(logger: Any, args: argparse.Namespace, it: int, world: int, d: float,
                   c: float, loss: float) -> None:
    from dllogger import Verbosity

    tbs = args.batch_size * world
    total = math.nan if args.nan else tbs / (d + c)
    logger.log(step=(0, it), data={"train.loss": loss, "train.compute_ips": tbs / c,
                                   "train.total_ips": total}, verbosity=Verbosity.DEFAULT)
    logger.log(step=(0, it), data={"train.data_time": d, "train.compute_time": c},
               verbosity=Verbosity.VERBOSE)
    logger.flush()


def _log_end(logger: Any, args: argparse.Namespace, world: int,
             times: list[tuple[float, float]]) -> None:
    from dllogger import Verbosity

    tbs = args.batch_size * world
    ips = [tbs / (d + c) for d, c in times]
    mean = math.nan if args.nan else sum(ips) / len(ips)  # DLE's own figure: mean of ips
    logger.log(step=(0,), data={"train.total_ips": mean}, verbosity=Verbosity.DEFAULT)
    logger.log(step=(), data={"train.total_ips": mean}, verbosity=Verbosity.DEFAULT)
    logger.flush()


if __name__ == "__main__":
    raise SystemExit(main())
