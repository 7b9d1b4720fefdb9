"""End-to-end runs of ``python -m workload`` as a subprocess (CPU, tiny model, few steps).

All runs of this module start together (one module-scoped fixture) so their start-up
(importing torch and torchvision) overlaps on the 2-core machines.
GPU paths (CUDA events, CUDA graphs, nvJPEG/DALI decode, NVML telemetry, NCCL) cannot run
here: ``benchmarks/gpu_paths.py`` runs each of them on a GPU machine and checks that it really
ran, and ``benchmarks/workload_vs_dle.py`` compares the synthetic-data throughput with DLE.
"""

from __future__ import annotations

import csv
import json
import math
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from workload_support import TINY, Launched, Result

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:The image decoding and encoding:DeprecationWarning"),
]

META_KEYS = {
    "torch_version",
    "torchvision_version",
    "cuda_version",
    "cudnn_version",
    "device",
    "device_name",
    "driver_version",
    "device_count",
    "world_size",
    "precision",
    "memory_format",
    "compile",
    "cuda_graphs",
    "arch",
    "mode",
    "batch_size",
    "global_batch_size",
    "image_size",
    "data",
    "hostname",
    "python_version",
}
COMMON_KEYS = {"iterations", "warmup", "world_size", "global_batch_size", "duration_s"}
TRAIN_KEYS = {
    "train.total_ips",
    "train.compute_ips",
    "train.loss",
    "train.data_time",
    "train.compute_time",
}
VAL_KEYS = {"val.total_ips", "val.compute_ips"} | {
    f"val.{kind}_latency_at{q}" for kind in ("compute", "total") for q in (50, 90, 95, 99)
}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("workload")


@pytest.fixture(scope="module")
def runs(workload_python: str, work: Path) -> Iterator[dict[str, Launched]]:
    from workload.make_dataset import make_dataset  # imports torch

    dataset = work / "jpegs"
    make_dataset(dataset, classes=4, per_class=4, size=48)
    started = {
        "train": Launched([*TINY, "--output-dir", str(work / "out")]),
        # bf16 inference on a real JPEG ImageFolder, one DataLoader worker process
        "infer": Launched(
            [
                *TINY,
                "--mode",
                "infer",
                "--precision",
                "bf16",
                "--no-channels-last",
                "--data",
                str(dataset),
                "--workers",
                "1",
            ]
        ),
        # two ranks training on disjoint shards of the JPEG folder (in-process decoding)
        "ddp": Launched(
            [*TINY, "--batch-size", "2", "--iterations", "2", "--data", str(dataset)],
            torchrun=2,
        ),
    }
    yield started
    for launched in started.values():
        if launched.proc.poll() is None:
            launched.proc.kill()
            launched.proc.wait()


def _ok(result: Result) -> dict:
    assert result.returncode == 0, result.describe()
    types = [line["type"] for line in result.lines]
    assert types[0] == "meta" and types[-1] == "summary", result.describe()
    assert set(types[1:-1]) <= {"iter"}
    assert set(result.meta["env"]) >= META_KEYS, META_KEYS - set(result.meta["env"])
    summary = result.summary
    assert summary["status"] == "ok"
    assert summary["env"] == result.meta["env"] | {
        k: v for k, v in summary["env"].items() if k not in result.meta["env"]
    }
    assert set(summary["data"]) >= COMMON_KEYS
    times = summary["iteration_times"]
    assert len(times) == summary["data"]["iterations"]  # warmup excluded
    assert all(math.isfinite(t) and t > 0 for t in times)
    return summary


def _positive(value: float) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


def test_train_synthetic_with_output_dir(runs: dict[str, Launched], work: Path) -> None:
    summary = _ok(runs["train"].result())
    data, env = summary["data"], summary["env"]
    assert set(data) >= TRAIN_KEYS
    assert _positive(data["train.total_ips"]) and _positive(data["train.compute_ips"])
    # total_ips counts every measured iteration's whole time (data + compute)
    times = summary["iteration_times"]
    assert data["train.total_ips"] == pytest.approx(4 * len(times) / math.fsum(times))
    assert data["iterations"] == 3 and data["warmup"] == 1
    assert (env["device"], env["precision"], env["memory_format"]) == (
        "cpu",
        "fp32",
        "channels_last",
    )
    assert (env["mode"], env["data"], env["world_size"]) == ("train", "synthetic", 1)
    assert not any(k.startswith("telemetry.") for k in data)  # no sampler on CPU

    out = work / "out"
    assert json.loads((out / "summary.json").read_text()) == summary
    rows = list(csv.DictReader((out / "iterations.csv").open()))
    assert [int(r["step"]) for r in rows] == [1, 2, 3]
    assert [float(r["iteration_time_s"]) for r in rows] == pytest.approx(summary["iteration_times"])
    assert not (out / "telemetry.csv").exists()


def test_infer_bf16_image_folder(runs: dict[str, Launched], work: Path) -> None:
    summary = _ok(runs["infer"].result())
    data, env = summary["data"], summary["env"]
    assert set(data) >= VAL_KEYS
    assert not any(k.startswith("train.") for k in data)
    assert _positive(data["val.total_ips"]) and data["val.data_time"] >= 0
    assert data["val.compute_latency_at50"] <= data["val.compute_latency_at99"]
    assert (env["precision"], env["mode"], env["memory_format"]) == ("bf16", "infer", "contiguous")
    assert env["data"] == str(work / "jpegs") and env["decoder"] == "cpu"


def test_torchrun_two_processes_gloo(runs: dict[str, Launched], work: Path) -> None:
    result = runs["ddp"].result()
    summary = _ok(result)
    metas = [line for line in result.lines if line["type"] == "meta"]
    assert len(metas) == 1  # only rank 0 prints
    assert summary["data"]["world_size"] == 2 and summary["env"]["world_size"] == 2
    assert summary["env"]["rank_hosts"] == [socket.gethostname()] * 2  # every rank's host
    assert summary["data"]["global_batch_size"] == 4 == 2 * summary["env"]["batch_size"]
    assert summary["env"]["data"] == str(work / "jpegs")
    assert _positive(summary["data"]["train.total_ips"])
