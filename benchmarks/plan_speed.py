"""How fast is planning? Wall time and peak memory of ``orchestrate plan`` and ``--dry-run`` on
large generated matrices, one backend and runtime at a time. Prints measured figures; claims
nothing it did not measure.

    python benchmarks/plan_speed.py [--cells 10000] [--runs 3] [--repo PATH] [--against PATH]
                                    [--backends process docker ssh slurm]
                                    [--runtimes none apptainer] [--commands json table dry-run]

For each backend (process, docker, ssh, slurm) and runtime (none, apptainer; apptainer is
not a runtime of the docker backend) it writes a matrix of ``--cells`` cells (CPU cells: two
hardware profiles x archs x precisions x batch sizes x image sizes x iterations, 5 repeats;
on docker, ssh and apptainer each profile runs its own image template) and runs, each in a
fresh interpreter as a user runs it (start-up and imports included):

* ``json``: ``orchestrate plan M --json`` (every cell with its exact launch);
* ``table``: ``orchestrate plan M`` (the plan's table);
* ``dry-run``: ``orchestrate matrix M --dry-run`` (every cell's command).

Each checkout runs each command once first on a 10-cell matrix of the same kind, not counted
(its bytecode caches written, in a folder of this run: ``PYTHONPYCACHEPREFIX``), then
``--runs`` times on the big one. Printed per command,
medians over the runs: wall time, CPU time (user + system: what it cost on a machine others
share) and peak resident memory (the child's own ``ru_maxrss`` from ``wait4``, not a running
maximum over this process's children; this process stays small, as a child's count starts
from its parent's size at the fork), and the cells the JSON lists (checked against the
matrix's). A command that exits non-zero (e.g. a backend whose tools this machine lacks) is
shown with its exit status and its first error line instead; nothing needs a GPU.

``--repo`` runs another checkout's orchestrator on the same files; ``--against`` a second one
beside it (e.g. the code before a change: ``git worktree add /tmp/before <rev>``), the two
alternating run by run so that both see the same load, their figures side by side.

What stands in for what is not here: the ssh matrices read an inventory of two loopback hosts
(never contacted: a dry run connects to nothing), and the Apptainer matrices find a stub
``apptainer`` program (a script that exits 0, never run by a dry run) first on ``PATH``, so
that a machine without Apptainer plans them as one with it does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tabulate import tabulate

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import dry_option  # noqa: E402

BACKENDS = ("process", "docker", "ssh", "slurm")
RUNTIMES = ("none", "apptainer")
COMMANDS = ("json", "table", "dry-run")
REPEATS = 5
#: The values each axis may take, in the order the axes are filled (the last takes the rest).
AXES: list[tuple[str, list[object]]] = [
    ("hardware", ["cpu-a", "cpu-b"]),
    ("arch", ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnext50_32x4d",
              "wide_resnet50_2", "vgg16", "vgg19", "densenet121", "densenet169",
              "mobilenet_v2", "mobilenet_v3_large", "mobilenet_v3_small", "efficientnet_b0",
              "efficientnet_b4", "convnext_tiny", "regnet_y_8gf", "vit_b_16", "swin_t"]),
    ("precision", ["fp32", "bf16"]),
    ("batch_size", [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]),
    ("image_size", [32, 64, 96, 128, 160, 192, 224, 256]),
]
#: The NGC release of each profile's image (docker, ssh and apptainer: one image each).
RELEASES = ("24.10", "23.10")
INVENTORY = """
[options]
connect_timeout = 5
trust_on_first_use = false

[[hosts]]
name = "lab-a"
address = "127.0.0.1"
port = 2222
tags = ["cpu-a", "cpu-b"]
gpus = [0, 1]

[[hosts]]
name = "lab-b"
address = "127.0.0.1"
port = 2223
tags = ["cpu-a", "cpu-b"]
gpus = [0]
"""


def axes_for(cells: int) -> tuple[dict[str, list[object]], int]:
    """Axis values whose product times the repeats is ``cells`` (each axis takes the largest
    number of its values that divides what is left; ``iterations`` takes the rest)."""
    repeats = REPEATS if cells % REPEATS == 0 else 1
    left = cells // repeats
    axes: dict[str, list[object]] = {}
    for name, values in AXES:
        take = max(n for n in range(1, len(values) + 1) if left % n == 0)
        axes[name] = values[:take]
        left //= take
    axes["iterations"] = list(range(10, 10 + left))
    return axes, repeats


def matrix_text(backend: str, runtime: str, cells: int, inventory: Path) -> str:
    """A matrix of ``cells`` CPU cells for ``backend`` and ``runtime``."""
    axes, repeats = axes_for(cells)
    lines = ["[matrix]", f'name = "plan_speed_{backend}_{runtime}"', f"repeats = {repeats}",
             f'backend = "{backend}"']
    if backend == "ssh":
        lines.append(f"hosts = {json.dumps(str(inventory))}")
    lines += ["", "[workload]", "warmup = 1", "data = \"synthetic\"", "", "[axes]"]
    lines += [f"{name} = {json.dumps(values)}" for name, values in axes.items()]
    for i, hw in enumerate(AXES[0][1]):
        lines += ["", f"[hardware.{hw}]", 'device = "cpu"',
                  f'env = {{ OMP_NUM_THREADS = "{i + 1}" }}']
        if runtime == "apptainer":
            lines += ['image = "singularity"',
                      f'image_vars = {{ base_tag = "{RELEASES[i]}-py3" }}', 'runtime = "apptainer"']
        elif backend in ("docker", "ssh"):
            lines += ['image = "ngc-pytorch"',
                      f'image_vars = {{ base_tag = "{RELEASES[i]}-py3", install_nvml = false }}']
        if backend == "slurm":
            lines.append("slurm = { cpus_per_task = 1 }")
    return "\n".join(lines) + "\n"


def argv(command: str, matrix: Path) -> list[str]:
    if command == "json":
        return ["plan", str(matrix), "--json"]
    if command == "table":
        return ["plan", str(matrix)]
    return ["matrix", str(matrix), "--dry-run", "--results", str(matrix.parent / "results")]


@dataclass
class Run:
    seconds: float
    cpu_seconds: float
    peak_mib: float
    returncode: int
    listed: int | None  # the cells plan --json lists
    error: str


#: Counts the cells of a plan --json output, in a process of its own: this one stays small (a
#: child's ru_maxrss starts from its parent's resident size at the fork).
COUNT = ("import json, sys\n"
         "data = json.load(open(sys.argv[1], encoding='utf-8'))\n"
         "print(len(data['cells'] if isinstance(data, dict) else data))\n")


def run_once(repo: Path, words: list[str], env: dict[str, str], out: Path) -> Run:
    """One command in a fresh interpreter: wall time, CPU time and peak RSS (its own wait4
    rusage; the CPU time says what the command cost on a machine others share)."""
    with out.open("wb") as stdout, tempfile.TemporaryFile() as stderr:
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator", *words], cwd=repo,
                                env={**env, "PYTHONPATH": str(repo)}, stdout=stdout,
                                stderr=stderr)
        _, status, usage = os.wait4(proc.pid, 0)
        took = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        stderr.seek(0)
        error = stderr.read().decode(errors="replace").strip()
    listed = None
    if proc.returncode == 0 and "--json" in words:
        listed = int(subprocess.run([sys.executable, "-c", COUNT, str(out)], check=True,
                                    capture_output=True, text=True).stdout)
    first = next((line for line in error.splitlines() if line.startswith("error")),
                 error.splitlines()[-1] if error else "")
    return Run(took, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024,
               proc.returncode, listed, first)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--repo", type=Path, default=REPO,
                        help="the checkout whose orchestrator runs (default: this one)")
    parser.add_argument("--against", type=Path,
                        help="another checkout (the code before a change), run on the same "
                             "files, alternating with --repo, and shown beside it")
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--runtimes", nargs="+", choices=RUNTIMES, default=list(RUNTIMES))
    parser.add_argument("--commands", nargs="+", choices=COMMANDS, default=list(COMMANDS))
    dry_option(parser, "100 cells on the process backend, plan --json once")
    args = parser.parse_args()
    if args.dry:
        args.cells, args.runs, args.against = 100, 1, None
        args.backends, args.runtimes, args.commands = ["process"], ["none"], ["json"]
    repos = [args.repo] + ([args.against] if args.against else [])
    rows = []
    with tempfile.TemporaryDirectory(prefix="plan-speed-") as tmp:
        root = Path(tmp)
        inventory = root / "hosts.toml"
        inventory.write_text(INVENTORY, encoding="utf-8")
        stub = root / "bin"
        stub.mkdir()
        (stub / "apptainer").write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
        (stub / "apptainer").chmod(0o755)
        env = {**os.environ, "PATH": f"{stub}{os.pathsep}{os.environ.get('PATH', '')}",
               "PYTHONPYCACHEPREFIX": str(root / "pycache")}
        env.pop("ORCHESTRATE_HOSTS", None)
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # start-up as a user has it: compiled once
        for backend in args.backends:
            for runtime in args.runtimes:
                if backend == "docker" and runtime == "apptainer":
                    continue  # not a runtime of the docker backend (refused by the checks)
                matrix = root / f"{backend}-{runtime}.toml"
                matrix.write_text(matrix_text(backend, runtime, args.cells, inventory),
                                  encoding="utf-8")
                small = root / f"{backend}-{runtime}-small.toml"
                small.write_text(matrix_text(backend, runtime, 10, inventory), encoding="utf-8")
                for command in args.commands:
                    for repo in repos:  # not counted: the bytecode caches written
                        run_once(repo, argv(command, small), env, root / "out")
                    runs: list[list[Run]] = [[] for _ in repos]
                    for _ in range(args.runs):  # the checkouts alternate: the same load
                        for i, repo in enumerate(repos):
                            runs[i].append(run_once(repo, argv(command, matrix), env,
                                                    root / "out"))
                    rows.append([backend, runtime, command,
                                 *[f for each in runs for f in figures(each, args.cells)]])
                    print(tabulate([rows[-1]], tablefmt="plain"), file=sys.stderr, flush=True)
    print(f"{args.cells:,} cells per matrix, {args.runs} run(s) each (medians); "
          + "; ".join(f"{label(i)}: {repo}" for i, repo in enumerate(repos)))
    headers = ["backend", "runtime", "command"]
    for i in range(len(repos)):
        headers += [f"{label(i)} s", "min..max", "CPU s", "peak MiB", "cells listed"]
    print(tabulate(rows, headers=headers, disable_numparse=True))
    return 0


def label(i: int) -> str:
    return ("repo", "against")[i]


def figures(runs: list[Run], cells: int) -> list[str]:
    """One checkout's figures of one command: wall s (median, min..max), CPU s, peak MiB
    (medians), the cells its JSON listed; or its exit status and error line."""
    failed = [r for r in runs if r.returncode != 0]
    if failed:
        return [f"exit {failed[0].returncode}", "", "", "", failed[0].error[:80]]
    seconds = [r.seconds for r in runs]
    listed = runs[0].listed
    shown = "" if listed is None else (f"{listed:,}" if listed == cells
                                       else f"{listed:,} (expected {cells:,})")
    return [f"{statistics.median(seconds):.2f}", f"{min(seconds):.2f}..{max(seconds):.2f}",
            f"{statistics.median(r.cpu_seconds for r in runs):.2f}",
            f"{statistics.median(r.peak_mib for r in runs):.0f}", shown]


if __name__ == "__main__":
    raise SystemExit(main())
