"""The workload's profile window (workload/profiling.py) and the profiler helper
(workload/profile_run.py), on the CPU.

* The torch profiler runs for real: its Chrome trace must hold exactly the named iterations.
* cudaProfilerStart/Stop, NVTX and the device synchronize need CUDA, which these machines do
  not have: a stand-in for ``workload.compat.CudaMarkers`` records each call with the iteration
  it happened in, so the test sees exactly where the window opens and closes.
* nsys, ncu and nvprof are not installed here: the helper's tests put stand-in executables
  (small Python scripts) named like them on ``PATH``. They mimic only what the helper relies on
  (a report file, the stats/import exports and their exit statuses, the old-version refusals).

Runs under the floor interpreter too (``ORCHESTRATE_FLOOR_PYTHON``: the test file name matches
``test_workload*.py``).
"""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from workload.cli import main as workload_main
from workload.cli import parse_args
from workload.errors import ConfigError
from workload.profile_run import (
    CheckFailed,
    check,
    parse_capabilities,
)
from workload.profiling import Profiler, tool_problem, window_problem

ROOT = Path(__file__).resolve().parents[1]


class RecordingMarkers:
    """Stand-in for the CUDA markers (no GPU here): records (call, iteration) pairs."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.iteration = -1

    def start(self) -> None:
        self.calls.append(("start", self.iteration))

    def stop(self) -> None:
        self.calls.append(("stop", self.iteration))

    def push(self, name: str) -> None:
        self.calls.append((f"push {name}", self.iteration))

    def pop(self) -> None:
        self.calls.append(("pop", self.iteration))

    def synchronize(self) -> None:
        self.calls.append(("synchronize", self.iteration))


def _loop(prof: Profiler, iterations: int, markers: RecordingMarkers | None = None,
          stop_at: int | None = None) -> None:
    import torch

    prof.begin()
    for i in range(iterations if stop_at is None else stop_at):
        if markers is not None:
            markers.iteration = i
        prof.iteration_start(i)
        with torch.profiler.record_function(f"step {i}"):
            torch.ones(16, 16) @ torch.ones(16, 16)
        prof.iteration_end(i)
    prof.finish()


@pytest.mark.parametrize("tool", ["nsys", "ncu", "nvprof"])
def test_markers_bracket_exactly_the_window(torch: Any, tool: str) -> None:
    markers = RecordingMarkers()
    prof = Profiler(tool, "cuda", None, 0, iterations=10, start=3, count=4, markers=markers,
                    capability=(7, 0))
    _loop(prof, 10, markers)
    expected = [("start", 3), ("push profile", 3)]
    for i in range(3, 7):
        expected += [(f"push iteration {i}", i), ("pop", i)]
    expected += [("pop", 6), ("synchronize", 6), ("stop", 6)]
    assert markers.calls == expected


def test_a_window_cut_short_is_closed_at_finish(torch: Any) -> None:
    markers = RecordingMarkers()
    prof = Profiler("nsys", "cuda", None, 0, 10, start=2, count=5, markers=markers,
                    capability=(9, 0))
    _loop(prof, 10, markers, stop_at=4)
    assert [c for c, _ in markers.calls][-3:] == ["pop", "synchronize", "stop"]
    assert [c for c, _ in markers.calls].count("start") == 1


def test_no_markers_off_cuda_or_without_a_tool(torch: Any) -> None:
    markers = RecordingMarkers()
    _loop(Profiler("nsys", "cpu", None, 0, 5, markers=markers), 5, markers)
    _loop(Profiler("none", "cuda", None, 0, 5, markers=markers), 5, markers)
    assert markers.calls == []


def test_nvprof_is_refused_on_ampere_and_later() -> None:
    assert "--profiler ncu" in tool_problem("nvprof", (8, 0))
    assert tool_problem("nvprof", (7, 5)) == "" and tool_problem("ncu", (9, 0)) == ""
    with pytest.raises(ConfigError, match="nvprof does not support this GPU"):
        Profiler("nvprof", "cuda", None, 0, 10, markers=RecordingMarkers(), capability=(9, 0))


@pytest.mark.parametrize(("iterations", "start", "count", "ok"), [
    (10, 0, 10, True), (10, 9, 1, True), (10, 5, 6, False), (10, 10, 1, False), (1, 0, 1, True),
])
def test_window_must_fit(iterations: int, start: int, count: int, ok: bool) -> None:
    assert (window_problem(iterations, start, count) == "") is ok
    if not ok:
        with pytest.raises(ConfigError, match="ends after"):
            Profiler("ncu", "cuda", None, 0, iterations, start, count, RecordingMarkers(), (9, 0))


def _names(trace: Path, prefix: str) -> list[str]:
    events = json.loads(trace.read_text())["traceEvents"]
    return [e["name"] for e in events if str(e.get("name", "")).startswith(prefix)]


def _iterations(trace: Path) -> set[int]:
    """The measured iterations the trace holds, by the workload's own labels."""
    return {int(name.split()[1]) for name in _names(trace, "iteration ")}


@pytest.mark.parametrize(("start", "count"), [(2, 3), (0, 2), (5, 1)])
def test_torch_trace_covers_exactly_the_window(torch: Any, tmp_path: Path, start: int,
                                               count: int) -> None:
    """A real torch.profiler trace on the CPU holds exactly the named iterations: the
    workload's ``iteration I`` labels, the loop's own ``step I`` record_functions, and as many
    ``ProfilerStep#N`` events as the window is long (torch 2.1 numbers them oddly: one lower,
    or twice #0 from the first step; hence the workload's labels). The file is written at finish,
    not inside the loop."""
    prof = Profiler("torch", "cpu", tmp_path, 0, 8, start=start, count=count)
    prof.begin()
    for i in range(8):
        prof.iteration_start(i)
        with torch.profiler.record_function(f"step {i}"):
            torch.ones(16, 16) @ torch.ones(16, 16)
        prof.iteration_end(i)
    trace = tmp_path / "trace_rank0.json"
    assert not trace.exists()
    prof.finish()
    window = set(range(start, start + count))
    assert _iterations(trace) == window
    assert set(_names(trace, "step ")) == {f"step {i}" for i in window}
    assert len(_names(trace, "ProfilerStep#")) == count


def test_torch_window_never_reached_writes_no_trace(torch: Any, tmp_path: Path) -> None:
    prof = Profiler("torch", "cpu", tmp_path, 0, 8, start=6, count=2)
    _loop(prof, 8, stop_at=3)
    assert not (tmp_path / "trace_rank0.json").exists()


def test_compat_choices_exist_on_this_torch(torch: Any) -> None:
    """The CUDA markers' callables exist (they are called only on a GPU) and the schedule is
    one cycle with exactly ``active`` recording steps."""
    from workload import compat

    choice = compat.cuda_markers()
    assert choice.available and "torch.cuda.profiler" in choice.label
    markers = choice()
    for name in ("start", "stop", "push", "pop", "synchronize"):
        assert callable(getattr(markers, name))
    sched = compat.profiler_schedule()(wait=2, warmup=0, active=3)
    actions = [sched(step).name for step in range(8)]
    assert actions[:2] == ["NONE", "NONE"] and actions[5:] == ["NONE", "NONE", "NONE"]
    assert actions[2:4] == ["RECORD", "RECORD"] and actions[4] == "RECORD_AND_SAVE"
    api = compat.describe(device="cuda", mode="train", precision="fp32", compile_mode="none",
                          cuda_graphs_used=False, decode=None, distributed=False,
                          pretrained=False, profiler="ncu")
    assert api["profiler"] == choice.label


def test_command_line_window_and_telemetry_flags() -> None:
    args = parse_args(["--profiler", "ncu", "--iterations", "20", "--profile-start", "15",
                       "--profile-iterations", "5", "--telemetry-interval", "2"])
    assert (args.profile_start, args.profile_iterations, args.telemetry_interval) == (15, 5, 2.0)
    with pytest.raises(ConfigError, match="ends after the 20 measured iterations"):
        parse_args(["--profiler", "ncu", "--iterations", "20", "--profile-start", "16"])
    # no profiler: the window is not checked (its defaults need 5 iterations)
    assert parse_args(["--iterations", "2"]).profile_iterations == 5


def test_workload_run_with_the_torch_profiler(torch: Any, tmp_path: Path) -> None:
    """The whole program on the CPU: the trace covers iterations 1..2 of 4, the summary says
    which."""
    out = io.StringIO()
    code = workload_main(["--arch", "resnet18", "--device", "cpu", "--batch-size", "2",
                          "--image-size", "32", "--warmup", "1", "--iterations", "4",
                          "--num-classes", "10", "--workers", "0", "--profiler", "torch",
                          "--profile-start", "1", "--profile-iterations", "2",
                          "--output-dir", str(tmp_path)], stdout=out)
    assert code == 0, out.getvalue()
    summary = json.loads(out.getvalue().splitlines()[-1])
    assert summary["env"]["profile_window"] == [1, 2]
    assert _iterations(tmp_path / "trace_rank0.json") == {1, 2}


# --- the helper (workload/profile_run.py) ----------------------------------------------------

FAKE_TOOL = r'''#!{python}
"""Stand-in for {name} (no NVIDIA tools here): mimics what workload.profile_run relies on."""
import json, os, subprocess, sys
log = os.environ["FAKE_TOOL_LOG"]
with open(log, "a") as fh:
    fh.write(json.dumps(sys.argv) + "\n")
args = sys.argv[1:]
name = os.path.basename(sys.argv[0])
if name == "nsys" and args[0] == "stats":
    report = args[args.index("--report") + 1]
    if report.startswith("cuda_gpu_"):  # an nsys from before 2023 knows only the old names
        sys.stderr.write("ERROR: Report '%s' could not be found.\n" % report)
        sys.exit(1)
    print("Processing [profile.sqlite] with [%s.py]..." % report)
    print('"Time(%)","Total Time (ns)","Instances","Average","Minimum","Maximum","Name"')
    print('100.0,1000,2,500.0,400,600,"k"')
    sys.exit(0)
if name == "ncu" and "--import" in args:
    if "--print-units" in args:  # an old ncu without --print-units
        sys.stderr.write("==ERROR== unrecognised option '--print-units'\n")
        sys.exit(1)
    print('"ID","Process ID","Process Name","Host Name","Kernel Name","gpu__time_duration.sum"')
    sys.exit(0)
# profile: write the report (the fake takes its options, then -- and the program)
sep = args.index("--")
opts, prog = args[:sep], args[sep + 1:]
report = None
for a in opts:
    if a.startswith("--output="):
        report = a.split("=", 1)[1] + ".nsys-rep"
if "--export" in opts:
    report = opts[opts.index("--export") + 1] + ".ncu-rep"
if report:
    open(report, "w").write("report")
sys.exit(subprocess.call(prog))
'''


@pytest.fixture
def fake_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("nsys", "ncu"):
        path = bin_dir / name
        path.write_text(FAKE_TOOL.replace("{python}", sys.executable).replace("{name}", name))
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_TOOL_LOG", str(tmp_path / "calls.jsonl"))
    return tmp_path


def _helper(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "workload.profile_run", *argv],
                          capture_output=True, text=True, env=env, timeout=120)


def _program(code: int) -> list[str]:
    return [sys.executable, "-c", f"import sys; print('program ran'); sys.exit({code})"]


@pytest.mark.subprocess  # the helper runs the tool stand-ins above
def test_helper_runs_nsys_then_its_stats_with_the_old_report_names(fake_tools: Path) -> None:
    out = fake_tools / "cell"
    out.mkdir()
    done = _helper("--tool", "nsys", "--out", str(out), "--", "nsys", "profile",
                   f"--output={out}/profile", "--", *_program(3))
    assert done.returncode == 3, done.stderr  # the program's exit status
    assert "program ran" in done.stdout
    kern = (out / "nsys_kern_sum.csv").read_text()
    assert '"Total Time (ns)"' in kern
    record = json.loads((out / "profile_run.json").read_text())
    assert record["exit"] == 3
    steps = {s["file"]: s for s in record["exports"]}
    assert steps["nsys_kern_sum.csv"]["report"] == "gpukernsum"
    assert [t["report"] for t in steps["nsys_gpu_trace.csv"]["tried"]] == [
        "cuda_gpu_trace", "gputrace"]
    calls = [json.loads(line) for line in (fake_tools / "calls.jsonl").read_text().splitlines()]
    assert [c[1] for c in calls] == ["profile", "stats", "stats", "stats", "stats"]


@pytest.mark.subprocess  # the helper runs the tool stand-ins above
def test_helper_runs_ncu_then_its_csv_import(fake_tools: Path) -> None:
    out = fake_tools / "cell"
    out.mkdir()
    done = _helper("--tool", "ncu", "--out", str(out), "--", "ncu", "--export",
                   f"{out}/profile", "--", *_program(0))
    assert done.returncode == 0, done.stderr
    assert (out / "ncu.csv").read_text().startswith('"ID","Process ID"')
    record = json.loads((out / "profile_run.json").read_text())
    tried = record["exports"][0]["tried"]
    assert [t["exit"] for t in tried] == [1, 0]  # --print-units refused, then without it


@pytest.mark.subprocess  # the helper runs the tool stand-ins above
def test_helper_no_stats_and_no_report(fake_tools: Path) -> None:
    out = fake_tools / "cell"
    out.mkdir()
    done = _helper("--tool", "nsys", "--out", str(out), "--no-stats", "--", "nsys", "profile",
                   f"--output={out}/profile", "--", *_program(0))
    assert done.returncode == 0 and not (out / "nsys_kern_sum.csv").exists()
    done = _helper("--tool", "ncu", "--out", str(out), "--", "ncu", "--", *_program(0))
    record = json.loads((out / "profile_run.json").read_text())
    assert "no report" in record["exports"][0]["skipped"]


@pytest.mark.subprocess  # the helper runs the tool stand-ins above
def test_helper_refuses_a_missing_tool_with_a_json_error(tmp_path: Path) -> None:
    done = _helper("--tool", "nvprof", "--out", str(tmp_path), "--", "nvprof-not-here",
                   *_program(0))
    assert done.returncode == 2
    error = json.loads(done.stdout.strip().splitlines()[-1])
    assert error["type"] == "error" and error["kind"] == "config"
    assert "CUDA 12 toolkits dropped nvprof" in error["message"]
    assert "'ncu'" in error["message"]


def test_helper_checks_nvprof_against_the_gpus() -> None:
    def which(name: str) -> str:
        return f"/usr/bin/{name}"

    with pytest.raises(CheckFailed, match="compute capability 8.0"):
        check("nvprof", ["nvprof", "x"], which=which, capabilities=[(7, 0), (8, 0)])
    check("nvprof", ["nvprof", "x"], which=which, capabilities=[(7, 0)])
    check("ncu", ["ncu", "x"], which=which, capabilities=[(9, 0)])
    with pytest.raises(CheckFailed, match="no command"):
        check("ncu", [], which=which)
    assert parse_capabilities("7.0\n9.0\n[N/A]\n") == [(7, 0), (9, 0)]
