"""Profiler CSV -> per-cell figures (orchestrator/results/figures/profiler_figures.py).

THE INPUT FILES ARE NOT CAPTURED TOOL OUTPUT. ``tests/data/profilers/`` was written from the
documented CSV formats of ncu (raw page), nsys stats (cuda_gpu_kern_sum / gpukernsum,
cuda_gpu_trace) and nvprof (metric summary): no NVIDIA GPU or tool exists on these machines.
Its README gives, per file, the command whose real output should replace it on a GPU machine.
The expected figures below are worked out by hand from those files.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from orchestrator.config.matrix_file import NcuOptions
from orchestrator.errors import LogFormatError
from orchestrator.results.figures.profiler_figures import (
    busy_fraction,
    figures_of_cell,
    ncu_figures,
    nsys_figures,
    number,
    nvprof_value,
    parse_ncu_raw,
    parse_nsys_gpu_trace,
    parse_nsys_kern_sum,
    parse_nvprof_metrics,
)

DATA = Path(__file__).resolve().parent / "data" / "profilers"


def text(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


@pytest.mark.parametrize(("raw", "value"), [
    ("1,234.5", 1234.5), ('"12.5"', 12.5), ("55.3%", 55.3), ("n/a", None), ("", None),
    ("nan", None), (None, None),
])
def test_numbers_as_the_tools_print_them(raw: str | None, value: float | None) -> None:
    assert number(raw) == value


def test_ncu_hopper_names_time_weighted() -> None:
    """H100 (real ncu 2025.3.1 output, four kernels of a ResNet-50 amp step): no FP16 pipe
    metric; smsp__ forms (what the default metrics ask for); figures weighted by kernel time."""
    kernels = parse_ncu_raw(text("ncu-raw-h100.csv"))
    assert [k.duration_ns for k in kernels] == [2912, 146528, 109920, 17408]
    assert kernels[1].name.startswith("sm90_xmma_fprop_image_first_layer")
    figs = ncu_figures(kernels)
    m = figs.metrics
    total = 2912 + 146528 + 109920 + 17408
    assert m["ncu.kernels"] == 4 and m["ncu.kernel_time_ms"] == pytest.approx(total / 1e6)
    def mean(values: list[float]) -> float:
        return (2912 * values[0] + 146528 * values[1] + 109920 * values[2]
                + 17408 * values[3]) / total
    assert m["ncu.fma_pct"] == pytest.approx(mean([0.71, 5.26, 21.06, 0.33]))
    assert m["ncu.sfu_pct"] == pytest.approx(mean([0, 0, 4.23, 0]))
    assert m["ncu.tensor_pct"] == pytest.approx(mean([0.02, 53.59, 1.32, 14.96]))
    assert "ncu.fp16_pct" not in m
    assert any("FP16x2 on the FMA pipes" in n for n in figs.notes)
    sources = figs.info["metrics_from"]
    assert sources["fma"] == "smsp__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active"
    assert sources["tensor"] == "smsp__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"


def test_ncu_volta_names_units_and_separators() -> None:
    """V100: pipe_fp16 and pipe_tensor; durations in usecond with thousands separators."""
    kernels = parse_ncu_raw(text("ncu-raw-v100.csv"))
    assert [k.duration_ns for k in kernels] == [1_500_000, 500_000]
    m = ncu_figures(kernels).metrics
    assert m["ncu.kernel_time_ms"] == pytest.approx(2.0)
    assert m["ncu.fma_pct"] == pytest.approx(0.75 * 20 + 0.25 * 60)  # 30
    assert m["ncu.fp16_pct"] == pytest.approx(0.75 * 30)  # 22.5
    assert m["ncu.sfu_pct"] == pytest.approx(0.75 * 1 + 0.25 * 5)  # 2
    assert m["ncu.tensor_pct"] == pytest.approx(0.75 * 50)  # 37.5


def test_ncu_explicit_metrics_become_figures_and_missing_durations_are_said() -> None:
    csv_text = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
                '"Block Size","Grid Size","Device","CC","sm__throughput.avg.pct_of_peak_sustained'
                '_elapsed"\n"","","","","","","","","","","","%"\n'
                '"0","1","p","h","k1","1","7","(1, 1, 1)","(1, 1, 1)","0","8.0","40"\n'
                '"1","1","p","h","k2","1","7","(1, 1, 1)","(1, 1, 1)","0","8.0","80"\n')
    options = NcuOptions(metrics=["sm__throughput.avg.pct_of_peak_sustained_elapsed",
                                  "dram__throughput.avg.pct_of_peak_sustained_elapsed"])
    figs = ncu_figures(parse_ncu_raw(csv_text), options)
    assert figs.metrics["ncu.sm__throughput.avg.pct_of_peak_sustained_elapsed"] == 60.0
    assert "ncu.kernel_time_ms" not in figs.metrics
    assert any("plain means" in n for n in figs.notes)
    assert any("dram__throughput" in n for n in figs.notes)


def test_ncu_output_with_tool_messages_before_the_table() -> None:
    noisy = "==PROF== Connected to process 7\n==WARNING== note\n" + text("ncu-raw-v100.csv")
    assert len(parse_ncu_raw(noisy)) == 2


def test_not_an_ncu_table_is_a_format_error() -> None:
    with pytest.raises(LogFormatError, match="no CSV header with Kernel Name"):
        parse_ncu_raw("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission\n")


def test_nsys_kernel_summary_new_and_old_names() -> None:
    new = parse_nsys_kern_sum(text("nsys-cuda_gpu_kern_sum.csv"))
    assert [(k.total_ns, k.instances) for k in new] == [
        (5_000_000, 10), (2_000_000, 20), (1_000_000, 40)]
    old = parse_nsys_kern_sum(text("nsys-gpukernsum-2020.csv"))
    assert [(k.total_ns, k.instances) for k in old] == [(4_000_000, 8), (1_000_000, 16)]
    figs = nsys_figures(new, None)
    assert figs.metrics == {"nsys.kernel_time_ms": 8.0, "nsys.kernels": 70.0,
                            "nsys.top_kernel_pct": 62.5}
    top = figs.info["top_kernels"]
    assert [t["instances"] for t in top] == [10, 20, 40]
    assert top[2]["name"].startswith("ncclDevKernel_AllReduce")


def test_nsys_gpu_busy_counts_overlapping_kernels_once_per_gpu() -> None:
    """GPU 0: kernels [0,100) [50,150) [300,400) and a copy (not a kernel) -> 250/400;
    GPU 1: [1000,1100) [1100,1300) -> 300/300; the mean of the two."""
    trace = parse_nsys_gpu_trace(text("nsys-cuda_gpu_trace.csv"))
    assert len(trace) == 5  # the memory copy has no grid
    assert busy_fraction(trace) == pytest.approx((250 / 400 + 1.0) / 2)
    figs = nsys_figures(None, trace)
    assert figs.metrics == {"nsys.gpu_busy_pct": pytest.approx(81.25)}
    assert busy_fraction([]) is None


def test_nvprof_levels_invocation_weighted() -> None:
    assert (nvprof_value("Low (2)"), nvprof_value("Max (10)"), nvprof_value("98.5%")) == (
        2.0, 10.0, 98.5)
    rows = parse_nvprof_metrics(text("nvprof.4242.csv"))
    assert len(rows) == 8
    from orchestrator.results.figures.profiler_figures import nvprof_figures

    m = nvprof_figures(rows).metrics
    assert m["nvprof.kernels"] == 40
    assert m["nvprof.fma_pct"] == pytest.approx(10 * (1 * 30 + 4 * 10) / 40)  # 17.5
    assert m["nvprof.fp16_pct"] == pytest.approx(10 * 2 * 30 / 40)  # 15
    assert m["nvprof.tensor_pct"] == pytest.approx(10 * 7 * 30 / 40)  # 52.5
    assert m["nvprof.sfu_pct"] == pytest.approx(10 * 1 * 10 / 40)  # 2.5


def _cell(tmp_path: Path, *files: tuple[str, str]) -> Path:
    cell = tmp_path / "cell"
    cell.mkdir()
    for src, dst in files:
        shutil.copy(DATA / src, cell / dst)
    return cell


def test_figures_of_a_cell_folder_per_tool(tmp_path: Path) -> None:
    cell = _cell(tmp_path, ("ncu-raw-h100.csv", "ncu.csv"),
                 ("nsys-cuda_gpu_kern_sum.csv", "nsys_kern_sum.csv"),
                 ("nsys-cuda_gpu_trace.csv", "nsys_gpu_trace.csv"),
                 ("nvprof.4241.csv", "nvprof.4241.csv"), ("nvprof.4242.csv", "nvprof.4242.csv"))
    ncu = figures_of_cell(cell, "ncu", NcuOptions())
    assert ncu.metrics["ncu.tensor_pct"] == pytest.approx(
        (2912 * 0.02 + 146528 * 53.59 + 109920 * 1.32 + 17408 * 14.96) / 276768)
    assert ncu.provenance()["files"] == ["ncu.csv"] and ncu.provenance()["tool"] == "ncu"
    nsys = figures_of_cell(cell, "nsys")
    assert set(nsys.metrics) == {"nsys.kernel_time_ms", "nsys.kernels", "nsys.top_kernel_pct",
                                 "nsys.gpu_busy_pct"}
    nvprof = figures_of_cell(cell, "nvprof")
    assert nvprof.metrics["nvprof.kernels"] == 40
    assert nvprof.info["files"] == ["nvprof.4241.csv", "nvprof.4242.csv"]


def test_a_cell_without_profiler_files_or_with_garbage_gets_notes_not_errors(
        tmp_path: Path) -> None:
    cell = _cell(tmp_path)
    for tool in ("ncu", "nsys", "nvprof"):
        figs = figures_of_cell(cell, tool)
        assert figs.metrics == {} and "recorded nothing" in figs.notes[0]
    (cell / "ncu.csv").write_text("==ERROR== Profiling failed\n")
    figs = figures_of_cell(cell, "ncu")
    assert figs.metrics == {} and "no CSV header" in figs.notes[0]
