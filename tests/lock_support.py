"""Locks in a test's own folder: :func:`orchestrator.local.locks.hold` with a
:class:`~orchestrator.local.locks.FileLocker` there (the library's backends name their lockers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.local.locks import FileLocker, HeldLocks, Holder, LockRequest, hold


def acquire(request: LockRequest, holder: Holder, *, folder: Path, **kwargs: Any) -> HeldLocks:
    """Take every lock of ``request`` in ``folder``, as a sweep on this machine does."""
    return hold([request], holder, lambda r, h: FileLocker(r, h, folder), **kwargs)
