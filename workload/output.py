"""Rendering: JSON lines on stdout and the files written into ``--output-dir``."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO


def clean(value: Any) -> Any:
    """JSON-safe copy: non-finite floats become null, tuples lists, paths strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


class Reporter:
    """Writes one JSON object per line; ``enabled`` is False on ranks other than 0."""

    def __init__(self, stream: TextIO, enabled: bool = True) -> None:
        self.stream = stream
        self.enabled = enabled

    def emit(self, obj: dict[str, Any], force: bool = False) -> None:
        """Print ``obj`` as one JSON line (on rank 0, or anywhere with ``force``)."""
        if not (self.enabled or force):
            return
        self.stream.write(json.dumps(clean(obj), sort_keys=False) + "\n")
        self.stream.flush()


ITERATION_FIELDS = ("step", "start_s", "data_time_s", "compute_time_s", "iteration_time_s")


def write_iterations_csv(
    path: Path,
    start_s: Sequence[float],
    data: Sequence[float],
    compute: Sequence[float],
    iteration: Sequence[float],
) -> None:
    """Write ``iterations.csv`` (steps numbered from 1; ``start_s`` is epoch seconds)."""
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(ITERATION_FIELDS)
        for i, row in enumerate(zip(start_s, data, compute, iteration, strict=True), start=1):
            writer.writerow([i, f"{row[0]:.6f}", *(f"{v:.9f}" for v in row[1:])])


def write_rank_iterations_csv(path: Path, ranks: Sequence[Sequence[float]]) -> None:
    """Write ``iterations_per_rank.csv``: every rank's own iteration time per step (steps from 1),
    one row per step and rank."""
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(("step", "rank", "iteration_time_s"))
        for rank, times in enumerate(ranks):
            for step, value in enumerate(times, start=1):
                writer.writerow([step, rank, f"{value:.9f}"])


def write_json(path: Path, obj: dict[str, Any]) -> None:
    """Write ``obj`` as pretty JSON."""
    path.write_text(json.dumps(clean(obj), indent=2) + "\n")
