"""Pytest fixtures: a real Docker engine and a locally made base image.

* ``docker_client``: a ``docker.DockerClient`` for the engine (DOCKER_HOST or the local socket).
  Without a reachable engine the test is skipped with the reason shown, unless ``CI=true``: then
  it fails, because CI must start dockerd (``tests/infra/start-dockerd.sh``).
* ``base_image``: the reference of a local stand-in for the NGC base image (Debian bookworm,
  python3, torch + torchvision), made once per session by ``tests/infra/make-base-image.sh``
  (a no-op when it exists; CI should run the script before pytest, it takes a few minutes).
  ``ORCHESTRATE_TEST_BASE_IMAGE`` overrides the name.
* ``bitfusion_files``: a stand-in Bitfusion client .deb and a dummy CA certificate.

Register with ``pytest_plugins = ["docker_support"]`` (tests/conftest.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from service_support import unavailable
from standin_support import Standin, container_mount
from workload_support import ONE_STEP_WORKLOAD

INFRA = Path(__file__).resolve().parent / "infra"
DEFAULT_BASE_IMAGE = "orchestrate-test/base:bookworm-torch2.14.1"


@pytest.fixture(scope="session")
def docker_client() -> Iterator[object]:
    """A DockerClient that answers ping; skip (or fail under CI=true) without an engine."""
    from orchestrator.errors import BackendUnavailable
    from orchestrator.local.engine import docker_client as connect

    try:
        client = connect()
    except BackendUnavailable as exc:
        unavailable(str(exc))
    yield client
    client.close()


@pytest.fixture(scope="session")
def base_image(docker_client: object) -> str:
    """A local base image standing in for nvcr.io's (made once; see make-base-image.sh)."""
    ref = os.environ.get("ORCHESTRATE_TEST_BASE_IMAGE", DEFAULT_BASE_IMAGE)
    import docker

    try:
        docker_client.images.get(ref)
        exists = True
    except docker.errors.ImageNotFound:
        exists = False
    if not exists and not shutil.which("debootstrap"):
        unavailable(f"no base image {ref} and no debootstrap to make one "
                     "(apt-get install -y debootstrap; .ci/run does)")
    proc = subprocess.run(
        ["bash", str(INFRA / "make-base-image.sh"), ref],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if proc.returncode != 0:
        pytest.fail(f"make-base-image.sh {ref} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return ref


@pytest.fixture(scope="session")
def bitfusion_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(client .deb, CA certificate) to build the Bitfusion image with.

    The real Bitfusion client is proprietary and cannot be downloaded here, so the .deb is a
    stand-in built now: package ``bitfusion-client-standin`` providing ``/usr/bin/bitfusion``, a
    shell script that skips its own options up to ``--`` and runs the rest
    (``bitfusion run -n 1 -- python3 ...`` runs ``python3 ...`` locally). The certificate is a
    freshly generated self-signed one (a dummy CA), or fixed placeholder text without openssl.
    """
    if not shutil.which("dpkg-deb"):
        unavailable("dpkg-deb not found (apt-get install -y dpkg)")
    root = tmp_path_factory.mktemp("bitfusion")
    pkg = root / "pkg"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "usr" / "bin").mkdir(parents=True)
    (pkg / "DEBIAN" / "control").write_text(
        textwrap.dedent(
            """\
            Package: bitfusion-client-standin
            Version: 0.0.1
            Architecture: all
            Maintainer: orchestrate tests <tests@example.invalid>
            Description: stand-in for the proprietary VMware Bitfusion client (tests only)
             Runs the command after "--" locally.
            """
        )
    )
    script = pkg / "usr" / "bin" / "bitfusion"
    script.write_text(
        textwrap.dedent(
            """\
            #!/bin/sh
            # Stand-in for the proprietary Bitfusion client: run the command after "--".
            while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done
            [ "$#" -gt 0 ] && shift
            exec "$@"
            """
        )
    )
    script.chmod(0o755)
    deb = root / "bitfusion-client-standin_0.0.1_all.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "--build", str(pkg), str(deb)],
        check=True,
        capture_output=True,
    )
    cert = root / "bitfusion-ca.crt"
    if shutil.which("openssl"):
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=orchestrate test Bitfusion CA",
                "-keyout",
                str(root / "ca.key"),
                "-out",
                str(cert),
            ],
            check=True,
            capture_output=True,
        )
    else:
        cert.write_text("-----BEGIN CERTIFICATE-----\nZHVtbXk=\n-----END CERTIFICATE-----\n")
    return deb, cert


def run_containers(client: Any, run_id: str) -> list[Any]:
    """Every container (running or not) labelled with sweep run ``run_id``."""
    from orchestrator.local.engine import LABEL_RUN

    return client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id}"})


#: A matrix of one small cell (resnet18, 32 px, batch 2, one iteration) on a ``cpu`` profile
#: built from the ngc-pytorch template over ``{base}`` (the local base image): the real
#: workload, or the STAND-IN (``{workload}``, ``{mounts}``).
CPU_CONTAINER_MATRIX = """
[matrix]
name = "{name}"
backend = "{backend}"
timeout_s = 240
{settings}
[workload]
hardware = "cpu"
{workload}
[hardware.cpu]
device = "cpu"
image = "ngc-pytorch"
image_vars = {{ base_image = "{base}", install_nvml = false }}
env = {{ OMP_NUM_THREADS = "1" }}
# memlock = unlimited (the GPU default) is refused on the project's VMs.
container = {{ shm_size = "256m", ulimits = {{ stack = 67108864 }}{mounts} }}
{profile_extra}
"""


def cpu_container_matrix(name: str, base: str, *, backend: str, settings: str = "",
                         profile_extra: str = "", standin: Standin | None = None,
                         knobs: str = "", launcher: str = "self") -> str:
    """:data:`CPU_CONTAINER_MATRIX` filled in: ``settings`` go under ``[matrix]``,
    ``profile_extra`` (more keys of the profile, or tables after it) at the end. With
    ``standin`` the cells run the STAND-IN workload, mounted into the container (its ``knobs``;
    ``launcher = "torchrun"`` for multi-node cells)."""
    if standin is None:
        return CPU_CONTAINER_MATRIX.format(name=name, backend=backend, base=base,
                                           settings=settings, profile_extra=profile_extra,
                                           workload=ONE_STEP_WORKLOAD, mounts="")
    workload = standin.workload.replace("warmup = 1\niterations = 2\n",
                                        "warmup = 0\niterations = 1\n")
    text = CPU_CONTAINER_MATRIX.format(name=name, backend=backend, base=base, settings=settings,
                                       profile_extra=profile_extra, workload=workload,
                                       mounts=f", mounts = [{container_mount()}]")
    return text + standin.command(knobs, container=True, launcher=launcher)
