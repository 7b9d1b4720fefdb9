"""Time and peak memory of ``orchestrate import`` of one large DLLogger raport.

A long DLE training run with ``--print-freq 1`` writes one ``DLLL`` record per iteration: a
raport of hundreds of MB. This writes such a raport (``--mb`` MB of iteration records in DLE's
form, a PARAMETER record first and the run summary last), then runs the real CLI in a fresh
process (``python -m orchestrator import RAPORT --matrix ... --param hardware=v100``) into an
empty results folder, ``--repeat`` times, and prints the wall time and the child's peak
resident memory (its own ``ru_maxrss``, from ``wait4``) of each.

    python benchmarks/import_speed.py [--mb 200] [--repeat 1] [--repo PATH]

``--repo`` runs another checkout's orchestrator (e.g. the code before a change) on the same
file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import dry_option  # noqa: E402


def write_raport(path: Path, megabytes: int) -> int:
    """A DLE-style raport of about ``megabytes`` MB; the number of iteration records."""
    start = 1767225600.0
    target = megabytes * 2**20
    with path.open("w", encoding="utf-8") as fh:
        fh.write("DLLL " + json.dumps({
            "timestamp": str(start), "datetime": "2026-01-01 00:00:00.000000",
            "elapsedtime": 0.0, "type": "LOG", "step": "PARAMETER",
            "data": {"arch": "resnet50", "batch_size": 256, "world_size": 8, "amp": True}})
            + "\n")
        written, i = 0, 0
        while written < target:
            i += 1
            line = "DLLL " + json.dumps({
                "timestamp": f"{start + i * 0.1:.6f}", "datetime": "2026-01-01 00:00:00.000000",
                "elapsedtime": i * 0.1, "type": "LOG", "step": [i // 5000, i % 5000 + 1],
                "data": {"train.loss": 6.9 - i * 1e-7, "train.total_ips": 20000.0 + i % 97,
                         "train.compute_ips": 21000.0 + i % 89,
                         "train.data_time": 0.001 + (i % 7) * 1e-5,
                         "train.compute_time": 0.1 + (i % 11) * 1e-4, "train.lr": 0.256}}) + "\n"
            fh.write(line)
            written += len(line)
        fh.write("DLLL " + json.dumps({
            "timestamp": f"{start + (i + 1) * 0.1:.6f}", "type": "LOG", "step": [],
            "data": {"train.total_ips": 20048.0}}) + "\n")
    return i


def run_import(repo: Path, raport: Path, results: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one import in a fresh process (its own ``wait4``
    rusage, not the running maximum over every child of this process)."""
    env = {**os.environ, "PYTHONPATH": str(repo)}
    with tempfile.TemporaryFile() as stderr:
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "import", str(raport),
                                 "--matrix", "big", "--param", "hardware=v100", "--results",
                                 str(results)], cwd=repo, env=env, stdout=subprocess.DEVNULL,
                                stderr=stderr)
        _, status, usage = os.wait4(proc.pid, 0)
        took = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            stderr.seek(0)
            raise SystemExit(f"import failed ({proc.returncode}): "
                             f"{stderr.read().decode(errors='replace')[-2000:]}")
    return took, usage.ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--repo", type=Path, default=REPO)
    parser.add_argument("--keep", type=Path, help="write (or reuse) the raport here")
    dry_option(parser, "a 1 MB raport imported once")
    args = parser.parse_args()
    if args.dry:
        args.mb, args.repeat, args.keep = 1, 1, None
    with tempfile.TemporaryDirectory(prefix="import-speed-") as tmp:
        raport = args.keep or Path(tmp) / "raport.json"
        if not raport.exists():
            records = write_raport(raport, args.mb)
            print(f"raport: {raport.stat().st_size / 2**20:.0f} MB, {records:,} iteration "
                  "records", file=sys.stderr)
        rows = []
        for n in range(args.repeat):
            took, peak = run_import(args.repo, raport, Path(tmp) / f"results-{n}")
            rows.append([f"{raport.stat().st_size / 2**20:.0f}", n + 1, f"{took:.1f}",
                         f"{peak:,.0f}"])
    print(tabulate(rows, headers=["raport MB", "run", "seconds", "peak RSS MB"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
