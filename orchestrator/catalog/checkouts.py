"""A lab's checkout of another program: which commit it is at, read from its ``.git`` files.

A seed matrix names the program's revision (``program_revision``) and the folder of the lab's
checkout (``program_dir``, possibly a sub-folder of the repository); `validate` compares the two
so that a checkout moved to another commit does not run as the seed's program. No ``git``
process: ``HEAD``, a loose ref or ``packed-refs`` are read as files (a ``.git`` file of a
worktree or submodule is followed).
"""

from __future__ import annotations

from pathlib import Path

_MAX_READ = 1 << 20


def _git_dir(folder: Path) -> Path | None:
    for candidate in (folder, *folder.parents):
        dot = candidate / ".git"
        if dot.is_dir():
            return dot
        if dot.is_file():
            text = _read(dot)
            if text and text.startswith("gitdir:"):
                target = Path(text.split(":", 1)[1].strip())
                return target if target.is_absolute() else (candidate / target).resolve()
            return None
    return None


def _read(path: Path) -> str | None:
    try:
        with path.open("r", encoding="utf-8", errors="replace") as fh:
            return fh.read(_MAX_READ)
    except OSError:
        return None


def head_revision(folder: Path) -> str | None:
    """The commit the checkout holding ``folder`` is at, or None (not a git checkout, an
    unreadable ref)."""
    git = _git_dir(folder)
    if git is None:
        return None
    head = (_read(git / "HEAD") or "").strip()
    if not head.startswith("ref:"):
        return head or None
    ref = head.split(":", 1)[1].strip()
    common = git
    commondir = _read(git / "commondir")
    if commondir:  # a linked worktree keeps its refs in the main repository
        common = (git / commondir.strip()).resolve()
    for base in (git, common):
        loose = _read(base / ref)
        if loose:
            return loose.strip()
    packed = _read(common / "packed-refs") or ""
    for line in packed.splitlines():
        if line.endswith(f" {ref}"):
            return line.split(" ", 1)[0]
    return None


def same_revision(actual: str, wanted: str) -> bool:
    """Whether commit ``actual`` is ``wanted`` (``wanted`` may be abbreviated, 7+ hex digits)."""
    a, w = actual.lower(), wanted.lower()
    return len(w) >= 7 and a.startswith(w)
