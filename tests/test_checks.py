"""orchestrator/backends/checks.py: can every cell run where it is planned, and do comparisons hold?

The bad-input table (tests/test_bad_inputs.py, category ``can-it-run``) runs each rule through
the CLI; these tests check the module's own API: the stack each shipped profile resolves to (and
that docs/matrix-files.md lists exactly that), the Bitfusion image built FROM the very image of
its native twin, errors reported once per field (not once per cell), and a sweep refusing before
it makes a run folder.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from gpu_support import GAUDI, facts, shipped_machine

from orchestrator.backends.checks import check_matrix, refuse_unrunnable
from orchestrator.errors import ConfigError
from orchestrator.images import build
from orchestrator.plan.matrix import load_matrix
from orchestrator.plan.selection import ImageKey
from orchestrator.plan.software import host_stack
from orchestrator.sweep import run_sweep

ROOT = Path(__file__).resolve().parents[1]
MATRICES = ROOT / "matrices"

#: matrix -> hardware -> (NGC release or Habana "installer X", torch) the profile resolves to;
#: None: this machine's Python (process/slurm backends) or a local stand-in base image.
SHIPPED: dict[str, dict[str, tuple[str, str] | None]] = {
    "bitfusion_vs_native": {"v100": ("23.10", "2.1.0a0+32f93b1"),
                            "v100-bitfusion": ("23.10", "2.1.0a0+32f93b1")},
    "v100_scaling": {"v100": ("23.10", "2.1.0a0+32f93b1")},
    "v100_profile": {"v100": ("23.10", "2.1.0a0+32f93b1")},
    "gaudi": {"gaudi": ("installer 1.18.0", "2.4.0")},
    # the profile's own release; its cells pin 24.05, 24.10, 25.01 (ngc_release axis)
    "ngc_releases": {"h100": ("24.05", "2.4.0a0+07cecf4168")},
    "h100_speed": {"h100": None},
    "dle_vs_workload": {"h100": None},
    "seed003_h100": {"h100": None},
    "dle_vs_workload_v100": {"v100": ("23.10", "2.1.0a0+32f93b1")},
    "cpu_smoke": {"cpu": None},
    "slurm_smoke": {"cpu": None},
    "docker_smoke": {"cpu-container": None},
    "ssh_smoke": {"cpu": None},
    "apptainer_slurm": {"gpu-node": ("23.10", "2.1.0a0+32f93b1")},
    "v100_multinode": {"v100-node": ("23.10", "2.1.0a0+32f93b1")},
}


def test_every_shipped_matrix_is_listed_here() -> None:
    assert set(SHIPPED) == {p.stem for p in MATRICES.glob("*.toml")}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_the_stack_of_every_shipped_profile(name: str) -> None:
    found = check_matrix(load_matrix(MATRICES / f"{name}.toml"), machine=shipped_machine(name))
    assert found.errors == [] and found.warnings == []
    for hw, expected in SHIPPED[name].items():
        stack = found.stacks[hw]
        if expected is None:
            assert stack.release is None and (stack.base is None or not stack.known)
            continue
        release, torch = expected
        assert stack.torch == torch and stack.known
        if release.startswith("installer"):
            assert stack.label.startswith(f"Habana PyTorch {release}")
        else:
            assert stack.release == release
            assert stack.base == f"nvcr.io/nvidia/pytorch:{release}-py3"


def test_the_docs_list_what_each_matrix_resolves_to() -> None:
    """docs/matrix-files.md "Shipped matrices": one row per matrix, with the release and torch
    it runs."""
    text = (ROOT / "docs" / "matrix-files.md").read_text()
    section = text[text.index("## Shipped matrices"):]
    end = section.find("\n## ", 1)
    section = section if end < 0 else section[:end]
    rows = {m[1]: m[2] for m in re.finditer(r"^\| `(\w+)` \|(.*)$", section, re.M)}
    assert set(rows) == set(SHIPPED)
    for name, profiles in SHIPPED.items():
        for expected in profiles.values():
            if expected is not None:
                release, torch = expected
                assert release.removeprefix("installer ") in rows[name], name
                assert torch in rows[name], name


def test_bitfusion_is_built_from_exactly_the_native_image(tmp_path: Path) -> None:
    """Seed 000's ratio compares one stack: the Bitfusion image's parent is the native image
    itself (same content-hash tag), so both sides run the same NGC release, bit for bit."""
    path = tmp_path / "bitfusion_vs_native.toml"
    shutil.copy(MATRICES / "bitfusion_vs_native.toml", path)
    (tmp_path / "bitfusion").mkdir()
    (tmp_path / "bitfusion" / "bitfusion-client-ubuntu2204_amd64.deb").write_bytes(b"deb")
    for name in ("client.yaml", "servers.conf"):
        (tmp_path / "bitfusion" / name).write_text("stand-in\n")
    (tmp_path / "bitfusion" / "bitfusion-ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    matrix = load_matrix(path)
    native, bitfusion = (build.plan_key(matrix, ImageKey(hw))[1]
                         for hw in ("v100", "v100-bitfusion"))
    assert bitfusion.parent is not None and bitfusion.parent.tag == native.tag
    assert native.base_image == "nvcr.io/nvidia/pytorch:23.10-py3"


def test_the_gaudi_matrix_measures_eager_and_lazy_mode() -> None:
    matrix = load_matrix(MATRICES / "gaudi.toml")
    configs = {(c.params.gpus, c.params.precision, c.params.batch_size, c.params.hpu_mode)
               for c in matrix.cells}
    assert configs == {(g, p, b, m) for g in (1, 8) for p, b in (("bf16", 256), ("fp32", 128))
                       for m in ("eager", "lazy")}
    assert {c.params.compile for c in matrix.cells} == {"none"}


def test_seed_000_infers_in_fp32_as_written_and_its_modern_equivalent_in_amp() -> None:
    """The seed's --evaluate lines carry no --amp (only its training line does): the
    reproduction infers in fp32; the modern equivalent (our workload) runs AMP throughout, and
    says it is not a reproduction."""
    matrix = load_matrix(MATRICES / "bitfusion_vs_native.toml")
    assert {(c.params.mode, c.params.batch_size) for c in matrix.cells} == {
        ("train", 256), ("infer", 256), ("infer", 1)}
    assert {c.params.precision for c in matrix.cells} == {"amp"}
    assert {c.params.arch for c in matrix.cells} == {"resnet50", "resnext101_32x4d"}
    assert "not a reproduction" in matrix.source_text
    seed = load_matrix(MATRICES / "seeds" / "000_bitfusion_dle.toml")
    assert {(c.params.mode, c.params.precision) for c in seed.cells} == {
        ("train", "amp"), ("infer", "fp32")}


GAUDI_COMPILE = """
[matrix]
backend = "docker"
repeats = 3
[workload]
hardware = "gaudi"
compile = "default"
[axes]
gpus = [1, 8]
precision = ["bf16", "fp32"]
[hardware.gaudi]
device = "hpu"
image = "habana"
"""


def test_a_problem_is_reported_once_per_field_not_per_cell(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text(GAUDI_COMPILE)
    found = check_matrix(load_matrix(path), machine=GAUDI)  # 12 cells, 4 configurations
    assert [p.field for p in found.errors] == ["workload.compile"]
    assert found.stacks["gaudi"].torch == "2.4.0"


def test_strict_turns_warnings_into_problems(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text("""
[matrix]
backend = "docker"
[workload]
hardware = "v100"
cuda_graphs = true
compile = "default"
[hardware.v100]
device = "cuda"
gpu = "H100"
image = "ngc-pytorch"
""")
    matrix = load_matrix(path)
    found = refuse_unrunnable(matrix, machine=facts("H100"))
    assert [p.field for p in found.warnings] == ["workload.cuda_graphs"]
    with pytest.raises(ConfigError, match="workload.cuda_graphs: with compile"):
        refuse_unrunnable(matrix, strict=True, machine=facts("H100"))


@pytest.mark.subprocess  # the docker backend's check asks `docker version`
def test_the_backend_decides_what_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text(GAUDI_COMPILE.replace('compile = "default"', 'hpu_mode = "eager"'))
    matrix = load_matrix(path)
    assert check_matrix(matrix, "docker").stacks["gaudi"].label.startswith("Habana")
    process = check_matrix(matrix, "process")
    assert process.stacks["gaudi"] == host_stack()
    assert any(p.field == "hardware.gaudi.image" and "not used" in p.message
               for p in process.notes)
    unknown = check_matrix(matrix, "apptainer")
    assert not unknown.stacks["gaudi"].known and unknown.errors == []


def test_comparisons_can_be_left_to_the_full_matrix(tmp_path: Path) -> None:
    """A ``--only`` subset may leave out the baseline's rows: the sweep checks cells only."""
    path = tmp_path / "m.toml"
    path.write_text('[matrix]\nbaseline = "hardware=v100"\n[workload]\nhardware = "cpu"\n'
                    '[hardware.cpu]\ndevice = "cpu"\n')
    matrix = load_matrix(path)
    assert [p.field for p in check_matrix(matrix).errors] == ["matrix.baseline"]
    assert check_matrix(matrix, comparisons=False).errors == []


def test_a_sweep_refuses_before_it_makes_a_run_folder(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text('[workload]\nhardware = "cpu"\nprecision = "amp"\narch = "resnet5"\n'
                    '[hardware.cpu]\ndevice = "cpu"\n')
    with pytest.raises(ConfigError) as err:
        run_sweep(load_matrix(path), results_root=tmp_path / "results")
    assert {p.field for p in err.value.problems} == {"workload.precision", "workload.arch"}
    assert not (tmp_path / "results").exists()


def test_what_this_machine_lacks_is_refused_before_the_run_folder_all_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep's one entry into the checks (preflight): an unset ``$env:`` reference and an
    Apptainer runtime missing here are one error naming both (each used to stop the sweep
    alone, the reference first), before any run folder."""
    monkeypatch.delenv("ORCHESTRATE_TEST_UNSET", raising=False)
    path = tmp_path / "m.toml"
    path.write_text('[workload]\nhardware = "cpu"\n[hardware.cpu]\ndevice = "cpu"\n'
                    'runtime = "apptainer"\nenv = { TOKEN = "$env:ORCHESTRATE_TEST_UNSET" }\n'
                    '[hardware.cpu.apptainer]\nbinary = "/no/such/apptainer"\n'
                    'sif = "/no/such/image.sif"\n')
    matrix = load_matrix(path)
    assert refuse_unrunnable(matrix).errors == []  # the matrix itself is right
    with pytest.raises(ConfigError) as err:
        run_sweep(matrix, results_root=tmp_path / "results")
    assert [p.field for p in err.value.problems] == ["hardware.cpu.env.TOKEN",
                                                     "hardware.cpu.apptainer.binary",
                                                     "hardware.cpu.apptainer.sif"]
    assert not (tmp_path / "results").exists()


def test_an_arch_newer_than_the_stacks_torchvision(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Every model of today's table exists from the floor on, so no shipped release lacks one:
    the table is made to say that this one came later (as a future model would)."""
    from orchestrator.catalog import stacks

    monkeypatch.setattr(stacks, "arch_available",
                        lambda arch, version: arch != "resnet18" or version >= "0.19")
    path = tmp_path / "m.toml"
    path.write_text('[matrix]\nbackend = "docker"\n[axes]\narch = ["resnet50", "resnet18"]\n'
                    'hardware = ["old", "new"]\n'
                    '[hardware.old]\ndevice = "cuda"\nimage = "ngc-pytorch"\n'
                    'image_vars = { base_tag = "23.10-py3" }\n'
                    '[hardware.new]\ndevice = "cuda"\nimage = "ngc-pytorch"\n'
                    'image_vars = { base_tag = "24.05-py3" }\n')
    (problem,) = check_matrix(load_matrix(path), machine=facts("H100")).errors
    assert problem.field == "axes.arch[1]"
    assert problem.message.startswith("'resnet18' is not in torchvision 0.16, which hardware 'old'")


# --- releases: auto per host, and ngc_release as an axis -------------------------------------

AUTO = ('[matrix]\nbackend = "ssh"\n[workload]\nhardware = "h100"\n[axes]\narch = {archs}\n'
        '[hardware.h100]\ndevice = "cuda"\ngpu = "{gpu}"\nimage = "ngc-pytorch"\n'
        'release = "auto"\n')


def test_auto_is_checked_against_every_release_a_host_may_get(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What fails on the newest release a host may get is an error; what fails only on older
    ones (a host with an older driver) is a warning naming them. The model table is made to
    say resnet18 came with torchvision 0.19 (NGC 24.05), as a future model would."""
    from orchestrator.catalog import stacks

    monkeypatch.setattr(stacks, "arch_available",
                        lambda arch, version: arch != "resnet18" or version >= "0.19")
    path = tmp_path / "m.toml"
    path.write_text(AUTO.format(archs='["resnet50", "resnet18", "resnet5x"]', gpu="H100"))
    found = check_matrix(load_matrix(path))
    stack = found.stacks["h100"]
    assert not stack.known and stack.candidates[0].release == "23.06"
    assert stack.candidates[-1].release == "25.12"
    assert [p.field for p in found.errors] == ["axes.arch[2]"]  # fails everywhere
    (warning,) = found.warnings
    assert warning.field == "axes.arch[1]"
    assert warning.message.startswith("on hosts whose driver gets 24.04 or older "
                                      "(release = 'auto'): 'resnet18' is not in torchvision 0.18")
    assert any(n.field == "hardware.h100.release" and "23.06..25.12 possible" in n.message
               for n in found.notes)


def test_auto_on_a_v100_is_only_checked_against_releases_that_run_volta(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text(AUTO.format(archs='["resnet50"]', gpu="V100"))
    stack = check_matrix(load_matrix(path)).stacks["h100"]
    assert stack.candidates[-1].release == "24.12"


@pytest.mark.parametrize(("profile", "field", "message"), [
    ('image_vars = { base_tag = "24.05-py3" }', "hardware.h100.image_vars.base_tag",
     "base_tag fixes the base image, which release = 'auto' chooses"),
])
def test_auto_with_a_fixed_base_is_an_error(tmp_path: Path, profile: str, field: str,
                                            message: str) -> None:
    path = tmp_path / "m.toml"
    path.write_text(AUTO.format(archs='["resnet50"]', gpu="H100") + profile + "\n")
    (problem,) = check_matrix(load_matrix(path)).errors
    assert problem.field == field and message in problem.message


RELEASES = ('[matrix]\nbackend = "{backend}"\nbaseline = "ngc_release=24.05"\n'
            '[workload]\nhardware = "h100"\n[axes]\nngc_release = {releases}\n'
            '[hardware.h100]\ndevice = "cuda"\ngpu = "H100"\nimage = "{image}"\n{extra}\n')


def releases_matrix(tmp_path: Path, *, backend: str = "docker", image: str = "ngc-pytorch",
                    releases: str = '["24.05", "24.10"]', extra: str = "") -> Path:
    path = tmp_path / "m.toml"
    path.write_text(RELEASES.format(backend=backend, image=image, releases=releases,
                                    extra=extra))
    return path


def test_a_release_axis_gives_each_release_its_stack_and_notes_the_comparison(
    tmp_path: Path
) -> None:
    matrix = load_matrix(releases_matrix(tmp_path))
    found = check_matrix(matrix, machine=facts("H100"))
    assert found.errors == [] and found.warnings == []
    by_release = {c.params.ngc_release: found.stack_of(c) for c in matrix.cells}
    assert by_release["24.05"].torch == "2.4.0a0+07cecf4168"
    assert by_release["24.10"].base == "nvcr.io/nvidia/pytorch:24.10-py3"
    assert any(n.field == "matrix.baseline" and "release comparison" in n.message
               for n in found.notes)
    assert {c.id for c in matrix.cells} == {"h100-g1-bs64-fp32-ngc24.05-r1",
                                            "h100-g1-bs64-fp32-ngc24.10-r1"}


@pytest.mark.subprocess  # the docker backend's check asks `docker version`
@pytest.mark.parametrize(("kwargs", "field", "message"), [
    ({"backend": "process"}, "axes.ngc_release[0]",
     "the process backend runs this machine's Python instead"),
    ({"image": "habana", "extra": 'device = "hpu"'}, "axes.ngc_release[0]",
     "builds 'habana', which takes none"),
    ({"extra": 'release = "auto"'}, "axes.ngc_release[0]", "has release = 'auto'"),
    ({"extra": 'image_vars = { base_image = "lab/pytorch:1" }'},
     "hardware.h100.image_vars.base_image", "base_image fixes the base image"),
    ({"releases": '["24.05", "23.02"]'}, "axes.ngc_release[1]",
     "NGC PyTorch 23.02 (nvcr.io/nvidia/pytorch:23.02-py3) is not offered"),
])
def test_what_a_release_axis_cannot_do(tmp_path: Path, kwargs: dict[str, str], field: str,
                                       message: str) -> None:
    if kwargs.get("image") == "habana":  # the device line replaces the profile's cuda one
        path = tmp_path / "m.toml"
        path.write_text(RELEASES.format(backend="docker", image="habana", releases='["24.05"]',
                                        extra="").replace('device = "cuda"\ngpu = "H100"',
                                                          'device = "hpu"'))
    else:
        path = releases_matrix(tmp_path, **kwargs)
    found = check_matrix(load_matrix(path), comparisons=False)
    assert any(p.field == field and message in p.message for p in found.errors), found.errors


@pytest.mark.subprocess  # the docker backend's check asks `docker version`
def test_a_mirror_of_nvcr_keeps_its_release_a_base_of_its_own_does_not(tmp_path: Path) -> None:
    """base_repository (a lab mirror of nvcr.io) keeps the release base_tag names; a base_image
    of the lab's own, however it is named, is not assumed to be an NGC release."""
    path = tmp_path / "m.toml"
    path.write_text('[matrix]\nbackend = "docker"\n[axes]\nhardware = ["mirror", "own"]\n'
                    '[hardware.mirror]\ndevice = "cuda"\nimage = "ngc-pytorch"\n'
                    'image_vars = { base_repository = "registry.lab:5000/nvidia/pytorch", '
                    'base_tag = "23.10-py3" }\n'
                    '[hardware.own]\ndevice = "cuda"\nimage = "ngc-pytorch"\n'
                    'image_vars = { base_image = "lab/pytorch:23.10-py3" }\n')
    found = check_matrix(load_matrix(path))
    mirror, own = found.stacks["mirror"], found.stacks["own"]
    assert (mirror.release, mirror.known) == ("23.10", True)
    assert mirror.base == "registry.lab:5000/nvidia/pytorch:23.10-py3"
    assert (own.release, own.known) == (None, False)


def test_an_old_release_is_refused_for_the_workload_and_allowed_for_a_foreign_program(
    tmp_path: Path
) -> None:
    """NGC 20.03 (seed 003's stack) ships torch 1.5: our workload cannot run there (an error at
    the field that picks it), DLE's main.py, which brings its own code, can (a note)."""
    path = tmp_path / "m.toml"
    path.write_text(
        '[matrix]\nbackend = "docker"\n[axes]\nprogram = ["workload", "dle"]\n'
        '[workload]\nhardware = "v100"\n'
        '[hardware.v100]\ndevice = "cuda"\ngpu = "V100"\nimage = "ngc-pytorch"\n'
        'image_vars = { base_tag = "20.03-py3" }\n'
        '[commands.dle]\ncommand = "python main.py --arch {arch} -b {batch_size} /data"\n'
        'figures = { parser = "dllogger" }\n')
    found = check_matrix(load_matrix(path), comparisons=False, machine=facts("V100"))
    field = "hardware.v100.image_vars.base_tag"
    assert [(p.field, "not offered for the workload" in p.message) for p in found.errors] == [
        (field, True)]
    assert "ships torch 1.5.0a0+8f84ded" in found.errors[0].message
    assert any(p.field == field and "program 'dle' brings its own code" in p.message
               for p in found.notes)
    assert found.stacks["v100"].torch == "1.5.0a0+8f84ded" and found.stacks["v100"].ubuntu == (
        "18.04")
    path.write_text(path.read_text().replace('program = ["workload", "dle"]', 'program = ["dle"]'))
    assert check_matrix(load_matrix(path), comparisons=False, machine=facts("V100")).errors == []
