"""How far a base-image pull has come (NGC images are 10-20 GB: minutes), from the events a
Docker engine sends while it pulls (docker-py's ``pull(..., stream=True, decode=True)``): one
event per layer and step, ``{"status": "Downloading", "id": LAYER, "progressDetail":
{"current": BYTES, "total": BYTES}}``, ``"Download complete"``, ``"Extracting"``, ``"Pull
complete"``, ``"Already exists"``, then ``"Digest: ..."`` and ``"Status: ..."`` lines
(tests/data/docker-pull/ has streams recorded from a real engine).

:class:`PullProgress` is pure: it is fed the events with the time each came, and says how many
layers are done, how many bytes are downloaded of how many, the rate over the last seconds and
the time left, as a line of text. :class:`PullReport` hands it to whoever listens to a build's
log (``on_log``): a listener that can draw it (an object with a ``pull_progress`` method: the
CLI's progress bar on a terminal) gets every update; any other gets a line when the pull starts,
one every :data:`LINE_EVERY_S` seconds and one when it ends (a log file, a pipe, cron).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.config.syntax import plural

#: Seconds between two progress lines for a listener that takes lines (a pipe, a log file).
LINE_EVERY_S = 5.0
#: The rate is measured over the last this many seconds.
RATE_WINDOW_S = 10.0

#: Layer statuses that end a layer: its bytes are on the engine.
DONE = frozenset({"Pull complete", "Already exists"})
#: Statuses after which a layer's download is complete (its bytes counted in full).
DOWNLOADED = frozenset({"Download complete", "Verifying Checksum", "Extracting", "Pull complete"})


@dataclass
class Layer:
    """One layer of a pull: its last status and its download's bytes (``total`` 0: not known
    yet)."""

    status: str = ""
    current: int = 0
    total: int = 0
    existed: bool = False

    @property
    def done(self) -> bool:
        return self.status in DONE


@dataclass
class PullProgress:
    """A pull of ``ref``, as its events tell it (fed with :meth:`feed`)."""

    ref: str
    started: float
    layers: dict[str, Layer] = field(default_factory=dict)
    now: float = 0.0
    #: The engine's last word: ``Status: Downloaded newer image for ...`` or ``... up to date``.
    outcome: str = ""
    finished: bool = False
    #: Why the pull stopped without the image (its stream's error), "" otherwise.
    failed: str = ""
    _samples: deque[tuple[float, int]] = field(default_factory=deque, repr=False)

    def __post_init__(self) -> None:
        self.now = self.now or self.started

    def feed(self, event: Mapping[str, Any], now: float) -> None:
        """Take one event of the engine's pull stream, which came at ``now``."""
        self.now = now
        status = str(event.get("status") or "")
        if status.startswith("Status: "):
            self.outcome = status.removeprefix("Status: ")
        layer_id = event.get("id")
        if isinstance(layer_id, str) and _is_layer(status):
            layer = self.layers.setdefault(layer_id, Layer())
            layer.status = status
            detail = event.get("progressDetail") or {}
            if status == "Downloading" and isinstance(detail, Mapping):
                layer.current = _int(detail.get("current"), layer.current)
                layer.total = _int(detail.get("total"), layer.total)
            elif status in DOWNLOADED and layer.total:
                layer.current = layer.total
            elif status == "Already exists":
                layer.existed = True
        self._samples.append((now, self.downloaded))
        while len(self._samples) > 2 and now - self._samples[1][0] >= RATE_WINDOW_S:
            self._samples.popleft()

    def finish(self, now: float) -> None:
        """The stream ended (the image is there)."""
        self.now, self.finished = now, True

    @property
    def elapsed(self) -> float:
        return max(0.0, self.now - self.started)

    @property
    def layers_done(self) -> int:
        return sum(1 for layer in self.layers.values() if layer.done)

    @property
    def downloaded(self) -> int:
        """Bytes downloaded so far (layers that already existed count nothing)."""
        return sum(layer.current for layer in self.layers.values() if not layer.existed)

    @property
    def to_download(self) -> int:
        """Bytes of the layers whose size the engine has said (it says so when each starts)."""
        return sum(layer.total for layer in self.layers.values() if not layer.existed)

    @property
    def sizes_known(self) -> bool:
        """Whether every layer still to download has said its size."""
        return all(layer.total or layer.existed or layer.done for layer in self.layers.values())

    @property
    def rate(self) -> float | None:
        """Bytes per second over the last :data:`RATE_WINDOW_S` seconds (None: too early)."""
        if len(self._samples) < 2:
            return None
        (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 - t0 >= 0.5 else None

    @property
    def seconds_left(self) -> float | None:
        rate = self.rate
        if not rate or not self.sizes_known or not self.to_download:
            return None
        return max(0.0, (self.to_download - self.downloaded) / rate)

    def text(self) -> str:
        """``12/35 layers, 3.2 GB of 9.8 GB, 45.1 MB/s, 2:24 left``: where the pull is."""
        parts = [f"{self.layers_done}/{len(self.layers)} layers"] if self.layers else []
        if self.to_download:
            more = "" if self.sizes_known else "+"
            parts.append(f"{size(self.downloaded)} of {size(self.to_download)}{more}")
        rate, left = self.rate, self.seconds_left
        if rate is not None:
            parts.append(f"{size(rate)}/s")
        if left is not None and self.downloaded < self.to_download:
            parts.append(f"{clock(left)} left")
        elif self.layers and self.sizes_known and self.downloaded >= self.to_download and (
                self.layers_done < len(self.layers)):
            parts.append("extracting")
        return ", ".join(parts) or "starting"

    def line(self) -> str:
        """A line for a log: ``pulling REF: <text>``, or when it is done, what it took."""
        if self.failed:
            return (f"pulling base image {self.ref} failed after {clock(self.elapsed)} "
                    f"({self.text()}): {self.failed}")
        if not self.finished:
            return f"pulling base image {self.ref}: {self.text()}"
        existed = sum(1 for layer in self.layers.values() if layer.existed)
        fetched = len(self.layers) - existed
        got = [f"{plural(fetched, 'layer')}, {size(self.downloaded)} in "
               f"{clock(self.elapsed)}"] if fetched else []
        if got and self.elapsed >= 1 and self.downloaded:
            got[0] += f" ({size(self.downloaded / self.elapsed)}/s)"
        if existed:
            got.append(f"{plural(existed, 'layer')} already there")
        said = f" ({self.outcome})" if self.outcome and not self.layers else ""
        return f"pulled base image {self.ref}: {', '.join(got) or 'nothing to fetch'}{said}"


def _is_layer(status: str) -> bool:
    """Whether an event with an id is a layer's (not ``Pulling from NAME`` with the tag)."""
    return not status.startswith(("Pulling from", "Digest:", "Status:"))


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def size(n: float) -> str:
    """Bytes in decimal units, as the engine shows them: ``9.8 GB``, ``340.5 MB``."""
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def clock(seconds: float) -> str:
    """``2:24``, ``1:02:03``."""
    s = int(round(seconds))
    hours, rest = divmod(s, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class PullWatcher(Protocol):
    """A listener that draws a pull itself (the CLI's progress bar): every update."""

    def pull_progress(self, progress: PullProgress) -> None: ...


def watcher_of(on_log: Callable[[str], None] | None) -> PullWatcher | None:
    """``on_log``, or the object it is a method of, where it draws pulls (a ``pull_progress``
    method); None where it takes lines only."""
    for candidate in (on_log, getattr(on_log, "__self__", None)):
        if callable(getattr(candidate, "pull_progress", None)):
            return candidate  # type: ignore[return-value]
    return None


class PullReport:
    """A pull's progress, reported to a build's ``on_log``: every update to a
    :class:`PullWatcher`, else lines (when it starts, every ``every_s`` seconds, when it ends).
    ``clock``: where the time comes from (a test gives a recorded stream's)."""

    def __init__(self, ref: str, on_log: Callable[[str], None] | None,
                 clock: Callable[[], float] = time.monotonic, every_s: float = LINE_EVERY_S):
        self.clock = clock
        self.progress = PullProgress(ref, clock())
        self.on_log = on_log
        self.watcher = watcher_of(on_log)
        self.every_s = every_s
        self._said = self.progress.started
        if self.watcher is not None:
            self.watcher.pull_progress(self.progress)
        elif on_log is not None:
            on_log(f"pulling base image {ref}")

    def event(self, event: Mapping[str, Any]) -> None:
        now = self.clock()
        self.progress.feed(event, now)
        if self.watcher is not None:
            self.watcher.pull_progress(self.progress)
        elif self.on_log is not None and now - self._said >= self.every_s:
            self._said = now
            self.on_log(self.progress.line())

    def finish(self, failed: str = "") -> None:
        """The stream ended: the image is there, or (``failed``: why) it is not."""
        self.progress.finish(self.clock())
        self.progress.failed = failed
        if self.watcher is not None:
            self.watcher.pull_progress(self.progress)
        elif self.on_log is not None:
            self.on_log(self.progress.line())
