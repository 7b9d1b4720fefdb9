"""The matrix an import joins: one rule for ``--matrix NAME`` and ``--matrix FILE`` (a matrix
file's configuration whenever there is one; then the runs' configurations; then a matrix
written from the logs), ``--set`` on import, and ``history`` of what it makes (issue 31).

The logs are our workload's JSON lines, written in-process by its own Reporter (the DLLogger
formats have their own tests, tests/test_import.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.errors import ConfigError
from orchestrator.results.folders.run_folder import RunPaths, runs_of
from orchestrator.results.importer.target import matrix_file_named
from orchestrator.results.reports.history import run_headers

MATRIX = """\
[matrix]
name = "lab"
description = "the lab's matrix"

[workload]
hardware = "v100"
arch = "resnet50"
batch_size = 32
iterations = 100

[axes]
precision = ["fp32", "amp"]

[hardware.v100]
device = "cuda"
gpu = "V100"
"""


def workload_log(path: Path, ips: float, precision: str = "amp") -> Path:
    """A log of our workload (its meta and summary lines), as a cell's output has them."""
    from workload.output import Reporter

    with path.open("w") as fh:
        rep = Reporter(fh)
        rep.emit({"type": "meta", "env": {"arch": "resnet50", "mode": "train", "batch_size": 32,
                                          "precision": precision, "world_size": 1,
                                          "hardware": "v100"}})
        rep.emit({"type": "summary", "status": "ok", "env": {"device": "cuda"},
                  "data": {"train.total_ips": ips}})
    return path


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder with matrices/lab_matrix.toml (matrix ``lab``: the name is not the
    file's) and three logs; ``--matrix lab`` is looked up under its ./matrices/."""
    (tmp_path / "matrices" / "sub").mkdir(parents=True)
    (tmp_path / "matrices" / "sub" / "lab_matrix.toml").write_text(MATRIX)
    (tmp_path / "matrices" / "sub" / "lab.references.toml").write_text("[[reference]]\n")
    for n in (1, 2, 3):
        workload_log(tmp_path / f"log{n}.txt", 1000.0 + n)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def imported(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["import", *args, "--results", "results", "--param", "hardware=v100"]) == 0, \
        capsys.readouterr().err
    return capsys.readouterr().out


def test_a_name_joins_its_matrix_file_even_without_runs(lab: Path, capsys) -> None:
    """Issue 31: `import X --matrix NAME` with no runs yet wrote a matrix "generated from the
    imported logs" and ignored the shipped file: another configuration than the sweeps'."""
    out = imported(capsys, "log1.txt", "--matrix", "lab")
    assert out.splitlines()[0].startswith("matrix lab (matrices/sub/lab_matrix.toml), run ")
    out = imported(capsys, "log2.txt", "--matrix", "matrices/sub/lab_matrix.toml")
    assert out.splitlines()[0].startswith("matrix lab (matrices/sub/lab_matrix.toml), run ")
    hashes = [{c["hash"] for c in json.loads(RunPaths(run.root).plan.read_text())["cells"]}
              for run in runs_of(Path("results"), "lab")]
    assert len(hashes) == 2 and hashes[0] == hashes[1]  # one configuration, whichever form
    assert "iterations = 100" in (runs_of(Path("results"), "lab")[0].root
                                  / "matrix.toml").read_text()  # the file, not generated


def test_history_of_name_and_file_imports_is_one_line(lab: Path, capsys) -> None:
    """The issue's history: "insufficient history" beside "dropped (not in the matrix)", and two
    runs of one second under one column header."""
    for n, how in ((1, "lab"), (2, "matrices/sub/lab_matrix.toml"), (3, "lab")):
        imported(capsys, f"log{n}.txt", "--matrix", how, "--run-id",
                 f"20261127-154102-000{n}")
    assert main(["history", "lab", "--results", "results", "--min-history", "2"]) == 0
    out = capsys.readouterr().out
    assert "dropped" not in out and "insufficient history" not in out
    head = out.splitlines()[0]
    assert all(f"20261127-154102-000{n}" in head for n in (1, 2, 3))


def test_run_headers_are_whole_ids_only_where_two_would_read_the_same() -> None:
    assert run_headers(["20261127-154102-aaaa", "20261127-154102-bbbb",
                        "20261128-000000-cccc"]) == [
        "20261127-154102-aaaa", "20261127-154102-bbbb", "20261128-000000-cccc"[:15]]


def test_a_name_without_a_file_still_joins_its_runs_or_is_generated(tmp_path: Path,
                                                                    monkeypatch, capsys) -> None:
    workload_log(tmp_path / "log.txt", 900.0)
    monkeypatch.chdir(tmp_path)  # no ./matrices here
    out = imported(capsys, "log.txt", "--matrix", "elsewhere")
    assert "(generated from the imported logs)" in out.splitlines()[0]
    workload_log(tmp_path / "log2.txt", 901.0)
    out = imported(capsys, "log2.txt", "--matrix", "elsewhere")
    assert "(the runs of elsewhere under results/elsewhere)" in out.splitlines()[0]


def test_set_on_import_joins_the_configuration_a_sweep_with_it_runs(lab: Path, capsys) -> None:
    from orchestrator.plan.matrix import load_matrix

    overrides = ["workload.iterations=20"]
    want = {c.group: c.hash for c in load_matrix(Path("matrices/sub/lab_matrix.toml"),
                                                 overrides=overrides).cells}
    imported(capsys, "log1.txt", "--matrix", "lab", "--set", overrides[0])
    (run,) = runs_of(Path("results"), "lab")
    plan = json.loads(RunPaths(run.root).plan.read_text())
    assert plan["set"] == overrides
    assert {c["hash"] for c in plan["cells"]} == {want["v100-g1-bs32-amp"]}
    assert main(["report", "lab", "--results", "results"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("run with --set workload.iterations=20")


def test_an_import_beside_its_runs_configuration_is_warned_of(lab: Path, capsys) -> None:
    """The runs ran the file as written; an import with --set lands in another configuration:
    said, not silent."""
    imported(capsys, "log1.txt", "--matrix", "lab")
    assert main(["import", "log2.txt", "--matrix", "lab", "--results", "results", "--param",
                 "hardware=v100", "--set", "workload.iterations=20"]) == 0
    err = capsys.readouterr().err
    assert "warning: v100-g1-bs32-amp: matrices/sub/lab_matrix.toml with --set " \
        "workload.iterations=20 makes it configuration" in err
    assert "`history` shows this import apart from them" in err
    imported(capsys, "log3.txt", "--matrix", "lab")
    assert "warning" not in capsys.readouterr().err


def test_set_needs_a_matrix_file(tmp_path: Path, monkeypatch, capsys) -> None:
    workload_log(tmp_path / "log.txt", 900.0)
    monkeypatch.chdir(tmp_path)
    assert main(["import", "log.txt", "--matrix", "nofile", "--param", "hardware=v100",
                 "--set", "workload.iterations=20"]) == 2
    assert "--set: --set sets a field of a matrix file, and matrix 'nofile' has none under " \
        "matrices/: give --matrix FILE.toml" in capsys.readouterr().err


def test_bad_set_on_import_names_the_file_and_the_override(lab: Path, capsys) -> None:
    assert main(["import", "log1.txt", "--matrix", "lab", "--results", "results",
                 "--set", "workload.iterations=0"]) == 2
    assert ("matrices/sub/lab_matrix.toml: workload.iterations: Input should be greater than 0 "
            "(got 0) (from --set workload.iterations=0)") in capsys.readouterr().err


def test_two_files_of_one_name_are_refused(lab: Path) -> None:
    (lab / "matrices" / "copy.toml").write_text(MATRIX)
    with pytest.raises(ConfigError, match="2 matrix files under matrices/ are matrix 'lab'"):
        matrix_file_named("lab")
    assert matrix_file_named("lab_matrix") is None  # the name, not the file's, counts
    assert matrix_file_named("lab.references") is None  # no matrix in it
