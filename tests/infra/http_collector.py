"""A real HTTP collector on loopback for the publish tests: stores every request it gets.

    python tests/infra/http_collector.py --port-file FILE --store FILE

It listens on 127.0.0.1 (a free port, written to ``--port-file`` once it listens) and answers
by the path a request is sent to:

* ``POST /ok/...``: 200; the request (method, path, headers, JSON body) is appended to
  ``--store`` as one JSON line;
* ``POST /refuse/...`` (and any method there, so that an MLflow client pointed at it meets a
  server that refuses): 403 with a one-line JSON error; stored too;
* ``POST /fail/N/...``: 503 for the first N requests to that path, then as ``/ok``;
* ``* /slow/S/...``: answers 200 after S seconds (a server too slow for the client's timeout);
* ``GET /received``: every stored request, a JSON list (how the tests read back what arrived).

Stdlib only. It is a real server on a real socket: the publish tests' requests go through
urllib's and the MLflow client's own HTTP stacks unchanged.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

LOCK = threading.Lock()
FAILS: dict[str, int] = {}


class Handler(BaseHTTPRequestHandler):
    store: Path

    def log_message(self, format: str, *args: object) -> None:  # the stdlib's names
        pass

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _record(self, body: bytes) -> None:
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = body.decode("utf-8", "replace")
        entry = {"method": self.command, "path": self.path,
                 "headers": dict(self.headers.items()), "body": parsed, "at": time.time()}
        with LOCK, self.store.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")

    def _answer(self, status: int, data: object) -> None:
        payload = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _handle(self) -> None:
        body = self._body()
        parts = self.path.split("?")[0].strip("/").split("/")
        head = parts[0]
        if head == "received" and self.command == "GET":
            with LOCK:
                text = self.store.read_text(encoding="utf-8") if self.store.exists() else ""
            self._answer(200, [json.loads(line) for line in text.splitlines() if line])
            return
        if head == "slow":
            time.sleep(float(parts[1]))
            self._answer(200, {})
            return
        if head == "refuse":
            self._record(body)
            self._answer(403, {"error_code": "PERMISSION_DENIED",
                               "message": "this collector refuses everything"})
            return
        if head == "fail":
            key = "/".join(parts[:3])
            with LOCK:
                left = FAILS.setdefault(key, int(parts[1]))
                FAILS[key] = max(0, left - 1)
            if left > 0:
                self._answer(503, {"error": "try again later"})
                return
        if head in ("ok", "fail") and self.command == "POST":
            self._record(body)
            self._answer(200, {"received": True})
            return
        self._answer(404, {"error": f"nothing at {self.path}"})

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--store", type=Path, required=True)
    args = parser.parse_args()
    Handler.store = args.store
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    tmp = args.port_file.with_suffix(".tmp")
    tmp.write_text(str(server.server_address[1]))
    tmp.replace(args.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
