"""A live run (a sweep works in it now) is ``running``, apart from a crashed one
(``unfinished``); ``report`` on it shows the cells that ended so far and says it is live; and
``orchestrate logs`` prints or follows one cell's log (issue 31, item 6).

"Live" is the run folder's lock held (:mod:`orchestrator.results.folders.folder_lock`): these
tests hold it in this process, as a sweep holds it in its own. A real sweep followed from
another process is the last test (integration tier)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from results_support import Config, params, write_run

from orchestrator.cli.app import main
from orchestrator.errors import ConfigError
from orchestrator.results.folders import folder_lock
from orchestrator.results.folders.cell_logs import (
    Follower,
    cell_ids,
    resolve_cell,
    tail_offset,
)
from orchestrator.results.folders.run_folder import RunPaths, read_json, write_json
from orchestrator.results.folders.store import open_store

ROOT = Path(__file__).resolve().parents[1]


def unfinished_run(results: Path, values: list[float | None], started_but_not_ended: int = 0
                   ) -> RunPaths:
    """A run whose run.json has no end, with a result for each of ``values`` and
    ``started_but_not_ended`` more cells that have a log but no result (running)."""
    configs = [Config(params(batch_size=8 * (i + 1)), [v]) for i, v in enumerate(values)]
    pending = [Config(params(batch_size=1000 + i), [1.0]) for i in range(started_but_not_ended)]
    paths = write_run(results, "m", "20261127-154100-aaaa", configs, finished=False,
                      plan_extra=pending)
    for cfg in pending:
        cell = f"{cfg.group}-r1"
        paths.cell_dir(cell).mkdir(parents=True, exist_ok=True)
        paths.cell_log(cell).write_text("# python workload.py\nstep 1\n")
    return paths


def test_a_run_a_sweep_works_in_is_running_and_a_dead_one_unfinished(tmp_path) -> None:
    results = tmp_path / "results"
    paths = unfinished_run(results, [100.0])
    with open_store(results) as store:
        assert [r.status for r in store.runs()] == ["unfinished"]
    lock = folder_lock.acquire(paths.lock, argv=["orchestrate", "matrix", "m.toml"])
    try:
        with open_store(results) as store:
            (run,) = store.runs()
            assert run.status == "running"
            assert run.live.startswith(f"held by pid {os.getpid()} on ")
            assert store.runs(status=["running"]) == [run]
            assert store.runs(status=["unfinished"]) == []
    finally:
        lock.release()
    with open_store(results) as store:  # the sweep died: the kernel dropped its lock
        assert [r.status for r in store.runs(status=["unfinished"])] == ["unfinished"]


def test_an_ended_run_being_resumed_is_running_too(tmp_path) -> None:
    results = tmp_path / "results"
    paths = write_run(results, "m", "20261127-154100-aaaa", [Config(params(), [100.0, None])])
    with folder_lock.acquire(paths.lock), open_store(results) as store:
        assert [r.status for r in store.runs()] == ["running"]
    with open_store(results) as store:
        assert [r.status for r in store.runs()] == ["failed"]


def test_runs_lists_a_live_run_as_running_saying_who(tmp_path, capsys) -> None:
    """... and its cells without a result as to run, not missing (found by the review: a live
    sweep's unstarted cells were counted as a dead one's)."""
    results = tmp_path / "results"
    paths = unfinished_run(results, [100.0], started_but_not_ended=2)
    with folder_lock.acquire(paths.lock, argv=["orchestrate", "matrix", "m.toml"]):
        assert main(["runs", "--results", str(results)]) == 0
        out = capsys.readouterr().out
        assert main(["runs", "--results", str(results), "--status", "running", "--json"]) == 0
        (listed,) = json.loads(capsys.readouterr().out)
    assert " running " in out.splitlines()[2]
    assert f"running: m:{paths.run_id} (held by pid {os.getpid()} on " in out
    assert listed["status"] == "running" and "orchestrate matrix m.toml" in listed["live"]
    header, _, row = out.splitlines()[:3]
    at = header.index("missing")
    assert row[at:].split()[:3] == ["2", "to", "run"], (header, row)
    assert (listed["missing"], listed["to_run"]) == (0, 2)
    with open_store(results) as store:  # the sweep died: what it had left is missing
        (dead,) = store.runs()
        assert (dead.status, dead.missing, dead.to_run) == ("unfinished", 2, 0)


def test_report_on_a_live_run_shows_the_cells_ended_so_far_and_says_it_is_live(
        tmp_path, capsys) -> None:
    results = tmp_path / "results"
    paths = unfinished_run(results, [100.0, 120.0], started_but_not_ended=1)
    (running,) = [c for c in cell_ids(paths) if "-1000-" in c]
    with folder_lock.acquire(paths.lock):
        assert main(["report", "m", "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert "100.0" in out and "120.0" in out  # the two cells that ended
    assert f"live: run {paths.run_id} is still running (held by pid {os.getpid()}" in out
    assert "2 of 3 cells ended so far" in out
    assert f"running now: {running} (follow one: orchestrate logs m:{paths.run_id} " in out
    assert not paths.summary_csv.exists()  # the sweep writes the summary when it ends


def test_report_on_a_live_run_with_no_cell_ended_says_so(tmp_path, capsys) -> None:
    results = tmp_path / "results"
    paths = unfinished_run(results, [], started_but_not_ended=2)
    with folder_lock.acquire(paths.lock):
        assert main(["report", "m", "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert "(no cell has ended yet)" in out and "(no results)" not in out
    assert "0 of 2 cells ended so far" in out


# --- cell names --------------------------------------------------------------------------------


def test_a_cell_is_named_by_its_id_or_a_unique_prefix_and_a_typo_gets_suggestions(tmp_path):
    paths = unfinished_run(tmp_path, [1.0, 2.0])
    a, b = cell_ids(paths)
    assert resolve_cell(paths, a) == a and resolve_cell(paths, b[:-1]) == b
    with pytest.raises(ConfigError, match="names 2 cells") as many:
        resolve_cell(paths, "resnet50-")
    assert a in str(many.value)
    typo = a.replace("amp", "apm")
    with pytest.raises(ConfigError, match=f": did you mean '{a}'( or '[^']+')?\\? \\(its cells: "):
        resolve_cell(paths, typo)
    with pytest.raises(ConfigError) as none_close:
        resolve_cell(paths, "zzz")
    assert f"no cell 'zzz' in run {paths.matrix_dir.name}:{paths.run_id} (its cells: {a}, " \
        in str(none_close.value)


def test_logs_of_a_misspelt_cell_exit_2_with_the_suggestion(tmp_path, capsys) -> None:
    paths = unfinished_run(tmp_path, [1.0])
    (cell,) = cell_ids(paths)
    assert main(["logs", "m", cell.replace("-r1", "-r7"), "--results", str(tmp_path)]) == 2
    assert f"did you mean '{cell}'" in capsys.readouterr().err


def test_tail_offset_finds_the_last_lines(tmp_path) -> None:
    log = tmp_path / "log.txt"
    log.write_bytes(b"a\nbb\nccc\n")
    assert [log.read_bytes()[tail_offset(log, n):] for n in (0, 1, 2, 3, 9)] == [
        b"", b"ccc\n", b"bb\nccc\n", b"a\nbb\nccc\n", b"a\nbb\nccc\n"]
    log.write_bytes(b"a\nbb")  # a last line without its newline is a line
    assert log.read_bytes()[tail_offset(log, 1):] == b"bb"
    log.write_bytes(b"x" * 200_000 + b"\nend\n")  # more than one block
    assert log.read_bytes()[tail_offset(log, 1):] == b"end\n"


def test_logs_prints_the_log_and_its_tail(tmp_path, capsysbinary) -> None:
    paths = unfinished_run(tmp_path, [1.0])
    (cell,) = cell_ids(paths)
    paths.cell_log(cell).write_bytes(b"# argv\nline 1\nline 2\n")
    assert main(["logs", "m", cell, "--results", str(tmp_path)]) == 0
    assert capsysbinary.readouterr().out == b"# argv\nline 1\nline 2\n"
    assert main(["logs", f"m:{paths.run_id[:10]}", cell[:12], "-n", "1", "--results",
                 str(tmp_path)]) == 0
    assert capsysbinary.readouterr().out == b"line 2\n"


# --- following ---------------------------------------------------------------------------------


class Sink:
    def __init__(self) -> None:
        self.data = b""
        self.said: list[str] = []


def follower(paths: RunPaths, cell: str, sink: Sink, live: threading.Event) -> Follower:
    return Follower(paths, cell, lambda b: setattr(sink, "data", sink.data + b),
                    sink.said.append, poll_s=0.02, is_live=live.is_set, rerun_grace_s=0.5)


def test_follow_prints_what_is_added_until_the_cell_ends(tmp_path) -> None:
    paths = unfinished_run(tmp_path, [], started_but_not_ended=1)
    (cell,) = cell_ids(paths)
    live, sink = threading.Event(), Sink()
    live.set()

    def the_cell() -> None:
        with paths.cell_log(cell).open("ab") as fh:
            for i in range(5):
                time.sleep(0.05)
                fh.write(f"step {i}\n".encode())
                fh.flush()
        write_json(paths.cell_result(cell), {"status": "ok", "reason": ""})

    threading.Thread(target=the_cell).start()
    f = follower(paths, cell, sink, live)
    ended = f.follow()
    f.close()
    assert ended == "ok"
    assert sink.data == paths.cell_log(cell).read_bytes()
    assert sink.data.endswith(b"step 3\nstep 4\n")


def test_follow_waits_for_a_cell_to_start_and_goes_on_with_its_next_attempt(tmp_path):
    paths = unfinished_run(tmp_path, [], started_but_not_ended=1)
    (cell,) = cell_ids(paths)
    os.rename(paths.cell_dir(cell), tmp_path / "later")
    live, sink = threading.Event(), Sink()
    live.set()

    def the_sweep() -> None:
        time.sleep(0.2)
        os.rename(tmp_path / "later", paths.cell_dir(cell))  # the cell starts
        time.sleep(0.2)
        write_json(paths.cell_result(cell), {"status": "host_lost", "reason": "gone"})
        time.sleep(0.1)
        paths.superseded(cell).parent.mkdir(exist_ok=True)  # the sweep runs it again
        os.rename(paths.cell_dir(cell), paths.superseded(cell, "host_lost"))
        time.sleep(0.1)
        paths.cell_dir(cell).mkdir()
        paths.cell_log(cell).write_bytes(b"# again\nattempt 2\n")
        time.sleep(0.2)
        write_json(paths.cell_result(cell), {"status": "ok"})

    threading.Thread(target=the_sweep).start()
    f = follower(paths, cell, sink, live)
    ended = f.follow()
    f.close()
    assert ended == "ok"
    assert sink.said[0] == f"waiting for cell {cell} to start"
    assert any("attempt 2" in s for s in sink.said[1:])
    assert sink.data == b"# python workload.py\nstep 1\n# again\nattempt 2\n"


def test_follow_ends_when_the_sweep_died_without_a_result(tmp_path) -> None:
    paths = unfinished_run(tmp_path, [], started_but_not_ended=1)
    (cell,) = cell_ids(paths)
    live, sink = threading.Event(), Sink()
    live.set()
    threading.Timer(0.3, live.clear).start()
    f = follower(paths, cell, sink, live)
    assert f.follow() == "the sweep ended without a result for the cell (it died or was killed)"
    f.close()
    assert sink.data.endswith(b"step 1\n")


def test_follow_of_a_cell_that_never_started_in_an_ended_run(tmp_path) -> None:
    paths = write_run(tmp_path, "m", "20261127-154100-aaaa", [Config(params(), [1.0])])
    (cell,) = cell_ids(paths)
    paths.cell_log(cell).unlink(missing_ok=True)
    live, sink = threading.Event(), Sink()
    assert follower(paths, cell, sink, live).follow().startswith("no log: the cell did not run")


# --- a real sweep, followed from another process -----------------------------------------------


def test_a_real_sweep_is_running_while_it_runs_and_its_cell_is_followed_to_its_end(
        tmp_path: Path, standin) -> None:
    """A stand-in sweep of two cells (each 1.5 s of steps) in a process of its own: while it
    runs, ``runs`` says running and ``logs --follow`` of its second cell prints that cell's
    whole log and ends when the cell ends; killed with SIGKILL, a second sweep's run is
    ``unfinished``."""
    matrix = tmp_path / "live.toml"
    matrix.write_text(standin.matrix("live", timeout_s=120, knobs="--standin-step-s=0.15")
                      .replace("iterations = 2", "iterations = 10")
                      + '\n[hardware.cpu]\ndevice = "cpu"\n\n[axes]\nbatch_size = [4, 8]\n')
    results = tmp_path / "results"
    env = {**os.environ, "ORCHESTRATE_LOCK_DIR": str(tmp_path / "locks")}

    def orchestrate(*args: str, **kw) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "orchestrator", *args, "--results",
                                 str(results)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, **kw)

    sweep = orchestrate("matrix", str(matrix), "--order-seed", "1")
    deadline = time.monotonic() + 60
    while not list(results.glob("live/*/plan.json")):
        assert time.monotonic() < deadline and sweep.poll() is None
        time.sleep(0.1)
    (run_dir,) = results.glob("live/*")
    cells = [c["id"] for c in json.loads((run_dir / "plan.json").read_text())["cells"]]
    listed = orchestrate("runs", "live", "--json").communicate(timeout=60)[0]
    assert [r["status"] for r in json.loads(listed)] == ["running"]
    follow = orchestrate("logs", "live", cells[1], "--follow")
    out, err = follow.communicate(timeout=120)
    assert follow.returncode == 0, err
    assert sweep.wait(timeout=120) == 0
    log = (run_dir / "cells" / cells[1] / "log.txt").read_bytes()
    assert out == log and b"summary" in log  # the whole log, to the workload's last line
    assert err.decode().strip().endswith(f"cell {cells[1]}: ok")

    killed = orchestrate("matrix", str(matrix), "--order-seed", "1")
    while len(list(results.glob("live/*/cells/*/log.txt"))) < 3:
        assert killed.poll() is None
        time.sleep(0.05)
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=30)
    statuses = json.loads(orchestrate("runs", "live", "--json").communicate(timeout=60)[0])
    assert [r["status"] for r in statuses] == ["ok", "unfinished"]
    from orchestrator.local import cell_processes

    cell_processes.kill_marked("live/", prefix=True)  # the killed sweep's workload
    assert read_json(run_dir / "run.json")["finished_at"]
