"""Issue 34, item 7: every benchmark runs, or says why it cannot, on a machine without a GPU;
and the benchmarks stop only the processes they started, by id.

Each script of ``benchmarks/`` runs with ``--help`` (exit 0, its usage naming ``--dry``) and
with ``--dry`` (a few seconds' version: a tiny run, or the requirements checked and what it
would run said) in a process of its own: exit 0, or 3 with a ``cannot run here:`` line saying
what the machine lacks (a GPU, a Docker image, a Slurm cluster, an mlflow server); never a
traceback. On this machine (no GPU) the four GPU benchmarks say so and the rest run; a GPU
machine runs them all the same way. No script stops processes by name (``pkill``,
``killall``): gpu_session.sh runs each step in a session of its own and stops what is left of
it by process id, and the benchmarks stop the runs they started (benchmarks/common.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
#: Modules the scripts import, not scripts themselves.
HELPERS = {"__init__.py", "common.py", "list_scheduling.py"}
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if p.name not in HELPERS) + [
    "gpu_session.sh"]


def _run(name: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    script = BENCH / name
    argv = ["bash", str(script)] if name.endswith(".sh") else [sys.executable, str(script)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OUT": "/nonexistent-never-written"}
    return subprocess.run([*argv, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.subprocess
@pytest.mark.parametrize("name", SCRIPTS)
def test_every_benchmark_has_help_and_a_dry_mode(name: str) -> None:
    helped = _run(name, "--help", timeout=60)
    assert helped.returncode == 0, helped.stderr
    assert "usage" in helped.stdout.lower() or name.endswith(".sh"), helped.stdout[:500]
    assert re.search(r"--dry\b(?!-)", helped.stdout), helped.stdout[:2000]
    dry = _run(name, "--dry", timeout=180)
    shown = f"{name} --dry: exit {dry.returncode}\n{dry.stdout[-1500:]}\n{dry.stderr[-1500:]}"
    assert "Traceback" not in dry.stdout + dry.stderr, shown
    assert dry.returncode in (0, 3), shown
    if dry.returncode == 3:
        assert re.search(r"^cannot run here: \S", dry.stderr, re.MULTILINE), shown
    assert not Path("/nonexistent-never-written").exists()


def test_every_script_is_a_script_or_a_helper() -> None:
    for path in BENCH.glob("*.py"):
        text = path.read_text()
        assert (path.name in HELPERS) != ('if __name__ == "__main__":' in text), path.name


def test_no_benchmark_stops_processes_by_name() -> None:
    """pkill -f 'main.py' in gpu_session.sh killed every process named like main.py on a
    shared GPU machine, other users' included."""
    found = [f"{p.name}: {line.strip()}" for p in BENCH.iterdir() if p.is_file()
             and p.suffix in (".py", ".sh")
             for line in p.read_text().splitlines()
             if re.search(r"\b(pkill|killall)\b", line) and not line.lstrip().startswith("#")]
    assert not found, found
