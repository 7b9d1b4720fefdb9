"""The ``[figures]`` table: how a cell's figures of merit are declared (pydantic models).

What the table means, and the parsers that honour it, is
:mod:`orchestrator.results.figures.figure_parsers`'s docstring.
The models live here, below :mod:`orchestrator.config.matrix_file`, because a matrix file takes the
table in
three places (``[figures]`` for the whole matrix, ``[hardware.NAME.figures]``,
``[commands.NAME.figures]``) and ``orchestrate import --figures FILE`` reads it alone. Strict:
unknown keys are errors, types are not coerced, values are frozen.
"""

from __future__ import annotations

import math
from pathlib import PurePosixPath
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from orchestrator.config.files import StrictModel
from orchestrator.config.user_regex import compile_pattern

FigureName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$", max_length=100)]


def _relative_file(value: str) -> str:
    path = PurePosixPath(value)
    if not value or path.is_absolute() or ".." in path.parts or "\\" in value:
        raise ValueError("must be a file name relative to the cell folder (no '/' start, no '..')")
    if any(ord(ch) < 32 for ch in value):
        raise ValueError("must not contain control characters")
    return value


#: A file in the cell folder, named relative to it.
RelativeFile = Annotated[str, AfterValidator(_relative_file)]


def _figure_pattern(value: str) -> str:
    rx = compile_pattern(value, multiline=True)  # PatternError (a ValueError) says why not
    if "value" not in rx.groupindex:
        if rx.groups == 0:
            raise ValueError(
                "has no group capturing the number; write it as (?P<value>[0-9.eE+-]+)")
        if rx.groups > 1:
            raise ValueError(
                f"has {rx.groups} groups; name the one capturing the number (?P<value>...)")
    return value


class Bounds(StrictModel):
    """A figure's accepted range; a value outside fails the cell."""

    lower: float | None = Field(None, description="Smallest accepted value.")
    upper: float | None = Field(None, description="Largest accepted value.")

    @model_validator(mode="after")
    def _sane(self) -> Bounds:
        if self.lower is None and self.upper is None:
            raise ValueError("give lower, upper or both")
        for name in ("lower", "upper"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number")
        if self.lower is not None and self.upper is not None and self.lower > self.upper:
            raise ValueError(f"lower ({self.lower:g}) is above upper ({self.upper:g})")
        return self


class RegexFigure(StrictModel):
    """A figure captured from the log (or a file of the cell folder) by a regular expression."""

    name: FigureName = Field(description="Figure name, e.g. 'train.total_ips'.")
    pattern: Annotated[str, Field(min_length=1), AfterValidator(_figure_pattern)] = Field(
        description="Regular expression in RE2 syntax (multi-line; no backreferences or "
        "lookaround); the number is its `value` group or only group."
    )
    unit: str = Field("", description="Unit, for readers (images/s, s, W).")
    which: Literal["last", "first", "mean", "median", "all"] = Field(
        "last", description="Which match after the warmup: last, first, mean, median, all.")
    warmup: Annotated[int, Field(ge=0)] = Field(0, description="Matches dropped first.")
    scale: float = Field(1.0, description="Multiplies the value (e.g. 0.001 for ms -> s).")
    file: RelativeFile | None = Field(None, description="Read this cell file, not the log.")

    @model_validator(mode="after")
    def _finite_scale(self) -> RegexFigure:
        if not math.isfinite(self.scale) or self.scale == 0:
            raise ValueError("scale must be a finite, non-zero number")
        return self


#: The parsers of other programs' output in the seeds' own formats
#: (:mod:`orchestrator.results.figures.foreign_logs`).
SEED_PARSERS = ("dlperf", "tbd-ncu", "tf-timehistory", "iteration-durations", "habana")
#: Parsers that drop a number of warmup iterations (or lines) first.
WARMUP_PARSERS = ("dllogger", "dlperf", "tf-timehistory", "habana")


class FiguresConfig(StrictModel):
    """How a cell's figures of merit are read and judged (a matrix's ``[figures]``)."""

    parser: Literal["workload", "dllogger", "regex", "dlperf", "tbd-ncu", "tf-timehistory",
                    "iteration-durations", "habana"] = Field(
        "workload", description="workload (our JSON lines), dllogger, regex only, or a seed's "
        "own format read by its own rule: dlperf (DLE text logs, DLPerf's "
        "extract_pytorch_logs_time.py), tbd-ncu (Nsight Compute CSV, TBD's coreutil.py), "
        "tf-timehistory (TensorFlow's TimeHistory lines), iteration-durations (seed 002's "
        "per-GPU iteration times), habana (Model-References train.py).")
    raport: RelativeFile | None = Field(
        None, description="dllogger: the JSON raport in the cell folder (default: the log).")
    warmup: Annotated[int, Field(ge=0)] | None = Field(
        None, description="dllogger, dlperf, habana: iterations (lines) dropped first; "
        "tf-timehistory: windows dropped (default: the cell's warmup; tf-timehistory: 1).")
    variant: Literal["timestamps", "time-values"] | None = Field(
        None, description="dlperf: which of DLPerf's rules (timestamps: DLLogger lines' "
        "times, seed 003's script; time-values: the Time column of 'Epoch: [e][i/n]' lines, the "
        "peers' script). Default: told from the log.")
    file: RelativeFile | None = Field(
        None, description="The cell file the parser reads (default: the log); "
        "iteration-durations: also the nvprof CSV files' glob for per-GPU clocks, power and "
        "temperature, e.g. 'resnet_*.csv'.")
    telemetry: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.*?%-]{1,128}$")] | None = Field(
        None, description="iteration-durations: a glob of the cell files holding nvprof's "
        "system-profiling CSV (one per process), e.g. 'resnet_*.csv'.")
    regex: list[RegexFigure] = Field([], description="Figures captured by regular expressions.")
    required: list[FigureName] | None = Field(
        None, description="Figures a cell must produce (default: the mode's throughput and "
        "every regex figure).")
    require_end: bool = Field(
        True, description="Fail a cell whose output lacks its end record (our summary line, "
        "DLLogger's run summary).")
    bounds: dict[FigureName, Bounds] = Field({}, description="Accepted range per figure.")

    @model_validator(mode="after")
    def _consistent(self) -> FiguresConfig:
        if self.parser == "regex" and not self.regex:
            raise ValueError("parser 'regex' needs at least one [[figures.regex]] entry")
        if self.parser != "dllogger" and self.raport is not None:
            raise ValueError("raport applies to parser 'dllogger' only")
        if self.parser not in WARMUP_PARSERS and self.warmup is not None:
            raise ValueError(f"warmup applies to parsers {', '.join(WARMUP_PARSERS)} only")
        if self.parser != "dlperf" and self.variant is not None:
            raise ValueError("variant applies to parser 'dlperf' only")
        if self.parser != "iteration-durations" and self.telemetry is not None:
            raise ValueError("telemetry applies to parser 'iteration-durations' only")
        if self.file is not None and self.parser not in SEED_PARSERS:
            raise ValueError(f"file applies to parsers {', '.join(SEED_PARSERS)} (dllogger: "
                             "raport)")
        names = [fig.name for fig in self.regex]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"regex figure names must be unique; repeated: {', '.join(dupes)}")
        return self
