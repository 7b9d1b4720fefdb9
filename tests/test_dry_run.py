"""``matrix --dry-run`` shows each cell's exact launch on every backend, and ``plan --json``
carries the same (orchestrator/backends/dry_run.py); a dry run connects to nothing and leaves no
temporary folder.

The commands come from the backends' own ``spec`` (the code a sweep launches with), so these
tests check what the dry run shows against what a launch would use, per backend: the process
backend's argv and environment, the docker container's image, devices, mounts and wrappers
(``bitfusion run``, ``ncu``), the ssh host and its container, the Slurm batch script, an
Apptainer ``exec``. The GPUs are stand-ins (this machine has none: tests/gpu_support.py).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.backends.dry_run import launches
from orchestrator.cli import main
from orchestrator.plan.matrix import load_matrix

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Any, ...]]]:
    """Every IP connection this process tries is refused and recorded (a local engine's unix
    socket is not a network connection and is let through)."""
    tried: list[tuple[Any, ...]] = []
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def guard(sock: socket.socket, address: Any, real: Any) -> Any:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            tried.append((sock.family.name, address))
            raise OSError("a dry run must not connect anywhere")
        return real(sock, address)

    monkeypatch.setattr(socket.socket, "connect", lambda s, a: guard(s, a, real_connect))
    monkeypatch.setattr(socket.socket, "connect_ex", lambda s, a: guard(s, a, real_connect_ex))
    yield tried


@pytest.fixture
def own_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary folder of this test's own (TMPDIR and tempfile's cache): what a dry run
    leaves in it is seen, whatever else the machine does in /tmp."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", None)
    yield folder


def dry_run(path: Path, results: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = main(["matrix", str(path), "--dry-run", "--results", str(results), *args])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert not results.exists()  # nothing written where the run would go
    return captured.out


def plan_json(path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    """``plan --json``, its cell folders under ``results`` beside the matrix (as the dry runs
    here)."""
    results = ["--results", str(path.parent / "results")]
    assert main(["plan", str(path), "--json", *results, *args]) == 0
    return json.loads(capsys.readouterr().out)


DOCKER = """
[matrix]
name = "dry"
backend = "docker"
[workload]
hardware = "v100"
gpus = 2
precision = "amp"
[axes]
hardware = ["v100", "bf", "ncu"]
[hardware.v100]
device = "cuda"
image = "ngc-pytorch"
image_vars = { base_tag = "23.10-py3" }
env = { HF_TOKEN = "hf_abcdefghijklmnop", DATA = "/data" }
container = { shm_size = "16g", mounts = [{ source = "/data/imagenet", target = "/imagenet" }] }
[hardware.bf]
device = "cuda"
image = "bitfusion"
wrapper = "bitfusion"
image_vars = { base_tag = "23.10-py3", client_deb = "c.deb", ca_cert = "ca.crt" }
bitfusion = { partial = 0.5, servers = ["10.0.0.1:56001"] }
[hardware.ncu]
device = "cuda"
image = "ngc-pytorch"
image_vars = { base_tag = "23.10-py3" }
[[exclude]]
hardware = "ncu"
[[include]]
hardware = "ncu"
gpus = 1
profiler = "ncu"
"""


@pytest.mark.docker
def test_docker_cells_show_their_container(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           gpu_machine, no_network, own_tmp) -> None:  # type: ignore[no-untyped-def]
    gpu_machine("V100", count=2)
    path = tmp_path / "m.toml"
    data = tmp_path / "imagenet"  # a bind source must exist (Docker refuses a missing one)
    data.mkdir()
    path.write_text(DOCKER.replace('"/data/imagenet"', f'"{data}"'))
    (tmp_path / "c.deb").write_bytes(b"!<arch>\n")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    out = dry_run(path, tmp_path / "results", capsys)
    launch = {c["id"]: c for c in plan_json(path, capsys)}
    native = launch["v100-g2-bs64-amp-profiler-none-r1"]["launch"]
    run = native["docker_run"]
    assert run["image"].startswith("orchestrate/ngc-pytorch:")
    assert run["device_requests"][0]["DeviceIDs"] == ["0", "1"]
    assert {"Target": "/imagenet", "Source": str(data), "Type": "bind",
            "ReadOnly": True} in run["mounts"]  # read_only is the mount default
    assert run["shm_size"] == 16 * 2**30
    assert run["environment"]["HF_TOKEN"] == "***"  # a secret is never shown
    assert "hf_abcdefghijklmnop" not in out and "hf_abcdefghijklmnop" not in json.dumps(launch)
    assert native["argv"][:4] == ["python3", "-m", "torch.distributed.run", "--standalone"]
    bitfusion = launch["bf-g2-bs64-amp-profiler-none-r1"]["launch"]
    assert bitfusion["argv"][:2] == ["bitfusion", "run"]
    assert "device_requests" not in bitfusion["docker_run"]  # its GPUs are the servers'
    ncu = launch["ncu-g1-bs64-amp-profiler-ncu-r1"]["launch"]
    assert ncu["argv"][:3] == ["python3", "-m", "workload.profile_run"]  # ... -- ncu ...
    assert ncu["argv"][ncu["argv"].index("--") + 1] == "ncu"
    for cell in launch.values():  # the text shows the same commands
        assert cell["launch"]["shell"] in out
    assert f"container of image {run['image']}:" in out and "device_requests:" in out
    assert no_network == [] and list(own_tmp.iterdir()) == []


def test_process_cells_show_argv_and_environment(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str],
                                                 gpu_machine, no_network, own_tmp,  # type: ignore[no-untyped-def]
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    gpu_machine("H100", count=2)
    monkeypatch.setenv("LAB_TOKEN", "lab-secret-0123456789")
    path = tmp_path / "m.toml"
    path.write_text('[matrix]\nname = "dry"\n[workload]\nhardware = "h100"\n[axes]\n'
                    'gpus = [1, 2]\n[hardware.h100]\ndevice = "cuda"\n'
                    'env = { TOKEN = "$env:LAB_TOKEN", NCCL_DEBUG = "WARN" }\n')
    out = dry_run(path, tmp_path / "results", capsys)
    cells = plan_json(path, capsys)
    one, two = (c["launch"] for c in cells)
    assert one["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert two["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert one["env"]["TOKEN"] == "$env:LAB_TOKEN"  # the reference, never its value
    assert one["env"]["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT)
    assert one["workdir"] == str(ROOT) and "-m" in one["argv"] and "workload" in one["argv"]
    assert two["argv"][1:4] == ["-m", "torch.distributed.run", "--standalone"]
    for launch in (one, two):
        assert launch["shell"] in out
        assert launch["output_dir"].endswith(f"/dry/<run id>/cells/{launch['cell_id']}")
    assert "TOKEN='$env:LAB_TOKEN'" in out and "lab-secret-0123456789" not in out
    assert no_network == [] and list(own_tmp.iterdir()) == []


def test_ssh_cells_show_their_host_and_container(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str],
                                                 no_network, own_tmp) -> None:  # type: ignore[no-untyped-def]
    """Hosts at addresses nothing answers: a connection attempt would be recorded."""
    (tmp_path / "h.toml").write_text(
        '[[hosts]]\nname = "gpu1"\naddress = "10.255.0.1"\nuser = "lab"\ntags = ["v100"]\n'
        '[[hosts]]\nname = "gpu2"\naddress = "10.255.0.2"\nport = 2222\nuser = "lab"\n'
        'tags = ["v100"]\n')
    path = tmp_path / "m.toml"
    path.write_text((ROOT / "matrices" / "v100_scaling.toml").read_text())
    out = dry_run(path, tmp_path / "results", capsys, "--backend", "ssh", "--hosts",
                  str(tmp_path / "h.toml"), "--only", "gpus=4", "--only", "precision=amp")
    assert "on host gpu1 (lab@10.255.0.1:22, the first host that may run it)" in out
    assert "hosts: " in out and "(2 hosts; not contacted by a dry run)" in out
    cells = plan_json(path, capsys, "--backend", "ssh", "--hosts", str(tmp_path / "h.toml"))
    launch = cells[0]["launch"]
    assert launch["ssh"] == {"host": "gpu1", "hostname": "10.255.0.1", "port": 22, "user": "lab"}
    assert launch["docker_run"]["image"].startswith("orchestrate/ngc-pytorch:")
    assert launch["output_dir"].startswith("/tmp/orchestrate/<run id>/")
    assert no_network == [] and list(own_tmp.iterdir()) == []


@pytest.mark.slurm
def test_slurm_cells_show_their_batch_script(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str],
                                             no_network, own_tmp) -> None:  # type: ignore[no-untyped-def]
    """The script a cell is submitted with, in full; the Apptainer cells' ``apptainer exec``
    in theirs. Nothing is written (the scripts used to go to a fresh temporary folder)."""
    path = tmp_path / "m.toml"
    path.write_text((ROOT / "matrices" / "slurm_smoke.toml").read_text()
                    + '\n[hardware.box]\ndevice = "cpu"\nruntime = "apptainer"\n'
                      '[hardware.box.apptainer]\nbinary = "/bin/true"\nsif = "/etc/hostname"\n'
                      '[[include]]\nhardware = "box"\narch = "resnet18"\nbatch_size = 4\n')
    out = dry_run(path, tmp_path / "results", capsys)
    matrix = load_matrix(path)
    found = launches(matrix, "slurm", matrix.cells, tmp_path / "results")
    for launch in found:
        assert launch["script"].startswith("#!/bin/bash\n")
        assert f"#SBATCH --job-name=orchestrate-{launch['cell_id']}" in launch["script"]
        for line in launch["script"].splitlines():
            assert line in out
    box = next(launch for launch in found if launch["cell_id"].startswith("box"))
    assert box["argv"][:3] == ["srun", "/bin/true", "exec"] and "/etc/hostname" in box["argv"]
    assert "slurm submissions" in out
    assert no_network == [] and list(own_tmp.iterdir()) == []
