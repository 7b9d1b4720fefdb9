"""The results store: an SQLite index of the run folders, kept fresh, safe across processes."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from results_support import Config, day, params, run_id, write_run

from orchestrator.errors import ConfigError
from orchestrator.results.folders import store as store_mod
from orchestrator.results.folders.run_folder import read_json, write_json
from orchestrator.results.folders.store import (
    INDEX_NAME,
    RecordedStack,
    open_store,
    run_signature,
    shallow_signature,
)

ROOT = Path(__file__).resolve().parents[1]


def three_runs(root: Path) -> None:
    for n in (1, 2, 3):
        write_run(root, "nightly", run_id(n), [
            Config(params(gpus=1), [100.0 + n, 101.0, 99.0]),
            Config(params(gpus=8), [700.0, 710.0, None]),
        ], started=day(n))


def test_index_is_built_from_folders_and_answers_queries(tmp_path):
    three_runs(tmp_path)
    write_run(tmp_path, "other", run_id(2, "bbbb"), [Config(params(), [5.0])], started=day(2))
    with open_store(tmp_path) as store:
        assert store.location == str(tmp_path / INDEX_NAME) and store.note is None
        runs = store.runs()
        assert [(r.matrix, r.run_id[:8]) for r in runs] == [
            ("nightly", "20261101"), ("nightly", "20261102"), ("other", "20261102"),
            ("nightly", "20261103")]
        nightly = store.runs(matrix="nightly")
        assert all((r.cells, r.ok, r.failed, r.status) == (6, 5, 1, "failed") for r in nightly)
        assert nightly[0].duration_s == pytest.approx(100.0)
        assert nightly[0].git_revision == "0123456789abcdef"
        cells = store.cells([nightly[0].pk], figures=True)
        assert len(cells) == 6
        ok = [c for c in cells if c.ok and c.params["gpus"] == 1]
        assert sorted(c.value for c in ok) == [99.0, 101.0, 101.0]
        assert ok[0].figures["train.compute_ips"] == pytest.approx(ok[0].value * 1.05)
        assert ok[0].stack == RecordedStack(image="orchestrate/ngc-pytorch:abc123", image_id=None,
                                    torch="2.4.0", cuda="12.4", cudnn="90100",
                                    driver="550.54", gpu="NVIDIA H100 80GB HBM3", host="dgx1",
                                    python="3.11.7")
        failed = [c for c in cells if not c.ok]
        assert failed[0].stack is not None and failed[0].stack.torch is None  # image only
        assert "out of memory" in failed[0].reason
        # the configuration is the plan's content hash, the same in every run
        assert len({c.config for c in store.cells([r.pk for r in nightly])}) == 2


def test_filters_by_date_status_and_ids(tmp_path):
    three_runs(tmp_path)
    write_run(tmp_path, "nightly", run_id(4), [Config(params(), [1.0])], started=day(4))
    with open_store(tmp_path) as store:
        assert [r.run_id[:8] for r in store.runs(since=day(2), until=day(4))] == [
            "20261102", "20261103"]
        assert [r.status for r in store.runs(status=["ok"])] == ["ok"]
        assert [r.run_id for r in store.runs(run_ids=[run_id(3)])] == [run_id(3)]


def test_resolve_run_specs(tmp_path):
    three_runs(tmp_path)
    write_run(tmp_path, "other", run_id(3, "bbbb"), [Config(params(), [5.0])], started=day(3))
    with open_store(tmp_path) as store:
        assert store.resolve("nightly:latest").run_id == run_id(3)
        assert store.resolve("nightly:latest~2").run_id == run_id(1)
        assert store.resolve(run_id(2)).run_id == run_id(2)
        assert store.resolve("20261102").run_id == run_id(2)  # a unique prefix
        assert store.resolve("other:latest").matrix == "other"
        with pytest.raises(ConfigError, match="names 2 runs"):
            store.resolve("20261103")
        with pytest.raises(ConfigError, match="has 3 run"):
            store.resolve("nightly:latest~3")
        with pytest.raises(ConfigError, match="say which matrix"):
            store.resolve("latest")
        with pytest.raises(ConfigError, match="no run 'nope'"):
            store.resolve("nope")


def rewrite_value(run_dir: Path, value: float) -> None:
    result = next((run_dir / "cells").glob("*-r3/result.json"))
    data = read_json(result)
    data["metrics"]["train.total_ips"] = value
    time.sleep(0.01)
    write_json(result, data)


def test_stale_runs_are_read_again_and_removed_runs_dropped(tmp_path):
    three_runs(tmp_path)
    with open_store(tmp_path) as store:
        assert store.refresh() == 0  # nothing changed since open_store refreshed
        first = Path(store.runs()[0].path)
        # --resume rewrites results, then run.json at its end: the run is read again
        rewrite_value(first, 1234.5)
        meta = read_json(first / "run.json")
        write_json(first / "run.json", {**meta, "resumed": [{"cells": 1}]})
        assert store.refresh() == 1
        assert 1234.5 in [c.value for c in store.cells([store.runs()[0].pk])]
        # a run folder removed: dropped from the index
        import shutil

        shutil.rmtree(store.runs()[-1].path)
        assert store.refresh() == 1
        assert len(store.runs()) == 2
        # a new run appears
        write_run(tmp_path, "nightly", run_id(9), [Config(params(), [1.0])], started=day(9))
        assert store.refresh() == 1 and len(store.runs()) == 3


def test_a_fifo_planted_as_plan_json_does_not_hang_a_refresh(tmp_path, caplog):
    """As for `report` (test_results): a FIFO in a shared results folder is not a run file."""
    import threading

    three_runs(tmp_path)
    plan = next((tmp_path / "nightly").iterdir()) / "plan.json"
    plan.unlink()
    os.mkfifo(plan)
    found: list[int] = []

    def index() -> None:
        with open_store(tmp_path) as store:
            found.append(len(store.runs()))

    worker = threading.Thread(target=index, daemon=True)  # a hang stays there: the test fails
    worker.start()
    worker.join(timeout=60)
    assert found == [3]
    assert "plan.json: not a regular file" in caplog.text


def test_a_run_still_going_is_watched_file_by_file(tmp_path):
    paths = write_run(tmp_path, "m", run_id(1), [Config(params(), [1.0, 2.0, 3.0])],
                      finished=False)
    with open_store(tmp_path) as store:
        assert store.runs()[0].status == "unfinished"
        rewrite_value(paths.root, 99.0)  # a cell ends while the sweep goes on
        assert store.refresh() == 1
        assert 99.0 in [c.value for c in store.cells([store.runs()[0].pk])]
        meta = read_json(paths.run_meta)
        write_json(paths.run_meta, {**meta, "finished_at": meta["started_at"] + 5})
        assert store.refresh() == 1 and store.runs()[0].status == "ok"


def test_a_hand_edit_of_an_ended_run_needs_reindex(tmp_path):
    three_runs(tmp_path)
    with open_store(tmp_path) as store:
        rewrite_value(Path(store.runs()[0].path), 4321.0)
        assert store.refresh() == 0  # by design: an ended run is checked by 3 stat calls
    with open_store(tmp_path, refresh=False) as store:
        assert store.rebuild() == 3
        assert 4321.0 in [c.value for c in store.cells([store.runs()[0].pk])]


def test_signatures_see_results_but_not_summary_files(tmp_path):
    paths = write_run(tmp_path, "m", run_id(1), [Config(params(), [1.0, 2.0])])
    deep, shallow = run_signature(paths.root), shallow_signature(paths.root)
    (paths.root / "summary.txt").write_text("rewritten by report\n")
    assert (run_signature(paths.root), shallow_signature(paths.root)) == (deep, shallow)
    result = paths.cell_result(sorted(os.listdir(paths.root / "cells"))[0])
    os.utime(result, ns=(0, 1))
    assert run_signature(paths.root) != deep
    assert shallow_signature(paths.root) == shallow  # only run.json, plan.json, cells/
    os.utime(paths.run_meta, ns=(0, 1))
    assert shallow_signature(paths.root) != shallow


def test_index_of_another_schema_version_is_rebuilt(tmp_path, monkeypatch):
    three_runs(tmp_path)
    with open_store(tmp_path) as store:
        assert len(store.runs()) == 3
    monkeypatch.setattr(store_mod, "SCHEMA_VERSION", store_mod.SCHEMA_VERSION + 1)
    with open_store(tmp_path) as store:
        assert len(store.runs()) == 3
        version = store.conn.execute("SELECT value FROM meta").fetchone()[0]
        assert int(version) == store_mod.SCHEMA_VERSION


def test_a_damaged_index_is_set_aside_and_rebuilt(tmp_path):
    three_runs(tmp_path)
    (tmp_path / INDEX_NAME).write_bytes(b"this is not sqlite" * 100)
    with open_store(tmp_path) as store:
        assert len(store.runs()) == 3
    assert list(tmp_path.glob(f"{INDEX_NAME}.damaged-*"))


def test_no_results_folder_is_a_clean_error(tmp_path):
    with pytest.raises(ConfigError, match="no results folder"):
        open_store(tmp_path / "nope")


def test_expected_durations_are_medians_of_ok_cells(tmp_path):
    for n, seconds in ((1, 10.0), (2, 30.0), (3, 20.0)):
        write_run(tmp_path, "m", run_id(n), [Config(params(), [1.0, None], duration_s=seconds)],
                  started=day(n))
    with open_store(tmp_path) as store:
        (config,) = {c.config for c in store.cells([r.pk for r in store.runs()])}
        assert store.expected_durations("m") == {config: 20.0}
        assert store.expected_durations("m", last=1) == {config: 20.0}
        assert store.expected_durations("m", last=2) == {config: 25.0}
        assert store.expected_durations("nope") == {}
    # a run that has just begun (no result yet) does not push older ones out
    write_run(tmp_path, "m", run_id(4), [], started=day(4), finished=False)
    with open_store(tmp_path) as store:
        assert store.expected_durations("m", last=2) == {config: 25.0}


def test_the_results_own_config_hash_comes_first(tmp_path):
    paths = write_run(tmp_path, "m", run_id(1), [Config(params(), [1.0], config_hash="planhash")])
    result = next((paths.root / "cells").glob("*/result.json"))
    write_json(result, {**read_json(result), "config_hash": "ownhash"})
    with open_store(tmp_path) as store:
        assert [c.config for c in store.cells([store.runs()[0].pk])] == ["ownhash"]


def test_old_folders_without_hashes_fall_back_to_the_parameters(tmp_path):
    paths = write_run(tmp_path, "m", run_id(1), [Config(params(), [1.0])])
    plan = read_json(paths.plan)
    for cell in plan["cells"]:
        del cell["hash"]
    write_json(paths.plan, plan)
    with open_store(tmp_path) as store:
        (cell,) = store.cells([store.runs()[0].pk])
        assert cell.config.startswith("p") and len(cell.config) == 12


# --- read-only results (an archive) ------------------------------------------------------------


@contextlib.contextmanager
def read_only_copy(source: Path, where: Path):
    """A read-only copy of ``source`` at ``where``: a read-only tmpfs as root (root ignores
    permission bits), else permission bits."""
    import shutil

    where.mkdir()
    if os.geteuid() == 0:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)],
                                 capture_output=True)
        if mounted.returncode != 0:
            from service_support import unavailable

            unavailable(f"cannot mount a tmpfs as root: {mounted.stderr.decode().strip()}")
        try:
            shutil.copytree(source, where, dirs_exist_ok=True)
            subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
            yield where
        finally:
            subprocess.run(["umount", str(where)], check=False)
    else:
        shutil.copytree(source, where, dirs_exist_ok=True)
        for dirpath, _, _ in os.walk(where):
            os.chmod(dirpath, 0o555)
        try:
            yield where
        finally:
            for dirpath, _, _ in os.walk(where):
                os.chmod(dirpath, 0o755)


@pytest.mark.subprocess  # mounts a read-only tmpfs (read_only_copy)
def test_read_only_results_use_a_cache_index_then_memory(tmp_path, monkeypatch):
    src = tmp_path / "src"
    three_runs(src)
    with read_only_copy(src, tmp_path / "archive") as archive:
        assert not os.access(archive, os.W_OK)
        monkeypatch.delenv("ORCHESTRATE_CACHE", raising=False)  # the user's cache folder
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
        with open_store(archive) as store:
            assert len(store.runs()) == 3
            assert store.location.startswith(str(tmp_path / "cache" / "orchestrate"))
            assert "read-only" in store.note and str(tmp_path / "cache") in store.note
        assert not (archive / INDEX_NAME).exists()
        monkeypatch.setenv("ORCHESTRATE_CACHE", str(tmp_path / "own"))  # before XDG's
        with open_store(archive) as store:
            assert store.location.startswith(str(tmp_path / "own" / "index-"))
        # the cache cannot be written either: an index in memory, still answering
        monkeypatch.setenv("ORCHESTRATE_CACHE", str(archive / "no-cache-here"))
        with open_store(archive) as store:
            assert store.location == ":memory:" and "in memory" in store.note
            assert [len(store.cells([r.pk])) for r in store.runs()] == [6, 6, 6]


# --- concurrency: real processes ---------------------------------------------------------------

WRITER = textwrap.dedent("""
    import sys, time, json
    from pathlib import Path
    sys.path[:0] = [sys.argv[2], sys.argv[2] + "/tests"]
    from results_support import Config, params, write_run
    from orchestrator.results.folders.store import open_store
    from orchestrator.results.folders.run_folder import read_json, write_json
    root = Path(sys.argv[1])
    with open_store(root) as store:
        for n in range(40):
            write_run(root, "m", f"20261201-{n:06d}-wwww",
                      [Config(params(gpus=g), [float(n), float(n) + 1]) for g in (1, 2, 4)],
                      started=1.8e9 + n)
            if n % 3 == 0:  # resume an older run: it is read again (a new key)
                old = next((root / "m").glob("*/cells/*/result.json"))
                data = read_json(old)
                data["duration_s"] = float(n)
                write_json(old, data)
                meta_file = old.parents[2] / "run.json"
                meta = read_json(meta_file)
                write_json(meta_file, {**meta, "resumed": meta.get("resumed", []) + [n]})
            store.refresh()
    (root / "writer-done").write_text("done")
""")

READER = textwrap.dedent("""
    import sys, json
    from pathlib import Path
    sys.path[:0] = [sys.argv[2], sys.argv[2] + "/tests"]
    from orchestrator.results.folders.store import open_store
    root = Path(sys.argv[1])
    queries, bad, refreshes = 0, [], 0
    while True:
        done = (root / "writer-done").exists()
        with open_store(root, refresh=(queries % 5 == 0)) as store:
            refreshes += queries % 5 == 0
            with store.snapshot():
                for run in store.runs(matrix="m"):
                    cells = store.cells([run.pk])
                    if len(cells) != run.cells:
                        bad.append([run.run_id, len(cells), run.cells])
            queries += 1
        if done:
            break
    print(json.dumps({"queries": queries, "bad": bad, "refreshes": refreshes}))
""")


@pytest.mark.subprocess  # readers and a writer in processes of their own
def test_two_readers_and_a_writer_in_separate_processes(tmp_path):
    """Real processes on one index: readers (some refreshing, i.e. writing too) never see a
    half-indexed run, never fail with 'database is locked', and the index ends complete."""
    write_run(tmp_path, "m", "20261130-000000-seed", [Config(params(), [1.0])], started=1.7e9)
    with open_store(tmp_path):
        pass
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [str(tmp_path), str(ROOT)]
    readers = [subprocess.Popen([sys.executable, "-c", READER, *args], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for _ in range(2)]
    writer = subprocess.run([sys.executable, "-c", WRITER, *args], env=env,
                            capture_output=True, text=True, timeout=300)
    assert writer.returncode == 0, writer.stderr
    for proc in readers:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        report = json.loads(out)
        assert report["bad"] == [] and report["queries"] >= 2
    with open_store(tmp_path) as store:
        runs = store.runs(matrix="m")
        assert len(runs) == 41
        assert all(len(store.cells([r.pk])) == r.cells for r in runs)
        mode = store.conn.execute("PRAGMA journal_mode").fetchone()[0]
        assert mode == "wal"


def test_a_write_waits_for_another_writer_instead_of_failing(tmp_path):
    import threading

    three_runs(tmp_path)
    with open_store(tmp_path) as store:
        blocker = sqlite3.connect(store.location, isolation_level=None, check_same_thread=False)
        blocker.execute("BEGIN IMMEDIATE")  # another writer holds the lock
        write_run(tmp_path, "nightly", run_id(7), [Config(params(), [1.0])], started=day(7))
        released = threading.Event()

        def release() -> None:
            released.set()
            blocker.execute("COMMIT")

        timer = threading.Timer(1.0, release)
        timer.start()
        assert store.refresh() == 1  # waited for the lock (busy timeout), then wrote
        assert released.is_set()
        timer.join()
        blocker.close()
        assert len(store.runs()) == 4


def test_a_sweep_does_not_wait_30_s_for_an_index_another_process_writes(tmp_path, caplog):
    """Issue 24, item 16: a sweep only wants its expected durations from the index; while
    another process holds the index's write lock it waits the sweep's short INDEX_WAIT_S, not
    the index's 30 s, and goes on in plan order."""
    from orchestrator import sweep

    three_runs(tmp_path)
    open_store(tmp_path).close()  # the index exists
    write_run(tmp_path, "nightly", run_id(4), [Config(params(gpus=1), [100.0])],
              started=day(4))  # a run the index has not seen: the refresh must write
    holder = sqlite3.connect(tmp_path / INDEX_NAME, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # as a long re-index in another process
    try:
        run = sweep.OpenRun(paths=None, cells=[], meta={"matrix": "nightly"},  # type: ignore
                            new=False)
        started = time.monotonic()
        sweep.expect_durations(run, tmp_path)
        waited = time.monotonic() - started
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert run.expected == {} and "stayed locked by another orchestrate" in caplog.text
    assert waited < store_mod.BUSY_TIMEOUT_S / 2, waited
