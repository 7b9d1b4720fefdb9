"""Images per driver release, for real: driver-aware sweeps over SSH, the nightly refresh, pinned
bases in every result, and the NGC release as an axis of a sweep.

Real: the Docker engine of this machine builds every image; the "hosts" are real sshd servers on
loopback (tests/ssh_support.py) whose engine is this machine's. Stand-ins, because no registry and
no GPU exist here:

* **NGC releases** are local images named like a lab mirror of nvcr.io,
  ``orchestrate-test/mirror/pytorch:YY.MM-py3`` (the ngc-pytorch template's ``base_repository``):
  each a one-line layer on the test base image (Debian + torch, tests/infra/make-base-image.sh)
  that sets ``NVIDIA_PYTORCH_VERSION=YY.MM`` as NGC's containers do, so each "release" has its own
  image ID and the workload reports the release it ran in.
* **Drivers**: every sshd host gives its sessions a PATH whose first folder holds an
  ``nvidia-smi`` STAND-IN (a shell script, labelled as such) reporting one H100 and the driver
  written in that folder's ``driver`` file; changing the file is a driver upgrade. The cells run
  on the CPU (device "cpu": no device request), on whichever "host" placement picks.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from ssh_support import SshdFactory, SshdServer, write_inventory
from standin_support import STANDIN_WORKLOAD, Standin, container_mount

from orchestrator import cli
from orchestrator.config.inventory import load_hosts
from orchestrator.images import state as imagestate
from orchestrator.images.refresh import refresh
from orchestrator.plan.matrix import load_matrix
from orchestrator.results.folders.run_folder import Status
from orchestrator.sweep import run_sweep

MIRROR = "orchestrate-test/mirror/pytorch"
RELEASES = ("24.05", "24.10", "25.01")
STANDARD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

NVIDIA_SMI_STANDIN = textwrap.dedent("""\
    #!/bin/sh
    # STAND-IN for nvidia-smi (tests only: this machine has no GPU). It reports one H100 and
    # the driver version written in the file "driver" next to this script.
    driver=$(cat "$(dirname "$0")/driver")
    case "$*" in
      *--query-gpu=*) echo "0, NVIDIA H100 80GB HBM3, 81559, $driver" ;;
      *) echo "| NVIDIA-SMI $driver    Driver Version: $driver    CUDA Version: 12.4 |" ;;
    esac
    """)

#: The cells: the STAND-IN workload (tests/standin/, mounted into the containers), which
#: reports the NGC release of its container as the workload does.
CELLS = f"""
[workload]
hardware = "gpu"
{STANDIN_WORKLOAD}telemetry_interval = 0
"""

PROFILE = """
[hardware.gpu]
device = "cpu"      # the cells run on the CPU; the drivers the hosts report pick the release
image = "ngc-pytorch"
{release}
image_vars = {{ base_repository = "{mirror}", install_nvml = false }}
env = {{ OMP_NUM_THREADS = "1" }}
container = {{ shm_size = "256m", ulimits = {{ stack = 67108864 }}, mounts = [{mount}] }}
"""


@pytest.fixture(scope="module")
def release_bases(docker_client: Any, base_image: str,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """release -> the image ID of its local stand-in (see the module docstring)."""
    ids = {}
    for release in RELEASES:
        ctx = tmp_path_factory.mktemp(f"release-{release}")
        (ctx / "Dockerfile").write_text(
            f"FROM {base_image}\nENV NVIDIA_PYTORCH_VERSION={release}\n")
        image, _ = docker_client.images.build(path=str(ctx), tag=f"{MIRROR}:{release}-py3",
                                              rm=True)
        ids[release] = image.id
    yield ids
    for release in RELEASES:
        with contextlib.suppress(docker.errors.APIError):
            docker_client.images.remove(f"{MIRROR}:{release}-py3", force=True)


@pytest.fixture
def built(docker_client: Any) -> Iterator[set[str]]:
    """Image tags a test made; removed afterwards (the next run builds from scratch)."""
    tags: set[str] = set()
    yield tags
    for tag in tags:
        with contextlib.suppress(docker.errors.APIError):
            docker_client.images.remove(tag, force=True)


def driver_host(factory: SshdFactory, root: Path, name: str, driver: str) -> tuple[SshdServer,
                                                                                   Path]:
    """An sshd "host" whose sessions find the nvidia-smi stand-in first on their PATH."""
    bindir = root / f"{name}-bin"
    bindir.mkdir()
    tool = bindir / "nvidia-smi"
    tool.write_text(NVIDIA_SMI_STANDIN)
    tool.chmod(0o755)
    (bindir / "driver").write_text(driver + "\n")
    return factory(name, setenv={"PATH": f"{bindir}:{STANDARD_PATH}"}), bindir / "driver"


@pytest.fixture(scope="module")
def two_drivers(sshd_factory: SshdFactory, tmp_path_factory: pytest.TempPathFactory
                ) -> tuple[tuple[SshdServer, Path], tuple[SshdServer, Path]]:
    """Host "drv-a" (driver 550.54.15: NGC 24.05) and "drv-b" (560.35.03: NGC 24.10)."""
    root = tmp_path_factory.mktemp("drivers")
    return (driver_host(sshd_factory, root, "drv-a", "550.54.15"),
            driver_host(sshd_factory, root, "drv-b", "560.35.03"))


def inventory(tmp_path: Path, servers: list[SshdServer]) -> Path:
    """The hosts, each with one (fake) GPU 0 and the tag "gpu"."""
    return write_inventory(tmp_path, servers, tags=("gpu",), gpus=[[0]] * len(servers))


def matrix_file(standin: Standin, tmp_path: Path, body: str, *,
                release: str = 'release = "auto"') -> Path:
    path = tmp_path / "drivers.toml"
    path.write_text(body + CELLS + PROFILE.format(release=release, mirror=MIRROR,
                                                  mount=container_mount())
                    + standin.command(container=True))
    return path


@pytest.mark.docker
@pytest.mark.ssh
@pytest.mark.timeout(900)
def test_each_host_runs_the_release_its_driver_allows_and_refresh_rebuilds_only_what_changed(
    tmp_path: Path, two_drivers: Any, release_bases: dict[str, str], docker_client: Any,
    built: set[str], capsys: pytest.CaptureFixture[str], standin: Standin,
) -> None:
    (a, a_driver), (b, _) = two_drivers
    hosts = inventory(tmp_path, [a, b])
    path = matrix_file(standin, tmp_path,
                       '[matrix]\nname = "drivers"\nbackend = "ssh"\ntimeout_s = 300\n'
                       '[axes]\nseed = [1, 2, 3, 4]\n')
    results = tmp_path / "results"
    outcome = run_sweep(load_matrix(path), results_root=results, hosts_file=hosts)

    # every cell ran the image of its host's driver, and its result says so
    assert {r.status for r in outcome.results} == {Status.OK}, [r.reason for r in outcome.results]
    expected = {a.name: ("24.05", "550.54.15"), b.name: ("24.10", "560.35.03")}
    images = {}
    for res in outcome.results:
        prov = res.provenance
        release, driver = expected[prov["host"]]
        assert (prov["release"], prov["release_family"], prov["release_how"]) == (
            release, "ngc", "auto")
        assert prov["host_driver"] == driver and f"driver {driver}" in prov["release_reason"]
        assert prov["base_image"] == f"{MIRROR}:{release}-py3"
        assert prov["base_image_id"] == release_bases[release] and prov["base_digest"] is None
        assert prov["image_id"] == docker_client.images.get(prov["image"]).id
        assert res.env["container_release"] == release  # what the workload saw in its container
        images[prov["host"]] = prov["image"]
    assert set(images) == {a.name, b.name} and images[a.name] != images[b.name]
    built.update(images.values())
    assert "release" in outcome.table.splitlines()[0]  # the rows ran two releases

    # the builds are recorded next to the results, readable by colleagues (the umask's mode)
    state_file = imagestate.state_path(results)
    mode = stat.S_IMODE(state_file.stat().st_mode)
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask
    state = imagestate.load_state(state_file)
    assert {(r.host, r.release, r.driver, r.tag) for r in state.images.values()} == {
        (a.name, "24.05", "550.54.15", images[a.name]),
        (b.name, "24.10", "560.35.03", images[b.name])}
    assert state.hosts[a.name]["driver"] == "550.54.15"

    # nothing changed: the nightly refresh (here through the CLI, the matrix read back from the
    # state) builds nothing and says so
    assert cli.main(["images", "refresh", "--hosts", str(hosts), "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert "nothing changed: 2 image(s) up to date on 2 host(s), nothing built" in out
    assert f"{a.name}: driver 550.54.15 (unchanged)" in out

    # drv-a's driver is upgraded: exactly its image is rebuilt, on the release the new driver runs
    a_driver.write_text("570.86.15\n")
    code = cli.main(["images", "refresh", "--hosts", str(hosts), "--results", str(results)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"{a.name}: driver 550.54.15 -> 570.86.15" in out
    assert ("drivers/gpu: 24.05 -> 25.01: rebuilt orchestrate/ngc-pytorch:" in out
            and "(driver 550.54.15 -> 570.86.15, release 24.05 -> 25.01, base "
                f"{MIRROR}:24.05-py3 -> {MIRROR}:25.01-py3)" in out), out
    assert f"{b.name}: driver 560.35.03 (unchanged)\n  drivers/gpu: 24.10: up to date" in out
    assert out.rstrip().endswith("1 image(s) rebuilt, 1 up to date on 2 host(s)")
    state = imagestate.load_state(state_file)
    new_a = next(r for r in state.images.values() if r.host == a.name)
    assert (new_a.release, new_a.driver, new_a.base_image_id, new_a.built) == (
        "25.01", "570.86.15", release_bases["25.01"], True)
    built.add(new_a.tag)

    # and again: nothing changed, nothing built
    report = refresh(load_hosts(hosts), [], results)
    assert [i.action for h in report.hosts for i in h.images] == ["up to date", "up to date"]
    assert report.changed == [] and report.ok

    # a dry run of drv-b's upgrade to the same driver: its new image is already on the engine
    # (the loopback hosts share it), so nothing would be built; nothing is written either
    (b_driver_file := Path(str(a_driver).replace("drv-a", "drv-b"))).write_text("570.86.15\n")
    before = state_file.read_bytes()
    report = refresh(load_hosts(hosts), [load_matrix(path)], results, dry_run=True)
    (b_report,) = [h for h in report.hosts if h.host == b.name]
    (image,) = b_report.images
    assert b_report.driver_changed and image.action == "up to date"
    assert "already on the host" in image.why and state_file.read_bytes() == before
    b_driver_file.write_text("560.35.03\n")


@pytest.mark.docker
@pytest.mark.ssh
@pytest.mark.timeout(600)
def test_a_host_whose_driver_runs_no_release_is_left_out_saying_why(
    tmp_path: Path, sshd_factory: SshdFactory, release_bases: dict[str, str], built: set[str],
    standin: Standin,
) -> None:
    """A host that answers no nvidia-smi (a CPU box tagged with the profile by mistake) runs
    none of the profile's cells; the other host runs them all; the sweep says why."""
    gpu, _ = driver_host(sshd_factory, tmp_path, "drv-gpu", "560.35.03")
    plain = sshd_factory("drv-none")
    hosts = inventory(tmp_path, [gpu, plain])
    path = matrix_file(standin, tmp_path, '[matrix]\nname = "drivers2"\nbackend = "ssh"\n'
                                 'timeout_s = 300\n[axes]\nseed = [1, 2]\n')

    class Log:
        def __init__(self) -> None:
            self.lines: list[str] = []

        def sweep_started(self, *_: Any) -> None: ...
        def log(self, message: str) -> None: self.lines.append(message)
        def cell_started(self, *_: Any) -> None: ...
        def cell_output(self, *_: Any) -> None: ...
        def cell_finished(self, *_: Any) -> None: ...
        def lock_wait(self, *_: Any) -> None: ...

    events = Log()
    outcome = run_sweep(load_matrix(path), results_root=tmp_path / "results", hosts_file=hosts,
                        events=events)
    assert {r.status for r in outcome.results} == {Status.OK}
    assert {r.provenance["host"] for r in outcome.results} == {"drv-gpu"}
    built.update(r.provenance["image"] for r in outcome.results)
    assert any(line.startswith("host drv-none: not used for hardware 'gpu': release = 'auto' "
                               "needs its NGC PyTorch driver, but nvidia-smi did not answer")
               for line in events.lines), events.lines


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_a_release_axis_compares_releases_on_the_same_hardware(
    tmp_path: Path, release_bases: dict[str, str], docker_client: Any, built: set[str],
    standin: Standin,
) -> None:
    """``ngc_release`` as an axis (docker backend, this machine): one image per release, each
    cell records its release, image ID and base; the table compares against 24.05 and labels the
    ratio as the release comparison, not as a cross-stack warning."""
    path = matrix_file(standin, tmp_path, '[matrix]\nname = "releases"\nbackend = "docker"\n'
                                 'timeout_s = 300\nbaseline = "ngc_release=24.05"\n'
                                 '[axes]\nngc_release = ["24.05", "24.10"]\n', release="")
    outcome = run_sweep(load_matrix(path), results_root=tmp_path / "results")
    assert {r.status for r in outcome.results} == {Status.OK}, [r.reason for r in outcome.results]
    by_release = {r.params["ngc_release"]: r for r in outcome.results}
    for release, res in by_release.items():
        prov = res.provenance
        assert (prov["release"], prov["release_how"]) == (release, "axis")
        assert prov["base_image_id"] == release_bases[release]
        assert prov["image_id"] == docker_client.images.get(prov["image"]).id
        assert res.env["container_release"] == release
        assert "ngc_release" not in json.dumps(res.env)  # the workload never saw the parameter
        built.add(prov["image"])
    assert by_release["24.05"].provenance["image"] != by_release["24.10"].provenance["image"]
    row = next(line for line in outcome.table.splitlines() if "| 24.10" in line)
    assert "x (release comparison: NGC 24.10 vs 24.05)" in row
    assert "cross-stack" not in outcome.table


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_the_docker_backend_takes_this_machines_driver(
    tmp_path: Path, release_bases: dict[str, str], built: set[str],
    monkeypatch: pytest.MonkeyPatch, standin: Standin,
) -> None:
    """``release = "auto"`` with the local docker backend: this machine's nvidia-smi (the
    STAND-IN first on PATH, reporting driver 560.35.03) picks NGC 24.10."""
    from orchestrator.catalog import gpus

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text(NVIDIA_SMI_STANDIN)
    (bindir / "nvidia-smi").chmod(0o755)
    (bindir / "driver").write_text("560.35.03\n")
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    gpus.local_facts.cache_clear()
    try:
        path = matrix_file(standin, tmp_path, '[matrix]\nname = "local_auto"\nbackend = "docker"\n'
                                     'timeout_s = 300\n')
        outcome = run_sweep(load_matrix(path), results_root=tmp_path / "results")
    finally:
        gpus.local_facts.cache_clear()
    (res,) = outcome.results
    assert res.status is Status.OK, res.reason
    built.add(res.provenance["image"])
    assert (res.provenance["release"], res.provenance["host_driver"]) == ("24.10", "560.35.03")
    assert res.env["container_release"] == "24.10"
    state = imagestate.load_state(imagestate.state_path(tmp_path / "results"))
    assert [(r.host, r.release) for r in state.images.values()] == [("localhost", "24.10")]
