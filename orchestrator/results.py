"""Results are values on disk.

:class:`RunPaths` decides every file name of a run; :class:`CellResult` is what one cell produced.
Tables and reports are built only from what is on disk, so any old run can be re-reported.

Layout::

    <results>/<matrix>/<run id>/
        matrix.toml        the matrix file as it was
        plan.json          the expanded cells
        run.json           backend, start/end, provenance, status counts
        summary.csv        one row per cell group (medians over repeats)
        summary.txt        the same table as printed
        cells/<cell id>/
            command.json   what was launched (argv, env, image, GPUs, host)
            log.txt        everything the workload printed
            metrics.jsonl  the workload's structured lines
            result.json    status, reason, timings, metrics, provenance, config_hash
            ...            files the workload wrote (iterations.csv, telemetry.csv, profiles)
"""

from __future__ import annotations

import enum
import json
import os
import secrets
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError


class Status(enum.StrEnum):
    """How a cell ended."""

    OK = "ok"
    FAILED = "failed"  # exited non-zero, or produced no summary
    TIMEOUT = "timeout"  # stopped at its per-cell timeout
    OOM = "oom"  # killed by the out-of-memory killer
    HOST_LOST = "host_lost"  # its host went away; retried elsewhere when possible
    CANCELLED = "cancelled"  # the sweep was interrupted
    UNPLACEABLE = "unplaceable"  # no host/GPUs can ever run it


@dataclass
class CellResult:
    """What one cell produced. Written as ``result.json``."""

    cell_id: str
    group: str
    repeat: int
    status: Status
    reason: str = ""
    exit_code: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    duration_s: float | None = None
    attempts: int = 1
    params: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    log_tail: list[str] = field(default_factory=list)
    #: The cell's content hash (parameters + hardware profile): what it measures. Empty in
    #: results written before it was recorded (the run's plan.json has it).
    config_hash: str = ""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CellResult:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["status"] = Status(known["status"])
        return cls(**known)


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (a crash never leaves half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, sort_keys=False, default=str)
        fh.write("\n")
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def new_run_id(now: float | None = None) -> str:
    """A sortable, unique run id: ``20261122-031500-ab12``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now or time.time()))
    return f"{stamp}-{secrets.token_hex(2)}"


@dataclass(frozen=True)
class RunPaths:
    """Every path of one run."""

    root: Path

    @classmethod
    def create(cls, results_root: Path, matrix_name: str, run_id: str | None = None) -> RunPaths:
        root = Path(results_root) / matrix_name / (run_id or new_run_id())
        root.mkdir(parents=True, exist_ok=False)
        (root / "cells").mkdir()
        return cls(root)

    @property
    def run_id(self) -> str:
        return self.root.name

    @property
    def matrix_file(self) -> Path:
        return self.root / "matrix.toml"

    @property
    def plan(self) -> Path:
        return self.root / "plan.json"

    @property
    def run_meta(self) -> Path:
        return self.root / "run.json"

    @property
    def summary_csv(self) -> Path:
        return self.root / "summary.csv"

    @property
    def summary_txt(self) -> Path:
        return self.root / "summary.txt"

    def cell_dir(self, cell_id: str) -> Path:
        return self.root / "cells" / cell_id

    def cell_log(self, cell_id: str) -> Path:
        return self.cell_dir(cell_id) / "log.txt"

    def cell_command(self, cell_id: str) -> Path:
        return self.cell_dir(cell_id) / "command.json"

    def cell_metrics(self, cell_id: str) -> Path:
        return self.cell_dir(cell_id) / "metrics.jsonl"

    def cell_result(self, cell_id: str) -> Path:
        return self.cell_dir(cell_id) / "result.json"

    def results(self) -> list[CellResult]:
        """Every cell result on disk, in plan order where a plan exists."""
        order: list[str] = []
        if self.plan.exists():
            order = [c["id"] for c in read_json(self.plan)["cells"]]
        found = {p.parent.name: p for p in (self.root / "cells").glob("*/result.json")}
        ids = [i for i in order if i in found] + sorted(set(found) - set(order))
        return [CellResult.from_json(read_json(found[i])) for i in ids]


def parse_metric_lines(text: str) -> list[dict[str, Any]]:
    """The workload's structured lines: JSON objects with a ``type``, one per line."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("type"), str):
            out.append(obj)
    return out


def find_run(results_root: Path, matrix_name: str, run_id: str | None = None) -> RunPaths:
    """A run folder: ``run_id`` or the newest run of the matrix."""
    base = Path(results_root) / matrix_name
    if run_id:
        root = base / run_id
        if not root.is_dir():
            raise ConfigError(f"no run {run_id!r} under {base}", field="run")
        return RunPaths(root)
    runs = runs_of(results_root, matrix_name)
    if not runs:
        raise ConfigError(f"no runs of {matrix_name!r} under {results_root}", field="run")
    return runs[-1]


def runs_of(results_root: Path, matrix_name: str) -> list[RunPaths]:
    """Every finished-or-not run of a matrix, oldest first (run ids sort by time)."""
    base = Path(results_root) / matrix_name
    if not base.is_dir():
        return []
    return [RunPaths(p) for p in sorted(base.iterdir()) if (p / "plan.json").exists()]
