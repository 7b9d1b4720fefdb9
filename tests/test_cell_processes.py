"""A process-backend cell's processes all end with it, however they detached (issue 10, item 2),
and a real OOM kill in its memory cgroup is ``oom`` (item 9).

Real processes throughout. The cell's command is replaced (a backend subclass's ``spec``) by
programs that misbehave on purpose: torchrun with two CPU ranks (gloo) that ignore SIGTERM and
block, one in a collective and one in a sleep (as in I/O); a daemon that double-forks and
calls ``setsid``. The OOM cell is the STAND-IN workload (tests/standin/) allocating more than
its memory limit. Everything else is the real process backend: its launch, its cgroups, its
marker, its stop. Each runs with the cgroups this machine allows (root: cgroup v2 here) and
with them turned off (``ORCHESTRATE_CGROUPS=0``: the marker scan alone, as for a user without
cgroup rights). "Nothing left" is checked independently of the code under test: no process
whose command line names the test's own script.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from workload_support import tiny_matrix

from orchestrator.backends.base import RunOptions
from orchestrator.backends.process import ProcessBackend
from orchestrator.errors import ConfigError
from orchestrator.local import cell_processes
from orchestrator.plan.launch import LaunchSpec
from orchestrator.plan.matrix import load_matrix
from orchestrator.results.folders.run_folder import RunPaths, Status
from orchestrator.sweep import NullEvents, run_cells, run_sweep

MATRIX = tiny_matrix("procs")

RANKS = """
import os, signal, sys, time
import torch.distributed as dist
signal.signal(signal.SIGTERM, signal.SIG_IGN)
dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"rank {rank} ready in session {os.getsid(0)}", flush=True)
if rank == 0:
    dist.barrier()  # rank 1 never joins: stuck in a collective
else:
    time.sleep(3600)  # stuck elsewhere (I/O)
"""

DAEMON = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        print("daemon ready", flush=True)
        time.sleep(3600)
    os._exit(0)
time.sleep(0.5)
if sys.argv[1] == "stay":
    time.sleep(3600)
"""


class ScriptBackend(ProcessBackend):
    """The real process backend running ``argv`` instead of the workload."""

    argv: tuple[str, ...] = ()

    def spec(self, cell, allocation, attempt: int = 1) -> LaunchSpec:
        return dataclasses.replace(super().spec(cell, allocation, attempt), argv=self.argv)


def mentioning(text: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,stat,args"], capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines()
            if text in ln and "ps -eo" not in ln and " Z" not in ln[:12]]


@pytest.fixture(params=["cgroups", "marker only"])
def tracking(request, monkeypatch) -> str:
    if request.param == "marker only":
        monkeypatch.setenv(cell_processes.CGROUPS_ENV, "0")
    return request.param


def run_script(write_matrix, tmp_path: Path, script: str, argv: list[str], timeout_s: float,
               python: str = sys.executable):
    """Run one cell whose command is ``python *argv`` (``SCRIPT`` in it: the script's path)."""
    path = tmp_path / "cell_script.py"
    path.write_text(script)
    matrix = load_matrix(write_matrix(MATRIX))
    paths = RunPaths.create(tmp_path / "results", matrix.name)
    backend = ScriptBackend(matrix, paths, RunOptions(timeout_s=timeout_s))
    backend.argv = (python, *[str(path) if a == "SCRIPT" else a for a in argv])
    try:
        (result,) = run_cells(backend, list(matrix.cells), NullEvents())
    finally:
        backend.close()
    return result, paths, str(path)


def assert_nothing_left(paths: RunPaths, script: str) -> None:
    prefix = cell_processes.run_marker_prefix("procs", paths.run_id)
    deadline = time.monotonic() + 5  # a SIGKILLed process may take a moment to be reaped
    while (mentioning(script) or cell_processes.marked_pids(prefix, prefix=True)) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert mentioning(script) == []
    assert cell_processes.alive(cell_processes.marked_pids(prefix, prefix=True)) == set()


def test_torchrun_ranks_that_ignore_sigterm_do_not_outlive_a_timeout(write_matrix, tmp_path,
                                                                      tracking, workload_python):
    result, paths, script = run_script(
        write_matrix, tmp_path, RANKS,
        ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "SCRIPT"],
        timeout_s=20, python=workload_python)
    log_text = paths.cell_log(result.cell_id).read_text()
    # the setup is what it claims: both ranks were up, each in a session of its own
    # (two ranks share one pipe: their lines may run together)
    sessions = set(re.findall(r"rank \d ready in session (\d+)", log_text))
    assert len(sessions) == 2, log_text[-2000:]
    assert result.status is Status.TIMEOUT, result.reason
    assert result.provenance["process_tracking"] == (
        "marker" if tracking == "marker only" else "cgroup v2")
    assert "leftover_processes" not in result.provenance
    assert_nothing_left(paths, script)


@pytest.mark.subprocess  # real processes that misbehave
def test_a_double_forked_daemon_does_not_outlive_a_timeout(write_matrix, tmp_path, tracking):
    result, paths, script = run_script(write_matrix, tmp_path, DAEMON, ["SCRIPT", "stay"],
                                       timeout_s=3)
    assert "daemon ready" in paths.cell_log(result.cell_id).read_text()
    assert result.status is Status.TIMEOUT
    assert_nothing_left(paths, script)


@pytest.mark.subprocess  # real processes that misbehave
def test_a_daemon_left_by_a_cell_that_ended_is_stopped_too(write_matrix, tmp_path, tracking):
    result, paths, script = run_script(write_matrix, tmp_path, DAEMON, ["SCRIPT", "leave"],
                                       timeout_s=60)
    assert result.exit_code == 0 and result.status is Status.FAILED  # no summary line
    assert_nothing_left(paths, script)


@pytest.mark.subprocess  # real processes that misbehave
def test_a_resumed_run_first_stops_what_a_killed_orchestrator_left(write_matrix, tmp_path):
    matrix = load_matrix(write_matrix(MATRIX))
    paths = RunPaths.create(tmp_path, matrix.name)
    marker = cell_processes.cell_marker(matrix.name, paths.run_id, matrix.cells[0].id)
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
         "signal.SIG_IGN); print('ready', flush=True); time.sleep(3600)"],
        env={**os.environ, cell_processes.MARKER_VAR: marker}, start_new_session=True,
        stdout=subprocess.PIPE, text=True)
    try:
        assert orphan.stdout is not None and orphan.stdout.readline() == "ready\n"
        seen: list[str] = []
        ProcessBackend(matrix, paths, RunOptions(timeout_s=60)).prepare(
            list(matrix.cells), on_log=seen.append)
        assert orphan.wait(timeout=20) == -signal.SIGKILL
        assert seen == [f"stopped 1 processes left running by an earlier attempt of run "
                        f"{paths.run_id}"]
    finally:
        orphan.kill()


def test_a_memory_limit_that_cannot_be_applied_is_refused_before_any_cell(write_matrix,
                                                                          tmp_path, monkeypatch):
    monkeypatch.setenv(cell_processes.CGROUPS_ENV, "0")
    path = write_matrix(MATRIX + '[hardware.cpu]\ndevice = "cpu"\n'
                        'container = { mem_limit = "1g" }\n', cpu_profile=False)
    with pytest.raises(ConfigError) as err:
        run_sweep(load_matrix(path), results_root=tmp_path)
    (problem,) = err.value.problems
    assert problem.field == "hardware.cpu.container.mem_limit"
    assert "memory cgroup" in problem.message and "ORCHESTRATE_CGROUPS=0" in problem.message
    assert not list(tmp_path.rglob("run.json")), "nothing ran, no run folder is left"


def test_a_real_oom_kill_in_the_cells_memory_cgroup_is_oom(write_matrix, tmp_path, standin):
    """The STAND-IN workload touching 600 MiB under a 256 MiB limit: the kernel's OOM killer
    in the cell's memory cgroup (the real workload's OOM on a GPU is its own error line)."""
    path = write_matrix(standin.matrix("procs", knobs="--standin-allocate-mb=600")
                        + '[hardware.cpu]\ndevice = "cpu"\n'
                        'container = { mem_limit = "256m" }\n', cpu_profile=False)
    outcome = run_sweep(load_matrix(path), results_root=tmp_path)
    (result,) = outcome.results
    assert result.status is Status.OOM, result.reason
    assert result.exit_code == -signal.SIGKILL
    assert result.reason == "killed by the out-of-memory killer (cell memory limit 256 MiB)"
    assert outcome.exit_code == 1


@pytest.mark.subprocess  # a real process in a stale cgroup
def test_empty_cgroups_of_killed_orchestrators_are_removed_by_the_next_sweep():
    """kill -9 of an orchestrator mid-cell leaves the cell's (then empty) cgroup: the next
    sweep's prepare removes it; a cgroup a process is still in, or one just made, is kept."""
    made = [cell_processes.make_cgroups(f"test-stale-{os.getpid()}-{n}") for n in range(2)]
    if made[0] is None or made[0].v2 is None:
        pytest.skip("no cgroup v2 folder can be made here (needs root or delegation)")
    empty, busy = made
    assert busy is not None and busy.v2 is not None
    sleeper = subprocess.Popen(["/bin/sh", "-c", f"echo 0 > {busy.v2 / 'cgroup.procs'} && "
                                "exec sleep 60"])
    try:
        deadline = time.monotonic() + 10
        while not busy.members() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cell_processes.remove_stale_cgroups(min_age_s=3600) == []  # all too young
        assert empty.v2 is not None and empty.v2.is_dir()
        removed = cell_processes.remove_stale_cgroups(min_age_s=0)
        assert empty.v2 in removed and not empty.v2.exists()
        assert busy.v2 not in removed and busy.v2.is_dir()
    finally:
        sleeper.kill()
        sleeper.wait()
        busy.remove()
