"""What the seeds need of our workload: every rank's iteration series (seed 002) and the traced
graph mode (seed 004), on the CPU."""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from workload.telemetry import Sample, per_gpu_telemetry

ROOT = Path(__file__).resolve().parents[1]


def test_per_rank_figures_keep_every_series_and_the_spread(torch: Any) -> None:
    from workload.run import per_rank_figures  # (workload.run imports torch)

    series = [[0.5, 0.4, 0.6], [0.5, 0.5, 0.7]]
    figures = per_rank_figures(series)
    assert figures["per_gpu.iteration_times"] == {"0": series[0], "1": series[1]}
    assert figures["gpu0.iteration_median_s"] == 0.5 and figures["gpu1.iteration_median_s"] == 0.5
    assert figures["per_gpu.spread_pct"] == 0.0
    assert "per_gpu.spread_pct" not in per_rank_figures([[0.1, 0.2]])


def test_per_gpu_telemetry_is_per_device_within_the_window() -> None:
    samples = [Sample(t, gpu, power_w=100.0 + 10 * gpu + t, temp_c=40.0 + t,
                      sm_clock_mhz=1000.0 + gpu, util_pct=90.0, mem_used_mib=1.0)
               for t in (0.0, 1.0, 2.0, 9.0) for gpu in (0, 1)]
    figures = per_gpu_telemetry(samples, 0.5, 2.5)
    assert figures["gpu0.power_w_mean"] == pytest.approx(101.5)
    assert figures["gpu1.power_w_mean"] == pytest.approx(111.5)
    assert figures["gpu1.sm_clock_mhz_mean"] == 1001.0 and figures["gpu0.temp_c_max"] == 42.0


def test_two_ranks_each_keep_their_own_series(tmp_path: Path, workload_python: str) -> None:
    """torchrun, two CPU ranks (gloo): the summary holds both ranks' series (not only the
    per-step maximum), iterations_per_rank.csv has a row per step and rank."""
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [workload_python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "workload", "--arch", "resnet18", "--image-size", "32", "--batch-size", "2",
         "--warmup", "1", "--iterations", "3", "--device", "cpu", "--output-dir", str(out)],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    data = summary["data"]
    series = data["per_gpu.iteration_times"]
    assert sorted(series) == ["0", "1"] and all(len(s) == 3 for s in series.values())
    # the throughput's per-step time is the slowest rank's: never below either rank's own
    for step, slowest in enumerate(summary["iteration_times"]):
        assert slowest >= max(series["0"][step], series["1"][step]) - 1e-9
    assert {"gpu0.iteration_median_s", "gpu1.iteration_median_s", "per_gpu.spread_pct"} <= set(
        data)
    with (out / "iterations_per_rank.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["step"], r["rank"]) for r in rows] == [
        (str(s), str(r)) for r in (0, 1) for s in (1, 2, 3)]


def small_model(torch: Any) -> Any:
    """A small convolutional model (made here: test modules import no torch at collection)."""
    nn = torch.nn

    class Small(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.bn = nn.BatchNorm2d(4)
            self.fc = nn.Linear(4, 10)

        def forward(self, x: Any) -> Any:
            return self.fc(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))

    return Small


def test_graph_mode_traces_the_model_and_trains_it(torch: Any) -> None:
    """hpu_mode graph is torch.jit.trace (seed 004's graph mode): the traced model shares the
    parameters, so the optimizer trains the original model's weights."""
    from workload.steps import build_step, trace_model

    Small = small_model(torch)  # a class
    torch.manual_seed(0)
    model = Small()
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
    assert isinstance(trace_model(model, x), torch.jit.ScriptModule)
    before = model.fc.weight.detach().clone()
    step, graphs = build_step(model, "train", "cpu", "fp32", False, (x, y), hpu_mode="graph")
    loss = step(x, y)
    assert not graphs and torch.isfinite(loss)
    assert not torch.equal(before, model.fc.weight)  # trained through the traced graph
    infer, _ = build_step(Small().eval(), "infer", "cpu", "fp32", False, (x, y),
                          hpu_mode="graph")
    assert infer(x, y).shape == (4, 10)
