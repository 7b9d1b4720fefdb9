"""Speed of the log pump (``Backend._pump``) on output without newlines.

A cell that draws a progress bar with ``\\r`` writes megabytes without a newline. The pump
reads the cell's pipe, writes the log and hands each line to the capture (the log's tail) and
the progress hook; while it works, the program blocks on its full pipe and its timeout runs.
Here a real child process writes ``--sizes`` MB of ``\\r``-separated progress text (no
newline, then one at the end) into a real pipe; the pump reads it in 64 KiB chunks as the
process backend does (``read1``) and writes a real log file. Printed: seconds per size and
MB/s, with and without a secret to mask (masking needs whole lines); linear means the MB/s
stay flat as the size grows.

    python benchmarks/log_pump.py [--sizes 16 64] [--repeat 1]
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

from tabulate import tabulate

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import dry_option  # noqa: E402
from orchestrator.backends.base import Backend, _Capture  # noqa: E402
from orchestrator.config.redact import Scrubber  # noqa: E402

WRITER = """
import sys
size = int(sys.argv[1])
bar = b"\\rtraining  42%|#########          | 4200/10000 [00:42<00:58, 99.9it/s]"
out = sys.stdout.buffer
written = 0
while written < size:
    out.write(bar)
    written += len(bar)
out.write(b"\\ndone\\n")
out.flush()
"""


class PipeExecution:
    """The output of a real child process, read as the process backend reads it."""

    def __init__(self, size: int):
        self.proc = subprocess.Popen([sys.executable, "-c", WRITER, str(size)],
                                     stdout=subprocess.PIPE)

    def output(self) -> Iterator[bytes]:
        stdout = self.proc.stdout
        assert isinstance(stdout, io.BufferedReader)
        while chunk := stdout.read1(65536):
            yield chunk
        self.proc.wait()


def pump_seconds(size_mb: int, secret: bool, folder: Path) -> tuple[float, int]:
    """Seconds the pump takes for ``size_mb`` MB without newlines; the log's size."""
    lines: list[str] = []
    stub = SimpleNamespace(options=SimpleNamespace(output_hook=lambda cell, line: lines.append(
        line[-80:])))
    capture = _Capture(scrub=Scrubber(["not-in-the-output-s3cr3t"] if secret else []))
    log_path = folder / f"log-{size_mb}-{secret}.txt"
    execution = PipeExecution(size_mb * 2**20)
    started = time.perf_counter()
    with log_path.open("ab") as log_file:
        Backend._pump(stub, "cell", execution, log_file, capture)  # type: ignore[arg-type]
    took = time.perf_counter() - started
    assert lines[-1] == "done" and len(lines) == 2, lines[-3:]
    return took, log_path.stat().st_size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64], metavar="MB")
    parser.add_argument("--repeat", type=int, default=1)
    dry_option(parser, "1 MB without a newline")
    args = parser.parse_args()
    if args.dry:
        args.sizes, args.repeat = [1], 1
    rows = []
    with tempfile.TemporaryDirectory(prefix="log-pump-") as tmp:
        for secret in (False, True):
            for size in args.sizes:
                best = min(pump_seconds(size, secret, Path(tmp))[0] for _ in range(args.repeat))
                rows.append([size, "yes" if secret else "no", f"{best:.2f}",
                             f"{size / best:.1f}"])
    print(tabulate(rows, headers=["MB without newline", "secret masked", "seconds", "MB/s"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
