"""The bad-input suite: what a careless or hostile user may hand ``orchestrate``.

Every case runs through the real entry point, :func:`orchestrator.cli.main`, in-process (stdout
and stderr captured), and a sample of them as real ``python -m orchestrator.cli`` processes. A
case either is refused (exit 2, the field named on stderr), or needs what this machine lacks
(exit 3: refused by validate and the sweep, shown by plan and --dry-run with the requirement
after the plan), or is legitimately accepted and runs correctly (exit 0, its output checked).
For every case: no traceback, nothing blocks, and no file is written outside the case's results
folder (the case folder and the repository are compared before and after).

The table is data: add a case with :func:`case` (any command line), :func:`bad_matrix` /
:func:`lacks` / :func:`good_matrix` (a matrix file), :func:`bad_hosts` (a hosts file). ``{dir}``
in an argument is the case's folder (also the working directory), ``{results}`` its results
folder.
``python tests/test_bad_inputs.py`` prints the number of cases per category.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpu_support import write_standin  # noqa: E402

from orchestrator.catalog import gpus  # noqa: E402
from orchestrator.cli import main  # noqa: E402

RUN = "20260101-000000-abcd"


@dataclass(frozen=True)
class Case:
    """One input and what must come of it."""

    category: str
    name: str
    argv: tuple[str, ...]
    files: Mapping[str, str | bytes] = field(default_factory=dict)
    #: 2: refused; 0: accepted (1 for a command whose own answer is "no", e.g. a regression)
    expect: int = 2
    #: texts stderr must contain (refused: the field; accepted: e.g. a warning)
    err: tuple[str, ...] = ()
    #: texts stdout must contain
    out: tuple[str, ...] = ()
    #: texts neither stdout nor stderr may contain (e.g. ``Infinity``, which is not JSON)
    absent: tuple[str, ...] = ()
    #: prepares the case folder beyond ``files`` (a FIFO, a symlink, an old run)
    setup: Callable[[Path], None] | None = None
    #: checks the case folder afterwards (accepted cases: what was written)
    check: Callable[[Path], None] | None = None
    #: also run it as a real subprocess
    subprocess: bool = False
    #: the machine "has" these GPUs (a stand-in nvidia-smi first on PATH: ``"H100"``,
    #: ``"V100"``, ``"Gaudi2"``, ...; tests/gpu_support.py); None: this machine as it is
    gpu: str | None = None
    #: environment variables set for the case (``{dir}`` replaced)
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.category}/{self.name}"


CASES: list[Case] = []


def case(category: str, name: str, argv: list[str], **kwargs: Any) -> None:
    """Add a case to the table."""
    CASES.append(Case(category, name, tuple(argv), **kwargs))


BASE = """\
[matrix]
{matrix}
[workload]
hardware = "cpu"
iterations = 1
warmup = 0
{workload}
[axes]
{axes}
{extra}
[hardware.cpu]
device = "cpu"
{hardware}
"""


def mx(matrix: str = "", workload: str = "", axes: str = "", extra: str = "",
       hardware: str = "") -> str:
    """A small valid matrix with the given lines added to its tables."""
    return BASE.format(matrix=matrix, workload=workload, axes=axes, extra=extra,
                       hardware=hardware)


def bad_matrix(category: str, name: str, text: str | bytes, fld: str, *,
               command: tuple[str, ...] = ("validate",), file: str = "m.toml",
               **kwargs: Any) -> None:
    """A matrix that must be refused naming ``fld`` (``m.toml: FIELD``); ``err``: more texts
    stderr must contain."""
    where = f"{file}: {fld}" if fld else file
    more = tuple(kwargs.pop("err", ()))
    case(category, name, [*command, f"{{dir}}/{file}"], files={file: text}, err=(where, *more),
         **kwargs)


def lacks(category: str, name: str, text: str | bytes, fld: str, *,
          command: tuple[str, ...] = ("validate",), file: str = "m.toml",
          **kwargs: Any) -> None:
    """A valid matrix whose cells need what the target lacks (exit 3, naming ``fld``):
    ``validate`` and the sweep refuse it (the field on stderr); ``plan`` and ``--dry-run``
    show the plan and then the requirement (on stdout; ``plan --json``: on stderr)."""
    where = f"{file}: {fld}" if fld else file
    shows = command[0] == "plan" or "--dry-run" in command
    stream = "out" if shows and "--json" not in command else "err"
    kwargs[stream] = (where, *kwargs.pop("err", ()), *kwargs.pop(stream, ()))
    case(category, name, [*command, f"{{dir}}/{file}"], files={file: text}, expect=3, **kwargs)


def good_matrix(category: str, name: str, text: str, cells: int, **kwargs: Any) -> None:
    """A matrix that must validate (``ok (N cells)``)."""
    case(category, name, ["validate", "{dir}/m.toml"], files={"m.toml": text}, expect=0,
         out=(f"ok ({cells} cell{'' if cells == 1 else 's'})",), **kwargs)


def bad_hosts(name: str, text: str | bytes, fld: str, **kwargs: Any) -> None:
    """A hosts file that ``hosts check`` must refuse before connecting anywhere."""
    where = f"h.toml: {fld}" if fld else "h.toml"
    case("hosts", name, ["hosts", "check", "{dir}/h.toml"], files={"h.toml": text},
         err=(where,), **kwargs)


# --- types -----------------------------------------------------------------------------------

for _name, _kw, _field in [
    ("batch_size-string", {"workload": 'batch_size = "8"'}, "workload.batch_size"),
    ("gpus-float", {"workload": "gpus = 1.0"}, "workload.gpus"),
    ("channels_last-yes", {"workload": 'channels_last = "yes"'}, "workload.channels_last"),
    ("channels_last-int", {"workload": "channels_last = 1"}, "workload.channels_last"),
    ("repeats-string", {"matrix": 'repeats = "3"'}, "matrix.repeats"),
    ("timeout-string", {"matrix": 'timeout_s = "1800"'}, "matrix.timeout_s"),
    ("timeout-bool", {"matrix": "timeout_s = true"}, "matrix.timeout_s"),
    ("seed-float", {"workload": "seed = 1.5"}, "workload.seed"),
    ("precision-int", {"workload": "precision = 1"}, "workload.precision"),
    ("arch-int", {"workload": "arch = 5"}, "workload.arch"),
    ("data-list", {"workload": "data = []"}, "workload.data"),
    ("axis-strings", {"axes": 'gpus = ["1", "2"]'}, "axes.gpus[0]"),
    ("axis-not-a-list", {"axes": "gpus = 4"}, "axes.gpus"),
    ("axis-mixed", {"axes": 'batch_size = [8, "16"]'}, "axes.batch_size[1]"),
    ("exclude-string", {"axes": "gpus = [1, 2]", "extra": '[[exclude]]\ngpus = "1"'},
     "exclude[0].gpus"),
    ("include-string", {"extra": '[[include]]\nbatch_size = "8"'}, "include[0].batch_size"),
    ("env-int", {"hardware": "env = { A = 1 }"}, "hardware.cpu.env.A"),
    ("partial-string", {"hardware": 'bitfusion = { partial = "1" }'},
     "hardware.cpu.bitfusion.partial"),
    ("cap_add-string", {"hardware": 'container = { cap_add = "SYS_NICE" }'},
     "hardware.cpu.container.cap_add"),
    ("image_vars-string", {"hardware": 'image_vars = "x"'}, "hardware.cpu.image_vars"),
    ("one_cell_per_host-string", {"matrix": 'one_cell_per_host = "no"'},
     "matrix.one_cell_per_host"),
    ("mounts-int", {"hardware": "container = { mounts = [1] }"},
     "hardware.cpu.container.mounts[0]"),
    ("privileged-int", {"hardware": "container = { privileged = 1 }"},
     "hardware.cpu.container.privileged"),
    ("gpu_ids-strings", {"hardware": 'gpu_ids = ["0"]'}, "hardware.cpu.gpu_ids[0]"),
]:
    bad_matrix("types", _name, mx(**_kw), _field)
case("types", "iterations-bool", ["validate", "{dir}/m.toml"],
     files={"m.toml": mx().replace("iterations = 1", "iterations = true")},
     err=("m.toml: workload.iterations",), subprocess=True)
bad_matrix("types", "matrix-not-a-table", "matrix = [1]\n", "matrix")
bad_matrix("types", "hardware-not-a-table",
           mx().replace('[hardware.cpu]\ndevice = "cpu"', "[hardware]\ncpu = 3"), "hardware.cpu")
good_matrix("types", "timeout-int-accepted", mx(matrix="timeout_s = 1800"), 1)
good_matrix("types", "partial-int-accepted", mx(hardware="bitfusion = { partial = 1 }"), 1)
good_matrix("types", "bool-accepted", mx(workload="channels_last = false"), 1)

# --- ranges ----------------------------------------------------------------------------------

_RANGES: list[tuple[str, dict[str, str], str]] = []
for _key, _values in {
    "gpus": ["0", "-1", "65", "1000000"],
    "batch_size": ["0", "1000000000000"],
    "iterations": ["0", "1000000000000"],
    "warmup": ["-1", "1000000000000"],
    "num_classes": ["0", "1000000000000"],
    "workers": ["-1", "1000000"],
    "image_size": ["8", "5000"],
    "seed": ["-1", "1099511627776"],
}.items():
    for _v in _values:
        if _key in ("iterations", "warmup"):  # set by mx() already
            _text = mx().replace(f"{_key} = {1 if _key == 'iterations' else 0}\n",
                                 f"{_key} = {_v}\n")
            bad_matrix("ranges", f"{_key}={_v}", _text, f"workload.{_key}")
        else:
            _RANGES.append((f"{_key}={_v}", {"workload": f"{_key} = {_v}"}, f"workload.{_key}"))
for _key, _values in {
    "repeats": ["0", "10000000"],
    "retries": ["-1", "1000"],
    "timeout_s": ["inf", "-inf", "nan", "1e300", "0", "-5", "604801"],
}.items():
    _RANGES += [(f"{_key}={_v}", {"matrix": f"{_key} = {_v}"}, f"matrix.{_key}")
                for _v in _values]
_RANGES += [
    ("partial=0", {"hardware": "bitfusion = { partial = 0 }"}, "hardware.cpu.bitfusion.partial"),
    ("partial=1.5", {"hardware": "bitfusion = { partial = 1.5 }"},
     "hardware.cpu.bitfusion.partial"),
    ("partial=nan", {"hardware": "bitfusion = { partial = nan }"},
     "hardware.cpu.bitfusion.partial"),
    ("shm_size-huge", {"hardware": 'container = { shm_size = "99999999g" }'},
     "hardware.cpu.container.shm_size"),
    ("shm_size-unit", {"hardware": 'container = { shm_size = "1x" }'},
     "hardware.cpu.container.shm_size"),
    ("mem_limit-words", {"hardware": 'container = { mem_limit = "lots" }'},
     "hardware.cpu.container.mem_limit"),
    ("ulimit-below-unlimited", {"hardware": "container = { ulimits = { nofile = -2 } }"},
     "hardware.cpu.container.ulimits.nofile"),
    ("ulimit-unknown", {"hardware": "container = { ulimits = { nofle = 1 } }"},
     "hardware.cpu.container.ulimits.nofle"),
    ("gpu_ids-negative", {"hardware": "gpu_ids = [-1]"}, "hardware.cpu.gpu_ids[0]"),
    ("gpu_ids-huge", {"hardware": "gpu_ids = [256]"}, "hardware.cpu.gpu_ids[0]"),
    ("gpu_ids-twice", {"hardware": "gpu_ids = [0, 0]"}, "hardware.cpu.gpu_ids"),
    ("cpus_per_gpu=0", {"hardware": "slurm = { cpus_per_gpu = 0 }"},
     "hardware.cpu.slurm.cpus_per_gpu"),
    ("cpus_per_gpu-huge", {"hardware": "slurm = { cpus_per_gpu = 100000 }"},
     "hardware.cpu.slurm.cpus_per_gpu"),
    ("max_jobs=0", {"hardware": "slurm = { max_jobs = 0 }"}, "hardware.cpu.slurm.max_jobs"),
    ("slurm-mem-huge", {"hardware": 'slurm = { mem = "99999999T" }'}, "hardware.cpu.slurm.mem"),
    ("slurm-time-huge", {"hardware": 'slurm = { time_limit = "99999999999:00:00" }'},
     "hardware.cpu.slurm.time_limit"),
    ("env-name-with-equals", {"hardware": 'env = { "A=B" = "x" }'}, "hardware.cpu.env"),
    ("env-value-nul", {"hardware": 'env = { A = "x\\u0000y" }'}, "hardware.cpu.env.A"),
    ("data-newline", {"workload": 'data = "/data/\\nimagenet"'}, "workload.data"),
    ("mount-target-relative",
     {"hardware": 'container = { mounts = [{ source = "/d", target = "d" }] }'},
     "hardware.cpu.container.mounts[0].target"),
]
for _i, (_name, _kw, _field) in enumerate(_RANGES):
    bad_matrix("ranges", _name, mx(**_kw), _field, subprocess=_i % 12 == 0)
bad_matrix("ranges", "data-an-option", mx(workload='data = "--help"'), "workload.data",
           err=("starts with '-'", "./--help"))
bad_matrix("ranges", "data-an-option-in-an-axis", mx(axes='data = ["/d", "-x"]'),
           "axes.data[1]")
good_matrix("ranges", "gpus=64-accepted", mx(workload="gpus = 64"), 1)
good_matrix("ranges", "batch=65536-accepted", mx(workload="batch_size = 65536"), 1)
good_matrix("ranges", "timeout-a-week-accepted", mx(matrix="timeout_s = 604800"), 1)
good_matrix("ranges", "repeats=1000-accepted", mx(matrix="repeats = 1000"), 1000)
good_matrix("ranges", "seed-max-accepted", mx(workload="seed = 4294967295"), 1)

# --- unknown keys: the nearest one suggested --------------------------------------------------

for _name, _text, _field, _guess in [
    ("batch_sze", mx(workload="batch_sze = 8"), "workload.batch_sze", "batch_size"),
    ("repeat", mx(matrix="repeat = 3"), "matrix.repeat", "repeats"),
    ("timout_s", mx(matrix="timout_s = 5"), "matrix.timout_s", "timeout_s"),
    ("axis", mx().replace("[axes]", "[axis]"), "axis", "axes"),
    ("matrx", mx().replace("[matrix]", "[matrx]"), "matrx", "matrix"),
    ("devce", mx(hardware='devce = "cpu"'), "hardware.cpu.devce", "device"),
    ("contaner", mx(hardware="contaner = {}"), "hardware.cpu.contaner", "container"),
    ("shm_sise", mx(hardware='container = { shm_sise = "1g" }'),
     "hardware.cpu.container.shm_sise", "shm_size"),
    ("partiton", mx(hardware='slurm = { partiton = "gpu" }'), "hardware.cpu.slurm.partiton",
     "partition"),
    ("partail", mx(hardware="bitfusion = { partail = 0.5 }"), "hardware.cpu.bitfusion.partail",
     "partial"),
    ("include-hardwre", mx(extra='[[include]]\nhardwre = "cpu"'), "include[0].hardwre",
     "hardware"),
    ("exclude-gpu", mx(axes="gpus = [1, 2]", extra="[[exclude]]\ngpu = 1"), "exclude[0].gpu",
     "gpus"),
    ("zip-precison", mx(extra='[[zip]]\nprecison = ["fp32"]'), "zip[0].precison", "precision"),
    # a table's field at the top of the file: that table's key named
    ("top-level-repeats", "repeats = 3\n" + mx(), "repeats", "matrix.repeats"),
]:
    bad_matrix("unknown-keys", _name, _text, f"{_field}: unknown key (did you mean {_guess!r}?")
bad_matrix("unknown-keys", "nothing-near", mx(workload="zzzz = 1"),
           "workload.zzzz: unknown key (check the spelling")

# --- nesting ---------------------------------------------------------------------------------

_DEEP = "nested too deeply"
_LINE = len(mx().splitlines()) + 1  # the line appended to mx()
for _name, _text, _field in [  # the field named (issue 24, item 17)
    ("arrays-500", mx() + "deep = " + "[" * 500 + "]" * 500 + "\n", f"deep (line {_LINE})"),
    ("inline-tables-500", mx() + "deep = " + "{a = " * 500 + "1" + "}" * 500 + "\n",
     f"deep (line {_LINE})"),
    ("headers-500", mx() + "[" + ".".join(["a"] * 500) + "]\nx = 1\n", "a.a.a..."),
    ("arrays-17", mx() + "deep = " + "[" * 17 + "]" * 17 + "\n", "hardware.cpu.deep..."),
    ("arrays-100000", "deep = " + "[" * 100000 + "]" * 100000 + "\n", "deep (line 1)"),
]:
    case("nesting", _name, ["validate", "{dir}/m.toml"], files={"m.toml": _text},
         err=(f"m.toml: {_field}: nested too deeply",), subprocess=_name == "arrays-500")
bad_matrix("nesting", "axis-of-lists", mx(axes="gpus = [[1], [2]]"), "axes.gpus[0]")
case("nesting", "hosts-500", ["hosts", "check", "{dir}/h.toml"],
     files={"h.toml": "x = " + "[" * 500 + "]" * 500 + "\n"},
     err=("h.toml: x (line 1): nested too deeply",))

# --- size ------------------------------------------------------------------------------------

_BIG = 2 * 1024 * 1024
case("size", "file-2MiB", ["validate", "{dir}/m.toml"],
     files={"m.toml": mx() + "#" * _BIG + "\n"}, err=("m.toml: too big", "1 MiB"),
     subprocess=True)
case("size", "axis-4.5M-values", ["plan", "{dir}/m.toml"],
     files={"m.toml": mx(axes="seed = [" + ",".join(["1"] * 4_500_000) + "]")},
     err=("m.toml: too big",))
bad_matrix("size", "axis-10001", mx(axes="seed = [" + ",".join(map(str, range(10001))) + "]"),
           "axes.seed: List should have at most 10000 items")
bad_matrix("size", "product-40000",
           mx(axes="seed = [" + ",".join(map(str, range(200))) + "]\nbatch_size = ["
              + ",".join(map(str, range(1, 201))) + "]", extra="[[exclude]]\nseed = 0"),
           "axes: axes.seed (200 values) x axes.batch_size (200 values) multiply up to 40,000")
bad_matrix("size", "repeats-times-cells",
           mx(matrix="repeats = 1000", axes="seed = [" + ",".join(map(str, range(11))) + "]"),
           "axes: axes.seed (11 values) x matrix.repeats (1000) plan 11,000 cells",
           subprocess=True)
bad_matrix("size", "after-exclude",
           mx(matrix="repeats = 3",
              axes="seed = [" + ",".join(map(str, range(8000))) + ']\nmode = ["train", "infer"]',
              extra="[[exclude]]\nmode = \"infer\"\nseed = [0, 1]"),
           "axes: axes.seed (8000 values) x axes.mode (2 values) x matrix.repeats (3) plan "
           "47,994 cells")
bad_matrix("size", "exclude-101-rules",
           mx(axes="seed = [1, 2]",
              extra="".join(f"[[exclude]]\nseed = {i}\n" for i in range(101))),
           "exclude: List should have at most 100 items")
bad_matrix("size", "include-10001",
           mx(extra="".join(f"[[include]]\nseed = {i}\n" for i in range(10001))),
           "include: List should have at most 10000 items")
case("size", "hosts-2MiB", ["hosts", "check", "{dir}/h.toml"],
     files={"h.toml": "#" * _BIG}, err=("h.toml: too big",))
good_matrix("size", "5000-cells-accepted",
            mx(axes="seed = [" + ",".join(map(str, range(5000))) + "]"), 5000)

# --- special files ---------------------------------------------------------------------------


def _fifo(name: str) -> Callable[[Path], None]:
    return lambda d: os.mkfifo(d / name)


def _symlink(name: str, target: str) -> Callable[[Path], None]:
    return lambda d: (d / name).symlink_to(target)


case("special-files", "fifo", ["validate", "{dir}/m.toml"], setup=_fifo("m.toml"),
     err=("m.toml: not a regular file (a FIFO)",), subprocess=True)
case("special-files", "fifo-plan", ["plan", "{dir}/m.toml"], setup=_fifo("m.toml"),
     err=("m.toml: not a regular file (a FIFO)",))
case("special-files", "dev-zero", ["validate", "/dev/zero"],
     err=("/dev/zero: not a regular file (a character device)",), subprocess=True)
case("special-files", "dev-zero-run", ["matrix", "/dev/zero", "--results", "{results}"],
     err=("/dev/zero: not a regular file",))
case("special-files", "symlink-to-dev-zero", ["validate", "{dir}/m.toml"],
     setup=_symlink("m.toml", "/dev/zero"), err=("m.toml: not a regular file",))
case("special-files", "directory", ["validate", "{dir}/sub"],
     setup=lambda d: (d / "sub").mkdir(), err=("sub: not a regular file (a folder)",))
case("special-files", "missing", ["validate", "{dir}/nope.toml"],
     err=("nope.toml: no such file",))
bad_matrix("special-files", "latin-1", b"[matrix]\ndescription = '\xe9t\xe9'\n",
           "not UTF-8")
bad_matrix("special-files", "binary", bytes(range(256)), "")
bad_matrix("special-files", "empty", "", "workload.hardware")
bad_matrix("special-files", "malformed", "[matrix\nname = 1\n", "malformed TOML")
case("special-files", "hosts-fifo", ["hosts", "check", "{dir}/h.toml"], setup=_fifo("h.toml"),
     err=("h.toml: not a regular file (a FIFO)",), subprocess=True)
case("special-files", "hosts-dev-null", ["hosts", "check", "/dev/null"],
     err=("/dev/null: not a regular file",))
case("special-files", "driver-from-hosts-fifo",
     ["images", "build", "ngc-pytorch", "--driver-from", "a", "--hosts", "{dir}/h.toml",
      "--dry-run"], setup=_fifo("h.toml"), err=("h.toml: not a regular file",))
case("special-files", "matrix-hosts-fifo",
     ["matrix", "{dir}/m.toml", "--backend", "ssh", "--hosts", "{dir}/h.toml", "--results",
      "{results}"], files={"m.toml": mx(hardware='image = "ngc-pytorch"')},
     setup=_fifo("h.toml"), err=("h.toml: not a regular file",))

# --- names and paths -------------------------------------------------------------------------

for _file in ("..toml", "...toml", ".hidden.toml", "a b.toml", "-x.toml"):
    bad_matrix("names-paths", f"file-{_file}", mx(), "matrix.name: the file name gives",
               file=_file)
for _file in ("..toml", "...toml"):
    case("names-paths", f"run-{_file}", ["matrix", f"{{dir}}/{_file}", "--results",
                                         "{results}"],
         files={_file: mx()}, err=("matrix.name",), subprocess=_file == "..toml")
for _name, _value in [("dotdot", "../x"), ("slash", "a/b"), ("hidden", ".x"), ("empty", ""),
                      ("long", "x" * 65), ("newline", "x\\ny"), ("space", "a b")]:
    bad_matrix("names-paths", f"name-{_name}", mx(matrix=f'name = "{_value}"'), "matrix.name")
bad_matrix("names-paths", "profile-name-escapes",
           mx().replace('hardware = "cpu"', 'hardware = "../x"')
           .replace("[hardware.cpu]", '[hardware."../x"]'), "hardware")
good_matrix("names-paths", "dotted-name-accepted", mx(matrix='name = "nightly.v2"'), 1)


def _a_run(d: Path, results: dict[str, Any] | None = None, plan: str | None = None,
           run_json: str | None = None, name: str = "m", run: str = RUN) -> None:
    """An old run of matrix ``name`` under ``d/results``."""
    root = d / "results" / name / run
    (root / "cells").mkdir(parents=True)
    results = {"a-r1": _result("a-r1")} if results is None else results
    ids = [{"id": cid} for cid in results]
    (root / "plan.json").write_text(plan if plan is not None else json.dumps({"cells": ids}))
    (root / "run.json").write_text(run_json if run_json is not None else "{}")
    for cid, data in results.items():
        (root / "cells" / cid).mkdir()
        text = data if isinstance(data, str) else json.dumps(data)
        (root / "cells" / cid / "result.json").write_text(text)


def _result(cell_id: str, status: str = "ok", ips: float = 100.0) -> dict[str, Any]:
    return {"cell_id": cell_id, "group": cell_id.rsplit("-r", 1)[0], "repeat": 1,
            "status": status, "params": {"hardware": "cpu", "gpus": 1, "mode": "train"},
            "metrics": {"train.total_ips": ips}}


for _name, _argv, _field in [
    ("report-run-dotdot", ["report", "m", "--run", "../../x"], "run id"),
    ("report-run-slash", ["report", "m", "--run", f"{RUN}/../../.."], "run id"),
    ("report-run-empty", ["report", "m", "--run", ""], "run id"),
    ("report-matrix-dotdot", ["report", "../x"], "matrix"),
    ("report-matrix-abs", ["report", "/etc"], "matrix"),
    ("history-matrix-dotdot", ["history", "../../etc"], "matrix"),
    ("history-matrix-file", ["history", "..toml"], "matrix"),
    ("resume-dotdot", ["matrix", "{dir}/m.toml", "--resume", "../../x"], "--resume"),
    ("clean-run-dotdot", ["clean", "--run", "../x"], "--run"),
    ("clean-run-empty", ["clean", "--run", ""], "--run"),
    ("clean-matrix-slash", ["clean", "--matrix", "a/b"], "--matrix"),
]:
    case("names-paths", _name, [*_argv, "--results", "{results}"] if _argv[0] != "clean"
         else _argv, files={"m.toml": mx()}, setup=_a_run, err=(_field,),
         subprocess=_name == "report-run-dotdot")

def _run_elsewhere(d: Path) -> None:
    """A run in the results, and one outside it ({dir}/elsewhere) that a symlink in the results
    leads to (results/m/<run 2>), and a victim matrix beside the results."""
    _a_run(d)
    _a_run(d / "elsewhere", run="20260102-000000-abcd")
    _a_run(d / "elsewhere", name="victim")
    (d / "results" / "m" / "20260102-000000-abcd").symlink_to(
        d / "elsewhere" / "results" / "m" / "20260102-000000-abcd")


def _nothing_indexed_outside(d: Path) -> None:
    """The results index holds no run from outside the results folder."""
    from orchestrator.results.folders.store import open_store

    with open_store(d / "results", refresh=False) as store:
        outside = [r.path for r in store.runs() if "elsewhere" in r.path]
    assert not outside, f"indexed from outside the results: {outside}"


_LONG_BACK = "latest~" + "9" * 5000
for _name, _argv, _err in [
    ("compare-matrix-prefix-dotdot", ["compare", "../elsewhere/results/victim:latest",
                                      "m:latest"], ("run: ",)),
    ("compare-matrix-prefix-absolute", ["compare", "/etc:latest", "m:latest"], ("run: ",)),
    ("compare-latest-5000-digits", ["compare", f"m:{_LONG_BACK}", "m:latest"],
     ("expected latest~N with N a number below a million",)),
    ("history-run-latest-5000-digits", ["history", "m", "--run", f"m:{_LONG_BACK}"],
     ("expected latest~N",)),
    ("report-run-a-link-out-of-the-results", ["report", "m", "--run", "20260102-000000-abcd"],
     ("outside the results folder",)),
    ("report-latest-a-link-out-of-the-results", ["report", "m"],
     ("outside the results folder",)),
]:
    case("names-paths", _name, [*_argv, "--results", "{results}"], setup=_run_elsewhere,
         err=_err, subprocess=_name == "compare-matrix-prefix-dotdot",
         check=_nothing_indexed_outside)

# --- template variables and injection --------------------------------------------------------


def _profile(image: str, image_vars: str) -> str:
    return mx(hardware=f'image = "{image}"\nimage_vars = {{ {image_vars} }}')


for _image, _vars in [
    ("ngc-pytorch", 'base_tag = "23.10-py3\\nRUN touch /pwned"'),
    ("ngc-pytorch", 'install_dir = "/opt/x\\nRUN id"'),
    ("ngc-pytorch", 'base_image = "nvcr.io/x:1 AS y\\nRUN id"'),
    ("ngc-pytorch", 'apt_packages = ["git; touch /pwned"]'),
    ("ngc-pytorch", 'apt_packages = ["$(id)"]'),
    ("ngc-pytorch", 'pip_packages = ["--index-url=http://evil.example"]'),
    ("ngc-pytorch", 'pip_packages = ["`id`"]'),
    ("ngc-pytorch", 'base_tag = "a b"'),
    ("ngc-pytorch", "base_tag = 23"),
    ("ngc-pytorch", 'bse_tag = "23.10-py3"'),
    ("bitfusion", 'bitfusion_dir = "/etc/bf\\nRUN id"'),
    ("bitfusion", "bitfusion_dir = \"/etc/b'f\""),
    ("bitfusion", 'parent_image = "x\\ny"'),
    ("bitfusion", 'client_deb = "/tmp/a\\nRUN id.deb"'),
    ("bitfusion", 'client_deb = "/tmp/Dockerfile"'),
    ("habana", 'synapse_version = "1.18.0/../../evil"'),
    ("habana", 'os = "ubuntu22.04\\nRUN id"'),
    ("habana", 'torch_version = "2.4.0:latest"'),
    ("habana", 'install_dir = "/opt/$(id)"'),
    ("habana", 'lazy_mode = true'),  # gone: the Gaudi mode is per cell (hpu_mode)
    ("singularity", 'bootstrap = "docker\\n%post\\n  id"'),
    ("singularity", 'install_dir = "/opt/x\\"y"'),
    ("singularity", "threads = 99999"),
    ("singularity", 'threads = "4"'),
]:
    _key = _vars.split(" =", 1)[0]
    _unknown = "unknown " if _key in ("bse_tag", "lazy_mode") else ""
    bad_matrix("templates", f"{_image}-{_key}-{len(CASES)}", _profile(_image, _vars),
               f"hardware.cpu.image_vars: {_unknown}template variable '{_key}'")
bad_matrix("templates", "unknown-template", mx(hardware='image = "ngc-pytroch"'),
           "hardware.cpu.image: unknown image template 'ngc-pytroch'")

_RENDER = ["images", "render", "ngc-pytorch", "--out", "{results}/ctx"]
for _name, _assignment, _field in [
    ("newline", "base_tag=23.10-py3\nRUN touch /pwned", "base_tag"),
    ("subshell", "base_tag=$(touch /pwned)", "base_tag"),
    ("backtick", "base_tag=`id`", "base_tag"),
    ("space", "install_dir=/opt/a b", "install_dir"),
    ("quote", "install_dir=/opt/'x'", "install_dir"),
    ("semicolon-item", "apt_packages=git;id", "apt_packages"),
    ("option-item", "pip_packages=--pre", "pip_packages"),
    ("image-ref", "base_image=evil ref", "base_image"),
    ("unknown", "bse_tag=1", "bse_tag"),
    ("no-equals", "base_tag", "base_tag"),
]:
    case("templates", f"set-{_name}", [*_RENDER, "--set", _assignment],
         err=(f"--set: {_field}",), subprocess=_name == "newline")
case("templates", "set-threads-negative",
     ["images", "render", "singularity", "--out", "{results}/ctx", "--set", "threads=-1"],
     err=("--set: threads", "less than the minimum 0"))
case("templates", "set-threads-word",
     ["images", "render", "singularity", "--out", "{results}/ctx", "--set", "threads=four"],
     err=("--set: threads",))
case("templates", "set-bootstrap",
     ["images", "render", "singularity", "--out", "{results}/ctx", "--set", "bootstrap=shell"],
     err=("--set: bootstrap",))
case("templates", "set-build-newline",
     ["images", "build", "ngc-pytorch", "--dry-run", "--set", "install_dir=/x\nRUN id"],
     err=("--set: install_dir",))


def _expect_in(path: str, *texts: str) -> Callable[[Path], None]:
    def check(root: Path) -> None:
        content = (root / path).read_text()
        for text in texts:
            assert text in content, content

    return check


case("templates", "set-requirements-accepted-and-quoted",
     [*_RENDER, "--set", "pip_packages=numpy<2,torch>=2", "--set", "base_tag=23.10-py3"],
     expect=0, out=("wrote",), subprocess=True,
     check=_expect_in("results/ctx/Dockerfile", "--no-cache-dir 'numpy<2' 'torch>=2'\n",
                      "FROM nvcr.io/nvidia/pytorch:23.10-py3\n"))
case("templates", "set-apt-accepted", [*_RENDER, "--set", "apt_packages=numactl,libfoo:amd64"],
     expect=0, out=("wrote",),
     check=_expect_in("results/ctx/Dockerfile", "      numactl libfoo:amd64 \\\n"))


# images render --out never writes through a symbolic link; file variables keep their mode
# (issue 24, item 12)


def _ctx_with_link(name: str, target_is_dir: bool = False) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        (d / "results" / "ctx").mkdir(parents=True)
        victim = d / "victim"
        if target_is_dir:
            victim.mkdir()
        else:
            victim.write_text("keep\n")
        (d / "results" / "ctx" / name).symlink_to(victim)

    return setup


def _victim_kept(d: Path) -> None:
    assert (d / "victim").read_text() == "keep\n"
    assert not (d / "results" / "ctx" / "Dockerfile").is_symlink()


case("templates", "render-out-dockerfile-a-link", _RENDER, setup=_ctx_with_link("Dockerfile"),
     expect=0, out=("wrote",), check=_victim_kept, subprocess=True)
case("templates", "render-out-workload-a-link-to-a-folder", _RENDER,
     setup=_ctx_with_link("workload", target_is_dir=True),
     err=("--out: ", "a symbolic link on the way; not followed",))


def _private_deb(d: Path) -> None:
    (d / "client.deb").write_bytes(b"!<arch>\n")
    (d / "client.deb").chmod(0o640)
    (d / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")


def _mode_kept(d: Path) -> None:
    assert (d / "results" / "ctx" / "client.deb").stat().st_mode & 0o777 == 0o640


case("templates", "render-file-variable-keeps-its-mode-accepted",
     ["images", "render", "bitfusion", "--out", "{results}/ctx", "--set",
      "client_deb={dir}/client.deb", "--set", "ca_cert={dir}/ca.crt", "--set",
      "parent_image=lab/pytorch:1"],
     setup=_private_deb, expect=0, out=("wrote",), check=_mode_kept)

# --- zip / exclude / include -----------------------------------------------------------------

for _name, _kw, _field in [
    ("zip-lengths", {"extra": '[[zip]]\nbatch_size = [8, 16]\nprecision = ["fp32"]'},
     "zip[0]: lists must have the same length"),
    ("zip-empty", {"extra": "[[zip]]"}, "zip[0]: empty"),
    ("zip-and-axis", {"axes": "batch_size = [8]", "extra": "[[zip]]\nbatch_size = [8]"},
     "zip[0].batch_size: already varied"),
    ("exclude-matches-nothing", {"axes": "gpus = [1, 2]", "extra": "[[exclude]]\ngpus = 4"},
     "exclude[0]: matches no cell"),
    ("exclude-empty", {"axes": "gpus = [1, 2]", "extra": "[[exclude]]"},
     "exclude[0]: empty rule"),
    ("exclude-everything", {"axes": "gpus = [1, 2]", "extra": "[[exclude]]\ngpus = [1, 2]"},
     "axes: the matrix expands to no cell"),
    ("exclude-wrong-type", {"axes": "gpus = [1, 2]", "extra": '[[exclude]]\ngpus = ["1"]'},
     "exclude[0].gpus"),
    ("include-unknown-hardware", {"extra": '[[include]]\nhardware = "h100"'},
     "include[0].hardware: unknown hardware profile 'h100'"),
    ("axes-empty-list", {"axes": "gpus = []"}, "axes.gpus: List should have at least 1 item"),
    ("axes-unknown-hardware", {"axes": 'hardware = ["cpu", "gpu"]'},
     "axes.hardware[1]: unknown hardware profile 'gpu'"),
    ("zip-unknown-hardware", {"extra": '[[zip]]\nhardware = ["cpu", "tpu"]\ngpus = [1, 2]'},
     "zip[0].hardware[1]: unknown hardware profile 'tpu'"),
]:
    bad_matrix("zip-exclude-include", _name, mx(**_kw), _field)
bad_matrix("zip-exclude-include", "include-without-hardware",
           '[axes]\nhardware = ["cpu"]\n[[include]]\nbatch_size = 8\n'
           '[hardware.cpu]\ndevice = "cpu"\n', "include[0]: no hardware")
good_matrix("zip-exclude-include", "include-duplicate-dropped",
            mx(extra='[[include]]\nhardware = "cpu"'), 1)
good_matrix("zip-exclude-include", "zip-accepted",
            mx(extra='[[zip]]\nbatch_size = [8, 16]\nprecision = ["fp32", "bf16"]'), 2)

# --- control cells (issue 25) ----------------------------------------------------------------

for _name, _extra, _field in [
    ("control-empty", "[control]", "control: give exactly one of params"),
    ("control-both", '[control]\nparams = {}\ncell = "cpu-bs8"', "control: give exactly one"),
    ("control-hardware", '[control]\nparams = { hardware = "cpu" }',
     "control.params.hardware: the control runs on the hardware"),
    ("control-unknown-cell", '[control]\ncell = "../../etc"', "control.cell: no cell group"),
    ("control-unknown-key", '[control]\nparams = {}\nevrey = 2', "control.evrey"),
    ("control-every-0", '[control]\nparams = {}\nevery = 0', "control.every"),
    ("control-every-huge", '[control]\nparams = {}\nevery = 100000', "control.every"),
    ("control-every-text", '[control]\nparams = {}\nevery = "2"', "control.every"),
    ("control-gpus", '[control]\nparams = { gpus = 4 }',
     "control.params.gpus: the control needs 4 GPU(s)"),
    ("control-bad-param", '[control]\nparams = { batch_size = 0 }', "control.params.batch_size"),
    ("control-unknown-program", '[control]\nparams = { program = "ref" }',
     "control.params.program: unknown program 'ref'"),
]:
    bad_matrix("control", _name, mx(extra=_extra), _field)
    bad_matrix("control", f"{_name}-dry-run", mx(extra=_extra), _field,
               command=("matrix", "--dry-run"))
good_matrix("control", "control-params", mx(extra='[control]\nparams = { batch_size = 4 }'), 1)

# --- hosts files -----------------------------------------------------------------------------

_HOST = '[[hosts]]\nname = "a"\naddress = "10.0.0.1"\n'


def _opts(line: str) -> str:
    return f"[options]\n{line}\n{_HOST}"


for _name, _text, _field in [
    ("connect_timeout-inf", _opts("connect_timeout = inf"), "options.connect_timeout"),
    ("connect_timeout-nan", _opts("connect_timeout = nan"), "options.connect_timeout"),
    ("connect_timeout-0", _opts("connect_timeout = 0"), "options.connect_timeout"),
    ("connect_timeout-601", _opts("connect_timeout = 601"), "options.connect_timeout"),
    ("connect_timeout-string", _opts('connect_timeout = "10"'), "options.connect_timeout"),
    ("command_timeout-1e300", _opts("command_timeout = 1e300"), "options.command_timeout"),
    ("keepalive-negative", _opts("keepalive = -1"), "options.keepalive"),
    ("keepalive-huge", _opts("keepalive = 100000"), "options.keepalive"),
    ("trust-string", _opts('trust_on_first_use = "yes"'), "options.trust_on_first_use"),
    ("known_hosts-newline", _opts('known_hosts = "a\\nb"'), "options.known_hosts"),
    ("port-0", _HOST + "port = 0\n", "hosts[0] (a).port"),
    ("port-70000", _HOST + "port = 70000\n", "hosts[0] (a).port"),
    ("port-string", _HOST + 'port = "22"\n', "hosts[0] (a).port"),
    ("gpus-negative", _HOST + "gpus = [-1]\n", "hosts[0] (a).gpus"),
    ("gpus-huge", _HOST + "gpus = [256]\n", "hosts[0] (a).gpus"),
    ("gpus-twice", _HOST + "gpus = [0, 0]\n", "hosts[0] (a).gpus"),
    ("max_concurrent-0", _HOST + "max_concurrent = 0\n", "hosts[0] (a).max_concurrent"),
    ("max_concurrent-huge", _HOST + "max_concurrent = 100000\n", "hosts[0] (a).max_concurrent"),
    ("duplicate-names", _HOST + _HOST, "hosts[1].name: duplicate host name"),
    ("adress", '[[hosts]]\nname = "a"\nadress = "x"\n',
     "hosts[0] (a).adress: unknown key (did you mean 'address'?"),
    ("no-hosts", "[options]\nconnect_timeout = 5\n", "hosts: Field required"),
    ("name-newline", '[[hosts]]\nname = "a\\nb"\naddress = "x"\n', "hosts[0].name"),
    ("name-empty", '[[hosts]]\nname = ""\naddress = "x"\n', "hosts[0].name"),
    ("address-space", '[[hosts]]\nname = "a"\naddress = "x; id"\n', "hosts[0] (a).address"),
    ("tag-blank", _HOST + 'tags = [" "]\n', "hosts[0] (a).tags"),
    ("user-newline", _HOST + 'user = "a\\nb"\n', "hosts[0] (a).user"),
    ("driver-word", _HOST + 'driver = "latest"\n', "hosts[0] (a).driver"),
    ("driver-number", _HOST + "driver = 535\n", "hosts[0] (a).driver"),
    ("gpu-newline", _HOST + 'gpu = "V100\\nx"\n', "hosts[0] (a).gpu"),
]:
    bad_hosts(_name, _text, _field, subprocess=_name == "connect_timeout-inf")

# --- command-line arguments ------------------------------------------------------------------

_PLAN = ["plan", "{dir}/m.toml"]
_TWO = {"m.toml": mx(axes="batch_size = [8, 16]\nchannels_last = [true, false]")}
for _name, _only, _err in [
    ("only-not-a-number", "batch_size=abc", "--only: batch_size=abc"),
    ("only-unknown-key", "nokey=1", "--only: nokey: unknown parameter"),
    ("only-no-value", "gpus", "--only: gpus: expected KEY=VALUE"),
    ("only-no-key", "=1", "--only: =1: expected KEY=VALUE"),
    ("only-gpus-0", "gpus=0", "--only: gpus=0"),
    ("only-gpus-65", "gpus=65", "--only: gpus=65"),
    ("only-precision", "precision=fp8", "--only: precision=fp8"),
    ("only-matches-nothing", "batch_size=32", "--only batch_size=32 matches no cell"),
    ("only-comma-list", "batch_size=8,16",
     "(several values: repeat --only, e.g. --only batch_size=8 --only batch_size=16)"),
    ("only-comma-two-keys", "channels_last=true,batch_size=8",
     "--only: channels_last=true,batch_size=8: several filters in one: one KEY=VALUE per "
     "--only, e.g. --only channels_last=true --only batch_size=8"),
]:
    case("cli", _name, [*_PLAN, "--only", _only], files=_TWO, err=(_err,),
         subprocess=_name == "only-not-a-number")
case("cli", "only-strings-accepted", [*_PLAN, "--only", "batch_size=8", "--only",
                                      "channels_last=no"],
     files=_TWO, expect=0, out=("m: 1 cell (", "cpu-g1-bs8-fp32-nochannelslast-r1"),
     subprocess=True)
case("cli", "only-yes-accepted", [*_PLAN, "--only", "channels_last=yes", "--only", "repeat=1"],
     files=_TWO, expect=0, out=("m: 2 cells",))
# --exclude: --only's grammar, each one dropping its cells; --set: a field of the file,
# checked as the file's (the field named, and that --set set it)
for _name, _option, _value, _err in [
    ("exclude-not-a-number", "--exclude", "batch_size=abc", "--exclude: batch_size=abc"),
    ("exclude-unknown-key", "--exclude", "nokey=1", "--exclude: nokey: unknown parameter"),
    ("exclude-no-value", "--exclude", "gpus", "--exclude: gpus: expected KEY=VALUE"),
    ("exclude-matches-nothing", "--exclude", "batch_size=32",
     "--exclude: batch_size=32: matches no cell of m"),
    ("exclude-comma-list", "--exclude", "batch_size=8,16",
     "(several values: repeat --exclude, e.g. --exclude batch_size=8 --exclude batch_size=16)"),
    *[(name, "--set", value, err) for name, value, err in [
        ("set-range", "workload.iterations=0",
         "m.toml: workload.iterations: Input should be greater than 0 (got 0) (from --set "
         "workload.iterations=0)"),
        ("set-type", "workload.batch_size=abc",
         "m.toml: workload.batch_size: Input should be a valid integer (got 'abc') (from --set "
         "workload.batch_size=abc)"),
        ("set-unknown-key", "workload.iteratons=20",
         "m.toml: workload.iteratons: unknown key (did you mean 'iterations'?"),
        ("set-unknown-table", "workloads.iterations=20", "m.toml: workloads: unknown key"),
        ("set-table-field-at-top", "repeats=2",
         "m.toml: repeats: unknown key (did you mean 'matrix.repeats'?"),
        ("set-two-tables-field-at-top", "timeout_s=60",  # both named (was: no suggestion)
         "m.toml: timeout_s: unknown key (did you mean 'matrix.timeout_s' or "
         "'publish.timeout_s'?"),
        ("set-under-a-value", "workload.iterations.x=1",
         "m.toml: workload.iterations: is a number here, not a table: 'x' cannot be a key under it "
         "(from --set workload.iterations.x=1)"),
        ("set-index-past-the-end", "hardware.cpu.container.mounts[2].source=/x",
         "hardware.cpu.container.mounts[2]: past the end"),
        ("set-index-on-a-table", "workload[0]=1",
         "m.toml: workload: is a table here, not a list: [0] cannot index it"),
        ("set-no-equals", "workload.iterations", "--set: workload.iterations: expected KEY=VALUE"),
        ("set-no-key", "=3", "--set: =3: expected KEY=VALUE"),
        ("set-bad-key", "work load=3", "--set: work load=3: expected '.' or the end after 'work'"),
        ("set-unclosed-quote", 'hardware."cpu.device=cuda', "--set: hardware.\"cpu.device=cuda"),
        ("set-enum", "hardware.cpu.device=gpu", "m.toml: hardware.cpu.device: Input should be "
         "'cuda', 'hpu' or 'cpu' (got 'gpu') (from --set hardware.cpu.device=gpu)"),
        ("set-list-not-toml", "axes.arch=[resnet50,resnet18]",
         "VALUE is not valid TOML, so it was read as text"),
        ("set-axis-item", "axes.batch_size=[8, 0]",
         "m.toml: axes.batch_size[1]: Input should be greater than 0 (got 0) (from --set "
         "axes.batch_size=[8, 0])"),
        ("set-name-not-a-folder", "matrix.name=../x", "m.toml: matrix.name"),
        ("set-unknown-profile", "workload.hardware=gpu",
         "unknown hardware profile 'gpu'; defined profiles: cpu (from --set "
         "workload.hardware=gpu)"),
        ("set-profile-rule", "hardware.cpu.gpu=V100",
         "m.toml: hardware.cpu: gpu names the accelerator of a cuda or hpu profile"),
        ("set-key-too-deep", "a" + "[0]" * 20 + "=1", "a key of at most 16 parts"),
        ("set-value-too-deep", "workload.data=" + "[" * 30 + "]" * 30,
         "m.toml: workload.data[0]...: nested too deeply"),
        ("set-value-recursion", "workload.data=" + "[" * 5000, "m.toml: workload.data: String "
         "should have at most 4096 characters"),
    ]],
]:
    case("cli", _name, [*_PLAN, _option, _value], files=_TWO, err=(_err,),
         subprocess=_name in ("exclude-not-a-number", "set-range"))
case("cli", "exclude-everything", [*_PLAN, "--exclude", "batch_size=8", "--exclude",
                                   "batch_size=16"],
     files=_TWO, err=("--exclude batch_size=8 --exclude batch_size=16 leaves no cell of m",))
case("cli", "exclude-accepted", [*_PLAN, "--exclude", "batch_size=8", "--exclude",
                                 "channels_last=no"],
     files=_TWO, expect=0, out=("m: 1 cell (", "cpu-g1-bs16-fp32-channelslast-r1",
                                "with --exclude batch_size=8 --exclude channels_last=no"),
     subprocess=True)
case("cli", "set-validate", ["validate", "{dir}/m.toml", "--set", "matrix.repeats=0"],
     files=_TWO, err=("m.toml: matrix.repeats", "(from --set matrix.repeats=0)"))
case("cli", "set-dry-run", ["matrix", "{dir}/m.toml", "--dry-run", "--results", "{results}",
                            "--set", "workload.precision=fp8"],
     files=_TWO, err=("m.toml: workload.precision", "(from --set workload.precision=fp8)"))
case("cli", "set-accepted", [*_PLAN, "--set", "axes.batch_size=[4]", "--set",
                             "axes.channels_last=[true]", "--set", "matrix.name=night",
                             "--set", "workload.data=/srv/data set"],
     files=_TWO, expect=0, out=("night: 1 cell (", "cpu-g1-bs4-fp32-r1",
                                "with --set 'axes.batch_size=[4]' --set "
                                "'axes.channels_last=[true]' --set matrix.name=night --set "
                                "'workload.data=/srv/data set'"), subprocess=True)
case("cli", "set-secret-masked", [*_PLAN, "--set", "hardware.cpu.env.HF_TOKEN=hf_abcdefgh123"],
     files=_TWO, expect=0, out=("--set 'hardware.cpu.env.HF_TOKEN=***'",),
     absent=("hf_abcdefgh123",))
for _name, _argv, _err in [
    ("report-baseline-no-equals", ["report", "m", "--baseline", "hardware"], "--baseline"),
    ("report-results-file", ["report", "m", "--results", "{dir}/m.toml"], "--results"),
    ("history-results-file", ["history", "m", "--results", "{dir}/m.toml"], "--results"),
    ("matrix-results-file", ["matrix", "{dir}/m.toml", "--results", "{dir}/m.toml"],
     "--results"),
    ("history-threshold-word", ["history", "m", "--threshold", "abc"], "--threshold"),
    ("history-last-word", ["history", "m", "--last", "abc"], "--last"),
    ("history-window-float", ["history", "m", "--window", "1.5"], "--window"),
    ("report-no-run", ["report", "m", "--run", "20990101-000000-ffff"], "run: no run"),
    ("report-no-matrix", ["report", "other"], "run: no runs of 'other'"),
    ("driver-word", ["images", "build", "ngc-pytorch", "--driver", "abc", "--dry-run"],
     "--driver: malformed driver version"),
    ("driver-and-base_tag", ["images", "build", "ngc-pytorch", "--driver", "535.104.05",
                             "--set", "base_tag=23.10-py3", "--dry-run"], "--driver: give either"),
    ("driver-from-without-hosts", ["images", "build", "ngc-pytorch", "--driver-from", "a"],
     "--driver-from needs --hosts"),
    ("driver-for-habana", ["images", "build", "habana", "--driver", "535.104.05", "--dry-run"],
     "that is an NVIDIA driver version"),
    ("driver-habana-unknown-series", ["images", "build", "habana", "--driver", "1.9.0",
                                      "--dry-run"], "not in orchestrator/data/habana"),
    ("gpu-unknown", ["images", "build", "ngc-pytorch", "--driver", "570.86.15", "--gpu", "V1OO",
                     "--dry-run"], "--gpu: unknown GPU 'V1OO'"),
    ("images-unknown", ["images", "render", "nope", "--out", "{results}/x"],
     "unknown image template 'nope'"),
    ("backend-unknown", ["matrix", "{dir}/m.toml", "--backend", "nope"],
     "--backend: unknown backend 'nope'"),
    ("jobs-word", ["hosts", "check", "{dir}/m.toml", "--jobs", "x"], "--jobs"),
    ("plan-without-file", ["plan"], "the following arguments are required"),
    ("quiet-and-verbose", ["-q", "-v", "plan", "{dir}/m.toml"], "not allowed with argument"),
    ("unknown-command", ["frobnicate"], "invalid choice"),
]:
    case("cli", _name, [*_argv, "--results", "{results}"]
         if _argv[0] in ("report", "history") and "--results" not in _argv else _argv,
         files={"m.toml": mx()}, setup=_a_run, err=(_err,),
         subprocess=_name in ("report-results-file", "driver-word"))
case("cli", "report-accepted", ["report", "m", "--results", "{results}", "--baseline",
                                "hardware=cpu"],
     setup=_a_run, expect=0, out=("100.0",))
case("cli", "dry-run-accepted", ["matrix", "{dir}/m.toml", "--dry-run", "--results",
                                 "{results}"],
     files={"m.toml": mx()}, expect=0, out=("dry run: would run 1 cell with",))
case("cli", "dry-run-names-the-backend-given-accepted",
     ["matrix", "{dir}/m.toml", "--dry-run", "--backend", "slurm", "--results", "{results}"],
     files={"m.toml": mx()}, expect=0, out=("repeat), backend slurm\n",
                                            "dry run: would run 1 cell with backend slurm"))
_SSH_SMOKE = (ROOT / "matrices" / "ssh_smoke.toml").read_text()
case("cli", "dry-run-ssh-missing-hosts",
     ["matrix", "{dir}/s.toml", "--dry-run", "--hosts", "{dir}/none.toml"],
     files={"s.toml": _SSH_SMOKE}, err=("none.toml: no such file",))
case("cli", "dry-run-ssh-bad-hosts",
     ["matrix", "{dir}/s.toml", "--dry-run", "--hosts", "{dir}/h.toml"],
     files={"s.toml": _SSH_SMOKE, "h.toml": '[[hosts]]\nname = "a"\nadress = "x"\n'},
     err=("h.toml: hosts[0] (a).adress: unknown key (did you mean 'address'?",))
case("cli", "dry-run-ssh-accepted",
     ["matrix", "{dir}/s.toml", "--dry-run", "--hosts", "{dir}/h.toml", "--results",
      "{results}"],
     files={"s.toml": _SSH_SMOKE, "h.toml": '[[hosts]]\nname = "a"\naddress = "127.0.0.1"\n'
            'tags = ["cpu"]\n'},
     expect=0, out=("h.toml (1 hosts; not contacted by a dry run)", "dry run: would run 4"))
def _two_runs(d: Path) -> None:
    _a_run(d)
    _a_run(d, {"a-r1": _result("a-r1", ips=50.0)}, run="20260102-000000-abcd")


for _name, _run, _expect, _text in [
    ("report-run-prefix-accepted", "20260101", 0, "results/m/20260101-000000-abcd"),
    ("report-run-latest-back-accepted", "latest~1", 0, "results/m/20260101-000000-abcd"),
    ("report-run-latest-accepted", "latest", 0, "results/m/20260102-000000-abcd"),
    ("report-run-ambiguous-prefix", "2026", 2, "no run '2026' under"),
    ("report-run-latest-too-far", "latest~2", 2, "'latest~2': 'm' has 2 run(s)"),
]:
    case("cli", _name, ["report", "m", "--results", "{results}", "--run", _run],
         setup=_two_runs, expect=_expect, out=(_text,) if _expect == 0 else (),
         err=(_text, "(2 runs start with it)") if _name.endswith("ambiguous-prefix")
         else () if _expect == 0 else (_text,))
case("cli", "validate-a-hosts-file", ["validate", "{dir}/h.toml"],
     files={"h.toml": '[options]\nconnect_timeout = 5\n[[hosts]]\nname = "a"\n'
            'address = "127.0.0.1"\n'},
     err=("h.toml: this is a hosts inventory, not a matrix file",))
case("hosts", "a-matrix-file", ["hosts", "check", "{dir}/h.toml"], files={"h.toml": mx()},
     err=("h.toml: this is a matrix file, not a hosts inventory",))
case("cli", "matrix-without-toml", ["validate", "{dir}/m"], files={"m.toml": mx()},
     err=("m: no such file", "did you mean ", "/m.toml?"))
case("cli", "export-of-no-run-says-so", ["export", "mm", "--results", "{results}"], setup=_a_run,
     expect=0, out=("matrix,run_id",),
     err=("note: nothing exported: no runs of 'mm' under", "`orchestrate runs` lists the runs"))
case("cli", "render-out-a-file", ["images", "render", "ngc-pytorch", "--out", "{dir}/m.toml"],
     files={"m.toml": mx()},
     err=("--out: ", "m.toml: cannot write it: a folder on its path is a file; give a writable "
          "folder",), subprocess=True)
case("cli", "render-out-under-a-file",
     ["images", "render", "ngc-pytorch", "--out", "{dir}/m.toml/ctx"], files={"m.toml": mx()},
     err=("--out: ", "cannot write it"))
case("cli", "render-out-with-brackets-accepted",
     ["images", "render", "ngc-pytorch", "--out", "{results}/c[/x]"], expect=0,
     out=("c[/x]/Dockerfile (tag would be orchestrate/ngc-pytorch:",))
case("cli", "build-dry-run-driver-accepted",
     ["images", "build", "ngc-pytorch", "--driver", "535.104.05", "--dry-run"], expect=0,
     out=("release:", "base image: nvcr.io/nvidia/pytorch:"))


# output files the user names: refused before any work (a plot's format) or one error line naming
# the option when they cannot be written (root here: a file on the path, not a read-only folder)
_RR = ["--results", "{results}"]
for _name, _argv, _err in [
    ("report-plot-txt", ["report", "m", *_RR, "--plot", "{dir}/x.txt"],
     ("--plot", "'.txt' is not a plot format", ".png, .svg, .pdf")),
    ("report-plot-no-suffix", ["report", "m", *_RR, "--plot", "{dir}/plotfile"],
     ("--plot", "no suffix")),
    ("history-plot-txt", ["history", "m", *_RR, "--plot", "{dir}/x.txt"],
     ("--plot", "not a plot format")),
    ("report-plot-under-a-file", ["report", "m", *_RR, "--plot", "{dir}/m.toml/x.png"],
     ("--plot", "m.toml/x.png: cannot write it: a folder on its path is a file")),
    ("report-html-under-a-file", ["report", "m", *_RR, "--html", "{dir}/m.toml/x.html"],
     ("--html", "cannot write it: a folder on its path is a file")),
    ("compare-html-under-a-file", ["compare", RUN, RUN, "--allow-same", *_RR, "--html",
                                   "{dir}/m.toml/c.html"],
     ("--html", "cannot write it")),
    ("history-plot-under-a-file", ["history", "m", *_RR, "--plot", "{dir}/m.toml/x.png"],
     ("--plot", "cannot write it")),
    ("export-out-a-folder", ["export", *_RR, "--out", "{dir}"],
     ("--out", "cannot write it: it is a folder")),
    ("report-baseline-typo", ["report", "m", *_RR, "--baseline", "hardwre=cpu"],
     ("--baseline: hardwre: unknown parameter (did you mean 'hardware'?",)),
    ("report-baseline-no-such-row", ["report", "m", *_RR, "--baseline", "hardware=v100"],
     ("--baseline: hardware=v100: no row of this run has hardware = 'v100' (it has: cpu)",)),
    ("export-status-typo", ["export", *_RR, "--status", "okk"],
     ("--status: invalid choice: 'okk'",)),
    ("export-where-typo", ["export", *_RR, "--where", "gpu=8"],
     ("--where: gpu: unknown parameter (did you mean 'gpus'?",)),
    ("runs-no-results-folder", ["runs", "--results", "{dir}/none"],
     ("--results: no results folder", "$ORCHESTRATE_RESULTS or `results` in the config file")),
    ("runs-results-file", ["runs", "--results", "{dir}/m.toml"],
     ("--results", "m.toml is not a folder")),
    ("lock-timeout-negative", ["matrix", "{dir}/m.toml", "--dry-run", "--lock-timeout", "-1"],
     ("--lock-timeout: '-1': give 0 or more seconds",)),
    ("lock-timeout-nan", ["matrix", "{dir}/m.toml", "--dry-run", "--lock-timeout", "nan"],
     ("--lock-timeout: 'nan': give 0 or more seconds",)),
    ("lock-timeout-word", ["matrix", "{dir}/m.toml", "--dry-run", "--lock-timeout", "soon"],
     ("--lock-timeout: 'soon' is not a number of seconds",)),
    ("dry-run-unknown-backend", ["matrix", "{dir}/m.toml", "--backend", "nope", "--dry-run"],
     ("--backend: unknown backend 'nope'",)),
    ("dry-run-results-file", ["matrix", "{dir}/m.toml", "--dry-run", "--results",
                              "{dir}/m.toml"], ("--results", "is not a folder")),
]:
    case("cli", _name, _argv, files={"m.toml": mx()}, setup=_a_run, err=_err,
         subprocess=_name == "report-plot-under-a-file")


def _summary_is_a_folder(d: Path) -> None:
    """A run whose summary files cannot be rewritten (as in a read-only archive: root ignores
    permissions, so summary.csv is a folder here)."""
    _a_run(d)
    (d / "results" / "m" / RUN / "summary.csv").mkdir()


case("old-runs", "report-of-a-read-only-run", ["report", "m", "--results", "{results}"],
     setup=_summary_is_a_folder, expect=0, out=("100.0",),
     err=("note: summary.csv and summary.txt not refreshed in",), subprocess=True)

# --- old runs on disk ------------------------------------------------------------------------

_R = ["report", "m", "--results", "{results}"]
case("old-runs", "truncated-result", _R,
     setup=lambda d: _a_run(d, {"a-r1": _result("a-r1"), "b-r1": json.dumps(_result("b-r1"))[:40]}),
     expect=0, out=("100.0",), err=("warning: skipping cell b-r1", "unreadable"),
     subprocess=True)
case("old-runs", "unknown-status", _R,
     setup=lambda d: _a_run(d, {"a-r1": _result("a-r1"), "b-r1": _result("b-r1", "exploded")}),
     expect=0, out=("100.0",), err=("skipping cell b-r1", "status: unknown status 'exploded'"))
case("old-runs", "truncated-plan", _R, setup=lambda d: _a_run(d, plan='{"cells": ['),
     expect=0, out=("100.0",), err=("plan.json", "using the cells found on disk"))
case("old-runs", "result-not-an-object", _R, setup=lambda d: _a_run(d, {"a-r1": "[1, 2]"}),
     expect=0, err=("skipping cell a-r1", "expected a JSON object"))
case("old-runs", "history-with-a-damaged-run", ["history", "m", "--results", "{results}"],
     setup=lambda d: (_a_run(d), _a_run(d, {"a-r1": "{"}, run="20260102-000000-abcd")),
     expect=0, err=("skipping cell a-r1",))


# hostile files anywhere under the results: every reader skips them with a warning (issue 24,
# item 7), and what it writes out is standard JSON
_DEEP_RUN = lambda d: _a_run(d, {"a-r1": _result("a-r1"),  # noqa: E731
                                 "b-r1": "[" * 100000 + "]" * 100000})
_LONG_RUN = lambda d: _a_run(d, {"a-r1": _result("a-r1"),  # noqa: E731
                                 "b-r1": '{"cell_id": "b-r1", "repeat": ' + "9" * 5000 + "}"})
_INFINITE_RUN = lambda d: _a_run(  # noqa: E731
    d, {"a-r1": json.dumps(_result("a-r1")).replace("100.0", "1e999")},
    run_json=f'{{"run_id": "{RUN}", "matrix": "m", "started_at": Infinity, '
             '"finished_at": 1e999}')
for _name, _argv, _setup, _out, _err in [
    ("runs-with-a-result-nested-100000", ["runs"], _DEEP_RUN, "m", "nested too deeply"),
    ("report-with-a-result-nested-100000", ["report", "m"], _DEEP_RUN, "100.0",
     "skipping cell b-r1"),
    ("history-with-a-result-nested-100000", ["history", "m"], _DEEP_RUN, "100.0",
     "nested too deeply"),
    ("export-with-a-result-nested-100000", ["export", "m", "--format", "json"], _DEEP_RUN,
     '"cell_id": "a-r1"', "nested too deeply"),
    ("report-with-a-5000-digit-number", ["report", "m"], _LONG_RUN, "100.0",
     "a number too long to read"),
    ("runs-with-infinite-times", ["runs"], _INFINITE_RUN, "m", ""),
    ("export-of-infinite-numbers-is-json", ["export", "m", "--format", "json"], _INFINITE_RUN,
     '"cell_id": "a-r1"', ""),
]:
    case("old-runs", _name, [*_argv, "--results", "{results}"], setup=_setup, expect=0,
         out=(_out,), err=(_err,) if _err else (), absent=("Infinity", "NaN"),
         subprocess=_name.startswith("runs-with-a-result"))


def _index_replaced_by(kind: str) -> Callable[[Path], None]:
    """A run, and in the index file's place a truncated index, a folder or a FIFO."""
    def setup(d: Path) -> None:
        _a_run(d)
        index = d / "results" / ".orchestrate-index.sqlite"
        if kind == "truncated":
            from orchestrator.cli import main as cli

            cli(["runs", "--results", str(d / "results")])  # a real index, then cut
            index.write_bytes(index.read_bytes()[:3000])
        elif kind == "folder":
            index.mkdir()
        else:
            os.mkfifo(index)

    return setup


def _index_rebuilt(d: Path) -> None:
    index = d / "results" / ".orchestrate-index.sqlite"
    assert index.is_file() and index.read_bytes().startswith(b"SQLite format 3")
    assert list((d / "results").glob(".orchestrate-index.sqlite.damaged-*"))


for _kind in ("truncated", "folder", "fifo"):
    case("old-runs", f"index-{_kind}-is-rebuilt", ["runs", "--results", "{results}"],
         setup=_index_replaced_by(_kind), expect=0, out=("m",), absent=("read-only",),
         err=("was damaged",), check=_index_rebuilt, subprocess=_kind == "fifo")


def _resume_setup(damage: str) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        from orchestrator.plan.matrix import load_matrix
        from orchestrator.sweep import plan_json

        (d / "m.toml").write_text(mx())
        matrix = load_matrix(d / "m.toml")
        plan = json.dumps(plan_json(matrix, "process"))
        _a_run(d, {}, plan=plan[:30] if damage == "plan" else plan,
               run_json="{" if damage == "run" else "{}")

    return setup


case("old-runs", "resume-truncated-plan", ["matrix", "{dir}/m.toml", "--resume", "--results",
                                           "{results}"],
     setup=_resume_setup("plan"), err=("plan.json: unreadable",))
case("old-runs", "resume-truncated-run", ["matrix", "{dir}/m.toml", "--resume", "--results",
                                          "{results}"],
     setup=_resume_setup("run"), err=("run.json: unreadable",))



_HELD: list[Any] = []  # locks the cases below hold for as long as the test process runs


def _run_in_use(d: Path) -> None:
    """A run that another sweep is working in: its run folder's lock is held (by this test
    process, as a sweep or a --resume holds it while it runs)."""
    from orchestrator.results.folders import folder_lock

    _resume_setup("none")(d)
    run = d / "results" / "m" / RUN
    _HELD.append(folder_lock.acquire(run / ".lock",
                                     argv=["orchestrate", "matrix", "m.toml", "--resume"]))


case("old-runs", "resume-of-a-run-in-use", ["matrix", "{dir}/m.toml", "--resume", "--results",
                                            "{results}"],
     setup=_run_in_use, err=("--resume: run 20260101-000000-abcd is in use by another sweep "
                             "(held by pid ", ": orchestrate matrix m.toml --resume)"))


def _narrow_run(d: Path) -> None:
    """A run that ran only ``--only batch_size=8`` of a two-cell matrix."""
    from orchestrator.plan.matrix import filter_cells, load_matrix
    from orchestrator.sweep import plan_json

    (d / "m.toml").write_text(mx(axes="batch_size = [8, 16]"))
    narrow = filter_cells(load_matrix(d / "m.toml"), ["batch_size=8"])
    _a_run(d, {}, plan=json.dumps(plan_json(narrow, "process")))


case("old-runs", "resume-with-a-wider-only", ["matrix", "{dir}/m.toml", "--resume", "--results",
                                              "{results}"],
     setup=_narrow_run, err=("--resume: 1 of the selected cells are not in run",
                             "resume with the options it ran with (--only batch_size=8)"))

def _stray_only_night(d: Path) -> None:
    """Three nights of two configurations, then one made with ``--only gpus=1``."""
    from results_support import Config, day, params, run_id, write_run

    both = [Config(params(gpus=1), [100.0]), Config(params(gpus=8), [800.0])]
    for n in (1, 2, 3):
        write_run(d / "results", "m", run_id(n), both, started=day(n))
    write_run(d / "results", "m", run_id(4), both[:1], started=day(4),
              argv=["orchestrate", "matrix", "m.toml", "--only", "gpus=1"])


# issue 23: a stray --only made the nightly gate go green ("1 dropped", rc 0)
case("old-runs", "history-gate-with-a-stray-only",
     ["history", "m", "--results", "{results}", "--fail-on-regression"], setup=_stray_only_night,
     expect=1, out=("DROPPED (--only)", "800.0", "unless --allow-dropped"))
case("old-runs", "history-gate-allow-dropped",
     ["history", "m", "--results", "{results}", "--fail-on-regression", "--allow-dropped"],
     setup=_stray_only_night, expect=0, out=("dropped (--only)", "allowed (--allow-dropped)"))

# issue 23: one run-name grammar; latest resolved when the results hold one matrix
for _name, _argv, _expect, _text in [
    ("report-run-matrix-prefixed", ["report", "--run", "m:latest"], 0, f"results/m/{RUN}"),
    ("report-run-latest-one-matrix", ["report", "--run", "latest"], 0, f"results/m/{RUN}"),
    ("report-run-other-matrix", ["report", "m", "--run", "x:latest"], 2,
     "--run: x:latest is a run of x, not of m"),
    ("compare-latest-one-matrix", ["compare", "latest", f"m:{RUN}", "--allow-same"], 0,
     f"A: m:{RUN}"),
    ("export-run-latest-one-matrix", ["export", "--run", "latest"], 0, RUN),
    ("clean-run-unknown-matrix", ["clean", "--run", "nosuch:latest"], 2, "--run: "),
]:
    case("old-runs", _name, [*_argv, "--results", "{results}"], files={"m.toml": mx()},
         setup=_a_run, expect=_expect, **({"out": (_text,)} if _expect == 0 else
                                          {"err": (_text,)}))
# issue 23: the nearest name for a misspelt command and --only key
case("cli", "command-misspelt", ["mtrix", "{dir}/m.toml"], files={"m.toml": mx()},
     err=("did you mean 'matrix'?",))
case("cli", "only-key-misspelt", ["plan", "{dir}/m.toml", "--only", "batchsize=8"],
     files={"m.toml": mx()}, err=("--only: batchsize: unknown parameter; did you mean "
                                  "batch_size?",))

# --- can it run: the semantic checks (orchestrator/backends/checks.py)
# ---------------------------------
# A cell that cannot run where it is planned is refused before anything is built or launched,
# naming the field where its value is set; what cannot be checked is a note, not an error.

GPU = """\
[matrix]
backend = "docker"
{matrix}
[workload]
{hw}iterations = 1
warmup = 0
{workload}
[axes]
{axes}
{extra}
[hardware.v100]
device = "cuda"
gpu = "V100"
image = "ngc-pytorch"
image_vars = {{ base_tag = "23.10-py3" }}
{profile}
{after}"""

GAUDI = """
[hardware.gaudi]
device = "hpu"
gpu = "HL-205"
image = "habana"
container = { runtime = "habana" }
"""


def gx(matrix: str = "", workload: str = "", axes: str = "", extra: str = "",
       profile: str = "", after: str = "", hw: str | None = "v100") -> str:
    """A small valid GPU matrix (a V100 on NGC 23.10, docker backend) with lines added;
    ``hw``: the [workload] hardware (None: none, e.g. for a hardware axis)."""
    return GPU.format(matrix=matrix, workload=workload, axes=axes, extra=extra,
                      profile=profile, after=after, hw=f'hardware = "{hw}"\n' if hw else "")


def hx(workload: str = "", axes: str = "", env: str = "") -> str:
    """A small valid Gaudi matrix with lines added."""
    return gx(workload=workload, axes=axes, after=GAUDI + env, hw="gaudi")


_NO_RUN_FOLDER = lambda d: None if not (d / "results").exists() else (  # noqa: E731
    _ for _ in ()).throw(AssertionError("a run folder was created"))

for _name, _text, _field, _more in [
    ("made-up-arch", gx(axes='arch = ["resnet50", "resnxt101_32x4d"]'), "axes.arch[1]",
     ("did you mean 'resnext101_32x4d'",)),
    ("made-up-arch-in-workload", gx(workload='arch = "resnet5o"'), "workload.arch",
     ("did you mean 'resnet50'",)),
    ("made-up-arch-in-include", gx(extra='[[include]]\nhardware = "v100"\narch = "vgg17"'),
     "include[0].arch", ("not a model the workload can build",)),
    ("made-up-arch-in-zip", gx(extra='[[zip]]\narch = ["resnet18", "reznet18"]\n'
                                     "batch_size = [8, 16]"),
     "zip[0].arch[1]", ("not a model",)),
    ("compile-on-torch-1.x", gx(workload='compile = "default"',
                                profile="").replace("23.10-py3", "23.02-py3"),
     "workload.compile", ("needs torch >= 2.0", "torch 1.14.0a0+44dac51",
                          "hardware.v100.image_vars.base_tag: NGC PyTorch 23.02")),
    ("refused-release", gx().replace("23.10-py3", "23.04-py3"),
     "hardware.v100.image_vars.base_tag", ("Python 3.8", "pick 23.06 or 23.07")),
    ("release-below-the-table", gx().replace("23.10-py3", "19.10-py3"),
     "hardware.v100.image_vars.base_tag", ("older than the workload's floor",)),
    ("seed-release-for-the-workload", gx().replace("23.10-py3", "21.03-py3"),
     "hardware.v100.image_vars.base_tag",
     ("not offered for the workload", "torch 1.9.0a0+df837d0", "for the workload pick 23.06")),
    ("singularity-on-docker", gx(profile="").replace('image = "ngc-pytorch"',
                                                      'image = "singularity"'),
     "hardware.v100.image", ("singularity definition", "docker backend")),
    ("singularity-on-ssh", gx(matrix='hosts = "h.toml"').replace('backend = "docker"',
                                                                  'backend = "ssh"')
     .replace('image = "ngc-pytorch"', 'image = "singularity"'),
     "hardware.v100.image", ("ssh backend",)),
    ("no-image-on-docker", mx(matrix='backend = "docker"'), "hardware.cpu.image",
     ("runs each cell in a container",)),
    ("bf16-on-v100", gx(workload='precision = "bf16"'), "workload.precision",
     ("compute capability 8.0", "V100, compute capability 7.0")),
    ("bf16-on-t4-by-capability", gx(axes='precision = ["amp", "bf16"]')
     .replace('gpu = "V100"', 'compute_capability = "7.5"'), "axes.precision[1]",
     ("compute capability 7.5",)),
    ("amp-on-gaudi", hx(workload='precision = "amp"'), "workload.precision",
     ("Gaudi's mixed precision is bf16",)),
    ("amp-on-cpu", mx(workload='precision = "amp"'), "workload.precision",
     ("on the CPU", "use bf16")),
    ("cuda-graphs-on-cpu", mx(workload="cuda_graphs = true"), "workload.cuda_graphs",
     ("need a CUDA GPU",)),
    ("cuda-graphs-on-gaudi", hx(workload="cuda_graphs = true"), "workload.cuda_graphs",
     ("device 'hpu'",)),
    ("nsys-on-cpu", mx(workload='profiler = "nsys"'), "workload.profiler",
     ("profiles CUDA GPUs",)),
    ("ncu-on-gaudi", hx(workload='profiler = "ncu"'), "workload.profiler",
     ("Nsight Compute (ncu) profiles CUDA GPUs",)),
    ("nsys-in-an-image-without-it", gx(workload='profiler = "nsys"')
     .replace('image = "ngc-pytorch"\nimage_vars = { base_tag = "23.10-py3" }',
              'image = "habana"'), "workload.profiler", ("does not ship Nsight Systems",)),
    ("ncu-on-pascal", gx(workload='profiler = "ncu"').replace('"V100"', '"P100"'),
     "workload.profiler", ("Volta",)),
    ("compile-on-pascal", gx(workload='compile = "max-autotune"').replace('"V100"', '"P100"'),
     "workload.compile", ("Triton", "7.0")),
    ("hpu_mode-on-cuda", gx(workload='hpu_mode = "lazy"'), "workload.hpu_mode",
     ("applies to Gaudi profiles",)),
    ("compile-on-gaudi", hx(workload='compile = "default"'), "workload.compile",
     ('hpu_mode = "compile"',)),
    ("lazy-mode-in-profile-env", hx(env='env = { PT_HPU_LAZY_MODE = "1" }'),
     "hardware.gaudi.env.PT_HPU_LAZY_MODE", ("per-cell choice",)),
    ("compile-hpu_mode-on-old-habana-torch",
     hx(workload='hpu_mode = "compile"', env='image_vars = { torch_version = "1.13.1" }'),
     "workload.hpu_mode", ("needs torch >= 2.0",)),
    ("pretrained-dle-model", gx(workload='arch = "se_resnext101_32x4d"\npretrained = true'),
     "workload.pretrained", ("no pretrained weights",)),
    ("baseline-unknown-key", mx(matrix='baseline = "hardwre=cpu"'), "matrix.baseline",
     ("did you mean 'hardware'",)),
    ("baseline-bad-value", mx(matrix='baseline = "gpus=one"'), "matrix.baseline",
     ("not a value of gpus",)),
    ("baseline-no-cell", mx(matrix='baseline = "hardware=v100"'), "matrix.baseline",
     ("no cell has hardware = v100", "the cells have hardware cpu")),
    ("baseline-no-pair", mx(matrix='baseline = "batch_size=8"',
                            extra='[[zip]]\nbatch_size = [8, 16]\nimage_size = [32, 64]'),
     "matrix.baseline", ("no cell has a batch_size = 8 row to compare with",)),
    ("capability-on-cpu", mx(hardware='compute_capability = "8.0"'), "hardware.cpu",
     ("describes a CUDA GPU",)),
]:
    bad_matrix("can-it-run", _name, _text, _field, err=_more,
               subprocess=_name in ("made-up-arch", "compile-on-torch-1.x",
                                    "singularity-on-docker"))

# releases: per host (release = "auto") and as an axis (ngc_release)
for _name, _text, _field, _more in [
    ("release-newest", gx(profile='release = "newest"'), "hardware.v100.release",
     ("Input should be 'auto'",)),
    ("forward-compat-without-auto", gx(profile="forward_compat = true"), "hardware.v100",
     ("forward_compat is how release = 'auto' picks",)),
    ("auto-without-image", mx(hardware='release = "auto"'), "hardware.cpu",
     ("give an image template",)),
    ("auto-and-base_tag", gx(profile='release = "auto"'),
     "hardware.v100.image_vars.base_tag", ("which release = 'auto' chooses per host",)),
    ("auto-with-a-fixed-parent", gx(profile='release = "auto"').replace(
        'image = "ngc-pytorch"\nimage_vars = { base_tag = "23.10-py3" }',
        'image = "bitfusion"\nimage_vars = { parent_image = "lab/pytorch:1" }'),
     "hardware.v100.image_vars.parent_image", ("fixes the base image",)),
    ("ngc_release-malformed", gx(axes='ngc_release = ["24.5"]'), "axes.ngc_release[0]",
     ("should match pattern",)),
    ("ngc_release-refused", gx(axes='ngc_release = ["24.05", "23.04"]'), "axes.ngc_release[1]",
     ("NGC PyTorch 23.04", "not offered", "pick 23.06 or 23.07")),
    ("ngc_release-below-the-table", gx(axes='ngc_release = ["19.10"]'), "axes.ngc_release[0]",
     ("older than the workload's floor",)),
    ("ngc_release-on-process", mx(axes='ngc_release = ["24.05"]'), "axes.ngc_release[0]",
     ("the process backend runs this machine's Python instead",)),
    ("ngc_release-on-habana", hx(axes='ngc_release = ["24.05"]'), "axes.ngc_release[0]",
     ("builds 'habana', which takes none",)),
    ("ngc_release-with-base_image", gx(axes='ngc_release = ["24.05"]').replace(
        'base_tag = "23.10-py3"', 'base_image = "lab/pytorch:1"'),
     "hardware.v100.image_vars.base_image", ("which the cells' ngc_release = 24.05 is to pick",)),
    ("ngc_release-with-auto", gx(axes='ngc_release = ["24.05"]').replace(
        'image_vars = { base_tag = "23.10-py3" }', 'release = "auto"'),
     "axes.ngc_release[0]", ("has release = 'auto'",)),
]:
    bad_matrix("can-it-run", _name, _text, _field, err=_more)

good_run_later = [
    ("release-axis", gx(axes='ngc_release = ["24.05", "24.10", "25.01"]',
                        matrix='baseline = "ngc_release=24.05"').replace('"V100"', '"H100"'),
     3, ("hardware v100, ngc_release 25.01 (docker backend): NGC PyTorch 25.01 (torch "
         "2.6.0a0+ecf3bae", "release comparison")),
    ("release-auto", gx().replace('image_vars = { base_tag = "23.10-py3" }',
                                  'release = "auto"'), 1,
     ("NGC PyTorch chosen per host from its driver (release = 'auto')",
      "23.06..24.12 possible")),  # a V100: the releases that still run Volta
]

# every problem at once: three profiles, three kinds of problem
case("can-it-run", "every-problem-at-once", ["validate", "{dir}/m.toml"],
     files={"m.toml": gx(workload='compile = "default"', axes='arch = ["resnet50", "resnet5"]',
                         after='[hardware.sing]\ndevice = "cuda"\nimage = "singularity"\n'
                               + GAUDI, extra="")
            .replace("23.10-py3", "23.02-py3")
            .replace('hardware = "v100"\n', "")
            .replace("[axes]", '[axes]\nhardware = ["v100", "sing"]')},
     err=("problems:", "m.toml: axes.arch[1]", "m.toml: workload.compile",
          "m.toml: hardware.v100.image_vars.base_tag", "m.toml: hardware.sing.image"))
# plan and matrix refuse too, before a run folder exists
bad_matrix("can-it-run", "plan-refuses", gx(workload='arch = "resnet5o"'), "workload.arch",
           command=("plan",))
bad_matrix("can-it-run", "matrix-refuses-before-a-run-folder",
           mx(workload='arch = "resnet5o"'), "workload.arch",
           command=("matrix", "--results", "{dir}/results"), check=_NO_RUN_FOLDER)
bad_matrix("can-it-run", "dry-run-refuses", gx(workload='precision = "bf16"'),
           "workload.precision", command=("matrix", "--dry-run", "--results", "{dir}/results"),
           check=_NO_RUN_FOLDER)
bad_matrix("can-it-run", "validate-for-another-backend", mx(), "hardware.cpu.image",
           command=("validate", "--backend", "docker"))
case("can-it-run", "validate-for-an-unknown-backend",
     ["validate", "{dir}/m.toml", "--backend", "apptainer"], files={"m.toml": mx()},
     err=("--backend: unknown backend 'apptainer'",))
bad_matrix("can-it-run", "cross-stack-baseline-strict",
           gx(matrix='baseline = "hardware=v100"', axes='hardware = ["v100", "new"]', hw=None,
              after='[hardware.new]\ndevice = "cuda"\ngpu = "V100"\nimage = "ngc-pytorch"\n'
                    'image_vars = { base_tag = "24.05-py3" }\n'),
           "matrix.baseline", command=("validate", "--strict"),
           err=("m.toml: matrix.baseline: compares hardware 'new' (NGC PyTorch 24.05",
                "with 'v100' (NGC PyTorch 23.10"))


#: The files a Bitfusion image copies into its build context (the lab's own client and CA),
#: next to the matrix.
BITFUSION_FILES = {"bitfusion-client.deb": b"!<arch>\n", "bitfusion-ca.crt": "-----BEGIN\n"}
_BF_FILES = 'client_deb = "bitfusion-client.deb", ca_cert = "bitfusion-ca.crt"'


def good_run(name: str, text: str, cells: int, out: tuple[str, ...] = (),
             argv: tuple[str, ...] = ("validate",), gpu: str = "V100") -> None:
    """A matrix the checks must accept (exit 0), with ``out`` on stdout, on a machine with a
    ``gpu`` (the docker backend's cells run on this machine's GPUs; a stand-in)."""
    files: dict[str, str | bytes] = {"m.toml": text}
    if 'wrapper = "bitfusion"' in text:
        files.update(BITFUSION_FILES)
    case("can-it-run", name, [*argv, "{dir}/m.toml"], files=files, expect=0,
         out=(f"ok ({cells} cell{'' if cells == 1 else 's'})", *out) if argv == ("validate",)
         else out, gpu=gpu)


for _name, _text, _cells, _out in good_run_later:
    good_run(_name, _text, _cells, _out, gpu="H100" if _name == "release-axis" else "V100")
good_run("dle-resnext-exists", gx(workload='arch = "resnext101_32x4d"'), 1,
         ("NGC PyTorch 23.10 (torch 2.1.0a0+32f93b1",))
good_run("dle-se-resnext-exists", gx(axes='arch = ["resnext101_32x4d", "se_resnext101_32x4d"]'),
         2)
good_run("gaudi-modes", hx(axes='hpu_mode = ["eager", "lazy", "compile"]\n'
                                'precision = ["bf16", "fp32"]'), 6,
         ("Habana PyTorch installer 1.18.0 (torch 2.4.0",), gpu="Gaudi2")
good_run("bf16-on-a100", gx(workload='precision = "bf16"').replace('"V100"', '"A100-SXM4-80GB"'),
         1, gpu="A100")
good_run("bf16-on-an-unnamed-gpu", gx(workload='precision = "bf16"')
         .replace('gpu = "V100"\n', ""), 1, ("note:", "bf16 not checked"))
good_run("gpu-typo-is-a-note", gx().replace('"V100"', '"V1OO"'), 1,
         ("note:", "did you mean 'V100'"))
good_run("nsys-and-ncu-in-ngc",
         gx(workload="profile_iterations = 1", axes='profiler = ["nsys", "ncu"]'), 2)
good_run("unknown-base-image-is-a-note",
         gx(workload='arch = "resnext101_32x4d"').replace(
             'base_tag = "23.10-py3"', 'base_image = "registry.lab/pytorch:custom"'), 1,
         ("note:", "not an NGC PyTorch or Habana release"))
good_run("bool-baseline", mx(matrix='baseline = "channels_last=false"',
                             axes="channels_last = [true, false]"), 2)
good_run("same-stack-bitfusion-baseline",
         gx(matrix='baseline = "hardware=v100"', axes='hardware = ["v100", "bf"]', hw=None,
            after='[hardware.bf]\ndevice = "cuda"\ngpu = "V100"\nimage = "bitfusion"\n'
                  'wrapper = "bitfusion"\nimage_vars = { base_tag = "23.10-py3", ' + _BF_FILES
                  + ' }\n'), 2,
         ("hardware bf (docker backend): NGC PyTorch 23.10",))
_BF = gx(axes='hardware = ["v100", "bf"]', hw=None,
         after='[hardware.bf]\ndevice = "cuda"\ngpu = "V100"\nimage = "bitfusion"\n'
               'wrapper = "bitfusion"\nimage_vars = { base_tag = "23.10-py3", client_deb = '
               '"client.deb", ca_cert = "ca.crt" }\n')
lacks("can-it-run", "missing-build-file-is-refused", _BF, "hardware.bf.image_vars.client_deb",
      err=("file or folder", "m.toml: hardware.bf.image_vars.ca_cert"), gpu="V100")
lacks("can-it-run", "missing-build-file-strict", _BF, "hardware.bf.image_vars.client_deb",
      command=("validate", "--strict"), err=("hardware.bf.image_vars.ca_cert",), gpu="V100")
lacks("can-it-run", "missing-build-file-dry-run", _BF, "hardware.bf.image_vars.client_deb",
      command=("matrix", "--dry-run", "--results", "{dir}/results"), check=_NO_RUN_FOLDER,
      gpu="V100", out=("image for bf: not planned here", "v100-g1-bs64-fp32-r1:",
                       "would not start here"))
good_run("cross-stack-baseline-warns",
         gx(matrix='baseline = "hardware=v100"', axes='hardware = ["v100", "bf"]', hw=None,
            after='[hardware.bf]\ndevice = "cuda"\ngpu = "V100"\nimage = "bitfusion"\n'
                  'wrapper = "bitfusion"\nimage_vars = { ' + _BF_FILES + ' }\n'), 2,
         ("warning:", "different software stacks", "NGC PyTorch 24.05"))
good_run("process-backend-runs-this-python", mx(workload='arch = "resnext101_32x4d"'), 1,
         ("this machine's Python (torch ",))
good_run("plan-accepts-resnext", gx(workload='arch = "resnext101_32x4d"'), 1,
         ("v100-g1-bs64-fp32-r1",), argv=("plan",))


# --- command templates: another program in a cell ---------------------------------------------

_CMD = """
[commands.lab]
command = "{{python}} ./bench.py -b {{batch_size}} {command} {{flags}}"
{lines}
[commands.lab.placeholders.flags]
param = "precision"
values = {{ fp32 = [], bf16 = ["--bf16"]{values} }}
"""


def cx(command: str = "", lines: str = "", values: str = "", workload: str = 'program = "lab"',
       axes: str = "", matrix: str = "", hardware: str = "", more: str = "") -> str:
    """A matrix whose cells run the command template ``lab`` (``{flags}`` maps precision)."""
    return mx(matrix=matrix, workload=workload, axes=axes, hardware=hardware,
              extra=_CMD.format(command=command, lines=lines, values=values) + more)


for _name, _text, _field, _more in [
    ("placeholder-typo", cx("--size {image_sise}"), "commands.lab.command",
     ("unknown placeholder {image_sise}", "did you mean {image_size}?")),
    ("unclosed-quote", cx("--name 'a b"), "commands.lab.command",
     ("cannot be split into words",)),
    ("lone-brace", cx("--x {"), "commands.lab.command", ("literal braces",)),
    ("format-spec", cx("--x {batch_size:>4}"), "commands.lab.command", ("has a format",)),
    ("attribute-access", cx("--x {arch.__class__}"), "commands.lab.command",
     ("is no placeholder name",)),
    ("quoted-line-break", cx("'a\\nb'"), "commands.lab.command", ("control character",)),
    ("command-key-typo", cx(lines='comand = "x"'), "commands.lab.comand",
     ("did you mean 'command'",)),
    ("launcher-unknown", cx(lines='launcher = "mpirun"'), "commands.lab.launcher",
     ("'torchrun' or 'self'",)),
    ("workdir-relative", cx(lines='workdir = "ConvNets"'), "commands.lab.workdir",
     ("absolute path",)),
    ("workdir-bad-reference", cx(lines='workdir = "$env:1X"'), "commands.lab.workdir",
     ("absolute path",)),
    ("env-name", cx(lines='env = { "A B" = "1" }'), "commands.lab.env",
     ("should match pattern",)),
    ("figures-parser-typo", cx(lines='figures = { parser = "dlloger" }'),
     "commands.lab.figures.parser", ("'workload', 'dllogger', 'regex'", "(got 'dlloger')")),
    ("figures-regex-without-group", cx(lines='figures = { parser = "regex", regex = [{ name = '
                                             '"x", pattern = "ips" }] }'),
     "commands.lab.figures.regex[0].pattern", ("has no group capturing the number",)),
    ("figures-regex-lookaround", cx(lines='figures = { parser = "regex", regex = [{ name = '
                                          '"x", pattern = "(?<=ips )(?P<value>[0-9]+)" }] }'),
     "commands.lab.figures.regex[0].pattern", ("invalid perl operator", "RE2 syntax")),
    ("figures-regex-backreference", cx(lines='figures = { parser = "regex", regex = [{ name = '
                                             '"x", pattern = "(?P<value>[0-9]+) \\\\1" }] }'),
     "commands.lab.figures.regex[0].pattern", ("backreferences and lookaround",)),
    ("unknown-program", cx(workload="", axes='program = ["workload", "lba"]'),
     "axes.program[1]", ("unknown program 'lba'", "did you mean 'lab'?")),
    ("unknown-program-of-a-profile", cx(workload="", hardware='program = "dle"'),
     "hardware.cpu.program", ("unknown program 'dle'",)),
    ("command-named-workload", mx(extra='[commands.workload]\ncommand = "prog"'),
     "commands.workload", ("our own workload's program name",)),
    ("unmapped-value", cx(axes='precision = ["fp32", "amp"]'),
     "commands.lab.placeholders.flags.values", ("no entry for precision = 'amp'",
                                                "(cell cpu-g1-bs64-amp)")),
    ("mapping-key-not-a-value", cx(values=', ampp = ["--amp"]'),
     "commands.lab.placeholders.flags.values.ampp", ("'ampp' is not a value of precision",)),
    ("mapping-line-break", cx(values=', amp = ["--a\\nmp"]'),
     "commands.lab.placeholders.flags.values.amp", ("should match pattern",)),
    ("mapping-param-typo", cx().replace('param = "precision"', 'param = "precison"'),
     "commands.lab.placeholders.flags.param", ("did you mean {precision}?",)),
    ("mapping-not-used", cx().replace("{{flags}}", "").replace("{flags}", ""),
     "commands.lab.placeholders.flags", ("not used: the command has no {flags}",)),
    ("list-inside-a-word", cx("--f={flags}").replace(" {flags}\"", "\""),
     "commands.lab.placeholders.flags.values.fp32", ("0 argv items", "sits inside a word")),
    ("builtin-redefined", cx("{output_dir}", more='[commands.lab.placeholders.output_dir]\n'
                                                  'param = "data"\nvalues = { synthetic = "x" }'),
     "commands.lab.placeholders.output_dir", ("is given by orchestrate",)),
    ("value-would-be-an-option", cx("{data}", workload='program = "lab"\ndata = "--help"'),
     "workload.data", ("starts with '-'", "./--help")),  # refused for every program (item 17)
    ("self-launch-on-several-nodes", cx(lines='launcher = "self"',
                                        hardware="multi_node = true"),
     "commands.lab.launcher", ("'self' starts the program once",)),
    ("torch-profiler-in-another-program", cx(workload='program = "lab"\nprofiler = "torch"'),
     "workload.profiler", ("inside our workload",)),
    ("our-cells-read-by-another-parser", mx(extra='[figures]\nparser = "dllogger"'),
     "figures.parser", ("print JSON lines",)),
]:
    bad_matrix("commands", _name, _text, _field, err=_more,
               subprocess=_name in ("placeholder-typo", "unmapped-value"))

lacks("commands", "workdir-variable-not-set",
      cx(lines='workdir = "$env:ORCHESTRATE_TEST_UNSET_DLE_DIR"'), "commands.lab.workdir",
      command=("matrix", "--results", "{dir}/results"), check=_NO_RUN_FOLDER,
      err=("ORCHESTRATE_TEST_UNSET_DLE_DIR", "not set"))
# hostile values are one argv item each: accepted, and the plan shows them unharmed
good_matrix("commands", "hostile-values-are-plain-text",
            cx("--data={data} {data}", workload="program = \"lab\"",
               axes='data = ["/d/a b", "/d/x; rm -rf ~", "/d/$(touch PWNED)", "/d/`id`", '
                    '"/d/it\'s \\"q\\""]'), 5,
            check=lambda d: None if not (d / "PWNED").exists() else (_ for _ in ()).throw(
                AssertionError("a value ran")))
good_matrix("commands", "side-by-side-baseline", cx(workload="", matrix='baseline = '
                                                    '"program=lab"',
                                                    axes='program = ["workload", "lab"]'), 2)
case("commands", "unused-parameter-is-a-warning", ["validate", "{dir}/m.toml"],
     files={"m.toml": cx(axes="seed = [1, 2]")}, expect=0,
     out=("ok (2 cells)", "warning:", "m.toml: commands.lab.command: seed varies among the "
          "cells of program 'lab'"))


# --- Apptainer / Singularity: where it can run, its options, what must exist where cells run --

_APPT = 'runtime = "apptainer"\nimage = "singularity"\n'
for _name, _text, _field, _more in [
    ("runtime-on-the-docker-backend", mx(matrix='backend = "docker"', hardware=_APPT),
     "hardware.cpu.runtime", ("process, ssh and slurm backends",)),
    ("multi-host-cells-on-ssh", mx(matrix='backend = "ssh"', hardware=_APPT +
                                   'multi_node = true'),
     "hardware.cpu.multi_node", ("one host per cell",)),
    ("singularity-definition-on-docker", mx(matrix='backend = "docker"',
                                            hardware='image = "singularity"'),
     "hardware.cpu.image", ("singularity definition", "pick a Dockerfile template")),
    ("runtime-typo", mx(hardware='runtime = "apptainr"'), "hardware.cpu.runtime",
     ("'docker', 'apptainer' or 'singularity'",)),
    ("docker-runtime-on-the-process-backend", mx(hardware='runtime = "docker"\nimage = '
                                                 '"ngc-pytorch"'),
     "hardware.cpu.runtime", ("docker and ssh backends",)),
    ("options-without-the-runtime", mx(hardware='[hardware.cpu.apptainer]\nbinary = '
                                       '"singularity"'),
     "hardware.cpu", ("set runtime",)),
    ("binary-with-shell-syntax", mx(hardware=_APPT + '[hardware.cpu.apptainer]\nbinary = '
                                    '"apptainer; id"'),
     "hardware.cpu.apptainer.binary", ("should match pattern",)),
    ("bind-source-with-a-colon", mx(hardware=_APPT + '[hardware.cpu.apptainer]\nbinds = '
                                    '[{ source = "/data/a:b", target = "/d" }]'),
     "hardware.cpu.apptainer.binds[0].source", ("separators",)),
    ("bind-target-relative", mx(hardware=_APPT + 'container = { mounts = [{ source = "/data", '
                                'target = "d" }] }'),
     "hardware.cpu.container.mounts[0].target", ()),
    ("release-auto", mx(hardware='runtime = "apptainer"\nimage = "ngc-pytorch"\n'
                        'release = "auto"'),
     "hardware.cpu.release", ("not offered under runtime",)),
    ("no-image-at-all", mx(hardware='runtime = "apptainer"'), "hardware.cpu.image",
     ("ready .sif",)),
    ("image-dir-relative", mx(hardware=_APPT + '[hardware.cpu.apptainer]\nimage_dir = "sif"'),
     "hardware.cpu.apptainer.image_dir", ("should match pattern",)),
    ("extra-arg-not-an-option", mx(hardware=_APPT + '[hardware.cpu.apptainer]\nextra_args = '
                                   '["/other.sif"]'),
     "hardware.cpu.apptainer.extra_args[0]", ("should match pattern",)),
]:
    bad_matrix("apptainer", _name, _text, _field, err=_more,
               subprocess=_name == "runtime-on-the-docker-backend")

# what must exist where the cells run: refused at the sweep's start, every problem at once
lacks("apptainer", "binary-and-bind-source-missing-at-start",
      mx(hardware='runtime = "apptainer"\n[hardware.cpu.apptainer]\n'
                  'binary = "/no/such/apptainer"\nsif = "/no/such/image.sif"\n'
                  'binds = [{ source = "/no/such/data", target = "/data" }]'),
      "hardware.cpu.apptainer.binary", command=("matrix", "--results", "{dir}/results"),
      check=_NO_RUN_FOLDER, err=("not on PATH on localhost",
                                 "m.toml: hardware.cpu.apptainer.binds[0].source",
                                 "/no/such/data does not exist on localhost"))


# --- imports: hostile logs and run folders -----------------------------------------------------
# What `orchestrate import` reads comes from anywhere: each of these was a traceback (issue 24,
# items 4, 6, 10, 15); now a refusal naming the file and line, or an import that writes only
# standard JSON.

_T0 = 1767225600.0  # 2026-01-01


def _dlll(step: Any, data: dict[str, Any], when: Any = None, raw_when: str | None = None) -> str:
    stamp = raw_when if raw_when is not None else json.dumps(str(when or _T0))
    return (f'DLLL {{"timestamp": {stamp}, "type": "LOG", "step": {json.dumps(step)}, '
            f'"data": {json.dumps(data)}}}')


def _raport(first: str | None = None, data: str | None = None, summary: float = 1020.0) -> str:
    """A DLLogger raport as DLE writes it; ``first``: a line put after PARAMETER; ``data``:
    the raw JSON of the second iteration's data."""
    lines = [_dlll("PARAMETER", {"arch": "resnet50", "batch_size": 64, "world_size": 1,
                                 "amp": True})]
    if first is not None:
        lines.append(first)
    for i in range(1, 11):
        if i == 2 and data is not None:
            lines.append(f'DLLL {{"timestamp": "{_T0 + i}", "type": "LOG", "step": [0, {i}], '
                         f'"data": {data}}}')
            continue
        lines.append(_dlll([0, i], {"train.total_ips": 1000.0 + i}, _T0 + i))
    lines.append(_dlll([], {"train.total_ips": summary}, _T0 + 20))
    return "\n".join(lines) + "\n"


def _stdout_log(date: str) -> str:
    return (f"DLL {date} - PARAMETER arch : resnet50  batch_size : 64  world_size : 1  "
            "amp : True\n"
            + "".join(f"DLL 2026-01-01 00:00:{i:02d} - Epoch: 0 Iteration: {i}  "
                      f"train.total_ips : {1000 + i} images/s\n" for i in range(1, 11))
            + "DLL 2026-01-01 00:01:00 - Summary: train.total_ips : 1005.0 images/s\n")


_IMPORT = ["import", "{dir}/raport.json", "--matrix", "imp", "--param", "hardware=v100",
           "--results", "{results}"]
for _name, _text, _err in [
    ("dll-date-month-13", _stdout_log("2024-13-45 10:00:00"),
     ("raport.json: line 1", "'2024-13-45 10:00:00' is not a date")),
    ("dll-date-year-0", _stdout_log("0000-01-01 00:00:00"),
     ("raport.json: line 1", "is not a date")),
    ("dlll-timestamp-nan", _raport(first=_dlll([0, 0], {}, raw_when="NaN")),
     ("raport.json: line 2", "timestamp nan is not a time from 1970 to 2099")),
    ("dlll-timestamp-1e999", _raport(first=_dlll([0, 0], {}, raw_when="1e999")),
     ("raport.json: line 2", "timestamp inf is not a time")),
    ("dlll-timestamp-5000-digits", _raport(first=_dlll([0, 0], {}, raw_when='"' + "1" * 5000
                                                        + '"')),
     ("raport.json: line 2", "(5002 characters) is not a")),
    ("dlll-timestamp-1e15", _raport(first=_dlll([0, 0], {}, when=1e15)),
     ("raport.json: line 2", "is not a time from 1970 to 2099")),
    ("dlll-timestamp-negative", _raport(first=_dlll([0, 0], {}, when=-86400.0)),
     ("raport.json: line 2", "is not a time from 1970 to 2099")),
    ("dlll-number-5000-digits", _raport(data='{"train.total_ips": ' + "1" * 5000 + "}"),
     ("raport.json: line 3", "a number too long to read")),
    ("dlll-nested-100000", _raport(data="[" * 100000 + "]" * 100000),
     ("raport.json: line 3", "nested too deeply")),
]:
    case("imports", _name, _IMPORT, files={"raport.json": _text}, err=_err,
         subprocess=_name == "dlll-nested-100000")


def _expect_standard_json(root: Path) -> None:
    """What orchestrate wrote is standard JSON (the copied source keeps what it said)."""
    written = [p for p in (root / "results").rglob("*") if p.name in (
        "result.json", "run.json", "plan.json", "metrics.jsonl")]
    assert len(written) >= 3, written
    for path in written:
        text = path.read_text()
        assert "Infinity" not in text and "NaN" not in text, path


case("imports", "dlll-infinite-figure-written-as-null", [*_IMPORT, "--warmup", "2"],
     files={"raport.json": _raport(summary=float("inf"))},
     expect=0, out=("(dllogger-raport, ok)",), check=_expect_standard_json)
case("imports", "param-hardware-with-a-dot-accepted",
     ["import", "{dir}/raport.json", "--matrix", "imp", "--param", "hardware=v1.00",
      "--warmup", "2", "--results", "{results}"], files={"raport.json": _raport()}, expect=0,
     out=("-> v1.00-", "| v1.00 "))


def _log_folder(name: str) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        (d / "logs").mkdir()
        (d / "logs" / name).write_text(_raport())

    return setup


case("imports", "pattern-repeat-captures-letters",
     ["import", "{dir}/logs", "--matrix", "imp", "--param", "hardware=v100", "--pattern",
      r"(?P<arch>[a-z0-9]+)_r(?P<repeat>[a-z]+)\.log", "--results", "{results}"],
     setup=_log_folder("resnet50_rx.log"),
     err=("resnet50_rx.log: file name", "repeat='x': not a repeat number"))
case("imports", "pattern-backtracking-cannot-hang",
     ["import", "{dir}/logs", "--matrix", "imp", "--param", "hardware=v100", "--pattern",
      r"(?P<arch>a+)+\.log", "--results", "{results}"],
     setup=_log_folder("a" * 40 + "!.log"), err=("none matches the naming rule",),
     subprocess=True)
case("imports", "pattern-backreference",
     ["import", "{dir}/logs", "--matrix", "imp", "--pattern", r"(?P<arch>a)\1\.log",
      "--results", "{results}"], setup=_log_folder("aa.log"),
     err=("--pattern: does not compile", "RE2 syntax"))


def _copied_run(plan: Any = None, result: str | None = None) -> Callable[[Path], None]:
    """A run folder of ours copied from elsewhere (``{dir}/copy``), with its plan.json or a
    result.json replaced."""
    def setup(d: Path) -> None:
        root = d / "copy"
        (root / "cells" / "a-r1").mkdir(parents=True)
        cell = {"id": "a-r1", "group": "a", "repeat": 1, "hash": "h",
                "params": {"hardware": "cpu"}}
        (root / "plan.json").write_text(json.dumps(plan if plan is not None else
                                                   {"matrix": "m", "cells": [cell]}))
        (root / "run.json").write_text(json.dumps({"run_id": "r", "matrix": "m"}))
        (root / "cells" / "a-r1" / "result.json").write_text(
            result if result is not None else json.dumps(_result("a-r1")))

    return setup


for _name, _setup, _err in [
    ("run-folder-plan-cells-not-a-list", _copied_run({"matrix": "m", "cells": {"a": 1}}),
     ("copy/plan.json: cells", "no 'cells' list")),
    ("run-folder-plan-cell-without-group",
     _copied_run({"matrix": "m", "cells": [{"id": "a-r1", "params": {"hardware": "cpu"}}]}),
     ("copy/plan.json: cells[0]", "needs id, group (text) and params")),
    ("run-folder-result-nested-100000", _copied_run(result="[" * 100000 + "]" * 100000),
     ("copy/cells/a-r1/result.json", "nested too deeply")),
    ("run-folder-result-5000-digits",
     _copied_run(result='{"cell_id": "a-r1", "repeat": ' + "1" * 5000 + "}"),
     ("copy/cells/a-r1/result.json", "a number too long to read")),
]:
    case("imports", _name, ["import", "{dir}/copy", "--results", "{results}"], setup=_setup,
         err=_err)


# links in what is imported are never followed (issue 24, item 10)
_SECRET = "-----BEGIN OPENSSH PRIVATE KEY----- not-for-the-results"


def _linked(rel: str, target: str) -> Callable[[Path], None]:
    """A copied run folder with ``rel`` (under {dir}/copy) a symbolic link to ``target``
    ({dir}/secret.key holds a private key)."""
    def setup(d: Path) -> None:
        _copied_run()(d)
        (d / "secret.key").write_text(_SECRET)
        link = d / "copy" / rel
        link.unlink(missing_ok=True)
        link.symlink_to(target.replace("{dir}", str(d)))

    return setup


def _nothing_of(*names: str) -> Callable[[Path], None]:
    def check(d: Path) -> None:
        for path in (d / "results").rglob("*"):
            assert path.name not in names, path
            assert not path.is_symlink(), path
            if path.is_file():
                assert _SECRET not in path.read_text(errors="replace"), path

    return check


for _name, _rel, _target in [
    ("run-folder-file-linked-to-a-private-key", "cells/a-r1/id_rsa", "{dir}/secret.key"),
    ("run-folder-folder-linked-to-etc", "cells/a-r1/etc", "/etc"),
    ("run-folder-fifo-in-a-cell", "cells/a-r1/pipe", ""),
]:
    case("imports", _name, ["import", "{dir}/copy", "--results", "{results}"],
         setup=_linked(_rel, _target) if _target else lambda d: (
             _copied_run()(d), os.mkfifo(d / "copy" / "cells" / "a-r1" / "pipe")),
         expect=0, out=("a-r1",), err=("not copied",), check=_nothing_of("id_rsa", "etc", "pipe"),
         subprocess=_name == "run-folder-folder-linked-to-etc")
def _run_json_fifo(d: Path) -> None:
    _copied_run()(d)
    (d / "copy" / "run.json").unlink()
    os.mkfifo(d / "copy" / "run.json")


case("imports", "run-folder-run-json-is-a-fifo", ["import", "{dir}/copy", "--results",
     "{results}"], setup=_run_json_fifo, err=("run.json: not a regular file",), subprocess=True)
for _name, _rel in [("run-folder-result-is-a-link", "cells/a-r1/result.json"),
                    ("run-folder-plan-is-a-link", "plan.json"),
                    ("run-folder-cell-folder-is-a-link", "cells/a-r1")]:
    case("imports", _name, ["import", "{dir}/copy", "--results", "{results}"],
         setup=_linked(_rel, "{dir}/secret.key") if _rel != "cells/a-r1" else (
             lambda d: (_copied_run()(d), (d / "elsewhere").mkdir(),
                        os.rename(d / "copy" / "cells" / "a-r1", d / "elsewhere" / "a-r1"),
                        (d / "copy" / "cells" / "a-r1").symlink_to(d / "elsewhere" / "a-r1"))),
         err=(f"copy/{_rel}: a symbolic link: not followed",))


def _logs_with_a_link(d: Path) -> None:
    (d / "logs").mkdir()
    (d / "logs" / "resnet50_amp_bs64_g1.log").write_text(_raport())
    (d / "outside.log").write_text(_raport().replace("1020.0", "1030.0"))
    (d / "logs" / "resnet50_amp_bs64_g1_r2.log").symlink_to(d / "outside.log")


case("imports", "log-folder-link-to-a-file-outside",
     ["import", "{dir}/logs", "--matrix", "imp", "--param", "hardware=v100", "--warmup", "2",
      "--results", "{results}"], setup=_logs_with_a_link, expect=0,
     out=("resnet50_amp_bs64_g1_r2.log (a symbolic link, not followed)", "-> v100-"),
     err=("not followed",))


def _no_import(d: Path) -> None:
    """The import wrote no run: the results hold the damaged run alone."""
    runs = [p.name for p in (d / "results" / "imp").iterdir() if not p.name.startswith(".")]
    assert runs == [RUN], runs


_NO_IMPORT = _no_import


# the matrix an import joins has a damaged run: refused naming its plan (issue 34, item 6;
# it was skipped with a warning, the cells matched against the other runs only)
for _name, _plan, _err in [
    ("target-run-plan-cells-not-a-list", '{"cells": {"a": 1}}', "plan.json: cells: no 'cells'"),
    ("target-run-plan-cell-without-group", '{"cells": [{"id": "a-r1"}]}',
     "plan.json: cells[0]: needs group (text) and params"),
]:
    case("imports", _name, [*_IMPORT, "--warmup", "2"], files={"raport.json": _raport()},
         setup=lambda d, plan=_plan: _a_run(d, name="imp", plan=plan),
         err=(_err, "repair this run's plan"), check=_NO_IMPORT)


# --- issue 34: hardening round 4 --------------------------------------------------------------

# the damaged run of the matrix an import joins (the cases above) and more of its plan
for _name, _plan, _err in [
    ("target-run-plan-not-an-object", "[1, 2]", "plan.json: cells: no 'cells'"),
    ("target-run-plan-cell-params-a-list", '{"cells": [{"group": "a", "params": []}]}',
     "plan.json: cells[0]: needs group (text) and params"),
    ("target-run-plan-truncated", '{"cells": [{"group": "a", "par', "plan.json: unreadable"),
]:
    case("imports", _name, [*_IMPORT, "--warmup", "2"], files={"raport.json": _raport()},
         setup=lambda d, plan=_plan: _a_run(d, name="imp", plan=plan), err=(_err,),
         check=_NO_IMPORT)

# a copied run folder whose plan.json does not describe it
_PLANNED = {"id": "a-r1", "group": "a", "repeat": 1, "hash": "h",
            "params": {"hardware": "cpu", "gpus": 1, "mode": "train"}}
for _name, _cell, _err in [
    ("run-folder-plan-gpus-3-nodes-2", {**_PLANNED, "params": {"hardware": "cpu", "gpus": 3,
                                                               "nodes": 2}},
     ("copy/plan.json: cells[0].params", "give a multiple of nodes")),
    ("run-folder-plan-another-group", {**_PLANNED, "group": "b"},
     ("result.json: group", "the plan says 'b'", "does not describe its cell a-r1")),
    ("run-folder-plan-another-repeat", {**_PLANNED, "repeat": 3},
     ("result.json: repeat", "the plan says 3")),
    ("run-folder-plan-another-parameter", {**_PLANNED, "params": {"hardware": "cpu", "gpus": 2}},
     ("result.json: params.gpus", "1, the plan says 2")),
    ("run-folder-plan-cell-params-a-string", {**_PLANNED, "params": "cpu"},
     ("copy/plan.json: cells[0]", "needs id, group (text) and params")),
]:
    case("imports", _name, ["import", "{dir}/copy", "--results", "{results}"],
         setup=_copied_run({"matrix": "m", "cells": [_cell]}), err=_err, check=_NO_RUN_FOLDER)

# a DLLogger stdout log with a huge step number (ValueError: int max str digits)
for _name, _step, _err in [
    ("dll-epoch-5000-digits", "Epoch: " + "9" * 5000 + " Iteration: 1",
     "a step number of 5000 digits"),
    ("dll-iteration-19-digits", "Epoch: 0 Iteration: " + "1" * 19, "a step number of 19 digits"),
    ("dll-tuple-step-5000-digits", "(0, " + "7" * 5000 + ")", "a step number of 5000 digits"),
]:
    case("imports", _name, _IMPORT, files={"raport.json": _stdout_log("2026-01-01 00:00:00")
                                           .replace("Epoch: 0 Iteration: 5", _step)},
         err=("raport.json: line 6", _err))


def _stack_in_export(d: Path) -> None:
    """The --stack value with a carriage return reads back whole from every CSV export."""
    import csv
    import io

    from orchestrator.results.folders.store import open_store
    from orchestrator.results.reports import export

    with open_store(d / "results") as store:
        out = io.StringIO()
        export.write_csv(store, store.runs(), export.Selection(), out)
    rows = list(csv.DictReader(io.StringIO(out.getvalue(), newline="")))
    assert {r["stack.gpu"] for r in rows} == {"Tesla\rV100 \x1b[31m"}, rows


case("imports", "stack-value-with-a-carriage-return",
     [*_IMPORT, "--warmup", "2", "--stack", "gpu=Tesla\rV100 \x1b[31m"],
     files={"raport.json": _raport()}, expect=0, out=("(dllogger-raport, ok)",),
     check=_stack_in_export)

# regex figures that match everywhere, or no number, on a 1.2 MiB log: a clear refusal at once
_BIG_LOG = "".join(f"step {i} loss 0.5 ips {1000 + i % 7}.5\n" for i in range(40000))
for _name, _pattern, _err in [
    ("figures-empty-match-everywhere", "(?P<value>)", "'' is not a number"),
    ("figures-words-not-numbers", "(?P<value>[a-z]+)", "'step' is not a number"),
    ("figures-optional-group-everywhere", r"(?P<value>\d*)", "'' is not a number"),
    ("figures-any-line", "(?m)^(?P<value>.*)$", "is not a number"),
    ("figures-star-of-nothing", "(?P<value>(?:)*)", "'' is not a number"),
]:
    case("figures", _name, ["import", "{dir}/log.txt", "--matrix", "imp", "--param",
                            "hardware=v100", "--figures", "{dir}/f.toml", "--results",
                            "{results}"],
         files={"log.txt": _BIG_LOG,
                "f.toml": f"[figures]\nparser = \"regex\"\n[[figures.regex]]\n"
                          f"name = \"train.total_ips\"\npattern = '{_pattern}'\n"},
         err=("log.txt: line 1", _err, "not read further"), check=_NO_RUN_FOLDER,
         subprocess=_name == "figures-empty-match-everywhere")

# Slurm extra_args that repeat an option orchestrate sets itself
for _arg, _named in [("--array=0-5%0", "--array"), ("-J other", "--job-name"),
                     ("--output=/tmp/x.out", "--output"), ("--dependency=afterok:1",
                                                           "--dependency"),
                     ("--gres=gpu:8", "--gres"), ("--gpus=2", "--gpus"),
                     ("--arr=0-1", "--array"), ("--partition=big", "--partition")]:
    bad_matrix("slurm-options", f"extra-args{_arg.split('=')[0].replace(' ', '-')}",
               mx(hardware=f'slurm = {{ extra_args = ["{_arg}"] }}'),
               "hardware.cpu.slurm.extra_args", err=(f"orchestrate sets {_named} itself",))

# compare: a run with itself
for _name, _a, _b in [("compare-latest-with-latest", "m:latest", "m:latest"),
                      ("compare-a-run-with-its-prefix", f"m:{RUN}", f"m:{RUN[:15]}"),
                      ("compare-latest-with-its-id", "m:latest", f"m:{RUN}")]:
    case("old-runs", _name, ["compare", _a, _b, "--results", "{results}"], setup=_a_run,
         err=("RUN_B", "a run compared with itself", "--allow-same"))
case("old-runs", "compare-a-run-with-itself-when-asked",
     ["compare", "m:latest", "m:latest", "--allow-same", "--results", "{results}"],
     setup=_a_run, expect=0, out=("+0.0%",))


# writes: a link (to {dir}/victim.txt, beside the results) or a FIFO where a command writes
def _planted(rel: str, kind: str) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        _a_run(d)
        (d / "victim.txt").write_text("precious\n")
        path = d / "results" / rel.replace("{run}", f"m/{RUN}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        if kind == "link":
            path.symlink_to(d / "victim.txt")
        else:
            os.mkfifo(path)

    return setup


def _replaced(rel: str) -> Callable[[Path], None]:
    def check(d: Path) -> None:
        assert (d / "victim.txt").read_text() == "precious\n"
        path = d / "results" / rel.replace("{run}", f"m/{RUN}")
        assert path.is_file() and not path.is_symlink(), path

    return check


for _kind in ("link", "fifo"):
    for _name, _argv, _rel in [
        ("report-summary-csv", ["report", "m"], "{run}/summary.csv"),
        ("report-summary-txt", ["report", "m"], "{run}/summary.txt"),
        ("report-html", ["report", "m", "--html", "{results}/r.html"], "r.html"),
        ("export-out", ["export", "m", "--out", "{results}/e.csv"], "e.csv"),
        ("runs-index", ["runs"], ".orchestrate-index.sqlite"),
    ]:
        case("special-files", f"{_name}-{_kind}", [*_argv, "--results", "{results}"],
             setup=_planted(_rel, _kind), expect=0, check=_replaced(_rel),
             subprocess=_name == "report-summary-csv" and _kind == "fifo")


# --- the user's config file and environment (issue 24, item 9) -------------------------------

_CONFIG = {"ORCHESTRATE_CONFIG": "{dir}/config.toml"}
for _name, _line, _argv, _err in [
    ("results-of-an-unknown-user", 'results = "~nosuchuser/x"', ["runs"],
     ("config.toml: results", "no user 'nosuchuser' here")),
    ("results-of-an-unknown-user-sweep", 'results = "~nosuchuser/x"',
     ["matrix", "{dir}/m.toml"], ("config.toml: results", "no user 'nosuchuser'")),
    ("results-with-a-nul-byte", 'results = "a\\u0000b"', ["matrix", "{dir}/m.toml"],
     ("config.toml: results",)),
    ("results-with-a-nul-byte-runs", 'results = "a\\u0000b"', ["runs"],
     ("config.toml: results",)),
    ("hosts-of-an-unknown-user", 'hosts = "~nosuchuser/h.toml"',
     ["matrix", "{dir}/s.toml", "--dry-run"], ("config.toml: hosts", "no user 'nosuchuser'")),
    ("results-a-number", "results = 5", ["runs"], ("config.toml: results",)),
]:
    case("user-config", _name, _argv, files={"config.toml": _line + "\n", "m.toml": mx(),
                                             "s.toml": re.sub(r"(?m)^hosts = .*$", "",
                                                              _SSH_SMOKE)},
         env=_CONFIG, err=_err, subprocess=_name == "results-of-an-unknown-user")
case("user-config", "results-env-of-an-unknown-user", ["runs"],
     env={"ORCHESTRATE_RESULTS": "~nosuchuser/r"},
     err=("$ORCHESTRATE_RESULTS: '~nosuchuser/r': no user 'nosuchuser'",))
case("user-config", "results-relative-to-the-config-accepted",
     ["matrix", "{dir}/m.toml", "--dry-run"], files={"config.toml": 'results = "res"\n',
                                                     "m.toml": mx()},
     env=_CONFIG, expect=0, out=("/case/res/m/<run id>/",))


# --- say no before the run (issue 23): the machine, one decision, the exact commands ---------

def gm(backend: str, profile: str, workload: str = "", matrix: str = "") -> str:
    """A GPU matrix on ``backend`` whose one profile ``g`` has ``profile``'s lines."""
    return (f'[matrix]\nbackend = "{backend}"\n{matrix}[workload]\nhardware = "g"\n'
            f'iterations = 1\nwarmup = 0\n{workload}[hardware.g]\n{profile}\n')


_CUDA = 'device = "cuda"'
_NGC = 'device = "cuda"\nimage = "ngc-pytorch"\n'
_RUN = ("matrix", "--results", "{dir}/results")
_DRY = ("matrix", "--dry-run", "--results", "{dir}/results")
# the torch that runs a cell against the GPU it gets (this machine has none; stand-ins where
# the case gives it one)
for _name, _text, _field, _command, _gpu, _more in [
    ("cuda-cell-without-a-gpu", gm("process", _CUDA), "hardware.g.device", ("validate",), None,
     ("this machine has none", "--backend ssh with a hosts inventory, --backend slurm")),
    ("cuda-cell-without-a-gpu-sweep", gm("process", _CUDA), "hardware.g.device", _RUN, None,
     ("this machine has none",)),
    ("cuda-cell-without-a-gpu-dry-run", gm("process", _CUDA), "hardware.g.device", _DRY, None,
     ("this machine has none",)),
    ("cuda-cell-without-a-gpu-plan", gm("process", _CUDA), "hardware.g.device", ("plan",), None,
     ("g-g1-bs", "would not start here")),
    ("cuda-cell-without-a-gpu-plan-json", gm("process", _CUDA), "hardware.g.device",
     ("plan", "--json"), None, ("would not start here",)),
    ("docker-cuda-cell-without-a-gpu", gm("docker", _NGC), "hardware.g.device", ("validate",),
     None, ("where the docker backend runs them",)),
    ("v100-under-a-cuda-13-torch-on-slurm", gm("slurm", _CUDA + '\ngpu = "V100"'),
     "hardware.g.gpu", ("validate",), None, ("no sm_70", "whl/cu126")),
    ("v100-under-a-cuda-13-torch-here", gm("process", _CUDA), "hardware.g", ("validate",), "V100",
     ("Tesla V100-SXM2-32GB (compute capability 7.0)", "no sm_70")),
    ("driver-older-than-the-torchs-cuda", gm("process", _CUDA), "hardware.g", ("validate",),
     "V100", ("driver 535.104.05 is older than torch", "580.65.06")),
    ("ngc-release-too-new-for-the-gpu",
     gm("docker", _NGC + 'gpu = "V100"\nimage_vars = { base_tag = "25.01-py3" }'),
     "hardware.g.image_vars.base_tag", ("validate",), "V100",
     ("supports compute capability 7.5 and newer", 'base_tag = "24.12-py3"')),
    ("gpu-ids-this-machine-lacks", gm("process", _CUDA + "\ngpu_ids = [3]"), "hardware.g.gpu_ids",
     ("validate",), "H100", ("no GPU with index 3",)),
    ("gaudi-cell-without-a-card", gm("docker", 'device = "hpu"\nimage = "habana"',
                                      'hpu_mode = "lazy"\n'), "hardware.g.device",
     ("validate",), "H100", ("a Gaudi card (device", "hl-smi found no card")),
]:
    lacks("say-no", _name, _text, _field, command=_command, gpu=_gpu, err=_more,
          check=_NO_RUN_FOLDER, subprocess=_name == "cuda-cell-without-a-gpu-sweep")
case("say-no", "cuda-cell-on-its-gpu", ["validate", "{dir}/m.toml"],
     files={"m.toml": gm("process", _CUDA + '\ngpu = "H100"')}, expect=0, gpu="H100",
     out=("ok (1 cell)", "on this machine's NVIDIA H100 80GB HBM3 (compute capability 9.0), "
          "driver 580.159.04"))
# one decision: what the sweep refuses on this machine, validate refuses too
_APPT_HERE = ('device = "cpu"\nruntime = "apptainer"\n[hardware.g.apptainer]\n'
              'binary = "/no/such/apptainer"\nsif = "/no/such/image.sif"\n')
_INVENTORY = ('[[hosts]]\nname = "gpu1"\naddress = "127.0.0.1"\nport = 1\nuser = "lab"\n'
              'tags = ["g"]\n')
for _name, _text, _field, _command, _more in [
    ("env-reference-unset", gm("process", 'device = "cpu"\n'
                                          'env = { TOKEN = "$env:ORCHESTRATE_NO_SUCH_VAR" }'),
     "hardware.g.env.TOKEN", ("validate",), ("export ORCHESTRATE_NO_SUCH_VAR",)),
    ("env-reference-unset-dry-run", gm("process", 'device = "cpu"\n'
                                                  'env = { T = "$env:ORCHESTRATE_NO_SUCH_VAR" }'),
     "hardware.g.env.T", _DRY, ()),
    ("apptainer-missing-here", gm("process", _APPT_HERE), "hardware.g.apptainer.binary",
     ("validate",), ("m.toml: hardware.g.apptainer.sif", "/no/such/image.sif does not exist")),
    ("ssh-without-an-inventory", gm("ssh", 'device = "cpu"\nimage = "ngc-pytorch"'),
     "matrix.hosts", ("validate",), ("needs a hosts inventory",)),
]:
    lacks("say-no", _name, _text, _field, command=_command, err=_more, check=_NO_RUN_FOLDER)
bad_matrix("say-no", "ssh-inventory-invalid",
           gm("ssh", 'device = "cpu"\nimage = "ngc-pytorch"', matrix='hosts = "m.toml"\n'), "",
           err=("this is a matrix file, not a hosts inventory",), check=_NO_RUN_FOLDER)
case("say-no", "ssh-profile-host-not-in-the-inventory", ["validate", "{dir}/m.toml"],
     files={"m.toml": gm("ssh", 'device = "cpu"\nimage = "ngc-pytorch"\nhosts = ["gpu9"]',
                         matrix='hosts = "h.toml"\n'), "h.toml": _INVENTORY},
     err=("m.toml: hardware.g.hosts", "no host named 'gpu9'"))
case("say-no", "ssh-profile-host-in-the-inventory", ["validate", "{dir}/m.toml"],
     files={"m.toml": gm("ssh", 'device = "cpu"\nimage = "ngc-pytorch"\nhosts = ["gpu1"]',
                         matrix='hosts = "h.toml"\n'), "h.toml": _INVENTORY},
     expect=0, out=("ok (1 cell)",))
case("say-no", "resume-a-run-that-is-not-there-dry-run",
     ["matrix", "{dir}/m.toml", "--dry-run", "--results", "{dir}/results", "--resume",
      "20200101-000000-aaaa"], files={"m.toml": mx()}, err=("--resume: no run",),
     check=_NO_RUN_FOLDER)
case("say-no", "plan-for-an-unknown-backend", ["plan", "{dir}/m.toml", "--backend", "k8s"],
     files={"m.toml": mx()}, err=("--backend: unknown backend 'k8s'",))
# the exact commands: what each cell would run, nothing written
case("say-no", "dry-run-shows-each-command",
     ["matrix", "{dir}/m.toml", "--dry-run", "--results", "{dir}/results"],
     files={"m.toml": mx(hardware='env = { HF_TOKEN = "hf_0123456789abcdef" }')}, expect=0,
     out=("commands (process backend", "command: ", " -m workload --batch-size 64",
          "HF_TOKEN='***'", "dry run: would run 1 cell with"),
     check=_NO_RUN_FOLDER)
case("say-no", "plan-json-carries-each-launch",
     ["plan", "{dir}/m.toml", "--json", "--results", "{dir}/results"],
     files={"m.toml": mx()}, expect=0, out=('"launch": {', '"argv": [', '"backend": "process"'),
     check=_NO_RUN_FOLDER)

# --- plan anywhere (issue 31): what the target lacks, refused by validate and the sweep alike,
# shown after the plan by plan and --dry-run (exit 3); a declared target ---------------------
_LOCAL_BASE = gm("docker", 'device = "cpu"\nimage = "ngc-pytorch"\nimage_vars = { base_image = '
                 '"orchestrate-test/never-built:1", install_nvml = false }')
for _name, _command, _more in [
    ("local-base-image-not-here", ("validate",), ("it is not a registry reference to pull",)),
    ("local-base-image-not-here-sweep", _RUN, ("it is not a registry reference to pull",)),
    ("local-base-image-not-here-dry-run", _DRY,
     ("image for g: orchestrate/ngc-pytorch:", "container of image", "would not start here")),
]:
    lacks("say-no", _name, _LOCAL_BASE, "hardware.g.image_vars.base_image", command=_command,
          err=_more if _command[0] != "matrix" or "--dry-run" not in _command else (),
          out=_more if "--dry-run" in _command else (), check=_NO_RUN_FOLDER)
_NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}
case("say-no", "no-docker-engine", ["validate", "{dir}/m.toml"],
     files={"m.toml": gm("docker", 'device = "cpu"\nimage = "ngc-pytorch"')}, expect=3,
     env=_NO_ENGINE, err=("no Docker engine reachable",), check=_NO_RUN_FOLDER)
case("say-no", "no-docker-engine-dry-run",
     ["matrix", "{dir}/m.toml", "--dry-run", "--results", "{dir}/results"],
     files={"m.toml": gm("docker", 'device = "cpu"\nimage = "ngc-pytorch"')}, expect=3,
     env=_NO_ENGINE, out=("container of image orchestrate/ngc-pytorch:", "- engine",
                          "no Docker engine reachable", "would not start here"),
     check=_NO_RUN_FOLDER)
case("say-no", "no-docker-engine-plan-json",
     ["plan", "{dir}/m.toml", "--json", "--results", "{dir}/results"],
     files={"m.toml": gm("docker", 'device = "cpu"\nimage = "ngc-pytorch"')}, expect=3,
     env=_NO_ENGINE, out=('"docker_run": {',), err=("no Docker engine reachable",),
     check=_NO_RUN_FOLDER)
for _name, _spec, _says in [
    ("target-unknown-gpu", "gpu=V1OO", "--target: unknown GPU 'V1OO'"),
    ("target-not-key-value", "V100", "--target: 'V100' is not KEY=VALUE"),
    ("target-bad-driver", "gpu=V100,driver=latest", "is not a driver version"),
    ("target-gpus-without-a-gpu", "gpu=none,gpus=4", "give 1..256 with a gpu model"),
]:
    case("cli", _name, ["plan", "{dir}/m.toml", "--target", _spec], files={"m.toml": mx()},
         err=(_says,))
case("cli", "target-for-a-sweep", ["matrix", "{dir}/m.toml", "--target", "gpu=V100",
                                   "--results", "{dir}/results"],
     files={"m.toml": mx()}, err=("--target: a sweep runs on this machine",),
     check=_NO_RUN_FOLDER)
case("say-no", "target-without-the-gpu-the-cells-need",
     ["validate", "{dir}/m.toml", "--target", "gpu=none"], files={"m.toml": gm("process", _CUDA)},
     expect=3, err=("m.toml: hardware.g.device", "and the target has none"))
case("say-no", "target-with-too-few-gpus-falls-short",
     ["plan", "{dir}/m.toml", "--target", "gpu=H100,gpus=2"],
     files={"m.toml": gm("process", _CUDA, workload="gpus = 4\n")}, expect=0,
     out=("falls short", "needs 4 GPUs, and the target has 2", "would start on the target"))
case("say-no", "target-with-too-few-gpus-strict",
     ["validate", "{dir}/m.toml", "--strict", "--target", "gpu=H100,gpus=2"],
     files={"m.toml": gm("process", _CUDA, workload="gpus = 4\n")}, expect=3,
     err=("m.toml: hardware.g.device", "needs 4 GPUs, and the target has 2"))


# --- the runner ------------------------------------------------------------------------------

HANG_LIMIT_S = 60


@dataclass
class Outcome:
    code: int
    out: str
    err: str


def _prepare(c: Case, root: Path) -> tuple[Path, list[str]]:
    root.mkdir(parents=True, exist_ok=True)
    for rel, content in c.files.items():
        path = root / rel
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    if c.setup is not None:
        c.setup(root)
    argv = [a.replace("{dir}", str(root)).replace("{results}", str(root / "results"))
            for a in c.argv]
    return root, argv


def _snapshot(root: Path, skip: Path | None = None) -> dict[str, tuple[int, int, int]]:
    """Every entry under ``root`` (not following links): (mode, size, mtime)."""
    found: dict[str, tuple[int, int, int]] = {}
    for folder, dirs, files in os.walk(root):
        if skip is not None and Path(folder) == skip:
            dirs[:] = []
            continue
        dirs[:] = [d for d in dirs if not (skip is not None and Path(folder, d) == skip)
                   and d not in ("__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache")]
        for name in [*files, *dirs]:
            path = Path(folder, name)
            st = path.lstat()
            mtime = 0 if path.is_dir() else st.st_mtime_ns
            found[str(path.relative_to(root))] = (st.st_mode, st.st_size if not path.is_dir()
                                                   else 0, mtime)
    return found


def _repository_snapshot() -> dict[str, Any]:
    """What a stray write into the repository would change: its top level and results/."""
    top = sorted(p.name for p in ROOT.iterdir())
    results = ROOT / "results"
    return {"top": top, "results": _snapshot(results) if results.is_dir() else {}}


def _alarm(signum: int, frame: object) -> None:
    raise TimeoutError(f"the case blocked for {HANG_LIMIT_S} s")


def run_in_process(argv: list[str], capsys: pytest.CaptureFixture[str]) -> Outcome:
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(HANG_LIMIT_S)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    captured = capsys.readouterr()
    return Outcome(code, captured.out, captured.err)


def run_subprocess(orchestrate_cli: Callable[..., Any], argv: list[str], cwd: Path) -> Outcome:
    proc = orchestrate_cli(*argv, cwd=cwd, env={"PYTHONPATH": str(ROOT)},
                           timeout=HANG_LIMIT_S, module="orchestrator.cli")
    return Outcome(proc.returncode, proc.stdout, proc.stderr)


def _verify(c: Case, outcome: Outcome, root: Path) -> None:
    shown = f"{c.id}: exit {outcome.code}\nstdout: {outcome.out[-2000:]}\nstderr: {outcome.err}"
    assert outcome.code == c.expect, shown
    for text in ("Traceback", "Exception ignored", 'File "'):
        assert text not in outcome.err and text not in outcome.out, shown
    for text in c.err:
        assert text in outcome.err, f"missing {text!r} on stderr\n{shown}"
    for text in c.out:
        assert text in outcome.out, f"missing {text!r} on stdout\n{shown}"
    for text in c.absent:
        assert text not in outcome.out + outcome.err, f"{text!r} in the output\n{shown}"
    if c.check is not None:
        c.check(root)


def _run_case(c: Case, tmp_path: Path, runner: Callable[[list[str], Path], Outcome],
              monkeypatch: pytest.MonkeyPatch) -> None:
    if c.gpu is not None:
        write_standin(tmp_path / "gpu-bin", c.gpu)
        monkeypatch.setenv("PATH", f"{tmp_path / 'gpu-bin'}{os.pathsep}{os.environ['PATH']}")
    gpus.local_facts.cache_clear()  # this case's machine, not the one a case before probed
    root, argv = _prepare(c, tmp_path / "case")
    before = _snapshot(tmp_path, skip=root / "results")
    repo_before = _repository_snapshot()
    saved = {k: os.environ.get(k) for k in c.env}
    os.environ.update({k: v.replace("{dir}", str(root)) for k, v in c.env.items()})
    try:
        outcome = runner(argv, root)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    _verify(c, outcome, root)
    assert _snapshot(tmp_path, skip=root / "results") == before, f"{c.id} wrote outside results/"
    assert _repository_snapshot() == repo_before, f"{c.id} wrote into the repository"


def _ids(cases: list[Case]) -> list[str]:
    return [c.id for c in cases]


_CHECKING = ("validate", "plan", "matrix")


def _asks_a_tool(c: Case) -> bool:
    """Whether the case's command asks a backend's own tool whether it is there (``docker
    version``, ``squeue``): validate, plan and a dry run check the backend as the sweep does
    (issue 23: one decision), so a case on another backend than ``process`` starts one."""
    if not c.argv or c.argv[0] not in _CHECKING:
        return False
    args = list(c.argv)
    if "--backend" in args:
        return args[args.index("--backend") + 1] != "process"
    text = " ".join(v if isinstance(v, str) else v.decode("utf-8", "replace")
                    for v in c.files.values())
    # ... and a GPU cell on this machine: the refusal names the backends that would run it
    return bool(re.search(r'backend\s*=\s*"(docker|slurm|ssh|apptainer)"|'
                          r'device\s*=\s*"(cuda|hpu)"', text)) or c.gpu is not None


def _in_process(cases: list[Case]) -> list[Any]:
    """The cases, those that start a backend's tool in the integration tier (subprocess)."""
    return [pytest.param(c, id=c.id, marks=[pytest.mark.subprocess]) if _asks_a_tool(c)
            else pytest.param(c, id=c.id) for c in cases]


@pytest.mark.parametrize("c", _in_process(CASES))
def test_bad_input_in_process(c: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the default ./results of a command lands in the case's folder
    _run_case(c, tmp_path, lambda argv, root: run_in_process(argv, capsys), monkeypatch)


SAMPLE = [c for c in CASES if c.subprocess]


@pytest.mark.parametrize("c", SAMPLE, ids=_ids(SAMPLE))
def test_bad_input_as_a_real_process(c: Case, tmp_path: Path,
                                     orchestrate_cli: Callable[..., Any],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _run_case(c, tmp_path, lambda argv, root: run_subprocess(orchestrate_cli, argv, root),
              monkeypatch)


def counts() -> Counter[str]:
    """Cases per category."""
    return Counter(c.category for c in CASES)


def test_the_table_is_big_enough_and_ids_are_unique(capsys: pytest.CaptureFixture[str]) -> None:
    by_category = counts()
    with capsys.disabled():
        print(f"\nbad-input cases: {len(CASES)} ({len(SAMPLE)} also as subprocesses); "
              + ", ".join(f"{k} {v}" for k, v in sorted(by_category.items())))
    assert len(CASES) >= 150
    assert len({c.id for c in CASES}) == len(CASES)
    assert all(n >= 5 for n in by_category.values()), by_category
    refused = sum(c.expect == 2 for c in CASES)
    assert refused >= 150 * 0.8


def _iter_categories() -> Iterator[str]:
    for category, n in sorted(counts().items()):
        yield f"{category:22} {n:4}"


if __name__ == "__main__":
    print("\n".join(_iter_categories()))
    print(f"{'total':22} {len(CASES):4}  ({len(SAMPLE)} also as real subprocesses)")
