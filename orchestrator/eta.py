"""When a sweep will be done: the estimate its progress lines show.

Pure: durations in, seconds out. For now the mean duration of the cells that finished, times the
cells left, divided by how many run at once. (Meant to be replaced by an estimator that knows
the durations of earlier runs of the same matrix; the signature is what callers rely on.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def estimate_eta(finished_s: Sequence[float], remaining: int, concurrency: int = 1
                 ) -> float | None:
    """Seconds until ``remaining`` more cells are done, or None before any cell finished.

    ``finished_s``: durations of the cells that finished (seconds); ``concurrency``: how many
    cells run at once."""
    if remaining <= 0:
        return 0.0
    durations = [d for d in finished_s if d is not None and math.isfinite(d) and d >= 0]
    if not durations:
        return None
    return sum(durations) / len(durations) * remaining / max(1, concurrency)


def format_duration(seconds: float | None) -> str:
    """``1:02:03``, ``2:03``, or ``?`` when unknown."""
    if seconds is None:
        return "?"
    total = int(round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
