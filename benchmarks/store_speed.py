"""Speed of the results store on a year of nightlies: 365 synthetic runs x 100 cells.

Generates the run folders once (``--dir``; kept for re-runs), with result.json files of the
size real ones have (environment, provenance, metrics, 100 iteration times, a log tail), then
measures, on this machine:

* the index **rebuild** from the folders (no index file yet);
* a **refresh** when nothing changed (what every command pays first: one stat per file);
* the commands ``runs``, ``compare`` and ``history`` with the index, run in-process through
  the CLI's ``main`` (argument parsing, opening and refreshing the index, the query, the
  rendering; output discarded): median and worst of ``--repeat`` runs;
* the same three commands as fresh processes (``python -m orchestrator ...``: interpreter
  start-up and imports included), for reference.

Synthetic numbers are fine for timing: 50 configurations x 2 repeats, throughput drifting
slowly with noise, one injected drop in the last run.

    python benchmarks/store_speed.py [--dir /tmp/store-bench] [--repeat 5]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import dry_option  # noqa: E402
from orchestrator.cli import main  # noqa: E402
from orchestrator.results.folders.store import INDEX_NAME, open_store  # noqa: E402

MATRIX = "nightly"
RUNS = 365
ARCHS = ["resnet50", "resnet18", "vit_b_16", "mobilenet_v3_large", "efficientnet_b0"]
BATCHES = [32, 64, 128, 256, 512]
PRECISIONS = ["fp32", "amp"]
REPEATS = 2
DAY0 = 1_764_547_200.0  # 2025-12-01 UTC


def configs() -> list[dict[str, object]]:
    """50 configurations: 5 archs x 5 batch sizes x 2 precisions."""
    return [{"hardware": "h100", "gpus": 1, "batch_size": b, "precision": p, "mode": "train",
             "arch": a, "image_size": 224, "warmup": 20, "iterations": 100,
             "data": "synthetic"} for a in ARCHS for b in BATCHES for p in PRECISIONS]


def write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))


def generate(root: Path) -> None:
    """365 runs of the matrix under ``root``."""
    rng = random.Random(365)
    cfgs = configs()
    base = {i: rng.uniform(200, 3000) for i in range(len(cfgs))}
    for n in range(RUNS):
        started = DAY0 + n * 86400
        run_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime(started)) + f"-{n:04x}"
        run = root / MATRIX / run_id
        cells: list[dict[str, Any]] = []
        for r in range(1, REPEATS + 1):
            for i, p in enumerate(cfgs):
                group = f"h100-{p['arch']}-bs{p['batch_size']}-{p['precision']}"
                cells.append({"id": f"{group}-r{r}", "group": group, "repeat": r,
                              "hash": f"{i:012x}", "params": p})
        write_json(run / "plan.json", {"matrix": MATRIX, "source": "matrices/nightly.toml",
                                       "backend": "ssh", "repeats": REPEATS,
                                       "varying": ["arch", "batch_size", "precision"],
                                       "baseline": None, "cells": cells})
        drift = 1.0 + 0.02 * (n / RUNS)
        for cell in cells:
            i = int(cell["hash"], 16)
            drop = 0.85 if n == RUNS - 1 and i % 10 == 0 else 1.0
            ips = base[i] * drift * drop * rng.gauss(1.0, 0.01)
            step = 256 / ips
            write_json(run / "cells" / cell["id"] / "result.json", {
                "cell_id": cell["id"], "group": cell["group"], "repeat": cell["repeat"],
                "status": "ok", "reason": "", "exit_code": 0, "started_at": started,
                "finished_at": started + 60, "duration_s": 60.0 * rng.uniform(0.9, 1.1),
                "attempts": 1, "config_hash": cell["hash"], "params": cell["params"],
                "metrics": {"train.total_ips": ips, "train.compute_ips": ips * 1.02,
                            "train.loss": 6.9, "train.compute_latency_at50": step,
                            "train.compute_latency_at99": step * 1.1, "iterations": 100,
                            "global_batch_size": 256,
                            "iteration_times": [step * rng.uniform(0.98, 1.05)
                                                for _ in range(100)]},
                "env": {"torch_version": "2.4.0", "cuda_version": "12.4",
                        "cudnn_version": "90100", "driver_version": "550.54.15",
                        "device": "cuda", "device_name": "NVIDIA H100 80GB HBM3",
                        "hostname": "dgx1", "python_version": "3.11.7"},
                "provenance": {"host": "dgx1", "backend": "ssh",
                               "image": "orchestrate/ngc-pytorch:0123456789ab",
                               "gpu_ids": [0], "attempt": 1, "git_revision": "0" * 40},
                "log_tail": [f"step {k}: loss 6.9" for k in range(20)],
            })
        write_json(run / "run.json", {"run_id": run_id, "matrix": MATRIX, "backend": "ssh",
                                      "started_at": started, "finished_at": started + 6000,
                                      "git_revision": "0" * 40, "orchestrate_version": "0.1.0",
                                      "controller_host": "ctl", "counts": {"ok": len(cells)},
                                      "interrupted": False})


def timed(argv: list[str], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = main(argv)
        out.append(time.perf_counter() - t0)
        if code not in (0, 1):
            raise SystemExit(f"{argv}: exit {code}")
    return out


def fresh_process(argv: list[str], repeat: int) -> list[float]:
    out = []
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "orchestrator", *argv], env=env,
                       capture_output=True, check=False)
        out.append(time.perf_counter() - t0)
    return out


def main_() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/orchestrate-store-bench"))
    parser.add_argument("--repeat", type=int, default=5)
    dry_option(parser, "the year of nightlies planned, its size said, nothing written")
    args = parser.parse_args()
    if args.dry:
        print(f"would write {RUNS} runs x {len(configs()) * REPEATS} cells into {args.dir} "
              f"and time the index on them {args.repeat} times")
        return
    root = args.dir
    if not (root / MATRIX).is_dir() or len(list((root / MATRIX).iterdir())) != RUNS:
        shutil.rmtree(root, ignore_errors=True)
        t0 = time.perf_counter()
        generate(root)
        print(f"generated {RUNS} runs x {len(configs()) * REPEATS} cells in {root} "
              f"({time.perf_counter() - t0:.1f} s)")
    files = sum(1 for _ in root.glob(f"{MATRIX}/*/cells/*/result.json"))
    size = sum(p.stat().st_size for p in root.glob(f"{MATRIX}/*/cells/*/result.json"))
    print(f"{files} result.json files, {size / 1e6:.0f} MB; cpu cores: {os.cpu_count()}, "
          f"load average {os.getloadavg()[0]:.1f}")

    for leftover in root.glob(INDEX_NAME + "*"):
        leftover.unlink()
    t0 = time.perf_counter()
    with open_store(root) as store:
        rebuild = time.perf_counter() - t0
        cells = store.conn.execute("SELECT COUNT(*) FROM cells").fetchone()[0]
        figures = store.conn.execute("SELECT COUNT(*) FROM figures").fetchone()[0]
    index_mb = (root / INDEX_NAME).stat().st_size / 1e6
    refresh = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        with open_store(root) as store:
            pass
        refresh.append(time.perf_counter() - t0)
    print(f"index rebuild from the folders: {rebuild:.1f} s ({cells} cells, {figures} figures, "
          f"index {index_mb:.0f} MB)")
    print(f"open + refresh, nothing changed: median {statistics.median(refresh):.3f} s, "
          f"worst {max(refresh):.3f} s")

    results = ["--results", str(root)]
    commands = {
        "runs": ["runs", MATRIX, *results],
        "compare": ["compare", f"{MATRIX}:latest~1", f"{MATRIX}:latest", *results],
        "history": ["history", MATRIX, *results],
    }
    print(f"\ncommand (365 runs x {len(configs()) * REPEATS} cells, index warm)   in-process "
          "median / worst     fresh process median")
    for name, argv in commands.items():
        inproc = timed(argv, args.repeat)
        proc = fresh_process(argv, max(1, args.repeat // 2))
        print(f"  {name:<10} {statistics.median(inproc):8.3f} s / {max(inproc):.3f} s"
              f"{statistics.median(proc):22.3f} s")


if __name__ == "__main__":
    main_()
