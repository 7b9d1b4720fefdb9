"""Control cells (issue 25): declared in a matrix, run between the configurations on their own
allocations, recorded as a role of their own, and the figures judged as ratios to them.

Pure parts (the schedule, the normalisation, the order) are tested on values; the run loop on
the fake backend of tests/backend_support.py (a FAKE execution: it replays a workload's output;
the real run loop, allocations and result files are what is checked); the store, history and
compare on synthetic run folders whose cells carry the times, host and GPUs a sweep records;
real sweeps on the process, docker and Slurm backends whose cells (controls included) run the
STAND-IN workload (tests/standin/): what is checked is where and when the controls run.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from backend_support import META, FakeBackend, Script, line
from results_support import BASE_ENV, day, run_id
from standin_support import Standin

from orchestrator.backends.base import ExitInfo, RunOptions
from orchestrator.cli import main
from orchestrator.config.matrix_file import CellParams
from orchestrator.errors import ConfigError
from orchestrator.plan.controls import ControlSchedule, highest_numbers
from orchestrator.plan.matrix import Cell, load_matrix
from orchestrator.plan.ordering import order_cells, recorded_order
from orchestrator.plan.placement import Allocation, Slot
from orchestrator.results.folders.run_folder import CellResult, RunPaths, Status, write_json
from orchestrator.results.folders.store import is_throughput, open_store
from orchestrator.results.reports.compare import compare_runs, render_compare, render_compare_csv
from orchestrator.results.reports.history import Options, analyze, render_history
from orchestrator.results.statistics.normalise import Measured, normalise
from orchestrator.sweep import NullEvents, run_cells

CONTROL_MATRIX = """
[matrix]
name = "ctl"
repeats = 2
[workload]
hardware = "cpu"
arch = "resnet18"
image_size = 32
batch_size = 2
warmup = 0
iterations = 1
workers = 0
num_classes = 10
[axes]
batch_size = [2, 4]
[control]
params = { arch = "mobilenet_v3_small", batch_size = 2 }
every = 2
"""


# --- the matrix: [control] ------------------------------------------------------------------


def test_a_control_gives_one_template_per_hardware_and_stays_out_of_the_configurations(
        write_matrix):
    matrix = load_matrix(write_matrix(CONTROL_MATRIX))
    assert len(matrix.cells) == 4 and not any(c.is_control for c in matrix.cells)
    (template,) = matrix.controls.values()
    assert template.role == "control" and template.group == "control-cpu"
    assert template.params.arch == "mobilenet_v3_small" and template.params.iterations == 1
    assert template.params.hardware == "cpu" and matrix.control_every == 2
    assert template.hash not in {c.hash for c in matrix.cells}
    assert template.measurement(3).id == "control-cpu-c3"


def test_a_named_cell_becomes_the_control_instead_of_a_configuration(write_matrix):
    text = CONTROL_MATRIX.replace(
        'params = { arch = "mobilenet_v3_small", batch_size = 2 }', 'cell = "cpu-g1-bs4-fp32"')
    matrix = load_matrix(write_matrix(text))
    assert {c.group for c in matrix.cells} == {"cpu-g1-bs2-fp32"}
    (template,) = matrix.controls.values()
    assert template.params.batch_size == 4 and template.group == "control-cpu"


def test_a_foreign_command_can_be_the_control(write_matrix, capsys, tmp_path):
    """A pinned program of the lab's (a [commands.NAME] template) as the control: its own
    environment keeps a change of the code under test out of it."""
    text = CONTROL_MATRIX.replace(
        'params = { arch = "mobilenet_v3_small", batch_size = 2 }',
        'params = { program = "pinned", batch_size = 2 }') + """
[commands.pinned]
command = "{python} -m workload --arch {arch} --batch-size {batch_size} --output-dir {output_dir}"
launcher = "self"
env = { WORKLOAD_INJECT_SLOWDOWN = "0" }
"""
    matrix = load_matrix(write_matrix(text))
    (template,) = matrix.controls.values()
    program = matrix.program(template)
    assert program.name == "pinned" and program.command is not None
    assert program.command.env == {"WORKLOAD_INJECT_SLOWDOWN": "0"}
    assert all(matrix.program(c).name == "workload" for c in matrix.cells)
    assert main(["matrix", str(write_matrix(text)), "--dry-run", "--results",
                 str(tmp_path)]) == 0
    assert "control-cpu: program pinned" in capsys.readouterr().out


@pytest.mark.parametrize("control, field, words", [
    ('params = { arch = "resnet18" }\ncell = "cpu-g1-bs2-fp32"', "control", "exactly one"),
    ("every = 3", "control", "exactly one"),
    ('params = { hardware = "cpu" }', "control.params.hardware", "leave hardware out"),
    ('cell = "cpu-g1-bs8-fp32"', "control.cell", "did you mean 'cpu-g1-bs"),
    ('params = { gpus = 2 }', "control.params.gpus", "gpus <= 1"),
    ('params = { program = "pinnned" }', "control.params.program", "unknown program"),
    ('params = { arch = "resnet18" }\nevery = 0', "control.every", "greater than or equal"),
], ids=["both", "neither", "hardware", "unknown-cell", "too-many-gpus", "unknown-program",
        "every-0"])
def test_a_bad_control_is_refused_with_its_field(write_matrix, control, field, words):
    text = CONTROL_MATRIX.split("[control]")[0] + "[control]\n" + control + "\n"
    with pytest.raises(ConfigError) as err:
        load_matrix(write_matrix(text))
    found = [p for p in err.value.problems if p.field == field]
    assert found and words in found[0].message, err.value.problems


def test_validate_and_dry_run_refuse_what_the_sweep_refuses(write_matrix, capsys, tmp_path):
    path = write_matrix(CONTROL_MATRIX.replace('batch_size = 2 }', 'batch_size = 2, gpus = 2 }'))
    assert main(["validate", str(path)]) == 2
    assert "control.params.gpus" in capsys.readouterr().err
    assert main(["matrix", str(path), "--dry-run", "--results", str(tmp_path)]) == 2
    assert "control.params.gpus" in capsys.readouterr().err


def test_dry_run_and_plan_show_the_control_and_the_order(write_matrix, capsys, tmp_path):
    path = write_matrix(CONTROL_MATRIX)
    assert main(["matrix", str(path), "--dry-run", "--order-seed", "7",
                 "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "control-cpu: program workload" in out and "after every 2 cells" in out
    assert "seed 7" in out
    assert main(["plan", str(path), "--json"]) == 0
    roles = [c["role"] for c in json.loads(capsys.readouterr().out)]
    assert roles == ["config"] * 4 + ["control"]


@pytest.mark.parametrize("seed", ["-1", "4294967296", "x"])
def test_order_seed_out_of_range_is_refused(write_matrix, capsys, seed):
    with pytest.raises(SystemExit) as err:
        main(["matrix", str(write_matrix(CONTROL_MATRIX)), "--dry-run", "--order-seed", seed])
    assert err.value.code == 2 and "--order-seed" in capsys.readouterr().err


# --- the schedule ---------------------------------------------------------------------------


def cell(group: str, repeat: int = 1, hardware: str = "cpu", role: str = "config") -> Cell:
    return Cell(f"{group}-r{repeat}", group, repeat, CellParams(hardware=hardware), group, role)


TEMPLATE = Cell("control-cpu", "control-cpu", 0, CellParams(hardware="cpu"), "ctl", "control")


def test_one_slot_gets_a_control_before_after_every_n_and_after_the_last():
    schedule = ControlSchedule.of({"cpu": TEMPLATE}, every=2)
    assert schedule is not None
    slot = Allocation.local("x", (0,))
    sequence = []
    cells = [cell(f"c{i}") for i in range(5)]
    for i, c in enumerate(cells):
        before = schedule.before(c, slot)
        if before:
            sequence.append(before.id)
        sequence.append(c.group)
        after = schedule.after(c, slot, last=i == len(cells) - 1)
        if after:
            sequence.append(after.id)
    assert sequence == ["control-cpu-c1", "c0", "c1", "control-cpu-c2", "c2", "c3",
                        "control-cpu-c3", "c4", "control-cpu-c4"]


def test_each_host_and_gpu_set_is_a_slot_of_its_own_and_numbers_go_on_after_a_resume():
    schedule = ControlSchedule.of({"cpu": TEMPLATE}, every=3,
                                  numbers=highest_numbers(["control-cpu-c7", "x-r1"],
                                                          {"cpu": TEMPLATE}))
    assert schedule is not None
    a = Allocation("a", (Slot("h1", (0,)),))
    b = Allocation("b", (Slot("h1", (1,)),))
    first = schedule.before(cell("x"), a)
    second = schedule.before(cell("y"), b)
    assert first is not None and first.id == "control-cpu-c8"
    assert second is not None and second.id == "control-cpu-c9"
    assert schedule.before(cell("z"), Allocation("z", (Slot("h1", (0,)),))) is None
    assert schedule.before(cell("w", hardware="gpu"), a) is None  # no control for it


def run_loop(write_matrix, tmp_path: Path, every: int = 2, repeats: int = 2
             ) -> tuple[list[CellResult], list[tuple[str, Allocation]]]:
    text = CONTROL_MATRIX.replace("every = 2", f"every = {every}").replace(
        "repeats = 2", f"repeats = {repeats}")
    matrix = load_matrix(write_matrix(text))
    paths = RunPaths.create(tmp_path, matrix.name)
    script = Script([line(META), line({"type": "summary", "data": {"train.total_ips": 50.0},
                                       "env": {"device": "cpu"}, "iteration_times": [0.1]})],
                    ExitInfo(code=0))
    backend = FakeBackend(matrix, paths, RunOptions(timeout_s=60), script=script)
    started: list[tuple[str, Allocation]] = []

    class Events(NullEvents):
        def cell_started(self, c: Cell, allocation: Allocation) -> None:
            started.append((c.id, allocation))

    schedule = ControlSchedule.of(matrix.controls, matrix.control_every)
    results = run_cells(backend, list(matrix.cells), Events(), controls=schedule)
    return results, started


def test_the_run_loop_runs_controls_between_the_cells_on_their_allocation(write_matrix,
                                                                          tmp_path):
    results, started = run_loop(write_matrix, tmp_path)
    order = [cid for cid, _ in started]
    assert order == ["control-cpu-c1", "cpu-g1-bs2-fp32-r1", "cpu-g1-bs4-fp32-r1", "control-cpu-c2",
                     "cpu-g1-bs2-fp32-r2", "cpu-g1-bs4-fp32-r2", "control-cpu-c3"]
    assert {a.slots for _, a in started} == {(Slot(None, ()),)}  # one slot: this machine
    roles = {r.cell_id: r.role for r in results}
    assert roles["control-cpu-c2"] == "control" and roles["cpu-g1-bs2-fp32-r1"] == "config"
    assert all(r.status is Status.OK for r in results) and len(results) == 7
    on_disk = json.loads((tmp_path / "ctl").glob("*/cells/control-cpu-c3/result.json")
                         .__next__().read_text())
    assert on_disk["role"] == "control" and on_disk["group"] == "control-cpu"


def test_every_one_brackets_each_cell(write_matrix, tmp_path):
    _, started = run_loop(write_matrix, tmp_path, every=1, repeats=1)
    assert [cid for cid, _ in started] == ["control-cpu-c1", "cpu-g1-bs2-fp32-r1", "control-cpu-c2",
                                           "cpu-g1-bs4-fp32-r1", "control-cpu-c3"]


# --- the order ------------------------------------------------------------------------------


def plan(names: list[str], repeats: int = 3, gpus: int = 1) -> list[Cell]:
    return [Cell(f"{n}-r{r}", n, r, CellParams(hardware="cpu", gpus=gpus), n)
            for r in range(1, repeats + 1) for n in names]


NAMES = [f"c{i}" for i in range(8)]


def test_a_seed_gives_one_order_again_and_rounds_of_repeats_stay():
    cells = plan(NAMES)
    one = order_cells(cells, {}, seed=11, parallel=False)
    assert one == order_cells(cells, {}, seed=11, parallel=False)
    assert one != order_cells(cells, {}, seed=12, parallel=False)
    assert [c.repeat for c in one] == sorted(c.repeat for c in cells)
    rounds = [[c.group for c in one if c.repeat == r] for r in (1, 2, 3)]
    assert all(sorted(r) == NAMES for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1  # each round shuffled on its own


def test_the_random_order_does_not_line_up_a_configuration_with_a_place_in_the_round():
    """Over many nights, each configuration takes every place in its round about equally."""
    cells = plan(NAMES, repeats=1)
    first = [order_cells(cells, {}, seed=s, parallel=False)[0].group for s in range(800)]
    counts = [first.count(n) for n in NAMES]
    assert min(counts) > 60 and max(counts) < 140, counts  # 100 expected each


def test_with_several_slots_long_cells_go_first_and_similar_ones_stay_random():
    cells = plan(NAMES, repeats=1)
    expected = {"c0": 100.0, "c1": 100.0, "c2": 110.0, "c3": 10.0, "c4": 10.0, "c5": 11.0,
                "c6": 50.0}  # c7: unknown
    orders = {tuple(c.group for c in order_cells(cells, expected, seed=s)) for s in range(40)}
    for order in orders:
        assert order[0] == "c7"  # unknown first
        assert set(order[1:4]) == {"c0", "c1", "c2"} and order[4] == "c6"
        assert set(order[5:]) == {"c3", "c4", "c5"}
    assert len(orders) > 1


def test_without_a_seed_a_parallel_order_is_the_old_longest_first():
    cells = plan(NAMES, repeats=1)
    expected = {n: 10.0 * 2 ** i for i, n in enumerate(NAMES)}  # one duration class each
    assert [c.group for c in order_cells(cells, expected)] == list(reversed(NAMES))


def test_a_recorded_order_is_kept_for_the_cells_left():
    cells = plan(NAMES, repeats=1)
    recorded = [c.id for c in order_cells(cells, {}, seed=3, parallel=False)]
    left = [c for c in cells if c.group in ("c1", "c5", "c6")]
    assert [c.id for c in recorded_order(left, recorded)] == [
        cid for cid in recorded if cid.split("-")[0] in ("c1", "c5", "c6")]


# --- normalisation --------------------------------------------------------------------------


def measured(key: int, role: str, start: float, value: float, host: str = "h1",
             gpus: tuple[int, ...] = (0,), ok: bool = True) -> Measured:
    return Measured(key, role, "cpu", host, gpus, start, start + 10.0, ok, "train.total_ips",
                    {"train.total_ips": value, "train.loss": 0.5})


def test_the_ratio_is_log_interpolated_between_the_controls_before_and_after():
    cells = [measured(0, "control", 0.0, 100.0), measured(1, "config", 10.0, 200.0),
             measured(2, "config", 20.0, 150.0), measured(3, "control", 30.0, 50.0)]
    out = normalise(cells, is_throughput)
    # midpoints 5 / 15 / 25 / 35: cell 1 sits a third of the way from 100 to 50 (log scale)
    ref1 = math.exp(math.log(100.0) * 2 / 3 + math.log(50.0) / 3)
    assert out[1].figures == {"norm.train.total_ips": pytest.approx(200.0 / ref1)}
    assert out[1].controls == (0, 3)
    assert set(out) == {1, 2}  # controls and the loss are not normalised


def test_a_steady_drift_cancels_exactly():
    """figure = speed x machine factor: a machine slowing 1 % per cell leaves the ratio."""
    factor = [0.99 ** i for i in range(7)]
    roles = ["control", "config", "config", "control", "config", "config", "control"]
    speed = {"control": 40.0, "config": 100.0}
    cells = [measured(i, role, 10.0 * i, speed[role] * factor[i]) for i, role in
             enumerate(roles)]
    ratios = [n.figures["norm.train.total_ips"] for n in normalise(cells, is_throughput).values()]
    assert ratios == pytest.approx([2.5] * 4, rel=1e-12)


def test_only_ok_controls_on_the_cells_host_and_gpus_count():
    cells = [measured(0, "control", 0.0, 100.0, host="h2"),
             measured(1, "control", 10.0, 100.0, gpus=(3,)),
             measured(2, "control", 20.0, 100.0, ok=False),
             measured(3, "config", 30.0, 200.0, gpus=(0, 1)),
             measured(4, "control", 40.0, 80.0, gpus=(0,)),
             measured(5, "config", 60.0, 80.0, host="h9")]
    out = normalise(cells, is_throughput)
    assert out[3].controls == (4,)  # the one after it, on its first GPU
    assert out[3].figures["norm.train.total_ips"] == pytest.approx(2.5)
    assert 5 not in out  # no control on its host


# --- store, history, compare on synthetic runs ----------------------------------------------

G = {"hardware": "cpu", "gpus": 1, "batch_size": 16, "mode": "train"}
CONFIGS = {"resnet": dict(G, arch="resnet18"), "mobile": dict(G, arch="mobilenet")}
SPEED = {"resnet": 20.0, "mobile": 140.0, "control": 15.0}


def controlled_run(root: Path, n: int, factor: float, slowdown: float = 0.0, rng_seed: int = 0,
                   noise: float = 0.01, with_control: bool = True, failed_control: bool = False,
                   within: float = 0.995) -> RunPaths:
    """A run as the sweep writes it: C x x C x x C x x C on one machine (every = 2, 3
    repeats), the machine factor ``factor`` drifting by ``within`` per cell within the run,
    ``slowdown`` in the configurations only."""
    rng = random.Random(rng_seed * 1000 + n)
    paths = RunPaths.create(root, "ctl", run_id(n))
    started = day(n)
    sequence: list[tuple[str, int]] = []
    number = 0
    for repeat in (1, 2, 3):
        if with_control and repeat == 1:
            number += 1
            sequence.append(("control", number))
        names = ["resnet", "mobile"]
        rng.shuffle(names)
        sequence += [(name, repeat) for name in names]
        if with_control:
            number += 1
            sequence.append(("control", number))
    plan_cells = [{"id": f"{k}-r{r}", "group": k, "repeat": r, "hash": f"h{k}",
                   "role": "config", "params": CONFIGS[k]} for r in (1, 2, 3) for k in CONFIGS]
    write_json(paths.plan, {"matrix": "ctl", "source": "matrices/ctl.toml", "backend": "process",
                            "repeats": 3, "varying": ["arch"], "baseline": None,
                            "cells": plan_cells})
    for i, (name, k) in enumerate(sequence):
        drift = factor * within ** i
        control = name == "control"
        value = SPEED[name] * drift * math.exp(rng.gauss(0.0, noise))
        if not control:
            value /= 1.0 + slowdown
        cid = f"control-cpu-c{k}" if control else f"{name}-r{k}"
        bad = control and failed_control and k == 2
        res = CellResult(
            cell_id=cid, group="control-cpu" if control else name, repeat=k,
            status=Status.FAILED if bad else Status.OK, started_at=started + 10 * i,
            finished_at=started + 10 * i + 9, duration_s=9.0,
            params=dict(G, arch="resnet18", batch_size=8, program="pinned") if control
            else CONFIGS[name],
            metrics={} if bad else {"train.total_ips": value,
                                    "iteration_times": [16.0 / value] * 6,
                                    "global_batch_size": 16},
            env=dict(BASE_ENV, device="cpu"), config_hash="hctl" if control else f"h{name}",
            provenance={"host": "vm", "gpu_ids": [], "backend": "process"},
            role="control" if control else "config")
        write_json(paths.cell_result(cid), res.to_json())
    write_json(paths.run_meta, {"run_id": paths.run_id, "matrix": "ctl", "started_at": started,
                                "finished_at": started + 200.0, "interrupted": False})
    return paths


def nights(root: Path, newest_factor: float, slowdown: float = 0.0, history: int = 6,
           **kw: object) -> None:
    """``history`` nights on a machine whose speed wanders by +-2 %, then the newest."""
    for n in range(1, history + 1):
        controlled_run(root, n, 1.0 + 0.02 * math.sin(n), **kw)
    controlled_run(root, history + 1, newest_factor, slowdown, **kw)


def lines_of(root: Path, **options: object) -> tuple[dict[str, object], object]:
    with open_store(root) as store:
        report = analyze(store, "ctl", Options(**options))
    return {ln.params["arch"]: ln for ln in report.lines}, report


def test_the_store_keeps_controls_apart_and_normalises_each_cell(tmp_path):
    controlled_run(tmp_path, 1, 1.0)
    with open_store(tmp_path) as store:
        (run,) = store.runs("ctl")
        assert (run.cells, run.ok, run.status) == (6, 6, "ok")
        cells = store.cells([run.pk])
        controls = [c for c in cells if c.is_control]
        assert len(controls) == 4 and all(c.norm is None for c in controls)
        configs = [c for c in cells if not c.is_control]
        assert all(c.norm is not None for c in configs)
        mobile = [c.norm for c in configs if c.group == "mobile"]
        assert mobile == pytest.approx([140.0 / 15.0] * 3, rel=0.05)
        p90 = store.cells([run.pk], metric="train.step_ips_p90")
        assert all(c.norm is not None for c in p90 if not c.is_control)
        assert store.expected_durations("ctl").keys() == {"hresnet", "hmobile"}


def test_a_failed_control_fails_the_run_but_not_its_configurations(tmp_path):
    controlled_run(tmp_path, 1, 1.0, failed_control=True)
    with open_store(tmp_path) as store:
        (run,) = store.runs("ctl")
        assert (run.cells, run.ok, run.status) == (6, 6, "failed")
        assert all(c.norm is not None for c in store.cells([run.pk]) if not c.is_control)


def test_a_slower_machine_is_no_regression_with_a_control_and_is_one_without(tmp_path):
    """The whole machine 15 % slower tonight (nothing in the code changed): raw images/s call
    it a regression; the ratio to the control does not."""
    nights(tmp_path, newest_factor=0.85)
    lines, report = lines_of(tmp_path)
    assert {ln.basis for ln in lines.values()} == {"normalised"}
    assert not report.failing, render_history(report)
    raw_lines, raw_report = lines_of(tmp_path, raw=True)
    assert {ln.verdict for ln in raw_lines.values()} == {"regression"}
    (control,) = report.controls
    assert control.change == pytest.approx(-0.15, abs=0.03)
    assert control.within == pytest.approx(0.995 ** 9 - 1, abs=0.03)


def test_a_slowdown_in_the_code_is_caught_through_the_machines_drift(tmp_path):
    """10 % slower code on a machine 8 % faster tonight: raw images/s see almost nothing."""
    nights(tmp_path, newest_factor=1.08, slowdown=0.10)
    lines, report = lines_of(tmp_path)
    assert {ln.verdict for ln in lines.values()} == {"regression"}
    assert lines["resnet18"].check.change == pytest.approx(1 / 1.1 - 1, abs=0.03)
    raw_lines, _ = lines_of(tmp_path, raw=True)
    assert not {ln.verdict for ln in raw_lines.values()} & {"regression"}
    text = render_history(report)
    assert "÷control" in text and "control: the machine's own drift" in text
    data = report.to_json()
    line = data["lines"][0]
    assert line["basis"] == "normalised" and set(line["figures"]) == {"normalised", "raw"}
    assert data["controls"][0]["group"] == "control-cpu"
    assert data["between_run_sd_normalised"] is not None


def test_history_before_the_control_existed_is_judged_raw_until_enough_has_one(tmp_path):
    for n in range(1, 5):
        controlled_run(tmp_path, n, 1.0, with_control=False)
    controlled_run(tmp_path, 5, 1.0)
    lines, report = lines_of(tmp_path)
    assert {ln.basis for ln in lines.values()} == {"raw"}
    assert all(ln.check is not None for ln in lines.values())
    assert "until at least 3 earlier runs have a control" in render_history(report)


def test_fail_on_regression_and_json_through_the_cli(tmp_path, capsys):
    nights(tmp_path, newest_factor=0.85)
    argv = ["history", "ctl", "--results", str(tmp_path), "--fail-on-regression",
            "--no-references"]
    assert main(argv) == 0
    assert main([*argv, "--raw"]) == 1
    capsys.readouterr()
    assert main([*argv, "--json", "--metric", "train.step_ips_p90"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {ln["basis"] for ln in data["lines"]} == {"normalised"}


def test_compare_judges_the_ratio_and_shows_the_drift_apart(tmp_path):
    controlled_run(tmp_path, 1, 1.0, noise=0.005)
    controlled_run(tmp_path, 2, 0.85, noise=0.005)
    with open_store(tmp_path) as store:
        a, b = store.runs("ctl")
        comp = compare_runs(store, a, b)
        raw = compare_runs(store, a, b, raw=True, confidence=0.9)  # 3 repeats: 90 % at most
    assert {r.verdict for r in raw.rows} == {"slower"}
    assert {r.basis for r in comp.rows} == {"normalised"}
    assert not {r.verdict for r in comp.rows} & {"slower", "faster"}
    (control,) = comp.controls
    assert control.change == pytest.approx(-0.15, abs=0.02)
    text = render_compare(comp)
    assert "control: the machine's drift from A to B" in text and "(÷control)" in text
    csv_text = render_compare_csv(comp)
    header, *rows = csv_text.splitlines()
    assert "norm_change" in header and "raw_change" in header
    assert sum(",control," in r for r in rows) == 1
    data = comp.to_json()
    assert data["rows"][0]["normalised"]["a_median"] is not None
    assert data["controls"][0]["change"] == pytest.approx(control.change)


def test_export_carries_the_role_and_the_normalised_figures(tmp_path, capsys):
    controlled_run(tmp_path, 1, 1.0)
    assert main(["export", "ctl", "--results", str(tmp_path), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    roles = {r["cell_id"]: r["role"] for r in rows}
    assert roles["control-cpu-c1"] == "control" and roles["resnet-r1"] == "config"
    figures = {r["figure"] for r in rows if r["cell_id"] == "resnet-r1"}
    assert {"norm.train.total_ips", "norm.train.step_ips_p90"} <= figures


def test_the_run_table_has_no_control_row_and_says_what_the_control_measured(tmp_path,
                                                                             capsys):
    paths = controlled_run(tmp_path, 1, 1.0)
    assert main(["report", "ctl", "--results", str(tmp_path), "--run", paths.run_id]) == 0
    out = capsys.readouterr().out
    assert "control control-cpu: 4 measurements" in out
    assert "pinned" not in out.split("control control-cpu")[0]


# --- a real sweep ---------------------------------------------------------------------------


def standin_control_matrix(standin: Standin) -> str:
    """:data:`CONTROL_MATRIX` whose cells and control run the STAND-IN workload."""
    return CONTROL_MATRIX.replace("[workload]\n", '[workload]\nprogram = "standin"\n',
                                  1) + standin.command()


def test_a_real_sweep_measures_its_control_between_the_cells_and_resume_keeps_the_order(
        write_matrix, tmp_path, standin):
    """The process backend (cells and control: the stand-in workload): C x x C x x C on this
    machine, the order of seed 5 recorded, the table without a control row; then two cells that
    did not end ok run again with --resume, in the recorded order, with controls of their own
    around them."""
    from orchestrator.sweep import run_sweep

    matrix = load_matrix(write_matrix(standin_control_matrix(standin)))
    outcome = run_sweep(matrix, results_root=tmp_path, order_seed=5)
    assert outcome.ok, [(r.cell_id, r.reason) for r in outcome.results]
    assert outcome.counts == {"ok": 4} and outcome.control_counts == {"ok": 3}
    paths = outcome.paths
    results = sorted(paths.results(), key=lambda r: r.started_at or 0.0)
    kinds = ["C" if r.role == "control" else "x" for r in results]
    assert kinds == list("CxxCxxC")
    assert {r.provenance["host"] for r in results} == {results[0].provenance["host"]}
    for before, after in zip(results, results[1:], strict=False):
        assert (before.finished_at or 0) <= (after.started_at or 0)  # one at a time
    plan = json.loads(paths.plan.read_text())
    expected = order_cells(list(matrix.cells), {}, seed=5, parallel=False)
    assert plan["order"]["seed"] == 5 and plan["order"]["parallel"] is False
    assert plan["order"]["cells"] == [c.id for c in expected]
    assert [r.cell_id for r in results if r.role == "config"] == plan["order"]["cells"]
    assert plan["control"]["every"] == 2
    assert [c["role"] for c in plan["control"]["cells"]] == ["control"]
    assert json.loads(paths.run_meta.read_text())["order_seed"] == 5
    assert "pinned" not in outcome.table and "control control-cpu: 3 measurements" in (
        outcome.table)
    assert len(paths.summary_csv.read_text().splitlines()) == 1 + 2
    with open_store(tmp_path) as store:
        cells = store.cells([store.runs("ctl")[0].pk])
    assert all(c.norm is not None for c in cells if not c.is_control)

    redo = plan["order"]["cells"][1:3]
    for cid in redo:  # as if they had failed
        data = json.loads(paths.cell_result(cid).read_text())
        data["status"] = "failed"
        paths.cell_result(cid).write_text(json.dumps(data))
    again = run_sweep(matrix, results_root=tmp_path, resume="", order_seed=99)
    assert again.ok
    rerun = sorted((r for r in paths.results() if r.cell_id in redo
                    or r.cell_id.startswith("control-cpu-c") and int(r.cell_id[13:]) > 3),
                   key=lambda r: r.started_at or 0.0)
    assert [r.cell_id for r in rerun] == ["control-cpu-c4", *redo, "control-cpu-c5"]
    assert json.loads(paths.plan.read_text())["order"]["seed"] == 5  # the run's own order


@pytest.mark.docker
def test_a_control_in_containers_runs_on_the_image_the_sweep_built_once(
        docker_client, base_image, write_matrix, tmp_path, standin):
    """The docker backend: the control's container is built with the cells' (one image for
    the profile), runs between them, and leaves no container."""
    from docker_support import cpu_container_matrix, run_containers

    from orchestrator.sweep import run_sweep

    text = cpu_container_matrix("dctl", base_image, backend="docker", standin=standin) + (
        '[axes]\nbatch_size = [2, 4]\n[control]\nparams = { batch_size = 2, arch = '
        '"mobilenet_v3_small" }\nevery = 2\n')
    logs: list[str] = []

    class Events(NullEvents):
        def log(self, message: str) -> None:
            logs.append(message)

    outcome = run_sweep(load_matrix(write_matrix(text, cpu_profile=False)),
                        results_root=tmp_path, events=Events())
    assert outcome.ok, [(r.cell_id, r.reason) for r in outcome.results]
    results = sorted(outcome.paths.results(), key=lambda r: r.started_at or 0.0)
    assert ["C" if r.role == "control" else "x" for r in results] == list("CxxC")
    assert len({r.provenance["image"] for r in results}) == 1
    assert len([m for m in logs if m.startswith("image ")]) == 1
    assert results[0].params["arch"] == "mobilenet_v3_small"
    assert run_containers(docker_client, outcome.paths.run_id) == []
    with open_store(tmp_path) as store:
        cells = store.cells([store.runs("dctl")[0].pk])
    assert all(c.norm is not None for c in cells if not c.is_control)


@pytest.mark.slurm
def test_a_control_on_slurm_is_a_job_and_calibrates_the_cells_of_its_node(
        write_matrix, tmp_path, no_jobs_left, standin):
    from test_backend_slurm import standin_tiny

    from orchestrator.sweep import run_sweep

    text = standin_tiny(standin) + ('[axes]\nbatch_size = [2, 4]\n[control]\n'
                                    'params = { batch_size = 2 }\nevery = 2\n')
    outcome = run_sweep(load_matrix(write_matrix(text, cpu_profile=False)),
                        results_root=tmp_path)
    assert outcome.ok, [(r.cell_id, r.reason) for r in outcome.results]
    controls = [r for r in outcome.results if r.role == "control"]
    configs = [r for r in outcome.results if r.role == "config"]
    # Slurm runs both cells at once (the sweep cannot tell their nodes before they run): a
    # control before the first, and one after each cell that ends with none waiting
    assert len(configs) == 2 and 2 <= len(controls) <= 3
    assert {r.provenance["host"] for r in outcome.results} == {no_jobs_left.node}
    assert len({r.provenance["slurm_job_id"] for r in outcome.results}) == len(outcome.results)
    with open_store(tmp_path) as store:
        cells = store.cells([store.runs("slurm_tiny")[0].pk])
    assert all(c.norm is not None for c in cells if not c.is_control)
