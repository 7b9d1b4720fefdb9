"""The STAND-IN workload (tests/standin/workload_standin.py) against the real one.

The plumbing tests trust the stand-in to speak the workload's contract; these tests are what
makes that trust earned. The unit tests run it in-process (its command line against the
workload's parser, its lines, exit codes and files); the workload-tier test runs the real
workload and the stand-in with the same arguments and compares what they print and write:
the same line types in the same order, the same keys, the same files with the same columns,
the same exit status and error kind for a missing dataset.
"""

from __future__ import annotations

import argparse
import ast
import csv
import hashlib
import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from standin_support import STANDIN
from workload_support import REPO, env, parse_lines

from workload import errors as workload_errors
from workload.cli import build_parser as workload_parser

#: A tiny real run: resnet18 at 32 px, batch 2, 10 measured iterations (one ``iter`` line).
ARGS = ["--arch", "resnet18", "--image-size", "32", "--batch-size", "2", "--warmup", "1",
        "--iterations", "10", "--device", "cpu", "--workers", "0", "--num-classes", "10",
        "--telemetry-interval", "0"]


def load_standin() -> ModuleType:
    spec = importlib.util.spec_from_file_location("workload_standin", STANDIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SI = load_standin()


def options(parser: argparse.ArgumentParser) -> dict[str, tuple[Any, ...]]:
    """Every option string: (choices, default, takes a value)."""
    out = {}
    for action in parser._actions:
        for opt in action.option_strings:
            out[opt] = (tuple(action.choices or ()), action.default, action.nargs != 0)
    return out


def run_in_process(argv: list[str]) -> tuple[int, list[dict[str, Any]]]:
    out = io.StringIO()
    code = SI.main(argv, stdout=out)
    return code, [json.loads(line) for line in out.getvalue().splitlines()]


def keys(obj: Any) -> Any:
    """The shape of a JSON value: its keys, recursively (lists by their first item)."""
    if isinstance(obj, dict):
        return {k: keys(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [keys(obj[0])] if obj and isinstance(obj[0], dict) else "list"
    return "value"


# --- unit: the stand-in alone, in-process ----------------------------------------------------


def test_the_standin_accepts_every_workload_flag_with_its_choices_and_defaults() -> None:
    ours = options(workload_parser())
    theirs = options(SI.build_parser())
    for opt, shape in ours.items():
        assert theirs.get(opt) == shape, opt
    extra = {o for o in theirs if o not in ours and o not in ("-h", "--help")}
    assert extra and all(o.startswith("--standin-") for o in extra), extra


def test_the_standin_imports_only_the_standard_library() -> None:
    tree = ast.parse(STANDIN.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    assert imported - {"__future__"} <= set(sys.stdlib_module_names), imported


def test_a_run_prints_meta_iter_summary_and_writes_the_workloads_files(tmp_path: Path) -> None:
    code, lines = run_in_process([*ARGS, "--standin-step-s", "0", "--output-dir",
                                  str(tmp_path)])
    assert code == 0
    assert [line["type"] for line in lines] == ["meta", "iter", "summary"]
    meta, it, summary = lines
    assert meta["env"]["standin"] and meta["env"]["torch_version"].endswith("+standin")
    assert it["step"] == 10 and set(it["data"]) == {"train.total_ips", "train.compute_ips",
                                                    "train.loss"}
    assert summary["status"] == "ok" and len(summary["iteration_times"]) == 10
    assert summary["data"]["iterations"] == 10 and summary["data"]["world_size"] == 1
    rows = list(csv.reader((tmp_path / "iterations.csv").open()))
    assert rows[0] == list(SI.ITERATION_FIELDS) and len(rows) == 11
    assert json.loads((tmp_path / "summary.json").read_text())["data"] == summary["data"]


def test_the_standins_error_kinds_and_exit_statuses_are_the_workloads() -> None:
    handled = [c for c in vars(workload_errors).values()
               if isinstance(c, type) and issubclass(c, workload_errors.WorkloadError)
               and c is not workload_errors.WorkloadError]
    assert {kind: code for kind, (code, _) in SI.ERRORS.items()} == {
        c.kind: c.exit_code for c in handled}


@pytest.mark.parametrize("kind, code", [("data", 2), ("device", 2), ("config", 2),
                                        ("arch", 2), ("weights", 2), ("oom", 3),
                                        ("internal", 1)])
def test_failures_are_the_workloads_error_line_and_exit_status(kind: str, code: int,
                                                               capsys) -> None:
    got, lines = run_in_process([*ARGS, "--standin-step-s", "0", "--standin-fail", kind,
                                 "--standin-fail-at", "3"])
    assert got == code
    assert [line["type"] for line in lines] == ["meta", "error"]
    assert lines[-1]["kind"] == kind and lines[-1]["rank"] == 0 and lines[-1]["message"]
    if kind == "internal":
        assert "Traceback" in capsys.readouterr().err


def test_a_missing_dataset_and_an_accelerator_are_refused_as_the_workload_does() -> None:
    code, lines = run_in_process([*ARGS, "--data", "/no/such_dataset"])
    assert code == 2 and lines == [{"type": "error", "kind": "data", "rank": 0, "message": (
        "--data /no/such_dataset: no such directory; pass an ImageFolder directory "
        "(DIR/<class>/<image>.jpg) or --data synthetic")}]
    code, lines = run_in_process([*ARGS, "--device", "cuda"])
    assert code == 2 and lines[0]["kind"] == "device"


def test_only_rank_zero_prints(monkeypatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    code, lines = run_in_process([*ARGS, "--standin-step-s", "0"])
    assert code == 0 and lines == []
    monkeypatch.setenv("RANK", "0")
    code, lines = run_in_process([*ARGS, "--standin-step-s", "0"])
    assert lines[-1]["data"]["world_size"] == 2 and lines[-1]["data"]["global_batch_size"] == 4


def test_knobs_for_logs_secrets_and_the_environment_it_was_given(tmp_path: Path, capsys,
                                                                 monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    code, _ = run_in_process([*ARGS, "--standin-step-s", "0", "--standin-lines", "3",
                              "--standin-env", "HF_TOKEN", "--output-dir", str(tmp_path),
                              "--standin-write-env", "env-rank{rank}.json"])
    err = capsys.readouterr().err
    assert code == 0 and err.count("[standin] noise line") == 3
    digest = hashlib.sha256(b"hf_secret").hexdigest()
    assert f"HF_TOKEN {digest} value: hf_secret" in err
    seen = json.loads((tmp_path / "env-rank0.json").read_text())
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] == "3" and seen["cwd"]


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "cmdline").read_text():
                found.append(int(entry.name))
        except OSError:
            pass
    return found


@pytest.mark.subprocess  # the stand-in's process knobs, for real
def test_a_hang_that_ignores_sigterm_and_leaves_a_daemon(tmp_path: Path) -> None:
    import signal
    import time

    marker = str(tmp_path / "out")
    proc = subprocess.Popen(
        [sys.executable, str(STANDIN), *ARGS, "--iterations", "1000000", "--output-dir", marker,
         "--standin-ignore-sigterm", "--standin-children", "1", "--standin-detach"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stderr is not None and "started 1 children" in proc.stderr.readline()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert proc.poll() is None, "SIGTERM is ignored"
        proc.kill()
        proc.wait(10)
        (daemon,) = [pid for pid in processes_with(marker) if pid != proc.pid]
        assert os.getsid(daemon) not in (os.getsid(0), proc.pid), "its own session"
    finally:
        for pid in processes_with(marker):
            os.kill(pid, signal.SIGKILL)


# --- workload tier: the stand-in against the real workload -----------------------------------


def run_program(argv: list[str], tmp_path: Path, name: str) -> tuple[int, list[dict], Path]:
    out = tmp_path / name
    proc = subprocess.run([*argv, "--output-dir", str(out)], cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, parse_lines(proc.stdout), out


CASES = {
    "train": [],
    "infer-bf16": ["--mode", "infer", "--precision", "bf16"],
    "missing-data": ["--data", "/no/such_dataset"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_standin_speaks_exactly_the_workloads_lines_and_files(workload_python: str,
                                                                  tmp_path: Path,
                                                                  case: str) -> None:
    args = [*ARGS, *CASES[case]]
    real = run_program([workload_python, "-m", "workload", *args], tmp_path, "real")
    stand = run_program([sys.executable, str(STANDIN), *args], tmp_path, "standin")
    assert stand[0] == real[0], (case, real[1], stand[1])
    assert [x["type"] for x in stand[1]] == [x["type"] for x in real[1]]
    for theirs, ours in zip(real[1], stand[1], strict=True):
        if "env" in ours:
            assert ours["env"].pop("standin")
        for part in ("data", "env"):  # the differing keys named, where they differ
            mine, real_keys = set(ours.get(part) or ()), set(theirs.get(part) or ())
            assert mine == real_keys, (ours["type"], part, "the workload only:",
                                       sorted(real_keys - mine), "the stand-in only:",
                                       sorted(mine - real_keys))
        assert keys(ours) == keys(theirs), ours["type"]
    if stand[1][-1]["type"] == "error":
        assert stand[1][-1]["kind"] == real[1][-1]["kind"]
        assert stand[1][-1]["message"] == real[1][-1]["message"]
        return
    files = sorted(p.name for p in real[2].iterdir())
    assert sorted(p.name for p in stand[2].iterdir()) == files
    assert {"iterations.csv", "summary.json"} <= set(files)
    for name in (f for f in files if f.endswith(".csv")):
        real_rows = list(csv.reader((real[2] / name).open()))
        stand_rows = list(csv.reader((stand[2] / name).open()))
        assert stand_rows[0] == real_rows[0] and len(stand_rows) == len(real_rows), name
    summary = json.loads((stand[2] / "summary.json").read_text())
    summary["env"].pop("standin")
    assert keys(summary) == keys(json.loads((real[2] / "summary.json").read_text()))
