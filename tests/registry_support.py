"""Images a real Docker engine can pull on machines that reach no registry: built here
``FROM scratch`` with layers of random bytes, saved, removed, and served by the registry
stand-in on loopback (tests/infra/registry_standin.py). Used by the pull tests and by
tests/tools/capture_docker_pull.py (which recorded tests/data/docker-pull/)."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "infra"))

from registry_standin import Repository, serve

NAME = "orchestrate-test/pull"


def context(sizes_mb: list[float], base: str = "scratch") -> bytes:
    """A build context: a Dockerfile FROM ``base`` copying one file of random bytes per size."""
    buf = io.BytesIO()
    lines = [f"FROM {base}"]
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i, mb in enumerate(sizes_mb):
            data = os.urandom(int(mb * 1_000_000))
            info = tarfile.TarInfo(f"blob-{base.replace('/', '-').replace(':', '-')}-{i}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            lines.append(f"COPY {info.name} /{info.name}")
        text = ("\n".join(lines) + "\n").encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(text)
        tar.addfile(info, io.BytesIO(text))
    return buf.getvalue()


@contextlib.contextmanager
def pullable(client: Any, sizes_mb: list[float], rate: float | None,
             more_mb: list[float] | None = None) -> Iterator[list[str]]:
    """Images this engine does not have and can pull from the stand-in registry: one of
    ``sizes_mb`` layers, and with ``more_mb`` a second built on it with those layers more
    (pulled after the first, its first layers already exist). Yields their references
    (``127.0.0.1:PORT/orchestrate-test/pull:1``, ``...:2``); removed from the engine after."""
    api = client.api
    repository = Repository()
    sources = [(f"{NAME}-source:1", "scratch", sizes_mb)]
    if more_mb:
        sources.append((f"{NAME}-source:2", sources[0][0], list(more_mb)))
    for number, (local, base, sizes) in enumerate(sources, start=1):
        for _ in api.build(fileobj=io.BytesIO(context(sizes, base)), custom_context=True,
                           tag=local, rm=True, decode=True):
            pass
        repository.add_saved(b"".join(api.get_image(local)), NAME, str(number))
    for local, _, _ in reversed(sources):
        api.remove_image(local, force=True)
    with serve(repository, rate) as address:
        refs = [f"{address}/{NAME}:{n}" for n in range(1, len(sources) + 1)]
        try:
            yield refs
        finally:
            for ref in reversed(refs):
                with contextlib.suppress(Exception):
                    api.remove_image(ref, force=True)
