"""The benchmarks that need a GPU: benchmarks/workload_vs_dle.py (pure parts; its runs need a
GPU and DeepLearningExamples) and benchmarks/gpu_paths.py (pure parts, and its CPU smoke)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return _load("workload_vs_dle")


@pytest.fixture(scope="module")
def paths(torch: Any) -> ModuleType:
    """benchmarks/gpu_paths.py (it imports torch: the tests that take it are workload-tier)."""
    return _load("gpu_paths")


def _dlll(step: object, data: dict) -> str:
    return "DLLL " + json.dumps({"timestamp": 1.0, "type": "LOG", "step": step, "data": data})


def test_parse_dllogger_and_measure_like_ours(bench: ModuleType) -> None:
    lines = [_dlll("PARAMETER", {"arch": "resnet50"})]
    # iteration times 1, 1, 2, 2 s at batch 256 -> ips 256, 256, 128, 128
    for i, ips in enumerate([256.0, 256.0, 128.0, 128.0]):
        lines.append(
            _dlll([0, i], {"train.total_ips": ips, "train.compute_ips": ips, "train.loss": 6.9})
        )
    lines.append(_dlll([], {"train.total_ips": 192.0}))  # DLE's own summary: ignored
    records = bench.parse_dllogger("\n".join(lines))
    assert len(records) == 4
    case = bench.Case("t", "train", 256, "amp")
    outcome = bench.dle_outcome(records, case, warmup=1)
    assert outcome.ips == pytest.approx(256 * 3 / 5)  # totals rule, warmup dropped


def test_latency_percentiles_from_dle(bench: ModuleType) -> None:
    lines = [
        _dlll(
            [0, 0, i],
            {
                "val.total_ips": 100.0,
                "val.compute_ips": 100.0,
                "val.compute_latency": 0.001 * (i + 1),
            },
        )
        for i in range(100)
    ]
    case = bench.Case("l", "infer", 1, "amp", latency=True)
    outcome = bench.dle_outcome(bench.parse_dllogger("\n".join(lines)), case, warmup=0)
    assert outcome.p50_ms == pytest.approx(51.0) and outcome.p99_ms == pytest.approx(99.0)


def test_parse_dle_stdout_fallback(bench: ModuleType) -> None:
    text = (
        "Epoch: 0 Iteration: 1  train.loss : 6.93  train.total_ips : 1234.50 img/s "
        "train.compute_ips : 1300.00 img/s\nnoise\n"
    )
    records = bench.parse_dle_stdout(text)
    assert records[0]["data"]["train.total_ips"] == 1234.5


def test_commands_match_between_programs(bench: ModuleType, tmp_path: Path) -> None:
    case = bench.CASES[0]
    dle = bench.dle_command(tmp_path, case, 100, 20, tmp_path, "python")
    assert {"--amp", "--training-only", "nhwc", "synthetic", "256"} <= set(dle)
    assert dle[dle.index("--prof") + 1] == "120"
    ours = bench.ours_command(case, 100, 20, "python", "cuda", "resnet50", 224, tmp_path)
    assert ours[ours.index("--precision") + 1] == "amp" and "--channels-last" in ours
    assert bench.dle_command(tmp_path, bench.CASES[1], 1, 1, tmp_path, "python") is None


def test_table(bench: ModuleType) -> None:
    c1, c4 = bench.CASES[0], bench.CASES[3]
    rows = bench.table_rows(
        [
            (c1, bench.Outcome(ips=2000.0), bench.Outcome(ips=1000.0)),
            (c4, bench.Outcome(p50_ms=1.0, p99_ms=2.0), bench.Outcome(note="DLE not run")),
        ]
    )
    assert rows[0][:4] == ["train-amp-bs256", "2,000.0", "1,000.0", "2.000"]
    assert rows[1][3] == "-" and "DLE not run" in rows[1][4]
    assert "ours/DLE" in bench.table(bench.HEADER, rows)


def test_without_gpu_exits_with_message(
    bench: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pretend there is no GPU even on a GPU machine: this test must not run the benchmark.
    monkeypatch.setattr(bench, "gpu_count", lambda: 0)
    assert bench.main([]) == 3  # benchmarks/common.py: CANNOT_RUN
    assert "cannot run here: no CUDA GPU" in capsys.readouterr().err


# ---- gpu_paths.py -----------------------------------------------------------------------------


def _setup(paths: ModuleType, device: str = "cuda", gpus: int = 1, dataset: Path | None = None):
    return paths.Setup("python", device, "resnet50", 224, 100, 30, gpus, 8, dataset)


def _case(paths: ModuleType, name: str):
    return next(c for c in paths.CASES if c.name == name)


def test_gpu_paths_commands(paths: ModuleType, tmp_path: Path) -> None:
    gpu = _setup(paths, gpus=4, dataset=tmp_path / "jpegs")
    ddp = paths.command(_case(paths, "train-amp-bs256-ddp"), gpu, tmp_path)
    assert ddp[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4"]
    assert ddp[5:7] == ["-m", "workload"]
    jpeg = paths.command(_case(paths, "train-amp-bs256-jpeg-nvjpeg"), gpu, tmp_path)
    assert jpeg[jpeg.index("--data") + 1] == str(tmp_path / "jpegs")
    assert jpeg[jpeg.index("--workers") + 1] == "8"
    prof = paths.command(_case(paths, "train-amp-bs256-torch-profiler"), gpu, tmp_path)
    assert prof[prof.index("--iterations") + 1] == "20" and "torch" in prof
    graphs = paths.command(_case(paths, "infer-amp-bs1-graphs"), gpu, tmp_path)
    assert "--cuda-graphs" in graphs and graphs[graphs.index("--batch-size") + 1] == "1"
    assert "--data" not in graphs and graphs[graphs.index("--workers") + 1] == "0"
    assert graphs[graphs.index("--iterations") + 1] == "2000"  # enough for a p99
    assert graphs[graphs.index("--telemetry-interval") + 1] == "0.05"
    cpu = paths.command(_case(paths, "train-amp-bs256"), _setup(paths, "cpu", 0), tmp_path)
    assert cpu[cpu.index("--precision") + 1] == "fp32"
    assert cpu[cpu.index("--batch-size") + 1] == "4"
    assert cpu[cpu.index("--telemetry-interval") + 1] == "0"
    cpu_bs1 = paths.command(_case(paths, "infer-amp-bs1"), _setup(paths, "cpu", 0), tmp_path)
    assert cpu_bs1[cpu_bs1.index("--iterations") + 1] == "100"


def test_gpu_paths_skips(paths: ModuleType) -> None:
    one, cpu = _setup(paths, gpus=1), _setup(paths, "cpu", 0)
    assert paths.skip_reason(_case(paths, "train-amp-bs256-ddp"), one) == (
        "DDP needs 2+ GPUs, 1 visible"
    )
    assert paths.skip_reason(_case(paths, "train-amp-bs256-ddp"), cpu) is None  # gloo
    assert paths.skip_reason(_case(paths, "train-amp-bs256-graphs"), cpu) == "needs CUDA"
    assert paths.skip_reason(_case(paths, "train-amp-bs256-graphs"), one) is None


def _summary(**env: object) -> dict:
    data = {
        "train.total_ips": 900.0,
        "train.compute_ips": 1000.0,
        "telemetry.power_mean_w": 500.0,
        "duration_s": 10.0,
    }
    return {"data": data, "env": {"precision": "amp", **env}}


def test_gpu_paths_checks(paths: ModuleType, tmp_path: Path) -> None:
    gpu = _setup(paths, gpus=2)
    (tmp_path / "telemetry.csv").write_text("t\n")
    graphs = _case(paths, "train-amp-bs256-graphs")
    ok = paths.evaluate(graphs, _summary(cuda_graphs=True), tmp_path, gpu)
    assert ok.failed == [] and ok.total_ips == 900.0
    # capture failed and the step ran eagerly: the path was not exercised
    eager = paths.evaluate(graphs, _summary(cuda_graphs=False), tmp_path, gpu)
    assert eager.failed == ["cuda_graphs=False, wanted True"]
    ddp = paths.evaluate(_case(paths, "train-amp-bs256-ddp"), _summary(world_size=1), tmp_path, gpu)
    assert ddp.failed == ["world_size=1, wanted 2"]
    prof = _case(paths, "train-amp-bs256-torch-profiler")
    no_trace = paths.evaluate(prof, _summary(), tmp_path, gpu)
    assert no_trace.failed == ["no trace_rank0.json"]
    bare = _summary()
    del bare["data"]["telemetry.power_mean_w"]
    (tmp_path / "telemetry.csv").unlink()
    base = paths.evaluate(_case(paths, "train-amp-bs256"), bare, tmp_path, gpu)
    assert base.failed == ["no telemetry in the measured window", "no telemetry.csv"]
    bare["data"]["duration_s"] = 0.1  # shorter than a few sampling periods: not required
    assert paths.evaluate(_case(paths, "train-amp-bs256"), bare, tmp_path, gpu).failed == []


@pytest.mark.subprocess  # runs a program
def test_run_workload_reads_only_whole_json_lines_and_stops_at_the_timeout(
    paths: ModuleType,
) -> None:
    from benchmarks.common import run_workload

    out = '{"type": "meta"}\n{"type": "iter", "da\nplain text\n{1: 2}\n{"type": "summary"}\n'
    run = run_workload([sys.executable, "-c", f"print({out!r}, end='')"], timeout=60)
    assert run.lines == [{"type": "meta"}, {"type": "summary"}]
    assert run.summary == {"type": "summary"}
    slow = run_workload([sys.executable, "-c", "import time; time.sleep(60)"], timeout=1)
    assert slow.timed_out and slow.summary is None
    assert slow.failure(1) == "timed out after 1 s"


def test_gpu_paths_table_compares_with_eager(paths: ModuleType) -> None:
    rows = paths.table_rows(
        [
            (_case(paths, "train-amp-bs256"), paths.Outcome(1000.0, 1000.0)),
            (_case(paths, "train-amp-bs256-graphs"), paths.Outcome(1100.0, 1100.0)),
            (_case(paths, "train-amp-bs256-jpeg-cpu"), paths.Outcome(500.0, 1000.0)),
            (_case(paths, "infer-amp-bs1"), paths.Outcome(p50_ms=2.0, p99_ms=3.0)),
            (_case(paths, "infer-amp-bs1-graphs"), paths.Outcome(p50_ms=1.0, p99_ms=1.5)),
            (_case(paths, "train-amp-bs256-ddp"), paths.Outcome(note="skipped: 1 GPU")),
        ]
    )
    four = paths.Outcome(3600.0, 3600.0, env={"world_size": 4})
    ddp = paths.table_rows(
        [
            (_case(paths, "train-amp-bs256"), paths.Outcome(1000.0, 1000.0)),
            (_case(paths, "train-amp-bs256-ddp"), four),
        ]
    )
    assert ddp[1][5] == "0.900"  # per GPU: the scaling efficiency
    by = {r[0]: r for r in rows}
    assert by["train-amp-bs256"][5] == "-"
    assert by["train-amp-bs256-graphs"][5] == "1.100"
    assert by["train-amp-bs256-jpeg-cpu"][3:6] == ["0.50", "", "0.500"]
    assert by["infer-amp-bs1-graphs"][4:6] == ["1.00 / 1.50", "2.000"]
    assert by["train-amp-bs256-ddp"][6] == "skipped: 1 GPU"
    assert "vs eager" in paths.table(paths.HEADER, rows)


def test_gpu_paths_cpu_smoke(
    paths: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    workload_python: str,
) -> None:
    monkeypatch.setattr(paths, "gpu_count", lambda: 0)  # the CPU path even on a GPU machine
    assert paths.main(["--cases", "infer-amp-bs1"]) == 3  # CANNOT_RUN
    assert "cannot run here: no CUDA GPU" in capsys.readouterr().err
    status = paths.main(["--allow-cpu", "--cases", "infer-amp-bs1", "infer-amp-bs1-graphs"])
    out = capsys.readouterr().out
    assert status == 0, out
    rows = {line.split()[0]: line for line in out.splitlines()[3:]}
    assert rows["infer-amp-bs1"].rstrip().endswith("ok")
    assert "skipped: needs CUDA" in rows["infer-amp-bs1-graphs"]
    assert "resnet18, 32 px" in out.splitlines()[0]
    # a timeout stops torchrun and both of its ranks (sessions of their own), not only torchrun
    command = paths.command
    endless = ["--iterations", "1000000"]  # the last --iterations wins
    monkeypatch.setattr(paths, "command", lambda *a: [*command(*a), *endless])
    assert paths.main(["--allow-cpu", "--cases", "train-amp-bs256-ddp", "--timeout", "8"]) == 1
    assert "timed out after 8 s" in capsys.readouterr().out
    left = subprocess.run(["pgrep", "-f", "gpu-paths-"], capture_output=True, text=True).stdout
    assert left == "", left
