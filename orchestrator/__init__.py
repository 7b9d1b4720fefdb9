"""orchestrate: run GPU benchmark experiment matrices in containers, locally, over SSH or on Slurm."""

from __future__ import annotations

__version__ = "0.1.0"
