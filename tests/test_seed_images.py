"""The seed images' install steps, from the seeds' own requirement lines, built on the local
engine as far as this machine allows.

No registry here, so each seed's base is a labelled **stand-in** with the real base's Ubuntu and
Python (``tests/infra/make-ubuntu-standin.sh``, then pip and, where the real base has it, a
``torch`` package record of the version it ships, so pip sees what the real base has). The
containers reach the Python package index as this machine's pip does: through its CA bundle
(``/etc/ssl/certs/ca-certificates.crt``, the ``cert`` of ``pip config list``), copied into the
stand-in. A requirement that no longer resolves (a package removed, an unreachable URL) then
fails the build here, as it would in a lab.

What is built, per seed (the lab's checkout is a test folder holding the seed's requirement
lines, quoted from the seed's repository at its revision):

* 003 -- DLE @ 5cc03caa's ``requirements.txt`` (``pytorch-ignite``; DLLogger from
  ``git+git://github.com/...``) on an NGC 20.03 stand-in (Ubuntu 18.04, Python 3.6, pip 20.0.2,
  torch 1.5.0a0 recorded): the DLLogger line is rewritten to ``git+https://`` (the image's label
  says so); ``pytorch-ignite`` installs from the index; the DLLogger line itself **cannot be
  built here** (no route to github.com from this project's machines): the build of the full
  file is shown to fail on exactly that host.
* 000 -- alexhanl/machine-learning @ 31353a8's ``PyTorch/ConvNets`` image (``pip install
  nvidia-pyindex``, ``pynvml==11.0.0``) on an NGC 21.03 stand-in (Ubuntu 20.04, Python 3.8); its
  ``nvidia-dllogger==0.1.0`` is served only by NVIDIA's index (pypi.ngc.nvidia.com), which
  **cannot be reached here**: the test shows the package index has no such package and builds the
  rest.

Not built here, and why: seed 001's TensorFlow base and Nsight Compute installer (NVIDIA's
sign-in download), seed 002's Singularity definition (no Apptainer runtime on these machines),
seed 004's Habana base (mpi4py needs Habana's MPI). Their templates are rendered and checked by
tests/test_images.py.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
from service_support import unavailable

from orchestrator.catalog import templates
from orchestrator.images.build import plan_image

ROOT = Path(__file__).resolve().parents[1]
INFRA = ROOT / "tests" / "infra"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

#: DLE @ 5cc03caa PyTorch/Classification/ConvNets/requirements.txt, as the seed's image reads it
DLE_5CC03CAA_REQUIREMENTS = (
    "pytorch-ignite\n"
    "git+git://github.com/NVIDIA/dllogger.git@26a0f8f1958de2c0c460925ff6102a4d2486d6cc"
    "#egg=dllogger\n")
#: alexhanl/machine-learning @ 31353a8 PyTorch/ConvNets/requirements.txt
ALEXHANL_REQUIREMENTS = "nvidia-dllogger==0.1.0\npynvml==11.0.0\n"

#: stand-in tag -> (Ubuntu suite, pip version, torch version the real base ships, what it is)
STANDINS = {
    "orchestrate-test/seed-standin:ngc-20.03": (
        "bionic", "20.0.2", "1.5.0a0+8f84ded",
        "NGC PyTorch 20.03 (Ubuntu 18.04, Python 3.6, pip 20.0.2, torch 1.5.0a0+8f84ded)"),
    "orchestrate-test/seed-standin:ngc-21.03": (
        "focal", "", "1.9.0a0+df837d0",
        "NGC PyTorch 21.03 (Ubuntu 20.04, Python 3.8, torch 1.9.0a0+df837d0)"),
}

STANDIN_DOCKERFILE = "\n".join((
    "FROM {ubuntu}",
    'LABEL org.orchestrate.stand-in="STAND-IN for {what}: Ubuntu\'s python3 and pip, a torch '
    'package record (no torch), this machine\'s CA bundle for the package index"',
    "COPY ca-bundle.crt /etc/orchestrate/ca-bundle.crt",
    "ENV PIP_CERT=/etc/orchestrate/ca-bundle.crt PIP_DISABLE_PIP_VERSION_CHECK=1",
    "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "
    "--no-install-recommends python3-pip python3-setuptools python3-wheel git "
    "&& rm -rf /var/lib/apt/lists/*",
    "{pip}RUN site=$(python3 -c 'import site; print(site.getsitepackages()[0])') "
    '&& mkdir -p "$site/torch-{torch}.dist-info" '
    "&& printf 'Metadata-Version: 2.1\\nName: torch\\nVersion: {torch}\\n' "
    '> "$site/torch-{torch}.dist-info/METADATA" '
    "&& printf 'pip\\n' > \"$site/torch-{torch}.dist-info/INSTALLER\"", ""))


def _context(files: dict[str, bytes]) -> io.BytesIO:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out.seek(0)
    return out


def build(client: Any, files: dict[str, bytes], tag: str) -> tuple[bool, str]:
    """Build a context on the engine: (ok, the build's output)."""
    log = []
    ok = True
    for chunk in client.api.build(fileobj=_context(files), custom_context=True, tag=tag,
                                  rm=True, forcerm=True, decode=True):
        if "stream" in chunk:
            log.append(chunk["stream"])
        if "error" in chunk:
            log.append(chunk["error"])
            ok = False
    return ok, "".join(log)


@pytest.fixture(scope="module")
def standins(docker_client: Any) -> dict[str, str]:
    """The stand-ins of NGC 20.03 and 21.03 (made once per engine; labelled)."""
    if not shutil.which("debootstrap"):
        unavailable("debootstrap is needed for the Ubuntu stand-ins (apt-get install debootstrap)")
    if not CA_BUNDLE.is_file():
        unavailable(f"no CA bundle at {CA_BUNDLE}: the stand-ins reach the index through it")
    made = {}
    for tag, (suite, pip, torch, what) in STANDINS.items():
        ubuntu = f"orchestrate-test/ubuntu-standin:{suite}"
        done = subprocess.run(["bash", str(INFRA / "make-ubuntu-standin.sh"), ubuntu, suite],
                              capture_output=True, text=True, timeout=1200)
        if done.returncode != 0:
            pytest.fail(f"make-ubuntu-standin.sh {suite} failed:\n{done.stderr[-2000:]}")
        with contextlib.suppress(Exception):  # made before: reused
            docker_client.images.get(tag)
            made[tag] = tag
            continue
        files = {"ca-bundle.crt": CA_BUNDLE.read_bytes()}
        upgrade = ""
        if pip:  # the real base's pip, as a wheel the host's pip fetches (Ubuntu 18.04's pip 9
            #      fails on today's index: it is what NGC 20.03 does not ship anyway)
            wheel = _pip_wheel(pip, docker_client)
            files[wheel.name] = wheel.read_bytes()
            upgrade = (f"COPY {wheel.name} /tmp/\nRUN python3 /tmp/{wheel.name}/pip install "
                       f"--no-index /tmp/{wheel.name} && rm /tmp/{wheel.name}\n")
        files["Dockerfile"] = STANDIN_DOCKERFILE.format(ubuntu=ubuntu, what=what, pip=upgrade,
                                                        torch=torch).encode()
        ok, log = build(docker_client, files, tag)
        assert ok, log[-3000:]
        made[tag] = tag
    return made


def _pip_wheel(version: str, _client: Any) -> Path:
    folder = Path.home() / ".cache" / "orchestrate" / "wheels"
    found = sorted(folder.glob(f"pip-{version}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(folder),
                        f"pip=={version}"], check=True, capture_output=True, timeout=300)
        found = sorted(folder.glob(f"pip-{version}-*.whl"))
    return found[0]


def lab_checkout(folder: Path, requirements: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "requirements.txt").write_text(requirements)
    (folder / "main.py").write_text("print('stand-in for the seed program')\n")
    return folder


def test_seed_003s_dllogger_line_is_rewritten_and_labelled(tmp_path: Path) -> None:
    """No engine: the plan of seed 003's image installs from a rewritten copy (git:// ->
    https://), records the rewrite in a label, and leaves the program's own file as it is."""
    program = lab_checkout(tmp_path / "ConvNets", DLE_5CC03CAA_REQUIREMENTS)
    plan = plan_image("program", {"base_tag": "20.03-py3", "program_dir": str(program),
                                  "requirements": "requirements.txt",
                                  "install_dir": "/workspace/rn50"})
    copy = plan.files[templates.REWRITTEN_REQUIREMENTS].decode().splitlines()
    assert copy == ["pytorch-ignite", "git+https://github.com/NVIDIA/dllogger.git@"
                    "26a0f8f1958de2c0c460925ff6102a4d2486d6cc#egg=dllogger"]
    assert plan.files["ConvNets/requirements.txt"].decode() == DLE_5CC03CAA_REQUIREMENTS
    dockerfile = plan.files["Dockerfile"].decode()
    assert ('LABEL org.orchestrate.requirements.rewritten="git+git://github.com/NVIDIA/dllogger'
            '.git@26a0f8f1958de2c0c460925ff6102a4d2486d6cc#egg=dllogger -> git+https://github.com'
            '/NVIDIA/dllogger.git@26a0f8f1958de2c0c460925ff6102a4d2486d6cc#egg=dllogger"'
            ) in dockerfile
    assert "-r /etc/orchestrate/requirements.rewritten.txt" in dockerfile
    # a file with nothing to rewrite is installed as before
    plain = lab_checkout(tmp_path / "plain", "pynvml==11.0.0\n")
    plan = plan_image("program", {"program_dir": str(plain), "requirements": "requirements.txt"})
    assert templates.REWRITTEN_REQUIREMENTS not in plan.files
    assert "requirements.rewritten" not in plan.files["Dockerfile"].decode()


def _seed_plan(program: Path, base: str, **more: Any) -> Any:
    return plan_image("program", {"base_image": base, "program_dir": str(program),
                                  "requirements": "requirements.txt", **more})


@pytest.mark.docker
def test_seed_003s_image_installs_what_resolves_and_fails_only_on_github(
        docker_client: Any, standins: dict[str, str], tmp_path: Path) -> None:
    base = standins["orchestrate-test/seed-standin:ngc-20.03"]
    started = time.monotonic()
    tags = []
    try:
        # 1. the seed's file as rewritten: every line but DLLogger's resolves; DLLogger's
        #    fails on github.com, which this project's machines cannot reach
        full = _seed_plan(lab_checkout(tmp_path / "full", DLE_5CC03CAA_REQUIREMENTS), base,
                          install_dir="/workspace/rn50")
        ok, log = build(docker_client, full.files, "orchestrate-test/seed003-full:latest")
        assert not ok
        assert "git clone" in log and "https://github.com/NVIDIA/dllogger.git" in log, log[-3000:]
        assert "Could not resolve host: github.com" in log, log[-3000:]
        # 2. what this machine can build: the file without the line it cannot reach
        reachable = DLE_5CC03CAA_REQUIREMENTS.splitlines()[0] + "\n"
        part = _seed_plan(lab_checkout(tmp_path / "part", reachable), base,
                          install_dir="/workspace/rn50")
        tags.append("orchestrate-test/seed003-part:latest")
        ok, log = build(docker_client, part.files, tags[-1])
        assert ok, log[-3000:]
        shown = docker_client.containers.run(tags[-1], [  # the stand-in has no torch to import
            "python3", "-m", "pip", "show", "pytorch-ignite"], remove=True).decode()
        version = next(ln.split()[1] for ln in shown.splitlines() if ln.startswith("Version:"))
        print(f"seed 003 image steps on {base}: pytorch-ignite {version} "
              f"({time.monotonic() - started:.0f} s)")
    finally:
        for tag in tags:
            with contextlib.suppress(Exception):  # cleanup
                docker_client.images.remove(tag, force=True)


@pytest.mark.docker
def test_seed_000s_native_image_installs_all_but_nvidias_index(
        docker_client: Any, standins: dict[str, str], tmp_path: Path) -> None:
    """`pip install nvidia-pyindex` then the requirements; nvidia-dllogger==0.1.0 is on no index
    this machine reaches (the host's pip finds none on the package index)."""
    found = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d",
                            str(tmp_path / "dl"), "nvidia-dllogger==0.1.0"],
                           capture_output=True, text=True, timeout=300)
    assert found.returncode != 0
    assert "No matching distribution found for nvidia-dllogger==0.1.0" in found.stderr
    base = standins["orchestrate-test/seed-standin:ngc-21.03"]
    started = time.monotonic()
    reachable = "".join(ln + "\n" for ln in ALEXHANL_REQUIREMENTS.splitlines()
                        if not ln.startswith("nvidia-dllogger"))
    plan = _seed_plan(lab_checkout(tmp_path / "ConvNets", reachable), base,
                      pip_setup=["nvidia-pyindex"], install_dir="/workspace/rn50")
    tag = "orchestrate-test/seed000-part:latest"
    try:
        ok, log = build(docker_client, plan.files, tag)
        assert ok, log[-3000:]
        shown = docker_client.containers.run(tag, ["python3", "-m", "pip", "list"],
                                             remove=True).decode()
        assert "nvidia-pyindex" in shown and "pynvml" in shown and "11.0.0" in shown
        print(f"seed 000 image steps on {base}: ({time.monotonic() - started:.0f} s)")
    finally:
        with contextlib.suppress(Exception):  # cleanup
            docker_client.images.remove(tag, force=True)
