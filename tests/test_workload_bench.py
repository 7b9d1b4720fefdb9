"""The pure parts of benchmarks/workload_vs_dle.py (the runs themselves need a GPU and DLE)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "workload_vs_dle.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("workload_vs_dle", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up
    spec.loader.exec_module(module)
    return module


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
    assert "ours/DLE" in bench.render(rows)


def test_without_gpu_exits_with_message(
    bench: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pretend there is no GPU even on a GPU machine: this test must not run the benchmark.
    monkeypatch.setattr(bench, "_gpu_available", lambda: False)
    assert bench.main([]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err
