"""Issue 34, item 4: a full disk and a read-only results folder, on every command that writes.

The results folder is a real tmpfs (``tmpfs`` fixture, tests/fs_support.py: root, integration
tier) holding three runs, two of them in its index (the third written after it was built, so
that each command's refresh of the index writes). It is filled to the last byte, or to all but
8 KiB (room for a rename, not for the index's pages), or remounted read-only; then each command
runs in-process: ``import`` (a log and a copied run folder), ``export --out`` (onto the full
disk) and ``export``, ``report`` (its tables), ``report --html``, ``history --plot``,
``compare --html``, ``runs``, ``publish`` (publish.json), ``clean --run`` (the index; Docker
tier), the images' state (its one writer, ``update_state``). Each must end with one clear line
(exit 0 where the command's own answer could be given, else 2), no traceback; the files of the
run folders are byte for byte what they were (a file the command could write on a nearly full
disk is whole), no temporary file is left, and the index was neither set aside as "damaged"
(export on a full disk called a healthy index damaged and moved it away) nor left half-written:
it opens and lists every run once the disk has room again.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_support import ok_collector, run_cli
from fs_support import fill
from results_support import Config, params, run_id, write_run

from orchestrator.results.folders.run_folder import ResultsRoot
from orchestrator.results.folders.store import open_store

RUN_A, RUN_B, RUN_C = run_id(1), run_id(2), run_id(3)



@pytest.fixture(scope="module")
def collector() -> Iterator[str]:
    with ok_collector() as url:
        yield url


#: name -> argv (``{R}``: the results folder, ``{src}``: a folder outside it with a DLLogger
#: raport and a copied run folder, ``{url}``: an HTTP collector)
COMMANDS: dict[str, list[str]] = {
    "import-log": ["import", "{src}/raport.json", "--matrix", "imp", "--param", "hardware=v100",
                   "--warmup", "2"],
    "import-run-folder": ["import", "{src}/copy", "--run-id", "20260110-000000-copy"],
    "export-out": ["export", "m", "--out", "{R}/export.csv"],
    "export-stdout": ["export", "m"],
    "report": ["report", "m", "--run", RUN_B],
    "report-html": ["report", "m", "--run", RUN_B, "--html", "{R}/r.html"],
    "history-plot": ["history", "m", "--plot", "{R}/h.svg"],
    "compare-html": ["compare", f"m:{RUN_A}", f"m:{RUN_B}", "--html", "{R}/c.html"],
    "runs": ["runs"],
    "publish": ["publish", f"m:{RUN_B}", "--http", "{url}"],
}


def _tree(root: Path) -> dict[str, bytes]:
    """Every run folder's files (the matrices' folders), byte for byte."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.startswith((".orchestrate-", ".filler"))
            and stat.S_ISREG(p.lstat().st_mode)}




def _prepare(results: Path, src: Path) -> None:
    from benchmarks.fault_suite import dllogger_raport

    configs = [Config(params(batch_size=b), [100.0 + b, 101.0 + b]) for b in (32, 64)]
    write_run(results, "m", RUN_A, configs, started=1_767_225_600.0)
    write_run(results, "m", RUN_B, configs, started=1_767_312_000.0)
    with open_store(results) as store:  # the index exists and is healthy
        assert len(store.runs()) == 2
    # a run the index has not seen yet: a command brings the index up to date first (writes)
    write_run(results, "m", RUN_C, configs, started=1_767_398_400.0)
    src.mkdir(exist_ok=True)
    (src / "raport.json").write_text(dllogger_raport())
    copy = write_run(src / "made", "c", run_id(9), configs)
    subprocess.run(["cp", "-r", str(copy.root), str(src / "copy")], check=True)


def _index_healthy(results: Path) -> None:
    index = ResultsRoot(results).index
    assert index.is_file() and not list(results.glob(".orchestrate-index.sqlite.damaged-*"))
    with open_store(results) as store:
        assert {r.run_id for r in store.runs(matrix="m")} == {RUN_A, RUN_B, RUN_C}


@pytest.mark.parametrize("fault", ["full", "nearly-full", "read-only"])
@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_full_or_read_only_results_folder(name: str, fault: str, tmp_path: Path,
                                            tmpfs: Callable[..., Any], collector: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    with tmpfs(tmp_path / "disk", size="4m") as results:
        _prepare(results, src)
        before = _tree(results)
        if fault == "read-only":
            subprocess.run(["mount", "-o", "remount,ro", str(results)], check=True)
        else:
            filler = fill(results)
            if fault == "nearly-full":  # room for a rename or two, not for the index's pages
                os.truncate(filler, filler.stat().st_size - 8192)
        argv = [a.replace("{R}", str(results)).replace("{src}", str(src))
                .replace("{url}", collector) for a in COMMANDS[name]]
        code, out, err = run_cli([*argv, "--results", str(results)], capsys, 60)
        shown = f"{name} on a {fault} results folder: exit {code}\n{out[-1500:]}\n{err}"
        assert "Traceback" not in out + err, shown
        assert code in (0, 2), shown
        lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
        if code == 2:
            assert len(lines) == 1 and (
                "No space left" in err or "Read-only file system" in err
                or "read-only" in err), shown
        after = _tree(results)  # what was there is whole; what the command wrote is whole
        assert {k: after.get(k) for k in before} == before, shown
        if fault == "read-only":
            subprocess.run(["mount", "-o", "remount,rw", str(results)], check=True)
        else:
            filler.unlink()
        assert {k: _tree(results).get(k) for k in before} == before
        assert not [p for p in results.rglob("*") if p.name.endswith(".tmp")
                    or p.name.startswith(".import-")], shown
        _index_healthy(results)


@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_the_images_state_on_a_full_or_read_only_disk(fault: str, tmp_path: Path,
                                                      tmpfs: Callable[..., Any]) -> None:
    """What ``images refresh`` and a sweep's image preparation write: an OSError (which they
    report in one line), and the old state whole."""
    from orchestrator.images.state import state_path, update_state

    with tmpfs(tmp_path / "disk", size="1m") as results:
        path = state_path(results)
        update_state(path, lambda s: s.hosts.update({"h": {"driver": "550"}}))
        before = path.read_bytes()
        if fault == "full":
            fill(results)
        else:
            subprocess.run(["mount", "-o", "remount,ro", str(results)], check=True)
        with pytest.raises(OSError):
            update_state(path, lambda s: s.hosts.update({"h": {"driver": "560"}}))
        assert path.read_bytes() == before
        assert [p.name for p in results.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.docker
@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_clean_on_a_full_or_read_only_results_folder(fault: str, tmp_path: Path,
                                                     tmpfs: Callable[..., Any],
                                                     capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    """``clean --run MATRIX:RUN`` resolves the run in the index (the one file it writes under
    the results folder), then asks the Docker engine for its containers (none)."""
    with tmpfs(tmp_path / "disk", size="4m") as results:
        _prepare(results, tmp_path / "src")
        before = _tree(results)
        if fault == "full":
            filler = fill(results)
        else:
            subprocess.run(["mount", "-o", "remount,ro", str(results)], check=True)
        code, out, err = run_cli(["clean", "--run", f"m:{RUN_B}", "--dry-run", "--results",
                               str(results)], capsys)
        assert code == 0 and "Traceback" not in err and "nothing to remove" in out, (out, err)
        assert _tree(results) == before
        if fault == "full":
            assert "cannot hold the index (" in err, err
            filler.unlink()
        else:
            subprocess.run(["mount", "-o", "remount,rw", str(results)], check=True)
        _index_healthy(results)


@pytest.mark.parametrize("message", ["database or disk is full", "disk I/O error"])
def test_a_full_disk_is_never_taken_for_a_damaged_index(message: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """What SQLite says when the disk fills under an index being brought up to date
    (SQLITE_FULL, or SQLITE_IOERR as the WAL cannot grow), made to happen here by the index's
    refresh (a real full disk gives the same messages: the tests above): the index is not
    moved aside as damaged (and rebuilt, losing nothing but time, on a disk with no room for
    it); the command goes on with an index elsewhere."""
    import sqlite3

    from orchestrator.results.folders import store as store_module

    results = tmp_path / "results"
    write_run(results, "m", RUN_A, [Config(params(), [1.0])])
    with open_store(results):
        pass
    index = ResultsRoot(results).index
    before = index.read_bytes()
    original = store_module.Store.refresh
    calls = []

    def full(self: Any, *args: Any, **kwargs: Any) -> int:
        calls.append(self.location)
        if self.location == str(index):
            raise sqlite3.OperationalError(message)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(store_module.Store, "refresh", full)
    with open_store(results) as store:
        assert store.location != str(index) and [r.run_id for r in store.runs()] == [RUN_A]
    assert index.read_bytes() == before
    assert not list(results.glob("*.damaged-*")) and calls[0] == str(index)
