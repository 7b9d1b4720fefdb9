"""Cron-friendly output and defaults (issue 10, item 11): timestamped progress lines outside a
terminal, ``-q`` / ``-v``, the ETA, ``$ORCHESTRATE_RESULTS`` and the user's config file, and
``clean`` that spares running sweeps (with ``--dry-run``)."""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from workload_support import tiny_matrix

from orchestrator.cli.sweep_commands import LineEvents, verbosity
from orchestrator.config.defaults import hosts_file, load_user_config, results_root
from orchestrator.errors import ConfigError
from orchestrator.plan.eta import Eta, format_duration
from orchestrator.plan.matrix import load_matrix
from orchestrator.plan.placement import Allocation
from orchestrator.results.folders.run_folder import CellResult, RunPaths, Status

ROOT = Path(__file__).resolve().parents[1]
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"

TINY = tiny_matrix("cron") + "[axes]\nseed = [1, 2]\n"


def test_without_history_the_eta_learns_from_todays_cells(write_matrix) -> None:
    """No earlier run: the median duration of the cells that ended, times what is left, over
    the cells running at once (never less than one cell)."""
    cells = list(load_matrix(write_matrix(TINY + "batch_size = [1, 2]\n")).cells)
    assert len(cells) == 4
    eta = Eta(cells, {})
    assert eta.remaining_s() is None
    for cell, took in zip(cells[:2], (10.0, 20.0), strict=True):
        eta.started(cell.id)
        eta.finished(cell.id, took)
    assert eta.remaining_s() == 30.0
    eta.concurrency = 2
    assert eta.remaining_s() == 15.0
    for cell in cells[2:]:
        eta.started(cell.id)
        eta.finished(cell.id, 15.0)
    assert eta.remaining_s() == 0.0
    assert format_duration(None) == "?" and format_duration(62) == "1:02"
    assert format_duration(3723) == "1:02:03"


def test_line_events_say_start_end_counts_and_eta(write_matrix, tmp_path) -> None:
    matrix = load_matrix(write_matrix(TINY))
    first, second = matrix.cells
    stream = io.StringIO()
    events = LineEvents(stream, verbose=True)
    events.sweep_started(RunPaths(tmp_path / "run"), list(matrix.cells), {})
    events.cell_started(first, Allocation.local(first.id, (0, 1)))
    events.cell_output(first.id, "a line of output")
    events.cell_finished(first, CellResult(first.id, first.group, 1, Status.OK, duration_s=12.0,
                                           metrics={"train.total_ips": 1234.5}))
    events.cell_started(second, Allocation.local(second.id))
    events.cell_finished(second, CellResult(second.id, second.group, 1, Status.FAILED,
                                            reason="exit code 1: boom", duration_s=3.0))
    lines = stream.getvalue().splitlines()
    assert all(re.match(STAMP + " ", ln) for ln in lines)
    text = [ln[20:] for ln in lines]
    assert text == [
        f"run folder: {tmp_path / 'run'} (2 cells)",
        f"[1/2] start {first.id} GPUs 0,1",
        f"{first.id} | a line of output",
        f"[1/2] ok {first.id} 12.0 s: 1,234.5 images/s | 1 ok | ETA 0:12",
        f"[2/2] start {second.id}",
        f"[2/2] failed {second.id} 3.0 s: exit code 1: boom | 1 failed, 1 ok | ETA 0:00",
    ]


@pytest.mark.parametrize("global_flags, own, expected", [
    ({"verbose": 0, "quiet": False}, {}, 0), ({"verbose": 0, "quiet": True}, {}, -1),
    ({"verbose": 2, "quiet": False}, {}, 1), ({}, {"matrix_quiet": 1}, -1),
    ({}, {"matrix_verbose": 2}, 1), ({"verbose": 1, "quiet": False}, {"matrix_quiet": 1}, 0),
])
def test_verbosity_from_the_global_flags_or_the_commands_own(global_flags, own, expected):
    assert verbosity(argparse.Namespace(**global_flags, **own)) == expected


def test_both_spellings_of_quiet_parse() -> None:
    from orchestrator.cli import build_parser

    for argv in (["-q", "matrix", "m.toml"], ["matrix", "m.toml", "-q"]):
        args = build_parser(argv).parse_args(argv)
        assert verbosity(args) == -1, argv


@pytest.fixture
def orchestrate(orchestrate_cli: Callable[..., Any]) -> Callable[..., Any]:
    """The CLI in a fresh interpreter (``orchestrate_cli``), with a sweep's timeout."""
    return functools.partial(orchestrate_cli, timeout=300)


def test_a_sweep_outside_a_terminal_prints_one_line_per_start_and_end(write_matrix, tmp_path,
                                                                       orchestrate, standin):
    path = write_matrix(standin.matrix("cron") + "[axes]\nseed = [1, 2]\n")
    proc = orchestrate("matrix", str(path), env={"ORCHESTRATE_RESULTS": str(tmp_path / "r")})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert all(re.match(STAMP + " ", ln) for ln in lines), proc.stderr
    # the cells run in the random order the sweep drew and recorded in plan.json
    (plan,) = (tmp_path / "r" / "cron").glob("*/plan.json")
    first, second = json.loads(plan.read_text())["order"]["cells"]
    assert {first, second} == {"cpu-g1-bs2-fp32-seed1-r1", "cpu-g1-bs2-fp32-seed2-r1"}
    assert [" ".join(ln[20:].split()[:3]) for ln in lines[1:]] == [
        f"[1/2] start {first}", f"[1/2] ok {first}", f"[2/2] start {second}", f"[2/2] ok {second}"]
    assert lines[2].rsplit(" ETA ", 1)[0].endswith("| 1 ok |")  # (the ETA itself varies)
    assert lines[4].endswith("| 2 ok | ETA 0:00")
    assert "cells: 2 ok" in proc.stdout and str(tmp_path / "r" / "cron") in proc.stdout

    quiet = orchestrate("matrix", str(path), "-q", "--results", str(tmp_path / "q"))
    assert quiet.returncode == 0 and quiet.stderr == ""
    assert "cells: 2 ok" in quiet.stdout


# --- results and hosts defaults ----------------------------------------------------------------


@pytest.fixture
def config_home(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("ORCHESTRATE_RESULTS", raising=False)
    monkeypatch.delenv("ORCHESTRATE_HOSTS", raising=False)
    monkeypatch.delenv("ORCHESTRATE_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    folder = tmp_path / "xdg" / "orchestrate"
    folder.mkdir(parents=True)
    return folder


def test_results_and_hosts_come_from_cli_env_config_default_in_that_order(config_home,
                                                                          monkeypatch):
    assert results_root() == Path("results") and hosts_file() is None
    (config_home / "config.toml").write_text('results = "res"\nhosts = "~/lab.toml"\n')
    assert results_root() == config_home / "res"
    assert hosts_file() == Path("~/lab.toml").expanduser()
    monkeypatch.setenv("ORCHESTRATE_RESULTS", "/from/env")
    monkeypatch.setenv("ORCHESTRATE_HOSTS", "/env/hosts.toml")
    assert results_root() == Path("/from/env") and hosts_file() == Path("/env/hosts.toml")
    assert hosts_file(matrix_hosts=Path("m.toml")) == Path("m.toml")
    assert results_root(Path("cli")) == Path("cli")
    assert hosts_file(Path("cli.toml"), Path("m.toml")) == Path("cli.toml")


def test_a_bad_config_file_names_the_file_and_the_field(config_home):
    path = config_home / "config.toml"
    path.write_text('results = 3\nresluts = "x"\n')
    with pytest.raises(ConfigError) as err:
        load_user_config()
    found = {(p.file, p.field) for p in err.value.problems}
    assert found == {(str(path), "results"), (str(path), "resluts")}


def test_every_command_with_results_uses_the_defaults(write_matrix, tmp_path, config_home,
                                                     orchestrate):
    (config_home / "config.toml").write_text(f'results = "{tmp_path / "conf"}"\n')
    path = write_matrix(TINY)
    dry = orchestrate("matrix", str(path), "--dry-run",
                      env={"XDG_CONFIG_HOME": str(config_home.parent)})
    assert f"into {tmp_path / 'conf'}/cron/<run id>/" in dry.stdout
    for command in ("report", "history"):
        proc = orchestrate(command, "cron", env={"ORCHESTRATE_RESULTS": str(tmp_path / "env"),
                                                 "XDG_CONFIG_HOME": str(config_home.parent)})
        assert proc.returncode == 2 and str(tmp_path / "env") in proc.stderr, proc.stderr


# --- clean -------------------------------------------------------------------------------------


@pytest.mark.docker
def test_clean_spares_running_sweeps_and_can_dry_run(docker_client, base_image, tmp_path,
                                                     orchestrate):
    from docker_support import run_containers

    from orchestrator.local.engine import (
        LABEL_CELL,
        LABEL_CONTROLLER,
        LABEL_MATRIX,
        LABEL_RUN,
        container_labels,
        controller_id,
    )

    assert container_labels("m", "r", "c")[LABEL_CONTROLLER] == controller_id()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_id = controller_id(dead.pid)
    dead.wait()
    time.sleep(0.1)
    run = f"clean-test-{os.getpid()}"
    controllers = {"alive": controller_id(), "dead": dead_id, "other": "elsewhere:123:456",
                   "old": None}
    made = []
    try:
        for name, controller in controllers.items():
            labels = {LABEL_RUN: run, LABEL_MATRIX: "m", LABEL_CELL: name}
            if controller:
                labels[LABEL_CONTROLLER] = controller
            made.append(docker_client.containers.run(base_image, ["sleep", "300"],
                                                     detach=True, labels=labels))

        def cells_left() -> set[str]:
            return {c.labels[LABEL_CELL] for c in run_containers(docker_client, run)}

        dry = orchestrate("clean", "--run", run, "--dry-run")
        assert dry.returncode == 0 and cells_left() == set(controllers)
        assert len(re.findall(r"^would remove ", dry.stdout, re.M)) == 2
        assert "cell alive): its sweep is still running" in dry.stdout
        assert "cell other): started by elsewhere:123:456 on another host" in dry.stdout

        assert "removed 2 containers" in orchestrate("clean", "--run", run).stdout
        assert cells_left() == {"alive", "other"}
        assert "removed 1 container" in orchestrate("clean", "--run", run, "--force").stdout
        assert cells_left() == {"alive"}
        none = orchestrate("clean", "--run", f"{run}-none", "--dry-run")
        assert none.returncode == 0 and none.stdout == (
            f"no containers of orchestrate for run {run}-none on this engine: nothing to remove\n")
    finally:
        for container in made:
            subprocess.run(["docker", "rm", "-f", container.id], capture_output=True)
