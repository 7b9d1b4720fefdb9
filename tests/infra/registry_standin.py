"""A stand-in for a container registry on loopback: what a real Docker engine pulls from when
the project's machines reach no registry (no Docker Hub, no nvcr.io).

It serves, read-only, the pull side of the Docker Registry HTTP API v2 for images saved with
``docker save``: ``GET /v2/``, ``GET|HEAD /v2/<name>/manifests/<tag or digest>`` (a schema 2
manifest) and ``GET|HEAD /v2/<name>/blobs/<digest>`` (the image's config and its layers, each
gzip-compressed here as a registry stores them). ``rate`` (bytes per second) slows the blobs
down, so that a pull of a few tens of MB takes seconds and the engine reports its progress as
it does for a 20 GB NGC image. A real engine pulls from it unchanged: 127.0.0.0/8 is an insecure
registry to dockerd by default (plain HTTP).

Stdlib only; used in-process by the tests (:func:`serve`) and by
``tests/tools/capture_docker_pull.py``, which recorded tests/data/docker-pull/.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import tarfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_V1 = "application/vnd.docker.container.image.v1+json"
LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class Repository:
    """The images a stand-in serves: blobs by digest, manifests by name and tag or digest."""

    blobs: dict[str, bytes] = field(default_factory=dict)
    manifests: dict[tuple[str, str], bytes] = field(default_factory=dict)

    def add_saved(self, saved: bytes, name: str, tag: str) -> str:
        """Add the image of a ``docker save`` archive as ``name:tag``; its manifest's digest."""
        with tarfile.open(fileobj=io.BytesIO(saved)) as archive:
            def read(member: str) -> bytes:
                handle = archive.extractfile(member)
                assert handle is not None, member
                return handle.read()

            (image,) = json.loads(read("manifest.json"))
            config = read(image["Config"])
            layers = [gzip.compress(read(layer), compresslevel=1, mtime=0)  # one blob per layer
                      for layer in image["Layers"]]
        for blob in (config, *layers):
            self.blobs[_digest(blob)] = blob
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": MANIFEST_V2,
            "config": {"mediaType": CONFIG_V1, "size": len(config), "digest": _digest(config)},
            "layers": [{"mediaType": LAYER_GZIP, "size": len(layer), "digest": _digest(layer)}
                       for layer in layers],
        }, indent=3).encode()
        digest = _digest(manifest)
        self.manifests[(name, tag)] = manifest
        self.manifests[(name, digest)] = manifest
        return digest


_PATH = re.compile(r"^/v2/(?P<name>.+)/(?P<kind>manifests|blobs)/(?P<ref>[^/]+)$")


def handler(repository: Repository, rate: float | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # the stdlib's names
            pass

        def _send(self, code: int, body: bytes, kind: str, digest: str | None = None,
                  head: bool = False) -> None:
            self.send_response(code)
            self.send_header("Docker-Distribution-API-Version", "registry/2.0")
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            if digest:
                self.send_header("Docker-Content-Digest", digest)
            self.end_headers()
            if head:
                return
            step = 64 * 1024
            for start in range(0, len(body), step):
                self.wfile.write(body[start:start + step])
                if rate:
                    time.sleep(step / rate)

        def _answer(self, head: bool) -> None:
            if self.path == "/v2/":
                self._send(200, b"{}", "application/json", head=head)
                return
            found = _PATH.match(self.path)
            if found is None:
                self._send(404, b'{"errors": [{"code": "NOT_FOUND"}]}', "application/json",
                           head=head)
                return
            ref = found.group("ref")
            if found.group("kind") == "manifests":
                body = repository.manifests.get((found.group("name"), ref))
                kind = MANIFEST_V2
            else:
                body = repository.blobs.get(ref)
                kind = "application/octet-stream"
            if body is None:
                self._send(404, b'{"errors": [{"code": "MANIFEST_UNKNOWN"}]}',
                           "application/json", head=head)
                return
            self._send(200, body, kind, _digest(body), head=head)

        def do_GET(self) -> None:  # the stdlib's names
            self._answer(head=False)

        def do_HEAD(self) -> None:
            self._answer(head=True)

    return Handler


@contextmanager
def serve(repository: Repository, rate: float | None = None) -> Iterator[str]:
    """Serve ``repository`` on a free port of 127.0.0.1 while the block runs; yields the
    registry's address (``127.0.0.1:PORT``), the first component of the references to pull."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(repository, rate))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
