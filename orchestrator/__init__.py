"""orchestrate: run GPU benchmark experiment matrices in containers, locally or over SSH."""

from __future__ import annotations

__version__ = "0.1.0"
