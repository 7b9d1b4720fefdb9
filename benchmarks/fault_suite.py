"""Fault suite: a real small sweep hit by what a shared lab machine does to it, then counted.

Every scenario runs the real CLI (``orchestrate matrix``, process backend, the tiny CPU workload,
``--cells`` cells) in a subprocess, does its damage, repairs it, finishes the run with
``--resume`` where that is the way back, and counts from the run folder alone:

* ``kill9@T``: SIGKILL of the orchestrator T seconds into the sweep (T drawn with ``--seed``
  over the sweep's length), then ``--resume`` (a plain run when it died before its run folder
  existed);
* ``disk-full``: the results folder is a tmpfs, filled up as soon as the first cell is recorded
  and freed once the sweep has ended; then ``--resume``;
* ``read-only-cell``: the folder of the last cell is a read-only tmpfs before it starts;
  unmounted once the sweep has ended; then ``--resume``;
* ``read-only-results``: the results folder is read-only from the start: the sweep must refuse
  at once and write nothing; made writable, the sweep runs;
* ``sighup``: the sweep runs on a pseudo-terminal that is its controlling terminal, which is
  closed while a cell runs (a terminal window or ssh session closed without ``nohup``): the
  kernel sends SIGHUP; then ``--resume``;
* ``concurrent-resume``: the sweep killed (SIGKILL) after its first cell, then two
  ``--resume`` of it started at once: one must finish it, the other be refused;
* ``concurrent-import``: four ``orchestrate import`` of one DLLogger raport at once: one
  run imported, the others refused as already imported;
* ``host-lost``: the ssh backend's test (tests/test_backend_ssh.py::
  test_lost_host_mid_sweep_is_retried_elsewhere: a real sshd killed under a running cell) run
  with pytest; its count line is read (with ``--host-lost``; needs Docker and sshd).

Counted: ``cells`` planned; ``recorded`` cells with a readable result.json that says ok at the
end; ``lost`` planned cells with no result at all; ``duplicated`` results beyond one per cell
(summary rows' run counts over the distinct results); ``silent`` cells of the damaged sweep that
had neither a result on disk nor an error line naming them; ``tracebacks`` in any output;
``left`` processes of the run still alive at the end (or orphaned by the damaged sweep);
``broken`` what else a scenario finds wrong (a run.json left unfinished, a cgroup left behind,
a result overwritten without its copy in ``superseded/``, a false failure: the note says which).
Mounting needs root.

    python benchmarks/fault_suite.py [--seed 1] [--kills 3] [--cells 4] [--host-lost]
    python benchmarks/fault_suite.py --signals 50 [--cells 3] [--parallel 3] [--standin]

``--signals N`` (issue 34): instead of the scenarios above, N sweeps each hit by a sequence of
1 to 4 stop signals (SIGINT, SIGTERM, SIGHUP) at a moment drawn over an undisturbed sweep's
length (``signal_campaign``): each must exit 130 (0 if the signals came after its end) with
every planned cell recorded and run.json finished. ``--standin``: the cells run the stand-in
program of tests/standin instead of the tiny CPU workload (seconds instead of minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import fcntl
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tabulate import tabulate

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import cannot_run, dry_option  # noqa: E402
from orchestrator.local import cell_processes  # noqa: E402

MATRIX = """
[matrix]
name = "faults"
timeout_s = 300
[workload]
hardware = "cpu"
{workload}
[axes]
seed = {seeds}
[hardware.cpu]
device = "cpu"
{tables}
"""

#: The cells' parameters: the tiny CPU workload (``iterations`` filled in).
WORKLOAD = """\
arch = "resnet18"
image_size = 32
batch_size = 2
warmup = 1
iterations = {iterations}
workers = 0
num_classes = 10
"""


@dataclass
class Count:
    """One scenario's figures."""

    scenario: str
    cells: int = 0
    recorded: int = 0
    lost: int = 0
    duplicated: int = 0
    silent: int = 0
    tracebacks: int = 0
    left: int = 0
    #: what else the scenario found wrong: a run.json left unfinished, a cgroup left behind, a
    #: result overwritten without a copy in superseded/, a false failure (see its note)
    broken: int = 0
    exit_codes: list[int] = field(default_factory=list)
    note: str = ""

    @property
    def clean(self) -> bool:
        """All cells recorded, none lost, duplicated or silent, no traceback, nothing left."""
        return (self.recorded == self.cells and self.lost == self.duplicated == self.silent
                == self.tracebacks == self.left == self.broken == 0 and self.cells > 0)


class Suite:
    """The scenarios over one working folder."""

    def __init__(self, work: Path, cells: int, iterations: int = 2, workload: str | None = None,
                 tables: str = ""):
        self.work = work
        self.cells = cells
        self.matrix = work / "faults.toml"
        body = WORKLOAD.format(iterations=iterations) if workload is None else workload
        self.matrix.write_text(MATRIX.format(workload=body, tables=tables,
                                             seeds=list(range(1, cells + 1))))
        self.locks = work / "locks"

    # --- running the CLI ---------------------------------------------------------------------

    def start(self, results: Path, *extra: str, locks: Path | None = None
              ) -> subprocess.Popen[str]:
        env = {**os.environ, "ORCHESTRATE_LOCK_DIR": str(locks or self.locks),
               "PYTHONPATH": str(REPO)}
        return subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "matrix", str(self.matrix), "--results",
             str(results), *extra], cwd=REPO, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)

    def run(self, results: Path, *extra: str, count: Count) -> str:
        return self.wait(self.start(results, *extra), count)

    @staticmethod
    def wait(proc: subprocess.Popen[str], count: Count) -> str:
        """Wait for a started sweep, count its exit code and tracebacks; its stderr."""
        out, err = proc.communicate(timeout=900)
        count.exit_codes.append(proc.returncode)
        count.tracebacks += (out + err).count("Traceback")
        return err

    def finish(self, results: Path, count: Count) -> None:
        """``--resume`` until the run is complete (at most 3 times); a plain run if there is no
        run folder yet."""
        for _ in range(3):
            resume = ("--resume",) if list(results.glob("faults/*/plan.json")) else ()
            self.run(results, *resume, count=count)
            if count.exit_codes[-1] == 0:
                return

    # --- counting ----------------------------------------------------------------------------

    @staticmethod
    def planned(results: Path) -> tuple[int, Path, list[str]]:
        """How many run folders there are, and the last one's folder and planned cell ids."""
        runs = sorted(results.glob("faults/*/plan.json"))
        if not runs:
            return 0, results, []
        return len(runs), runs[-1].parent, [c["id"] for c in
                                            json.loads(runs[-1].read_text())["cells"]]

    def tally(self, results: Path, count: Count) -> Count:
        folders, root, planned = self.planned(results)
        if folders != 1:
            count.note += f" {folders} run folders;"
            if not folders:
                count.cells, count.lost = self.cells, self.cells
                return count
        count.cells = len(planned)
        found: dict[str, str] = {}
        for path in (root / "cells").glob("*/result.json"):
            try:
                found[path.parent.name] = json.loads(path.read_text())["status"]
            except (OSError, ValueError, KeyError):
                found[path.parent.name] = "unreadable"
        count.recorded = sum(1 for c in planned if found.get(c) == "ok")
        count.lost = sum(1 for c in planned if c not in found)
        summary = root / "summary.csv"
        if summary.exists():
            runs_in_table = sum(int(row["runs"]) for row in csv.DictReader(summary.open()))
            count.duplicated += max(0, runs_in_table - len(found))
        prefix = cell_processes.run_marker_prefix("faults", root.name)
        count.left += len(cell_processes.alive(cell_processes.marked_pids(prefix, prefix=True)))
        return count

    def silent(self, results: Path, stderr: str) -> int:
        """Cells of a damaged sweep with neither a result on disk nor an error naming them."""
        folders, root, planned = self.planned(results)
        if not folders:
            return 0
        reported = set(re.findall(r"cell (\S+) \(\w+\): its result could not be written",
                                  stderr))
        return sum(1 for c in planned
                   if not (root / "cells" / c / "result.json").exists() and c not in reported)

    # --- scenarios ---------------------------------------------------------------------------

    def kill9(self, after_s: float) -> Count:
        results = self.work / f"kill9-{after_s:.1f}"
        count = Count(f"kill9@{after_s:.1f}s")
        proc = self.start(results)
        time.sleep(after_s)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        count.exit_codes.append(proc.returncode)
        done = len(list(results.glob("faults/*/cells/*/result.json")))
        count.note = (f"killed with {done} results on disk; resumed"
                      if list(results.glob("faults/*/plan.json"))
                      else "killed before its run folder existed; run again")
        self.finish(results, count)
        return self.tally(results, count)

    def disk_full(self) -> Count:
        count = Count("disk-full")
        with tmpfs(self.work / "full", "16m") as results:
            filler = results / ".filler"
            proc = self.start(results)
            wait_for(lambda: bool(list(results.glob("faults/*/cells/*/result.json"))), proc)
            fill(filler)
            err = self.wait(proc, count)
            count.silent = self.silent(results, err)
            count.note = f"damaged sweep: {err.count('No space left on device')} ENOSPC errors"
            filler.unlink()
            self.finish(results, count)
            return self.tally(results, count)

    def read_only_cell(self) -> Count:
        count = Count("read-only-cell")
        results = self.work / "ro-cell"
        last = self.planned_ids()[-1]
        proc = self.start(results)
        wait_for(lambda: bool(list(results.glob("faults/*/cells"))), proc)
        (cells,) = results.glob("faults/*/cells")
        with tmpfs(cells / last, "64k", read_only=True):
            err = self.wait(proc, count)
            count.silent = self.silent(results, err)
            count.note = f"damaged sweep: {err.count('Read-only file system')} EROFS errors"
        (cells / last).rmdir()
        self.finish(results, count)
        return self.tally(results, count)

    def read_only_results(self) -> Count:
        count = Count("read-only-results")
        with tmpfs(self.work / "ro", "1m", read_only=True) as results:
            err = self.run(results, count=count)
            refused = count.exit_codes[-1] == 2 and "cannot create the run folder" in err
            written = [p for p in results.rglob("*")]
            count.note = ("refused at once, nothing written" if refused and not written
                          else f"NOT refused cleanly: {err.strip()[-200:]}")
            subprocess.run(["mount", "-o", "remount,rw", str(results)], check=True)
            self.finish(results, count)
            return self.tally(results, count)

    def host_lost(self) -> Count:
        count = Count("host-lost")
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
             "tests/test_backend_ssh.py::test_lost_host_mid_sweep_is_retried_elsewhere"],
            cwd=REPO, capture_output=True, text=True, timeout=900,
            env={**os.environ, "PYTHONPATH": str(REPO)})
        count.exit_codes.append(proc.returncode)
        match = re.search(r"fault suite: host lost: cells=(\d+) recorded=(\d+) lost=(\d+) "
                          r"duplicated=(\d+)", proc.stdout)
        if match is None:
            count.note = "not run: " + (proc.stdout.strip().splitlines() or ["?"])[-1]
            return count
        count.cells, count.recorded, count.lost, count.duplicated = map(int, match.groups())
        count.note = "tests/test_backend_ssh.py (a real sshd killed mid-cell)"
        return count

    def hangup(self) -> Count:
        """SIGHUP: the sweep's terminal closes under it (an ssh session or a terminal window
        closed without nohup). The sweep must stop as on SIGTERM: its running cell stopped and
        recorded, no process of it left, run.json finished, the cell's cgroup removed."""
        count = Count("sighup")
        results = self.work / "sighup"
        terminal = Terminal()
        env = {**os.environ, "ORCHESTRATE_LOCK_DIR": str(self.locks), "PYTHONPATH": str(REPO)}
        proc = terminal.start([sys.executable, "-m", "orchestrator", "matrix", str(self.matrix),
                               "--results", str(results)], env)
        wait_for(lambda: bool(list(results.glob("faults/*/cells/*/log.txt"))), proc)
        time.sleep(0.5)  # the cell's program is running
        terminal.hang_up()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            count.note += " did not end within 120 s of the hangup (a hang);"
            count.broken += 1
            proc.wait()
        count.exit_codes.append(proc.returncode)
        count.tracebacks += terminal.text().count("Traceback")
        folders, root, _ = self.planned(results)
        if folders:
            prefix = cell_processes.run_marker_prefix("faults", root.name)
            orphans = cell_processes.alive(cell_processes.marked_pids(prefix, prefix=True))
            if orphans:
                count.left += len(orphans)
                count.note += f" {len(orphans)} cell processes orphaned;"
                cell_processes.kill_marked(prefix, prefix=True)
            meta = json.loads((root / "run.json").read_text())
            if meta.get("finished_at") is None:
                count.broken += 1
                count.note += " run.json not finished;"
            if cell_processes.run_cgroups(root.name):
                count.broken += 1
                count.note += " the cell's cgroup left behind;"
            done = len(list(root.glob("cells/*/result.json")))
            count.note += f" stopped with {done} results on disk; resumed"
        self.finish(results, count)
        return self.tally(results, count)

    def concurrent_resume(self) -> Count:
        """Two ``--resume`` of one run at once (two people, or cron and a person, finishing a
        nightly that died): one finishes the run, the other is refused naming the holder; no
        cell runs twice, no live cell is stopped by the other's clean-up."""
        count = Count("concurrent-resume")
        results = self.work / "two-resumes"
        proc = self.start(results)
        wait_for(lambda: len(list(results.glob("faults/*/cells/*/result.json"))) >= 1, proc)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        count.exit_codes.append(proc.returncode)
        _, root, _ = self.planned(results)
        before = workload_starts(root)
        on_disk = len(list(root.glob("cells/*/result.json")))
        first = self.start(results, "--resume")
        wait_for(lambda: workload_starts(root) != before, first)  # its first cell runs
        second = self.start(results, "--resume")
        err2 = self.wait(second, count)
        self.wait(first, count)
        refused = count.exit_codes[-2] == 2 and "is in use by another sweep" in err2
        if not refused:
            count.broken += 1
            count.note += f" the second --resume was not refused (exit {count.exit_codes[-2]});"
        if count.exit_codes[-1] != 0:
            count.broken += 1
            count.note += f" the first --resume failed (exit {count.exit_codes[-1]});"
        after = workload_starts(root)
        ran = {c: after.get(c, 0) - before.get(c, 0) for c in after}
        count.duplicated += sum(max(0, n - 1) for n in ran.values())
        count.note += (f" killed with {on_disk} results on disk; the second --resume "
                       + ("refused naming the holder" if refused else "NOT refused"))
        self.finish(results, count)
        return self.tally(results, count)

    def concurrent_import(self, parallel: int = 4) -> Count:
        """``parallel`` imports of one DLLogger raport into one results folder at once (a
        script run twice, two people): one run is imported, the others are refused as already
        imported; none duplicates it, and nothing half-written stays."""
        count = Count("concurrent-import")
        results = self.work / "imports"
        raport = self.work / "raport.json"
        raport.write_text(dllogger_raport())
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        procs = [subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "import", str(raport), "--matrix", "imported",
             "--param", "hardware=v100", "--results", str(results)], cwd=REPO, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(parallel)]
        errors = [self.wait(proc, count) for proc in procs]
        runs = sorted(results.glob("imported/*/plan.json"))
        count.cells = 1
        count.recorded = sum(1 for run in runs
                             if json.loads(next(run.parent.glob("cells/*/result.json"))
                                           .read_text())["status"] == "ok")
        count.recorded = min(count.recorded, 1)
        count.lost = 0 if runs else 1
        count.duplicated = max(0, len(runs) - 1)
        refused = sum(1 for code, err in zip(count.exit_codes, errors, strict=True)
                      if code == 2 and "already imported into imported" in err)
        if sorted(count.exit_codes) != [0] + [2] * (parallel - 1) or refused != parallel - 1:
            count.broken += 1
        leftovers = [p.name for p in (results / "imported").iterdir()
                     if p.name.startswith(".")] if (results / "imported").is_dir() else []
        count.broken += len(leftovers)
        count.note = (f"{parallel} imports at once: {len(runs)} run folders, {refused} refused "
                      "as already imported" + (f"; left: {leftovers}" if leftovers else ""))
        return count

    def stop_signals(self, index: int, anchor: str, offset_s: float,
                     sequence: Sequence[tuple[float, int]]) -> Count:
        """A sequence of stop signals (SIGINT, SIGTERM, SIGHUP in any order and number, a gap
        before each) sent ``offset_s`` seconds after the ``anchor``: ``start`` (the
        orchestrator's first line), ``run`` (its run folder's run.json exists): while it
        starts, opens its run folder, runs or records a cell, stops, writes its table. It must
        stop once:
        exit 130, every planned cell with a readable result, ``run.json`` finished, no process
        of it left, no traceback (or, with signals that came after its end, exit 0 with the
        run complete). No ``--resume`` follows: ``recorded`` counts results of any status."""
        shown = "+".join(f"{signal.Signals(sig).name[3:]}" for _, sig in sequence)
        count = Count(f"signals#{index}")
        results = self.work / f"signals-{index}"
        proc = self.start(results, locks=self.work / f"signal-locks-{index}")
        catches(proc.pid, signal.SIGTERM)  # the offset runs from the first line of ours
        if anchor == "run":
            with contextlib.suppress(RuntimeError):  # it ended first: signals after its end
                wait_for(lambda: bool(list(results.glob("faults/*/run.json"))), proc, 120)
        time.sleep(offset_s)
        ended_first = proc.poll() is not None
        for gap, sig in sequence:
            time.sleep(gap)
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            count.broken += 1
            count.note += " did not end within 120 s of the signals (a hang);"
        count.exit_codes.append(proc.returncode)
        count.tracebacks += (out + err).count("Traceback")
        if "Traceback" in out + err:
            (self.work / f"signals-{index}.err").write_text(out + err)
        folders, root, planned = self.planned(results)
        count.cells = len(planned)
        found: dict[str, str] = {}
        for path in (root / "cells").glob("*/result.json") if folders else []:
            try:
                found[path.parent.name] = json.loads(path.read_text())["status"]
            except (OSError, ValueError, KeyError):
                found[path.parent.name] = "unreadable"
        count.recorded = sum(1 for c in planned if found.get(c, "unreadable") != "unreadable")
        count.lost = sum(1 for c in planned if c not in found)
        unreadable = sum(1 for c in planned if found.get(c) == "unreadable")
        if unreadable:
            count.broken += unreadable
            count.note += f" {unreadable} unreadable results;"
        complete = bool(folders) and count.recorded == count.cells
        meta: dict[str, Any] = {}
        if folders:
            try:
                meta = json.loads((root / "run.json").read_text())
            except (OSError, ValueError):
                meta = {}
            if not meta.get("finished_at"):
                count.broken += 1
                count.note += " run.json not finished;"
            summary = root / "summary.csv"
            if summary.exists():
                runs_in_table = sum(int(row["runs"]) for row in csv.DictReader(summary.open()))
                count.duplicated += max(0, runs_in_table - len(found))
            prefix = cell_processes.run_marker_prefix("faults", root.name)
            orphans = cell_processes.alive(cell_processes.marked_pids(prefix, prefix=True))
            if orphans:
                count.left += len(orphans)
                cell_processes.kill_marked(prefix, prefix=True)
        after_end = (proc.returncode == 0 and complete and not meta.get("interrupted")
                     and set(found.values()) == {"ok"})
        if proc.returncode != 130 and not after_end:
            count.broken += 1
            last = (err.strip().splitlines() or [""])[-1][-120:]
            count.note += f" exit {proc.returncode} ({last});"
        where = ("after its end" if after_end or ended_first else
                 "before its run folder existed" if not folders else
                 f"{sum(1 for v in found.values() if v == 'ok')} ok")
        count.note = f"{shown} at {anchor}+{offset_s:.2f} s: {where};{count.note}".rstrip(";")
        if not folders:  # nothing was planned on disk: nothing could be lost
            count.cells = count.recorded = 0
        return count

    def planned_ids(self) -> list[str]:
        out = subprocess.run([sys.executable, "-m", "orchestrator", "plan", str(self.matrix),
                              "--json"], cwd=REPO, capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
        return [c["id"] for c in json.loads(out)]


def dllogger_raport(iterations: int = 40) -> str:
    """A DLLogger JSON raport as DLE's main.py writes it (PARAMETER, iterations, summary)."""
    def record(when: float, step: object, data: dict[str, object]) -> str:
        return "DLLL " + json.dumps({"timestamp": f"{when}", "type": "LOG", "step": step,
                                     "data": data})

    start = 1767225600.0  # 2026-01-01
    lines = [record(start, "PARAMETER", {"arch": "resnet50", "batch_size": 64,
                                         "world_size": 1, "amp": True})]
    lines += [record(start + i, [0, i], {"train.total_ips": 1000.0 + i,
                                         "train.data_time": 0.01, "train.compute_time": 0.05})
              for i in range(1, iterations + 1)]
    lines.append(record(start + iterations + 1, [], {"train.total_ips": 1020.0}))
    return "\n".join(lines) + "\n"


def workload_starts(root: Path) -> dict[str, int]:
    """How many times each cell's workload started in run ``root`` (its ``meta`` lines in the
    logs of the cell's folder and of its archived attempts in ``superseded/``)."""
    starts: dict[str, int] = {}
    logs = [*root.glob("cells/*/log.txt"), *root.glob("superseded/*/log.txt")]
    for log in logs:
        folder = log.parent
        cell = folder.name if folder.parent.name == "cells" else folder.name.rsplit("-", 1)[0]
        text = log.read_text(errors="replace")
        starts[cell] = starts.get(cell, 0) + text.count('"type": "meta"')
    return starts


class Terminal:
    """A pseudo-terminal that is a process's controlling terminal, and can be closed under it
    (what closing a terminal window or losing an ssh session does: the kernel sends SIGHUP)."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        self.chunks: list[bytes] = []
        self.closing = threading.Event()
        self.reader = threading.Thread(target=self._drain, daemon=True)

    def start(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=self.slave, stdout=self.slave,
                                stderr=self.slave, start_new_session=True,
                                preexec_fn=_take_terminal)
        os.close(self.slave)
        self.reader.start()
        return proc

    def _drain(self) -> None:
        import select

        while not self.closing.is_set():
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                try:
                    self.chunks.append(os.read(self.master, 65536))
                except OSError:
                    break
        os.close(self.master)

    def hang_up(self) -> None:
        """Close the terminal (its reader closes the master side)."""
        self.closing.set()
        self.reader.join(timeout=10)

    def text(self) -> str:
        return b"".join(self.chunks).decode(errors="replace")


def _take_terminal() -> None:
    """In the child, a session leader: make stdin's terminal the controlling one."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen[Any],
             timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the sweep ended (or hung) before the fault could be made")
        time.sleep(0.05)


@contextmanager
def tmpfs(path: Path, size: str, read_only: bool = False) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "fault-suite", str(path)],
                   check=True, capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(path: Path) -> None:
    with path.open("ab", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
        except OSError:
            pass


def kill_points(seed: int, kills: int, span_s: float) -> list[float]:
    """``kills`` moments (seconds into a sweep) drawn with ``seed`` over ``span_s``."""
    rng = random.Random(seed)
    return sorted(round(rng.uniform(0.5, span_s), 1) for _ in range(kills))


#: The signals that stop a sweep, any of them, in any order and number.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def catches(pid: int, sig: int, timeout_s: float = 30.0) -> None:
    """Wait until process ``pid`` has a handler of its own for ``sig`` (``SigCgt`` in its
    /proc status): the orchestrator's first lines, after Python's own start-up (tens of ms,
    seconds on a loaded machine), during which a signal takes its default action before any
    code of ours runs or any file is written."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return
        mask = re.search(r"^SigCgt:\s*([0-9a-f]+)", status, re.MULTILINE)
        if mask and int(mask.group(1), 16) & (1 << (sig - 1)):
            return
        time.sleep(0.005)


Sequence_ = tuple[str, float, tuple[tuple[float, int], ...]]


def signal_sequences(seed: int, runs: int, start_s: float, run_s: float) -> list[Sequence_]:
    """``runs`` stop-signal sequences drawn with ``seed``: when the first is sent, a third of
    them over ``start_s`` after the orchestrator's own code started (:func:`catches`: loading,
    checking, opening the run folder), the others over ``run_s`` after its run folder exists
    (cells running, recorded, stopped; the table written); then 1 to 4 signals, each after a
    gap of 0 to 0.3 s."""
    rng = random.Random(seed)
    out = []
    for _ in range(runs):
        anchor = "start" if rng.random() < 1 / 3 else "run"
        offset = round(rng.uniform(0.0, start_s if anchor == "start" else run_s), 2)
        signals = tuple((0.0 if i == 0 else round(rng.uniform(0.0, 0.3), 2),
                         int(rng.choice(STOP_SIGNALS))) for i in range(rng.randint(1, 4)))
        out.append((anchor, offset, signals))
    return out


def signal_campaign(work: Path, *, seed: int = 1, runs: int = 50, cells: int = 3,
                    parallel: int = 3, workload: str | None = None, tables: str = ""
                    ) -> tuple[list[Count], float]:
    """``runs`` sweeps of ``cells`` cells, each hit by a stop-signal sequence
    (:func:`signal_sequences`, over the length of an undisturbed sweep, measured first),
    ``parallel`` at a time (each with its own GPU-lock folder); the counts and that length."""
    suite = Suite(work, cells, workload=workload, tables=tables)
    calm = Count("undisturbed")
    proc = suite.start(work / "calm")
    catches(proc.pid, signal.SIGTERM)
    started = time.monotonic()
    wait_for(lambda: bool(list((work / "calm").glob("faults/*/run.json"))), proc, 120)
    opened = time.monotonic()
    suite.wait(proc, calm)
    ended = time.monotonic()
    plan = signal_sequences(seed, runs, ended - started, ended - opened)
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        counts = list(pool.map(lambda item: suite.stop_signals(item[0], *item[1]),
                               enumerate(plan, start=1)))
    return counts, ended - started


def signal_table(counts: list[Count], span_s: float) -> str:
    """The campaign in one line per sweep, and its totals."""
    rows = [[c.scenario, c.cells, c.recorded, c.lost, c.duplicated, c.tracebacks, c.left,
             c.broken, " ".join(map(str, c.exit_codes)), c.note] for c in counts]
    totals = [sum(getattr(c, k) for c in counts)
              for k in ("cells", "recorded", "lost", "duplicated", "tracebacks", "left",
                        "broken")]
    rows.append(["total", *totals, "", f"{len(counts)} sweeps; an undisturbed one takes "
                 f"{span_s:.1f} s"])
    return tabulate(rows, headers=["sweep", "cells", "recorded", "lost", "duplicated",
                                   "tracebacks", "left", "broken", "exit", "signals at"])


def run_suite(work: Path, *, seed: int = 1, kills: int = 3, cells: int = 4,
              host_lost: bool = False, span_s: float | None = None,
              workload: str | None = None, tables: str = "") -> list[Count]:
    """Every scenario; the figures of each. ``workload``: the cells' ``[workload]`` keys
    instead of the tiny CPU workload's, ``tables``: more tables of the matrix (the test suite
    runs a stand-in program through a ``[commands.NAME]`` table)."""
    suite = Suite(work, cells, workload=workload, tables=tables)
    span = span_s if span_s is not None else 6.0 * cells
    counts = [suite.kill9(t) for t in kill_points(seed, kills, span)]
    counts += [suite.disk_full(), suite.read_only_cell(), suite.read_only_results(),
               suite.hangup(), suite.concurrent_resume(), suite.concurrent_import()]
    if host_lost:
        counts.append(suite.host_lost())
    return counts


def table(counts: list[Count]) -> str:
    rows = [[c.scenario, c.cells, c.recorded, c.lost, c.duplicated, c.silent, c.tracebacks,
             c.left, c.broken, " ".join(map(str, c.exit_codes)), c.note.strip()]
            for c in counts]
    total = [sum(getattr(c, k) for c in counts)
             for k in ("cells", "recorded", "lost", "duplicated", "silent", "tracebacks", "left",
                       "broken")]
    rows.append(["total", *total, "", ""])
    return tabulate(rows, headers=["scenario", "cells", "recorded", "lost", "duplicated",
                                   "silent", "tracebacks", "left", "broken", "exit codes",
                                   "note"])


def standin_tables() -> tuple[str, str]:
    """The ``[workload]`` keys and the ``[commands.standin]`` table of cells that run the
    stand-in program (tests/standin/, what the test suite runs), each iteration 0.1 s."""
    sys.path.insert(0, str(REPO / "tests"))
    from standin_support import STANDIN_WORKLOAD, Standin  # type: ignore[import-not-found]

    return STANDIN_WORKLOAD, Standin().command("--standin-step-s=0.1")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kills", type=int, default=3, help="kill -9 points (default 3)")
    parser.add_argument("--cells", type=int, default=4, help="cells per sweep (default 4)")
    parser.add_argument("--host-lost", action="store_true",
                        help="also run the ssh backend's lost-host test (Docker, sshd)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--signals", type=int, default=0, metavar="N",
                        help="instead: N sweeps hit by stop-signal sequences at random moments")
    parser.add_argument("--parallel", type=int, default=3,
                        help="--signals: sweeps at a time (default 3)")
    parser.add_argument("--standin", action="store_true",
                        help="the cells run the stand-in of tests/standin (no torch: a cell "
                        "takes a fraction of a second) instead of the tiny CPU workload")
    dry_option(parser, "3 stand-in sweeps of 1 cell hit by stop signals")
    args = parser.parse_args()
    if args.dry:
        args.signals, args.cells, args.standin, args.parallel = 3, 1, True, 3
    workload, tables = standin_tables() if args.standin else (None, "")
    if not args.signals and os.geteuid() != 0:
        return cannot_run("the scenarios mount tmpfs file systems: run as root (--signals N "
                          "needs no root)")
    if args.signals:
        with tempfile.TemporaryDirectory(prefix="fault-suite-") as tmp:
            counts, span = signal_campaign(Path(tmp), seed=args.seed, runs=args.signals,
                                           cells=args.cells, parallel=args.parallel,
                                           workload=workload, tables=tables)
        print(signal_table(counts, span))
        if args.json:
            args.json.write_text(json.dumps([asdict(c) for c in counts], indent=2))
        return 0 if all(c.lost == c.duplicated == c.tracebacks == c.left == c.broken == 0
                        for c in counts) else 1
    with tempfile.TemporaryDirectory(prefix="fault-suite-") as tmp:
        counts = run_suite(Path(tmp), seed=args.seed, kills=args.kills, cells=args.cells,
                           host_lost=args.host_lost, workload=workload, tables=tables)
    print(table(counts))
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in counts], indent=2))
    return 0 if all(c.clean for c in counts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
