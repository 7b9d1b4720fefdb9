"""docs/contributing.md's recipes for the results, done as they say, end to end.

* **A metric column**: one :class:`~orchestrator.results.reports.table_rules.Column` in
  ``METRIC_COLUMNS`` (every table) or in a table rule's ``columns`` (that rule's tables); the
  table ``orchestrate report`` prints, summary.csv and the HTML report then have it, with no
  other change.
* **A foreign log format**: a figures parser that says how to tell the format and what its logs
  state (``import_kind``, ``detect``, ``stated_params``, ``table_rule``; the toy has its own
  ``detect`` and ``stated_params``), listed in ``PARSERS``,
  and its name among the parsers a matrix may name; ``orchestrate import`` then recognises such
  a log, reads its figures and writes a run ``report`` shows, with no other change.

The toy column and the toy format live only in these tests (registered with ``monkeypatch``).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from orchestrator.cli import main
from orchestrator.config.figures import FiguresConfig
from orchestrator.results.figures import figure_parsers
from orchestrator.results.figures.figure_parsers import CellOutput, FigureParser, Figures
from orchestrator.results.folders.run_folder import CellResult, RunPaths, Status, write_json
from orchestrator.results.reports import summary, table_rules
from orchestrator.results.reports.table_rules import Column

TOY_COLUMN = Column("widgets/s", "widgets_per_s", ("toy.widgets_per_s",), 2)


def toy_run(root: Path) -> RunPaths:
    """A run of one configuration, two ok repeats whose results have the toy figure (3 and 5:
    median 4.00)."""
    paths = RunPaths.create(root, "toy", "20261101-000000-aaaa")
    params = {"hardware": "h100", "gpus": 1, "batch_size": 64, "mode": "train"}
    cells = [{"id": f"h100-r{r}", "group": "h100", "repeat": r, "hash": "abc", "params": params}
             for r in (1, 2)]
    write_json(paths.plan, {"matrix": "toy", "repeats": 2, "varying": [], "cells": cells})
    for r, widgets in ((1, 3.0), (2, 5.0)):
        result = CellResult(cell_id=f"h100-r{r}", group="h100", repeat=r, status=Status.OK,
                            params=params, metrics={"train.total_ips": 100.0 * r,
                                                    "toy.widgets_per_s": widgets})
        write_json(paths.cell_result(result.cell_id), result.to_json())
    write_json(paths.run_meta, {"run_id": paths.run_id, "matrix": "toy", "finished_at": 1.0})
    return paths


@pytest.mark.parametrize("listed_in", ["METRIC_COLUMNS", "a table rule's columns"])
def test_a_new_metric_column_is_one_column_listed_once(
        listed_in: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    if listed_in == "METRIC_COLUMNS":
        monkeypatch.setattr(summary, "METRIC_COLUMNS", (*summary.METRIC_COLUMNS, TOY_COLUMN))
    else:
        rule = table_rules.RULES["median"]
        monkeypatch.setitem(table_rules.RULES, "median",
                            dataclasses.replace(rule, columns=(*rule.columns, TOY_COLUMN)))
    paths = toy_run(tmp_path)
    html = tmp_path / "report.html"

    assert main(["report", "toy", "--results", str(tmp_path), "--html", str(html)]) == 0

    table = capsys.readouterr().out
    header = next(line for line in table.splitlines() if "widgets/s" in line)
    row = table.splitlines()[table.splitlines().index(header) + 2]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[[c.strip() for c in header.strip("|").split("|")].index("widgets/s")] == "4.00"
    [written] = csv.DictReader(io.StringIO(paths.summary_csv.read_text(encoding="utf-8")))
    assert float(written["widgets_per_s"]) == 4.0
    page = html.read_text(encoding="utf-8")
    assert "widgets/s" in page and "4.00" in page


def test_a_column_without_values_is_not_shown(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Listed but without the figure in any result: no column (as the telemetry columns on a
    run without telemetry)."""
    absent = Column("gizmos", "gizmos", ("toy.gizmos",))
    monkeypatch.setattr(summary, "METRIC_COLUMNS", (*summary.METRIC_COLUMNS, absent))
    rows, table = summary.summarize_run(toy_run(tmp_path))
    assert "gizmos" not in table and "gizmos" not in summary.render_csv(rows)


# --- a foreign log format --------------------------------------------------------------------


class ToyParser(FigureParser):
    """A toy format: ``TOY batch=<n>`` once, then ``TOY ips=<x>`` lines; ``train.total_ips`` is
    their mean."""

    name: ClassVar[str] = "toy"
    import_kind: ClassVar[str | None] = "toy-log"
    table_rule: ClassVar[str] = "median"

    @classmethod
    def detect(cls, text: str) -> bool:
        return text.startswith("TOY ")

    @classmethod
    def stated_params(cls, text: str, path: Path) -> dict[str, Any]:
        batch = [int(ln.partition("=")[2]) for ln in text.splitlines()
                 if ln.startswith("TOY batch=")]
        return {"batch_size": batch[0]} if batch else {}

    def parse(self, output: CellOutput) -> Figures:
        ips = [float(ln.partition("=")[2]) for ln in output.log_text.splitlines()
               if ln.startswith("TOY ips=")]
        figures = Figures(self.name, source=output.log_name)
        if ips:
            figures.metrics["train.total_ips"] = sum(ips) / len(ips)
        else:
            figures.missing = {"train.total_ips": "no TOY ips= line"}
        return figures


@pytest.fixture
def toy_format(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The toy parser registered as the recipe says: in ``PARSERS``, and its name among the
    parsers a matrix may name (``FiguresConfig.parser``, a ``Literal``: the schema matrix files
    are validated by; extended here for the test and put back after it)."""
    monkeypatch.setitem(figure_parsers.PARSERS, ToyParser.name, ToyParser)
    field = FiguresConfig.model_fields["parser"]
    known = field.annotation
    names = (*typing.get_args(known), ToyParser.name)
    field.annotation = typing.Literal[names]
    FiguresConfig.model_rebuild(force=True)
    try:
        yield
    finally:
        field.annotation = known
        FiguresConfig.model_rebuild(force=True)


def test_a_new_foreign_format_is_one_parser_listed_once(
        toy_format: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "bench.out"
    log.write_text("TOY batch=32\nTOY ips=100\nTOY ips=110\n", encoding="utf-8")
    results = tmp_path / "results"

    assert main(["import", str(log), "--matrix", "toys", "--param", "hardware=v100",
                 "--results", str(results)]) == 0
    assert main(["report", "toys", "--results", str(results)]) == 0

    [run] = list((results / "toys").iterdir())
    [result_file] = RunPaths(run).result_files()
    result = json.loads(result_file.read_text(encoding="utf-8"))
    assert result["status"] == "ok"
    assert result["provenance"]["imported"]["format"] == "toy-log"
    assert result["metrics"]["train.total_ips"] == 105.0
    assert result["provenance"]["matched_on"]["batch_size"] == "log"
    assert result["params"]["batch_size"] == 32
    assert "105.0" in capsys.readouterr().out


def test_without_its_registration_the_toy_log_is_no_log_the_importer_reads(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The recipe's registration is what makes the difference: the same log, unregistered, is
    refused."""
    log = tmp_path / "bench.out"
    log.write_text("TOY batch=32\nTOY ips=100\n", encoding="utf-8")
    assert main(["import", str(log), "--matrix", "toys", "--param", "hardware=v100",
                 "--results", str(tmp_path / "results")]) != 0
    assert "not a log this importer reads" in capsys.readouterr().err
