"""Summary tables: medians over repeats, speedup and efficiency vs 1 GPU, CSV, from disk."""

from __future__ import annotations

import csv
import io

import pytest

from orchestrator.results.folders.run_folder import CellResult, RunPaths, Status, write_json
from orchestrator.results.reports.summary import (
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


def test_speedup_of_multi_node_rows_is_against_one_gpu_on_one_node():
    cells = [result(1, 1, 100.0), result(8, 1, 760.0), result(16, 1, 1440.0)]
    for cell, nodes in zip(cells, (1, 1, 2), strict=True):
        cell.params["nodes"] = nodes
    by = {r.params["gpus"]: r for r in summarize(cells)}
    assert by[8].speedup == pytest.approx(7.6)
    assert by[16].speedup == pytest.approx(14.4) and by[16].efficiency == pytest.approx(0.9)


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


# --- comparisons stay within one software stack -------------------------------------------

NGC_2310 = {"torch_version": "2.1.0a0+32f93b1", "torchvision_version": "0.16.0a0",
            "cuda_version": "12.2", "cudnn_version": 8906, "container_release": "23.10"}
NGC_2405 = {"torch_version": "2.4.0a0+07cecf4168", "torchvision_version": "0.19.0a0",
            "cuda_version": "12.4", "cudnn_version": 90100, "container_release": "24.05"}


def stacked(hw: str, ips: float, env: dict[str, object], repeat: int = 1,
            **params: object) -> CellResult:
    values = {"hardware": hw, "mode": "train", "batch_size": 256, **params}
    group = "-".join(str(v) for v in values.values())
    return CellResult(cell_id=f"{group}-r{repeat}", group=group, repeat=repeat,
                      status=Status.OK, params=values, metrics={"train.total_ips": ips},
                      env=dict(env))


def test_a_ratio_across_stacks_is_marked_with_what_differs():
    rows = summarize([stacked("v100", 1000.0, NGC_2310),
                      stacked("v100-bitfusion", 850.0, NGC_2405)])
    add_ratios(rows, "hardware", "v100")
    native, bitfusion = rows
    assert native.cross_stack == {}
    note = bitfusion.cross_stack["ratio"]
    assert note.startswith("torch 2.4.0a0+07cecf4168 vs 2.1.0a0+32f93b1")
    assert "CUDA 12.4 vs 12.2" in note and "NGC 24.05 vs 23.10" in note
    table = render_table(rows, baseline="hardware=v100")
    assert "0.85x (cross-stack: torch 2.4.0a0+07cecf4168 vs 2.1.0a0+32f93b1" in table
    assert "ratio: torch 2.4.0a0" in render_csv(rows)


def test_a_ratio_on_one_stack_is_bare():
    rows = summarize([stacked("v100", 1000.0, NGC_2310),
                      stacked("v100-bitfusion", 850.0, NGC_2310)])
    add_ratios(rows, "hardware", "v100")
    assert all(r.cross_stack == {} for r in rows)
    table = render_table(rows, baseline="hardware=v100")
    assert "0.85x" in table and "cross-stack" not in table


def test_parts_only_one_side_records_are_not_compared():
    """An imported DLLogger run knows no cuDNN: the parts both record decide."""
    partial = {k: v for k, v in NGC_2310.items() if k != "cudnn_version"}
    rows = summarize([stacked("v100", 1000.0, NGC_2310), stacked("dle", 900.0, partial)])
    add_ratios(rows, "hardware", "v100")
    assert rows[1].cross_stack == {}


def test_a_speedup_across_stacks_is_marked_too():
    rows = summarize([stacked("v100", 1000.0, NGC_2310, gpus=1),
                      stacked("v100", 7000.0, NGC_2405, gpus=8)])
    eight = rows[1]
    assert eight.speedup == pytest.approx(7.0)
    assert eight.cross_stack["speedup"].startswith("torch 2.4.0a0")
    assert "7.00 (cross-stack: torch" in render_table(rows)


def test_repeats_on_two_stacks_show_both():
    rows = summarize([stacked("v100", 1000.0, NGC_2310),
                      stacked("bf", 850.0, NGC_2310, repeat=1),
                      stacked("bf", 860.0, NGC_2405, repeat=2)])
    add_ratios(rows, "hardware", "v100")
    assert rows[1].cross_stack["ratio"].startswith(
        "torch 2.1.0a0+32f93b1/2.4.0a0+07cecf4168 vs 2.1.0a0+32f93b1")


def test_a_bool_baseline_is_written_as_toml_writes_it(tmp_path):
    rows = summarize([stacked("h100", 1000.0, {}, cuda_graphs=False),
                      stacked("h100", 1100.0, {}, cuda_graphs=True)])
    assert add_ratios(rows, "cuda_graphs", "false") == 2
    assert rows[1].ratio == pytest.approx(1.1)


def release_result(host: str, release: str, repeat: int, ips: float, *,
                   ngc_release: str | None = None, env_release: bool = False) -> CellResult:
    params = {"hardware": "h100", "gpus": 1, "precision": "bf16"}
    if ngc_release is not None:
        params["ngc_release"] = ngc_release
    group = "h100" + (f"-ngc{ngc_release}" if ngc_release else "")
    env = {"torch_version": {"24.05": "2.4.0a0", "24.10": "2.5.0a0"}[release]}
    if env_release:
        env["container_release"] = release
    return CellResult(
        cell_id=f"{group}-r{repeat}", group=group, repeat=repeat, status=Status.OK,
        params=params, metrics={"train.total_ips": ips}, env=env,
        provenance={"host": host, "release": release, "release_family": "ngc",
                    "image_id": f"sha256:{release}"})


def test_the_table_says_which_release_each_row_ran_and_marks_a_mixed_row():
    """release = "auto" on hosts with different drivers: one group's repeats ran two releases
    (the provenance says which; the stack key takes it where the env has no NGC release)."""
    rows = summarize([release_result("a", "24.05", 1, 100.0), release_result("b", "24.10", 2,
                                                                             120.0)])
    (row,) = rows
    assert row.releases == ["24.05", "24.10"]
    assert len(row.stacks) == 2 and ("NGC", "24.05") in row.stacks[0]
    table = render_table(rows)
    assert "| release" in table and "24.05/24.10*" in table
    assert "* the row's repeats ran different releases" in table
    assert "release" in render_csv(rows).splitlines()[0].split(",")


def test_one_release_everywhere_adds_no_column():
    rows = summarize([release_result("a", "24.05", 1, 100.0),
                      release_result("b", "24.05", 2, 110.0)])
    assert "release" not in render_table(rows)


def test_a_release_baseline_is_labelled_the_release_comparison_not_cross_stack():
    rows = summarize([
        release_result("a", "24.05", 1, 100.0, ngc_release="24.05", env_release=True),
        release_result("a", "24.10", 1, 125.0, ngc_release="24.10", env_release=True),
    ])
    assert add_ratios(rows, "ngc_release", "24.05") == 2  # the baseline row too (1.00x)
    new = next(r for r in rows if r.params["ngc_release"] == "24.10")
    assert new.ratio == pytest.approx(1.25) and new.cross_stack == {}
    assert new.release_comparison == {"ratio": "torch 2.5.0a0 vs 2.4.0a0, NGC 24.10 vs 24.05"}
    table = render_table(rows, baseline="ngc_release=24.05")
    assert "1.25x (release comparison: torch 2.5.0a0 vs 2.4.0a0, NGC 24.10 vs 24.05)" in table
    assert "cross-stack" not in table
    assert "| release" not in table  # the ngc_release column says it already
    # the same rows compared on another key stay a cross-stack warning
    rows = summarize([
        release_result("a", "24.05", 1, 100.0, ngc_release="24.05", env_release=True),
        release_result("a", "24.10", 1, 125.0, ngc_release="24.10", env_release=True),
    ])
    for row in rows:
        row.params.pop("ngc_release")
        row.params["hardware"] = "h100" if row.releases == ["24.05"] else "h100-new"
    add_ratios(rows, "hardware", "h100")
    assert "cross-stack: torch 2.5.0a0 vs 2.4.0a0" in render_table(rows, baseline="hardware=h100")


def test_rows_run_under_ncu_are_marked_as_not_the_throughput():
    """ncu slowed the iterations outside its window to 0.64x on an H100 (2026-11-25): a row of
    ncu cells gets '~' after its images/s and a footnote saying so; other rows stay bare."""
    plain = result(1, 1, 1000.0)
    profiled = result(2, 1, 640.0)
    profiled.params["profiler"] = "ncu"
    text = render_table(summarize([plain, profiled]), ["gpus"])
    assert "640.0~" in text and "1,000.0~" not in text
    assert "ran under ncu, which slows the whole program" in text
    assert "~ ran under ncu" not in render_table(summarize([plain]), ["gpus"])
