"""Profiler command lines: a command wrapped in nsys, ncu or nvprof, and which tool fits a GPU.

Pure: no I/O, no clocks. :func:`wrap` is a function of (tool, options, output folder, argv) and
knows nothing of our workload, so it wraps any in-image command the same way.

The wrapped command is ``python -m workload.profile_run --tool T --out DIR -- <tool argv>
<argv>``: that small argv-only helper (stdlib only, in every image that has ``workload/``) runs
the tool, keeps its exit status, then the tool's own CSV export in the same place (``nsys stats``
-> ``nsys_kern_sum.csv``/``nsys_gpu_trace.csv``, ``ncu --import --csv --page raw`` ->
``ncu.csv``), so the figures come from files the tool itself wrote, inside the image that has
the tool. ``helper=False`` gives the bare tool command (a host without our package).

Capture: which part of a run is recorded (``capture`` of ``[hardware.X.nsys|ncu|nvprof]``):

========= ================================================== ===================================
capture   nsys / ncu / nvprof                                 honoured by
========= ================================================== ===================================
range     ``--capture-range=cudaProfilerApi                   programs that call cudaProfilerStart
          --capture-range-end=stop`` / ``--profile-from-start and Stop: our workload, around
          off`` / ``--profile-from-start off``                exactly iterations profile_start ..
                                                              profile_start+profile_iterations-1
nvtx      ``--capture-range=nvtx --nvtx-capture=NAME``        programs that push an NVTX range:
          (+ ``NSYS_NVTX_PROFILER_REGISTER_ONLY=0``, since    our workload's ``profile`` range
          torch.cuda.nvtx pushes unregistered strings) /      (same window); nvprof has none
          ``--nvtx --nvtx-include NAME/``
whole     start to exit; bound it with nsys ``delay_s`` /     everything else, e.g.
          ``duration_s`` or ncu ``launch_skip`` /             DeepLearningExamples' main.py: it
          ``launch_count``                                    calls no cudaProfilerStart and
                                                              pushes no NVTX range
========= ================================================== ===================================

A program that never calls cudaProfilerStart under ``range`` is simply not profiled (nsys and
ncu wait for a start that never comes): the cell still runs, its figures are missing.

Tools and GPUs (:func:`tool_problem`): nvprof does not profile compute capability 8.0 and later
(Ampere, Hopper: use ncu for metrics, nsys for a timeline) and is not shipped with CUDA 12
toolkits (every NGC PyTorch release the project offers is CUDA 12). ncu's pipe metrics differ by
architecture (see :data:`PIPE_METRICS` in :mod:`orchestrator.results.figures.profiler_figures`); the
default metric list asks by regular expression, so one list serves Volta to Hopper.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.config.matrix_file import (
    HardwareProfile,
    NcuOptions,
    NsysOptions,
    NvprofOptions,
)

ToolOptions = NsysOptions | NcuOptions | NvprofOptions

#: Base name of every report a tool writes in the output folder (``profile.nsys-rep``, ...).
REPORT = "profile"
#: nvprof's CSV log, one per profiled process (``%p``: the process id).
NVPROF_LOG = "nvprof.%p.csv"
#: The helper that runs a tool and its CSV export (workload/profile_run.py).
HELPER_MODULE = "workload.profile_run"

def options_of(profile: HardwareProfile, tool: str) -> ToolOptions:
    """The profile's options for ``tool`` (nsys, ncu or nvprof)."""
    options: ToolOptions = getattr(profile, tool)
    return options


def wrap(
    tool: str,
    options: ToolOptions,
    out_dir: str | None,
    argv: Sequence[str],
    *,
    python: str = "python",
    helper: bool = True,
) -> list[str]:
    """``argv`` run under ``tool`` with ``options``, its reports in ``out_dir`` (default: the
    working directory). With ``helper``, the tool runs under ``python -m workload.profile_run``,
    which exports the tool's CSV after the run (module docstring)."""
    out = out_dir.rstrip("/") if out_dir else "."
    inner = tool_argv(tool, options, out)
    if not helper:
        return [*inner, *argv]
    post = ["--no-stats"] if isinstance(options, NsysOptions) and not options.stats else []
    return [python, "-m", HELPER_MODULE, "--tool", tool, "--out", out, *post, "--",
            *inner, *argv]


def tool_argv(tool: str, options: ToolOptions, out: str) -> list[str]:
    """The tool's own command, up to where the profiled program's argv goes."""
    if tool == "nsys" and isinstance(options, NsysOptions):
        return nsys_argv(options, f"{out}/{REPORT}")
    if tool == "ncu" and isinstance(options, NcuOptions):
        return ncu_argv(options, f"{out}/{REPORT}")
    if tool == "nvprof" and isinstance(options, NvprofOptions):
        return nvprof_argv(options, f"{out}/{NVPROF_LOG}")
    raise ValueError(f"no command line for profiler {tool!r} with {type(options).__name__}")


def nsys_argv(options: NsysOptions, report: str) -> list[str]:
    """``nsys profile ...`` writing ``report``.nsys-rep."""
    argv = ["nsys", "profile", "--force-overwrite=true", f"--trace={','.join(options.trace)}",
            f"--output={report}"]
    end = ([f"--capture-range-end={options.capture_range_end}"]
           if options.capture_range_end != "none" else [])
    if options.capture == "range":
        argv += ["--capture-range=cudaProfilerApi", *end]
    elif options.capture == "nvtx":
        argv += ["--capture-range=nvtx", f"--nvtx-capture={options.nvtx_range}",
                 "--env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0", *end]
    else:
        if options.delay_s is not None:
            argv.append(f"--delay={options.delay_s:g}")
        if options.duration_s is not None:
            argv.append(f"--duration={options.duration_s:g}")
    return [*argv, *options.extra_args]


def ncu_argv(options: NcuOptions, report: str) -> list[str]:
    """``ncu ...`` exporting ``report``.ncu-rep (every process: torchrun's workers too)."""
    argv = ["ncu", "--target-processes", "all", "--force-overwrite", "--export", report,
            "--nvtx"]
    if options.capture == "range":
        argv += ["--profile-from-start", "off"]
    elif options.capture == "nvtx":
        argv += ["--nvtx-include", f"{options.nvtx_range}/"]  # '/': a push/pop range
    argv += ["--replay-mode", options.replay_mode]
    if options.set is not None:
        argv += ["--set", options.set]
    for section in options.sections:
        argv += ["--section", section]
    if options.metrics:
        argv += ["--metrics", ",".join(options.metrics)]
    if options.launch_skip is not None:
        argv += ["--launch-skip", str(options.launch_skip)]
    if options.launch_count is not None:
        argv += ["--launch-count", str(options.launch_count)]
    if options.kernel_name is not None:
        argv += ["--kernel-name", options.kernel_name]
    return [*argv, *options.extra_args]


def nvprof_argv(options: NvprofOptions, log_file: str) -> list[str]:
    """``nvprof ...`` writing one CSV log per process (``%p``)."""
    argv = ["nvprof", "--profile-child-processes", "--csv", "--log-file", log_file]
    if options.capture == "range":
        argv += ["--profile-from-start", "off"]
    if options.metrics:
        argv += ["--metrics", ",".join(options.metrics)]
    return [*argv, *options.extra_args]


# --- which tool fits which GPU ---------------------------------------------------------------


def tool_problem(tool: str, capability: tuple[int, int] | None = None,
                 cuda: str | None = None) -> str:
    """Why ``tool`` cannot profile this GPU / CUDA toolkit, naming the tool to use ('' if it
    can, or if nothing is known)."""
    if tool != "nvprof":
        return ""
    if capability is not None and capability >= (8, 0):
        return (f"nvprof does not support GPUs of compute capability {capability[0]}."
                f"{capability[1]} (Ampere and later): use profiler = 'ncu' for the pipe "
                "utilisation metrics or 'nsys' for a timeline")
    if cuda is not None and cuda.split(".")[0].isdigit() and int(cuda.split(".")[0]) >= 12:
        return (f"nvprof is not part of CUDA {cuda} (CUDA 12 toolkits dropped it): use profiler "
                "= 'ncu' or 'nsys', or an image with CUDA 11 or older (a base_image)")
    return ""


