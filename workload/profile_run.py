"""Run a profiler, then its own CSV export, in one command: argv only, never a shell.

``python -m workload.profile_run --tool nsys|ncu|nvprof --out DIR [--no-stats] -- TOOL-ARGV...``

``TOOL-ARGV`` is the whole profiled command (``nsys profile ... python -m workload ...``), as
``orchestrator/plan/profilers.py`` builds it; the tool writes its report as ``DIR/profile.*``.
Steps:

1. Check: the tool is on ``PATH`` and, for nvprof, no visible GPU has compute capability 8.0 or
   more (asked from ``nvidia-smi`` when it is there). A failed check prints one JSON ``error``
   line (the workload's contract) saying which tool to use instead, and exits 2.
2. Run the command; stdin/stdout/stderr pass through, SIGTERM and SIGINT are forwarded.
3. Export what the tool wrote, whatever the exit status, when the report exists (the tool's
   output goes to stderr, the CSV to the file):

   * nsys: ``nsys stats --report cuda_gpu_kern_sum --format csv REPORT`` -> ``nsys_kern_sum.csv``
     and ``cuda_gpu_trace`` -> ``nsys_gpu_trace.csv``; nsys before 2023 calls the reports
     ``gpukernsum`` / ``gputrace`` (tried when the new name fails). ``--no-stats`` skips this.
     The report is ``profile.nsys-rep`` (``profile.qdrep`` before nsys 2021.4).
   * ncu: ``ncu --import profile.ncu-rep --csv --page raw --print-units base`` -> ``ncu.csv``
     (without ``--print-units`` when that ncu does not know it).
   * nvprof: nothing; it writes ``nvprof.<pid>.csv`` itself.
4. Record what ran in ``DIR/profile_run.json`` (commands, exit statuses, report names used).

The exit status is the profiled command's (nsys, ncu and nvprof return the program's). Imports
only the standard library.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

#: Reports of ``nsys stats``, each with its names from the newest nsys to the oldest.
NSYS_REPORTS: dict[str, tuple[str, ...]] = {
    "nsys_kern_sum.csv": ("cuda_gpu_kern_sum", "gpukernsum"),
    "nsys_gpu_trace.csv": ("cuda_gpu_trace", "gputrace"),
}
NCU_CSV = "ncu.csv"
RECORD = "profile_run.json"

#: What to use instead when a tool is missing from the image.
MISSING_HINT = {
    "nsys": "install Nsight Systems in the image (NGC PyTorch images ship it), or use "
            "profiler = 'torch'",
    "ncu": "install Nsight Compute in the image (NGC PyTorch images ship it), or use "
           "profiler = 'nsys'",
    "nvprof": "CUDA 12 toolkits dropped nvprof: use profiler = 'ncu' (metrics) or 'nsys' "
              "(timeline), or an image with CUDA 11 or older",
}


class CheckFailed(Exception):
    """The tool cannot run here; the message says what to do."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m workload.profile_run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tool", choices=("nsys", "ncu", "nvprof"), required=True)
    p.add_argument("--out", required=True, metavar="DIR", help="where the tool's report is")
    p.add_argument("--no-stats", dest="stats", action="store_false",
                   help="nsys: skip the CSV export")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the tool's whole command")
    return p


def check(tool: str, command: Sequence[str], which: Any = shutil.which,
          capabilities: Any = None) -> None:
    """Raise :class:`CheckFailed` when ``command`` cannot profile here."""
    if not command:
        raise CheckFailed("no command to profile after --")
    if which(command[0]) is None:
        raise CheckFailed(f"{command[0]} is not on PATH in this image: {MISSING_HINT[tool]}")
    if tool == "nvprof":
        caps = gpu_capabilities() if capabilities is None else capabilities
        new = [c for c in caps if c >= (8, 0)]
        if new:
            raise CheckFailed(
                f"nvprof does not support GPUs of compute capability {new[0][0]}.{new[0][1]} "
                "(Ampere and later): use profiler = 'ncu' for the pipe utilisation metrics or "
                "'nsys' for a timeline")


def gpu_capabilities() -> list[tuple[int, int]]:
    """Compute capabilities of the visible GPUs from ``nvidia-smi`` (empty when unknown)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []  # an old driver without the compute_cap field: the workload checks too
    return parse_capabilities(out)


def parse_capabilities(text: str) -> list[tuple[int, int]]:
    """``8.0\\n9.0`` -> ``[(8, 0), (9, 0)]``; unparsable lines are skipped."""
    caps = []
    for line in text.splitlines():
        major, dot, minor = line.strip().partition(".")
        if dot and major.isdigit() and minor.isdigit():
            caps.append((int(major), int(minor)))
    return caps


def run_forwarding(command: Sequence[str]) -> int:
    """Run ``command`` in the foreground; SIGTERM/SIGINT go to it. Returns its exit status."""
    proc = subprocess.Popen(list(command))

    def forward(signum: int, frame: FrameType | None) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return proc.wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _run_to_file(command: list[str], path: Path) -> int:
    """Run ``command`` with its stdout in ``path`` (removed again when it fails)."""
    try:
        with path.open("w") as fh:
            code = subprocess.run(command, stdout=fh, check=False).returncode
    except OSError as exc:
        print(f"[profile_run] {command[0]}: {exc}", file=sys.stderr)
        code = 127
    if code != 0:
        path.unlink(missing_ok=True)
    return code


def export_nsys(exe: str, out: Path) -> list[dict[str, Any]]:
    """``nsys stats`` CSV exports of ``out/profile.nsys-rep`` (or ``.qdrep``)."""
    report = next((p for p in (out / "profile.nsys-rep", out / "profile.qdrep") if p.exists()),
                  None)
    if report is None:
        return [{"step": "nsys stats", "skipped": "no report (nothing captured?)"}]
    steps = []
    for file, names in NSYS_REPORTS.items():
        step: dict[str, Any] = {"step": "nsys stats", "file": file, "tried": []}
        for name in names:
            command = [exe, "stats", "--report", name, "--format", "csv", str(report)]
            code = _run_to_file(command, out / file)
            step["tried"].append({"report": name, "exit": code})
            if code == 0:
                step["report"] = name
                break
        steps.append(step)
    return steps


def export_ncu(exe: str, out: Path) -> list[dict[str, Any]]:
    """``ncu --import ... --csv --page raw`` of ``out/profile.ncu-rep``."""
    report = out / "profile.ncu-rep"
    if not report.exists():
        return [{"step": "ncu import", "skipped": "no report (nothing captured?)"}]
    base = [exe, "--import", str(report), "--csv", "--page", "raw"]
    step: dict[str, Any] = {"step": "ncu import", "file": NCU_CSV, "tried": []}
    for command in ([*base, "--print-units", "base"], base):
        code = _run_to_file(command, out / NCU_CSV)
        step["tried"].append({"argv": command[1:], "exit": code})
        if code == 0:
            break
    return [step]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    out = Path(args.out)
    try:
        check(args.tool, command)
    except CheckFailed as exc:
        print(f"[profile_run] error: {exc}", file=sys.stderr)
        print(json.dumps({"type": "error", "kind": "config", "rank": 0, "message": str(exc)}),
              flush=True)
        return 2
    code = run_forwarding(command)
    exe = shutil.which(command[0]) or command[0]
    steps: list[dict[str, Any]] = []
    if args.tool == "nsys" and args.stats:
        steps = export_nsys(exe, out)
    elif args.tool == "ncu":
        steps = export_ncu(exe, out)
    record = {"tool": args.tool, "command": command, "exit": code, "exports": steps}
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    except OSError as exc:
        print(f"[profile_run] {RECORD} not written: {exc}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
