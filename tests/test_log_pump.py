"""The log pump (``Backend._pump``): every byte into the log, lines to the tail and the
progress hook, secrets masked; output without newlines (``\\r`` progress bars) costs linear
time and bounded memory (issue 24, item 5: 64 MB took 47 s, quadratic). Its speed is measured
by ``benchmarks/log_pump.py``; here what it hands on is checked.

The output comes from chunks given in the test (the pump reads whatever ``Execution.output``
yields; the process backend's is a real pipe, exercised by every sweep test).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from orchestrator.backends.base import LINE_KEEP_BYTES, TAIL_LINE_CHARS, Backend, _Capture
from orchestrator.config.redact import MASK, Scrubber


class Chunks:
    def __init__(self, chunks: list[bytes]):
        self.chunks = chunks

    def output(self):
        yield from self.chunks


def pump(tmp_path: Path, chunks: list[bytes], secrets: tuple[str, ...] = ()
         ) -> tuple[bytes, list[str], _Capture]:
    seen: list[str] = []
    stub = SimpleNamespace(options=SimpleNamespace(
        output_hook=lambda cell, line: seen.append(line)))
    capture = _Capture(scrub=Scrubber(secrets))
    log = tmp_path / "log.txt"
    with log.open("ab") as fh:
        Backend._pump(stub, "c", Chunks(chunks), fh, capture)  # type: ignore[arg-type]
    return log.read_bytes(), seen, capture


BAR = b"\rtraining 42%|#####     | 4200/10000 [00:42<00:58, 99.9it/s]"


def test_a_progress_bar_without_newlines_is_logged_whole_and_handed_on_by_its_end(tmp_path):
    bar = BAR * 50_000  # 3 MB, one "line"
    chunks = [bar[i:i + 65536] for i in range(0, len(bar), 65536)] + [b"\ndone\nlast"]
    log, seen, capture = pump(tmp_path, chunks)
    assert log == bar + b"\ndone\nlast"
    assert len(seen) == 3 and seen[1:] == ["done", "last"]
    dropped = len(bar) - LINE_KEEP_BYTES
    assert seen[0].startswith(f"[... {dropped} bytes] ") and seen[0].endswith("99.9it/s]")
    assert len(seen[0]) < LINE_KEEP_BYTES + 40
    tail = capture.tail[0]
    assert tail.endswith("99.9it/s]") and len(tail) < TAIL_LINE_CHARS + 40


def test_an_open_line_at_the_end_is_kept_by_its_end_too(tmp_path):
    log, seen, _ = pump(tmp_path, [b"ok\n", BAR * 3000, BAR * 3000])
    assert log.endswith(BAR) and seen[0] == "ok"
    assert seen[1].startswith("[... ") and seen[1].endswith("99.9it/s]")


def test_secrets_are_masked_in_long_lines_and_across_chunks(tmp_path):
    secret = "hf_s3cr3t_token_value"
    text = (BAR * 2000 + b" token=" + secret.encode() + BAR * 2000 + b"\nnext " +
            secret.encode() + b"\n")
    cut = text.index(b"s3cr3t") + 2  # the secret split between two chunks
    log, seen, _ = pump(tmp_path, [text[:cut], text[cut:]], secrets=(secret,))
    assert secret.encode() not in log and log.count(MASK.encode()) == 2
    assert seen[1] == f"next {MASK}" and secret not in "".join(seen)
