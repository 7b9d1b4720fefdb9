"""The parsers held against real output of the tools on an H100 (tests/data/h100-2026-11-25/,
captured by benchmarks/gpu_session.sh on 2026-11-25: NVIDIA H100 80GB HBM3, driver 580.159.04,
torch 2.11.0+cu130, Nsight Compute 2025.3.1; the commands are in that folder's README.md).

Each test here failed on the code before the real files were seen, or checks a fact the real
files showed and the code now relies on."""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
from pathlib import Path

import pytest

from orchestrator.config.matrix_file import DEFAULT_NCU_METRICS
from orchestrator.results.figures import foreign_logs as fl
from orchestrator.results.figures.profiler_figures import (
    HOPPER_TENSOR,
    PIPE_METRICS,
    ncu_figures,
    parse_ncu_raw,
)
from orchestrator.results.importer.logs import _seed_kind

DATA = Path(__file__).parent / "data" / "h100-2026-11-25"


def unzip(name: str) -> str:
    return gzip.decompress((DATA / name).read_bytes()).decode()


def raw_rows() -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(io.StringIO(unzip("ncu-raw.csv.gz"))))
    return rows[0], rows[2:]  # header, (units row), kernels


# --- ncu -----------------------------------------------------------------------------------


def test_every_profiled_kernel_lies_inside_the_capture_window():
    """The window was measured iteration 15 (--profile-start 15 --profile-iterations 1):
    ncu's NVTX column puts every profiled kernel inside the workload's 'profile' range and
    'iteration 15', none in another iteration (ncu ran with --profile-from-start off)."""
    header, kernels = raw_rows()
    nvtx = next(i for i, h in enumerate(header) if h.startswith("thread Domain:Push/Pop_Range"))
    assert len(kernels) == 179
    iterations = {m for row in kernels for m in re.findall(r":iteration (\d+):", row[nvtx])}
    assert iterations == {"15"}
    assert all(":profile:" in row[nvtx] for row in kernels)


def test_the_raw_page_of_an_h100_parses_with_its_units_and_separators():
    kernels = parse_ncu_raw(unzip("ncu-raw.csv.gz"))
    assert len(kernels) == 179
    first = kernels[0]
    assert first.name.startswith("void at::vectorized_elementwise_kernel<8")
    assert first.duration_ns == 2912.0  # gpu__time_duration.sum in ns (--print-units base)
    assert first.metrics["gpc__cycles_elapsed.max"] == 4637.0  # printed "4,637"
    figs = ncu_figures(kernels)
    assert figs.metrics["ncu.kernels"] == 179
    assert figs.metrics["ncu.kernel_time_ms"] == pytest.approx(4.72432)
    assert set(figs.metrics) >= {"ncu.fma_pct", "ncu.tensor_pct", "ncu.sfu_pct"}
    assert 0 < figs.metrics["ncu.tensor_pct"] < 100


def test_on_hopper_pipe_tensor_counts_hmma_alone():
    """Why the Hopper per-type Tensor metric is preferred: in the real profile
    smsp__pipe_tensor_cycles_active equals the HMMA-only metric for every kernel, while the
    warpgroup MMA (gmma) instructions ran (sm__inst_executed_pipe_tensor_op_gmma > 0)."""
    kernels = parse_ncu_raw(unzip("ncu-raw.csv.gz"))
    pct = ".avg.pct_of_peak_sustained_active"
    for k in kernels:
        assert k.metrics[f"smsp__pipe_tensor_cycles_active{pct}"] == \
            k.metrics[f"smsp__pipe_tensor_op_hmma_cycles_active{pct}"]
    gmma = "sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_elapsed"
    assert max(k.metrics[gmma] for k in kernels) > 1.0
    assert PIPE_METRICS["tensor"][0] == f"sm__{HOPPER_TENSOR}{pct}"


def test_default_ncu_metrics_name_what_an_h100_has():
    """Every alternative of the default metric regexes names a metric ncu 2025.3 lists for
    GH100 or one of older chips' known names; the Hopper Tensor and FP16 forms are among
    them (the default asked for pipe_tensor_op_gmma_cycles_active, which no chip has)."""
    names = set((DATA / "ncu-query-metrics-gh100-pipes.txt").read_text().split())
    hopper = [n for n in names for m in DEFAULT_NCU_METRICS if m.startswith("regex:")
              and re.search(m[len("regex:"):], n)]
    assert f"smsp__{HOPPER_TENSOR}.avg.pct_of_peak_sustained_active" in hopper
    assert "smsp__inst_executed_pipe_fma_type_fp16.avg.pct_of_peak_sustained_active" in hopper
    assert "smsp__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active" not in names
    for candidates in PIPE_METRICS.values():  # every candidate is real on GH100 or pre-Hopper
        for name in candidates:
            assert isinstance(name, str)
            assert name in names or re.search(r"pipe_fp16|pipe_tensor\.avg", name), name


def test_todays_details_page_is_read_as_the_seeds_format():
    """ncu 2025.3's `ncu --csv` (the details page TBD's coreutil.py reads) has NVTX, block and
    grid size, device and CC columns where TBD's ncu had 'Kernel Time': the old exact header
    match refused it as "not ncu --csv output"."""
    text = unzip("ncu-details.csv.gz")
    assert fl.TBD_HEADER not in text
    assert _seed_kind(text) == "tbd-ncu"
    kernels = fl.parse_ncu_long_csv(text)
    assert len(kernels) == 174  # this export was taken while the (cut) profile was written
    result = fl.coreutil(kernels)
    assert set(result.pct) == {"fma", "tensor", "sfu"}  # Hopper: no FP16 pipe metric
    assert any(n.startswith("fp16: sm__inst_executed_pipe_fp16") for n in result.notes)
    assert result.kernels == 173  # IDs 0..172: coreutil's range(max_id)


def test_details_and_raw_pages_of_one_report_give_the_same_coreutil_figures():
    """The same ncu report exported both ways: the seed rule over the details page equals the
    same rule computed here, independently, over the raw page (kernels 0..172)."""
    details = fl.coreutil(fl.parse_ncu_long_csv(unzip("ncu-details.csv.gz")))
    kernels = parse_ncu_raw(unzip("ncu-raw.csv.gz"))[:173]
    cycles = [int(k.metrics[fl.TBD_CYCLES]) for k in kernels]
    for unit in ("fma", "tensor", "sfu"):
        metric = fl.TBD_FIELDS[unit]
        expected = 100 * sum(c * k.metrics[metric] / 100 for c, k in zip(cycles, kernels,
                                                                          strict=True))
        assert details.pct[unit] == pytest.approx(expected / sum(cycles), rel=1e-9)


# --- nvidia-smi and NVML telemetry ---------------------------------------------------------


def test_the_real_nvidia_smi_banner():
    from orchestrator.catalog.gpus import parse_smi_header

    assert parse_smi_header((DATA / "nvidia-smi.txt").read_text()) == ("580.159.04", "13.0")


def test_nvml_telemetry_agrees_with_nvidia_smi_over_the_same_window():
    """A training run sampled by the workload's NVML sampler every 5 ms while this session
    polled nvidia-smi every 0.2 s: the workload's summary (recomputed here from its real
    telemetry.csv and iterations.csv) and nvidia-smi agree on power, temperature, clock and
    throttling over the measured window."""
    from workload.telemetry import Sample, summarize_telemetry

    tdir = DATA / "telemetry"
    with (tdir / "iterations.csv").open() as fh:
        rows = list(csv.DictReader(fh))  # the 60 measured iterations (warmup not written)
    start = float(rows[0]["start_s"])
    end = float(rows[-1]["start_s"]) + float(rows[-1]["iteration_time_s"])
    with (tdir / "telemetry.csv").open() as fh:
        samples = [Sample(float(r["timestamp"]), int(r["gpu"]), float(r["power_w"]),
                          float(r["temp_c"]), float(r["sm_clock_mhz"]), float(r["util_pct"]),
                          float(r["mem_used_mib"]), r["throttled"] == "True")
                   for r in csv.DictReader(fh)]
    ours = summarize_telemetry(samples, start, end, images=len(rows) * 256)
    recorded = json.loads((tdir / "summary.json").read_text())["data"]
    for key in ("telemetry.power_mean_w", "telemetry.temp_max_c", "telemetry.samples",
                "telemetry.energy_per_image_j"):
        assert ours[key] == pytest.approx(recorded[key], rel=0.02), key
    with (tdir / "nvidia-smi-samples.csv").open() as fh:
        smi = [r for r in csv.DictReader(fh) if start <= float(r["host_time"]) <= end]
    assert len(smi) >= 5
    smi_power = sum(float(r["power.draw"]) for r in smi) / len(smi)
    assert ours["telemetry.power_mean_w"] == pytest.approx(smi_power, rel=0.05)
    assert ours["telemetry.temp_max_c"] == max(float(r["temperature.gpu"]) for r in smi)
    assert ours["telemetry.sm_clock_mean_mhz"] == pytest.approx(
        sum(float(r["clocks.sm"]) for r in smi) / len(smi), rel=0.01)
    assert ours["telemetry.throttled"] is False
    assert {r["clocks_event_reasons.active"] for r in smi} == {"0x0000000000000000"}


def test_nvml_power_refreshes_slower_than_the_shortest_interval_allowed():
    """Why telemetry_interval stops at MIN_TELEMETRY_INTERVAL_S: sampled every 5 ms on the H100,
    NVML's power reading changed a median 99 ms apart (and the temperature ~300 ms): a shorter
    interval repeats readings."""
    import statistics

    from orchestrator.config.matrix_file import MIN_TELEMETRY_INTERVAL_S

    with (DATA / "telemetry" / "telemetry.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    stamps = [float(r["timestamp"]) for r in rows]
    assert statistics.median(b - a for a, b in zip(stamps, stamps[1:], strict=False)) < 0.006
    changes = [float(rows[i]["timestamp"]) for i in range(1, len(rows))
               if rows[i]["power_w"] != rows[i - 1]["power_w"]]
    refresh = statistics.median(b - a for a, b in zip(changes, changes[1:], strict=False))
    assert refresh > MIN_TELEMETRY_INTERVAL_S
