"""The recipe "A backend" of docs/contributing.md, done: a toy backend (tests/toy_backend.py,
one module) and its record (registered here, in the test) are all it takes for ``validate``,
``--dry-run`` and a sweep to run through it; no shipped file names it. The checks, the
runtimes' refusals and the CLI learn what it can do from its record alone.

The toy backend is no fake: its cells run (as subprocesses of the STAND-IN workload,
tests/standin/), so the sweep test is in the integration tier; the others run nothing.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.backends import BackendRecord, backend_names, register, unregister
from orchestrator.cli import main

ROOT = Path(__file__).resolve().parents[1]

#: The toy backend's record: the one line the recipe adds to orchestrator/backends/registry.py.
RECORD = BackendRecord("toy", "toy_backend:ToyBackend", runtime="none", runtimes=("none",),
                       here=True)


@pytest.fixture
def toy() -> Iterator[BackendRecord]:
    """The toy backend, registered for the test (and taken out after it)."""
    register(RECORD)
    try:
        yield RECORD
    finally:
        unregister(RECORD.name)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return code, out.out, out.err


def test_a_sweep_runs_through_the_toy_backend(
    toy: BackendRecord, standin, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """validate, the dry run and the sweep, through the CLI, on the toy backend named by the
    matrix file: every cell ends ok with the stand-in's figures, recorded as the toy's; and
    ``orchestrate backends`` lists it."""
    path = tmp_path / "m.toml"
    path.write_text(standin.matrix("toymatrix").replace(
        "[matrix]\n", '[matrix]\nbackend = "toy"\n', 1)
        + '[hardware.cpu]\ndevice = "cpu"\n[axes]\nbatch_size = [2, 4]\n')
    results = tmp_path / "results"

    code, out, err = _run(["validate", path], capsys)
    assert code == 0, err
    assert "hardware cpu (toy backend)" in out

    code, out, err = _run(["matrix", path, "--dry-run", "--results", results], capsys)
    assert code == 0, err
    assert "toymatrix: 2 cells" in out and "backend toy" in out
    assert f"commands (toy backend; cell folders under {results}/toymatrix/<run id>/):" in out
    assert out.count(str(standin.path)) == 2  # each cell's command line
    assert not results.exists()

    code, out, err = _run(["-q", "matrix", path, "--results", results], capsys)
    assert code == 0, err
    assert "2 cells: 2 ok" in out
    (run,) = (results / "toymatrix").iterdir()
    assert json.loads((run / "run.json").read_text())["backend"] == "toy"
    cells = sorted((run / "cells").iterdir())
    assert len(cells) == 2
    for cell in cells:
        result = json.loads((cell / "result.json").read_text())
        assert result["status"] == "ok", result
        assert result["provenance"]["backend"] == "toy"
        assert result["metrics"]["train.total_ips"] > 0
        assert result["provenance"]["program"]["name"] == "standin"
        assert "machine" in result and result["machine"]["start"]  # record: here = True

    code, out, _ = _run(["backends"], capsys)  # (asks every backend: Docker, Slurm)
    assert code == 0
    assert re.search(r"^toy +available$", out, re.M)


def test_the_checks_read_the_toy_record_not_its_name(
    toy: BackendRecord, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """What the toy's record does not list is refused, in words built from the records: a
    runtime it does not run (and the backends that do), a cell over several nodes."""
    assert "toy" in backend_names()
    path = tmp_path / "m.toml"
    path.write_text('[matrix]\nbackend = "toy"\n[workload]\nhardware = "cpu"\nnodes = 2\n'
                    'gpus = 2\n[hardware.cpu]\ndevice = "cpu"\nruntime = "apptainer"\n'
                    'apptainer = { sif = "/x.sif" }\n')
    code, _, err = _run(["validate", path], capsys)
    assert code == 2
    assert ("hardware.cpu.runtime: runtime 'apptainer' runs `apptainer exec` on the process, "
            "ssh and slurm backends; the toy backend runs Docker containers") in err
    assert "workload.nodes: nodes = 2: the toy backend runs a cell on one machine" in err

    register(dataclasses.replace(RECORD, runtimes=("none", "apptainer"), multi_node="nodes"))
    code, _, err = _run(["validate", path], capsys)
    assert "hardware.cpu.runtime" not in err and "workload.nodes" not in err


def test_the_recipe_names_every_fact_of_a_record() -> None:
    """docs/contributing.md's recipe says what each field of a record means: a field added to
    BackendRecord must be added to the recipe (a new backend's author fills it in)."""
    text = (ROOT / "docs" / "contributing.md").read_text(encoding="utf-8")
    recipe = text[text.index("**A backend.**"):text.index("**An image template.**")]
    missing = [f.name for f in dataclasses.fields(BackendRecord)
               if f"`{f.name}`" not in recipe]
    assert not missing, f"the recipe does not name {missing}"
    for path in ("orchestrator/backends/registry.py", "tests/toy_backend.py",
                 "tests/test_backend_recipe.py"):
        assert path in recipe and (ROOT / path).exists(), path
