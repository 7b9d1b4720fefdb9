"""The run folder on disk: names and run ids, file modes, and reading damaged old runs."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

import pytest

from orchestrator.config.syntax import check_name, check_run_id
from orchestrator.errors import ConfigError
from orchestrator.results.folders.run_folder import (
    CellResult,
    ResultsRoot,
    RunPaths,
    Status,
    find_run,
    new_run_id,
    runs_of,
    write_json,
)


@pytest.mark.parametrize("name", ["v100_scaling", "a", "A-1.b_c", "x" * 64,
                                  pytest.param(new_run_id(), id="a-new-run-id")])
def test_valid_names(name: str) -> None:
    assert check_name(name) == name
    assert check_run_id(name) == name


@pytest.mark.parametrize("name", [
    "", ".", "..", "...", ".hidden", "a/b", "../x", "x/..", "a b", "a\nb", "-x", "_x", "x" * 65,
    "a\\b", "a\x00b", "ü",
])
def test_names_that_are_no_folder_names_are_refused(name: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_name(name, "matrix.name")
    assert err.value.problems[0].field == "matrix.name"
    with pytest.raises(ConfigError) as err:
        check_run_id(name, "--run")
    assert err.value.problems[0].field == "--run"


def test_run_paths_refuse_escaping_names(tmp_path: Path) -> None:
    for name, run in (("..", None), ("ok", "../../x"), ("a/b", None), ("ok", ".x")):
        with pytest.raises(ConfigError):
            RunPaths.create(tmp_path / "results", name, run)
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").rglob("*"))
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["results"])


def test_find_run_and_runs_of_check_names(tmp_path: Path) -> None:
    (tmp_path / "m" / "20260101-000000-abcd").mkdir(parents=True)
    with pytest.raises(ConfigError, match="run id"):
        find_run(tmp_path, "m", "../../etc")
    with pytest.raises(ConfigError, match="matrix"):
        find_run(tmp_path, "../m")
    with pytest.raises(ConfigError, match="matrix"):
        runs_of(tmp_path, "m/..")


def test_results_root_that_is_a_file(tmp_path: Path) -> None:
    file = tmp_path / "results"
    file.write_text("not a folder")
    for call in (lambda: RunPaths.create(file, "m"), lambda: find_run(file, "m"),
                 lambda: runs_of(file, "m")):
        with pytest.raises(ConfigError) as err:
            call()
        assert err.value.problems[0].file == "--results"
        assert "is not a folder" in str(err.value)


def test_an_existing_run_id_is_refused(tmp_path: Path) -> None:
    RunPaths.create(tmp_path, "m", "r1")
    with pytest.raises(ConfigError, match="already exists"):
        RunPaths.create(tmp_path, "m", "r1")


def test_runs_of_leaves_out_what_is_no_run(tmp_path: Path) -> None:
    base = tmp_path / "m"
    for run in ("20260101-000000-aaaa", "20260102-000000-bbbb"):
        RunPaths.create(tmp_path, "m", run).plan.write_text("{}")
    (base / "notes.txt").write_text("a stray file")
    (base / ".hidden").mkdir()
    (base / ".hidden" / "plan.json").write_text("{}")
    (base / "no-plan").mkdir()
    assert [r.run_id for r in runs_of(tmp_path, "m")] == [
        "20260101-000000-aaaa", "20260102-000000-bbbb"
    ]


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_every_file_of_a_run_follows_the_umask(tmp_path: Path, umask: int) -> None:
    """write_json (plan.json, run.json, result.json, command.json) and plain files get the same
    mode: a colleague can read what the umask lets them read."""
    old = os.umask(umask)
    try:
        paths = RunPaths.create(tmp_path, "m")
        write_json(paths.plan, {"cells": []})
        write_json(paths.cell_result("c-r1"), {"x": 1})
        paths.summary_txt.write_text("table\n")
    finally:
        os.umask(old)
    expected = 0o666 & ~umask
    for path in (paths.plan, paths.cell_result("c-r1"), paths.summary_txt):
        assert stat.S_IMODE(path.stat().st_mode) == expected, path
    assert not list(paths.root.rglob(".*.tmp"))  # no temporary file left behind


def test_write_json_replaces_atomically_and_cleans_up_on_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "x.json"
    write_json(target, {"a": 1})

    def full_disk(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="No space"):
        write_json(target, {"a": 2})
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def _result(cell_id: str, status: str = "ok", **extra: object) -> dict[str, object]:
    return {"cell_id": cell_id, "group": cell_id.rsplit("-r", 1)[0], "repeat": 1,
            "status": status, "params": {"hardware": "cpu", "gpus": 1}, **extra}


def _run_with(tmp_path: Path, files: dict[str, str]) -> RunPaths:
    paths = RunPaths.create(tmp_path, "m", "r1")
    for rel, text in files.items():
        target = paths.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return paths


def test_damaged_results_are_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = json.dumps(_result("a-r1"))
    paths = _run_with(tmp_path, {
        "plan.json": json.dumps({"cells": [{"id": "a-r1"}, {"id": "b-r1"}, {"id": "c-r1"}]}),
        "cells/a-r1/result.json": good,
        "cells/b-r1/result.json": good[: len(good) // 2],  # truncated
        "cells/c-r1/result.json": json.dumps(_result("c-r1", status="exploded")),
        "cells/d-r1/result.json": json.dumps(_result("d-r1", repeat="one")),
        "cells/e-r1/result.json": "[1, 2]",
        "cells/f-r1/result.json": json.dumps(_result("f-r1", params={"gpus": [1]})),
        "cells/g-r1/result.json": "\xff\xfe",
    })
    with caplog.at_level(logging.WARNING, logger="orchestrator.results.folders.run_folder"):
        results = paths.results()
    assert [r.cell_id for r in results] == ["a-r1"]
    text = caplog.text
    assert "skipping cell b-r1" in text and "unreadable" in text
    assert "unknown status 'exploded'" in text
    assert "skipping cell d-r1" in text and "repeat" in text
    assert "skipping cell e-r1" in text and "expected a JSON object" in text
    assert "skipping cell f-r1" in text and "params.gpus" in text
    assert "skipping cell g-r1" in text


@pytest.mark.parametrize("plan", ["{\"cells\": [", "[]", "{\"cells\": 3}", "{\"cells\": [7]}"])
def test_a_damaged_plan_only_loses_the_order(
    tmp_path: Path, plan: str, caplog: pytest.LogCaptureFixture
) -> None:
    paths = _run_with(tmp_path, {
        "plan.json": plan,
        "cells/b-r1/result.json": json.dumps(_result("b-r1")),
        "cells/a-r1/result.json": json.dumps(_result("a-r1")),
    })
    assert [r.cell_id for r in paths.results()] == ["a-r1", "b-r1"]


def test_report_of_a_damaged_run_warns_and_prints_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.cli import main

    _run_with(tmp_path, {
        "plan.json": "{\"cells\": [{\"id\": \"a-r1\"",
        "cells/a-r1/result.json": json.dumps(_result("a-r1", metrics={"train.total_ips": 5.0})),
        "cells/b-r1/result.json": json.dumps(_result("b-r1", status="weird")),
    })
    assert main(["report", "m", "--results", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "5.0" in captured.out
    assert "warning: skipping cell b-r1" in captured.err and "Traceback" not in captured.err
    assert "plan.json" in captured.err


def test_from_json_round_trip_and_unknown_fields() -> None:
    res = CellResult("a-r1", "a", 1, Status.TIMEOUT, reason="slow", metrics={"x": 1.0})
    data = res.to_json() | {"added_later": True}
    assert CellResult.from_json(data) == res
    with pytest.raises(ValueError, match="missing status"):
        CellResult.from_json({"cell_id": "a", "group": "a", "repeat": 1})


def test_a_fifo_planted_as_result_json_does_not_hang_report(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    paths = _run_with(tmp_path, {"cells/a-r1/result.json": json.dumps(_result("a-r1"))})
    (paths.root / "cells" / "b-r1").mkdir()
    os.mkfifo(paths.root / "cells" / "b-r1" / "result.json")
    os.mkfifo(paths.plan)
    with caplog.at_level(logging.WARNING, logger="orchestrator.results.folders.run_folder"):
        assert [r.cell_id for r in paths.results()] == ["a-r1"]
    assert "not a regular file" in caplog.text


# --- one owner of the layout -----------------------------------------------------------------

PACKAGE = Path(__file__).resolve().parents[1] / "orchestrator"
OWNER = PACKAGE / "results" / "folders" / "run_folder.py"


def owned_names() -> set[str]:
    """The names of the layout under a results root: the str class constants of
    :class:`ResultsRoot` and :class:`RunPaths`."""
    return {value for cls in (ResultsRoot, RunPaths) for name, value in vars(cls).items()
            if name.isupper() and isinstance(value, str)}


def spelled_outside_the_owner(package: Path, names: set[str]) -> list[str]:
    """Where a module of ``package`` other than the owner spells a path of the layout by hand:
    a string constant with one of ``names`` as a path component (``"run.json"``,
    ``"cells/*/result.json"``, an f-string's ``"/log.txt"``), or a bare-word name (``cells``,
    ``superseded``) as an operand of ``/``; and ``.parent.parent`` of a run folder's root (the
    results root reached by hand). Docstrings are prose, not paths."""
    import ast

    found = []
    for path in sorted(package.rglob("*.py")):
        if path.name == OWNER.name and path.parent.name == OWNER.parent.name:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                                    | ast.AsyncFunctionDef)
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        divided = {id(side) for node in ast.walk(tree)
                   if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
                   for side in (node.left, node.right)}
        in_fstrings = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr)
                       for part in node.values}
        where = path.relative_to(package.parent)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "parent" and isinstance(
                    node.value, ast.Attribute) and node.value.attr == "parent" and isinstance(
                    node.value.value, ast.Attribute) and node.value.value.attr == "root":
                found.append(f"{where}:{node.lineno}: .root.parent.parent")
            if isinstance(node, ast.JoinedStr):  # f"{x}/log.txt": a value is no part of a name
                text = "".join(v.value if isinstance(v, ast.Constant) else "\0"
                               for v in node.values)
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and id(node) not in docstrings and id(node) not in in_fstrings):
                text = node.value
            else:
                continue
            for name in sorted(names & set(text.split("/"))):
                if "." in name or "/" in text or id(node) in divided:
                    found.append(f"{where}:{node.lineno}: {text!r}")
    return found


def test_no_module_but_the_owner_spells_a_path_of_the_layout() -> None:
    """Every path under a results root comes from ResultsRoot / RunPaths: no other module of
    the package spells one of their names as a path (a JSON key ``"cells"`` is no path)."""
    names = owned_names()
    assert {"run.json", "plan.json", "result.json", "cells", "superseded", "log.txt",
            ".orchestrate-index.sqlite", ".orchestrate-images.json", ".import.lock"} <= names
    assert spelled_outside_the_owner(PACKAGE, names) == []


def test_the_layout_grep_finds_a_path_spelled_by_hand(tmp_path: Path) -> None:
    """The check itself, on modules that build paths as the code did before RunPaths owned
    them all (each line one way of spelling a path)."""
    (tmp_path / "mod.py").write_text(
        '"""A docstring naming run.json is prose."""\n'
        'def f(run_dir, paths, cell):\n'
        '    a = run_dir / "run.json"\n'
        '    b = paths.root / "superseded" / cell\n'
        '    c = run_dir.glob("*/result.json")\n'
        '    d = paths.root.parent.parent\n'
        '    e = {"cells": []}\n'
        '    g = f"{run_dir}/log.txt", f"{cell}.lock"\n'
        '    return a, b, c, d, e, g\n', encoding="utf-8")
    found = spelled_outside_the_owner(tmp_path, owned_names())
    assert sorted(line.split(":")[1] for line in found) == ["3", "4", "5", "6", "8"], found
