"""The seeds' own analysis scripts as oracles for our import and report.

DLPerf's ``extract_pytorch_logs_time.py`` (seed 003's table: the seed's revision 183b8d1 in
``dlperf/183b8d1/``, and c89430ba) and TBD's ``coreutil.py`` (seed 001's) are in the peers
folder (``$ORCHESTRATE_PEERS``, ``../shared/peers``, ``/work/shared/peers``; never copied into
the project). Each test writes logs in the script's format from known numbers
(tests/seed_logs_support.py), runs the script on them, runs ``orchestrate import`` and the table
rule on the same logs, and checks the figures agree to the rounding the script prints.

What they need: DLPerf's script numpy (in the test venv); coreutil.py pandas older than 2.2 (it
calls ``int()`` on a one-row Series) and tqdm, which the project's own venv does not pin: CI
makes a venv for them (``.ci/run``: ``oracle_venv``) and names its interpreter in
``$ORCHESTRATE_ORACLE_PYTHON``. Without one the coreutil test skips (fails under ``CI=true``).
"""

from __future__ import annotations

import ast
import os
import random
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from results_support import import_results
from seed_logs_support import dlperf_dllogger_log, dlperf_examples_log, ncu_csv, write
from service_support import unavailable

from orchestrator.results.figures import foreign_logs as fl
from orchestrator.results.folders.run_folder import RunPaths
from orchestrator.results.importer import ImportOptions
from orchestrator.results.reports.summary import summarize_run

HERE = Path(__file__).resolve()


def peers_dir() -> Path:
    """The peers folder, as .ci/run finds it; skip (fail under CI=true) without one."""
    for base in (os.environ.get("ORCHESTRATE_PEERS"), HERE.parents[2] / "shared" / "peers",
                 "/work/shared/peers"):
        if base and (Path(base) / "dlperf").is_dir():
            return Path(base)
    unavailable("no peers folder with dlperf/ and tbd/ (set ORCHESTRATE_PEERS)")
    raise AssertionError("unreachable")


def oracle_python() -> str:
    """An interpreter with pandas < 2.2 and tqdm (coreutil.py's needs)."""
    python = os.environ.get("ORCHESTRATE_ORACLE_PYTHON")
    if python and Path(python).exists():
        return python
    unavailable("ORCHESTRATE_ORACLE_PYTHON is not set: coreutil.py needs pandas<2.2 and tqdm "
                "(.ci/run's oracle_venv makes them)")
    raise AssertionError("unreachable")


def dlperf_folder(root: Path, *, runs: int = 5, seed: int = 1) -> dict[str, list[list[float]]]:
    """DLPerf's layout (1n1g, 1n4g, 1n8g, r50_b128_fp32_<run>.log) in pytorch/examples'
    format, runs of different lengths; the first iterations slow (DLPerf skips index <= 5 and 20
    lines more)."""
    rng = random.Random(seed)
    made: dict[str, list[list[float]]] = {}
    for gpus, base in ((1, 0.350), (4, 0.355), (8, 0.366)):
        for run in range(1, runs + 1):
            times = [rng.uniform(1.0, 3.0) if i < 3 else rng.gauss(base, 0.008)
                     for i in range(126 + run)]
            made.setdefault(f"1n{gpus}g", []).append(times)
            write(root / f"1n{gpus}g" / f"r50_b128_fp32_{run}.log",
                  dlperf_examples_log(times, per_epoch=10009, seed=run))
    return made


def run_dlperf(peers: Path, log_dir: Path, out: Path) -> dict[str, Any]:
    """DLPerf's script on ``log_dir``; its final dict, as it pretty-prints it."""
    done = subprocess.run(
        [sys.executable, str(peers / "dlperf" / "extract_pytorch_logs_time.py"), "--log_dir",
         str(log_dir), "--output_dir", str(out), "--warmup_batches", "20", "--train_batches",
         "120", "--batch_size_per_device", "128"],
        capture_output=True, text=True, timeout=120, check=True)
    text = done.stdout
    start = text.index("{'r50'")
    return ast.literal_eval(text[start:text.index("Saving result to")].strip())


@pytest.mark.subprocess  # runs the seed's own script
def test_dlperf_script_and_our_import_give_the_same_table(tmp_path: Path) -> None:
    """Seed 003's numbers: DLPerf's median, mean and speedup per configuration, ours beside."""
    peers = peers_dir()
    logs = tmp_path / "ngc" / "pytorch"
    dlperf_folder(logs)
    theirs = run_dlperf(peers, logs, tmp_path / "out")["r50"]
    paths, plan = import_results([logs], ImportOptions(
        matrix="dlperf_seed003", results_root=tmp_path / "results",
        params=["hardware=v100"]))
    assert {e.kind for e in plan.entries} == {"dlperf-log"}
    assert plan.target.table_rule == "dlperf"
    rows, table = summarize_run(RunPaths(paths.root))
    ours = {f"1n{r.params['gpus']}g": r for r in rows}
    assert set(ours) == set(theirs) == {"1n1g", "1n4g", "1n8g"}
    for case, row in ours.items():
        assert row.ips == theirs[case]["median_speed"], case
        assert row.ips_mean == theirs[case]["average_speed"], case
        assert (row.speedup or 1.0) == theirs[case]["speedup"], case
    # what every run gave, per log: the script prints them as {run: speed}
    assert "table rule: dlperf" in table and "samples/s (DLPerf median)" in table
    for case, row in ours.items():
        print(f"{case}: DLPerf median {theirs[case]['median_speed']} mean "
              f"{theirs[case]['average_speed']} speedup {theirs[case]['speedup']} | ours "
              f"{row.ips} {row.ips_mean} {row.speedup}")


@pytest.mark.subprocess  # runs the seed's own script
def test_dlperf_rule_keeps_the_scripts_one_digit_time_pattern(tmp_path: Path) -> None:
    """An iteration of 12.403 s is read as 2.403 by DLPerf's ``\\d.\\d{1,3}\\s``: ours reads it
    the same way (the seed's rule, quirk included), and the script agrees."""
    peers = peers_dir()
    times = [0.35] * 40 + [12.403] + [0.35] * 90
    log = dlperf_examples_log(times, per_epoch=200)
    write(tmp_path / "logs" / "1n1g" / "r50_b128_fp32_1.log", log)
    theirs = run_dlperf(peers, tmp_path / "logs", tmp_path / "out")["r50"]["1n1g"]
    ours = fl.dlperf_speed(log, 128, warmup=20, train=120)
    assert ours.variant == "time-values"
    assert ours.ips == theirs["median_speed"]
    honest = round(128 / ((99 * 0.35 + 12.403) / 100), 2)
    assert ours.ips != honest  # the quirk is real: the 12.403 s iteration counts as 2.403 s


def test_dlperf_timestamp_rule_of_seed_003(tmp_path: Path) -> None:
    """Seed 003's own script (DLPerf @ 183b8d1; it runs as the oracle below) timed DLLogger's
    lines: (t120 - t20) / 100 per iteration. Checked against the times the log was written
    from: lines 21..120 took exactly sum(times[20:120])."""
    rng = random.Random(5)
    times = [rng.uniform(0.3, 0.4) for _ in range(125)]
    log = dlperf_dllogger_log(times, datetime(2020, 8, 28, 10, 0, 0, 123456), global_batch=1024)
    speed = fl.dlperf_speed(log, 1024, warmup=20, train=120)
    assert speed.variant == "timestamps"
    elapsed = sum(times[20:120])
    assert speed.ips == pytest.approx(round(1024 / (elapsed / 100), 2), abs=0.011)
    assert speed.detail["start"]["line"] < speed.detail["end"]["line"]
    # a log that stops before line 120 has no figure (DLPerf would record 0)
    short = fl.dlperf_speed(dlperf_dllogger_log(times[:100], datetime(2020, 1, 1),
                                                global_batch=1024), 1024)
    assert short.ips is None and short.lines == 100


@pytest.mark.subprocess  # runs the seed's own script
def test_seed_003s_own_script_and_our_timestamps_rule_give_the_same_table(tmp_path: Path
                                                                         ) -> None:
    """Seed 003's table came from DLPerf @ 183b8d1 (NVIDIADeepLearningExamples/PyTorch/
    resnet50v1.5/extract_pytorch_logs_time.py: DLLogger line times), which the peers folder
    holds in ``dlperf/183b8d1/`` (``$ORCHESTRATE_DLPERF_SEED_SCRIPT`` may name another copy). It
    runs as the oracle of the timestamps rule, in CI too."""
    script = os.environ.get("ORCHESTRATE_DLPERF_SEED_SCRIPT") or str(
        peers_dir() / "dlperf" / "183b8d1" / "extract_pytorch_logs_time.py")
    if not Path(script).is_file():
        unavailable(f"no copy of DLPerf @ 183b8d1's script at {script}")
    rng = random.Random(7)
    logs = tmp_path / "ngc" / "pytorch"
    for gpus, base in ((1, 0.350), (4, 0.355), (8, 0.366)):
        for run in range(1, 6):
            times = [rng.uniform(1.0, 3.0) if i < 3 else rng.gauss(base, 0.008)
                     for i in range(120 + run)]
            write(logs / f"1n{gpus}g" / f"r50_b128_fp32_{run}.log", dlperf_dllogger_log(
                times, datetime(2020, 8, 28, 10, run, 0, 123456), global_batch=128 * gpus,
                seed=run))
    done = subprocess.run(
        [sys.executable, script, "--log_dir", str(logs), "--output_dir", str(tmp_path / "out"),
         "--warmup_batches", "20", "--train_batches", "120", "--batch_size_per_device", "128"],
        capture_output=True, text=True, timeout=120, check=True)
    text = re.sub(r"np\.float64\(([^)]*)\)", r"\1", done.stdout)  # numpy 2 reprs
    theirs = ast.literal_eval(text[text.index("{'r50'"):text.index("Saving result")].strip())
    paths, _ = import_results([logs], ImportOptions(
        matrix="dlperf_seed003", results_root=tmp_path / "results", params=["hardware=v100"]))
    rows, _ = summarize_run(RunPaths(paths.root))
    for row in rows:
        case = theirs["r50"][f"1n{row.params['gpus']}g"]
        assert (row.ips, row.ips_mean, row.speedup or 1.0) == (
            case["median_speed"], case["average_speed"], case["speedup"])


@pytest.mark.subprocess  # runs the seed's own script
def test_coreutil_and_our_tbd_rule_print_the_same_utilisations(tmp_path: Path) -> None:
    """Seed 001's numbers: coreutil.py's four lines, ours formatted as it prints them."""
    peers = peers_dir()
    python = oracle_python()
    rng = random.Random(3)
    kernels = [{
        "gpc__cycles_elapsed.max": rng.randint(2_000, 900_000),
        **{metric: rng.uniform(0, 60) for metric in fl.TBD_FIELDS.values()},
    } for _ in range(60)]
    csv_path = write(tmp_path / "profiled_data_ncu" / "core_util_batch_32.csv", ncu_csv(kernels))
    done = subprocess.run([python, str(peers / "tbd" / "coreutil.py"), str(csv_path)],
                          capture_output=True, text=True, timeout=300, check=True)
    theirs = [ln for ln in done.stdout.splitlines() if ln.strip()]
    paths, plan = import_results([csv_path], ImportOptions(
        matrix="tbd_seed001", results_root=tmp_path / "results",
        params=["hardware=v100"]))
    assert plan.entries[0].kind == "tbd-ncu" and plan.entries[0].known["batch_size"] == 32
    result = RunPaths(paths.root).results()[0]
    ours = [f"{unit}\t{result.metrics[f'tbd.{unit}_pct']:.5f} %" for unit in fl.TBD_FIELDS]
    assert ours == theirs
    rows, table = summarize_run(RunPaths(paths.root))
    assert rows[0].rule == "tbd" and "FMA %" in table
    assert f"{rows[0].rule_columns['tbd_fma_pct']:.5f}" in table
    print("coreutil.py:", theirs, "| ours:", ours)
