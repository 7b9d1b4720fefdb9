"""One run-name grammar (issue 23): ``MATRIX:RUN``, a unique prefix, ``latest``, ``latest~N``,
for ``report``, ``compare``, ``history``, ``export`` and ``clean``; ``latest`` without a matrix
is the newest run of the one matrix the results hold. Synthetic run folders."""

from __future__ import annotations

from pathlib import Path

import pytest
from results_support import Config, day, params, run_id, write_run

from orchestrator.cli import main
from orchestrator.cli.result_commands import report_run
from orchestrator.errors import ConfigError


def runs(root: Path, matrices: tuple[str, ...] = ("nightly",)) -> None:
    """Four runs of each matrix: days 1..4 (ids 202611DD-000000-aaaa)."""
    for matrix in matrices:
        for n in (1, 2, 3, 4):
            write_run(root, matrix, run_id(n), [Config(params(gpus=1), [100.0 + n])],
                      started=day(n))


@pytest.mark.parametrize(("matrix", "spec", "expected"), [
    ("nightly", "latest~3", run_id(1)),
    (None, "nightly:latest~3", run_id(1)),
    ("nightly", "nightly:latest~1", run_id(3)),
    (None, "latest~2", run_id(2)),  # the one matrix under the results
    (None, "nightly:20261102", run_id(2)),  # a prefix
    (None, None, None),  # the newest
])
def test_report_takes_every_form(tmp_path: Path, matrix: str | None, spec: str | None,
                                 expected: str | None) -> None:
    runs(tmp_path)
    assert report_run(tmp_path, matrix, spec) == ("nightly", expected if spec is None else (
        spec.rpartition(":")[2]))
    args = ["report", *([matrix] if matrix else []), *(["--run", spec] if spec else []),
            "--results", str(tmp_path)]
    assert main(args) == 0


def test_report_with_several_matrices_says_which(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    runs(tmp_path, ("nightly", "weekly"))
    assert main(["report", "--run", "latest~1", "--results", str(tmp_path)]) == 2
    assert "say which matrix" in capsys.readouterr().err
    assert main(["report", "--run", "weekly:latest~1", "--results", str(tmp_path)]) == 0
    assert f"weekly/{run_id(3)}" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="is a run of weekly, not of nightly"):
        report_run(tmp_path, "nightly", "weekly:latest")


def test_compare_latest_with_one_matrix_and_an_unqualified_second_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs(tmp_path)
    assert main(["compare", "latest", "latest~1", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"A: nightly:{run_id(4)}" in out and f"B: nightly:{run_id(3)}" in out
    runs(tmp_path / "two", ("nightly", "weekly"))
    assert main(["compare", "weekly:latest~1", "latest", "--results",
                 str(tmp_path / "two")]) == 0  # the second run: the first one's matrix
    out = capsys.readouterr().out
    assert f"A: weekly:{run_id(3)}" in out and f"B: weekly:{run_id(4)}" in out
    assert main(["compare", "latest", "latest~1", "--results", str(tmp_path / "two")]) == 2
    assert "say which matrix" in capsys.readouterr().err


def test_history_and_export_take_the_same_forms(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    runs(tmp_path)
    assert main(["history", "nightly", "--run", "nightly:latest~1", "--results",
                 str(tmp_path)]) == 0
    assert f"newest {run_id(3)}" in capsys.readouterr().out
    assert main(["export", "--run", "latest~1", "--results", str(tmp_path)]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    assert rows and all(f",{run_id(3)}," in row for row in rows)


def test_clean_resolves_run_names_in_the_results(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``clean --run`` asks the engine for the containers of a run id: a name is resolved
    first (the engine itself is faked: only the labels it is asked for matter here)."""
    from orchestrator.cli import maintenance_commands
    from orchestrator.local import engine

    runs(tmp_path)
    asked: list[dict[str, str]] = []

    class Client:
        def close(self) -> None: ...

    monkeypatch.setattr(engine, "docker_client", lambda: Client())
    monkeypatch.setattr(engine, "leftover_containers",
                        lambda client, labels: asked.append(dict(labels)) or [])
    for spec, expected in [("nightly:latest~1", run_id(3)), ("latest", run_id(4)),
                           ("20261102", run_id(2)), ("20991231-000000-zzzz",
                                                     "20991231-000000-zzzz")]:
        asked.clear()
        assert main(["clean", "--run", spec, "--dry-run", "--results", str(tmp_path)]) == 0
        assert asked[0][engine.LABEL_RUN] == expected, spec
    with pytest.raises(ConfigError, match="--run"):
        maintenance_commands._run_label("nosuch:latest", None, tmp_path)


def test_publish_without_a_matrix_says_how_publish_names_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """publish takes MATRIX[:RUN], not report's --run: its refusal says so."""
    runs(tmp_path, ("nightly", "weekly"))
    assert main(["publish", "--results", str(tmp_path), "--http", "http://127.0.0.1:9/x"]) == 2
    err = capsys.readouterr().err
    assert "say which matrix: orchestrate publish MATRIX[:RUN] (runs of nightly, weekly)" in err
    assert "--run" not in err


def test_runs_of_a_matrix_without_runs_says_so_in_one_phrase(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs(tmp_path)
    assert main(["runs", "weekly", "--results", str(tmp_path)]) == 0
    assert capsys.readouterr().out == (
        f"(no runs of 'weekly' under {tmp_path} (runs of nightly))\n")


@pytest.mark.parametrize(("command", "status"), [
    (["runs", "{name}"], 0), (["export", "{name}"], 0),  # listings: an empty answer is an answer
    (["report", "{name}"], 2), (["history", "{name}"], 2),  # these need a run
    (["compare", "{name}:latest", "nightly:latest~1"], 2),
    (["publish", "{name}", "--http", "http://127.0.0.1:9/x"], 2),
])
def test_a_matrix_without_runs_gets_one_wording_and_the_name_meant(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str],
        status: int) -> None:
    """Every command that takes a matrix name says of one without runs the same thing: the
    matrix meant when the name looks misspelt, else the matrices that have runs (runs and
    export said 'no runs of' and nothing else, compare 'no run 'latest' of ...')."""
    runs(tmp_path, ("nightly", "weekly"))
    for name, hint in (("nigthly", ": did you mean 'nightly'?"),
                       ("zzz", " (runs of nightly, weekly)")):
        args = [part.format(name=name) for part in command]
        assert main([*args, "--results", str(tmp_path)]) == status, args
        said = capsys.readouterr()
        assert f"no runs of {name!r} under {tmp_path}{hint}" in said.out + said.err, (args, said)


def test_report_takes_matrix_colon_run_as_publish_and_logs_do(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`report nightly:RUN` is the run (it was refused: "cannot be a folder name"); a run given
    twice is refused naming both."""
    runs(tmp_path)
    assert main(["report", f"nightly:{run_id(2)}", "--results", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith(f"{tmp_path}/nightly/{run_id(2)}\n")
    assert report_run(tmp_path, "nightly:latest~3", None) == ("nightly", "latest~3")
    with pytest.raises(ConfigError, match="names a run and so does --run latest: give one"):
        report_run(tmp_path, "nightly:latest", "latest")
