"""Plots are drawn from run folders on disk (matplotlib: the `plots` extra, installed by make)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.results import CellResult, RunPaths, Status, write_json

pytest.importorskip("matplotlib", reason="the plots extra is not installed")

PNG = b"\x89PNG\r\n\x1a\n"


def write_run(root: Path, run_id: str, scale: float = 1.0) -> RunPaths:
    paths = RunPaths.create(root, "scaling", run_id)
    write_json(paths.plan, {"cells": [], "varying": ["gpus", "precision"]})
    for precision, base in (("fp32", 400.0), ("amp", 1200.0)):
        for gpus in (1, 2, 4):
            group = f"v100-g{gpus}-{precision}"
            res = CellResult(
                cell_id=f"{group}-r1", group=group, repeat=1, status=Status.OK,
                params={"hardware": "v100", "gpus": gpus, "precision": precision},
                metrics={"train.total_ips": base * gpus * 0.9 * scale},
            )
            write_json(paths.cell_result(res.cell_id), res.to_json())
    return paths


def test_report_and_history_plots(tmp_path, capsys):
    write_run(tmp_path, "20261101-000000-aaaa")
    write_run(tmp_path, "20261102-000000-aaaa", scale=0.8)
    out = tmp_path / "scaling.png"
    assert main(["report", "scaling", "--results", str(tmp_path), "--plot", str(out)]) == 0
    assert out.read_bytes().startswith(PNG) and out.stat().st_size > 10_000
    trend = tmp_path / "trend.svg"
    assert main(["history", "scaling", "--results", str(tmp_path), "--plot", str(trend)]) == 0
    assert "<svg" in trend.read_text()[:500]
    assert "REGRESSION" in capsys.readouterr().out
