"""Which image a cell runs on which host: the release the cell pins, the profile names, or the
host's driver picks (``release = "auto"``). Pure: the host facts are values (the parsers of
nvidia-smi/hl-smi output are tests/test_gpus.py's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.catalog.gpus import GpuInfo, HostFacts
from orchestrator.errors import ConfigError
from orchestrator.images import build
from orchestrator.plan import selection
from orchestrator.plan.matrix import Matrix, load_matrix
from orchestrator.plan.selection import HostDriver, ImageKey, NoRelease

MATRIX = """
[matrix]
name = "sel"
backend = "ssh"

[workload]
hardware = "h100"

[axes]
precision = ["fp32", "bf16"]

[hardware.h100]
device = "cuda"
gpu = "H100"
image = "ngc-pytorch"
release = "auto"
{extra}

[hardware.v100]
device = "cuda"
gpu = "V100"
image = "ngc-pytorch"
image_vars = {{ base_tag = "23.10-py3" }}

[hardware.gaudi]
device = "hpu"
image = "habana"
release = "auto"
"""


def matrix(tmp_path: Path, extra: str = "", body: str = "") -> Matrix:
    path = tmp_path / "sel.toml"
    path.write_text(MATRIX.format(extra=extra) + body)
    return load_matrix(path)


def nvidia(name: str, driver: str | None, *models: str) -> HostDriver:
    facts = HostFacts(name, True, driver=driver, accelerator="nvidia" if driver else None,
                      gpus=tuple(GpuInfo(i, m, 81559) for i, m in enumerate(models)))
    return HostDriver.from_facts(facts)


def test_the_host_driver_is_that_of_its_oldest_gpu() -> None:
    mixed = nvidia("a", "570.86.15", "NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-32GB")
    assert mixed == HostDriver("a", "570.86.15", "nvidia", "7.0")
    assert nvidia("b", "570.86.15", "Some Future GPU").compute_capability is None


@pytest.mark.parametrize(("driver", "models", "release"), [
    ("550.54.15", ("NVIDIA H100 80GB HBM3",), "24.05"),
    ("560.35.03", ("NVIDIA H100 80GB HBM3",), "24.10"),
    ("590.48.01", ("NVIDIA H100 80GB HBM3",), "25.12"),
    ("590.48.01", ("Tesla V100-SXM2-32GB",), "24.12"),  # 25.01 dropped Volta
])
def test_auto_gives_each_host_the_newest_release_its_driver_runs(
    tmp_path: Path, driver: str, models: tuple[str, ...], release: str
) -> None:
    m = matrix(tmp_path)
    choice = selection.choose(m, ImageKey("h100", None, "a"), nvidia("a", driver, *models))
    assert (choice.release, choice.family, choice.how, choice.driver) == (
        release, "ngc", "auto", driver)
    assert choice.values["base_tag"] == f"{release}-py3"
    assert f"driver {driver}" in choice.reason and release in choice.reason
    assert choice.label == f"NGC PyTorch {release}"


def test_forward_compat_is_the_datacenter_option(tmp_path: Path) -> None:
    host = nvidia("a", "535.161.08", "NVIDIA H100 80GB HBM3")
    assert selection.choose(matrix(tmp_path), ImageKey("h100", None, "a"), host).release == "23.10"
    dc = matrix(tmp_path, "forward_compat = true")
    choice = selection.choose(dc, ImageKey("h100", None, "a"), host)
    assert choice.release == "25.03" and "forward compatibility" in choice.reason


def test_a_host_that_runs_no_release_is_named_with_what_to_do(tmp_path: Path) -> None:
    m = matrix(tmp_path)
    with pytest.raises(NoRelease) as no_driver:
        selection.choose(m, ImageKey("h100", None, "cpu-box"), nvidia("cpu-box", None))
    assert no_driver.value.host == "cpu-box" and "nvidia-smi did not answer" in no_driver.value.why
    assert no_driver.value.problems[0].field == "hardware.h100.release"
    with pytest.raises(NoRelease, match="older than every known NGC PyTorch release"):
        selection.choose(m, ImageKey("h100", None, "old"), nvidia("old", "418.39.01", "A100"))
    with pytest.raises(NoRelease, match=r"runs NGC PyTorch 21\.03 at the newest.*floor"):
        selection.choose(m, ImageKey("h100", None, "old"), nvidia("old", "470.82.01", "A100"))
    gaudi = HostDriver("g", "1.18.0-524", "gaudi")
    with pytest.raises(NoRelease, match="reports a gaudi driver"):
        selection.choose(m, ImageKey("h100", None, "g"), gaudi)


def test_auto_on_gaudi_takes_the_hosts_own_software_release(tmp_path: Path) -> None:
    choice = selection.choose(matrix(tmp_path), ImageKey("gaudi", None, "g"),
                              HostDriver("g", "1.18.0-524", "gaudi"))
    assert (choice.release, choice.family) == ("1.18.0", "habana")
    assert choice.values == {"synapse_version": "1.18.0", "torch_version": "2.4.0"}
    plan = build.plan_image(choice.template, choice.values)
    assert plan.base_image == ("vault.habana.ai/gaudi-docker/1.18.0/ubuntu22.04/habanalabs/"
                               "pytorch-installer-2.4.0:latest")


def test_a_cells_ngc_release_pins_its_image(tmp_path: Path) -> None:
    m = matrix(tmp_path, body='[[include]]\nhardware = "v100"\nngc_release = "24.10"\n')
    choice = selection.choose(m, ImageKey("v100", "24.10"))
    assert (choice.release, choice.how, choice.values["base_tag"]) == ("24.10", "axis",
                                                                       "24.10-py3")
    own = selection.choose(m, ImageKey("v100"))
    assert (own.release, own.how, own.values["base_tag"]) == ("23.10", "profile", "23.10-py3")


def test_image_keys_carry_the_host_only_where_the_driver_picks(tmp_path: Path) -> None:
    m = matrix(tmp_path, body='[[include]]\nhardware = "h100"\nngc_release = "24.10"\n'
                              '[[include]]\nhardware = "v100"\n')
    keys = {selection.image_key(m, c, "a") for c in m.cells}
    assert keys == {ImageKey("h100", None, "a"), ImageKey("h100", "24.10", None),
                    ImageKey("v100", None, None)}
    assert selection.needed_keys(m, m.cells) == [
        ImageKey("h100"), ImageKey("h100", "24.10"), ImageKey("v100")]


def test_auto_with_a_fixed_base_is_refused(tmp_path: Path) -> None:
    m = matrix(tmp_path, 'image_vars = { base_tag = "24.05-py3" }')
    with pytest.raises(ConfigError, match="base_tag fixes the base image"):
        selection.choose(m, ImageKey("h100", None, "a"), nvidia("a", "550.54.15", "H100"))


def test_a_mirror_keeps_the_release_choice(tmp_path: Path) -> None:
    m = matrix(tmp_path, 'image_vars = { base_repository = "registry.lab:5000/nvidia/pytorch" }')
    choice, plan = build.plan_key(m, ImageKey("h100", None, "a"),
                                  nvidia("a", "560.35.03", "H100"))
    assert plan.base_image == "registry.lab:5000/nvidia/pytorch:24.10-py3"
    assert choice.release == "24.10"


def test_a_pinned_release_the_hosts_driver_cannot_run_is_warned() -> None:
    """Preparing the image warns (the ssh backend still runs the cells: forward compatibility
    may cover it)."""
    from orchestrator.images.prepare import driver_too_old

    pinned = selection.ImageChoice("h100", "ngc-pytorch", {}, "24.10", "ngc", "profile")
    old = HostDriver("a", "550.54.15", "nvidia")
    message = driver_too_old(pinned, old)
    assert message is not None and message.startswith(
        "driver 550.54.15 is older than NGC PyTorch 24.10 needs (>= 560.35.03)")
    assert driver_too_old(pinned, HostDriver("b", "560.35.03", "nvidia")) is None
    assert driver_too_old(pinned, HostDriver("c")) is None  # not probed


DATA = Path(__file__).resolve().parent / "data"


@pytest.mark.parametrize(("sample", "driver", "capability", "shown"), [
    ("nvidia-smi-query-8xh100.csv", "550.54.15", "9.0", "NGC 24.05"),
    ("nvidia-smi-query-mixed.csv", "470.223.02", "7.0", "none (driver too old or unknown)"),
])
def test_nvidia_smi_output_as_hosts_print_it_decides_the_release(
    sample: str, driver: str, capability: str, shown: str
) -> None:
    """The query lines of nvidia-smi (saved samples of that output format) through the probe's
    parser: the driver and the oldest GPU a host reports pick its release."""
    from orchestrator.catalog.gpus import parse_gpu_csv

    found, drv = parse_gpu_csv((DATA / sample).read_text())
    host = HostDriver.from_facts(HostFacts("h", True, gpus=tuple(found), driver=drv,
                                           accelerator="nvidia"))
    assert (host.driver, host.compute_capability) == (driver, capability)
    assert selection.newest_release(host) == shown


def test_preparing_an_image_for_a_host_that_runs_no_release(tmp_path: Path) -> None:
    """images.prepare, the one preparation of the docker and ssh backends and refresh: the ssh
    backend and refresh skip the image on that host (said, with why; nothing recorded), the
    docker backend raises. Nothing reaches an engine (there is none: the client is None)."""
    from orchestrator.images.prepare import Engine, Ledger, prepare_image

    m = matrix(tmp_path)
    old = nvidia("old", "470.82.01", "A100")
    ledger, said = Ledger(tmp_path), []
    done = prepare_image(m, ImageKey("h100"), Engine("old", None, old, remote=True), ledger,
                         skip_unrunnable=True, say=said.append)
    assert (done.action, done.key, done.record) == ("skipped", ImageKey("h100", None, "old"),
                                                    None)
    # 470.82.01 runs NGC 21.03 at the newest, a release the catalog keeps for seed 000 but no
    # longer offers for the workload: refused, with what to do.
    assert "no longer offered" in done.why and "upgrade the driver" in done.why
    assert said == [f"host old: not used for hardware 'h100': {done.why}"]
    assert ledger.records == []
    refreshed = prepare_image(m, ImageKey("h100"), Engine("old", None, old, remote=True),
                              keep_going=True)
    assert refreshed.action == "skipped"
    with pytest.raises(NoRelease):
        prepare_image(m, ImageKey("h100"), Engine("localhost", None, old))
