"""The seeds' own formats (orchestrator/results/figures/foreign_logs.py), their figures parsers,
their import and their table rules: each checked against the numbers its log was written from
(tests/seed_logs_support.py), with the hostile cases a lab's old logs bring."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from results_support import import_results
from seed_logs_support import (
    dlperf_examples_log,
    habana_log,
    iteration_duration_log,
    ncu_csv,
    write,
)

from orchestrator.config.figures import FiguresConfig
from orchestrator.errors import ConfigError, LogFormatError
from orchestrator.results.figures import foreign_logs as fl
from orchestrator.results.figures.figure_parsers import CellOutput, evaluate
from orchestrator.results.folders.run_folder import RunPaths
from orchestrator.results.importer import ImportOptions, plan_import
from orchestrator.results.reports.summary import summarize_run
from orchestrator.results.reports.table_rules import RULES


def _options(tmp_path: Path, *params: str, **kw: object) -> ImportOptions:
    return ImportOptions(matrix="seed", results_root=tmp_path / "results",
                         params=["hardware=lab", *params], **kw)  # type: ignore[arg-type]


# --- DLPerf's layout -----------------------------------------------------------------------------


def test_dlperf_layout_states_gpus_batch_precision_and_run_and_skips_other_names(
        tmp_path: Path) -> None:
    """``2n8g/r50_b128_fp32_3.log``: 16 GPUs (DLPerf's global batch counts nodes), batch 128,
    fp32, run 3. DLPerf's published 1n8g row also read ``r50_b128_fp32_1_3.log``-style files
    (its name split keys them as run 1, overwriting run 1 in glob order): they are skipped and
    listed here, not silently merged."""
    times = [0.4] * 130
    for seed, name in enumerate(("1n1g/r50_b128_fp32_1.log", "2n8g/r50_b128_fp32_3.log",
                                 "1n8g/r50_b128_fp32_1_3.log", "1n8g/notes.txt")):
        write(tmp_path / "logs" / name, dlperf_examples_log(times, seed=seed))
    plan = plan_import([tmp_path / "logs"], _options(tmp_path))
    got = {e.path.name: (e.known, e.repeat, e.origin["gpus"]) for e in plan.entries}
    assert got["r50_b128_fp32_3.log"][0] == {
        "gpus": 16, "batch_size": 128, "precision": "fp32", "arch": "resnet50",
        "hardware": "lab"}
    assert got["r50_b128_fp32_3.log"][1:] == (3, "DLPerf folder layout")
    assert sorted(Path(p).name for p in plan.skipped) == ["notes.txt", "r50_b128_fp32_1_3.log"]
    big = next(e for e in plan.entries if e.known["gpus"] == 16)
    assert big.evaluation is not None
    assert big.evaluation.figures.metrics["dlperf.total_ips"] == round(128 * 16 / 0.4, 2)


def test_dlperf_layout_with_an_unknown_model_names_the_file(tmp_path: Path) -> None:
    write(tmp_path / "logs" / "1n1g" / "vgg16_b128_fp32_1.log", dlperf_examples_log([0.4] * 130))
    with pytest.raises(ConfigError, match=r"vgg16_b128_fp32_1\.log.*DLPerf model 'vgg16'"):
        plan_import([tmp_path / "logs"], _options(tmp_path))
    plan = plan_import([tmp_path / "logs"], _options(tmp_path, "arch=vgg16"))
    assert plan.entries[0].known["arch"] == "vgg16"


def test_a_dlperf_log_that_ends_early_is_refused_with_its_line_count(tmp_path: Path) -> None:
    write(tmp_path / "logs" / "1n1g" / "r50_b128_fp32_1.log", dlperf_examples_log([0.4] * 60))
    with pytest.raises(ConfigError, match=r"54 DLPerf lines \(time-values\); its rule needs 120"):
        plan_import([tmp_path / "logs"], _options(tmp_path))


def test_dlperf_time_values_rule_by_hand() -> None:
    """Lines with index <= 5 skipped, 20 more dropped, the next 100 Time values summed."""
    times = [9.0] * 6 + [5.0] * 20 + [0.25] * 50 + [0.5] * 50 + [7.0] * 10
    speed = fl.dlperf_speed(dlperf_examples_log(times), 256)
    assert speed.ips == round(256 / ((50 * 0.25 + 50 * 0.5) / 100), 2)
    with pytest.raises(LogFormatError, match="without DLPerf's"):
        fl.dlperf_speed("Epoch: something else\n", 1, variant="time-values")


# --- TBD: Nsight Compute CSV ---------------------------------------------------------------------

KERNEL = {"gpc__cycles_elapsed.max": 1000.0, **dict.fromkeys(fl.TBD_FIELDS.values(), 10.0)}


def test_coreutil_rule_weights_by_cycles_and_leaves_the_last_kernel_out() -> None:
    kernels = [
        {**KERNEL, "gpc__cycles_elapsed.max": 3000.0,
         fl.TBD_FIELDS["fma"]: 40.0},
        {**KERNEL, "gpc__cycles_elapsed.max": 1000.0, fl.TBD_FIELDS["fma"]: 0.0},
        {**KERNEL, "gpc__cycles_elapsed.max": 10**9, fl.TBD_FIELDS["fma"]: 100.0},  # the last
    ]
    result = fl.coreutil(fl.parse_ncu_long_csv(ncu_csv(kernels, thousands=True)))
    assert result.pct["fma"] == pytest.approx(100 * (3000 * 0.40) / 4000)
    assert result.pct["tensor"] == pytest.approx(10.0)
    assert (result.kernels, result.launches) == (2, 3)
    assert any("left out, as coreutil.py's range(max_id)" in n for n in result.notes)


def test_ncu_csv_without_a_metric_or_header() -> None:
    incomplete = [KERNEL, {"gpc__cycles_elapsed.max": 5.0}, KERNEL]
    result = fl.coreutil(fl.parse_ncu_long_csv(ncu_csv(incomplete)))
    assert result.kernels == 1 and any("kernel ID 1: no " in n for n in result.notes)
    with pytest.raises(LogFormatError, match="not ncu --csv output"):
        fl.parse_ncu_long_csv("==PROF== Disconnected from process 1\n")
    bad = ncu_csv([KERNEL, KERNEL]).replace('"10.00"', '"n/a"', 1)
    with pytest.raises(LogFormatError, match=r"line \d+.*'n/a' is not a number"):
        fl.parse_ncu_long_csv(bad)


# --- TensorFlow TimeHistory -----------------------------------------------------------------


def test_time_history_mean_after_the_first_window(tmp_path: Path) -> None:
    text = "\n".join(f"I0101 TimeHistory: 1.00 seconds, {v:.2f} examples/second between steps "
                     f"{i * 100} and {(i + 1) * 100}" for i, v in enumerate([10.0, 300.0, 302.0]))
    ev = evaluate(CellOutput(text, params={"mode": "train"}),
                  FiguresConfig(parser="tf-timehistory"))
    assert ev.ok and ev.figures.metrics["train.total_ips"] == pytest.approx(301.0)
    write(tmp_path / "throughput_logs" / "throughput_64.log", text)
    plan = plan_import([tmp_path / "throughput_logs" / "throughput_64.log"], _options(tmp_path))
    assert plan.entries[0].kind == "tf-timehistory"
    assert plan.entries[0].known["batch_size"] == 64


# --- seed 002: per-GPU series --------------------------------------------------------------------


def series(gpus: int = 4, n: int = 500) -> dict[int, list[float]]:
    return {g: [2.0] + [0.20 + 0.01 * g + 0.001 * (i % 7) for i in range(n - 1)]
            for g in range(gpus)}


def test_every_gpus_series_is_kept_and_tabled(tmp_path: Path) -> None:
    truth = series()
    text = iteration_duration_log(truth)
    parsed = fl.iteration_durations(text)
    assert {g: [t for _, t in pts] for g, pts in parsed.items()} == truth
    ev = evaluate(CellOutput(text), FiguresConfig(parser="iteration-durations"))
    assert ev.ok, ev.reason
    metrics = ev.figures.metrics
    assert metrics["per_gpu.iteration_times"]["3"] == truth[3]
    for g in range(4):
        assert metrics[f"gpu{g}.iteration_median_s"] == statistics.median(truth[g][1:])
    medians = [statistics.median(truth[g][1:]) for g in range(4)]
    assert metrics["per_gpu.spread_pct"] == pytest.approx(
        100 * (max(medians) - min(medians)) / min(medians))


NVPROF = """==1234== NVPROF is profiling process 1234, command: python
"Start","Duration","Grid X","Device","Context","Stream","Name","SM Clock","Memory Clock",\
"Temperature","Power","Fan"
s,ms,,,,,,MHz,MHz,C,mW,%
0.5,,,"Tesla V100-SXM2-16GB (0)",,,,1380,877,41,65000,
0.5001,0.2,80,"Tesla V100-SXM2-16GB (0)",1,7,"volta_sgemm",,,,,
0.6,,,"Tesla V100-SXM2-16GB (0)",,,,1530,877,43,250000,
"""


def test_seed_002_import_keeps_per_gpu_series_and_nvprof_telemetry(tmp_path: Path) -> None:
    """``resnet_iterdur_<ts>_<host>.txt`` with its ``resnet_<pid>_<ts>_<host>.csv`` beside it:
    4 GPUs stated by the log, per-GPU clock/power/temperature from nvprof's system profiling
    (power in mW becomes W), the files copied with the log, the per-gpu rule's table."""
    folder = tmp_path / "run1"
    write(folder / "resnet_iterdur_1658772000_node7.txt", iteration_duration_log(series()))
    write(folder / "resnet_1234_1658772000_node7.csv", NVPROF)
    write(folder / "resnet_9_1658771999_other.csv", NVPROF.replace("(0)", "(3)"))
    paths, plan = import_results([folder / "resnet_iterdur_1658772000_node7.txt"],
                                 _options(tmp_path))
    entry = plan.entries[0]
    assert entry.kind == "iteration-durations" and entry.known["gpus"] == 4
    assert [p.name for p in entry.companions] == ["resnet_1234_1658772000_node7.csv"]
    result = RunPaths(paths.root).results()[0]
    assert result.metrics["gpu0.sm_clock_mhz_mean"] == pytest.approx(1455.0)
    assert result.metrics["gpu0.power_w_max"] == pytest.approx(250.0)
    assert "gpu3.power_w_mean" not in result.metrics  # another run's file is not this one's
    assert (paths.root / "cells" / result.cell_id / "resnet_1234_1658772000_node7.csv").exists()
    rows, table = summarize_run(RunPaths(paths.root))
    assert rows[0].rule == "per-gpu"
    assert "GPU 0 s/iter" in table and "GPU 3 s/iter" in table and "spread %" in table
    assert "GPU 0 W" in table


# --- Habana ----------------------------------------------------------------------------------


def test_habana_per_card_and_scaling(tmp_path: Path) -> None:
    """img/s per card and scaling % = per-card(8) / per-card(1): seed 004's 601 / 679 = 88.5 %."""
    write(tmp_path / "logs" / "hls1_1card.log", habana_log([100.0] * 5 + [679.0] * 50))
    write(tmp_path / "logs" / "hls1_8card.log", habana_log([90.0] * 5 + [601.0] * 50))
    first = import_results([tmp_path / "logs" / "hls1_1card.log"], _options(
        tmp_path, "gpus=1", warmup=5))[0]
    result = RunPaths(first.root).results()[0]
    assert result.metrics["habana.img_per_s_card"] == 679.0
    assert result.metrics["train.total_ips"] == 679.0
    # one run with both: the two logs imported together
    paths, _ = import_results([tmp_path / "logs"], ImportOptions(
        matrix="both", results_root=tmp_path / "results", warmup=5,
        pattern=r"hls1_(?P<gpus>[0-9]+)card\.log", params=["hardware=gaudi"]))
    rows, table = summarize_run(RunPaths(paths.root))
    eight = next(r for r in rows if r.params["gpus"] == 8)
    assert eight.ips == 601.0 and eight.efficiency == pytest.approx(601 / 679)
    assert "scaling %" in table and "88.5%" in table and "img/s per card" in table


# --- the rules themselves ------------------------------------------------------------------------


def test_the_rule_names_are_the_ones_a_matrix_may_give() -> None:
    from typing import get_args

    from orchestrator.cli.import_commands import RULE_CHOICES
    from orchestrator.config.matrix_file import TableRuleName

    assert tuple(RULES) == get_args(TableRuleName) == RULE_CHOICES


@pytest.mark.parametrize(("raw", "message"), [
    ({"parser": "workload", "variant": "timestamps"}, "variant applies to parser 'dlperf'"),
    ({"parser": "regex", "regex": [{"name": "x", "pattern": "(1)"}], "warmup": 2},
     "warmup applies to parsers"),
    ({"parser": "dllogger", "telemetry": "x*.csv"}, "telemetry applies"),
    ({"parser": "workload", "file": "x.log"}, "file applies to parsers"),
    ({"parser": "dlperf", "variant": "stopwatch"}, "Input should be 'timestamps'"),
])
def test_figures_options_of_the_seed_parsers_are_checked(raw: dict[str, object],
                                                         message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FiguresConfig.model_validate(raw)


def test_a_plan_with_a_rule_this_version_does_not_know_falls_back(tmp_path: Path) -> None:
    write(tmp_path / "logs" / "1n1g" / "r50_b128_fp32_1.log", dlperf_examples_log([0.4] * 130))
    paths, _ = import_results([tmp_path / "logs"], _options(tmp_path))
    plan = json.loads((paths.root / "plan.json").read_text())
    assert plan["table_rule"] == "dlperf"
    plan["table_rule"] = "from-the-future"
    (paths.root / "plan.json").write_text(json.dumps(plan))
    rows, table = summarize_run(RunPaths(paths.root))
    assert rows[0].rule == "median" and "table rule" not in table


def test_our_ncu_figures_read_the_seeds_elapsed_metrics_weighted_by_cycles() -> None:
    """A profile asking for TBD's metrics (the _elapsed forms and gpc__cycles_elapsed.max) gets
    its ncu.* figures from them, weighted by the elapsed cycles as coreutil.py weights them (the
    figures were missing before: only the _active forms were read)."""
    from orchestrator.results.figures.profiler_figures import Kernel, ncu_figures

    fma = fl.TBD_FIELDS["fma"]
    kernels = [Kernel("a", 10.0, {fl.TBD_CYCLES: 3000.0, fma: 40.0}),
               Kernel("b", 90.0, {fl.TBD_CYCLES: 1000.0, fma: 0.0})]
    figures = ncu_figures(kernels)
    assert figures.metrics["ncu.fma_pct"] == pytest.approx(30.0)  # by cycles; by time: 4.0
    assert figures.info["weighting"]["fma"] == fl.TBD_CYCLES
