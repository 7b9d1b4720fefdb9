"""The fault suite (issue 10, "Measured"; issue 24): a real small sweep killed with SIGKILL at
seeded moments, run on a disk that fills up, with a read-only cell folder and a read-only
results folder, its terminal closed under it (SIGHUP), resumed twice at once; after each, the
run is finished with --resume and counted from disk alone: every cell recorded, none lost, none
duplicated, no cell of the damaged sweep silent, no traceback, no process of the run left,
nothing else broken (run.json finished, no cgroup left, the second --resume refused). The
figures are printed (``pytest -s``); the full table with more kill points, with the real
workload, is ``python benchmarks/fault_suite.py`` (benchmarks/README.md). The lost-host case is
the ssh backend's own test (tests/test_backend_ssh.py), which prints its count line too.

Mounting tmpfs needs root (CI runs as root); elsewhere the test is skipped, or fails under CI.
"""

from __future__ import annotations

import os

from service_support import unavailable
from standin_support import STANDIN_WORKLOAD, Standin

from benchmarks.fault_suite import run_suite, signal_campaign, signal_table, table


def test_every_cell_survives_kills_full_disks_and_read_only_folders(tmp_path, standin: Standin):
    """The cells run the STAND-IN workload (tests/standin/), each iteration 0.5 s: a cell
    lasts about 1.5 s (the kill points fall over the sweep's 4 s), without torch's CPU load."""
    if os.geteuid() != 0:
        unavailable("the fault suite mounts tmpfs file systems: it needs root")
    counts = run_suite(tmp_path, seed=1, kills=2, cells=2, span_s=4.0,
                       workload=STANDIN_WORKLOAD, tables=standin.command("--standin-step-s=0.5"))
    print("\n" + table(counts))
    for count in counts:
        assert count.clean, count


def test_any_sequence_of_stop_signals_at_any_moment_loses_nothing(tmp_path, standin: Standin):
    """Issue 34: 50 sweeps (2 STAND-IN cells of about 0.3 s each, 5 at a time), each hit by 1
    to 4 of SIGINT, SIGTERM and SIGHUP, 0 to 0.3 s apart, the first at a moment drawn (seeded)
    over an undisturbed sweep's length: a third from the orchestrator's first line on (loading
    the matrix, checking, opening the run folder), the others from the moment its run folder
    exists (cells running, recorded, stopped; the table written). Every sweep exits 130 (or 0,
    complete, where the signals came after its end), every planned cell has a readable result,
    run.json is finished, no process is left, nothing is duplicated and no traceback is
    printed. (Before: a second signal lost cells, left run.json unfinished, and the process
    died by the signal, exit -15 / -1 / -2.) About 45 s here, on 2 loaded cores."""
    counts, span = signal_campaign(tmp_path, seed=34, runs=50, cells=2, parallel=5,
                                   workload=STANDIN_WORKLOAD,
                                   tables=standin.command("--standin-step-s=0.1"))
    print("\n" + signal_table(counts, span))
    bad = [c for c in counts if c.lost or c.duplicated or c.tracebacks or c.left or c.broken]
    assert not bad, bad
    assert len(counts) >= 50
    assert sum(c.cells for c in counts) > 0, "no signal came while a run folder existed"
