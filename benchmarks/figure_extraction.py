"""Time and peak memory of reading a cell's figures by a regex, against the log's size.

When a cell ends, the sweep reads its figures from its log
(:func:`orchestrator.results.figures.figure_parsers.evaluate`, the same call
``import --figures`` makes); no cell timeout covers that step. Here a cell folder with a log of
``--sizes`` MiB (training lines ``step N loss L ips X``, a ``throughput`` line every 1000) is
read by one ``[[figures.regex]]`` figure of each kind:

* ``numeric``: ``ips (?P<value>[0-9.]+)``, a number on every line (``which = "median"``, as
  every pattern here but the next);
* ``numeric-all``: the same with ``which = "all"`` (every number kept in the result);
* ``numeric-rare``: ``throughput (?P<value>[0-9.]+)``, a number every 1000 lines;
* ``empty``: ``(?P<value>)``, an empty match at every position of the log;
* ``non-numeric``: ``(?P<value>[a-z]+)``, a word (not a number) several times per line.

Each measurement runs in a fresh process (``--limit-s`` seconds at most: one still running
then is shown as ``> limit``); printed per size and pattern: seconds, the process's peak
resident memory over what it held before the log was read (MiB), the cell's verdict (ok, or
the start of its failure reason) and the size of the ``result.json`` it would write. Linear
means the seconds grow no faster than the size.

    python benchmarks/figure_extraction.py [--sizes 1 16 64] [--limit-s 300] [--dry]

``--dry``: a 0.05 MiB log and a 20 s limit (a few seconds in all; the benchmarks' own test).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tabulate import tabulate

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PATTERNS = {  # name: (pattern, which)
    "numeric": (r"ips (?P<value>[0-9.]+)", "median"),
    "numeric-all": (r"ips (?P<value>[0-9.]+)", "all"),
    "numeric-rare": (r"throughput (?P<value>[0-9.]+)", "median"),
    "empty": (r"(?P<value>)", "median"),
    "non-numeric": (r"(?P<value>[a-z]+)", "median"),
}


def write_log(path: Path, size_mib: float) -> None:
    """A training log of ``size_mib`` MiB: ``step N loss L ips X`` lines, a ``throughput``
    line every 1000."""
    target = int(size_mib * 2**20)
    with path.open("w", encoding="ascii") as fh:
        written = step = 0
        while written < target:
            chunk = "".join(
                f"step {i} loss {1 / (i + 1):.4f} ips {1000 + i % 97}.5\n"
                + (f"throughput {2000 + i % 13}.25 images/s\n" if i % 1000 == 999 else "")
                for i in range(step, step + 1000))
            fh.write(chunk)
            written += len(chunk)
            step += 1000


def measure_one(cell_dir: Path, pattern: str, which: str) -> dict[str, Any]:
    """In this process: read the cell's figures with ``pattern``; seconds, peak memory."""
    from orchestrator.config.figures import FiguresConfig
    from orchestrator.results.figures.figure_parsers import CellOutput, evaluate
    from orchestrator.results.folders import safejson

    config = FiguresConfig.model_validate(
        {"parser": "regex", "require_end": False,
         "regex": [{"name": "x", "pattern": pattern, "which": which}]})
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    output = CellOutput.from_cell_dir(cell_dir, {"mode": "train"})
    evaluation = evaluate(output, config)
    took = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = {"metrics": evaluation.figures.metrics, "reason": evaluation.reason,
              "provenance": evaluation.figures.info()}
    return {"seconds": took, "peak_mib": (peak - before) / 1024,
            "verdict": "ok" if evaluation.ok else evaluation.reason[:60],
            "result_kb": len(safejson.dumps(result)) / 1024}


def measure(cell_dir: Path, name: str, limit_s: float) -> dict[str, Any]:
    """:func:`measure_one` in a fresh process, stopped after ``limit_s`` seconds."""
    try:
        proc = subprocess.run([sys.executable, __file__, "--one", str(cell_dir), name],
                              capture_output=True, text=True, timeout=limit_s)
    except subprocess.TimeoutExpired:
        return {"seconds": None, "peak_mib": None, "verdict": f"still running at {limit_s:g} s",
                "result_kb": None}
    if proc.returncode != 0:
        return {"seconds": None, "peak_mib": None,
                "verdict": f"crashed: {proc.stderr.strip().splitlines()[-1:]}", "result_kb": None}
    return dict(json.loads(proc.stdout))


def _shown(value: float | None, fmt: str, limit_s: float) -> str:
    return f"> {limit_s:g}" if value is None and fmt == ".2f" else (
        "-" if value is None else format(value, fmt))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[1, 16, 64], metavar="MIB")
    parser.add_argument("--patterns", nargs="+", choices=list(PATTERNS), default=list(PATTERNS))
    parser.add_argument("--limit-s", type=float, default=300.0,
                        help="seconds one measurement may take (default 300)")
    parser.add_argument("--dry", action="store_true", help="a 0.05 MiB log, a 20 s limit")
    parser.add_argument("--one", nargs=2, metavar=("CELL_DIR", "NAME"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure_one(Path(args.one[0]), *PATTERNS[args.one[1]])))
        return 0
    sizes, limit_s = ([0.05], 20.0) if args.dry else (args.sizes, args.limit_s)
    rows = []
    with tempfile.TemporaryDirectory(prefix="figure-extraction-") as tmp:
        for size in sizes:
            cell_dir = Path(tmp) / f"cell-{size:g}"
            cell_dir.mkdir()
            write_log(cell_dir / "log.txt", size)
            for name in args.patterns:
                got = measure(cell_dir, name, limit_s)
                rows.append([f"{size:g}", name, _shown(got["seconds"], ".2f", limit_s),
                             _shown(got["peak_mib"], ".0f", limit_s),
                             _shown(got["result_kb"], ".1f", limit_s), got["verdict"]])
                print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    print(tabulate(rows, headers=["log MiB", "pattern", "seconds", "peak MiB", "result kB",
                                  "cell"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
