"""Base-image pulls show their progress (issue 31: a pull printed one line, then nothing until
it ended, and NGC images are 10-20 GB): layers, bytes, rate and time left, as a bar on a
terminal and a line every few seconds elsewhere.

The events are real: tests/data/docker-pull/three-layers-then-one-more.jsonl was recorded from
this machine's Docker engine 20.10 (docker-py 7.2) pulling from the registry stand-in on
loopback (tests/tools/capture_docker_pull.py; its first line says how): an image of three layers
of 16, 32 and 8 MB of random bytes at 4 MB/s a layer, the same again (up to date), then an image
built on it with one more layer of 16 MB (three layers already there). Replayed here with their
recorded times; tests/test_image_pull.py pulls through the real engine."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from orchestrator.images.pulls import PullProgress, PullReport, size, watcher_of

RECORDED = Path(__file__).resolve().parent / "data" / "docker-pull" / \
    "three-layers-then-one-more.jsonl"


def recorded() -> tuple[dict[str, Any], dict[int, list[tuple[float, dict[str, Any]]]]]:
    """The recording's header and its pulls: number -> [(seconds since it began, event)]."""
    lines = [json.loads(line) for line in RECORDED.read_text().splitlines()]
    pulls: dict[int, list[tuple[float, dict[str, Any]]]] = {}
    for line in lines[1:]:
        pulls.setdefault(line["pull"], []).append((line["t"], line["event"]))
    return lines[0]["recorded"], pulls


class Clock:
    """The recorded time, moved on by the replay."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def replay(number: int, on_log: Any, every_s: float = 5.0,
           until: float | None = None) -> PullReport:
    """Pull ``number`` of the recording through a :class:`PullReport` to ``on_log``."""
    clock = Clock()
    report = PullReport(f"registry.lab:5000/pull:{number}", on_log, clock=clock,
                        every_s=every_s)
    for t, event in recorded()[1][number]:
        if until is not None and t > until:
            return report
        clock.t = t
        report.event(event)
    report.finish()
    return report


def test_the_recorded_pull_adds_up_to_its_layers() -> None:
    head, pulls = recorded()
    progress = PullProgress("r", 0.0)
    for t, event in pulls[1]:
        progress.feed(event, t)
    progress.finish(pulls[1][-1][0])
    assert len(progress.layers) == len(head["layers_mb"]) and progress.layers_done == 3
    # random bytes do not compress: each layer's gzip is its size in MB, a few kB over
    assert sorted(layer.total for layer in progress.layers.values()) == pytest.approx(
        sorted(mb * 1e6 for mb in head["layers_mb"]), rel=0.01)
    assert progress.downloaded == progress.to_download
    assert progress.outcome.startswith("Downloaded newer image for ")


def test_midway_it_says_layers_bytes_rate_and_time_left() -> None:
    head, pulls = recorded()
    duration = pulls[1][-1][0]
    progress = PullProgress("r", 0.0)
    for t, event in pulls[1]:
        if t > duration / 2:
            break
        progress.feed(event, t)
    text = progress.text()
    found = re.fullmatch(r"(\d)/3 layers, ([\d.]+) MB of ([\d.]+) MB, ([\d.]+) MB/s, "
                         r"(\d+):(\d\d) left", text)
    assert found, text
    done, total = float(found.group(2)), float(found.group(3))
    assert 0 < done < total == pytest.approx(sum(head["layers_mb"]), rel=0.01)
    rate = float(found.group(4)) * 1e6
    # the stand-in sends each layer at `rate`: never more than all layers at once
    assert 0 < rate <= head["rate"] * len(head["layers_mb"]) * 1.2
    left = int(found.group(5)) * 60 + int(found.group(6))
    assert left == pytest.approx((total - done) * 1e6 / rate, abs=1.0)


def test_piped_a_line_every_few_seconds_and_one_at_each_end() -> None:
    """What a log file, cron or a pipe gets (today: one line, then nothing until the end)."""
    _, pulls = recorded()
    lines: list[str] = []
    replay(1, lines.append, every_s=2.0)
    duration = pulls[1][-1][0]
    assert lines[0] == "pulling base image registry.lab:5000/pull:1"
    assert len(lines) - 2 == pytest.approx(duration // 2.0, abs=1)
    assert all(re.match(r"pulling base image \S+: \d/3 layers, [\d.]+ MB of [\d.]+ MB, "
                        r"[\d.]+ MB/s", line) for line in lines[1:-1]), lines
    assert re.fullmatch(r"pulled base image \S+: 3 layers, 56\.0 MB in 0:\d\d \([\d.]+ MB/s\)",
                        lines[-1]), lines[-1]


def test_an_up_to_date_image_and_layers_already_there_are_said_so() -> None:
    lines: list[str] = []
    replay(2, lines.append)
    assert lines[-1].startswith("pulled base image registry.lab:5000/pull:2: nothing to fetch "
                                "(Image is up to date for ")
    lines.clear()
    report = replay(3, lines.append)
    assert re.fullmatch(r"pulled base image \S+: 1 layer, 16\.0 MB in 0:0\d \([\d.]+ MB/s\), "
                        r"3 layers already there", lines[-1]), lines[-1]
    assert report.progress.to_download == pytest.approx(16e6, rel=0.01)  # what existed: none


def test_a_failed_pull_says_where_it_stopped() -> None:
    lines: list[str] = []
    report = replay(1, lines.append, until=2.0)
    report.finish(failed="connection reset by peer")
    assert re.fullmatch(r"pulling base image \S+ failed after 0:02 \(\d/3 layers, [\d.]+ MB of "
                        r"[\d.]+ MB, .*\): connection reset by peer", lines[-1]), lines[-1]


def test_sizes_in_the_engines_units() -> None:
    assert [size(n) for n in (512, 98_304, 16_005_069, 9.8e9, 2e13)] == [
        "512 B", "98.3 kB", "16.0 MB", "9.8 GB", "20.0 TB"]


def test_the_sweep_and_images_build_draw_pulls_on_a_terminal() -> None:
    """Who draws a pull: an on_log that is a method of an object with ``pull_progress`` (the
    sweep's terminal display, ``images build``'s log); the sweep's lines do not."""
    from orchestrator.cli.sweep_commands import LineEvents, RichEvents

    rich_events, line_events = RichEvents(), LineEvents(io.StringIO())
    assert watcher_of(rich_events.log) is rich_events
    assert watcher_of(line_events.log) is None
    assert watcher_of(print) is None and watcher_of(None) is None


def test_a_terminal_gets_a_bar_with_bytes_layers_and_rate() -> None:
    from rich.console import Console

    from orchestrator.cli.pull_bars import PullBars

    out = io.StringIO()
    bars = PullBars(Console(file=out, force_terminal=True, width=100))
    report = replay(1, bars, until=4.0)
    assert bars.bars is not None
    (task,) = bars.bars.tasks
    assert task.description == "pull registry.lab:5000/pull:1"
    assert 0 < task.completed < task.total == report.progress.to_download
    assert re.fullmatch(r"\d/3 layers, [\d.]+ MB of [\d.]+ MB, [\d.]+ MB/s, \d:\d\d left",
                        task.fields["detail"]), task.fields["detail"]
    report = replay(1, bars)
    assert bars.bars is None and not bars.tasks  # the bar is gone, the last line stays
    assert report.progress.line() in out.getvalue()


def test_the_sweeps_lines_when_piped(capsys: pytest.CaptureFixture[str]) -> None:
    """``orchestrate matrix ... 2>log``: the pull's lines are the sweep's timestamped lines."""
    from orchestrator.cli.sweep_commands import LineEvents

    stream = io.StringIO()
    replay(1, LineEvents(stream).log, every_s=2.0)
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 4
    assert all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d pull(ing|ed) base image ", ln)
               for ln in lines), lines


def test_piped_images_build_lines_every_few_seconds() -> None:
    from rich.console import Console

    from orchestrator.cli.pull_bars import PullBars

    out = io.StringIO()
    replay(1, PullBars(Console(file=out, force_terminal=False, width=100), every_s=2.0))
    lines = out.getvalue().splitlines()
    assert lines[0] == "pulling base image registry.lab:5000/pull:1"
    assert len(lines) >= 4 and lines[-1].startswith("pulled base image ")
    assert all("layers" in ln and "MB/s" in ln for ln in lines[1:-1]), lines
