"""Telemetry and profiler figures in the tables, and the throttle re-run.

Results here are synthetic (``result.json`` values written by the test): no GPU on these
machines produces power, clocks or throttling. The sweep tests run the real run loop
(``sweep.run_cells`` and the base backend's ``run_cell``) on the fake execution of
tests/backend_support.py, whose replayed output says the GPU throttled, and which leaves
an ncu CSV (written from ncu's documented format: tests/data/profilers/README.md) where the
tool would have.
"""

from __future__ import annotations

import csv
import io
import shutil
from pathlib import Path
from typing import Any

import pytest
from backend_support import FakeExecution, Script, line

from orchestrator.backends.base import Backend, Execution, ExitInfo, RunOptions
from orchestrator.config.matrix_file import MatrixSettings
from orchestrator.plan.launch import LaunchSpec
from orchestrator.plan.matrix import Cell, load_matrix
from orchestrator.plan.placement import Allocation
from orchestrator.results.figures.rerun import should_rerun, throttled
from orchestrator.results.folders.run_folder import (
    CellResult,
    RunPaths,
    Status,
    read_json,
    write_json,
)
from orchestrator.results.reports.summary import (
    THROTTLE_NOTE,
    render_csv,
    render_table,
    summarize,
    write_summary,
)
from orchestrator.sweep import NullEvents, run_cells

DATA = Path(__file__).resolve().parent / "data" / "profilers"

TELEMETRY = {"telemetry.power_mean_w": 290.0, "telemetry.energy_per_image_j": 0.125,
             "telemetry.temp_max_c": 71.0, "telemetry.sm_clock_mean_mhz": 1755.0,
             "telemetry.throttled": False}


def result(batch: int, repeat: int, ips: float, status: Status = Status.OK,
           **metrics: Any) -> CellResult:
    group = f"h100-g1-bs{batch}-amp"
    return CellResult(
        cell_id=f"{group}-r{repeat}", group=group, repeat=repeat, status=status,
        params={"hardware": "h100", "gpus": 1, "batch_size": batch, "precision": "amp"},
        metrics={"train.total_ips": ips, **metrics},
    )


def metrics(**changes: Any) -> dict[str, Any]:
    """TELEMETRY with some figures changed (keyword names: ``__`` for ``.``)."""
    out = dict(TELEMETRY)
    for key, value in changes.items():
        out[key.replace("__", ".")] = value
    return out


def test_telemetry_and_profiler_columns_with_a_throttled_row() -> None:
    results = [
        result(128, 1, 2000.0, **metrics()),
        result(128, 2, 2100.0, **metrics(telemetry__power_mean_w=310.0,
                                         telemetry__temp_max_c=75.0)),
        result(256, 1, 2500.0, **metrics(telemetry__throttled=True),
               **{"ncu.fma_pct": 12.5, "ncu.tensor_pct": 48.0}),
        result(256, 2, 2400.0, Status.FAILED, **metrics(telemetry__throttled=True)),
    ]
    rows = summarize(results)
    first, second = rows
    assert first.extra["power_mean_w"] == 300.0  # median of 290 and 310
    assert first.extra["temp_max_c"] == 75.0  # max over repeats
    assert first.throttled == 0 and second.throttled == 1  # the failed repeat does not count
    assert second.extra["tensor_pct"] == 48.0 and "tensor_pct" not in first.extra
    table = render_table(rows)
    header = table.splitlines()[0]
    for title in ("W", "J/image", "max C", "SM MHz", "FMA %", "Tensor %"):
        assert f" {title} " in header
    assert "FP16 %" not in header and "GPU busy %" not in header  # no row has them
    assert "2,500.0!" in table and "2,050.0 " in table
    assert table.endswith(THROTTLE_NOTE)
    parsed = list(csv.DictReader(io.StringIO(render_csv(rows))))
    assert parsed[0]["power_mean_w"] == "300.0" and parsed[0]["throttled"] == "0"
    assert parsed[1]["throttled"] == "1" and parsed[1]["tensor_pct"] == "48.0"
    assert parsed[0]["energy_per_image_j"] == "0.125"


def test_no_telemetry_no_columns_no_mark() -> None:
    rows = summarize([result(128, 1, 2000.0), result(256, 1, 2500.0)])
    table = render_table(rows)
    headers = [h.strip() for h in table.splitlines()[0].split("|")]
    assert "images/s (median)" in headers and "W" not in headers and "!" not in table
    assert rows[0].throttled is None and "throttled" not in render_csv(rows)


def test_nvprof_figures_fill_the_pipe_columns_where_ncu_has_none() -> None:
    rows = summarize([result(128, 1, 900.0, **{"nvprof.fma_pct": 17.5,
                                               "nvprof.tensor_pct": 52.5})])
    assert rows[0].extra == {"fma_pct": 17.5, "tensor_pct": 52.5}


def test_summary_from_result_files_on_disk(tmp_path: Path) -> None:
    paths = RunPaths.create(tmp_path / "results", "m")
    for res in (result(128, 1, 2000.0, **metrics(telemetry__throttled=True)),
                result(128, 2, 2100.0, **metrics())):
        write_json(paths.cell_result(res.cell_id), res.to_json())
    rows, table = write_summary(paths)
    assert rows[0].throttled == 1 and "!" in table
    assert "throttled" in paths.summary_csv.read_text()


@pytest.mark.parametrize(("status", "flag", "reruns", "allowed", "expected"), [
    (Status.OK, True, 0, 1, True),
    (Status.OK, True, 1, 1, False),   # already re-run as often as allowed
    (Status.OK, True, 0, 0, False),   # re-runs off (the default)
    (Status.OK, False, 0, 3, False),  # did not throttle
    (Status.OK, None, 0, 3, False),   # no telemetry (CPU, no NVML, Gaudi): unknown, no re-run
    (Status.FAILED, True, 0, 3, False),  # failed cells are not re-run for throttling
])
def test_should_rerun(status: Status, flag: bool | None, reruns: int, allowed: int,
                      expected: bool) -> None:
    res = result(128, 1, 1.0, status, **({} if flag is None else {"telemetry.throttled": flag}))
    settings = MatrixSettings(rerun_throttled=allowed)
    assert should_rerun(res, settings, reruns) is expected
    assert throttled(res) is (status is Status.OK and flag is True)


# --- the sweep: a re-run after throttling, profiler figures into result.json ---------------

META = {"type": "meta", "env": {"device": "cuda"}}


def summary(throttled_: bool) -> dict[str, Any]:
    return {"type": "summary", "env": {"device": "cuda"},
            "data": {"train.total_ips": 500.0, "telemetry.throttled": throttled_}}


class ScriptedBackend(Backend):
    """Replays one script per launch, in order; with ``ncu_csv``, leaves that file as the
    cell's ``ncu.csv`` the way workload/profile_run.py would."""

    name = "scripted"

    def __init__(self, *args: Any, scripts: list[Script], ncu_csv: Path | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.scripts = list(scripts)
        self.ncu_csv = ncu_csv
        self.launched: list[int] = []

    def spec(self, cell: Cell, allocation: Allocation, attempt: int = 1) -> LaunchSpec:
        return LaunchSpec(cell_id=cell.id, argv=("fake",), env={}, device="cuda",
                          attempt=attempt)

    def launch(self, spec: LaunchSpec) -> Execution:
        self.launched.append(spec.attempt)
        if self.ncu_csv is not None:
            shutil.copy(self.ncu_csv, self.paths.cell_dir(spec.cell_id) / "ncu.csv")
        return FakeExecution(self.scripts.pop(0))

    def unplaceable(self, cell: Cell) -> str | None:
        return None


class Log(NullEvents):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def log(self, message: str) -> None:
        self.lines.append(message)


def _backend(write_matrix: Any, tmp_path: Path, extra: str, scripts: list[Script],
             ncu_csv: Path | None = None) -> ScriptedBackend:
    matrix = load_matrix(write_matrix(f"""
        [matrix]
        {extra}
        [workload]
        hardware = "gpu"
        iterations = 10
        profiler = "ncu"
        [hardware.gpu]
        device = "cuda"
    """, cpu_profile=False))
    paths = RunPaths.create(tmp_path / "results", matrix.name)
    return ScriptedBackend(matrix, paths, RunOptions(timeout_s=30), scripts=scripts,
                           ncu_csv=ncu_csv)


def _ok(throttled_: bool) -> Script:
    return Script([line(META), line(summary(throttled_))], ExitInfo(code=0))


def test_a_throttled_cell_runs_again_and_its_first_attempt_is_kept(
        write_matrix: Any, tmp_path: Path) -> None:
    backend = _backend(write_matrix, tmp_path, "rerun_throttled = 2",
                       [_ok(True), _ok(False)], ncu_csv=DATA / "ncu-raw-h100.csv")
    events = Log()
    (res,) = run_cells(backend, list(backend.matrix.cells), events)
    assert backend.launched == [1, 2]
    assert res.status is Status.OK and res.metrics["telemetry.throttled"] is False
    assert res.attempts == 2
    assert events.lines and "throttled while measuring" in events.lines[0]
    superseded = list((backend.paths.root / "superseded").iterdir())
    assert len(superseded) == 1 and "-throttled-" in superseded[0].name
    assert read_json(superseded[0] / "result.json")["metrics"]["telemetry.throttled"] is True
    # the profiler's figures are in the result and in result.json
    on_disk = read_json(backend.paths.cell_result(res.cell_id))
    assert on_disk["metrics"]["ncu.tensor_pct"] == pytest.approx(  # the real H100 sample
        (2912 * 0.02 + 146528 * 53.59 + 109920 * 1.32 + 17408 * 14.96) / 276768)
    assert on_disk["provenance"]["profiler"]["tool"] == "ncu"


def test_re_runs_stop_at_the_setting_and_the_last_attempt_is_recorded(
        write_matrix: Any, tmp_path: Path) -> None:
    backend = _backend(write_matrix, tmp_path, "rerun_throttled = 1", [_ok(True), _ok(True)])
    (res,) = run_cells(backend, list(backend.matrix.cells), NullEvents())
    assert backend.launched == [1, 2] and res.metrics["telemetry.throttled"] is True
    # no ncu.csv left: the figures say so instead of failing the cell
    assert res.status is Status.OK
    assert "recorded nothing" in res.provenance["profiler"]["notes"][0]


def test_no_rerun_by_default(write_matrix: Any, tmp_path: Path) -> None:
    backend = _backend(write_matrix, tmp_path, "", [_ok(True)])
    (res,) = run_cells(backend, list(backend.matrix.cells), NullEvents())
    assert backend.launched == [1] and res.attempts == 1
    assert not (backend.paths.root / "superseded").exists()
