"""The sweep's own time around its cells: ``orchestrate matrix`` against the same commands run
bare, one after the other. Prints measured figures; claims nothing it did not measure.

    python benchmarks/sweep_overhead.py [--cells 4] [--pairs 4] [--workload tiny|standin]
                                        [--repo PATH] [--against PATH] [--keep DIR]

It writes a matrix of ``--cells`` cells for the process backend, each a fresh process of

* ``tiny`` (default): the real workload, resnet18 at 32 px, batch 2, one warmup and two
  measured training steps on this CPU (a cell takes a few seconds, most of it ``import
  torch``; the fault suite's cells);
* ``standin``: the tests' stand-in workload (``tests/standin/workload_standin.py``: the
  workload's JSON lines and files, no torch; 20 iterations of 10 ms), where the sweep's own
  time is most of the whole,

then runs one sweep of each checkout not counted (its bytecode caches written, in a folder of
this run: ``PYTHONPYCACHEPREFIX``), then ``--pairs`` rounds, the order inside each round
rotating so that drift in the load spreads over every kind:

* ``sweep``: ``python -m orchestrator matrix M --results DIR`` in a fresh process as a user
  runs it (start-up, checks, run folder, cells, records, table, plot), its output to a file
  (the display for a pipe), wall time from its start to its exit;
* ``bare``: each cell's command as ``orchestrate plan --json`` says the sweep starts it (argv,
  environment, working folder, its own output folder), run one after the other with
  :func:`subprocess.run`, wall time of all of them.

Printed: the medians of both side by side, the difference in all and per cell, the ratio; and
where the sweep's time went, from its run folder (``run.json``, each ``result.json``'s
``started_at`` / ``finished_at``): before its first cell started, in the cells, between them,
after the last one ended, and how long after the sweep's exit its ``summary.png`` was there
(drawn by a process of its own: the next command waits for it, so that the drawing never
overlaps a measurement). With ``--against`` a second checkout's sweep runs in each round too
(e.g. the code before a change), beside the first. ``--keep`` keeps the run folders.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabulate import tabulate

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import fault_suite  # noqa: E402
from benchmarks.common import dry_option  # noqa: E402

#: The fault suite's matrix of ``seed`` cells on this machine's CPU, named for this benchmark.
MATRIX = fault_suite.MATRIX.replace('name = "faults"', 'name = "overhead"', 1)
#: The real workload's smallest honest cell: resnet18, 32 px, batch 2, 1 warmup + 2 steps.
TINY = fault_suite.WORKLOAD.format(iterations=2)
#: How long a sweep's summary.png may take to appear after its exit (seconds).
PLOT_WAIT_S = 30.0
STANDIN = 'program = "standin"\n' + TINY.replace("iterations = 2", "iterations = 20")
#: The stand-in reaches a cell as any program does (tests/standin_support.py's table).
STANDIN_COMMAND = f"""
[commands.standin]
description = "STAND-IN for the workload (tests/standin/workload_standin.py)"
command = \"\"\"{{python}} {REPO / 'tests' / 'standin' / 'workload_standin.py'} --arch={{arch}} \\
  --mode={{mode}} --batch-size={{batch_size}} --precision={{precision}} \\
  --image-size={{image_size}} --warmup={{warmup}} --iterations={{iterations}} --data={{data}} \\
  --num-classes={{num_classes}} --seed={{seed}} --output-dir={{output_dir}} \\
  --standin-step-s=0.01\"\"\"
launcher = "self"
"""


@dataclass
class Sweep:
    """One sweep: its wall time and where the time went (seconds)."""

    seconds: float
    before: float = 0.0
    cells: float = 0.0
    between: float = 0.0
    after: float = 0.0
    ok: int = 0
    #: After the sweep's exit, until its summary.png was there (0: there at the exit).
    plot: float = 0.0


def matrix_text(cells: int, workload: str) -> str:
    if workload == "tiny":
        return MATRIX.format(workload=TINY, seeds=list(range(cells)), tables="")
    return MATRIX.format(workload=STANDIN, seeds=list(range(cells)), tables=STANDIN_COMMAND)


def environment(repo: Path, work: Path) -> dict[str, str]:
    """The environment a checkout's commands run in: it imported from its own folder, its
    bytecode cached in a folder of this run (as a user's start-up has it, whatever this
    machine sets: ``PYTHONDONTWRITEBYTECODE`` would compile every module at every start)."""
    env = {**os.environ, "PYTHONPATH": str(repo), "PYTHONPYCACHEPREFIX": str(work / "pycache")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run_sweep(repo: Path, matrix: Path, results: Path, log: Path) -> Sweep:
    """``orchestrate matrix`` in a fresh process; its wall time and its run folder's times."""
    env = environment(repo, log.parent)
    started = time.time()
    t0 = time.perf_counter()
    with log.open("wb") as out:
        code = subprocess.run([sys.executable, "-m", "orchestrator", "matrix", str(matrix),
                               "--results", str(results)], cwd=repo, env=env, stdout=out,
                              stderr=subprocess.STDOUT, check=False).returncode
    took = time.perf_counter() - t0
    ended = started + took
    if code != 0:
        raise SystemExit(f"the sweep failed (exit {code}): {log.read_text()[-2000:]}")
    runs = sorted((results / "overhead").iterdir())
    plot = runs[-1] / "summary.png"
    while not plot.exists() and time.perf_counter() - t0 - took < PLOT_WAIT_S:
        time.sleep(0.01)  # (an older checkout may draw it after its exit: not overlapping)
    drawn = time.perf_counter() - t0 - took
    cells = []
    for path in sorted((runs[-1] / "cells").glob("*/result.json")):
        result = json.loads(path.read_text())
        cells.append((result["started_at"], result["finished_at"], result["status"]))
    cells.sort()
    inside = sum(end - start for start, end, _ in cells)
    gaps = sum(cells[i + 1][0] - cells[i][1] for i in range(len(cells) - 1))
    return Sweep(took, before=cells[0][0] - started, cells=inside, between=gaps,
                 after=ended - cells[-1][1], ok=sum(1 for *_, s in cells if s == "ok"),
                 plot=drawn if plot.exists() else math.inf)


def bare_commands(repo: Path, matrix: Path, results: Path) -> list[dict[str, Any]]:
    """Each cell's launch as the sweep gives it (``plan --json``)."""
    env = environment(repo, matrix.parent)
    out = subprocess.run([sys.executable, "-m", "orchestrator", "plan", str(matrix), "--json",
                          "--results", str(results)], cwd=repo, env=env, check=True,
                         capture_output=True, text=True).stdout
    return [cell["launch"] for cell in json.loads(out)]


def run_bare(launches: list[dict[str, Any]], env: dict[str, str]) -> float:
    """The cells' commands one after the other, each in its own output folder, in ``env`` (the
    environment a sweep's cells inherit) with each launch's own variables."""
    t0 = time.perf_counter()
    for launch in launches:
        Path(launch["output_dir"]).mkdir(parents=True, exist_ok=True)
        subprocess.run(launch["argv"], cwd=launch["workdir"] or REPO,
                       env={**env, **launch["env"]}, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=4, help="rounds (sweep and bare each)")
    parser.add_argument("--workload", choices=("tiny", "standin"), default="tiny")
    parser.add_argument("--repo", type=Path, default=REPO)
    parser.add_argument("--against", type=Path, help="another checkout's sweep beside it")
    parser.add_argument("--keep", type=Path, help="keep the run folders here")
    dry_option(parser, "1 stand-in cell, 1 round")
    args = parser.parse_args()
    if args.dry:
        args.cells, args.pairs, args.workload, args.against = 1, 1, "standin", None
    repos = [args.repo] + ([args.against] if args.against else [])
    with tempfile.TemporaryDirectory(prefix="sweep-overhead-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        matrix = work / "overhead.toml"
        matrix.write_text(matrix_text(args.cells, args.workload), encoding="utf-8")
        launches = bare_commands(args.repo, matrix, work / "bare")
        for i, repo in enumerate(repos):  # not counted: the bytecode caches written
            run_sweep(repo, matrix, work / "warm-up", work / f"warm-up-{i}.log")
        load_start = os.getloadavg()
        sweeps: list[list[Sweep]] = [[] for _ in repos]
        bare: list[float] = []
        kinds = [*range(len(repos)), -1]  # -1: bare
        for n in range(args.pairs):
            shift = n % len(kinds)
            for kind in kinds[shift:] + kinds[:shift]:
                if kind < 0:
                    bare.append(run_bare(launches, environment(args.repo, work)))
                else:
                    sweeps[kind].append(run_sweep(repos[kind], matrix, work / f"results-{kind}",
                                                  work / f"sweep-{kind}-{n}.log"))
                print(f"round {n + 1}: {'bare' if kind < 0 else f'sweep {kind}'} done",
                      file=sys.stderr, flush=True)
        load_end = os.getloadavg()
    print(f"{args.cells} cells ({args.workload}), {args.pairs} rounds; load average at start "
          f"{load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}, at end "
          f"{load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}")
    median_bare = statistics.median(bare)
    rows = [["bare (the commands one after the other)", f"{median_bare:.2f}",
             f"{min(bare):.2f}..{max(bare):.2f}", "", "", ""]]
    for i, runs in enumerate(sweeps):
        med = statistics.median(r.seconds for r in runs)
        rows.append([f"sweep ({repos[i]})", f"{med:.2f}",
                     f"{min(r.seconds for r in runs):.2f}..{max(r.seconds for r in runs):.2f}",
                     f"{med - median_bare:+.2f}", f"{(med - median_bare) / args.cells:+.3f}",
                     f"{med / median_bare:.3f}"])
    print(tabulate(rows, headers=["", "s (median)", "min..max", "beyond bare", "per cell",
                                  "ratio"], disable_numparse=True))
    print()
    parts = []
    for i, runs in enumerate(sweeps):
        parts.append([str(repos[i])] + [
            f"{statistics.median(getattr(r, name) for r in runs):.2f}"
            for name in ("before", "cells", "between", "after", "plot")]
            + [f"{min(r.ok for r in runs)}/{args.cells}"])
    print(tabulate(parts, headers=["the sweep's time (medians, s)", "before the first cell",
                                   "in the cells", "between cells", "after the last cell",
                                   "summary.png after the exit", "cells ok"],
                   disable_numparse=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
