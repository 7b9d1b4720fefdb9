"""Absolute performance references per configuration, with bounds (like ReFrame's ``reference``).

A references file lives next to its matrix: ``matrices/NAME.toml`` -> ``matrices/NAME.references
.toml``. Each ``[[reference]]`` names the configurations it applies to by parameters (``match``:
every key must equal the cell's parameter) and gives bounds on one figure (default: the
headline images/s, ``train.total_ips`` / ``val.total_ips``), either relative to a value::

    [[reference]]
    match = { arch = "resnet50", gpus = 8, precision = "amp" }
    value = 9800.0          # images/s
    lower = "-5%"           # fail below 9310
    upper = "+10%"          # fail above 10780 (update the reference: something changed)

or absolute (``min`` / ``max``, either may be left out)::

    [[reference]]
    match = { mode = "infer", batch_size = 1 }
    metric = "val.compute_latency_at99"
    max = 0.004             # seconds

The newest run's median over its ok repeats is checked against every reference that matches
it; when several match one configuration and figure, the most specific one (most ``match``
keys) applies, and two equally specific ones are an error. Validation (pydantic, unknown keys
rejected) reports every problem of the file at once, with the field path.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from orchestrator.config.files import StrictModel
from orchestrator.config.matrix_file import PARAM_NAMES, param_type
from orchestrator.config.syntax import parse_percent
from orchestrator.errors import ConfigError, Problem

SUFFIX = ".references.toml"


class ReferenceEntry(StrictModel):
    """One ``[[reference]]`` table."""

    #: Not strict, unlike the other user-file models: bounds have always been coerced
    #: (``value = "1500"``, ``min = true``); strictness would refuse files accepted today.
    model_config = ConfigDict(strict=False)

    match: dict[str, Any] = Field(description="Parameters a configuration must have.")
    metric: str | None = Field(None, description="Figure to check (default: images/s).")
    value: Annotated[float, Field(gt=0)] | None = Field(
        None, description="Reference value; lower/upper are relative to it.")
    lower: str | None = Field(None, description="Lowest allowed, relative: '-5%'.")
    upper: str | None = Field(None, description="Highest allowed, relative: '+10%'.")
    min: float | None = Field(None, description="Lowest allowed, absolute.")
    max: float | None = Field(None, description="Highest allowed, absolute.")
    note: str = ""

    def bounds(self) -> tuple[float | None, float | None]:
        """The absolute (low, high) bounds (already validated)."""
        if self.value is not None:
            low = None if self.lower is None else self.value * (1 + parse_percent(self.lower,
                                                                                  True))
            high = None if self.upper is None else self.value * (1 + parse_percent(self.upper,
                                                                                   True))
            return low, high
        return self.min, self.max


def _entry_problems(entry: ReferenceEntry, where: str, file: str) -> list[Problem]:
    problems = []
    for key, value in entry.match.items():
        if key not in PARAM_NAMES:
            problems.append(Problem(file, f"{where}.match.{key}",
                                    f"unknown parameter (known: {', '.join(PARAM_NAMES)})"))
            continue
        try:
            TypeAdapter(param_type(key)).validate_python(value, strict=True)
        except ValidationError as exc:
            problems.append(Problem(file, f"{where}.match.{key}",
                                    exc.errors()[0]["msg"] + f" (got {value!r})"))
    if not entry.match:
        problems.append(Problem(file, f"{where}.match", "empty: name at least one parameter"))
    relative = entry.lower is not None or entry.upper is not None
    absolute = entry.min is not None or entry.max is not None
    if relative and absolute:
        problems.append(Problem(file, where, "give value with lower/upper, or min/max, "
                                "not both"))
    elif relative and entry.value is None:
        problems.append(Problem(file, f"{where}.value", "lower/upper need the value they are "
                                "relative to"))
    elif not relative and not absolute:
        problems.append(Problem(file, where, "no bound: give value with lower and/or upper, "
                                "or min and/or max"))
    for name, sign in (("lower", -1), ("upper", 1)):
        text = getattr(entry, name)
        if text is None:
            continue
        try:
            pct = parse_percent(text, signed=True)
        except ValueError as exc:
            problems.append(Problem(file, f"{where}.{name}", str(exc)))
            continue
        if pct * sign < 0:
            problems.append(Problem(file, f"{where}.{name}",
                                    f"{text!r}: {name} must be {'<=' if sign < 0 else '>='} 0%"))
    if entry.min is not None and entry.max is not None and entry.min > entry.max:
        problems.append(Problem(file, where, f"min {entry.min} is above max {entry.max}"))
    return problems


def load_references(path: Path) -> list[ReferenceEntry]:
    """Read and validate a references file; ConfigError lists every problem at once."""
    file = str(path)
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", file=file) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", file=file) from None
    problems = [Problem(file, key, "unknown key (expected [[reference]] tables)")
                for key in raw if key != "reference"]
    tables = raw.get("reference", [])
    if not isinstance(tables, list):
        problems.append(Problem(file, "reference", "expected [[reference]] tables"))
        tables = []
    entries = []
    for i, table in enumerate(tables):
        where = f"reference[{i}]"
        try:
            entry = ReferenceEntry.model_validate(table)
        except ValidationError as exc:
            problems += [Problem(file, ".".join([where, *(str(p) for p in err["loc"])]),
                                 err["msg"]) for err in exc.errors()]
            continue
        problems += _entry_problems(entry, where, file)
        entries.append(entry)
    if problems:
        raise ConfigError(problems)
    return entries


def references_next_to(matrix_file: Path) -> Path:
    """``matrices/NAME.toml`` -> ``matrices/NAME.references.toml``."""
    return matrix_file.with_name(matrix_file.stem + SUFFIX)


@dataclass(frozen=True)
class ReferenceCheck:
    """One configuration's figure against the reference that applies to it."""

    entry: ReferenceEntry
    metric: str
    value: float | None  # the newest run's median (None: no ok repeat with this figure)
    low: float | None
    high: float | None

    @property
    def verdict(self) -> str:
        """within | below | above | no value."""
        if self.value is None:
            return "no value"
        if self.low is not None and self.value < self.low:
            return "below"
        if self.high is not None and self.value > self.high:
            return "above"
        return "within"

    @property
    def failed(self) -> bool:
        return self.verdict != "within"

    def describe(self) -> str:
        bounds = f"[{_num(self.low)}, {_num(self.high)}]"
        if self.value is None:
            return f"{self.metric}: no value (reference {bounds})"
        return f"{self.metric} {_num(self.value)}: {self.verdict} {bounds}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.4g}"


def applicable(entries: Sequence[ReferenceEntry], params: Mapping[str, Any], headline: str,
               file: str = "") -> dict[str, ReferenceEntry]:
    """``{metric: entry}``: the most specific matching entry per figure. ConfigError when two
    equally specific entries match."""
    best: dict[str, tuple[int, int, ReferenceEntry]] = {}
    clashes = []
    for i, entry in enumerate(entries):
        if any(params.get(k) != v for k, v in entry.match.items()):
            continue
        metric = entry.metric or headline
        rank = len(entry.match)
        if metric in best and best[metric][0] == rank:
            clashes.append(Problem(file, f"reference[{i}]",
                                   f"matches the same configuration as reference"
                                   f"[{best[metric][1]}] ({metric}) and is as specific; "
                                   "add a match key to one of them"))
        if metric not in best or best[metric][0] < rank:
            best[metric] = (rank, i, entry)
    if clashes:
        raise ConfigError(clashes)
    return {metric: entry for metric, (_, _, entry) in best.items()}


def check(entries: Sequence[ReferenceEntry], params: Mapping[str, Any], headline: str,
          values: Mapping[str, float | None], file: str = "") -> list[ReferenceCheck]:
    """Check a configuration's figures (``values``: metric -> newest median)."""
    out = []
    for metric, entry in applicable(entries, params, headline, file).items():
        low, high = entry.bounds()
        out.append(ReferenceCheck(entry, metric, values.get(metric), low, high))
    return out
