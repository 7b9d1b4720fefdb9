"""Issue 34, item 2: every file the project writes under a results folder is written without
following a link, never opens a FIFO or a device, and is replaced atomically.

A shared results folder (or a copied run folder) may hold anything at the paths a command
writes. Here, for every command that writes (``report``, ``report --html``, ``report --plot``,
``history --plot``, ``export``, ``import``, ``compare --html``, ``publish``, ``runs``; the sweep
itself and ``clean`` in the integration tests at the end; the images' state at its one writer),
a symbolic link to a file outside the results folder, then a FIFO, are planted at every path
the command writes: the paths of :class:`~orchestrator.results.folders.run_folder.RunPaths` and
:class:`~orchestrator.results.folders.run_folder.ResultsRoot` (``WRITTEN``,
``CELL_WRITTEN``, the index, the import lock), and the files the user names. The command runs
in-process under a 30 s alarm (nothing may block) and then: the file the link points to is
unchanged and nothing else outside the results folder changed; the command exited 0 with every
planted path now a regular file (replaced, not written through), or 2 with one line naming
what it refused; never a traceback.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_support import ok_collector, run_cli
from results_support import Config, params, run_id, write_run

from orchestrator.results.folders import folder_lock
from orchestrator.results.folders.run_folder import (
    ResultsRoot,
    RunPaths,
    make_folder,
    open_stream,
    replacing,
    write_file,
    write_json,
)

ROOT = Path(__file__).resolve().parents[1]
RUN_A, RUN_B = run_id(1), run_id(2)
IMPORTED = "20260105-000000-imp1"
VICTIM_TEXT = "precious: must not change\n"


@dataclass(frozen=True)
class Command:
    """A command line and the paths it writes (``{R}``: the results folder)."""

    name: str
    argv: tuple[str, ...]
    #: paths under the results folder it writes, relative to it
    writes: tuple[str, ...]
    #: exit status with everything planted (2: it refuses, naming what)
    expect: int = 0


def _run_file(name: str, run: str = RUN_B) -> str:
    return f"m/{run}/{name}"


INDEX = ResultsRoot.INDEX
COMMANDS = [
    Command("report", ("report", "m", "--run", RUN_B),
            (_run_file(RunPaths.SUMMARY_CSV), _run_file(RunPaths.SUMMARY_TXT))),
    Command("report-html", ("report", "m", "--run", RUN_B, "--html", "{R}/m/report.html"),
            (_run_file(RunPaths.SUMMARY_CSV), _run_file(RunPaths.SUMMARY_TXT),
             "m/report.html")),
    Command("report-plot", ("report", "m", "--run", RUN_B, "--plot",
                            "{R}/" + _run_file(RunPaths.SUMMARY_PNG)),
            (_run_file(RunPaths.SUMMARY_CSV), _run_file(RunPaths.SUMMARY_TXT),
             _run_file(RunPaths.SUMMARY_PNG))),
    Command("history-plot", ("history", "m", "--plot", "{R}/history.svg"),
            (INDEX, "history.svg")),
    Command("export", ("export", "m", "--out", "{R}/export.csv"), (INDEX, "export.csv")),
    Command("export-json", ("export", "m", "--format", "json", "--out", "{R}/export.json"),
            (INDEX, "export.json")),
    Command("compare-html", ("compare", f"m:{RUN_A}", f"m:{RUN_B}", "--html",
                             "{R}/compare.html"), (INDEX, "compare.html")),
    Command("runs", ("runs",), (INDEX,)),
    Command("import", ("import", "{raport}", "--matrix", "imp", "--param", "hardware=v100",
                       "--run-id", IMPORTED),
            (f"imp/{ResultsRoot.IMPORT_LOCK}",)),
    Command("import-over-a-run-folder", ("import", "{raport}", "--matrix", "imp", "--param",
                                         "hardware=v100", "--run-id", IMPORTED),
            (f"imp/{IMPORTED}",), expect=2),
    Command("publish", ("publish", f"m:{RUN_B}", "--http", "{url}"),
            (_run_file(RunPaths.PUBLISHED),)),
]



@pytest.fixture(scope="module")
def collector() -> Iterator[str]:
    with ok_collector() as url:
        yield url


def _results(tmp: Path) -> Path:
    results = tmp / "results"
    configs = [Config(params(batch_size=b), [100.0 + b]) for b in (32, 64)]
    write_run(results, "m", RUN_A, configs, started=1_767_225_600.0)
    write_run(results, "m", RUN_B, configs, started=1_767_312_000.0)
    (results / "imp").mkdir()
    return results


def _victim(tmp: Path) -> Path:
    victim = tmp / "outside" / "victim.txt"
    victim.parent.mkdir(exist_ok=True)
    victim.write_text(VICTIM_TEXT)
    return victim


def plant(path: Path, kind: str, victim: Path) -> None:
    """A symbolic link to ``victim`` (to its folder where a folder belongs), or a FIFO."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "link":
        path.symlink_to(victim.parent if "." not in path.name.lstrip(".") else victim)
    else:
        os.mkfifo(path)


def _snapshot(folder: Path) -> dict[str, tuple[int, int, bytes]]:
    out = {}
    for path in sorted(folder.rglob("*")):
        st = path.lstat()
        data = path.read_bytes() if stat.S_ISREG(st.st_mode) else b""
        out[str(path.relative_to(folder))] = (st.st_mode, st.st_size, data)
    return out




@pytest.mark.parametrize("kind", ["link", "fifo"])
@pytest.mark.parametrize("command", COMMANDS, ids=[c.name for c in COMMANDS])
def test_a_link_or_fifo_at_every_path_a_command_writes(command: Command, kind: str,
                                                         tmp_path: Path, collector: str,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    from benchmarks.fault_suite import dllogger_raport

    results = _results(tmp_path)
    raport = tmp_path / "raport.json"
    raport.write_text(dllogger_raport())
    victim = _victim(tmp_path)
    for rel in command.writes:
        plant(results / rel, kind, victim)
    outside = _snapshot(tmp_path / "outside")
    argv = [a.replace("{R}", str(results)).replace("{raport}", str(raport))
            .replace("{url}", collector) for a in command.argv] + ["--results", str(results)]
    code, out, err = run_cli(argv, capsys)
    shown = f"{command.name} ({kind}): exit {code}\n{out[-1500:]}\n{err}"
    assert "Traceback" not in out + err, shown
    assert code == command.expect, shown
    assert victim.read_text() == VICTIM_TEXT, shown
    assert _snapshot(tmp_path / "outside") == outside, shown
    if code == 0:
        for rel in command.writes:
            if rel.endswith(".lock") and not (results / rel).is_symlink():
                assert not (results / rel).exists()  # taken afresh, removed on release
                continue
            mode = (results / rel).lstat().st_mode
            assert stat.S_ISREG(mode), f"{rel} is not a regular file after {command.name}"
    else:
        assert len(err.strip().splitlines()) == 1 and "error:" in err, shown


def test_every_path_the_project_writes_is_planted_by_some_case() -> None:
    """The paths come from RunPaths / ResultsRoot: a file added there without a case here
    fails."""
    planted = {Path(rel).name for c in COMMANDS for rel in c.writes}
    planted |= set(SWEEP_PLANTED) | {ResultsRoot.IMAGES_STATE, ResultsRoot.IMAGES_LOCK}
    planted |= set(RunPaths.CELL_WRITTEN)  # test_cell_files_through_the_writers below
    wanted = {*RunPaths.WRITTEN, *RunPaths.CELL_WRITTEN, *ResultsRoot.WRITTEN,
              ResultsRoot.IMPORT_LOCK}
    assert wanted <= planted, sorted(wanted - planted)


#: The modules that write files otherwise than through run_folder's writers, and why that is
#: safe. A new ``write_text`` / ``open(..., "w")`` elsewhere fails the test below.
OTHER_WRITERS = {
    "orchestrator/results/folders/run_folder.py": "the writers themselves",
    "orchestrator/catalog/templates.py": "a build context: its own O_EXCL | O_NOFOLLOW writer",
    "orchestrator/images/sif.py": "a tar archive in memory",
    "orchestrator/results/reports/plots.py": "savefig into replacing()'s file or a caller's "
                                              "stream",
    "orchestrator/results/importer/target.py": "a matrix file in a temporary folder of its own",
    "orchestrator/results/importer/run_folders.py": "copies into the import's new hidden "
                                                    "folder (mkdtemp), links and FIFOs left out",
    "orchestrator/results/importer/logs.py": "copies into the import's new hidden folder",
    "orchestrator/remote/connection.py": "the user's known_hosts, not a results folder",
    "orchestrator/local/cell_processes.py": "cgroup control files",
}
_WRITE = re.compile(r"""\.write_text\(|\.write_bytes\(|\.open\(["'][wa]|"""
                    r"""open\([^)]*["'][wa]b?["']|savefig\(|shutil\.copy|copytree\(""")


def test_nothing_else_writes_a_file_its_own_way() -> None:
    found = sorted({str(path.relative_to(ROOT)) for path in (ROOT / "orchestrator").rglob("*.py")
                    if _WRITE.search(path.read_text())})
    assert found == sorted(OTHER_WRITERS), sorted(set(found) ^ set(OTHER_WRITERS))


# --- the writers themselves --------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_the_writers_replace_what_is_planted_and_never_write_through_it(kind: str,
                                                                         tmp_path: Path) -> None:
    """What every command above writes through: write_json, write_file, replacing (a report,
    a plot, an export, metrics.jsonl, a Slurm script). The cell files are written this way
    (command.json, result.json, metrics.jsonl), the log by open_stream."""
    victim = _victim(tmp_path)
    cell = tmp_path / "results" / "m" / RUN_B / "cells" / "c1"
    for name, write in [
        (RunPaths.CELL_RESULT, lambda p: write_json(p, {"ok": True})),
        (RunPaths.CELL_COMMAND, lambda p: write_file(p, "{}\n")),
        (RunPaths.CELL_METRICS, lambda p: _through_replacing(p)),
    ]:
        path = cell / name
        plant(path, kind, victim)
        write(path)
        assert stat.S_ISREG(path.lstat().st_mode) and victim.read_text() == VICTIM_TEXT
        assert [p.name for p in cell.iterdir() if p.name.endswith(".tmp")] == []
    log = cell / RunPaths.CELL_LOG
    plant(log, kind, victim)
    with pytest.raises(OSError):
        open_stream(log)
    assert victim.read_text() == VICTIM_TEXT


def _through_replacing(path: Path) -> None:
    with replacing(path) as fh:
        fh.write('{"type": "iter"}\n')


def test_cell_files_through_the_writers() -> None:
    """(The cell files' own case is the test above; this names it for the coverage test.)"""
    assert set(RunPaths.CELL_WRITTEN) == {RunPaths.CELL_LOG, RunPaths.CELL_COMMAND,
                                          RunPaths.CELL_METRICS, RunPaths.CELL_RESULT}


def test_a_write_that_fails_leaves_the_old_file_whole_and_no_temporary_file(tmp_path: Path
                                                                           ) -> None:
    path = tmp_path / "summary.csv"
    path.write_text("old\n")
    with pytest.raises(RuntimeError), replacing(path) as fh:
        fh.write("new, half")
        raise RuntimeError("a full disk, an interrupt")
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_folder_that_is_a_link_out_is_never_written_into(tmp_path: Path) -> None:
    """``superseded/`` and ``slurm/`` of a run (make_folder), and any file's folder
    (replacing): a link to a folder elsewhere is refused, not followed."""
    victim = _victim(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / RunPaths.SUPERSEDED).symlink_to(victim.parent)
    with pytest.raises(OSError, match="not a folder"):
        RunPaths(run).superseded("c1")
    with pytest.raises(OSError, match="symbolic link"):
        write_file(run / RunPaths.SUPERSEDED / "x.txt", "x")
    with pytest.raises(OSError):
        make_folder(run / RunPaths.SUPERSEDED)
    assert sorted(p.name for p in victim.parent.iterdir()) == [victim.name]


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_lock_files_are_never_opened_through_a_link_or_a_fifo(kind: str, tmp_path: Path
                                                               ) -> None:
    """``<run>/.lock`` and ``<matrix>/.import.lock`` (folder_lock): what is planted there is
    removed (the path is the lock's own), never opened; the lock is taken afresh."""
    victim = _victim(tmp_path)
    lock = tmp_path / "results" / "m" / ResultsRoot.IMPORT_LOCK
    plant(lock, kind, victim)
    assert folder_lock.holder(lock) is None  # only looks: a link or FIFO is nobody's lock
    with folder_lock.acquire(lock):
        assert stat.S_ISREG(lock.lstat().st_mode)
        assert folder_lock.holder(lock)
    assert victim.read_text() == VICTIM_TEXT


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_the_images_state_and_its_lock(kind: str, tmp_path: Path) -> None:
    """What ``images refresh`` and a sweep's image preparation write
    (:func:`orchestrator.images.state.update_state`). A link (to a state file elsewhere) is
    read, and replaced by the new state, not written through; a FIFO is refused as it is read
    (the read guard: one ConfigError naming it); a link or FIFO at its lock is refused (an
    OSError, which the callers report in one line)."""
    from orchestrator.errors import ConfigError
    from orchestrator.images.state import state_path, update_state

    victim = _victim(tmp_path)
    state = '{"hosts": {}, "images": []}\n'
    victim.write_text(state)
    results = tmp_path / "results"
    path = state_path(results)
    plant(path, kind, victim)
    if kind == "link":
        update_state(path, lambda s: s.hosts.update({"h": {"driver": "550"}}))
        assert stat.S_ISREG(path.lstat().st_mode) and "550" in path.read_text()
    else:
        with pytest.raises(ConfigError, match="not a regular file"):
            update_state(path, lambda s: None)
        path.unlink()
    assert victim.read_text() == state
    plant(results / ResultsRoot.IMAGES_LOCK, kind, victim)
    with pytest.raises(OSError):
        update_state(path, lambda s: None)
    assert victim.read_text() == state


# --- the sweep itself and clean (integration) --------------------------------------------------

#: What a ``--resume`` writes into its run folder besides the cells' folders (made afresh):
#: links to copies of the files outside (run.json and plan.json are read first), and FIFOs
#: where the resume does not read first.
SWEEP_PLANTED = (RunPaths.PLAN, RunPaths.RUN_META, RunPaths.SUMMARY_CSV, RunPaths.SUMMARY_TXT,
                 RunPaths.SUMMARY_PNG, RunPaths.MATRIX_FILE, RunPaths.SUPERSEDED, INDEX)


def _cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *argv], cwd=cwd,
                          capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize("kind", ["link", "fifo", "superseded-link"])
def test_a_resumed_sweep_writes_through_nothing_planted_in_its_run(kind: str, tmp_path: Path,
                                                                   write_matrix: Callable[
                                                                       ..., Path],
                                                                   standin) -> None:
    """A sweep whose second cell fails, then ``--resume`` with a link (to an outside copy of
    what was there) or a FIFO at every run-level file it writes, at ``superseded/`` (where the
    failed cell's folder is moved: a link there would carry it out of the results) and at the
    index. The resume must finish the run writing only inside it."""
    path = write_matrix(standin.matrix("safe", timeout_s=60) + """
        [axes]
        seed = [1, 2]
        [[include]]
        seed = 2
        data = "/no/such_dataset"
    """)
    results = tmp_path / "results"
    first = _cli("matrix", str(path), "--results", str(results), cwd=tmp_path)
    assert first.returncode == 1, first.stderr
    (run,) = (results / "safe").iterdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    planted = []
    for name in SWEEP_PLANTED:
        where = results / name if name == INDEX else run / name
        if (kind == "fifo" and name in (RunPaths.PLAN, RunPaths.RUN_META)) or (
                (kind == "superseded-link") != (name == RunPaths.SUPERSEDED)):
            continue  # read first (refused: the read guard's case); superseded/ on its own
        copy = outside / name
        if where.is_file():
            copy.write_bytes(where.read_bytes())
        elif name == RunPaths.SUPERSEDED:
            copy.mkdir()
        else:
            copy.write_text(VICTIM_TEXT)
        if where.exists():
            where.unlink()
        if kind == "fifo":
            os.mkfifo(where)
        else:
            where.symlink_to(copy)
        planted.append(where)
    before = _snapshot(outside)
    resumed = _cli("matrix", str(path), "--results", str(results), "--resume", cwd=tmp_path)
    shown = f"exit {resumed.returncode}\n{resumed.stdout}\n{resumed.stderr}"
    assert "Traceback" not in resumed.stderr, shown
    assert _snapshot(outside) == before, shown
    if kind == "superseded-link":  # refused before anything moves: one line
        assert resumed.returncode == 2 and "not a folder" in resumed.stderr, shown
        assert len(resumed.stderr.strip().splitlines()) == 1, shown
        return
    assert resumed.returncode == 1, shown  # the cell fails again, is recorded
    for where in planted:
        if where.name not in (RunPaths.SUMMARY_PNG, RunPaths.MATRIX_FILE, RunPaths.PLAN):
            assert stat.S_ISREG(where.lstat().st_mode), where  # (the others: not rewritten)
    meta = json.loads((run / RunPaths.RUN_META).read_text())
    assert meta["finished_at"] and len(meta["resumed"]) == 1


@pytest.mark.docker
@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_clean_resolving_a_run_writes_through_nothing_planted(kind: str, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]
                                                              ) -> None:
    """``clean --run MATRIX:RUN`` resolves the run in the results index (which it brings up to
    date: the one file it writes there); then asks the Docker engine for the run's
    containers (none)."""
    results = _results(tmp_path)
    victim = _victim(tmp_path)
    plant(results / INDEX, kind, victim)
    code, out, err = run_cli(["clean", "--run", f"m:{RUN_B}", "--dry-run", "--results",
                              str(results)], capsys)
    assert code == 0 and "Traceback" not in err, (out, err)
    assert "nothing to remove" in out
    assert victim.read_text() == VICTIM_TEXT
    assert stat.S_ISREG((results / INDEX).lstat().st_mode)
