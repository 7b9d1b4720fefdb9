"""Does ``orchestrate history --fail-on-regression`` hold up on real, noisy reruns?

Two steps, on this machine (busy with other work, as lab machines are):

``collect``: real sweeps of ``benchmarks/regression_matrix.toml`` (4 configurations x 3
repeats, CPU), one after another: every ``--inject-every``-th run with
``WORKLOAD_INJECT_SLOWDOWN=0.10`` (each measured step sleeps 10 % of its own duration: its
throughput drops to 1/1.1, -9.1 %), the others plain. Plain runs go to ``DIR/noise``, injected
ones to ``DIR/injected``; interleaving them spreads the machine's drift over both.

``evaluate``: trials of the real CLI (``orchestrator.cli.main(["history", ...,
"--fail-on-regression"])``, in-process) on results folders assembled from those runs (copies of
their ``run.json``, ``plan.json`` and ``result.json`` files, with start times rewritten so the
run under test is the newest):

* **false positives**: the run under test is a plain run. *Rolling*: each plain run against
  the plain runs before it in time (up to ``--window``), as a nightly job sees them; trials
  start once ``--min-history`` runs precede. *Resampled*: each plain run against
  ``--window`` plain runs drawn at random (seeded) from all the others, ``--trials`` times.
* **detection**: the run under test is an injected run; earlier runs as above (plain runs
  only, before it in time for rolling; drawn from all plain runs for resampled).

A trial counts as flagged when the command exits 1. The verdict's settings are the CLI's
defaults unless given (``--metric`` as ``--metric`` of history). Resampled trials share runs
(the number of distinct runs under test is printed): they smooth the estimate, they do not add
independent evidence.

    python benchmarks/regression.py collect --dir /tmp/regbench --runs 24 --inject-every 3
    python benchmarks/regression.py evaluate --dir /tmp/regbench [--metric train.step_ips_p90]

**With a control** (``--control``, issue 25): ``collect --control`` runs
``benchmarks/regression_control_matrix.toml`` instead, whose ``[control]`` (a pinned command
the injected slowdown cannot reach) the sweep runs between the cells on the same machine; each
run takes a fresh random cell order (its seed in plan.json). ``evaluate --control`` then judges
every trial four ways on the same runs, side by side: images/s and ``train.step_ips_p90``, each
raw (``history --raw``: as without a control) and normalised (the default: each cell's figure
divided by the control measured beside it), and prints the noise of the raw figure against
that of the ratio. Collection sets ``ORCHESTRATE_LOCK_DIR`` to a folder of its own: the other
work on the machine (its load is the drift under test) neither waits for the benchmark's cells
nor holds them up.

    python benchmarks/regression.py collect --control --dir /tmp/regctl --runs 17 --inject-every 3
    python benchmarks/regression.py evaluate --control --dir /tmp/regctl --trials 200
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import dry_option  # noqa: E402
from orchestrator.cli import main  # noqa: E402

MATRIX_FILE = REPO / "benchmarks" / "regression_matrix.toml"
MATRIX = "regression_bench"
CONTROL_MATRIX_FILE = REPO / "benchmarks" / "regression_control_matrix.toml"
CONTROL_MATRIX = "regression_control"
SLOWDOWN = "0.10"


def _uptime() -> str:
    """``uptime``'s line (load averages over 1, 5 and 15 minutes), as the machine says it."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10
                              ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def collect(out: Path, runs: int, every: int, control: bool = False) -> None:
    """Run the matrix ``runs`` times; every ``every``-th run with the slowdown injected."""
    log = out / "collect.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    matrix_file = CONTROL_MATRIX_FILE if control else MATRIX_FILE
    for i in range(runs):
        injected = every > 0 and i % every == every - 1
        kind = "injected" if injected else "noise"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("WORKLOAD_INJECT_SLOWDOWN", None)
        if injected:
            env["WORKLOAD_INJECT_SLOWDOWN"] = SLOWDOWN
        if control:
            env["ORCHESTRATE_LOCK_DIR"] = str(out / "locks")
        t0 = time.time()
        before = _uptime()
        done = subprocess.run([sys.executable, "-m", "orchestrator", "matrix", str(matrix_file),
                               "--results", str(out / kind)], env=env, capture_output=True,
                              text=True)
        record = {"i": i, "kind": kind, "rc": done.returncode, "s": round(time.time() - t0, 1),
                  "load": os.getloadavg()[0], "uptime_before": before,
                  "uptime_after": _uptime()}
        if done.returncode != 0:
            record["stderr_tail"] = done.stderr[-2000:]
        with log.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        print(json.dumps(record), flush=True)


def finished_runs(folder: Path, matrix: str = MATRIX) -> list[Path]:
    """Run folders of the matrix that ended, oldest first."""
    base = folder / matrix
    out = []
    for run in sorted(base.iterdir()) if base.is_dir() else []:
        meta = run / "run.json"
        if meta.is_file() and json.loads(meta.read_text()).get("finished_at"):
            out.append(run)
    return out


def assemble(dest: Path, earlier: list[Path], newest: Path) -> None:
    """A results folder: ``earlier`` in the given order, then ``newest``, one day apart."""
    for n, run in enumerate([*earlier, newest]):
        target = dest / run.parent.name / f"20300101-{n:06d}-{run.name[-4:]}"
        (target / "cells").mkdir(parents=True)
        shutil.copy(run / "plan.json", target / "plan.json")
        meta = json.loads((run / "run.json").read_text())
        started = 1.9e9 + n * 86400
        meta.update(started_at=started, finished_at=started + 100, run_id=target.name)
        (target / "run.json").write_text(json.dumps(meta))
        for result in (run / "cells").glob("*/result.json"):
            (target / "cells" / result.parent.name).mkdir()
            shutil.copy(result, target / "cells" / result.parent.name / "result.json")


def flagged(earlier: list[Path], newest: Path, options: list[str]) -> tuple[bool, dict]:
    """Run the history check on these runs; (exit code was 1, its --json report)."""
    return flagged_ways(earlier, newest, [options])[0]


def flagged_ways(earlier: list[Path], newest: Path, ways: list[list[str]]
                 ) -> list[tuple[bool, dict]]:
    """The history check on these runs once per option list (one results folder, one index):
    for each, (exit code was 1, its --json report)."""
    out = []
    with tempfile.TemporaryDirectory(prefix="regbench-") as tmp:
        assemble(Path(tmp), earlier, newest)
        for options in ways:
            argv = ["history", newest.parent.name, "--results", tmp, "--fail-on-regression",
                    "--no-references", "--json", *options]
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
                code = main(argv)
            if code not in (0, 1):
                raise SystemExit(f"history exited {code}")
            out.append((code == 1, json.loads(buf.getvalue())))
    return out


def run_medians(folder: Path, matrix: str, metric: str | None, normalised: bool = False
                ) -> dict[str, list[float]]:
    """Per configuration (cell group), each ended run's median of its ok repeats: of the
    figure, or of its ratio to the control (``normalised``)."""
    from orchestrator.results.folders.store import open_store

    out: dict[str, list[float]] = {}
    with open_store(folder) as store, store.snapshot():
        for run in store.runs(matrix):
            if run.status == "unfinished":
                continue
            values: dict[str, list[float]] = {}
            for cell in store.cells([run.pk], metric=metric):
                value = cell.norm if normalised else cell.value
                if cell.ok and value and not cell.is_control:
                    values.setdefault(cell.group, []).append(value)
            for group, vals in values.items():
                out.setdefault(group, []).append(statistics.median(vals))
    return out


def log_robust_sd(values: list[float]) -> float:
    """Robust sd (1.4826 x MAD) of log values, as a fraction."""
    centre = statistics.median(values)
    return math.expm1(1.4826 * statistics.median(abs(v - centre) for v in values))


def robust_sd(medians: list[float]) -> float:
    """Robust sd (1.4826 x MAD) of the runs' leave-one-out log deviations, as a fraction."""
    from orchestrator.results.statistics.stats import loo_deviations

    return log_robust_sd(loo_deviations(medians))


def noise_summary(folder: Path, metric: str | None, matrix: str = MATRIX,
                  normalised: bool = False) -> str:
    """How noisy the plain runs are and how big the injected change came out, per
    configuration: robust sd (1.4826 x MAD) of plain runs' medians against the median of the
    other plain runs, and the injected runs' median change against the median of all plain
    runs."""
    plain = run_medians(folder / "noise", matrix, metric, normalised)
    injected = run_medians(folder / "injected", matrix, metric, normalised)
    lines = []
    for group, meds in sorted(plain.items()):
        if len(meds) < 3:
            continue
        ref = statistics.median(meds)
        change = statistics.median(v / ref - 1 for v in injected.get(group, [ref]))
        lines.append(f"  {group}: plain runs' sd {robust_sd(meds):.1%}, injected runs' median "
                     f"change {change:+.1%}")
    return "\n".join(lines)


def rate(results: list[bool]) -> str:
    if not results:
        return "no trials"
    return f"{sum(results)}/{len(results)} = {sum(results) / len(results):.1%}"


def evaluate(folder: Path, window: int, min_history: int, trials: int, options: list[str],
             seed: int) -> None:
    noise = finished_runs(folder / "noise")
    injected = finished_runs(folder / "injected")
    print(f"runs: {len(noise)} plain, {len(injected)} injected ({SLOWDOWN} slowdown); "
          f"window {window}, min history {min_history}; options: {' '.join(options) or '-'}")
    metric = options[options.index("--metric") + 1] if "--metric" in options else None
    print(noise_summary(folder, metric))
    opts = ["--window", str(window), "--min-history", str(min_history), *options]
    rng = random.Random(seed)

    def before(run: Path) -> list[Path]:
        return [r for r in noise if r.name < run.name][-window:]

    rolled = [flagged(before(r), r, opts) for r in noise if len(before(r)) >= min_history]
    fp_roll = [hit for hit, _ in rolled]
    detectable = [line["detectable_drop"] for _, report in rolled for line in report["lines"]
                  if line.get("detectable_drop") is not None]
    tp_roll = [flagged(before(r), r, opts)[0] for r in injected
               if len(before(r)) >= min_history]
    fp_res, tp_res = [], []
    for _ in range(trials):
        run = rng.choice(noise)
        others = [r for r in noise if r != run]
        fp_res.append(flagged(sorted(rng.sample(others, min(window, len(others)))), run,
                              opts)[0])
        if injected:
            run = rng.choice(injected)
            tp_res.append(flagged(sorted(rng.sample(noise, min(window, len(noise)))), run,
                                  opts)[0])
    print(f"  false positives, rolling (nightly order): {rate(fp_roll)}")
    print(f"  false positives, resampled histories:     {rate(fp_res)} "
          f"({len(noise)} distinct plain runs under test)")
    print(f"  detection, rolling:                       {rate(tp_roll)}")
    print(f"  detection, resampled histories:           {rate(tp_res)} "
          f"({len(injected)} distinct injected runs under test)")
    if detectable:
        print(f"  drop the check catches 95 % of the time (history's 'detects', rolling): "
              f"median {statistics.median(detectable):.1%}, range "
              f"{min(detectable):.1%}..{max(detectable):.1%}")


def diagnose(folder: Path, matrix: str, metric: str | None) -> list[str]:
    """Why the ratio does (not) cancel the noise, from every cell of the plain runs: the sd of
    a cell's log figure around its configuration's median (raw) and of its log ratio to the
    control, the correlation of the cell's log figure with its control reference's, and how
    much the control itself moves between two successive measurements."""
    from orchestrator.results.folders.store import open_store

    raw: dict[str, list[float]] = {}
    ratio: dict[str, list[float]] = {}
    steps: list[float] = []
    gaps: list[float] = []
    with open_store(folder) as store, store.snapshot():
        for run in store.runs(matrix):
            if run.status == "unfinished":
                continue
            cells = store.cells([run.pk], metric=metric)
            controls = sorted((c for c in cells if c.is_control and c.ok and c.value),
                              key=lambda c: c.started_at or 0.0)
            for a, b in zip(controls, controls[1:], strict=False):
                steps.append(math.log(b.value / a.value))  # type: ignore[operator]
                gaps.append((b.started_at or 0.0) - (a.started_at or 0.0))
            for c in cells:
                if c.is_control or not c.ok or not c.value or not c.norm:
                    continue
                raw.setdefault(c.group, []).append(math.log(c.value))
                ratio.setdefault(c.group, []).append(math.log(c.norm))

    def centred(groups: dict[str, list[float]]) -> list[float]:
        return [v - statistics.median(vals) for vals in groups.values() for v in vals]

    x, r = centred(raw), centred(ratio)
    ref = [a - b for a, b in zip(x, r, strict=True)]  # log reference, centred alike
    corr = statistics.correlation(x, ref) if len(x) > 2 else float("nan")

    return [f"  cells' robust sd around their configuration's median: raw "
            f"{log_robust_sd(x):.1%}, ratio {log_robust_sd(r):.1%}, the control reference "
            f"{log_robust_sd(ref):.1%}; correlation of a cell's log figure with its reference's "
            f"{corr:+.2f} ({len(x)} cells)",
            f"  the control between two successive measurements ({statistics.median(gaps):.0f} s"
            f" apart, median): robust sd {log_robust_sd(steps):.1%} of the log change "
            f"({len(steps)} pairs)"]


#: The four ways ``evaluate --control`` judges each trial: (figure, basis, history options).
WAYS: tuple[tuple[str, str, list[str]], ...] = (
    ("images/s", "raw", ["--raw"]),
    ("images/s", "÷control", []),
    ("step p90", "raw", ["--metric", "train.step_ips_p90", "--raw"]),
    ("step p90", "÷control", ["--metric", "train.step_ips_p90"]),
)


def evaluate_control(folder: Path, window: int, min_history: int, trials: int,
                     options: list[str], seed: int) -> None:
    """False alarms and detections of the check on the same runs, judged four ways (images/s
    and p90, raw and as a ratio to the control), side by side; and the noise of each."""
    from tabulate import tabulate

    noise = finished_runs(folder / "noise", CONTROL_MATRIX)
    injected = finished_runs(folder / "injected", CONTROL_MATRIX)
    print(f"runs: {len(noise)} plain, {len(injected)} injected ({SLOWDOWN} slowdown into the "
          f"configurations, not the control); window {window}, min history {min_history}; "
          f"options: {' '.join(options) or '-'}")
    for figure, metric in (("images/s", None), ("step p90", "train.step_ips_p90")):
        for label, normalised in (("raw", False), ("÷control", True)):
            print(f"{figure}, {label}, plain runs' medians:")
            print(noise_summary(folder, metric, CONTROL_MATRIX, normalised))
        print(f"{figure}, every cell of the plain runs:")
        print("\n".join(diagnose(folder / "noise", CONTROL_MATRIX, metric)))
    ways = [["--window", str(window), "--min-history", str(min_history), *options, *extra]
            for _, _, extra in WAYS]
    rng = random.Random(seed)

    def before(run: Path) -> list[Path]:
        return [r for r in noise if r.name < run.name][-window:]

    def trial(earlier: list[Path], run: Path) -> list[tuple[bool, dict]]:
        return flagged_ways(earlier, run, ways)

    fp_roll = [trial(before(r), r) for r in noise if len(before(r)) >= min_history]
    tp_roll = [trial(before(r), r) for r in injected if len(before(r)) >= min_history]
    fp_res, tp_res = [], []
    for _ in range(trials):
        run = rng.choice(noise)
        others = [r for r in noise if r != run]
        fp_res.append(trial(sorted(rng.sample(others, min(window, len(others)))), run))
        if injected:
            run = rng.choice(injected)
            tp_res.append(trial(sorted(rng.sample(noise, min(window, len(noise)))), run))
    rows = []
    for w, (figure, basis, _) in enumerate(WAYS):
        detects = [line["detectable_drop"] for got in fp_roll for line in got[w][1]["lines"]
                   if line.get("detectable_drop") is not None]
        judged = [line["basis"] for got in fp_roll + tp_roll for line in got[w][1]["lines"]
                  if line.get("change") is not None]
        rows.append([
            figure, basis,
            rate([got[w][0] for got in fp_roll]), rate([got[w][0] for got in fp_res]),
            rate([got[w][0] for got in tp_roll]), rate([got[w][0] for got in tp_res]),
            (f"{statistics.median(detects):.1%} ({min(detects):.1%}..{max(detects):.1%})"
             if detects else ""),
            f"{sum(b == 'normalised' for b in judged)}/{len(judged)}",
        ])
    print(tabulate(rows, headers=["figure", "judged on", "false alarms, rolling", "resampled",
                                  "detected, rolling", "resampled", "detects (median, range)",
                                  "lines on ratio"], tablefmt="github", disable_numparse=True))
    print(f"({len(noise)} distinct plain and {len(injected)} distinct injected runs under test; "
          "resampled trials share them)")


def main_() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    dry_option(parser, "both matrices validated and planned, nothing run")
    sub = parser.add_subparsers(dest="step")
    p = sub.add_parser("collect", help="real runs of the matrix, some with the slowdown")
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--runs", type=int, default=24)
    p.add_argument("--inject-every", type=int, default=3)
    p.add_argument("--control", action="store_true",
                   help="the matrix with a [control] (regression_control_matrix.toml)")
    p = sub.add_parser("evaluate", help="false-positive and detection rates of the check")
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--control", action="store_true",
                   help="runs collected with --control: judged raw and as ratios, side by side")
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--min-history", type=int, default=3)
    p.add_argument("--trials", type=int, default=200, help="resampled trials of each kind")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--metric", help="as history --metric")
    p.add_argument("--threshold", help="as history --threshold (default: its default)")
    p.add_argument("--alpha", help="as history --alpha")
    args = parser.parse_args()
    if args.dry:
        from orchestrator.plan.matrix import load_matrix

        for path in (MATRIX_FILE, CONTROL_MATRIX_FILE):
            matrix = load_matrix(path)
            print(f"would collect runs of {path.name}: {len(matrix.cells)} cells each "
                  f"({len(matrix.controls)} control), then judge them")
        return
    if args.step is None:
        parser.error("choose a step: collect or evaluate")
    if args.step == "collect":
        collect(args.dir, args.runs, args.inject_every, args.control)
        return
    options = []
    for name in ("metric", "threshold", "alpha"):
        if getattr(args, name):
            options += [f"--{name}", getattr(args, name)]
    if args.control:
        if args.metric:
            parser.error("evaluate --control judges images/s and train.step_ips_p90 both")
        evaluate_control(args.dir, args.window, args.min_history, args.trials, options,
                         args.seed)
        return
    evaluate(args.dir, args.window, args.min_history, args.trials, options, args.seed)


if __name__ == "__main__":
    main_()
