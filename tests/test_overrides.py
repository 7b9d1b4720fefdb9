"""``--set KEY=VALUE`` (a matrix file's field from the command line) and ``--exclude``.

The grammar (keys, values, how a value is read for its field), that an override is the same as
the edit of the file it stands for (the same cells, the same content hashes), what is recorded
(plan.json, run.json, the report's line; secrets masked) and what ``--resume`` and ``history``
make of it. Bad values are in tests/test_bad_inputs.py (category ``cli``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from results_support import Config, params, run_id, write_run

from orchestrator.cli import main
from orchestrator.config.matrix_file import MatrixFile
from orchestrator.config.overrides import (
    parse_key,
    read_overrides,
    read_value,
    redact_argv,
)
from orchestrator.errors import ConfigError
from orchestrator.plan.matrix import filter_cells, load_matrix
from orchestrator.results.reports.summary import summarize_run
from orchestrator.sweep import plan_json, resume_selection, selection_record

ROOT = Path(__file__).resolve().parents[1]

MATRIX = """
[matrix]
repeats = 2
[workload]
hardware = "cpu"
iterations = 8
[axes]
batch_size = [8, 16]
precision = ["fp32", "bf16"]
"""


@pytest.mark.parametrize(("key", "path"), [
    ("workload.iterations", ("workload", "iterations")),
    ("hardware.v100.container.mounts[0].source",
     ("hardware", "v100", "container", "mounts", 0, "source")),
    ('hardware."v1.00".gpu', ("hardware", "v1.00", "gpu")),
    ("hardware.'a b'.env.X", ("hardware", "a b", "env", "X")),
    ("commands.dle-dlperf.workdir", ("commands", "dle-dlperf", "workdir")),
    ("zip[1].arch[0]", ("zip", 1, "arch", 0)),
    (" workload . seed ", ("workload", "seed")),
])
def test_keys_are_dotted_toml_keys_with_indexes(key: str, path: tuple[object, ...]) -> None:
    assert parse_key(key) == path


@pytest.mark.parametrize("key", ["", "a..b", "a.", ".a", "a b", "a[x]", 'a."b', "a[-1]"])
def test_a_key_that_is_no_key_says_what_keys_are(key: str) -> None:
    assert isinstance(parse_key(key), str)


@pytest.mark.parametrize(("key", "text", "value"), [
    ("workload.iterations", "20", 20),
    ("workload.channels_last", "false", False),
    ("workload.data", "/srv/imagenet", "/srv/imagenet"),  # not TOML: the text
    ("workload.data", '"/srv/a b"', "/srv/a b"),
    ("workload.ngc_release", "23.10", "23.10"),  # TOML's float 23.1, but the field takes text
    ("matrix.name", "2026", "2026"),
    ("matrix.description", "true", "true"),
    ("matrix.timeout_s", "1800", 1800),
    ("axes.batch_size", "[8, 16]", [8, 16]),
    ("axes.arch", '["resnet50", "resnet18"]', ["resnet50", "resnet18"]),
    ("hardware.v100.container.mounts",
     '[{ source = "/scratch", target = "/imagenet", read_only = true }]',
     [{"source": "/scratch", "target": "/imagenet", "read_only": True}]),
    ("hardware.v100.image_vars.base_tag", "23.10-py3", "23.10-py3"),
    ("hardware.v100.image_vars.build_jobs", "8", 8),  # a field of any type: TOML's reading
    ("matrix.description", "2026-11-27", "2026-11-27"),  # a date is always text
    ("unknown.key", "12", 12),
])
def test_values_are_toml_where_they_parse_else_text(key: str, text: str, value: object) -> None:
    (found,), problems = read_overrides([f"{key}={text}"], MatrixFile)
    assert not problems
    assert found.value == value and type(found.value) is type(value)


def test_a_value_read_as_toml_for_a_field_of_any_type_says_how_to_quote_it() -> None:
    value, how = read_value("1.13", None)
    assert (value, how) == (1.13, "toml")
    (found,), _ = read_overrides(["hardware.g.image_vars.synapse_version=1.13"], MatrixFile)
    assert found.read_as == "toml-any"
    from orchestrator.config.overrides import origin

    assert origin(found) == ("(from --set hardware.g.image_vars.synapse_version=1.13; VALUE was "
                             "read as a number: for text, quote it: hardware.g.image_vars."
                             "synapse_version='\"1.13\"')")


def test_an_override_is_the_edit_of_the_file_it_stands_for(write_matrix) -> None:
    """The same cells, ids and content hashes as the file with the value written in it; a
    field no cell's hash covers (description, timeout) leaves the hashes alone, one that
    changes what runs (iterations) changes them, as an edit of the file would."""
    plain = load_matrix(write_matrix(MATRIX))
    edited = load_matrix(write_matrix(MATRIX.replace("iterations = 8", "iterations = 20"),
                                      name="edited.toml"))
    overridden = load_matrix(write_matrix(MATRIX, name="o.toml"),
                             overrides=["workload.iterations=20"])
    assert [(c.id, c.hash) for c in overridden.cells] == [(c.id, c.hash) for c in edited.cells]
    assert {c.hash for c in overridden.cells}.isdisjoint({c.hash for c in plain.cells})
    cosmetic = load_matrix(write_matrix(MATRIX, name="c.toml"), overrides=[
        "matrix.description=tonight's run", "matrix.timeout_s=7200"])
    assert [c.hash for c in cosmetic.cells] == [c.hash for c in plain.cells]
    assert cosmetic.settings.timeout_s == 7200
    assert overridden.source_text == plain.source_text  # the file as written is kept


def test_overrides_apply_in_order_and_make_what_is_missing(write_matrix) -> None:
    path = write_matrix(MATRIX)
    m = load_matrix(path, overrides=[
        "workload.iterations=20", "workload.iterations=30",  # a later one wins
        "hardware.gpu.device=cuda", "hardware.gpu.gpu=V100",  # a new profile, field by field
        "hardware.cpu.container.mounts[0].source=/scratch",  # a new list, its first item
        "hardware.cpu.container.mounts[0].target=/data",
        "hardware.cpu.container.mounts[1]={ source = '/a', target = '/b' }",  # one past: adds
    ])
    assert {c.params.iterations for c in m.cells} == {30}
    assert m.profiles["gpu"].gpu == "V100"
    assert [(x.source, x.target) for x in m.profiles["cpu"].container.mounts] == [
        ("/scratch", "/data"), ("/a", "/b")]
    assert [o.shown for o in m.overrides][0] == "workload.iterations=20"


def test_the_seed_lab_path_is_overridden_without_editing_the_file() -> None:
    """Issue 31: the shipped seeds hard-code /opt/lab/... checkouts; a lab sets its own."""
    seed = ROOT / "matrices" / "seeds" / "003_dlperf.toml"
    plain = load_matrix(seed)
    m = load_matrix(seed, overrides=[
        "hardware.v100.image_vars.program_dir=/srv/dle/PyTorch/Classification/ConvNets",
        "hardware.v100.container.mounts[0].source=/scratch/imagenet"])
    assert m.profiles["v100"].image_vars["program_dir"] == (
        "/srv/dle/PyTorch/Classification/ConvNets")
    assert m.profiles["v100"].container.mounts[0].source == "/scratch/imagenet"
    assert [c.id for c in m.cells] == [c.id for c in plain.cells]
    assert {c.hash for c in m.cells}.isdisjoint({c.hash for c in plain.cells})  # what runs


def test_every_problem_an_override_causes_says_so(write_matrix) -> None:
    path = write_matrix(MATRIX)
    with pytest.raises(ConfigError) as info:
        load_matrix(path, overrides=["workload.iterations=0", "axes.precision=[\"fp8\"]",
                                     "matrix.repeats=3"])
    got = [str(p) for p in info.value.problems]
    assert got == [
        f"{path}: workload.iterations: Input should be greater than 0 (got 0) (from --set "
        "workload.iterations=0)",
        f"{path}: axes.precision[0]: Input should be 'fp32', 'amp' or 'bf16' (got 'fp8') "
        "(from --set axes.precision=[\"fp8\"])",
    ]
    # a problem of the file itself is not blamed on an override
    bad = write_matrix(MATRIX.replace("iterations = 8", "iterations = 0"), name="bad.toml")
    with pytest.raises(ConfigError) as info:
        load_matrix(bad, overrides=["matrix.repeats=3"])
    assert "--set" not in str(info.value)


def test_semantic_problems_of_an_override_name_it_too(write_matrix) -> None:
    """The checks after the types (a hardware value naming no profile, an [[exclude]] that
    matches nothing) say which override caused them."""
    path = write_matrix(MATRIX + "[[exclude]]\nbatch_size = 8\nprecision = \"bf16\"\n")
    with pytest.raises(ConfigError) as info:
        load_matrix(path, overrides=["workload.hardware=v100", "axes.batch_size=[32]"])
    text = str(info.value)
    assert ("workload.hardware: unknown hardware profile 'v100'; defined profiles: cpu (from "
            "--set workload.hardware=v100)") in text
    assert "exclude[0]: matches no cell" in text  # the file's rule, unchanged: not blamed


def test_secrets_are_masked_in_what_is_recorded(write_matrix) -> None:
    m = load_matrix(write_matrix(MATRIX), overrides=[
        "hardware.cpu.env.HF_TOKEN=hf_secret_value",
        "hardware.cpu.env={ API_KEY = 'k-123456789', PATH_X = '/x' }",
        "workload.data=/srv/data"])
    assert [o.shown for o in m.overrides] == [
        "hardware.cpu.env.HF_TOKEN=***",
        'hardware.cpu.env={ API_KEY = "***", PATH_X = "/x" }',
        "workload.data=/srv/data"]
    plan = json.dumps(plan_json(m, "process"))
    assert "hf_secret_value" not in plan and "k-123456789" not in plan
    assert redact_argv(["orchestrate", "matrix", "m.toml", "--set",
                        "hardware.cpu.env.HF_TOKEN=hf_secret_value",
                        "--set=hardware.cpu.env.MY_PASSWORD=pw12345678", "--only", "gpus=1"]) \
        == ["orchestrate", "matrix", "m.toml", "--set", "hardware.cpu.env.HF_TOKEN=***",
            "--set=hardware.cpu.env.MY_PASSWORD=***", "--only", "gpus=1"]


def test_exclude_drops_each_value_and_is_recorded(write_matrix) -> None:
    m = load_matrix(write_matrix(MATRIX), overrides=["matrix.repeats=1"])
    kept = filter_cells(m, ["precision=fp32"], ["batch_size=16", "precision=bf16"])
    assert [c.id for c in kept.cells] == ["cpu-g1-bs8-fp32-r1"]
    assert kept.excluded == ("batch_size=16", "precision=bf16")
    assert {c.params.batch_size for c in filter_cells(m, [], ["batch_size=8"]).cells} == {16}
    plan = plan_json(kept, "process")
    assert (plan["set"], plan["only"], plan["exclude"]) == (
        ["matrix.repeats=1"], ["precision=fp32"], ["batch_size=16", "precision=bf16"])
    assert selection_record(kept) == {"set": ["matrix.repeats=1"], "only": ["precision=fp32"],
                                      "exclude": ["batch_size=16", "precision=bf16"]}
    assert selection_record(load_matrix(write_matrix(MATRIX, name="n.toml"))) == {}


def test_an_exclude_that_matches_no_cell_is_refused(write_matrix) -> None:
    m = load_matrix(write_matrix(MATRIX))
    with pytest.raises(ConfigError, match="--exclude: batch_size=32: matches no cell of m"):
        filter_cells(m, [], ["batch_size=32"])
    # one that --only already left out is no typo: it matches a cell of the matrix
    assert len(filter_cells(m, ["batch_size=8"], ["batch_size=16"]).cells) == 4


def test_the_report_shows_the_options_under_the_table(tmp_path: Path, capsys) -> None:
    paths = write_run(tmp_path, "m", run_id(1), [Config(params(), [100.0])])
    plan = json.loads(paths.plan.read_text())
    plan.update({"set": ["workload.iterations=20", "workload.data=/srv/a b"],
                 "exclude": ["gpus=8"]})
    paths.plan.write_text(json.dumps(plan))
    _, table = summarize_run(paths)
    assert table.splitlines()[-1] == ("run with --set workload.iterations=20 --set "
                                      "'workload.data=/srv/a b' --exclude gpus=8")
    assert main(["report", "m", "--results", str(tmp_path)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("--exclude gpus=8")
    plain = write_run(tmp_path, "p", run_id(1), [Config(params(), [100.0])])
    assert "run with" not in summarize_run(plain)[1]
    html = tmp_path / "r.html"
    assert main(["report", "m", "--results", str(tmp_path), "--html", str(html)]) == 0
    assert "run with --set workload.iterations=20 --set &#39;workload.data=/srv/a b&#39; " \
        "--exclude gpus=8" in html.read_text()


def test_resume_says_which_overrides_the_run_had(write_matrix, tmp_path: Path) -> None:
    """A resume without the run's --set (its cells' hashes differ) says what it ran with."""
    path = write_matrix(MATRIX)
    ran = load_matrix(path, overrides=["workload.iterations=20"])
    paths = write_run(tmp_path, ran.name, run_id(1), [])
    paths.plan.write_text(json.dumps(plan_json(ran, "process")))
    with pytest.raises(ConfigError) as info:
        resume_selection(paths, load_matrix(path))
    assert ("it ran with --set workload.iterations=20, this sweep with no --set); start a new "
            "run instead of --resume") in str(info.value)
    assert len(resume_selection(paths, load_matrix(path, overrides=[
        "workload.iterations=20", "matrix.timeout_s=60"]))) == len(ran.cells)


def test_plan_json_and_the_plan_record_the_options(write_matrix, tmp_path: Path,
                                                   capsys) -> None:
    path = write_matrix(MATRIX)
    assert main(["plan", str(path), "--set", "workload.iterations=3", "--exclude",
                 "precision=bf16", "--json"]) == 0
    cells = json.loads(capsys.readouterr().out)
    assert {c["params"]["iterations"] for c in cells} == {3}
    assert {c["params"]["precision"] for c in cells} == {"fp32"}
    assert main(["plan", str(path), "--set", "workload.iterations=3", "--exclude",
                 "precision=bf16"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["m: 4 cells (2 configurations x 2 repeats), backend process",
                         "with --set workload.iterations=3 --exclude precision=bf16"]
    assert main(["validate", str(path), "--set", "workload.iterations=3"]) == 0
    assert capsys.readouterr().out.startswith(
        f"{path} --set workload.iterations=3: ok (8 cells)")
