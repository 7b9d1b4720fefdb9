"""Submitting a sweep to Slurm: one job array per job shape against one ``sbatch`` per cell.

Runs the same cells (``--cells`` of them, each the stand-in task program
``tests/standin/slurm_task.py`` sleeping ``--sleep`` s) through the slurm backend on the same
cluster (``--conf``; default: the two-node test cluster of
``tests/infra/start-slurm-multinode.sh``), three ways:

* ``array %N``: the default: the cells go as one array, ``--array=0-K%N`` (``array_limit``);
* ``per cell, max_jobs N``: ``arrays = false`` with the sweep's own cap of N cells in Slurm
  (how a concurrency limit was had before arrays);
* ``per cell``: ``arrays = false``, no cap: every cell its own job at once, Slurm queues them.

It counts every Slurm command the backend runs (sbatch, squeue, sacct, scontrol, scancel) and
times them, and prints per way: the sbatch calls and their total time, the time from the
sweep's start until every cell was submitted, the squeue calls, the sweep's wall time, and the
most cells seen running at once (from each task's own start and end times; every node shares
this machine's clock).

    .venv/bin/python benchmarks/slurm_arrays.py [--cells 40] [--limit 4] [--sleep 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import orchestrator.backends.slurm as slurm  # noqa: E402
from benchmarks.common import cannot_run, dry_option  # noqa: E402
from orchestrator.plan.matrix import load_matrix  # noqa: E402
from orchestrator.results.folders.run_folder import Status  # noqa: E402
from orchestrator.sweep import run_sweep  # noqa: E402

TASK = REPO / "tests" / "standin" / "slurm_task.py"
MATRIX = """
[matrix]
name = "slurm_arrays_{way}"
backend = "slurm"
timeout_s = 600
retries = 0
[workload]
hardware = "cpu"
program = "task"
[axes]
seed = {seeds}
[hardware.cpu]
device = "cpu"
[hardware.cpu.slurm]
conf = "{conf}"
{options}
[commands.task]
command = "{command}"
[commands.task.figures]
parser = "regex"
regex = [{{ name = "task.ips", pattern = 'task images/s: (\\d+\\.\\d+)' }}]
"""


class Recorder:
    """Every Slurm command of the backend: its argv, when it started and how long it took."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], float, float]] = []
        self.real = slurm._slurm

    def __call__(self, args: Sequence[str], *rest: Any, **kw: Any
                 ) -> subprocess.CompletedProcess[str]:
        started = time.monotonic()
        proc = self.real(args, *rest, **kw)
        self.calls.append((list(args), started, time.monotonic() - started))
        return proc

    def of(self, tool: str) -> list[tuple[list[str], float, float]]:
        return [c for c in self.calls if c[0][0] == tool]


def peak_running(cell_dirs: list[Path]) -> int:
    """Most tasks running at once, from their task.json start and end times."""
    events: list[tuple[float, int]] = []
    for folder in cell_dirs:
        seen = json.loads((folder / "task.json").read_text())
        events += [(seen["started"], 1), (seen["ended"], -1)]
    peak = now = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):
        now += step
        peak = max(peak, now)
    return peak


def run_way(way: str, options: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    command = (f"{{python}} {TASK} --out {{output_dir}} --seed {{seed}} --sleep {args.sleep}")
    path = root / f"{way}.toml"
    path.write_text(MATRIX.format(way=way, seeds=list(range(args.cells)), conf=args.conf,
                                  options=options, command=command))
    matrix = load_matrix(path)
    recorder = Recorder()
    slurm._slurm = recorder
    try:
        started = time.monotonic()
        outcome = run_sweep(matrix, results_root=root / "results")
        wall = time.monotonic() - started
    finally:
        slurm._slurm = recorder.real
    bad = [r for r in outcome.results if r.status is not Status.OK]
    if bad:
        raise SystemExit(f"{way}: {len(bad)} cells did not end ok, e.g. {bad[0].reason}")
    sbatches = recorder.of("sbatch")
    last_submit = max(start + took for _, start, took in sbatches) - started
    return {
        "way": way,
        "sbatch calls": len(sbatches),
        "sbatch time (s)": round(sum(took for *_, took in sbatches), 3),
        "all submitted after (s)": round(last_submit, 2),
        "squeue calls": len(recorder.of("squeue")),
        "sweep wall (s)": round(wall, 1),
        "peak running": peak_running([outcome.paths.cell_dir(r.cell_id)
                                      for r in outcome.results]),
    }


def slurm_problem(conf: str) -> str | None:
    """Why the cluster of ``conf`` cannot take the cells here; None when it answers."""
    if shutil.which("sbatch") is None or shutil.which("squeue") is None:
        return "no Slurm client tools (sbatch, squeue) on PATH"
    if not Path(conf).is_file():
        return f"no cluster configuration {conf} (tests/infra/start-slurm-multinode.sh makes it)"
    probe = subprocess.run(["squeue", "--noheader"], capture_output=True, text=True,
                           env={**os.environ, "SLURM_CONF": conf}, timeout=30)
    if probe.returncode != 0:
        return f"the cluster of {conf} does not answer: {probe.stderr.strip()[:200]}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=40)
    parser.add_argument("--limit", type=int, default=4, help="array_limit and max_jobs")
    parser.add_argument("--sleep", type=float, default=1.0, help="seconds each cell runs")
    parser.add_argument("--conf", default="/etc/orchestrate-slurm-mn/slurm.conf",
                        help="slurm.conf of the cluster (default: the two-node test cluster)")
    dry_option(parser, "the cluster asked whether it answers, nothing submitted")
    args = parser.parse_args()
    problem = slurm_problem(args.conf)
    if problem:
        return cannot_run(problem)
    if args.dry:
        print(f"would submit {args.cells} cells of {args.sleep:g} s three ways to {args.conf}")
        return 0
    ways = [
        (f"array %{args.limit}", f"array_limit = {args.limit}"),
        (f"per cell, max_jobs {args.limit}", f"arrays = false\nmax_jobs = {args.limit}"),
        ("per cell", "arrays = false"),
    ]
    with tempfile.TemporaryDirectory(prefix="slurm-arrays-") as tmp:
        rows = [run_way(way.replace(" ", "_").replace(",", "").replace("%", ""), options,
                        args, Path(tmp)) | {"way": way} for way, options in ways]
    print(f"{args.cells} cells of {args.sleep:g} s each, cluster {args.conf}")
    print(tabulate(rows, headers="keys", tablefmt="github"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
