"""A wait for another sweep's locks is said as it happens (who, since when; under ``-q`` too)
and kept out of the run's time: its own field in run.json and the store, its own column in
``runs`` (issue 31, item 6). The sweeps that really wait for each other are in
tests/test_locks.py; these use the lock module, the events and synthetic run folders."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest
from lock_support import acquire
from results_support import Config, params, write_run

from orchestrator.backends.base import lock_wait_record
from orchestrator.cli.app import main
from orchestrator.cli.sweep_commands import LineEvents, QuietEvents, sweep_events
from orchestrator.local.locks import Holder, LockRequest, describe_holder, user_name
from orchestrator.results.folders.run_folder import lock_wait_of, read_json, write_json
from orchestrator.results.folders.store import open_store


def test_the_holder_names_user_pid_run_cell_and_since_and_an_older_holder_no_user() -> None:
    record = Holder("nightly/20261122-031500-ab12", "v100-g2-r1", pid=4242, host="node1",
                    since=0.0, user="ana").to_json()
    said = describe_holder(record)
    assert said.startswith("held by run nightly/20261122-031500-ab12 (user ana, pid 4242 on "
                           "node1, cell v100-g2-r1) since ")
    older = json.loads(record)
    del older["user"]  # what a holder of an earlier version wrote
    assert "user" not in describe_holder(json.dumps(older))
    assert "(pid 4242 on node1, cell v100-g2-r1)" in describe_holder(json.dumps(older))
    assert describe_holder("garbage") == "held by another sweep"
    assert Holder("m/r", "c").user == user_name()


def test_a_wait_records_when_it_began_and_who_held_the_lock(tmp_path: Path) -> None:
    import threading

    first = acquire(LockRequest("h", (0,)), Holder("m/a", "c", user="ana"), folder=tmp_path)
    threading.Timer(0.8, first.release).start()
    before = time.time()
    with acquire(LockRequest("h", (0,)), Holder("m/b", "d"), folder=tmp_path) as held:
        assert held.waited_s >= 0.7
        assert held.waited_from is not None and before <= held.waited_from <= before + 0.5
        assert held.held_by.startswith("held by run m/a (user ana, pid ")
        record = lock_wait_record(held)
    assert record["lock_wait_s"] == held.waited_s
    assert record["lock_wait"]["until"] - record["lock_wait"]["from"] == pytest.approx(
        held.waited_s, abs=0.01)
    with acquire(LockRequest("h", (0,)), Holder("m/c", "e"), folder=tmp_path) as free:
        assert (free.waited_s, free.waited_from, free.held_by) == (0.0, None, "")


def cell(start: float, end: float, wait: tuple[float, float] | None = None,
         old_wait_s: float | None = None) -> dict:
    provenance: dict = {}
    if wait:
        provenance["lock_wait"] = {"from": wait[0], "until": wait[1]}
        provenance["lock_wait_s"] = wait[1] - wait[0]
    if old_wait_s:
        provenance["lock_wait_s"] = old_wait_s
    return {"started_at": start, "finished_at": end, "provenance": provenance}


def test_the_runs_lock_wait_is_the_time_it_did_nothing_but_wait() -> None:
    # one after the other (the process backend): the waits add up
    assert lock_wait_of([cell(164, 200, wait=(0, 164)), cell(300, 330, wait=(200, 300))]) == 264
    # two cells waiting at once count once
    assert lock_wait_of([cell(100, 110, wait=(0, 100)), cell(100, 120, wait=(50, 100))]) == 100
    # a wait beside a running cell costs the run nothing (ssh: another host's cell ran)
    assert lock_wait_of([cell(0, 100), cell(80, 90, wait=(20, 80))]) == 0
    assert lock_wait_of([cell(0, 50), cell(80, 90, wait=(20, 80))]) == 30
    # results written before the interval was: the wait ended when the cell started
    assert lock_wait_of([cell(164, 225, old_wait_s=164)]) == 164
    assert lock_wait_of([cell(0, 1), {"provenance": "damaged"}, {}]) == 0


def test_runs_shows_the_wait_apart_and_leaves_it_out_of_the_duration(tmp_path, capsys) -> None:
    """The issue's nights: 4:04 with a 164 s wait against 1:01 for the next night. With the
    wait apart, both show the 1:01 their cells took."""
    results = tmp_path / "results"
    night1 = write_run(results, "nightly", "20261126-023000-aaaa", [Config(params(), [100.0])],
                       started=1000.0)
    meta = read_json(night1.run_meta)
    meta.update(finished_at=1000.0 + 244, lock_wait_s=164.0)  # as the run.json says
    write_json(night1.run_meta, meta)
    night2 = write_run(results, "nightly", "20261127-023000-bbbb", [Config(params(), [100.0])],
                       started=100000.0)
    meta = read_json(night2.run_meta)
    meta.update(finished_at=100000.0 + 61)
    meta.pop("lock_wait_s", None)
    write_json(night2.run_meta, meta)
    with open_store(results) as store:
        first, second = store.runs(matrix="nightly")
    assert (first.elapsed_s, first.lock_wait_s, first.duration_s) == (244, 164, 80)
    assert (second.lock_wait_s, second.duration_s) == (0, 61)
    assert main(["runs", "--results", str(results)]) == 0
    out = capsys.readouterr().out
    header, _, row1, row2, *notes = out.splitlines()
    assert header.split()[-4:] == ["duration", "lock", "wait", "revision"]
    assert row1.split()[-3:-1] == ["0:01:20", "0:02:44"]  # duration, then the wait
    assert row2.split()[-2] == "0:01:01"  # and no wait
    assert any("without its lock waits" in n for n in notes)
    assert main(["runs", "--results", str(results), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(r["duration_s"], r["lock_wait_s"], r["elapsed_s"]) for r in data] == [
        (80, 164, 244), (61, 0, 61)]


def test_an_old_run_without_the_field_has_its_wait_counted_from_its_results(tmp_path) -> None:
    results = tmp_path / "results"
    run = write_run(results, "m", "20261126-023000-aaaa", [Config(params(), [100.0])],
                    started=1000.0)
    (result_file,) = run.cells_dir.glob("*/result.json")
    data = read_json(result_file)
    data.update(started_at=1164.0, finished_at=1200.0, provenance={"lock_wait_s": 164.0})
    write_json(result_file, data)
    meta = read_json(run.run_meta)
    meta.pop("lock_wait_s", None)
    meta["finished_at"] = 1244.0
    write_json(run.run_meta, meta)
    with open_store(results) as store:
        (found,) = store.runs()
    assert (found.lock_wait_s, found.duration_s) == (164.0, 80.0)


def test_a_lock_wait_is_one_line_under_quiet_and_two_otherwise() -> None:
    quiet, lines = io.StringIO(), io.StringIO()
    q = sweep_events(-1, quiet)
    assert isinstance(q, QuietEvents)
    events = LineEvents(lines)
    for ev in (q, events):
        ev.log("build output and the like")
        ev.lock_wait("c-r1", "waiting for GPU 0 on localhost: held by run m/x (user ana, pid 1 "
                     "on h, cell c) since 2026-11-27 02:30:00", None)
        ev.lock_wait("c-r1", "got GPU 0 on localhost after waiting 164 s", 164.0)
    (said,) = quiet.getvalue().splitlines()
    assert said.endswith("c-r1: waiting for GPU 0 on localhost: held by run m/x (user ana, pid 1 "
                         "on h, cell c) since 2026-11-27 02:30:00")
    assert said[:4].isdigit()  # timestamped, as the nightly's log needs
    assert [ln.split(" ", 2)[2] for ln in lines.getvalue().splitlines()] == [
        "build output and the like",
        "c-r1: waiting for GPU 0 on localhost: held by run m/x (user ana, pid 1 on h, cell c) "
        "since 2026-11-27 02:30:00",
        "c-r1: got GPU 0 on localhost after waiting 164 s"]

