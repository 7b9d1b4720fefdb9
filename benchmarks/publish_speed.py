"""How long publishing takes, whether the round trip is exact, and what a server that is down
does: ``orchestrate publish`` against a real ``mlflow server`` and a real HTTP collector.

Makes (once, kept in ``--dir`` for re-runs) two run folders by real sweeps of the stand-in
workload (tests/standin/: real processes, the workload's files and JSON lines, no model):
a 100-cell sweep (10 configurations x 10 repeats, 100 iterations each: a 100-point step
series per cell) and a 1-cell sweep. Then, on a fresh server (its own SQLite store and artifact
folder, started from ``$ORCHESTRATE_MLFLOW_SERVER`` as the tests start it), measures:

* the first publish of each run to MLflow (every cell new), and publishing it again (nothing
  changed), in-process through the CLI's ``main`` (``--repeat`` times each, on fresh
  experiments: median and worst);
* the same to the HTTP collector (tests/infra/http_collector.py);
* the round trip: every difference between what the server holds (read back through its REST
  API with plain HTTP) and the run folder: cells, params, figures, step series, tags, status,
  artifacts (tests/publish_support.py's check, the one the tests run);
* ``orchestrate publish`` (a fresh process) and ``orchestrate matrix`` with ``after_sweep``
  against a port nothing listens on: exit status, the lines printed, the time taken, and
  whether the run folder is byte-identical afterwards.

    ORCHESTRATE_MLFLOW_SERVER=~/.cache/orchestrate/venv-mlflow-3.17.2/bin/mlflow \\
        python benchmarks/publish_speed.py [--dir /tmp/publish-bench] [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import importlib  # noqa: E402

from tabulate import tabulate  # noqa: E402

from benchmarks.common import cannot_run, dry_option  # noqa: E402
from orchestrator.cli import main  # noqa: E402
from orchestrator.results.folders.run_folder import RunPaths, find_run  # noqa: E402

# The tests' own server start-up, collector and round-trip check (tests/publish_support.py) and
# stand-in matrices (tests/standin_support.py): one definition for the tests and the figures.
support = importlib.import_module("publish_support")
standin_matrix = importlib.import_module("standin_support").standin_matrix
COLLECTOR, MlflowRest, _stop = support.COLLECTOR, support.MlflowRest, support._stop
free_port, round_trip_differences = support.free_port, support.round_trip_differences
start_mlflow_server = support.start_mlflow_server


def make_run(folder: Path, name: str, configs: int, repeats: int) -> RunPaths:
    """A run of ``configs`` x ``repeats`` stand-in cells under ``folder/results`` (made once)."""
    results = folder / "results"
    with contextlib.suppress(Exception):
        return find_run(results, name)
    matrix = folder / f"{name}.toml"
    text = standin_matrix(name).replace("iterations = 2", "iterations = 100").replace(
        f'[matrix]\nname = "{name}"\n', f'[matrix]\nname = "{name}"\nrepeats = {repeats}\n')
    axis = ", ".join(str(2 + i) for i in range(configs))
    matrix.write_text(text + f'\n[axes]\nbatch_size = [{axis}]\n\n[hardware.cpu]\n'
                      'device = "cpu"\n')
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "orchestrator", "-q", "matrix", str(matrix),
                           "--results", str(results), "--no-publish"], cwd=REPO,
                          capture_output=True, text=True, env={
                              **os.environ, "ORCHESTRATE_CONFIG": str(folder / "none.toml")})
    if done.returncode != 0:
        raise SystemExit(f"the sweep of {name} failed:\n{done.stderr[-3000:]}")
    print(f"made {name}: {configs * repeats} cells in {time.monotonic() - started:.0f} s",
          file=sys.stderr)
    return find_run(results, name)


def publish(run: RunPaths, *flags: str) -> tuple[float, int, str]:
    """``orchestrate publish`` in-process: seconds, exit status, what it printed."""
    out, err = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["publish", f"{run.root.parent.name}:{run.run_id}", "--results",
                     str(run.root.parents[1]), *flags])
    return time.perf_counter() - started, code, (out.getvalue() + err.getvalue()).strip()


def timed(run: RunPaths, repeat: int, flags: list[str], experiment: bool) -> list[list[float]]:
    """[first publish seconds..., again seconds...] over ``repeat`` fresh experiments."""
    firsts, agains = [], []
    for i in range(repeat):
        extra = ["--experiment", f"bench-{run.root.parent.name}-{time.time_ns()}-{i}"] \
            if experiment else []
        if not experiment:  # a fresh collector path: everything is sent again
            flags = [flags[0], f"{flags[1].rsplit('/', 1)[0]}/{time.time_ns()}"]
            (run.root / "publish.json").unlink(missing_ok=True)
        seconds, code, text = publish(run, *flags, *extra)
        assert code == 0, text
        firsts.append(seconds)
        seconds, code, text = publish(run, *flags, *extra)
        assert code == 0 and "unchanged" in text, text
        agains.append(seconds)
    return [firsts, agains]


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def server_down(folder: Path, big: RunPaths) -> list[list[object]]:
    """What `orchestrate publish` and a sweep with after_sweep do against a port nothing
    listens on."""
    down = f"http://127.0.0.1:{free_port()}"
    rows: list[list[object]] = []
    before = tree(big.root)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "orchestrator", "publish", big.root.parent.name,
                           "--results", str(big.root.parents[1]), "--mlflow", down],
                          cwd=REPO, capture_output=True, text=True)
    seconds = time.monotonic() - started
    intact = tree(big.root) == before
    rows.append(["orchestrate publish (100 cells)", done.returncode, f"{seconds:.1f}",
                 "yes" if intact else "NO", done.stderr.strip().splitlines()[0]])
    work = Path(tempfile.mkdtemp(dir=folder))
    matrix = work / "down.toml"
    matrix.write_text(standin_matrix("down") + '\n[hardware.cpu]\ndevice = "cpu"\n\n'
                      f'[publish]\nmlflow = "{down}"\nafter_sweep = true\n')
    started = time.monotonic()
    swept = subprocess.run([sys.executable, "-m", "orchestrator", "-q", "matrix", str(matrix),
                            "--results", str(work / "results")], cwd=REPO, capture_output=True,
                           text=True, env={**os.environ,
                                           "ORCHESTRATE_CONFIG": str(work / "none.toml")})
    seconds = time.monotonic() - started
    run = find_run(work / "results", "down")
    ok = all(c.status.value == "ok" for c in run.results())
    rows.append(["orchestrate matrix, after_sweep (1 cell)", swept.returncode, f"{seconds:.1f}",
                 "yes" if ok else "NO", swept.stderr.strip().splitlines()[-1]])
    shutil.rmtree(work)
    return rows


def main_() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/publish-bench"))
    parser.add_argument("--repeat", type=int, default=3)
    dry_option(parser, "the mlflow server looked for, nothing started")
    args = parser.parse_args()
    executable = os.environ.get("ORCHESTRATE_MLFLOW_SERVER")
    if not executable or not Path(executable).is_file():
        raise SystemExit(cannot_run(
            "set ORCHESTRATE_MLFLOW_SERVER to the mlflow executable of a venv with the full "
            "mlflow package (.ci/run makes one)"))
    if args.dry:
        print(f"would publish a 100-cell and a 1-cell run {args.repeat} times to an mlflow "
              f"server ({executable}) and an HTTP collector")
        return
    args.dir.mkdir(parents=True, exist_ok=True)
    os.environ["ORCHESTRATE_CONFIG"] = str(args.dir / "none.toml")
    big = make_run(args.dir, "hundred", 10, 10)
    one = make_run(args.dir, "one", 1, 1)

    server_root = Path(tempfile.mkdtemp(prefix="mlflow-bench-"))
    collector_root = Path(tempfile.mkdtemp(prefix="collector-bench-"))
    started = time.monotonic()
    server, uri = start_mlflow_server(executable, server_root)
    server_start = time.monotonic() - started
    port_file = collector_root / "port"
    collector = subprocess.Popen([sys.executable, str(COLLECTOR), "--port-file", str(port_file),
                                  "--store", str(collector_root / "got.jsonl")],
                                 start_new_session=True)
    try:
        while not port_file.exists():
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port_file.read_text()}/ok/bench"
        rows = []
        for run, label in ((big, "100 cells"), (one, "1 cell")):
            for target, flags, experiment in (("MLflow", ["--mlflow", uri], True),
                                              ("HTTP collector", ["--http", url], False)):
                first, again = timed(run, args.repeat, flags, experiment)
                rows.append([f"{target}, {label}", f"{statistics.median(first):.3f}",
                             f"{max(first):.3f}", f"{statistics.median(again):.3f}",
                             f"{max(again):.3f}"])
        print(f"mlflow server start-up: {server_start:.1f} s (SQLite store, first start)\n")
        print(tabulate(rows, headers=["publish", "first (s, median)", "worst", "again (s, median)",
                                      "worst"], tablefmt="github"))
        _, code, _ = publish(big, "--mlflow", uri, "--experiment", "round-trip")
        diffs = round_trip_differences(MlflowRest(uri), "round-trip", big.root)
        one_diffs = round_trip_differences(MlflowRest(uri), "one", one.root) if publish(
            one, "--mlflow", uri, "--experiment", "one")[1] == 0 else ["publish failed"]
        print(f"\nround trip, 100-cell run: {len(diffs)} differences; 1-cell run: "
              f"{len(one_diffs)} differences")
        for line in (diffs + one_diffs)[:10]:
            print(f"  {line}")
        print()
        print(tabulate(server_down(args.dir, big), headers=[
            "server down", "exit", "s", "results intact", "first line on stderr"],
            tablefmt="github"))
    finally:
        _stop(server)
        _stop(collector)
        shutil.rmtree(server_root, ignore_errors=True)
        shutil.rmtree(collector_root, ignore_errors=True)


if __name__ == "__main__":
    main_()
