"""The CLI's words (issue 23): counts that agree with what is planned, in the right number, and
the nearest name for a misspelt command or ``--only`` key."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.cli import main

MATRIX = """
    [matrix]
    repeats = 3
    [axes]
    hardware = ["cpu"]
    batch_size = [8, 16]
"""


@pytest.mark.parametrize(("only", "head"), [
    ([], "m: 6 cells (2 configurations x 3 repeats), backend process"),
    (["repeat=1"], "m: 2 cells (2 configurations x 1 repeat), backend process"),
    (["repeat=1", "batch_size=8"], "m: 1 cell (1 configuration x 1 repeat), backend process"),
    (["repeat=2", "repeat=3", "batch_size=16"],
     "m: 2 cells (1 configuration x 2 repeats), backend process"),
])
def test_plan_and_dry_run_headers_count_what_is_planned(
        write_matrix: Callable[..., Path], capsys: pytest.CaptureFixture[str], tmp_path: Path,
        only: list[str], head: str) -> None:
    path = write_matrix(MATRIX)
    flags = [x for o in only for x in ("--only", o)]
    assert main(["plan", str(path), *flags]) == 0
    assert capsys.readouterr().out.splitlines()[0] == head
    assert main(["matrix", str(path), "--dry-run", "--results", str(tmp_path / "r"),
                 *flags]) == 0
    assert capsys.readouterr().out.splitlines()[0] == head


@pytest.mark.parametrize(("argv", "suggestion"), [
    (["mtrix"], "did you mean 'matrix'?"),
    (["histroy", "m"], "did you mean 'history'?"),
    (["images", "lst"], "did you mean 'list'?"),
    (["hosts", "chek"], "did you mean 'check'?"),
])
def test_a_misspelt_command_gets_the_nearest_name(capsys: pytest.CaptureFixture[str],
                                                  argv: list[str], suggestion: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.rstrip().endswith(suggestion)


def test_a_misspelt_only_key_gets_the_nearest_name(write_matrix: Callable[..., Path],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = write_matrix(MATRIX)
    for argv in (["plan", str(path)], ["matrix", str(path), "--dry-run"]):
        assert main([*argv, "--only", "batchsize=8"]) == 2
        assert "--only: batchsize: unknown parameter; did you mean batch_size?" in (
            capsys.readouterr().err)
    assert main(["plan", str(path), "--only", "repeats=1"]) == 2
    assert "did you mean repeat?" in capsys.readouterr().err
