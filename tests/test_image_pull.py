"""A registry base image pulled through the real Docker engine, its progress reported as a
sweep and ``images build`` report it (issue 31), and pinned to its registry digest.

No registry is reachable from the project's machines: the image (``FROM scratch``, layers of
random bytes, built here) is served by the registry stand-in on loopback
(tests/infra/registry_standin.py, the Registry HTTP API v2's pull side), from which dockerd
pulls it unchanged. About 10 s: two pulls of 18 MB at 4 MB/s a layer, and the build."""

from __future__ import annotations

import re
from typing import Any

import pytest
from registry_support import pullable

from orchestrator.images import build
from orchestrator.images.pulls import PullProgress


@pytest.fixture
def pullable_ref(docker_client: Any) -> Any:
    with pullable(docker_client, [6, 12], rate=4e6) as refs:
        yield refs[0]


def test_a_registry_base_is_pulled_with_its_progress_and_pinned_to_its_digest(
        docker_client: Any, pullable_ref: str) -> None:
    ref = pullable_ref
    lines: list[str] = []
    pin = build.engine_resolver(docker_client, on_log=lines.append)(ref)
    repository = ref.rpartition(":")[0]
    assert pin.digest is not None and pin.digest.startswith(f"{repository}@sha256:")
    assert pin.identity == pin.digest  # the registry's digest pins it, not the local ID
    assert lines[0] == f"pulling base image {ref}"
    assert re.fullmatch(rf"pulled base image {re.escape(ref)}: 2 layers, 18\.0 MB in 0:0\d "
                        r"\([\d.]+ MB/s\)", lines[-1]), lines


def test_a_display_gets_every_update_of_a_pull(docker_client: Any, pullable_ref: str) -> None:
    """What the sweep's terminal display and ``images build`` get: each event's progress."""

    class Display:
        def __init__(self) -> None:
            self.lines: list[str] = []
            self.seen: list[tuple[int, int, int, bool]] = []

        def __call__(self, line: str) -> None:
            self.lines.append(line)

        def pull_progress(self, progress: PullProgress) -> None:
            self.seen.append((progress.downloaded, progress.to_download,
                              progress.layers_done, progress.finished))

    display = Display()
    build.engine_resolver(docker_client, on_log=display)(pullable_ref)
    assert display.lines == []  # drawn, not said
    downloaded = [d for d, _, _, _ in display.seen]
    assert downloaded == sorted(downloaded) and len(set(downloaded)) > 5
    assert display.seen[-1][3] and display.seen[-1][2] == 2
    assert display.seen[-1][0] == display.seen[-1][1] == pytest.approx(18e6, rel=0.01)
