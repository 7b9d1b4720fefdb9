"""Synthetic run folders for the results store, history, compare and export tests.

They have the layout and fields a real sweep writes (``run.json``, ``plan.json`` with content
hashes, ``cells/*/result.json`` with ``env`` and ``provenance``), with the numbers chosen by the
test. No workload runs.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.results.folders.run_folder import CellResult, RunPaths, Status, write_json
from orchestrator.results.importer import ImportOptions, ImportPlan, plan_import, write_import

BASE_ENV = {
    "torch_version": "2.4.0", "cuda_version": "12.4", "cudnn_version": "90100",
    "driver_version": "550.54", "device": "cuda", "device_name": "NVIDIA H100 80GB HBM3",
    "hostname": "dgx1", "python_version": "3.11.7",
}


@dataclass
class Config:
    """One configuration of a synthetic matrix and its repeats' values in one run."""

    params: dict[str, Any]
    values: Sequence[float | None]  # one per repeat; None: the repeat failed
    env: dict[str, Any] = field(default_factory=dict)  # overrides of BASE_ENV
    image: str | None = "orchestrate/ngc-pytorch:abc123"
    config_hash: str | None = None  # default: from the params
    duration_s: float = 10.0

    @property
    def group(self) -> str:
        p = self.params
        return "-".join(str(p[k]) for k in sorted(p) if k not in ("mode",))

    @property
    def hash(self) -> str:
        if self.config_hash:
            return self.config_hash
        blob = json.dumps(self.params, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def params(**kw: Any) -> dict[str, Any]:
    """Cell parameters with defaults for what a test leaves out."""
    out = {"hardware": "h100", "gpus": 1, "batch_size": 64, "precision": "amp",
           "mode": "train", "arch": "resnet50"}
    out.update(kw)
    return out


def write_run(root: Path, matrix: str, run_id: str, configs: Sequence[Config],
              started: float | None = None, source: str | None = None,
              finished: bool = True, plan_extra: Sequence[Config] = (),
              only: Sequence[str] | None = None,
              argv: Sequence[str] = ("orchestrate",),
              exclude: Sequence[str] | None = None) -> RunPaths:
    """A run folder with one cell per repeat of each configuration (``only``, ``exclude``:
    plan.json's ``--only`` and ``--exclude`` filters; ``argv``: run.json's command line)."""
    paths = RunPaths.create(root, matrix, run_id)
    started = started if started is not None else time.time()
    repeats = max((len(c.values) for c in configs), default=1)
    cells = []
    for cfg in [*configs, *plan_extra]:
        for r in range(1, repeats + 1):
            cells.append({"id": f"{cfg.group}-r{r}", "group": cfg.group, "repeat": r,
                          "hash": cfg.hash, "params": cfg.params})
    plan: dict[str, Any] = {"matrix": matrix, "source": source or f"matrices/{matrix}.toml",
                            "backend": "process", "repeats": repeats, "varying": [],
                            "baseline": None, "cells": cells}
    if only is not None:
        plan["only"] = list(only)
    if exclude is not None:
        plan["exclude"] = list(exclude)
    write_json(paths.plan, plan)
    counts: dict[str, int] = {}
    for cfg in configs:
        for r, value in enumerate(cfg.values, start=1):
            ok = value is not None
            status = Status.OK if ok else Status.FAILED
            counts[status.value] = counts.get(status.value, 0) + 1
            key = f"{'train' if cfg.params.get('mode', 'train') == 'train' else 'val'}"
            res = CellResult(
                cell_id=f"{cfg.group}-r{r}", group=cfg.group, repeat=r, status=status,
                reason="" if ok else "exit code 1: CUDA error: out of memory",
                exit_code=0 if ok else 1, started_at=started + r, finished_at=started + r + 1,
                duration_s=cfg.duration_s, params=dict(cfg.params),
                metrics={f"{key}.total_ips": value, f"{key}.compute_ips": value * 1.05,
                         f"{key}.loss": 0.5} if ok else {},
                env={**BASE_ENV, **cfg.env} if ok else {},
                provenance={"host": (cfg.env.get("hostname") or BASE_ENV["hostname"]),
                            "backend": "process", "image": cfg.image,
                            "git_revision": "0123456789abcdef"},
            )
            write_json(paths.cell_result(res.cell_id), res.to_json())
    write_json(paths.run_meta, {
        "run_id": run_id, "matrix": matrix, "backend": "process", "started_at": started,
        "finished_at": started + 100.0 if finished else None, "orchestrate_version": "0.1.0",
        "git_revision": "0123456789abcdef", "controller_host": "ctl", "argv": list(argv),
        "counts": counts, "interrupted": False,
    })
    return paths


def run_id(day: int, suffix: str = "aaaa") -> str:
    """``20261101-000000-aaaa`` for day 1 of November 2026."""
    return f"202611{day:02d}-000000-{suffix}"


def day(n: int) -> float:
    """The UTC timestamp of day ``n`` of November 2026, midnight."""
    import calendar

    return float(calendar.timegm((2026, 11, n, 0, 0, 0, 0, 0, 0)))


def import_results(sources: list[Path], options: ImportOptions) -> tuple[RunPaths, ImportPlan]:
    """Plan and write an import, as ``orchestrate import`` does: the new run folder and the
    plan."""
    plan = plan_import(sources, options)
    return write_import(plan, options), plan
