"""The CLI's words (issue 23): counts that agree with what is planned, in the right number, and
the nearest name for a misspelt command or ``--only`` key; (issue 31) for a misspelt option and
for a word that means a sweep, ``images list`` within 100 columns in a pipe, and a compare
page that names its runs in the order it shows them."""

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
    # a word for what a command does: `run` is nearest to `runs`, but most likely means a sweep
    (["run", "m.toml"], "did you mean 'matrix' (run a sweep: every cell of a matrix file) or "
     "'runs' (list runs: date, matrix, backend, cells ok/failed, duration, revision)?"),
    (["sweep", "m.toml"], "did you mean 'matrix' (run a sweep: every cell of a matrix file)?"),
    (["launch"], "did you mean 'matrix' (run a sweep: every cell of a matrix file) or 'plan' "
     "(print the expanded cells of a matrix)?"),
    (["runn"], "did you mean 'runs'?"),
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


@pytest.mark.parametrize(("argv", "suggestion"), [
    (["matrix", "m.toml", "--dryrun"], "unrecognized arguments: --dryrun; did you mean "
     "--dry-run?"),
    (["matrix", "m.toml", "--dry_run"], "did you mean --dry-run?"),
    (["plan", "m.toml", "--jsn"], "did you mean --json?"),
    (["history", "m", "--allow_dropped"], "did you mean --allow-dropped?"),
    (["images", "build", "x", "--dryrun", "--sett", "a=1"],
     "did you mean --dry-run (for --dryrun), --set (for --sett)?"),
    (["--verbse", "runs"], "did you mean --verbose?"),
    (["runs", "--zzzzz"], "unrecognized arguments: --zzzzz"),  # nothing near: nothing said
])
def test_a_misspelt_option_gets_the_nearest_one_of_its_command(
        capsys: pytest.CaptureFixture[str], argv: list[str], suggestion: str) -> None:
    """Issue 31: `--dryrun` got no "did you mean --dry-run"."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.rstrip().endswith(suggestion)


def test_images_list_in_a_pipe_fits_100_columns(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 31: piped, `images list` was 305 columns wide (one table row per variable)."""
    from orchestrator.catalog import templates
    from orchestrator.cli.image_commands import piped_lines

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such-docker.sock")
    assert main(["images", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 100
    for name in templates.template_names():
        for variable in templates.load_template(name).variables:
            assert [ln for ln in lines if ln.startswith(f"  {variable} ")], (name, variable)
    long = piped_lines("t (dockerfile): " + "word " * 40, [
        ("v", "str (path)", "/a/" + "x" * 150, "d " * 80)], "  local images: " + "tag, " * 40,
        width=60)
    assert max(map(len, long)) <= 60 and long[0].startswith("t (dockerfile): word")


def test_the_compare_page_names_its_runs_in_the_order_it_shows_them(tmp_path: Path) -> None:
    """Issue 31: the compare HTML's title said "B vs A" while the page lists A first."""
    import re

    from results_support import Config, day, params, run_id, write_run

    from orchestrator.results.folders.store import open_store
    from orchestrator.results.reports.compare import compare_runs
    from orchestrator.results.reports.report_html import compare_report

    for n, ips in ((1, 100.0), (2, 90.0)):
        write_run(tmp_path, "m", run_id(n), [Config(params(), [ips, ips + 1, ips - 1])],
                  started=day(n))
    with open_store(tmp_path) as store:
        comp = compare_runs(store, *store.runs())
    html = compare_report(comp)
    title = re.search(r"<title>(.*?)</title>", html, re.S)
    assert title is not None
    a, b = comp.a.label, comp.b.label
    assert title.group(1).strip() == f"A: {a} vs B: {b}"
    assert html.index(f"Run A: {a}") < html.index(f"Run B: {b}")
