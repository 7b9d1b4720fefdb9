"""Plan anywhere: does every shipped matrix show every cell, on a machine that has nothing?

    .venv/bin/python benchmarks/plan_anywhere.py [--json]

Simulates a machine with no GPU, no Docker engine, no Apptainer and no Slurm (the project's
machines have no GPU anyway): it runs itself again in a subprocess whose PATH holds every
program of this machine's PATH but ``docker*``, ``apptainer``, ``singularity``, Slurm's clients
(``sbatch``, ``squeue``, ...), ``nvidia-smi`` and ``hl-smi`` (links in a temporary folder), and
whose ``DOCKER_HOST`` points at a socket that does not exist. There, for every matrix in
``matrices/`` and ``matrices/seeds/``, it runs the real CLI entry point
(:func:`orchestrator.cli.main`, as ``python -m orchestrator`` does) twice, in that process:

* ``orchestrate plan MATRIX --json``: the cells listed (each with its ``launch``);
* ``orchestrate matrix MATRIX --dry-run``: the cells whose command is printed (a ``CELL:``
  heading followed by a ``command:`` line),

against the cells the matrix expands to (``load_matrix``: configurations x repeats, and the
control templates ``plan --json`` lists too), with each command's exit status (0: the sweep
would start here; 3: it would not, the requirements listed) and the kinds of what is not met.
``--json`` prints the rows as JSON (tests/test_plan_anywhere.py reads them).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: Programs the simulated machine does not have (a glob's prefix ends with ``*``).
ABSENT = ("docker*", "dockerd", "containerd*", "apptainer", "singularity", "sbatch", "squeue",
          "scancel", "scontrol", "sinfo", "srun", "sacct", "salloc", "nvidia-smi", "hl-smi")
#: Where no Docker engine answers.
DEAD_ENGINE = "unix:///nonexistent/docker.sock"


def matrices() -> list[Path]:
    return sorted((ROOT / "matrices").glob("*.toml")) + sorted(
        (ROOT / "matrices" / "seeds").glob("*.toml"))


def _absent(name: str) -> bool:
    return any(name.startswith(p[:-1]) if p.endswith("*") else name == p for p in ABSENT)


def bare_path(folder: Path) -> str:
    """A folder of links to every program on this PATH but :data:`ABSENT` (first found wins)."""
    folder.mkdir(parents=True, exist_ok=True)
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not directory or not os.path.isdir(directory):
            continue
        for entry in sorted(os.listdir(directory)):
            link = folder / entry
            if _absent(entry) or link.exists() or link.is_symlink():
                continue
            link.symlink_to(os.path.join(directory, entry))
    return str(folder)


def bare_environment(folder: Path) -> dict[str, str]:
    """This process's environment on the simulated machine."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "APPTAINER", "SINGULARITY"))}
    env.update(PATH=bare_path(folder), DOCKER_HOST=DEAD_ENGINE, PYTHONPATH=str(ROOT))
    for name in ("DOCKER_CONTEXT", "DOCKER_CONFIG", "ORCHESTRATE_HOSTS"):
        env.pop(name, None)
    return env


def _cli(argv: list[str]) -> tuple[int, str, str]:
    from orchestrator.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def _commands_printed(text: str, ids: list[str]) -> int:
    """Cells whose ``  CELL:`` heading in the dry run is followed by a ``command:`` line before
    the next heading."""
    blocks = re.split(r"(?m)^  (\S+):$", text)
    shown = {blocks[i]: blocks[i + 1] for i in range(1, len(blocks) - 1, 2)}
    return sum(1 for cell_id in ids if "command: " in shown.get(cell_id, ""))


def _unmet_kinds(text: str) -> list[str]:
    block = text.partition("\n  not met:\n")[2]
    kinds = []
    for line in block.splitlines():
        if not line.startswith("    "):
            break
        found = re.match(r"    - (\S+(?: file)?)", line)
        if found and found[1] not in kinds:
            kinds.append(found[1])
    return kinds


def measure(path: Path, results: Path) -> dict[str, Any]:
    """One matrix: expanded, listed by ``plan --json``, printed by ``--dry-run``."""
    from orchestrator.plan.matrix import load_matrix

    matrix = load_matrix(path)
    ids = [c.id for c in matrix.checked_cells]
    start = time.perf_counter()
    plan_code, plan_out, plan_err = _cli(["plan", str(path), "--json", "--results", str(results)])
    plan_s = time.perf_counter() - start
    try:
        listed = json.loads(plan_out) if plan_out.strip() else []
    except json.JSONDecodeError:
        listed = []
    with_launch = sum(1 for c in listed if c.get("id") in ids and c.get("launch"))
    start = time.perf_counter()
    dry_code, dry_out, dry_err = _cli(["matrix", str(path), "--dry-run", "--results",
                                       str(results)])
    dry_s = time.perf_counter() - start
    return {
        "matrix": str(path.relative_to(ROOT)), "backend": matrix.settings.backend,
        "cells": len(matrix.cells), "controls": len(matrix.controls),
        "plan_listed": with_launch, "plan_exit": plan_code, "plan_s": round(plan_s, 3),
        "dry_run_commands": _commands_printed(dry_out, ids), "dry_run_exit": dry_code,
        "dry_run_s": round(dry_s, 3), "dry_run_lines": len(dry_out.splitlines()),
        "not_met": _unmet_kinds(dry_out),
        "errors": [e for e in (plan_err if plan_code not in (0, 3) else "",
                               dry_err if dry_code not in (0, 3) else "") if e],
    }


def inside(as_json: bool, dry: bool = False) -> None:
    """Run on the simulated machine: every matrix (``dry``: the first), then the table (or
    JSON)."""
    machine = {"docker": shutil.which("docker"), "sbatch": shutil.which("sbatch"),
               "apptainer": shutil.which("apptainer"), "nvidia-smi": shutil.which("nvidia-smi"),
               "DOCKER_HOST": os.environ.get("DOCKER_HOST")}
    with tempfile.TemporaryDirectory(prefix="plan-anywhere-") as tmp:
        rows = [measure(path, Path(tmp) / "results") for path in matrices()[:1 if dry else None]]
    if as_json:
        print(json.dumps({"machine": machine, "rows": rows}, indent=2))
        return
    print(f"machine: {', '.join(f'{k}={v}' for k, v in machine.items())}")
    head = (f"{'matrix':40} {'backend':8} {'cells':>6} {'plan --json':>11} {'exit':>4} "
            f"{'--dry-run':>9} {'exit':>4} {'s':>5}  not met")
    print(head)
    print("-" * len(head))
    for r in rows:
        cells = r["cells"] + r["controls"]
        print(f"{r['matrix']:40} {r['backend']:8} {cells:>6} {r['plan_listed']:>11} "
              f"{r['plan_exit']:>4} {r['dry_run_commands']:>9} {r['dry_run_exit']:>4} "
              f"{r['plan_s'] + r['dry_run_s']:>5.2f}  {', '.join(r['not_met']) or '-'}")
        for error in r["errors"]:
            print(f"    error: {error.strip()[:300]}")
    complete = sum(1 for r in rows if r["plan_listed"] == r["dry_run_commands"]
                   == r["cells"] + r["controls"])
    print(f"\n{complete} of {len(rows)} matrices: every cell listed by plan --json and printed "
          "by --dry-run")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="the rows as JSON")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dry", action="store_true",
                        help="a few seconds' check: the first shipped matrix only")
    args = parser.parse_args()
    if args.inside:
        inside(args.json, args.dry)
        return
    with tempfile.TemporaryDirectory(prefix="bare-machine-") as tmp:
        env = bare_environment(Path(tmp) / "bin")
        argv = [sys.executable, __file__, "--inside"] + (["--json"] if args.json else []) + (
            ["--dry"] if args.dry else [])
        done = subprocess.run(argv, env=env, cwd=ROOT, check=False)
    raise SystemExit(done.returncode)


if __name__ == "__main__":
    main()
