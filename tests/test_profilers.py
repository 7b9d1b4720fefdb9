"""Profiler command lines (orchestrator/plan/profilers.py) and the checks that refuse a tool a GPU
or
an image cannot run.

Every command line is compared with a golden file under ``tests/golden/profiler-*.argv`` (one
argv item per line; ``UPDATE_GOLDEN=1`` rewrites them: review the diff). No NVIDIA tool runs
here: what the tools do with these options is their documentation's word (docs/profiling.md),
checked on a GPU machine only when one is lent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from golden_support import check_golden
from gpu_support import facts
from pydantic import ValidationError

from orchestrator.backends.checks import refuse_unrunnable
from orchestrator.catalog import gpus
from orchestrator.config.matrix_file import (
    DEFAULT_NCU_METRICS,
    CellParams,
    HardwareProfile,
    NcuOptions,
    NsysOptions,
    NvprofOptions,
)
from orchestrator.errors import ConfigError
from orchestrator.plan import profilers
from orchestrator.plan.launch import workload_argv
from orchestrator.plan.matrix import Cell, load_matrix

#: A foreign command: DeepLearningExamples' ResNet-50 training, as its README starts it.
DLE = ["python", "./main.py", "--arch", "resnet50", "-b", "256", "--amp", "--epochs", "1",
       "--prof", "100", "/imagenet"]
WORKLOAD = ["python", "-m", "workload", "--iterations", "100"]

CASES: dict[str, tuple[str, Any, list[str], dict[str, Any]]] = {
    # name: (tool, options, argv, wrap keyword arguments)
    "nsys-defaults": ("nsys", NsysOptions(), WORKLOAD, {}),
    "nsys-nvtx": ("nsys", NsysOptions(capture="nvtx", trace=["cuda", "nvtx", "cudnn", "cublas"]),
                  WORKLOAD, {}),
    "nsys-old-no-range-end": ("nsys", NsysOptions(capture_range_end="none"), WORKLOAD, {}),
    "nsys-whole-dle": ("nsys", NsysOptions(capture="whole", delay_s=60, duration_s=30,
                                           stats=False), DLE, {"python": "python3"}),
    "nsys-bare": ("nsys", NsysOptions(), WORKLOAD, {"helper": False}),
    "ncu-defaults": ("ncu", NcuOptions(), WORKLOAD, {}),
    "ncu-nvtx-sections": ("ncu", NcuOptions(
        capture="nvtx", sections=["SpeedOfLight", "ComputeWorkloadAnalysis"], set="basic",
        metrics=["gpu__time_duration.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed"],
        kernel_name="regex:gemm", launch_count=50, extra_args=["--cache-control", "all"]),
        WORKLOAD, {}),
    "ncu-whole-dle": ("ncu", NcuOptions(capture="whole", launch_skip=2000, launch_count=300),
                      DLE, {"python": "python3"}),
    "nvprof-defaults": ("nvprof", NvprofOptions(), WORKLOAD, {}),
    "nvprof-whole-dle": ("nvprof", NvprofOptions(capture="whole", metrics=[
        "tensor_precision_fu_utilization", "flop_count_hp"]), DLE, {"python": "python3"}),
}

#: The GPU machine these docker cells run on (a stand-in: this machine has none).
MACHINE = facts("H100")


def _check_golden(name: str, argv: list[str]) -> None:
    check_golden(f"profiler-{name}.argv", "\n".join(argv) + "\n")


@pytest.mark.parametrize("name", sorted(CASES))
def test_command_line_matches_golden(name: str) -> None:
    tool, options, argv, kwargs = CASES[name]
    _check_golden(name, profilers.wrap(tool, options, "/results/c1", argv, **kwargs))


def cell(**params: Any) -> Cell:
    values = CellParams.model_validate({"hardware": "h100", **params})
    return Cell(id="c", group="c", repeat=1, params=values, hash="h")


@pytest.mark.parametrize("tool", ["nsys", "ncu", "nvprof"])
def test_workload_cells_under_torchrun_match_golden(tool: str) -> None:
    """The whole command of a 2-GPU cell: helper, tool, torchrun, workload with its window."""
    this = cell(gpus=2, profiler=tool, iterations=50, profile_start=10, profile_iterations=3)
    argv = workload_argv(this, HardwareProfile(device="cuda"), python="python3",
                         output_dir="/results/c1")
    _check_golden(f"{tool}-workload-torchrun", argv)
    at = argv.index("--profile-start")
    assert argv[at:at + 4] == ["--profile-start", "10", "--profile-iterations", "3"]


def test_the_wrapper_knows_nothing_of_the_workload() -> None:
    """A foreign command ends the argv unchanged; the tool part is the same as for ours."""
    for tool, options in (("nsys", NsysOptions()), ("ncu", NcuOptions()),
                          ("nvprof", NvprofOptions())):
        ours = profilers.wrap(tool, options, "/o", WORKLOAD)
        theirs = profilers.wrap(tool, options, "/o", DLE)
        assert theirs[-len(DLE):] == DLE
        assert ours[:-len(WORKLOAD)] == theirs[:-len(DLE)]


def test_no_output_folder_means_the_working_directory() -> None:
    argv = profilers.wrap("ncu", NcuOptions(), None, ["prog"])
    assert argv[argv.index("--out") + 1] == "." and "./profile" in argv


def test_default_ncu_metrics_ask_for_each_pipe_and_the_kernel_time() -> None:
    joined = " ".join(DEFAULT_NCU_METRICS)
    for pipe in ("fma", "fp16", "xu", "tensor", "tensor_op_hmma", "fma_type_fp16",
                 "tensor_type_hmma_hgmma_qgmma_imma_igmma_bmma_bgmma"):
        assert pipe in joined
    assert "gpu__time_duration.sum" in DEFAULT_NCU_METRICS
    assert all("," not in m for m in DEFAULT_NCU_METRICS)  # ncu takes one comma-joined list


@pytest.mark.parametrize(("model", "values", "match"), [
    (NvprofOptions, {"capture": "nvtx"}, "no NVTX capture"),
    (NcuOptions, {"metrics": ["a,b"]}, "metrics"),
    (NcuOptions, {"metrics": ["sm__x y"]}, "metrics"),
    (NcuOptions, {"replay_mode": "everything"}, "replay_mode"),
    (NcuOptions, {"nvtx_range": "dom@range"}, "nvtx_range"),
    (NsysOptions, {"trace": []}, "trace"),
    (NsysOptions, {"trace": ["cuda;rm"]}, "trace"),
    (NsysOptions, {"extra_args": ["--x\nnewline"]}, "extra_args"),
    (NsysOptions, {"capture_range_end": "stop-kill"}, "capture_range_end"),
    (NsysOptions, {"delay_s": 10}, "capture = 'whole'"),
])
def test_bad_tool_options_are_refused(model: Any, values: dict[str, Any], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        model.model_validate(values)


# --- which tool fits which GPU ---------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [
    ("V100", "7.0"), ("NVIDIA A100-SXM4-80GB", "8.0"), ("a10g", "8.6"),
    ("H100 80GB HBM3", "9.0"), ("h200", "9.0"), ("Tesla V100-SXM2-16GB", "7.0"),
    ("mystery", None),
])
def test_compute_capability_of_a_profile_gpu_name(value: str, expected: str | None) -> None:
    """The capability the profiler check (checks._capability) reads from a profile's gpu."""
    assert gpus.compute_capability(value) == expected


def test_nvprof_is_refused_on_ampere_and_later_and_on_cuda_12() -> None:
    for cc in ((8, 0), (8, 6), (9, 0)):
        message = profilers.tool_problem("nvprof", cc)
        assert "nvprof does not support" in message and "'ncu'" in message
        assert "'nsys'" in message
    assert profilers.tool_problem("nvprof", (7, 0)) == ""
    assert profilers.tool_problem("nvprof", (7, 0), cuda="11.8.0") == ""
    assert "CUDA 12" in profilers.tool_problem("nvprof", None, cuda="12.4.1")
    assert profilers.tool_problem("ncu", (9, 0), cuda="12.4.1") == ""
    assert profilers.tool_problem("nsys", (7, 0)) == ""


def _errors(path: Path) -> list[str]:
    """What `validate` refuses in a matrix (orchestrator.backends.checks: one place for
    can-it-run)."""
    with pytest.raises(ConfigError) as err:
        refuse_unrunnable(load_matrix(path), machine=MACHINE)
    return [str(p) for p in err.value.problems]


def _matrix(write_matrix: Any, workload: str, profile: str = 'device = "cuda"') -> Any:
    return write_matrix(f"""
        [matrix]
        backend = "docker"
        [workload]
        hardware = "gpu"
        {workload}
        [hardware.gpu]
        image = "ngc-pytorch"
        {profile}
    """, cpu_profile=False)


def test_a_profile_that_names_its_gpu_is_checked(write_matrix: Any) -> None:
    a100 = _matrix(write_matrix, 'profiler = "nvprof"',
                   'device = "cuda"\ngpu = "A100"\nimage_vars = { base_image = "lab/pt:21.05" }')
    (problem,) = _errors(a100)
    assert "workload.profiler" in problem and "compute capability 8.0" in problem
    for gpu in ("V100", None):  # a Volta, or an unknown GPU: nothing is assumed
        line = f'\ngpu = "{gpu}"' if gpu else ""
        path = _matrix(write_matrix, 'profiler = "nvprof"', 'device = "cuda"' + line
                       + '\nimage_vars = { base_image = "lab/pt:21.05" }', )
        assert refuse_unrunnable(load_matrix(path), machine=MACHINE)


def test_matrix_refuses_a_window_outside_the_measured_iterations(write_matrix: Any) -> None:
    path = _matrix(write_matrix, 'profiler = "ncu"\niterations = 20\nprofile_start = 18')
    (problem,) = _errors(path)
    assert "workload.profile_start" in problem
    assert "measured iterations 18..22" in problem and "20 measured iterations" in problem
    # no profiler: the window is not looked at
    no_profiler = _matrix(write_matrix, "iterations = 20\nprofile_start = 18")
    assert refuse_unrunnable(load_matrix(no_profiler), machine=MACHINE)


def test_matrix_refuses_nvprof_on_a_cuda_12_image_and_wrapping_tools_off_cuda(
        write_matrix: Any) -> None:
    path = _matrix(write_matrix, 'profiler = "nvprof"',
                   'device = "cuda"\nimage_vars = { base_tag = "24.05-py3" }')
    (problem,) = _errors(path)
    assert "nvprof is not part of CUDA 12" in problem and "'ncu'" in problem
    # a base image of its own: its CUDA is not known, nothing is assumed
    own = _matrix(write_matrix, 'profiler = "nvprof"',
                  'device = "cuda"\nimage_vars = { base_image = "lab/pytorch:21.05-py3" }')
    assert refuse_unrunnable(load_matrix(own), machine=MACHINE)
    cpu = _matrix(write_matrix, 'profiler = "nsys"', 'device = "cpu"')
    (problem,) = _errors(cpu)
    assert "profiles CUDA GPUs" in problem and '"torch"' in problem


def _problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as err:
        load_matrix(path)
    return [str(p) for p in err.value.problems]


@pytest.mark.parametrize(("line", "field"), [
    ("profile_start = -1", "workload.profile_start"),
    ("profile_iterations = 0", "workload.profile_iterations"),
    ("profile_iterations = 10000000", "workload.profile_iterations"),
    ("telemetry_interval = 0.001", "workload.telemetry_interval"),
    ("telemetry_interval = 61", "workload.telemetry_interval"),
    ("telemetry_interval = nan", "workload.telemetry_interval"),
    ('telemetry_interval = "1"', "workload.telemetry_interval"),
])
def test_profile_and_telemetry_ranges(write_matrix: Any, line: str, field: str) -> None:
    problems = _problems(_matrix(write_matrix, line))
    assert any(f": {field}: " in p for p in problems), problems


def test_telemetry_off_and_rerun_setting_are_accepted(write_matrix: Any) -> None:
    path = write_matrix("""
        [matrix]
        rerun_throttled = 2
        [workload]
        hardware = "cpu"
        telemetry_interval = 0
        [axes]
        telemetry_interval = [0, 0.05, 1]
    """)
    matrix = load_matrix(path)
    assert matrix.settings.rerun_throttled == 2
    assert [c.params.telemetry_interval for c in matrix.cells] == [0.0, 0.05, 1.0]
