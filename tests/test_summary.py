"""Summary tables: medians over repeats, speedup and efficiency vs 1 GPU, CSV, from disk."""

from __future__ import annotations

import csv
import io

import pytest

from orchestrator.results import CellResult, RunPaths, Status, write_json
from orchestrator.summary import (
    add_ratios,
    render_csv,
    render_table,
    summarize,
    write_summary,
)


def result(gpus: int, repeat: int, ips: float | None, status: Status = Status.OK,
           mode: str = "train", precision: str = "fp32") -> CellResult:
    group = f"v100-g{gpus}-{precision}-{mode}"
    metrics = {} if ips is None else {
        f"{'train' if mode == 'train' else 'val'}.total_ips": ips,
        f"{'train' if mode == 'train' else 'val'}.compute_ips": ips * 1.1,
        "val.compute_latency_at50": 0.002, "val.compute_latency_at99": 0.004,
    }
    return CellResult(
        cell_id=f"{group}-r{repeat}", group=group, repeat=repeat, status=status,
        params={"hardware": "v100", "gpus": gpus, "precision": precision, "mode": mode},
        metrics=metrics,
    )


def test_median_over_ok_repeats_only():
    rows = summarize([
        result(1, 1, 100.0), result(1, 2, 300.0), result(1, 3, 200.0),
        result(1, 4, None, Status.FAILED), result(1, 5, 9999.0, Status.TIMEOUT),
    ])
    (row,) = rows
    assert (row.runs, row.ok) == (5, 3)
    assert row.ips == 200.0 and (row.ips_min, row.ips_max) == (100.0, 300.0)
    assert row.statuses == {"ok": 3, "failed": 1, "timeout": 1}
    assert row.speedup is None  # no gpus axis


def test_speedup_and_efficiency_vs_one_gpu_with_equal_other_params():
    rows = summarize([
        result(1, 1, 100.0), result(2, 1, 190.0), result(4, 1, 360.0), result(8, 1, 640.0),
        result(1, 1, 300.0, precision="amp"), result(8, 1, 2100.0, precision="amp"),
    ])
    by = {(r.params["gpus"], r.params["precision"]): r for r in rows}
    assert by[(1, "fp32")].speedup == pytest.approx(1.0)
    assert by[(2, "fp32")].speedup == pytest.approx(1.9)
    assert by[(8, "fp32")].efficiency == pytest.approx(0.8)
    assert by[(8, "amp")].speedup == pytest.approx(7.0)  # against amp's 1 GPU, not fp32's
    assert by[(8, "amp")].efficiency == pytest.approx(0.875)
    table = render_table(rows)
    assert "speedup" in table and "efficiency" in table and "80%" in table


def test_no_speedup_without_a_one_gpu_baseline():
    rows = summarize([result(2, 1, 100.0), result(4, 1, 180.0)])
    assert all(r.speedup is None for r in rows)


def test_inference_rows_show_latency_in_ms():
    (row,) = summarize([result(1, 1, 500.0, mode="infer")])
    assert row.latency_p50_ms == pytest.approx(2.0) and row.latency_p99_ms == pytest.approx(4.0)
    assert "p99 ms" in render_table([row])


def test_csv_has_params_and_numbers():
    rows = summarize([result(1, 1, 100.0), result(2, 1, 150.0)])
    parsed = list(csv.DictReader(io.StringIO(render_csv(rows))))
    assert [p["gpus"] for p in parsed] == ["1", "2"]
    assert float(parsed[1]["speedup"]) == pytest.approx(1.5)
    assert parsed[0]["statuses"] == "ok=1"


def test_write_summary_reads_only_the_disk(tmp_path):
    paths = RunPaths.create(tmp_path, "m", "run1")
    for res in (result(1, 1, 100.0), result(2, 1, 180.0)):
        write_json(paths.cell_result(res.cell_id), res.to_json())
    rows, table = write_summary(paths)
    assert len(rows) == 2 and paths.summary_csv.is_file() and paths.summary_txt.is_file()
    assert "180.0" in table and "1.80" in table


def test_ratio_vs_baseline_row():
    def res(hw: str, ips: float) -> CellResult:
        return CellResult(cell_id=f"{hw}-r1", group=hw, repeat=1, status=Status.OK,
                          params={"hardware": hw, "mode": "train", "batch_size": 256},
                          metrics={"train.total_ips": ips})

    rows = summarize([res("v100", 1000.0), res("v100-bitfusion", 850.0)])
    assert add_ratios(rows, "hardware", "v100") == 2
    assert [r.ratio for r in rows] == [pytest.approx(1.0), pytest.approx(0.85)]
    assert "vs hardware=v100" in render_table(rows, baseline="hardware=v100")
    assert "0.85x" in render_table(rows, baseline="hardware=v100")
