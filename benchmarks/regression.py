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
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
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

from orchestrator.cli import main  # noqa: E402

MATRIX_FILE = REPO / "benchmarks" / "regression_matrix.toml"
MATRIX = "regression_bench"
SLOWDOWN = "0.10"


def collect(out: Path, runs: int, every: int) -> None:
    """Run the matrix ``runs`` times; every ``every``-th run with the slowdown injected."""
    log = out / "collect.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    for i in range(runs):
        injected = every > 0 and i % every == every - 1
        kind = "injected" if injected else "noise"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("WORKLOAD_INJECT_SLOWDOWN", None)
        if injected:
            env["WORKLOAD_INJECT_SLOWDOWN"] = SLOWDOWN
        t0 = time.time()
        done = subprocess.run([sys.executable, "-m", "orchestrator", "matrix", str(MATRIX_FILE),
                               "--results", str(out / kind)], env=env, capture_output=True,
                              text=True)
        record = {"i": i, "kind": kind, "rc": done.returncode, "s": round(time.time() - t0, 1),
                  "load": os.getloadavg()[0]}
        with log.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        print(json.dumps(record), flush=True)


def finished_runs(folder: Path) -> list[Path]:
    """Run folders of the matrix that ended, oldest first."""
    base = folder / MATRIX
    out = []
    for run in sorted(base.iterdir()) if base.is_dir() else []:
        meta = run / "run.json"
        if meta.is_file() and json.loads(meta.read_text()).get("finished_at"):
            out.append(run)
    return out


def assemble(dest: Path, earlier: list[Path], newest: Path) -> None:
    """A results folder: ``earlier`` in the given order, then ``newest``, one day apart."""
    for n, run in enumerate([*earlier, newest]):
        target = dest / MATRIX / f"20300101-{n:06d}-{run.name[-4:]}"
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
    with tempfile.TemporaryDirectory(prefix="regbench-") as tmp:
        assemble(Path(tmp), earlier, newest)
        argv = ["history", MATRIX, "--results", tmp, "--fail-on-regression",
                "--no-references", "--json", *options]
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
            code = main(argv)
    if code not in (0, 1):
        raise SystemExit(f"history exited {code}")
    return code == 1, json.loads(buf.getvalue())


def noise_summary(folder: Path, metric: str | None) -> str:
    """How noisy the plain runs are and how big the injected change came out, per
    configuration: robust sd (1.4826 x MAD) of plain runs' medians against the median of the
    other plain runs, and the injected runs' median change against the median of all plain
    runs."""
    import math

    from orchestrator.results.stats import loo_deviations
    from orchestrator.results.store import open_store

    def medians(kind: str) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        with open_store(folder / kind) as store, store.snapshot():
            for run in store.runs(MATRIX):
                if run.status == "unfinished":
                    continue
                values: dict[str, list[float]] = {}
                for cell in store.cells([run.pk], metric=metric):
                    if cell.ok and cell.value:
                        values.setdefault(cell.group, []).append(cell.value)
                for group, vals in values.items():
                    out.setdefault(group, []).append(statistics.median(vals))
        return out

    plain, injected = medians("noise"), medians("injected")
    lines = []
    for group, meds in sorted(plain.items()):
        devs = loo_deviations(meds)
        centre = statistics.median(devs)
        sd = 1.4826 * statistics.median(abs(d - centre) for d in devs)
        ref = statistics.median(meds)
        change = statistics.median(v / ref - 1 for v in injected.get(group, [ref]))
        lines.append(f"  {group}: plain runs' sd {math.expm1(sd):.1%}, injected runs' median "
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


def main_() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("collect", help="real runs of the matrix, some with the slowdown")
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--runs", type=int, default=24)
    p.add_argument("--inject-every", type=int, default=3)
    p = sub.add_parser("evaluate", help="false-positive and detection rates of the check")
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--min-history", type=int, default=3)
    p.add_argument("--trials", type=int, default=200, help="resampled trials of each kind")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--metric", help="as history --metric")
    p.add_argument("--threshold", help="as history --threshold (default: its default)")
    p.add_argument("--alpha", help="as history --alpha")
    args = parser.parse_args()
    if args.step == "collect":
        collect(args.dir, args.runs, args.inject_every)
        return
    options = []
    for name in ("metric", "threshold", "alpha"):
        if getattr(args, name):
            options += [f"--{name}", getattr(args, name)]
    evaluate(args.dir, args.window, args.min_history, args.trials, options, args.seed)


if __name__ == "__main__":
    main_()
