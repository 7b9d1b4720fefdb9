"""Unit tests of the workload's pure parts and handled errors (in-process, CPU, fast).

The parts that import torch (the data pipeline, the timers, a run) take the ``torch`` fixture:
they are workload-tier; the rest (metrics, command line, telemetry, output) is unit-tier."""

from __future__ import annotations

import ast
import io
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from workload import metrics
from workload.cli import build_parser, main, parse_args
from workload.errors import ConfigError, DataError
from workload.output import Reporter, clean
from workload.telemetry import (
    HlSmiSampler,
    Sample,
    make_sampler,
    parse_hl_smi_csv,
    summarize_telemetry,
)

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding:DeprecationWarning")

WORKLOAD_DIR = Path(__file__).resolve().parents[1] / "workload"


# ---- metrics ---------------------------------------------------------------------------------


@pytest.mark.parametrize("q", [0, 10, 25, 50, 90, 95, 99, 100])
@pytest.mark.parametrize("n", [1, 2, 5, 10, 101])
def test_percentile_matches_torch_nearest(torch: Any, q: float, n: int) -> None:
    values = torch.rand(n, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    expected = torch.quantile(values, q / 100, interpolation="nearest").item()
    assert metrics.percentile(values.tolist(), q) == pytest.approx(expected)


def test_percentile_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        metrics.percentile([], 50)
    with pytest.raises(ValueError):
        metrics.percentile([1.0], 101)


def test_images_per_second_uses_totals() -> None:
    # 4 iterations of batch 8: 32 images in 0.1+0.1+0.1+0.5 = 0.8 s -> 40 img/s
    assert metrics.images_per_second(8, [0.1, 0.1, 0.1, 0.5]) == pytest.approx(40.0)
    assert metrics.images_per_second(8, []) == 0.0


def test_summarize_keys_and_values() -> None:
    out = metrics.summarize("val", [0.01, 0.03], [0.1, 0.3], global_batch_size=16)
    assert out["val.total_ips"] == pytest.approx(32 / 0.44)
    assert out["val.compute_ips"] == pytest.approx(32 / 0.4)
    assert out["val.data_time"] == pytest.approx(0.02)
    assert out["val.compute_time"] == pytest.approx(0.2)
    for q in (50, 90, 95, 99):
        assert f"val.compute_latency_at{q}" in out
        assert f"val.total_latency_at{q}" in out
    assert out["val.compute_latency_at99"] == pytest.approx(0.3)


# ---- command line ----------------------------------------------------------------------------


def test_defaults() -> None:
    a = parse_args([])
    assert (a.arch, a.mode, a.batch_size, a.precision, a.image_size) == (
        "resnet50",
        "train",
        64,
        "fp32",
        224,
    )
    assert (a.warmup, a.iterations, a.data, a.compile) == (20, 100, "synthetic", "none")
    assert a.channels_last is True and a.cuda_graphs is False and a.pretrained is False
    assert (a.num_classes, a.workers, a.device, a.seed) == (1000, 4, "auto", 0)
    assert a.telemetry_interval == 0.5 and a.profiler == "none"
    assert a.output_dir is None and a.checkpoint_dir is None


def test_every_contract_flag_parses() -> None:
    a = parse_args(
        [
            "--arch",
            "vit_b_16",
            "--mode",
            "infer",
            "--batch-size",
            "8",
            "--precision",
            "bf16",
            "--image-size",
            "64",
            "--warmup",
            "0",
            "--iterations",
            "3",
            "--data",
            "/d",
            "--no-channels-last",
            "--compile",
            "max-autotune",
            "--cuda-graphs",
            "--pretrained",
            "--num-classes",
            "10",
            "--workers",
            "0",
            "--device",
            "hpu",
            "--seed",
            "7",
            "--output-dir",
            "/o",
            "--telemetry-interval",
            "0",
            "--profiler",
            "nsys",
            "--profile-start",
            "1",
            "--profile-iterations",
            "2",
            "--checkpoint-dir",
            "/c",
        ]
    )
    assert a.channels_last is False and a.cuda_graphs is True and a.pretrained is True
    assert (a.mode, a.compile, a.device, a.profiler) == ("infer", "max-autotune", "hpu", "nsys")
    assert (a.profile_start, a.profile_iterations) == (1, 2)
    # the last of a flag and its --no- form wins, both ways
    b = parse_args(["--no-channels-last", "--channels-last", "--cuda-graphs", "--no-cuda-graphs",
                    "--pretrained", "--no-pretrained"])  # fmt: skip
    assert (b.channels_last, b.cuda_graphs, b.pretrained) == (True, False, False)


@pytest.mark.parametrize(
    "argv",
    [
        ["--precision", "fp8"],
        ["--batch-size", "0"],
        ["--mode", "eval"],
        ["--bogus"],
        ["--profiler", "torch"],
        ["--telemetry-interval", "-1"],
    ],
)
def test_bad_command_lines_raise_config_error(argv: list[str]) -> None:
    with pytest.raises(ConfigError):
        parse_args(argv)


def test_help_mentions_every_flag() -> None:
    text = build_parser().format_help()
    for flag in ("--arch", "--checkpoint-dir", "--telemetry-interval", "--no-cuda-graphs"):
        assert flag in text


def _run_main(argv: list[str]) -> tuple[int, list[dict]]:
    out = io.StringIO()
    rc = main(argv, stdout=out)
    return rc, [json.loads(line) for line in out.getvalue().splitlines()]


def test_bad_option_prints_json_error(torch: Any) -> None:
    """(The CLI imports workload.device, hence torch, on its way out.)"""
    rc, lines = _run_main(["--precision", "fp8"])
    assert rc == 2
    (line,) = lines
    assert {k: line[k] for k in ("type", "kind", "rank")} == {
        "type": "error",
        "kind": "config",
        "rank": 0,
    }
    assert set(line) == {"type", "kind", "rank", "message"} and "fp8" in line["message"]


def test_unknown_arch_error(torch: Any) -> None:
    rc, lines = _run_main(["--arch", "resnet5o", "--device", "cpu"])
    assert rc == 2 and len(lines) == 1
    assert lines[0]["type"] == "error" and lines[0]["kind"] == "arch"
    assert "resnet5o" in lines[0]["message"] and "resnet50" in lines[0]["message"]


def test_missing_pretrained_weights_error(torch: Any, tmp_path: Path) -> None:
    rc, lines = _run_main(
        [
            "--arch",
            "resnet18",
            "--mode",
            "infer",
            "--device",
            "cpu",
            "--pretrained",
            "--checkpoint-dir",
            str(tmp_path),
        ]
    )
    assert rc != 0 and len(lines) == 1 and lines[0]["type"] == "error"
    message = lines[0]["message"]
    assert str(tmp_path) in message
    assert "resnet18-f37072fd.pth" in message
    assert "never downloaded" in message


def test_bad_dataset_path_error(torch: Any, tmp_path: Path) -> None:
    rc, lines = _run_main([*_tiny(), "--data", str(tmp_path / "nope")])
    assert rc == 2 and lines[-1]["type"] == "error" and lines[-1]["kind"] == "data"
    assert str(tmp_path / "nope") in lines[-1]["message"]


def _tiny() -> list[str]:
    return [
        "--arch",
        "resnet18",
        "--image-size",
        "32",
        "--batch-size",
        "2",
        "--device",
        "cpu",
        "--warmup",
        "0",
        "--iterations",
        "1",
        "--workers",
        "0",
    ]


def test_in_process_infer_run_is_complete(torch: Any, tmp_path: Path) -> None:
    rc, lines = _run_main([*_tiny(), "--mode", "infer", "--iterations", "2"])
    assert rc == 0, lines
    assert [x["type"] for x in lines] == ["meta", "summary"]
    assert len(lines[-1]["iteration_times"]) == 2
    assert lines[-1]["data"]["val.total_ips"] > 0


# ---- data ------------------------------------------------------------------------------------


def test_find_images_errors(torch: Any, tmp_path: Path) -> None:
    from workload.data import find_images

    with pytest.raises(DataError, match="no such directory"):
        find_images(tmp_path / "missing")
    with pytest.raises(DataError, match="no class subdirectories"):
        find_images(tmp_path)
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "x.png").write_bytes(b"")
    with pytest.raises(DataError, match="no .jpg"):
        find_images(tmp_path)


def test_make_dataset_layout(torch: Any, tmp_path: Path) -> None:
    from workload.data import find_images
    from workload.make_dataset import main as make_dataset_main
    from workload.make_dataset import make_dataset

    assert (
        make_dataset_main([str(tmp_path), "--classes", "3", "--per-class", "2", "--size", "24"])
        == 0
    )
    files, labels, classes = find_images(tmp_path)
    assert classes == ["class_000", "class_001", "class_002"]
    assert len(files) == 6 and labels == [0, 0, 1, 1, 2, 2]
    from torchvision.io import decode_jpeg, read_file

    image = decode_jpeg(read_file(files[0]))
    assert image.dtype == torch.uint8 and image.shape[0] == 3
    assert make_dataset(tmp_path / "b", classes=1, per_class=1, size=16)[0].suffix == ".jpg"


def test_forever_sampler(torch: Any) -> None:
    from workload.data import ForeverSampler

    it = iter(ForeverSampler(3, shuffle=False, seed=0))
    assert [next(it) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    it = iter(ForeverSampler(3, shuffle=True, seed=0))
    assert all(0 <= next(it) < 3 for _ in range(5000))


@pytest.mark.parametrize("shuffle", [False, True])
def test_forever_sampler_shards_are_disjoint_and_cover_the_files(torch: Any,
                                                                  shuffle: bool) -> None:
    from workload.data import ForeverSampler

    drawn = []
    for shard in range(3):
        sampler = ForeverSampler(10, shuffle=shuffle, seed=shard, shard=shard, shards=3)
        it = iter(sampler)
        drawn.append({next(it) for _ in range(2000)})
        assert len(sampler) == len(drawn[-1])  # every index of the shard comes up
    assert drawn == [{0, 3, 6, 9}, {1, 4, 7}, {2, 5, 8}]


def test_forever_sampler_smaller_than_world_is_not_sharded(torch: Any) -> None:
    from workload.data import ForeverSampler

    it = iter(ForeverSampler(2, shuffle=False, seed=0, shard=3, shards=4))
    assert [next(it) for _ in range(4)] == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="shard 4"):
        ForeverSampler(10, shuffle=False, seed=0, shard=4, shards=4)


# ---- telemetry, timing, output ----------------------------------------------------------------


def test_summarize_telemetry_window_and_energy() -> None:
    samples = [
        Sample(0.0, 0, 500.0, 90.0, 100.0, 0.0, 1.0),  # before the window: ignored
        Sample(1.0, 0, 200.0, 60.0, 1500.0, 99.0, 10.0),
        Sample(1.0, 1, 100.0, 65.0, 1400.0, 98.0, 10.0),
        Sample(2.0, 0, 220.0, 61.0, 1500.0, 99.0, 12.0, throttled=True),
        Sample(2.0, 1, 80.0, 62.0, 1400.0, 97.0, 12.0),
    ]
    out = summarize_telemetry(samples, start=1.0, end=3.0, images=100)
    assert out["telemetry.power_mean_w"] == pytest.approx(300.0)  # per instant, summed
    assert out["telemetry.energy_per_image_j"] == pytest.approx(300.0 * 2.0 / 100)
    assert out["telemetry.temp_max_c"] == 65.0
    assert out["telemetry.sm_clock_mean_mhz"] == pytest.approx(1450.0)
    assert out["telemetry.throttled"] is True
    assert summarize_telemetry([], 0, 1, 1) == {}


def test_parse_hl_smi_csv() -> None:
    text = "0, 350.5, 45, 97, 20480, 1600\n1, 300, 44, 95, 20000\nN/A, x\n"
    out = parse_hl_smi_csv(text, 5.0)
    assert [s.gpu for s in out] == [0, 1]
    assert out[0].power_w == 350.5 and out[0].sm_clock_mhz == 1600
    assert math.isnan(out[1].sm_clock_mhz)


def test_summarize_telemetry_without_throttle_reasons_or_clock() -> None:
    """hl-smi reports no throttle reason: no telemetry.throttled (unknown is not 'no'); a clock
    no sample read gives no clock figure."""
    samples = [Sample(1.0, 0, 300.0, 50.0, float("nan"), 90.0, 10.0)]
    out = summarize_telemetry(samples, 0.0, 2.0, 10, reports_throttle=False)
    assert "telemetry.throttled" not in out and "telemetry.sm_clock_mean_mhz" not in out
    assert out["telemetry.power_mean_w"] == 300.0


HL_SMI = """#!{python}
# Stand-in for hl-smi (no Gaudi here): answers -Q with CSV, and refuses clocks.current.soc as an
# hl-smi whose documented query fields lack it would.
import sys
fields = sys.argv[sys.argv.index("-Q") + 1].split(",")
if "clocks.current.soc" in fields:
    sys.stderr.write("Invalid query: clocks.current.soc\\n")
    sys.exit(1)
assert fields == ["index", "power.draw", "temperature.aip", "utilization.aip", "memory.used"]
print("0, 350.5, 45, 97, 20480")
print("1, 300, 44, 95, 20000")
"""


@pytest.mark.subprocess  # runs an hl-smi stand-in
def test_hl_smi_sampler_asks_the_documented_fields_when_the_clock_is_refused(
    tmp_path: Path,
) -> None:
    exe = tmp_path / "hl-smi"
    exe.write_text(HL_SMI.replace("{python}", sys.executable))
    exe.chmod(0o755)
    sampler = HlSmiSampler(0.5, str(exe))
    assert not sampler.reports_throttle
    first = sampler.read(1.0)
    assert [s.power_w for s in first] == [350.5, 300.0] and math.isnan(first[0].sm_clock_mhz)
    assert len(sampler.read(2.0)) == 2  # straight to the documented fields from now on


def test_no_sampler_without_gpu() -> None:
    assert make_sampler("cpu", 0.5, []) is None
    assert make_sampler("cuda", 0.0, [None]) is None


def test_host_timer_marks(torch: Any) -> None:
    from workload.timing import HostTimer

    timer = HostTimer()
    timer.start()
    for _ in range(3):
        timer.ready()
        timer.end()
    t = timer.finish()
    assert len(t.data) == len(t.compute) == len(t.start_wall) == 3
    assert all(x >= 0 for x in t.data + t.compute)
    assert t.start_wall == sorted(t.start_wall) and timer.completed(2)


class _FakeEvent:
    """Stand-in for torch.cuda.Event: this machine has no GPU, so the timer's bookkeeping
    (which events it creates and when, how it turns them into times) is checked against a
    fake clock.  The GPU itself is exercised by benchmarks/workload_vs_dle.py."""

    created = 0
    clock = 0.0
    instances: list[_FakeEvent] = []

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        type(self).created += 1
        type(self).instances.append(self)
        self.at: float | None = None

    def record(self) -> None:
        type(self).clock += 1.0  # ms
        self.at = type(self).clock

    def query(self) -> bool:
        return self.at is not None

    def elapsed_time(self, other: _FakeEvent) -> float:
        assert self.at is not None and other.at is not None
        return other.at - self.at


def test_cuda_event_timer_creates_its_events_before_the_window(
    torch: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from workload.timing import CudaEventTimer

    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    _FakeEvent.created, _FakeEvent.instances = 0, []
    timer = CudaEventTimer(iterations=3)
    assert _FakeEvent.created == 7
    # each recorded once already: torch creates the CUDA event at its first record
    assert all(e.at is not None for e in _FakeEvent.instances)
    timer.start()
    for _ in range(3):
        timer.ready()
        timer.end()
    assert _FakeEvent.created == 7  # the measured loop only re-records
    t = timer.finish()
    assert t.data == t.compute == [0.001] * 3  # one fake millisecond between marks
    assert t.start_wall == pytest.approx([t.start_wall[0] + 0.002 * i for i in range(3)])
    assert timer.completed(2) and not timer.completed(3)
    timer.start()  # a second window, longer than the pool: it grows
    for _ in range(4):
        timer.ready()
        timer.end()
    assert _FakeEvent.created == 9 and len(timer.finish().data) == 4


def test_reporter_json_lines() -> None:
    out = io.StringIO()
    Reporter(out).emit({"type": "iter", "data": {"x": float("nan"), "y": (1, 2)}})
    Reporter(out, enabled=False).emit({"type": "meta"})
    assert json.loads(out.getvalue()) == {"type": "iter", "data": {"x": None, "y": [1, 2]}}
    assert clean(float("inf")) is None


# ---- import hygiene --------------------------------------------------------------------------

OPTIONAL = {"pynvml", "habana_frameworks", "nvidia"}


def test_workload_imports_only_stdlib_torch_torchvision() -> None:
    allowed = set(sys.stdlib_module_names) | {"torch", "torchvision", "workload"}
    for path in WORKLOAD_DIR.glob("*.py"):
        tree = ast.parse(path.read_text())
        top_level = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                roots = [node.module.split(".")[0]]
            else:
                continue
            for root in roots:
                assert root != "orchestrator", f"{path.name} imports orchestrator"
                if root in OPTIONAL:
                    assert id(node) not in top_level, f"{path.name}: unguarded import {root}"
                else:
                    assert root in allowed, f"{path.name} imports {root}"


#: Names new in Python 3.11 that the workload must not use: the NGC images from the floor release
#: (23.06) to 24.xx ship Python 3.10.
PY311_ONLY = {"tomllib", "UTC", "Self", "StrEnum", "ExceptionGroup", "TaskGroup", "LiteralString",
              "Never", "reveal_type", "assert_never", "add_note", "exceptiongroup"}  # fmt: skip


def test_workload_is_python_3_10_code() -> None:
    """Syntax of Python 3.10 (ast feature_version) and none of 3.11's new names."""
    for path in WORKLOAD_DIR.glob("*.py"):
        tree = ast.parse(path.read_text(), feature_version=(3, 10))
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        names |= {a.name.split(".")[0] for n in ast.walk(tree)
                  if isinstance(n, ast.Import | ast.ImportFrom) for a in n.names}  # fmt: skip
        assert not names & PY311_ONLY, f"{path.name}: {names & PY311_ONLY}"


def test_summarize_telemetry_without_samples_in_the_window() -> None:
    from workload.telemetry import Sample, summarize_telemetry

    outside = [Sample(0.0, 0, 500.0, 90.0, 100.0, 0.0, 1.0)]
    assert summarize_telemetry(outside, start=10.0, end=11.0, images=64) == {}


def test_progress_lines_every_ten_measured_iterations(torch: Any) -> None:
    """The `iter` path: 10 measured iterations give one progress line, with the loss."""
    argv = ["--arch", "resnet18", "--image-size", "32", "--batch-size", "2", "--device", "cpu",
            "--warmup", "0", "--iterations", "10", "--workers", "0", "--num-classes", "10",
            "--telemetry-interval", "0"]
    rc, lines = _run_main(argv)
    assert rc == 0, lines
    assert [line["type"] for line in lines] == ["meta", "iter", "summary"]
    step = lines[1]
    assert step["step"] == 10
    assert math.isfinite(step["data"]["train.loss"])
    # the line covers measured iterations 1..10, here the whole window: the summary's figures
    summary = lines[2]["data"]
    for key in ("train.total_ips", "train.compute_ips"):
        assert step["data"][key] == pytest.approx(summary[key]) and summary[key] > 0
