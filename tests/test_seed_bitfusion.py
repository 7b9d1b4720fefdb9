"""Seed 000's Bitfusion image, built for real on the local engine, and its client's secrets.

Stand-ins, because the real things cannot be had here (each labelled as such):

* the base: NGC PyTorch 21.03 is Ubuntu 20.04; no registry here, so an Ubuntu 20.04 (focal)
  minbase made by ``tests/infra/make-ubuntu-standin.sh`` stands in for it (image label
  ``org.orchestrate.stand-in``);
* the client: VMware's .deb is proprietary; a stand-in package named as the real one
  (``bitfusion-client-ubuntu2004``, "STAND-IN" in its description) provides ``/usr/bin/bitfusion``,
  which runs the command after ``--`` locally, and creates the ``bitfusion`` group as the real
  client does;
* the configuration: a client.yaml holding a made-up token, servers.conf, a CA certificate.

What is checked: ``validate`` passes the 20.04 client on the 20.04 base and refuses it on a 22.04
one, naming the bases to use; ``orchestrate images build program-bitfusion`` builds the program
image and the Bitfusion image on top of it (the client installed with apt, the token at
/root/.bitfusion/client.yaml mode 400, root in the bitfusion group); the build itself refuses a
client of another Ubuntu; a sweep whose cell runs through ``bitfusion run`` in that image, with
``--privileged --pid=host``, writes no byte of the token to any file of its results or to its
output.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from service_support import unavailable

ROOT = Path(__file__).resolve().parents[1]
INFRA = ROOT / "tests" / "infra"
STANDIN = os.environ.get("ORCHESTRATE_TEST_UBUNTU_FOCAL", "orchestrate-test/ubuntu-standin:focal")


@pytest.fixture(scope="session")
def focal_base(docker_client: Any) -> str:
    """The Ubuntu 20.04 stand-in for NGC 21.03's base (made once)."""
    if not shutil.which("debootstrap"):
        unavailable("debootstrap is needed for the Ubuntu stand-in (apt-get install debootstrap)")
    done = subprocess.run(["bash", str(INFRA / "make-ubuntu-standin.sh"), STANDIN, "focal"],
                          capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        pytest.fail(f"make-ubuntu-standin.sh failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return STANDIN


def standin_client(folder: Path, ubuntu: str) -> Path:
    """A stand-in Bitfusion client .deb for ``ubuntu`` (e.g. ``2004``), named as VMware names
    theirs."""
    if not shutil.which("dpkg-deb"):
        unavailable("dpkg-deb not found")
    pkg = folder / f"pkg{ubuntu}"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "usr" / "bin").mkdir(parents=True)
    (pkg / "DEBIAN" / "control").write_text(textwrap.dedent(f"""\
        Package: bitfusion-client-ubuntu{ubuntu}
        Version: 0.0.1-standin
        Architecture: all
        Maintainer: orchestrate tests <tests@localhost>
        Description: STAND-IN for VMware's Bitfusion client (tests only)
         Provides /usr/bin/bitfusion, which runs the command after -- locally.
        """))
    postinst = pkg / "DEBIAN" / "postinst"
    postinst.write_text("#!/bin/sh\nset -e\ngroupadd -f bitfusion\n")
    postinst.chmod(0o755)
    script = pkg / "usr" / "bin" / "bitfusion"
    script.write_text("#!/bin/sh\n# STAND-IN: run the command after --\n"
                      'while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done\n'
                      '[ "$#" -gt 0 ] && shift\nexec "$@"\n')
    script.chmod(0o755)
    deb = folder / f"bitfusion-client-ubuntu{ubuntu}_0.0.1-standin_amd64.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(pkg), str(deb)],
                   check=True, capture_output=True)
    return deb


def lab(tmp_path: Path, token: str) -> Path:
    """The lab's files beside a matrix: the program, the client (20.04 and 22.04), its
    configuration."""
    folder = tmp_path / "lab"
    program = folder / "ConvNets"
    program.mkdir(parents=True)
    (program / "main.py").write_text(
        "import sys\nprint('args', ' '.join(sys.argv[1:]))\n"
        "print('DLL 2021-03-18 12:00:00.000000 - Summary: train.compute_ips : 800.49 img/s')\n")
    standin_client(folder, "2004")
    standin_client(folder, "2204")
    (folder / "client.yaml").write_text(f"token: {token}\nversion: stand-in\n")
    (folder / "servers.conf").write_text("servers:\n- addresses: [10.0.0.7:56001]\n")
    (folder / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\nc3RhbmQtaW4=\n"
                                   "-----END CERTIFICATE-----\n")
    return folder


MATRIX = """
[matrix]
name = "bitfusion_standin"
backend = "docker"
timeout_s = 600

[workload]
hardware = "bf"
program = "main"
gpus = 1
warmup = 0

[hardware.bf]
device = "cuda"
image = "program-bitfusion"
wrapper = "bitfusion"
bitfusion = {{ partial = 1.0 }}

[hardware.bf.image_vars]
base_image = "{base}"
base_ubuntu = "{ubuntu}"
program_dir = "lab/ConvNets"
install_dir = "/workspace/rn50"
client_deb = "lab/bitfusion-client-ubuntu{client}_0.0.1-standin_amd64.deb"
client_config = "lab/client.yaml"
servers_conf = "lab/servers.conf"
ca_cert = "lab/ca.crt"

[hardware.bf.container]
ipc = "host"
privileged = {privileged}
pid = "host"
ulimits = {{}}

[commands.main]
command = "python3 ./main.py --arch {{arch}}"
launcher = "self"
workdir = "/workspace/rn50"
[commands.main.figures]
parser = "regex"
regex = [{{ name = "train.total_ips", pattern = 'compute_ips : (?P<value>[0-9.]+)' }}]
"""


def orchestrate(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.subprocess  # dpkg-deb builds the client packages
def test_validate_refuses_a_client_for_another_ubuntu_and_names_the_base(tmp_path: Path) -> None:
    """No engine needed: the .deb's package name against the base's Ubuntu (a file problem,
    exit 2, whatever the machine has)."""
    lab(tmp_path, "t")
    path = tmp_path / "m.toml"
    path.write_text(MATRIX.format(base="lab/standin:focal", ubuntu="22.04", client="2004",
                                  privileged="true"))
    done = orchestrate("validate", str(path), cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert ("hardware.bf.image_vars.client_deb: the Bitfusion client "
            "bitfusion-client-ubuntu2004_0.0.1-standin_amd64.deb is built for Ubuntu 20.04 "
            "(its package 'bitfusion-client-ubuntu2004')") in done.stderr
    assert 'base_tag = "22.06-py3" (NGC releases of Ubuntu 20.04: 21.03, 22.06)' in done.stderr
    path.write_text(MATRIX.format(base="lab/standin:focal", ubuntu="20.04", client="2004",
                                  privileged="true"))
    done = orchestrate("validate", str(path), cwd=tmp_path)
    # The client now matches the base; what is left is the machine's: the base image is not on
    # this engine (or there is no engine), a requirement of the target (exit 3), as the sweep
    # would refuse it.
    assert done.returncode == 3, done.stdout + done.stderr
    assert "client_deb" not in done.stderr
    assert "hardware.bf.image_vars.base_image: base image lab/standin:focal" in done.stderr or (
        "engine" in done.stderr.lower()), done.stderr


@pytest.mark.docker
def test_the_bitfusion_image_builds_and_its_token_stays_out_of_results(
        docker_client: Any, focal_base: str, tmp_path: Path) -> None:
    token = f"bf-token-{secrets.token_hex(12)}"
    folder = lab(tmp_path, token)
    built: list[str] = []
    try:
        # 1. `images build` of the template on the local engine (the parent program image too)
        done = orchestrate(
            "images", "build", "program-bitfusion", "--set", f"base_image={focal_base}",
            "--set", "base_ubuntu=20.04", "--set", f"program_dir={folder / 'ConvNets'}",
            "--set", "install_dir=/workspace/rn50", "--set",
            f"client_deb={folder / 'bitfusion-client-ubuntu2004_0.0.1-standin_amd64.deb'}",
            "--set", f"client_config={folder / 'client.yaml'}",
            "--set", f"servers_conf={folder / 'servers.conf'}",
            "--set", f"ca_cert={folder / 'ca.crt'}", "--set", "timezone=Asia/Shanghai",
            cwd=tmp_path, timeout=1200)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        tags = [w for w in done.stdout.split() if w.startswith("orchestrate/program")]
        assert any(t.startswith("orchestrate/program-bitfusion:") for t in tags), done.stdout
        built += tags
        image = next(t for t in tags if t.startswith("orchestrate/program-bitfusion:"))
        check = docker_client.containers.run(image, ["sh", "-c", (
            "stat -c '%a %U' /root/.bitfusion/client.yaml && id -nG root && command -v bitfusion "
            "&& test -f /etc/bitfusion/servers.conf && test -f /etc/bitfusion/tls/ca.crt && "
            "readlink /etc/localtime && pwd")], remove=True).decode()
        assert check.split("\n")[:3] == ["400 root", "root bitfusion", "/usr/bin/bitfusion"]
        assert check.rstrip().endswith("/workspace/rn50") and "Asia/Shanghai" in check
        labels = docker_client.images.get(focal_base).labels or {}
        assert "stand-in" in labels.get("org.orchestrate.stand-in", "")
        assert token not in done.stdout + done.stderr  # the build's own output

        # 2. the build refuses a client of another Ubuntu, inside the base
        wrong = orchestrate(
            "images", "build", "program-bitfusion", "--set", f"base_image={focal_base}",
            "--set", f"program_dir={folder / 'ConvNets'}", "--set",
            f"client_deb={folder / 'bitfusion-client-ubuntu2204_0.0.1-standin_amd64.deb'}",
            "--set", f"ca_cert={folder / 'ca.crt'}", cwd=tmp_path, timeout=1200)
        assert wrong.returncode != 0
        assert ("is built for Ubuntu 22.04; this base is Ubuntu 20.04" in
                wrong.stdout + wrong.stderr), wrong.stdout[-2000:] + wrong.stderr[-2000:]
        built += [w for w in wrong.stdout.split() if w.startswith("orchestrate/program:")]

        # 3. a sweep through `bitfusion run` with --pid=host: no byte of the token in its
        #    results or its output. --privileged cannot run here (this VM's engine refuses to
        #    apply capabilities: "unable to apply caps"); the request itself is checked as built
        #    by test_the_seed_000_containers_ask_what_the_seed_asks.
        path = tmp_path / "m.toml"
        path.write_text(MATRIX.format(base=focal_base, ubuntu="20.04", client="2004",
                                      privileged="false"))
        results = tmp_path / "results"
        run = orchestrate("matrix", str(path), "--results", str(results), "-q", cwd=tmp_path,
                          timeout=1200)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        cell = next(results.glob("bitfusion_standin/*/cells/*"))
        log = (cell / "log.txt").read_text()
        assert "args --arch resnet50" in log
        command = json.loads((cell / "command.json").read_text())
        assert command["argv"][:7] == ["bitfusion", "run", "-n", "1", "-p", "1", "--"]
        assert command["container"]["pid"] == "host"
        leaked = [p for p in results.rglob("*") if p.is_file() and token.encode() in
                  p.read_bytes()]
        assert leaked == [] and token not in run.stdout + run.stderr
    finally:
        for tag in reversed(built):
            with contextlib.suppress(Exception):  # cleanup: an image already gone is fine
                docker_client.images.remove(tag, force=True)


def test_the_seed_000_containers_ask_what_the_seed_asks() -> None:
    """docker run ... --ipc=host --privileged --pid=host (Bitfusion) and --ipc=host (native),
    the seed's mounts, and no local GPU request on the Bitfusion side (its GPUs are remote)."""
    pytest.importorskip("docker")
    from orchestrator.plan.matrix import load_matrix
    from orchestrator.runtimes.docker import container_kwargs, container_spec

    matrix = load_matrix(ROOT / "matrices" / "seeds" / "000_bitfusion_dle.toml")
    by_hw = {}
    for cell in matrix.cells:
        spec = container_spec(cell, matrix.profile(cell), matrix.program(cell), image="x:1",
                              output_dir="/tmp/out", labels={}, gpu_ids=(1,))
        by_hw[cell.hardware] = container_kwargs(spec)
    bf, native = by_hw["v100-bitfusion"], by_hw["v100"]
    assert (bf["privileged"], bf["pid_mode"], bf["ipc_mode"]) == (True, "host", "host")
    assert "device_requests" not in bf
    assert (native["privileged"], native.get("pid_mode"), native["ipc_mode"]) == (
        False, None, "host")
    assert [d["DeviceIDs"] for d in native["device_requests"]] == [["1"]]
    for kwargs in (bf, native):
        assert {(m["Target"], m["Source"]) for m in kwargs["mounts"]} >= {
            ("/root/.cache/torch/hub/checkpoints", "/data/pretrained"),
            ("/imagenet", "/data/imagenette2-160")}
        assert kwargs["ulimits"] == []
