"""Matrix expansion and validation: axes, zip, exclude, include, repeats, ids, errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_support import facts, shipped_machine

from orchestrator.errors import ConfigError
from orchestrator.plan.matrix import filter_cells, load_matrix, parse_only

ROOT = Path(__file__).resolve().parents[1]


def problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_matrix(path)
    return [str(p) for p in info.value.problems]


def test_product_of_axes_in_file_order(write_matrix):
    m = load_matrix(write_matrix("""
        [axes]
        hardware = ["cpu"]
        gpus = [1, 2]
        precision = ["fp32", "amp"]
    """))
    assert [c.id for c in m.cells] == [
        "cpu-g1-bs64-fp32-r1", "cpu-g1-bs64-amp-r1", "cpu-g2-bs64-fp32-r1", "cpu-g2-bs64-amp-r1",
    ]
    assert m.varying == ("gpus", "precision")


def test_workload_defaults_apply_to_every_cell(write_matrix):
    m = load_matrix(write_matrix("""
        [workload]
        hardware = "cpu"
        batch_size = 7
        iterations = 3
        [axes]
        arch = ["resnet18", "resnet50"]
    """))
    assert {c.params.batch_size for c in m.cells} == {7}
    assert {c.params.iterations for c in m.cells} == {3}
    assert [c.id for c in m.cells] == ["cpu-resnet18-g1-bs7-fp32-r1", "cpu-resnet50-g1-bs7-fp32-r1"]


def test_zip_varies_values_together(write_matrix):
    m = load_matrix(write_matrix("""
        [workload]
        hardware = "cpu"
        [axes]
        precision = ["fp32", "bf16"]
        [[zip]]
        arch = ["resnet50", "resnext101_32x4d"]
        batch_size = [256, 128]
    """))
    pairs = {(c.params.arch, c.params.batch_size) for c in m.cells}
    assert pairs == {("resnet50", 256), ("resnext101_32x4d", 128)}
    assert len(m.cells) == 4


def test_exclude_drops_matching_cells_and_lists_match_any(write_matrix):
    m = load_matrix(write_matrix("""
        [workload]
        hardware = "cpu"
        [axes]
        gpus = [1, 2, 4]
        precision = ["fp32", "amp"]
        [[exclude]]
        gpus = [2, 4]
        precision = "fp32"
    """))
    got = {(c.params.gpus, c.params.precision) for c in m.cells}
    assert got == {(1, "fp32"), (1, "amp"), (2, "amp"), (4, "amp")}


def test_include_adds_cells_with_defaults_and_drops_duplicates(write_matrix):
    m = load_matrix(write_matrix("""
        [workload]
        hardware = "cpu"
        mode = "train"
        [axes]
        batch_size = [32]
        [[include]]
        mode = "infer"
        batch_size = 1
        [[include]]
        batch_size = 32
    """))
    got = [(c.params.mode, c.params.batch_size) for c in m.cells]
    assert got == [("train", 32), ("infer", 1)]


def test_repeats_run_round_robin(write_matrix):
    m = load_matrix(write_matrix("""
        [matrix]
        repeats = 3
        [axes]
        hardware = ["cpu"]
        batch_size = [1, 2]
    """))
    assert [(c.params.batch_size, c.repeat) for c in m.cells] == [
        (1, 1), (2, 1), (1, 2), (2, 2), (1, 3), (2, 3),
    ]
    assert len({c.id for c in m.cells}) == 6
    assert len({c.group for c in m.cells}) == 2
    # repeats of a configuration share its content hash
    assert len({c.hash for c in m.cells}) == 2


def test_ids_and_hashes_are_stable_and_hash_follows_the_profile(write_matrix, tmp_path):
    text = """
        [axes]
        hardware = ["cpu"]
        gpus = [1, 2]
    """
    a = load_matrix(write_matrix(text, name="a.toml"))
    b = load_matrix(write_matrix(text, name="b.toml"))
    assert [(c.id, c.hash) for c in a.cells] == [(c.id, c.hash) for c in b.cells]
    c = load_matrix(write_matrix(text + '\n[hardware.cpu]\ndevice = "cpu"\nenv = {X = "1"}\n',
                                 name="c.toml", cpu_profile=False))
    assert [x.id for x in c.cells] == [x.id for x in a.cells]
    assert {x.hash for x in c.cells}.isdisjoint({x.hash for x in a.cells})


def test_colliding_ids_get_a_hash_suffix(write_matrix):
    m = load_matrix(write_matrix("""
        [workload]
        hardware = "cpu"
        [axes]
        data = ["/data/a b", "/data/a_b"]
    """))
    ids = [c.id for c in m.cells]
    assert len(set(ids)) == 2
    assert all(i.startswith("cpu-g1-bs64-fp32-data-data_a_b-") for i in ids)


@pytest.mark.parametrize("name,cells,example", [
    ("v100_scaling", 40, "v100-g4-bs128-amp-r1"),
    ("v100_profile", 6, "v100-resnext101_32x4d-infer-g1-bs1-amp-r1"),
    ("bitfusion_vs_native", 36, "v100_bitfusion-resnet50-infer-g1-bs1-amp-r3"),
    ("gaudi", 24, "gaudi-g8-bs256-bf16-eager-r2"),
    ("cpu_smoke", 8, "cpu-resnet18-g1-bs16-bf16-r1"),
])
def test_shipped_matrices(name, cells, example):
    m = load_matrix(ROOT / "matrices" / f"{name}.toml")
    assert m.name == name
    assert len(m.cells) == cells
    assert example in {c.id for c in m.cells}


def test_v100_scaling_expresses_the_experiment():
    m = load_matrix(ROOT / "matrices" / "v100_scaling.toml")
    assert {c.params.gpus for c in m.cells} == {1, 2, 4, 8}
    assert {c.params.precision for c in m.cells} == {"fp32", "amp"}
    assert {(c.params.batch_size, c.params.warmup, c.params.iterations) for c in m.cells} == {
        (128, 20, 100)}
    assert {c.repeat for c in m.cells} == {1, 2, 3, 4, 5}


# --- errors: every problem at once, with file and field ---------------------------------------


def test_type_and_range_errors_are_all_reported(write_matrix):
    path = write_matrix("""
        [matrix]
        repeats = 0
        [workload]
        batch_size = -1
        [axes]
        hardware = ["cpu"]
        gpus = [1, 0]
        precision = ["fp32", "fp8"]
        bogus = [1]
    """)
    got = problems(path)
    assert len(got) == 5
    text = "\n".join(got)
    assert f"{path}: matrix.repeats: Input should be greater than 0" in text
    assert "workload.batch_size: Input should be greater than 0 (got -1)" in text
    assert "axes.gpus[1]: Input should be greater than 0 (got 0)" in text
    assert "axes.precision[1]" in text and "'fp8'" in text
    assert "axes.bogus: unknown key" in text


def test_malformed_toml(write_matrix):
    path = write_matrix("[axes\nhardware = 1\n")
    (msg,) = problems(path)
    assert msg.startswith(f"{path}: malformed TOML") and "line 1" in msg


def test_missing_file(tmp_path):
    (msg,) = problems(tmp_path / "nope.toml")
    assert "no such file" in msg


def test_unknown_hardware_profile(write_matrix):
    got = problems(write_matrix("""
        [axes]
        hardware = ["cpu", "v100"]
        [[include]]
        hardware = "h100"
    """))
    assert any("axes.hardware[1]: unknown hardware profile 'v100'; defined profiles: cpu" in p
               for p in got)
    assert any("include[0].hardware: unknown hardware profile 'h100'" in p for p in got)


def test_hardware_must_be_set(write_matrix):
    got = problems(write_matrix("""
        [axes]
        gpus = [1]
    """))
    assert any("workload.hardware: no cell has hardware" in p for p in got)
    got = problems(write_matrix("""
        [axes]
        hardware = ["cpu"]
        [[include]]
        batch_size = 1
    """, name="inc.toml"))
    assert len(got) == 1 and "include[0]: no hardware: give it here" in got[0]


def test_exclude_matching_nothing_is_an_error(write_matrix):
    got = problems(write_matrix("""
        [axes]
        hardware = ["cpu"]
        gpus = [1, 2]
        [[exclude]]
        gpus = 3
    """))
    assert got == [f"{got[0].split(':')[0]}: exclude[0]: matches no cell (gpus = 3); "
                   "check the values against [axes]"]


def test_matrix_that_expands_to_nothing(write_matrix):
    got = problems(write_matrix("""
        [axes]
        hardware = ["cpu"]
        [[exclude]]
        hardware = "cpu"
    """))
    assert any("expands to no cell" in p for p in got)


def test_zip_errors(write_matrix):
    got = problems(write_matrix("""
        [axes]
        hardware = ["cpu"]
        arch = ["resnet18"]
        [[zip]]
        arch = ["resnet50", "resnet18"]
        batch_size = [1]
    """))
    assert any("zip[0]: lists must have the same length" in p for p in got)
    got = problems(write_matrix("""
        [axes]
        hardware = ["cpu"]
        arch = ["resnet18"]
        [[zip]]
        arch = ["resnet50"]
        batch_size = [1]
    """, name="b.toml"))
    assert any("zip[0].arch: already varied" in p for p in got)


def test_profile_errors(write_matrix):
    got = problems(write_matrix("""
        [matrix]
        backend = "kubernetes"
        [axes]
        hardware = ["bf"]
        [hardware.bf]
        device = "cpu"
        wrapper = "bitfusion"
        [hardware.gpu]
        device = "tpu"
    """))
    text = "\n".join(got)
    assert "hardware.bf: wrapper 'bitfusion' needs device = 'cuda'" in text
    assert "hardware.gpu.device" in text


def test_unknown_backend(write_matrix):
    path = write_matrix("""
        [matrix]
        backend = "kubernetes"
        [axes]
        hardware = ["cpu"]
        [[exclude]]
        gpus = 3
    """)
    with pytest.raises(ConfigError) as info:
        load_matrix(path, backends=["process", "docker"])
    got = [str(p) for p in info.value.problems]
    assert any("matrix.backend: unknown backend 'kubernetes'; known: process, docker" in p
               for p in got)
    assert any("exclude[0]: matches no cell" in p for p in got)  # reported together
    # Without names to check against, the name is left to whoever picks the backend.
    assert not any("matrix.backend" in p for p in problems(path))


def test_empty_axis_list_is_rejected(write_matrix):
    got = problems(write_matrix("""
        [axes]
        hardware = ["cpu"]
        gpus = []
    """))
    assert any("axes.gpus" in p for p in got)


# --- --only -------------------------------------------------------------------------------------


def test_only_filters(write_matrix):
    m = load_matrix(write_matrix("""
        [matrix]
        repeats = 2
        [axes]
        hardware = ["cpu"]
        gpus = [1, 2, 4]
        precision = ["fp32", "amp"]
    """))
    f = filter_cells(m, ["gpus=1", "gpus=4", "precision=amp", "repeat=2"])
    assert [c.id for c in f.cells] == ["cpu-g1-bs64-amp-r2", "cpu-g4-bs64-amp-r2"]


def test_only_errors(write_matrix):
    m = load_matrix(write_matrix("""
        [axes]
        hardware = ["cpu"]
    """))
    with pytest.raises(ConfigError, match="unknown parameter"):
        parse_only(["gpu=1"])
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        parse_only(["gpus"])
    with pytest.raises(ConfigError, match="valid integer"):
        parse_only(["gpus=two"])
    with pytest.raises(ConfigError, match="matches no cell"):
        filter_cells(m, ["gpus=8"])


def test_unknown_image_template_and_variables(write_matrix):
    got = problems(write_matrix("""
        [axes]
        hardware = ["a", "b"]
        [hardware.a]
        device = "cuda"
        image = "ngc-pytorhc"
        [hardware.b]
        device = "cuda"
        image = "ngc-pytorch"
        image_vars = { bse_tag = "23.10-py3", apt_packages = "vim" }
    """))
    text = "\n".join(got)
    assert "hardware.a.image: unknown image template 'ngc-pytorhc'; known: " in text
    assert "hardware.b.image_vars: unknown template variable 'bse_tag'" in text
    assert "hardware.b.image_vars:" in text and "apt_packages" in text
    assert len(got) == 3


def _reference_cells(axes, zip_group, excludes, includes, defaults):
    """A deliberately naive expansion to check the real one against."""
    combos = [dict(defaults)]
    for key, values in axes.items():
        combos = [{**c, key: v} for c in combos for v in values]
    if zip_group:
        n = len(next(iter(zip_group.values())))
        combos = [{**c, **{k: vs[i] for k, vs in zip_group.items()}}
                  for c in combos for i in range(n)]
    kept = [c for c in combos
            if not any(all(c[k] == v for k, v in rule.items()) for rule in excludes)]
    for inc in includes:
        cell = {**defaults, **inc}
        if cell not in kept:
            kept.append(cell)
    return kept


@pytest.mark.parametrize("seed", range(40))
def test_expansion_matches_a_brute_force_reference(write_matrix, seed):
    import random

    rng = random.Random(seed)
    pool = {
        "gpus": [1, 2, 4, 8], "batch_size": [1, 32, 64, 128, 256],
        "precision": ["fp32", "amp", "bf16"], "arch": ["resnet18", "resnet50", "vgg16"],
        "mode": ["train", "infer"], "seed": [0, 1, 2],
    }
    keys = rng.sample(sorted(pool), rng.randint(2, 5))
    zip_keys = keys[:2] if rng.random() < 0.5 else []
    n_zip = rng.randint(1, 3)
    zip_group = {k: [rng.choice(pool[k]) for _ in range(n_zip)] for k in zip_keys}
    axes = {k: rng.sample(pool[k], rng.randint(1, len(pool[k]))) for k in keys[len(zip_keys):]}
    defaults = {"hardware": "cpu", "gpus": 1, "batch_size": 64, "precision": "fp32",
                "arch": "resnet50", "mode": "train", "seed": 0}
    product = _reference_cells(axes, zip_group, [], [], defaults)
    excludes = []
    for _ in range(rng.randint(0, 2)):  # rules built from real cells, so each matches one
        cell = rng.choice(product)
        rule_keys = rng.sample([k for k in (*axes, *zip_group)], 1)
        excludes.append({k: cell[k] for k in rule_keys})
    includes = [{"arch": "resnet18", "batch_size": 3}] if rng.random() < 0.5 else []
    repeats = rng.randint(1, 3)

    def toml_value(v):
        return f'"{v}"' if isinstance(v, str) else str(v)

    lines = [f"[matrix]\nrepeats = {repeats}\n[workload]\nhardware = \"cpu\"\n[axes]"]
    lines += [f"{k} = [{', '.join(map(toml_value, vs))}]" for k, vs in axes.items()]
    if zip_group:
        lines.append("[[zip]]")
        lines += [f"{k} = [{', '.join(map(toml_value, vs))}]" for k, vs in zip_group.items()]
    for rule in excludes:
        lines.append("[[exclude]]")
        lines += [f"{k} = {toml_value(v)}" for k, v in rule.items()]
    for inc in includes:
        lines.append("[[include]]")
        lines += [f"{k} = {toml_value(v)}" for k, v in inc.items()]
    expected = _reference_cells(axes, zip_group, excludes, includes, defaults)
    # a zip may repeat a value pair: the real expansion keeps each configuration once
    unique = []
    for cell in expected:
        if cell not in unique:
            unique.append(cell)
    path = write_matrix("\n".join(lines) + "\n", name=f"r{seed}.toml")
    if not unique:
        with pytest.raises(ConfigError, match="expands to no cell"):
            load_matrix(path)
        return
    m = load_matrix(path)
    got = [{k: c.params.model_dump()[k] for k in defaults} for c in m.cells if c.repeat == 1]
    assert sorted(map(repr, got)) == sorted(map(repr, unique))
    assert len(m.cells) == len(unique) * repeats
    assert len({c.id for c in m.cells}) == len(m.cells)
    assert [c.repeat for c in m.cells] == sorted(c.repeat for c in m.cells)


def test_the_docs_example_matrix_is_valid(tmp_path):
    """The example of docs/matrix-files.md (its first TOML block) loads, expands as its comments
    say, and every cell can run."""
    text = (ROOT / "docs" / "matrix-files.md").read_text()
    start = text.index("```toml\n") + len("```toml\n")
    example = text[start:text.index("\n```", start)]
    path = tmp_path / "docs_example.toml"
    path.write_text(example)
    m = load_matrix(path)
    assert m.name == "v100_scaling" and m.settings.baseline == "precision=fp32"
    assert m.profiles["v100"].slurm.partition == "gpu"
    # 4 gpus x 2 precisions x 2 zipped archs = 16, minus fp32 on 4 and 8 GPUs (4), plus 1 include
    assert len(m.cells) == (16 - 4 + 1) * 5
    from orchestrator.backends.checks import check_matrix

    found = check_matrix(m, machine=facts("V100", count=8))  # every cell: a V100 of 8, NGC 23.10
    assert found.errors == [] and found.warnings == [], found


@pytest.mark.parametrize("path", sorted((ROOT / "matrices").glob("*.toml")), ids=lambda p: p.stem)
def test_every_shipped_matrix_validates(path):
    """Structure, and every cell passes the semantic checks (orchestrator/backends/checks.py) for
    the matrix's own backend: no error, no warning (a note only where a stack cannot be known)."""
    from orchestrator.backends.checks import check_matrix

    m = load_matrix(path)
    assert m.cells and m.name == path.stem
    found = check_matrix(m, machine=shipped_machine(path.stem))  # on the machine it is meant for
    assert found.errors == [] and found.warnings == [], found
    assert set(found.stacks) == {c.hardware for c in m.cells}


@pytest.mark.parametrize("path", sorted((ROOT / "hosts").glob("*.toml")), ids=lambda p: p.stem)
def test_every_shipped_inventory_validates(path):
    from orchestrator.config.inventory import load_hosts

    assert load_hosts(path).names


def test_content_hashes_stay_those_of_orchestrate_0_1(write_matrix):
    """A cell that uses nothing a later version added keeps the hash orchestrate 0.1 gave it
    (recorded from commit 6be8385): `--resume` of an older run and its history still line up."""
    path = write_matrix("""
        [matrix]
        name = "hashes"
        [workload]
        arch = "resnet18"
        image_size = 64
        [axes]
        hardware = ["cpu", "v100"]
        precision = ["fp32", "bf16"]
        [hardware.cpu]
        device = "cpu"
        env = { OMP_NUM_THREADS = "1" }
        [hardware.v100]
        device = "cuda"
        image = "ngc-pytorch"
        image_vars = { base_tag = "23.10-py3" }
        container = { ipc = "host", shm_size = "16g" }
    """)
    assert {c.id: c.hash for c in load_matrix(path).cells} == {
        "cpu-g1-bs64-fp32-r1": "54611089260c", "cpu-g1-bs64-bf16-r1": "34093e6a4730",
        "v100-g1-bs64-fp32-r1": "6e941c841f1d", "v100-g1-bs64-bf16-r1": "ceae122c601b",
    }
    changed = load_matrix(write_matrix(path.read_text().replace(
        'image_size = 64', 'image_size = 64\nprofile_iterations = 3'), name="changed.toml"))
    assert "54611089260c" not in {c.hash for c in changed.cells}, "a used new field changes it"


def test_content_hashes_of_command_cells_survive_the_seed_fields(write_matrix):
    """The fields issue 22 added (a container's pid, a figures table's variant / file /
    telemetry) leave a cell that does not use them with the hash it had before (recorded from
    main at a40e88c): another program's history still lines up."""
    path = write_matrix("""
        [matrix]
        name = "hashes_cmd"
        [workload]
        hardware = "v100"
        program = "dle"
        [axes]
        gpus = [1, 8]
        [hardware.v100]
        device = "cuda"
        image = "ngc-pytorch"
        image_vars = { base_tag = "23.10-py3" }
        container = { ipc = "host", shm_size = "16g" }
        [commands.dle]
        command = "python main.py --arch {arch} -b {batch_size} /data"
        figures = { parser = "dllogger", warmup = 10 }
    """, cpu_profile=False)
    assert {c.id: c.hash for c in load_matrix(path).cells} == {
        "v100-g1-bs64-fp32-r1": "44dd00a528c5", "v100-g8-bs64-fp32-r1": "dbdc572703ac"}
    pid = load_matrix(write_matrix(path.read_text().replace(
        'shm_size = "16g" }', 'shm_size = "16g", pid = "host" }'), name="pid.toml",
        cpu_profile=False))
    assert "44dd00a528c5" not in {c.hash for c in pid.cells}, "a used new field changes it"
