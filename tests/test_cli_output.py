"""What the CLI writes besides results: log levels (-q / -v), library warnings kept out of the
user's way, and a quiet end when the reader of its output goes away (``| head``)."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
import warnings
from argparse import Namespace
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.cli import sweep_commands as sweep_command
from orchestrator.cli.app import EXIT_BROKEN_PIPE

ROOT = Path(__file__).resolve().parents[1]


def _noisy(args: Namespace) -> int:
    warnings.warn("a library deprecation", UserWarning, stacklevel=1)
    log = logging.getLogger("orchestrator.noisy")
    log.warning("something the user should know")
    log.info("some detail")
    log.debug("a debug line")
    print("the output")
    return 0


@pytest.mark.parametrize(("flags", "shown", "hidden"), [
    ([], ["warning: something the user should know"],
     ["a library deprecation", "some detail", "a debug line"]),
    (["-q"], [], ["something the user should know", "a library deprecation", "some detail"]),
    (["-v"], ["warning: something", "info: some detail", "a library deprecation"],
     ["a debug line"]),
    (["-vv"], ["debug: a debug line", "info: some detail"], []),
])
def test_log_levels_and_library_warnings(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    flags: list[str], shown: list[str], hidden: list[str],
) -> None:
    monkeypatch.setattr(sweep_command, "cmd_validate", _noisy)
    assert main([*flags, "validate", "x.toml"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "the output\n"
    for text in shown:
        assert text in captured.err
    for text in hidden:
        assert text not in captured.err


def test_logging_is_left_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep_command, "cmd_validate", _noisy)
    root = logging.getLogger()
    before = (list(root.handlers), root.level, warnings.showwarning)
    main(["-v", "validate", "x.toml"])
    assert (list(root.handlers), root.level, warnings.showwarning) == before


def test_q_and_v_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["-q", "-v", "schema"])
    assert info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.subprocess  # the CLI in a process, its pipe closed early
def test_output_piped_into_head_ends_quietly(tmp_path: Path) -> None:
    """The reader closes the pipe before the (1 MB) plan is written: no traceback, exit 141."""
    seeds = ", ".join(str(i) for i in range(3000))
    matrix = tmp_path / "big.toml"
    matrix.write_text(f'[workload]\nhardware = "cpu"\n[axes]\nseed = [{seeds}]\n'
                      '[hardware.cpu]\ndevice = "cpu"\n')
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "plan", "--json", str(matrix)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(10) == b'[\n  {"id":'  # one cell a line
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(60) == EXIT_BROKEN_PIPE
    assert err == "", err


@pytest.mark.subprocess  # a real bash pipeline
def test_shell_pipeline_into_head(tmp_path: Path) -> None:
    proc = subprocess.run(
        f"{sys.executable} -m orchestrator schema | head -n 1; echo \"status ${{PIPESTATUS[0]}}\"",
        shell=True, executable="/bin/bash", capture_output=True, text=True, cwd=ROOT, timeout=60,
    )
    assert proc.stdout.startswith("{\n")
    assert proc.stdout.splitlines()[-1] in ("status 0", f"status {EXIT_BROKEN_PIPE}")
    assert proc.stderr == ""


def test_terminal_progress_shows_brackets_as_they_are(tmp_path):
    """A reason such as ``[Errno 28] ...`` or a path with ``[/x]`` is text, not rich markup:
    shown whole, and never a MarkupError in the middle of a sweep."""
    import io

    from rich.console import Console
    from rich.progress import Progress, TextColumn

    from orchestrator.cli.sweep_commands import RichEvents
    from orchestrator.plan.matrix import load_matrix
    from orchestrator.plan.placement import Allocation
    from orchestrator.results.folders.run_folder import CellResult, RunPaths, Status

    (tmp_path / "m.toml").write_text('[matrix]\nname = "m"\n[axes]\nhardware = ["cpu"]\n'
                                     '[hardware.cpu]\ndevice = "cpu"\n')
    cell = load_matrix(tmp_path / "m.toml").cells[0]
    buf = io.StringIO()
    events = RichEvents()
    events.console = Console(file=buf, width=300, color_system=None)
    events.progress = Progress(TextColumn("[bold]{task.description}"),
                               TextColumn("{task.fields[status]}"), console=events.console)
    with events:
        events.sweep_started(RunPaths(tmp_path / "r[/x]"), [cell], {})
        events.log("waiting for [/dim] the CPU")
        events.cell_started(cell, Allocation.local(cell.id))
        events.lock_wait(cell.id, "waiting for the CPU of localhost: held by run m/[/x]", None)
        events.lock_wait(cell.id, "got the CPU of localhost after waiting 3 s", 3.0)
        events.cell_finished(cell, CellResult(cell.id, cell.group, 1, Status.FAILED,
                                              reason="[Errno 28] No space left on device [/x]"))
    out = buf.getvalue()
    assert f"run folder: {tmp_path / 'r[/x]'}" in out
    assert "waiting for [/dim] the CPU" in out
    assert f"{cell.id}: waiting for the CPU of localhost: held by run m/[/x]" in out
    assert f"{cell.id}: got the CPU of localhost after waiting 3 s" in out
    assert "[Errno 28] No space left on device [/x]" in out


@pytest.mark.subprocess  # the CLI in a process, its pipe closed early
def test_images_list_into_head_exits_141_and_a_pipe_gets_plain_tables(tmp_path: Path) -> None:
    """Issue 23: ``images list | head -2`` exited 1 without a word (rich's own answer to a closed
    pipe), and piped, rich wrapped its tables to 80 columns (354 lines). Issue 31: the plain
    tables that replaced them were 305 columns wide; piped it fits 100, each variable on a line
    of its own that starts with its name."""
    cmd = [sys.executable, "-m", "orchestrator.cli", "images", "list"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(10)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(60) == EXIT_BROKEN_PIPE
    assert err == "", err

    from orchestrator.catalog import templates

    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=60,
                         env={"COLUMNS": "80", "PATH": "/usr/bin:/bin"}).stdout
    lines = out.splitlines()
    assert max(map(len, lines)) <= 100
    blocks = {block.split(" ", 1)[0]: block.splitlines() for block in out.split("\n\n") if block}
    for name in templates.template_names():
        template = templates.load_template(name)
        assert blocks[name][0].startswith(f"{name} ({template.kind}): "), name
        for variable, spec in template.variables.items():  # a line per variable, its name first
            (line,) = [ln for ln in blocks[name] if ln.startswith(f"  {variable} ")]
            assert line.split()[1] == spec.type, line
    assert not any("│" in ln or "┃" in ln for ln in lines)  # no rich box drawing in a pipe


def test_plan_table_is_tabulates_simple_table() -> None:
    """The plan's table (:func:`text_table`, written without tabulate for speed) is byte for
    byte what tabulate's "simple" table with disable_numparse gives, for every kind of value a
    cell parameter takes; values tabulate lays out otherwise (several lines, escapes, non-ASCII)
    are laid out by tabulate itself."""
    import random

    from tabulate import tabulate

    values = [None, True, False, 0, 7, 123456, 1.5, 0.25, 1e-7, "", "x", "resnet18", "a b",
              "wide_resnet50_2", "/data/x y", "é", "a\nb", "\x1b[1mB\x1b[0m", "tab\tx"]
    rng = random.Random(7)
    for _ in range(400):
        width = rng.randint(1, 6)
        headers = [rng.choice(["cell", "n", "hash", "x", "precision", "é"]) for _ in range(width)]
        rows = [[rng.choice(values) for _ in range(width)] for _ in range(rng.randint(0, 5))]
        assert sweep_command.text_table(headers, rows) == tabulate(
            rows, headers=headers, tablefmt="simple", disable_numparse=True), (headers, rows)


def test_plan_json_is_one_cell_a_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """plan --json is one JSON array, each cell (with its launch) compact on a line of its own:
    written as it is made, greppable, parsed back whole."""
    import json

    matrix = tmp_path / "m.toml"
    matrix.write_text('[workload]\nhardware = "cpu"\n[axes]\nbatch_size = [1, 2, 3]\n'
                      '[hardware.cpu]\ndevice = "cpu"\n')
    assert main(["plan", str(matrix), "--json", "--results", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "[" and lines[-1] == "]" and len(lines) == 5
    cells = json.loads(out)
    assert [json.loads(line.rstrip(",")) for line in lines[1:-1]] == cells
    assert [c["params"]["batch_size"] for c in cells] == [1, 2, 3]
    assert all(c["launch"]["cell_id"] == c["id"] for c in cells)
    empty = io.StringIO()
    sweep_command.write_json_array(empty, [])
    assert json.loads(empty.getvalue()) == []
