"""Two sweeps on the same GPUs of one machine run one after the other (issue 10, item 10).

Real sweeps (the orchestrate CLI, the process backend, the STAND-IN workload of tests/standin/,
each iteration 0.2 s) run at the same time in separate processes, sharing one lock folder. This
machine has no GPU: the cells are CPU cells whose profile lists ``gpu_ids``, which makes them
hold those GPUs' locks while they run, exactly as GPU cells do. The unit tests at the top use the
lock module alone.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from lock_support import acquire
from standin_support import Standin

from orchestrator.local import cell_processes
from orchestrator.local.locks import (
    Holder,
    LockBusy,
    LockRequest,
    LockWaitCancelled,
    user_name,
)

ROOT = Path(__file__).resolve().parents[1]


# --- the lock module ---------------------------------------------------------------------------


def test_lock_files_come_in_one_order() -> None:
    assert LockRequest("h", (3, 1)).files() == [
        ("h.lock", fcntl.LOCK_SH), ("h-gpu1.lock", fcntl.LOCK_EX), ("h-gpu3.lock", fcntl.LOCK_EX)]
    assert [n for n, _ in LockRequest("h").files()] == ["h.lock", "h-cpu.lock"]
    assert [n for n, _ in LockRequest("h", whole_host=True).files()] == ["h.lock"]
    assert LockRequest("h", (0, 1)).describe() == "GPUs 0,1 on h"


def test_a_held_gpu_makes_another_request_wait_and_say_who_holds_it(tmp_path: Path) -> None:
    first = acquire(LockRequest("h", (0,)), Holder("m/run-a", "cell-a"), folder=tmp_path)
    heard: list[str] = []
    with pytest.raises(LockBusy) as err:
        acquire(LockRequest("h", (1, 0)), Holder("m/run-b", "cell-b"), timeout_s=0.6,
                on_wait=heard.append, folder=tmp_path)
    assert "GPUs 0,1 on h held by run m/run-a" in str(err.value)
    assert f"(user {user_name()}, pid {os.getpid()} on " in str(err.value)
    assert "cell cell-a" in str(err.value)
    (said,) = heard
    assert said.startswith("cell-b: waiting for GPUs 0,1 on h: held by run m/run-a")
    # other GPUs are free, and the whole host is not
    with acquire(LockRequest("h", (1,)), Holder("m/run-b", "x"), timeout_s=0, folder=tmp_path):
        pass
    with pytest.raises(LockBusy):
        acquire(LockRequest("h", whole_host=True), Holder("m/run-b", "y"), timeout_s=0,
                folder=tmp_path)
    first.release()
    with acquire(LockRequest("h", (0, 1)), Holder("m/run-b", "z"), timeout_s=0, folder=tmp_path):
        pass


def test_waiting_ends_when_the_holder_releases_or_the_sweep_is_interrupted(tmp_path) -> None:
    first = acquire(LockRequest("h", (0,)), Holder("m/a", "c"), folder=tmp_path)
    threading.Timer(1.0, first.release).start()
    with acquire(LockRequest("h", (0,)), Holder("m/b", "c"), folder=tmp_path) as second:
        assert second.waited_s >= 0.9

    blocker = acquire(LockRequest("h", (0,)), Holder("m/a", "c"), folder=tmp_path)
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    with pytest.raises(LockWaitCancelled):
        acquire(LockRequest("h", (0,)), Holder("m/b", "c"), cancel=cancel, folder=tmp_path)
    blocker.release()


# --- real sweeps -------------------------------------------------------------------------------


def matrix_file(standin: Standin, folder: Path, name: str, gpu_ids: list[int],
                iterations: int = 2) -> Path:
    path = folder / f"{name}.toml"
    cells = standin.matrix(name, timeout_s=300, knobs="--standin-step-s=0.2").replace(
        "iterations = 2", f"iterations = {iterations}")
    path.write_text(f'{cells}[hardware.cpu]\ndevice = "cpu"\ngpu_ids = {gpu_ids}\n')
    return path


def start(path: Path, results: Path, locks: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "ORCHESTRATE_LOCK_DIR": str(locks)}
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "matrix", str(path), "--results", str(results),
         *extra], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_until_held(locks: Path, gpu: int, pid: int, timeout: float = 60.0) -> None:
    """Until sweep ``pid`` holds GPU ``gpu`` (it writes itself into the lock file)."""
    deadline = time.monotonic() + timeout
    path = locks / f"localhost-gpu{gpu}.lock"
    while time.monotonic() < deadline:
        try:
            if json.loads(path.read_text() or "{}").get("pid") == pid:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"sweep {pid} never held GPU {gpu}")


def result_of(results: Path, name: str) -> dict:
    (path,) = results.glob(f"{name}/*/cells/*/result.json")
    return json.loads(path.read_text())


def test_two_sweeps_on_one_gpu_run_one_after_the_other(tmp_path, standin):
    locks, results = tmp_path / "locks", tmp_path / "results"
    first = start(matrix_file(standin, tmp_path, "first", [0], iterations=30), results, locks)
    wait_until_held(locks, 0, first.pid)
    second = start(matrix_file(standin, tmp_path, "second", [0]), results, locks, "-q")
    other = start(matrix_file(standin, tmp_path, "other", [1]), results, locks)
    outs = [p.communicate(timeout=600) for p in (first, second, other)]
    assert [p.returncode for p in (first, second, other)] == [0, 0, 0], outs
    a, b = result_of(results, "first"), result_of(results, "second")
    assert b["started_at"] >= a["finished_at"], "the second sweep ran on a GPU in use"
    assert b["provenance"]["lock_wait_s"] > 0
    # -q: the wait is the one line on stderr, timestamped, naming who held the GPU
    (waited,) = outs[1][1].splitlines()
    assert "waiting for GPU 0 on localhost" in waited and waited[:4].isdigit()
    assert "held by run first/" in waited and f"(user {user_name()}, pid {first.pid} on " in waited
    assert "waiting for" not in outs[2][1], "a sweep on another GPU does not wait"
    # the wait is the run's own field, kept out of its duration
    (run_json,) = results.glob("second/*/run.json")
    meta = json.loads(run_json.read_text())
    waited_s = b["provenance"]["lock_wait_s"]
    assert meta["lock_wait_s"] == pytest.approx(waited_s, abs=0.01)
    listed = subprocess.run([sys.executable, "-m", "orchestrator", "runs", "second", "--json",
                             "--results", str(results)], cwd=ROOT, capture_output=True,
                            text=True, check=True)
    (record,) = json.loads(listed.stdout)
    assert record["lock_wait_s"] == meta["lock_wait_s"]
    assert record["duration_s"] == pytest.approx(record["elapsed_s"] - waited_s, abs=0.01)
    assert record["duration_s"] < b["finished_at"] - b["started_at"] + 30  # the cell, not the wait


def test_no_wait_fails_the_cell_saying_who_holds_the_gpu(tmp_path, standin):
    locks, results = tmp_path / "locks", tmp_path / "results"
    first = start(matrix_file(standin, tmp_path, "first", [0], iterations=1000000), results, locks)
    try:
        wait_until_held(locks, 0, first.pid)
        second = start(matrix_file(standin, tmp_path, "second", [0]), results, locks, "--no-wait")
        _, err = second.communicate(timeout=120)
        assert second.returncode == 1, err
        result = result_of(results, "second")
        assert result["status"] == "failed"
        assert result["reason"].startswith("waiting for GPU 0 on localhost: GPU 0 on localhost "
                                           "held by run first/")
        assert "(--lock-timeout 0)" in result["reason"] and "Traceback" not in err
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)


def test_the_lock_of_a_sweep_killed_with_sigkill_is_released(tmp_path, standin):
    locks, results = tmp_path / "locks", tmp_path / "results"
    first = start(matrix_file(standin, tmp_path, "first", [0], iterations=1000000), results, locks)
    wait_until_held(locks, 0, first.pid)
    second = start(matrix_file(standin, tmp_path, "second", [0]), results, locks)
    try:
        deadline = time.monotonic() + 30
        while not list(results.glob("second/*/cells/*/log.txt")):  # it reached its lock
            assert time.monotonic() < deadline, "the second sweep never reached its cell"
            time.sleep(0.1)
        time.sleep(1.0)
        first.kill()  # SIGKILL: no cleanup of any kind
        first.communicate(timeout=30)
        _, err = second.communicate(timeout=300)
        assert second.returncode == 0, err
        assert "waiting for GPU 0 on localhost" in err
        assert result_of(results, "second")["status"] == "ok"
    finally:
        (run,) = results.glob("first/*")
        cell_processes.kill_marked(f"first/{run.name}/", prefix=True)  # the killed sweep's workload
