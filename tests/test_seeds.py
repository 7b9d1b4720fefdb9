"""The seed matrices (matrices/seeds/) against the seeds: every cell's command, word for word.

Each seed's own command lines are in its translation table (``matrices/seeds/translation/``,
read by tests/seed_spec.py): lines of the seed's file in ``../shared/seeds`` (checked here to be
there verbatim) or of the script the seed ran at its pinned revision (quoted with path and
revision). Every cell's command -- what the docker / slurm backends start, :func:`cell_command`
-- must equal its seed line with the table's declared differences applied; docs/seeds.md is
rendered from the same tables and must equal them.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
import seed_spec
from gpu_support import GAUDI, facts

from orchestrator.backends.checks import check_matrix
from orchestrator.plan.launch import cell_command
from orchestrator.plan.matrix import Cell, Matrix, load_matrix
from orchestrator.runtimes.docker import CONTAINER_OUT, CONTAINER_PYTHON

ROOT = Path(__file__).resolve().parents[1]
SEEDS = ROOT / "matrices" / "seeds"
HERE = Path(__file__).resolve()


def seeds_dir() -> Path | None:
    for base in (os.environ.get("ORCHESTRATE_SEEDS"), HERE.parents[2] / "shared" / "seeds",
                 "/work/shared/seeds"):
        if base and Path(base).is_dir():
            return Path(base)
    return None


SPECS = seed_spec.load_all()


def load(spec: seed_spec.Spec) -> Matrix:
    return load_matrix(SEEDS / spec.matrix)


def rendered(matrix: Matrix, cell: Cell) -> list[str]:
    """The cell's command as its backend starts it: in a container (python3, the cell folder
    at /orchestrate/out) or, for the Apptainer profile, the program part of it (what runs inside
    the image; `{cell}` stands for the cell folder)."""
    profile = matrix.profile(cell)
    output = "{cell}" if profile.apptainer_runtime else CONTAINER_OUT
    return cell_command(cell, profile, matrix.program(cell), python=CONTAINER_PYTHON,
                        output_dir=output).argv


@pytest.mark.parametrize("number", seed_spec.NUMBERS)
def test_every_seed_cell_runs_its_seed_line_but_the_declared_differences(number: str) -> None:
    spec = SPECS[number]
    matrix = load(spec)
    for cell in matrix.cells:
        ours = rendered(matrix, cell)
        theirs, stale = seed_spec.translate(spec, cell, seed_spec.seed_argv(spec, cell))
        assert stale == [], (cell.id, stale)
        assert ours == theirs, (cell.id, _first_difference(ours, theirs))


@pytest.mark.parametrize("number", seed_spec.NUMBERS)
def test_every_line_and_difference_concerns_some_cell(number: str) -> None:
    """No line or difference of a table is dead: each selects at least one cell."""
    spec = SPECS[number]
    cells = load(spec).cells
    for entry in (*spec.lines, *spec.differences, *spec.extra_cells):
        assert any(seed_spec.selects(entry.cells, c) for c in cells), (number, entry)


def _first_difference(ours: list[str], theirs: list[str]) -> str:
    for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            return f"word {i}: ours {a!r}, the seed's {b!r}"
    return f"lengths {len(ours)} vs {len(theirs)}"


@pytest.mark.parametrize("number", seed_spec.NUMBERS)
def test_the_lines_quoted_from_a_seed_file_are_in_it(number: str) -> None:
    """A line whose source is the seed's file is there verbatim, for every cell's values."""
    folder = seeds_dir()
    if folder is None:
        pytest.skip("no seeds folder (../shared/seeds)")
    spec = SPECS[number]
    text = (folder / spec.file).read_text(encoding="utf-8")
    shown = {" ".join(line.split()) for line in text.splitlines()}
    for cell in load(spec).cells:
        line = seed_spec.line_of(spec, cell)
        if line.source.startswith("the seed's file"):
            assert seed_spec.fill(line.text, line.vars, cell) in shown, (number, cell.id)


def test_seed_003s_learning_rate_is_its_scripts_awk_line() -> None:
    """LR=$(awk 'BEGIN{print total_bz / 1000}'), total_bz = 128 x GPUs: awk prints %.6g."""
    rule = SPECS["003"].lines[0].vars["LR"]
    assert rule["param"] == "gpus"
    for gpus, lr in rule["values"].items():
        assert lr == f"{128 * int(gpus) / 1000:.6g}"


def test_seed_002s_revision_ships_no_table_rule() -> None:
    """The seed's own directory breakdown (its README at 7961513) names every file of
    sec5a_resnet: no analysis script, so the table rule is a declared difference."""
    folder = seeds_dir()
    if folder is None:
        pytest.skip("no seeds folder (../shared/seeds)")
    text = (folder / "002_9f0290487a42a6f6.txt").read_text(encoding="utf-8")
    tree = text.split("```", 2)[1]
    files = re.findall(r"── ([^:]+):", tree)
    assert "run-resnet.sh" in files and "torch_imagenet_resnet.py" in files
    assert not [f for f in files if "extract" in f or "analy" in f], files
    table = next(p for p in SPECS["002"].parameters if p.parameter == "table")
    assert table.status == "declared" and "b7ca445" in table.reason


def test_seed_004s_table_says_graph_mode_is_not_measured() -> None:
    """The seed's figures are graph mode; no cell runs it, and the table's header says so."""
    from orchestrator.results.reports import table_rules

    matrix = load(SPECS["004"])
    assert {c.params.hpu_mode for c in matrix.cells} == {"eager", "lazy"}
    note = table_rules.table_rule("habana").unmeasured_note([c.params.model_dump()
                                                            for c in matrix.cells])
    assert "graph mode" in note and "torch.jit.trace" in note
    assert table_rules.table_rule("habana").unmeasured_note([{"hpu_mode": "graph"}]) == ""


def test_docs_seeds_page_is_rendered_from_the_tables() -> None:
    """docs/seeds.md is the tables' rendering (UPDATE_GOLDEN=1 rewrites it)."""
    page = ROOT / "docs" / "seeds.md"
    text = seed_spec.render_page(SPECS)
    if os.environ.get("UPDATE_GOLDEN"):
        page.write_text(text, encoding="utf-8")
    assert page.read_text(encoding="utf-8") == text, (
        "docs/seeds.md differs from matrices/seeds/translation/: "
        "UPDATE_GOLDEN=1 make test PYTEST_ARGS=tests/test_seeds.py")
    # "as written" only where it holds: a seed with no declared difference (and the intro's
    # sentence saying when a seed would be)
    as_written = sum(1 for s in SPECS.values() if seed_spec.counts(s)["declared"] == 0)
    assert text.count("as written") == 1 + as_written


def test_every_declared_parameter_has_a_reason() -> None:
    for number, spec in SPECS.items():
        for p in spec.parameters:
            assert p.status in seed_spec.STATUSES, (number, p.parameter)
            assert p.status == "exact" or p.reason, (number, p.parameter)
        for d in (*spec.differences, *spec.extra_cells):
            assert d.reason, (number, d.parameter)


def test_every_seed_matrix_validates_and_names_its_rule_and_stack() -> None:
    expected = {
        "000": ("dle", {"v100": "21.03", "v100-bitfusion": "21.03"}),
        "001": ("tbd", {"gpu": None}),
        "002": ("per-gpu", {"gpu-node": "22.06"}),
        "003": ("dlperf", {"v100": "20.03"}),
        "004": ("habana", {"gaudi": None}),
    }
    v100s = facts("V100", count=8)  # seed 000 pins gpu_ids = [1]
    machines = {"000": v100s, "001": v100s, "003": v100s,
                "004": GAUDI}  # the docker backend's cells get this machine's (stand-in) GPUs
    for number, (rule, stacks) in expected.items():
        matrix = load(SPECS[number])
        found = check_matrix(matrix, machine=machines.get(number))
        assert found.errors == [], (number, found.errors)
        assert matrix.settings.table_rule == rule
        for hw, release in stacks.items():
            assert found.stacks[hw].release == release, (number, hw)


def test_the_seed_matrices_are_the_ones_listed() -> None:
    assert {s.matrix for s in SPECS.values()} == {p.name for p in SEEDS.glob("*.toml")}


def test_graph_mode_is_refused_with_its_reason_on_the_seeds_gaudi_software(tmp_path: Path
                                                                            ) -> None:
    text = (SEEDS / "004_habana.toml").read_text().replace(
        'hpu_mode = ["eager", "lazy"]', 'hpu_mode = ["eager", "lazy", "graph"]')
    path = tmp_path / "004.toml"
    path.write_text(text)
    found = check_matrix(load_matrix(path), machine=GAUDI)
    assert [p.field for p in found.errors] == ["axes.hpu_mode[2]"]
    assert "torch.jit.trace" in found.errors[0].message
    assert "use hpu_mode = \"lazy\"" in found.errors[0].message


@pytest.mark.slurm  # the dry run of the slurm backend asks for sbatch and squeue
@pytest.mark.subprocess  # the CLI in a process
def test_seed_002s_dry_run_prints_the_seeds_command(tmp_path: Path) -> None:
    """`orchestrate matrix --dry-run` of the Slurm seed prints each cell's apptainer command:
    after the image, the seed's own line (with the two declared paths). A stand-in
    `singularity` on PATH (the dry run only asks that it exists), an empty program folder and
    the data folder it binds (the sweep, so the dry run, refuses a bind source that is not
    there)."""
    import shutil
    import subprocess
    import sys

    from service_support import unavailable

    if not shutil.which("sbatch"):
        unavailable("the slurm backend's dry run needs Slurm's client tools (slurm-wlm)")
    fake = tmp_path / "bin" / "singularity"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'singularity-ce version 3.7.2 (stand-in)'\n")
    fake.chmod(0o755)
    (tmp_path / "lab" / "sec5a_resnet").mkdir(parents=True)
    path = tmp_path / "002.toml"
    (tmp_path / "imagenetv2" / "ImageNetV2-matched-frequency").mkdir(parents=True)
    path.write_text((SEEDS / "002_variability.toml").read_text().replace(
        "/opt/lab/gpu_variability_sc22_artifact/sec5a_resnet", "lab/sec5a_resnet").replace(
        '"/scratch/imagenetv2"', f'"{tmp_path / "imagenetv2"}"'))
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    done = subprocess.run([sys.executable, "-m", "orchestrator", "matrix", str(path),
                           "--dry-run", "--results", str(tmp_path / "r")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    shown = done.stdout.splitlines()
    start = shown.index("  gpu_node-g4-bs64-fp32-r1:")
    line = next(ln for ln in shown[start:] if ln.startswith("    command: srun singularity exec"))
    argv = shlex.split(line.split(": ", 1)[1])
    after = argv[next(i for i, w in enumerate(argv) if w.endswith(".sif")) + 1:]
    cell = str(tmp_path / "r" / "seed002_variability" / "<run id>" / "cells"
               / "gpu_node-g4-bs64-fp32-r1")
    spec = SPECS["002"]
    one = next(c for c in load_matrix(path).cells)
    theirs, _ = seed_spec.translate(spec, one, seed_spec.seed_argv(spec, one))
    expected = [w.replace("{cell}", cell) for w in theirs]
    assert after == expected, _first_difference(after, expected)


def test_validate_refuses_a_seed_cell_whose_weights_are_missing_and_names_the_cells(
        tmp_path: Path) -> None:
    """Seed 000's ResNeXt-101 --pretrained cells need DLE's weights in the hub cache (the seed
    pre-placed only ResNet-50's): the one decision's machine check refuses them where the
    file is missing, names the field and the cells, and passes once it is there."""
    from orchestrator.backends import backend_class
    from orchestrator.backends.checks import machine_problems, requirements

    cache, data = tmp_path / "pretrained", tmp_path / "imagenette2-160"
    for folder in (cache, data / "train", data / "val"):
        folder.mkdir(parents=True)
    (cache / "nvidia_resnet50_200821.pth.tar").write_bytes(b"w")
    path = tmp_path / "000.toml"
    path.write_text((SEEDS / "000_bitfusion_dle.toml").read_text().replace(
        '"/data/pretrained"', f'"{cache}"').replace('"/data/imagenette2-160"', f'"{data}"'))
    matrix = load_matrix(path)
    found = machine_problems(matrix, backend_class("docker"))
    assert [(p.field, p.message.split(" (")[0]) for p in found] == [
        ("commands.dle-infer.requires[0]",
         f"{cache}/nvidia_resnext101-32x4d_200821.pth.tar does not exist on this machine")]
    assert "2 cells (v100-dle_infer-resnext101_32x4d" in found[0].message
    listed = {r.host_path for r in requirements(matrix, matrix.cells)}
    assert f"{cache}/nvidia_resnet50_200821.pth.tar" in listed and f"{data}/val" in listed
    (cache / "nvidia_resnext101-32x4d_200821.pth.tar").write_bytes(b"w")
    assert machine_problems(matrix, backend_class("docker")) == []
    # the mount the seed wrote to is read-write, the dataset read-only
    mounts = {m.target: m.read_only for m in matrix.profiles["v100"].container.mounts}
    assert mounts == {"/root/.cache/torch/hub/checkpoints": False, "/imagenet": True}


@pytest.mark.subprocess  # the CLI in a process
def test_validate_and_the_dry_run_refuse_a_missing_dataset_alike(tmp_path: Path) -> None:
    """One decision: `validate` refuses seed 003's cells when the dataset's train/ folder is not
    under the mount's source, and `matrix --dry-run` shows the plan, then the same requirement
    (exit 3: what this machine lacks)."""
    import subprocess
    import sys

    data = tmp_path / "imagenet"
    data.mkdir()
    path = tmp_path / "003.toml"
    path.write_text((SEEDS / "003_dlperf.toml").read_text().replace(
        '"/data/imagenet"', f'"{data}"'))
    outs = [subprocess.run([sys.executable, "-m", "orchestrator", *args, str(path)],
                           capture_output=True, text=True, timeout=120)
            for args in (["validate"], ["matrix", "--dry-run"])]
    for done in outs:
        assert done.returncode == 3, done.stdout + done.stderr
        assert (f"commands.dle-dlperf.requires[0]: {data}/train does not exist on this machine"
                in done.stderr + done.stdout), done.stderr
