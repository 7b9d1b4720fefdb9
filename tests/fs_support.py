"""Real file-system faults for tests: a tiny tmpfs (a full disk) or a read-only one.

Mounting needs root (CI runs as root). Where mounting is impossible the test is skipped with
the reason, or fails under ``CI=true`` (:func:`service_support.unavailable`).
"""

from __future__ import annotations

import contextlib
import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path

from service_support import unavailable


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "256k", read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (made if missing) for the ``with`` block."""
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size},mode=0755" + (",ro" if read_only else "")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "orchestrate-test", str(path)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        unavailable(f"cannot mount a tmpfs at {path} (needs root): "
                    f"{proc.stderr.strip() or proc.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(folder: Path, name: str = ".filler") -> Path:
    """Write a file into ``folder`` until its file system is full; the file (delete it to free
    the space again)."""
    filler = folder / name
    with filler.open("ab", buffering=0) as fh:
        while True:
            try:
                fh.write(b"\0" * 4096)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    return filler
