"""The commands the docs show, found and run as a reader would run them (issue 31, item 7).

**The convention** (docs/contributing.md, "Documentation"): in ``README.md`` and
``docs/*.md``, a fenced block tagged ``sh`` holds commands a reader types, and they are run:

* each line is one command (a line ending in ``\\`` goes on with the next), run in the order of
  the page in **one shell session per page** (``sh``, from the root of a fresh copy of the
  repository: a block may use what an earlier block of its page made), and must exit 0, or the
  status a trailing ``# exits N`` comment states;
* a block whose first line is ``# not run: <reason>`` is shown, not run (a GPU, a lab host, a
  tracking server, hours): the reason is part of the page;
* a block whose first line is ``# file: <path>`` is the text of a file the repository ships
  (e.g. ``examples/nightly.sh``): it must equal that file, and the file is what runs;
* every other fence (``toml``, ``json``, output) is never run.

Commands written inline (`` `orchestrate report MATRIX` ``) and ``$ orchestrate ...`` lines of
output blocks are checked against the real parser: the command exists and so does every
option they name.

``python tests/docs_support.py`` prints every shell command of the docs with what becomes of it
(run, or not run and why), the table of the issue's closing note; ``--run`` runs them too.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOT_RUN = re.compile(r"^#\s*not run:\s*(?P<why>\S.*)$")
FILE = re.compile(r"^#\s*file:\s*(?P<path>\S+)\s*$")
EXITS = re.compile(r"#.*\bexits (?P<code>\d+)\b")
FENCE = re.compile(r"^```(?P<lang>[A-Za-z0-9_-]*)\s*$")


def pages() -> list[Path]:
    """The README and every page of docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Block:
    """A fenced block of a page."""

    page: str  # relative to the repository
    line: int  # of its opening fence, 1-based
    lang: str
    lines: tuple[str, ...]

    @property
    def not_run(self) -> str | None:
        """Why the block is not run (``# not run: ...``), else None."""
        found = NOT_RUN.match(self.lines[0]) if self.lines else None
        return found.group("why") if found else None

    @property
    def file(self) -> str | None:
        """The shipped file the block shows (``# file: ...``), else None."""
        found = FILE.match(self.lines[0]) if self.lines else None
        return found.group("path") if found else None

    @property
    def runs(self) -> bool:
        return self.lang == "sh" and self.not_run is None and self.file is None


@dataclass(frozen=True)
class Command:
    """One command of a runnable block."""

    page: str
    line: int
    text: str
    expect: int = 0


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``."""
    out: list[Block] = []
    lang: str | None = None
    start, body = 0, []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        fence = FENCE.match(line)
        if lang is None and fence:
            lang, start, body = fence.group("lang"), number, []
        elif lang is not None and line.strip() == "```":
            page = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            out.append(Block(str(page), start, lang, tuple(body)))
            lang = None
        elif lang is not None:
            body.append(line)
    return out


def commands(block: Block) -> list[Command]:
    """The commands of a runnable block: its lines (``\\`` continues one), comments and blank
    lines left out."""
    out: list[Command] = []
    pending: list[str] = []
    first = 0
    for offset, line in enumerate(block.lines, start=1):
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if not pending:
            first = block.line + offset
        if line.rstrip().endswith("\\"):
            pending.append(line.rstrip()[:-1])
            continue
        text = " ".join(part.strip() for part in [*pending, line])
        pending = []
        found = EXITS.search(text)
        out.append(Command(block.page, first, text, int(found.group("code")) if found else 0))
    return out


def page_commands(path: Path) -> list[Command]:
    return [c for b in blocks(path) if b.runs for c in commands(b)]


def cli_parsers() -> dict[str, argparse.ArgumentParser]:
    """The real parser of every command, keyed ``""`` (the top), ``report``, ``images build``."""
    from orchestrator.cli.app import build_parser

    def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}

    top = build_parser()
    found = {"": top}
    for name, sub in subparsers(top).items():
        nested = subparsers(sub)
        found[name] = sub
        found.update({f"{name} {n}": p for n, p in nested.items()})
    return found


# --- running -----------------------------------------------------------------------------------


def copy_repository(dest: Path) -> Path:
    """The files a fresh clone has (tracked, and new files git does not ignore) under ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=ROOT, capture_output=True, check=True)
    for name in listed.stdout.decode().split("\0"):
        source = ROOT / name
        if not name or not source.is_file() or source.is_symlink():
            continue  # deleted in the working tree, or a link
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    return dest


def environment(work: Path, checkout: Path) -> dict[str, str]:
    """A reader's shell: ``orchestrate`` on PATH running the copy's code with this Python, a
    home, config and caches of its own, no ORCHESTRATE_* settings of this machine (but a lock
    folder of its own: a docs sweep neither waits for nor holds up anyone's GPUs)."""
    bin_dir = work / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    shim = bin_dir / "orchestrate"
    shim.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m orchestrator \"$@\"\n")
    shim.chmod(0o755)
    (bin_dir / "python").symlink_to(sys.executable)
    home = work / "home"
    home.mkdir(exist_ok=True)
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(("ORCHESTRATE_", "XDG_", "MLFLOW_")) and k not in (
                "HOME", "PATH", "PYTHONPATH", "VIRTUAL_ENV", "MPLCONFIGDIR")}
    return {**keep, "HOME": str(home), "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
            "PYTHONPATH": str(checkout), "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_CACHE_HOME": str(home / ".cache"), "MPLCONFIGDIR": str(home / ".mpl"),
            "ORCHESTRATE_LOCK_DIR": str(work / "locks"), "PYTHONDONTWRITEBYTECODE": "1"}


def script(cmds: list[Command], out: Path) -> str:
    """A POSIX sh script that runs ``cmds`` in order, each one's output into ``out/N.log`` and
    its exit status into ``out/status`` (``N status``), going on after a failure."""
    parts = ["#!/bin/sh"]
    for n, cmd in enumerate(cmds):
        parts += ["{", cmd.text, f"}} >{shlex.quote(str(out / f'{n}.log'))} 2>&1 </dev/null",
                  f"echo \"{n} $?\" >>{shlex.quote(str(out / 'status'))}"]
    return "\n".join(parts) + "\n"


@dataclass
class Outcome:
    command: Command
    status: int | None  # None: never reached (the page's shell died or timed out)
    output: str
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == self.command.expect


def run_page(path: Path, work: Path, timeout_s: float = 300.0) -> list[Outcome]:
    """Run the page's commands in a fresh copy of the repository under ``work``."""
    cmds = page_commands(path)
    if not cmds:
        return []
    checkout = copy_repository(work / "repo")
    out = work / "out"
    out.mkdir()
    env = environment(work, checkout)
    sh = work / "page.sh"
    sh.write_text(script(cmds, out))
    started = time.monotonic()
    subprocess.run(["sh", str(sh)], cwd=checkout, env=env, timeout=timeout_s,
                   stdin=subprocess.DEVNULL, capture_output=True)
    total = time.monotonic() - started
    statuses = {}
    if (out / "status").exists():
        for line in (out / "status").read_text().splitlines():
            n, code = line.split()
            statuses[int(n)] = int(code)
    outcomes = []
    for n, cmd in enumerate(cmds):
        log = out / f"{n}.log"
        outcomes.append(Outcome(cmd, statuses.get(n), log.read_text(errors="replace")
                                if log.exists() else ""))
    if outcomes:
        outcomes[0].seconds = total  # the page's time, on its first command
    return outcomes


# --- the table ---------------------------------------------------------------------------------


def table(run: bool = False) -> str:
    """Every shell command of the docs and what becomes of it (``run``: run them too)."""
    rows = ["| page | line | command | as written |", "| --- | --- | --- | --- |"]
    for path in pages():
        outcomes: dict[int, Outcome] = {}
        if run:
            with tempfile.TemporaryDirectory() as tmp:
                outcomes = {o.command.line: o for o in run_page(path, Path(tmp))}
        for block in blocks(path):
            if block.lang != "sh":
                continue
            if block.file:
                rows.append(f"| {block.page} | {block.line} | (the text of `{block.file}`) | "
                            "shipped file, equal to the block |")
                continue
            for cmd in commands(block):
                shown = cmd.text.replace("|", "\\|")
                if block.not_run:
                    what = f"not run: {block.not_run}"
                elif cmd.line in outcomes:
                    o = outcomes[cmd.line]
                    what = ("ran" if o.ok else f"FAILED (exit {o.status})") + (
                        f", exit {o.status} as the page says" if o.ok and cmd.expect else "")
                else:
                    what = "runs (tests/test_docs_run.py)"
                rows.append(f"| {block.page} | {cmd.line} | `{shown}` | {what} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table(run="--run" in sys.argv[1:]))
