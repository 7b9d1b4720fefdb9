"""The speed benchmarks run on any machine (no GPU, no Apptainer): benchmarks/plan_speed.py's
generated matrices expand to the cells asked for on every backend, and both scripts run end to
end in a small dry mode (a few cells, one run) and print their tables.

Performance itself is claimed only by the scripts' printed figures (benchmarks/README.md),
never here: these tests check that the scripts measure what they say they do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.plan.matrix import load_matrix

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


@pytest.mark.parametrize("cells", [2_000, 35, 7])
def test_plan_speed_matrices_have_the_cells_asked_for_on_every_backend(tmp_path, cells):
    from benchmarks import plan_speed as bench

    inventory = tmp_path / "hosts.toml"
    inventory.write_text(bench.INVENTORY)
    for backend in bench.BACKENDS:
        for runtime in bench.RUNTIMES:
            if backend == "docker" and runtime == "apptainer":
                continue
            path = tmp_path / f"{backend}-{runtime}.toml"
            path.write_text(bench.matrix_text(backend, runtime, cells, inventory))
            matrix = load_matrix(path)
            assert len(matrix.cells) == cells, (backend, runtime)
            assert matrix.settings.backend == backend
            assert {p.apptainer_runtime for p in matrix.profiles.values()} == {
                runtime == "apptainer"}


@pytest.mark.subprocess  # the CLI in fresh processes
def test_plan_speed_runs_without_a_gpu_in_a_small_dry_mode():
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "plan_speed.py"), "--cells", "20", "--runs", "1",
         "--backends", "process", "slurm", "--commands", "json", "table"],
        capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split() for line in proc.stdout.splitlines()
            if line.startswith(("process", "slurm"))]
    assert len(rows) == 8  # 2 backends x 2 runtimes x 2 commands
    json_rows = [r for r in rows if r[2] == "json"]
    assert all(r[-1] == "20" for r in json_rows), proc.stdout  # every cell listed


@pytest.mark.subprocess  # a real sweep of the stand-in workload, and the bare commands
def test_sweep_overhead_runs_in_a_small_dry_mode():
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "sweep_overhead.py"), "--workload", "standin",
         "--cells", "2", "--pairs", "1"],
        capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "bare (the commands one after the other)" in proc.stdout
    assert "2/2" in proc.stdout  # both cells of the sweep ended ok
    # the sweep's summary.png was there when the command exited (table and plot included in
    # the sweep's time, as the issue asks)
    (row,) = [line for line in proc.stdout.splitlines() if line.startswith(str(ROOT))]
    assert row.split()[-2] == "0.00", row
