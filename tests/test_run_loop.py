"""Every cell of a sweep ends with exactly one result on disk, whatever stops it from starting.

Issue 10, item 1: a cell whose launch raised used to vanish (no result.json, missing from the
summary and the counts, exit status 0). Each cause listed there is produced here, for real
where a real component produces it:

* an environment variable name with ``=``, a NUL byte in an environment value or in a path:
  the real process backend (``subprocess`` refuses them);
* a cell id too long for a folder name (planning cuts long ids; this one is put past it): the
  real backend cannot make its folder, and the sweep still counts and reports the cell;
* ENOSPC writing ``command.json``: a real full tmpfs (root only; CI runs as root);
* a ``LaunchError`` from Docker (an unknown runtime) and from ``sbatch`` (an unknown
  partition): the real engine and the real Slurm (marked docker / slurm);
* an OverflowError converting a timeout: the real Slurm backend's ``--time`` of an infinite
  timeout (no Slurm needed: it happens before sbatch);
* a cancel wait that times out and exceptions inside ``run_cell`` (a bug in a hook): no real
  component does that on purpose, so a fake backend (tests/backend_support.py) stands in
  for the backend, and the real run loop is what is checked.

The matrix validation may refuse some of these values before a sweep starts (that is the
bad-input suite's concern); these tests put them past it, as the run loop must cope anyway.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import threading
from pathlib import Path

import pytest
from backend_support import META, SUMMARY, FakeBackend, FakeExecution, Script, line
from fs_support import fill
from slurm_support import slurm_cluster  # noqa: F401 - the fixture
from workload_support import tiny_matrix

from orchestrator import sweep
from orchestrator.backends.base import Execution, ExitInfo, RunOptions
from orchestrator.errors import ConfigError, LaunchError
from orchestrator.plan.launch import LaunchSpec
from orchestrator.plan.matrix import Matrix, load_matrix
from orchestrator.results.folders.run_folder import RunPaths, Status
from orchestrator.sweep import NullEvents, run_cells, run_sweep

ROOT = Path(__file__).resolve().parents[1]

TINY = tiny_matrix("starts", timeout_s=240)


def on_disk(paths: RunPaths) -> dict[str, dict]:
    """Every result.json of a run: cell id -> its content."""
    return {p.parent.name: json.loads(p.read_text())
            for p in (paths.root / "cells").glob("*/result.json")}


def with_profile(matrix: Matrix, **changes: object) -> Matrix:
    """``matrix`` with its cpu profile changed past validation."""
    matrix.profiles["cpu"] = matrix.profiles["cpu"].model_copy(update=changes)
    return matrix


def run_json(paths: RunPaths) -> dict:
    return json.loads(paths.run_meta.read_text())


# --- real causes, process backend ------------------------------------------------------------


@pytest.mark.parametrize("env, expected", [
    pytest.param({"A=B": "1"}, "illegal environment variable name", id="name-with-equals"),
    pytest.param({"X": "a\0b"}, "embedded null byte", id="nul-in-value",
                 marks=pytest.mark.subprocess),  # refused where the process is started
])
def test_an_environment_the_os_refuses_gives_a_failed_cell_on_disk(write_matrix, tmp_path, env,
                                                                   expected):
    matrix = with_profile(load_matrix(write_matrix(TINY)), env=env)
    outcome = run_sweep(matrix, results_root=tmp_path)
    (result,) = outcome.results
    assert result.status is Status.FAILED
    assert result.reason.startswith("launching: ValueError") and expected in result.reason
    assert on_disk(outcome.paths)[result.cell_id]["status"] == "failed"
    assert outcome.exit_code == 1 and outcome.counts == {"failed": 1}
    assert run_json(outcome.paths)["counts"] == {"failed": 1}
    assert "failed=1" in outcome.paths.summary_csv.read_text()


@pytest.mark.subprocess  # the OS refuses the exec (fork_exec)
def test_a_nul_byte_in_a_path_gives_a_failed_cell_on_disk(write_matrix, tmp_path):
    matrix = load_matrix(write_matrix(TINY))
    (cell,) = matrix.cells
    bad = dataclasses.replace(cell, params=cell.params.model_copy(update={"data": "/d\0x"}))
    outcome = run_sweep(matrix.with_cells([bad]), results_root=tmp_path)
    (result,) = outcome.results
    assert result.status is Status.FAILED and "embedded null byte" in result.reason
    assert on_disk(outcome.paths)[cell.id]["status"] == "failed"
    assert outcome.exit_code == 1


def test_a_cell_whose_folder_cannot_be_made_is_still_counted_and_reported(write_matrix,
                                                                          tmp_path):
    matrix = load_matrix(write_matrix(TINY))
    (cell,) = matrix.cells
    long = dataclasses.replace(cell, id="c" * 300)  # past the planning check
    outcome = run_sweep(matrix.with_cells([long]), results_root=tmp_path)
    (result,) = outcome.results
    assert result.status is Status.FAILED and "File name too long" in result.reason
    assert outcome.counts == {"failed": 1} and outcome.exit_code == 1
    (problem,) = outcome.problems
    assert problem.startswith(f"cell {long.id} (failed): its result could not be written")
    assert run_json(outcome.paths)["counts"] == {"failed": 1}
    assert run_json(outcome.paths)["problems"] == [problem]


def test_enospc_writing_command_json_gives_a_failed_cell_on_disk(write_matrix, tmp_path, tmpfs):
    """A real full disk: the results folder is a tiny tmpfs, filled once the run folder exists
    and freed when the cell has been recorded; the result is written when the sweep ends."""
    matrix = load_matrix(write_matrix(TINY))
    with tmpfs(tmp_path / "disk", size="256k") as disk:
        state: dict[str, object] = {}

        class FillThenFree(NullEvents):
            def sweep_started(self, paths, cells, expected) -> None:
                state["paths"] = paths
                state["filler"] = fill(disk)

            def log(self, message: str) -> None:
                state["log"] = message

            def cell_finished(self, cell, result) -> None:
                paths = state["paths"]
                assert isinstance(paths, RunPaths)
                state["on_disk_then"] = paths.cell_result(cell.id).exists()
                Path(str(state["filler"])).unlink()

        outcome = run_sweep(matrix, results_root=disk, events=FillThenFree())
        (result,) = outcome.results
        assert result.status is Status.FAILED
        assert result.reason.startswith("writing command.json: OSError: [Errno 28]")
        assert state["on_disk_then"] is False and "could not be written" in str(state["log"])
        assert on_disk(outcome.paths)[result.cell_id]["reason"] == result.reason
        assert outcome.problems == [] and outcome.exit_code == 1
        assert not list(disk.rglob(".command.json.*")), "no temporary file left behind"


def test_enospc_while_the_cell_runs_fails_it_and_its_output_still_drains(write_matrix, tmp_path,
                                                                         tmpfs, standin):
    """The STAND-IN workload on a real tmpfs that fills up at its first line of output: the
    cell still ends (its output is read to the end), failed because its files are incomplete,
    and its result is on disk once the space is back."""
    matrix = load_matrix(write_matrix(standin.matrix("starts", timeout_s=240)))
    with tmpfs(tmp_path / "disk", size="1m") as disk:

        class FillAtFirstLine(NullEvents):
            filler: Path | None = None

            def cell_output(self, cell_id: str, text: str) -> None:
                if self.filler is None:
                    self.filler = fill(disk)

            def cell_finished(self, cell, result) -> None:
                assert self.filler is not None
                self.filler.unlink()

        outcome = run_sweep(matrix, results_root=disk, events=FillAtFirstLine())
        (result,) = outcome.results
        assert result.status is Status.FAILED
        assert "could not be written" in result.reason and "[Errno 28]" in result.reason
        assert on_disk(outcome.paths)[result.cell_id]["status"] == "failed"
        assert outcome.exit_code == 1


@pytest.mark.parametrize("fault", ["read-only", "full", "a file"])
def test_an_unwritable_results_folder_is_one_clear_error(write_matrix, tmp_path, tmpfs,
                                                         orchestrate_cli, fault):
    path = write_matrix(TINY)

    def orchestrate(*args: str) -> subprocess.CompletedProcess[str]:
        return orchestrate_cli(*args, timeout=300)

    if fault == "a file":
        results = tmp_path / "results"
        results.write_text("not a folder")
        proc = orchestrate("matrix", str(path), "--results", str(results))
    else:
        with tmpfs(tmp_path / "disk", size="64k", read_only=fault == "read-only") as results:
            if fault == "full":
                fill(results)
            proc = orchestrate("matrix", str(path), "--results", str(results))
            assert [p for p in results.rglob("*") if p.name != ".filler"] == []
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    (message,) = proc.stderr.strip().splitlines()
    assert message.startswith(f"error: --results: {results}: ")
    expected = {"read-only": "Read-only file system", "full": "No space left on device",
                "a file": "is not a folder"}[fault]
    assert expected in message


# --- real causes, Docker and Slurm --------------------------------------------------------------


@pytest.mark.docker
def test_a_container_the_engine_refuses_gives_a_failed_cell_on_disk(docker_client, base_image,
                                                                    write_matrix, tmp_path):
    from test_backend_docker import container_matrix

    path = write_matrix(container_matrix(base_image, extra=', runtime = "no-such-runtime"'),
                        cpu_profile=False)
    outcome = run_sweep(load_matrix(path), results_root=tmp_path)
    (result,) = outcome.results
    assert result.status is Status.FAILED
    assert result.reason.startswith("launching: ") and "refused the container" in result.reason
    assert on_disk(outcome.paths)[result.cell_id]["status"] == "failed"
    assert outcome.exit_code == 1


@pytest.mark.slurm
def test_a_job_sbatch_refuses_gives_a_failed_cell_on_disk(slurm_cluster, write_matrix,  # noqa: F811
                                                          tmp_path):
    from test_backend_slurm import TINY as SLURM_TINY

    path = write_matrix(SLURM_TINY + '[hardware.cpu.slurm]\npartition = "no_such_partition"\n',
                        cpu_profile=False)
    outcome = run_sweep(load_matrix(path), results_root=tmp_path)
    (result,) = outcome.results
    assert result.status is Status.FAILED and "sbatch refused" in result.reason
    assert on_disk(outcome.paths)[result.cell_id]["status"] == "failed"
    assert outcome.exit_code == 1


def test_an_infinite_timeout_the_slurm_backend_cannot_convert_gives_a_failed_cell(
        write_matrix, tmp_path):
    from orchestrator.backends.slurm import SlurmBackend

    matrix = load_matrix(write_matrix(TINY))
    paths = RunPaths.create(tmp_path, matrix.name)
    backend = SlurmBackend(matrix, paths, RunOptions(timeout_s=float("inf")))
    (result,) = run_cells(backend, list(matrix.cells), NullEvents())
    assert result.status is Status.FAILED
    assert result.reason.startswith("preparing the launch: OverflowError")
    assert on_disk(paths)[result.cell_id]["status"] == "failed"


# --- the run loop's own frame (a fake backend stands in: no real one fails like this) ----------


OK_SCRIPT = Script([line(META), line(SUMMARY)], ExitInfo(code=0))


def fake_backend(write_matrix, tmp_path, cls: type[FakeBackend] = FakeBackend,
                 script: Script = OK_SCRIPT, **options: object) -> FakeBackend:
    matrix = load_matrix(write_matrix(TINY + "[axes]\nseed = [1, 2]\n"))
    paths = RunPaths.create(tmp_path, matrix.name)
    return cls(matrix, paths, RunOptions(timeout_s=30, poll_interval_s=0.05, **options),
               script=script)


class RaisingExecution(FakeExecution):
    def exit_info(self) -> ExitInfo:
        raise RuntimeError("the engine answered nonsense")


@pytest.mark.parametrize("hook, step", [
    ("spec", "preparing the launch"),
    ("launch", "launching"),
    ("exit_info", "running"),
    ("finish", "recording the outcome"),
])
def test_an_exception_anywhere_in_run_cell_gives_a_failed_cell_on_disk(write_matrix, tmp_path,
                                                                       hook, step):
    class Broken(FakeBackend):
        def spec(self, cell, allocation, attempt=1) -> LaunchSpec:
            if hook == "spec":
                raise KeyError("gpu_ids")
            return super().spec(cell, allocation, attempt)

        def launch(self, spec: LaunchSpec) -> Execution:
            if hook == "launch":
                raise LaunchError(f"{spec.cell_id}: the engine refused it")
            if hook == "exit_info":
                execution = RaisingExecution(self.script)
                self.executions.append(execution)
                return execution
            return super().launch(spec)

        def finish(self, cell, result, execution) -> None:
            if hook == "finish":
                raise RuntimeError("a bug in a hook")

    backend = fake_backend(write_matrix, tmp_path, Broken)
    results = run_cells(backend, list(backend.matrix.cells), NullEvents())
    assert len(results) == 2
    for result in results:
        assert result.status is Status.FAILED and result.reason.startswith(f"{step}: ")
        assert on_disk(backend.paths)[result.cell_id]["reason"] == result.reason
    for execution in backend.executions:  # a started cell was stopped and closed
        assert execution.closed


def test_a_worker_that_raises_is_recorded_by_the_sweep(write_matrix, tmp_path):
    backend = fake_backend(write_matrix, tmp_path)

    def broken(*args: object) -> object:
        raise MemoryError("no memory for the thread")

    backend.run_cell = broken  # type: ignore[method-assign]
    results = run_cells(backend, list(backend.matrix.cells), NullEvents())
    assert [r.status for r in results] == [Status.FAILED, Status.FAILED]
    assert {d["reason"] for d in on_disk(backend.paths).values()} == {
        "MemoryError: no memory for the thread"}


def test_a_cell_that_does_not_stop_after_an_interrupt_is_recorded_failed(write_matrix, tmp_path,
                                                                          monkeypatch):
    """The launch hangs (a dead engine that never answers): after the interrupt the sweep waits
    CANCEL_WAIT_S for the cell, records it failed, and returns."""
    monkeypatch.setattr(sweep, "CANCEL_WAIT_S", 0.5)
    stuck = threading.Event()

    class Hanging(FakeBackend):
        def launch(self, spec: LaunchSpec) -> Execution:
            stuck.wait(30)
            return super().launch(spec)

    backend = fake_backend(write_matrix, tmp_path, Hanging)

    class InterruptAtStart(NullEvents):
        def cell_started(self, cell, allocation) -> None:
            backend.options.cancel.set()

    try:
        results = run_cells(backend, list(backend.matrix.cells)[:1], InterruptAtStart())
        (result,) = results
        assert result.status is Status.FAILED
        assert "did not stop within 0.5 s" in result.reason
        assert on_disk(backend.paths)[result.cell_id]["status"] == "failed"
    finally:
        stuck.set()


# --- --resume after damage ---------------------------------------------------------------------


def test_resume_treats_a_truncated_result_as_not_ok(write_matrix, tmp_path):
    matrix = load_matrix(write_matrix(TINY + "[axes]\nseed = [1, 2]\n"))
    run = sweep.open_run(matrix, "process", tmp_path, None)
    first, second = matrix.cells
    for cell in (first, second):
        ok = sweep._unrun_result(cell, Status.OK, "")
        sweep.save_result(run.paths, ok)
    text = run.paths.cell_result(first.id).read_text()
    run.paths.cell_result(first.id).write_text(text[: len(text) // 2])  # a crash mid-write

    assert [c.id for c in sweep.cells_to_resume(run.paths, matrix)] == [first.id]
    assert (run.paths.root / "superseded").is_dir()

    run.paths.plan.write_text('{"cells": [')
    with pytest.raises(ConfigError, match="the plan of run .* cannot be read"):
        sweep.cells_to_resume(run.paths, matrix)


@pytest.mark.subprocess  # git, for real
def test_the_revision_is_learned_without_writing_the_checkouts_index(tmp_path, request):
    """Issue 24, item 17: every sweep ran `git status` in the checkout, which refreshes the
    index (.git/index.lock, then a rewritten .git/index): a `git commit` there at that moment
    failed. A file whose stat changed but whose content did not makes git want to refresh."""
    from orchestrator.backends.base import git_revision

    # the checkout's revision is asked once per session (conftest): asked again after the
    # cache_clear below, so that the unit tests after this one start no git of their own
    request.addfinalizer(lambda: (git_revision.cache_clear(), git_revision()))

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c",
                               "user.email=t@t", *args], check=True, capture_output=True,
                              text=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    git("add", "a.txt")
    git("commit", "-qm", "one")
    rev = git("rev-parse", "HEAD")
    os.utime(tmp_path / "a.txt", (1_700_000_000, 1_700_000_000))  # stat-dirty, same content
    index = tmp_path / ".git" / "index"
    before = index.stat()
    assert git_revision(tmp_path) == rev
    after = index.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    (tmp_path / "a.txt").write_text("two, longer\n")  # another size: no racy-git doubt
    git_revision.cache_clear()  # asked once per process
    assert git_revision(tmp_path) == f"{rev}-dirty"
    assert index.stat().st_mtime_ns == before.st_mtime_ns


class LosesItsFirstHost(FakeBackend):
    """The first attempt of every cell ends host_lost (as a preempted or NODE_FAIL job
    reports it), the next one ok."""

    def launch(self, spec: LaunchSpec) -> Execution:
        lost = Script([line(META), b"partial output of the lost attempt\n"],
                      ExitInfo(code=None, host_lost=True, detail="Slurm: job 7 PREEMPTED on n1"))
        execution = FakeExecution(lost if spec.attempt == 1 else OK_SCRIPT)
        self.executions.append(execution)
        return execution


def test_a_lost_attempt_is_kept_aside_and_named_in_the_result(write_matrix, tmp_path):
    """A cell whose host was lost runs again; the lost attempt's folder goes to superseded/
    (its output never mixes with the next attempt's), and the cell's one result names it."""
    backend = fake_backend(write_matrix, tmp_path, cls=LosesItsFirstHost)
    cell = backend.matrix.cells[0]
    (result,) = run_cells(backend, [cell], NullEvents(), retries=1)
    assert result.status is Status.OK and result.attempts == 2
    (lost,) = result.provenance["lost_attempts"]
    assert lost["attempt"] == 1 and lost["status"] == "host_lost"
    assert lost["reason"] == "Slurm: job 7 PREEMPTED on n1"
    kept = backend.paths.root / lost["folder"]
    assert kept.parent == backend.paths.root / "superseded"
    assert json.loads((kept / "result.json").read_text())["status"] == "host_lost"
    assert "partial output of the lost attempt" in (kept / "log.txt").read_text()
    log = backend.paths.cell_log(cell.id).read_text()
    assert "partial output" not in log and log.count('"type": "summary"') == 1
    assert on_disk(backend.paths)[cell.id]["provenance"]["lost_attempts"] == [lost]


def test_a_lost_attempt_without_retries_left_is_the_result(write_matrix, tmp_path):
    backend = fake_backend(write_matrix, tmp_path, cls=LosesItsFirstHost)
    (result,) = run_cells(backend, [backend.matrix.cells[0]], NullEvents(), retries=0)
    assert result.status is Status.HOST_LOST and "lost_attempts" not in result.provenance
    assert not (backend.paths.root / "superseded").exists()
