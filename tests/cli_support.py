"""The CLI run in-process under a time limit, and an HTTP collector that takes everything: what
tests/test_safe_writes.py and tests/test_full_disk.py share."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from orchestrator.cli import main


class _Collector(BaseHTTPRequestHandler):
    """Takes every document (200)."""

    def do_POST(self) -> None:  # the stdlib's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def ok_collector() -> Iterator[str]:
    """An HTTP collector on loopback, in a thread, that answers 200 to every POST; its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/ok"
    finally:
        server.shutdown()


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str], limit_s: int = 30
            ) -> tuple[int, str, str]:
    """``orchestrate ARGV`` in-process: (exit status, stdout, stderr). A command still running
    after ``limit_s`` seconds (blocked on a FIFO, a hang) fails the test (TimeoutError)."""
    def alarm(signum: int, frame: object) -> None:
        raise TimeoutError(f"the command blocked for {limit_s} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(limit_s)
    try:
        code = main(argv)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    out = capsys.readouterr()
    return code, out.out, out.err
