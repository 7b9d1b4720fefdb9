"""Shared by the real-service fixtures (Docker, sshd, Slurm)."""

from __future__ import annotations

import os

import pytest


def unavailable(reason: str) -> None:
    """Skip the test, or fail it under ``CI=true``, where every service must be running."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(reason)
