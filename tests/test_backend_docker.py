"""The Docker backend: container options as built, and sweeps on a real Docker engine.

There is no NVIDIA runtime on these machines, so GPU device requests are checked as built
(``container_kwargs``) and the containers themselves run on the CPU. The images are built on a
local stand-in for the NGC base image (tests/infra/make-base-image.sh).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from docker_support import run_containers
from service_support import communicate_or_dump
from standin_support import Standin, container_mount
from workload_support import TINY_WORKLOAD

from orchestrator.backends.base import RunOptions
from orchestrator.backends.docker import DockerBackend
from orchestrator.errors import BackendUnavailable
from orchestrator.local.engine import LABEL_CELL, LABEL_CONTROLLER, LABEL_RUN
from orchestrator.plan.matrix import load_matrix
from orchestrator.plan.placement import Allocation
from orchestrator.results.folders.run_folder import RunPaths, Status
from orchestrator.runtimes.docker import CONTAINER_OUT, container_kwargs
from orchestrator.sweep import run_sweep

ROOT = Path(__file__).resolve().parents[1]

GPU_MATRIX = """
[matrix]
backend = "docker"
[workload]
hardware = "v100"
gpus = 2
precision = "amp"
[hardware.v100]
device = "cuda"
image = "ngc-pytorch"
container = { shm_size = "16g", mounts = [{ source = "/data/imagenet", target = "/imagenet" }] }
[hardware.v100-bf]
device = "cuda"
image = "bitfusion"
wrapper = "bitfusion"
bitfusion = { partial = 0.5, servers = ["10.0.0.1:56001"] }
[hardware.gaudi]
device = "hpu"
image = "habana"
container = { runtime = "habana", cap_add = ["SYS_NICE"], network = "host", privileged = true }
"""


def backend_for(path: Path, tmp_path: Path) -> DockerBackend:
    matrix = load_matrix(path)
    paths = RunPaths.create(tmp_path / "results", matrix.name)
    backend = DockerBackend(matrix, paths, RunOptions(timeout_s=60))
    backend.image_tags = {hw: f"orchestrate/test:{hw}" for hw in matrix.profiles}
    return backend


def test_gpu_container_as_built(write_matrix, tmp_path):
    backend = backend_for(write_matrix(GPU_MATRIX), tmp_path)
    (cell,) = backend.matrix.cells
    spec = backend.spec(cell, Allocation.local(cell.id, (2, 5)))
    kw = container_kwargs(spec)

    (req,) = kw["device_requests"]
    assert req["Driver"] == "nvidia" and req["DeviceIDs"] == ["2", "5"]
    assert req["Capabilities"] == [["gpu"]]
    assert "CUDA_VISIBLE_DEVICES" not in kw["environment"]  # the device request selects GPUs
    assert kw["ipc_mode"] == "host" and kw["shm_size"] == 16 * 2**30
    assert {(u["Name"], u["Soft"], u["Hard"]) for u in kw["ulimits"]} == {
        ("memlock", -1, -1), ("stack", 67108864, 67108864)}
    assert kw["privileged"] is False
    mounts = {m["Target"]: m for m in kw["mounts"]}
    assert mounts["/imagenet"]["Source"] == "/data/imagenet" and mounts["/imagenet"]["ReadOnly"]
    assert mounts[CONTAINER_OUT]["Source"] == str(backend.paths.cell_dir(cell.id).resolve())
    assert not mounts[CONTAINER_OUT]["ReadOnly"]
    assert kw["labels"][LABEL_CELL] == cell.id and kw["labels"][LABEL_RUN] == backend.paths.run_id
    assert kw["image"] == "orchestrate/test:v100"
    # two GPUs: torchrun inside the container, the workload's flags as a list (no shell)
    assert kw["command"][:5] == ["python3", "-m", "torch.distributed.run", "--standalone",
                                 "--nproc_per_node=2"]
    assert kw["command"][kw["command"].index("--precision") + 1] == "amp"
    assert kw["command"][kw["command"].index("--output-dir") + 1] == CONTAINER_OUT


def test_bitfusion_and_gaudi_containers_as_built(write_matrix, tmp_path):
    text = GPU_MATRIX.replace('hardware = "v100"\n', "")
    text += '[axes]\nhardware = ["v100-bf", "gaudi"]\n'
    backend = backend_for(write_matrix(text), tmp_path)
    bf, gaudi = backend.matrix.cells
    kw = container_kwargs(backend.spec(bf, Allocation.local(bf.id)))
    assert kw["command"][:9] == ["bitfusion", "run", "-n", "2", "-p", "0.5", "-l",
                                 "10.0.0.1:56001", "--"]
    assert kw["command"][9:11] == ["python3", "-m"]
    assert "device_requests" not in kw  # Bitfusion's GPUs are remote
    kw = container_kwargs(backend.spec(gaudi, Allocation.local(gaudi.id, (0, 1))))
    assert kw["runtime"] == "habana" and kw["cap_add"] == ["SYS_NICE"]
    assert kw["network_mode"] == "host" and kw["privileged"] is True
    assert kw["environment"]["HABANA_VISIBLE_DEVICES"] == "0,1"
    assert kw["command"][kw["command"].index("--device") + 1] == "hpu"


def test_no_engine_gives_one_clear_message(monkeypatch, tmp_path, orchestrate_cli):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    with pytest.raises(BackendUnavailable, match="no Docker engine reachable.*--backend process"):
        DockerBackend.check_available()
    proc = orchestrate_cli("matrix", "matrices/docker_smoke.toml", "--results", str(tmp_path),
                           timeout=60, env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    # what this machine lacks (exit 3), refused before a run folder exists
    assert proc.returncode == 3 and "Traceback" not in proc.stderr
    assert "no Docker engine reachable" in proc.stderr and "--backend process" in proc.stderr
    assert not any(tmp_path.rglob("run.json"))


# --- real engine --------------------------------------------------------------------------------


def test_the_probe_asks_the_engine_what_the_sdk_would(docker_client, base_image, monkeypatch):
    """The one decision asks the local engine over its socket without the SDK
    (``engine_probe``): it answers as docker-py's client does for an image the engine has, one
    it lacks and one whose name needs quoting; an engine over TCP is asked through the SDK."""
    import docker

    from orchestrator.local.engine import engine_probe

    host = str(docker_client.api.base_url)
    if not host.startswith("http+docker://localhost"):
        pytest.skip(f"this engine is not on a local socket ({host})")
    refs = [base_image, "orchestrate-test/no-such-image:1",
            "localhost:5000/a/b:c@sha256:" + "0" * 64]

    def sdk_has(ref: str) -> bool:
        try:
            docker_client.api.inspect_image(ref)
        except (docker.errors.ImageNotFound, docker.errors.NotFound):
            return False
        return True
    probe = engine_probe()
    try:
        assert type(probe).__name__ == "_SocketProbe"
        assert [probe.image_exists(r) for r in refs] == [sdk_has(r) for r in refs] == [
            True, False, False]
    finally:
        probe.close()
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:9")  # nothing listens: the SDK says so
    with pytest.raises(BackendUnavailable, match="no Docker engine reachable"):
        engine_probe()

CONTAINER_MATRIX = """
[matrix]
name = "dsmoke"
backend = "docker"
timeout_s = 240
[workload]
hardware = "box"
{tiny}
[hardware.box]
device = "cpu"
image = "ngc-pytorch"
image_vars = {{ base_image = "{base}", install_nvml = false }}
container = {{ shm_size = "256m", ulimits = {{ stack = 67108864 }} {extra} }}
"""


def container_matrix(base: str, extra: str = "", standin: Standin | None = None,
                     knobs: str = "") -> str:
    """The tiny CPU matrix in containers built on ``base``; ``extra``: more container options.
    With ``standin``, the cells run the STAND-IN workload (mounted into the container; its
    ``knobs``)."""
    if standin is None:
        return CONTAINER_MATRIX.format(tiny=TINY_WORKLOAD, base=base, extra=extra)
    text = CONTAINER_MATRIX.format(tiny=standin.workload, base=base,
                                   extra=f"{extra}, mounts = [{container_mount()}]")
    return text + standin.command(knobs, container=True)


@pytest.mark.docker
def test_sweep_in_containers_builds_once_and_cleans_up(docker_client, base_image, write_matrix,
                                                       tmp_path):
    path = write_matrix(container_matrix(base_image, extra="") + """
        [axes]
        precision = ["fp32", "bf16"]
        [[include]]
        data = "/no/such_dataset"
    """, cpu_profile=False)
    logs: list[str] = []

    class Events:
        def __getattr__(self, name):
            return lambda *a, **k: None

        def log(self, message: str) -> None:
            logs.append(message)

    outcome = run_sweep(load_matrix(path), results_root=tmp_path, events=Events())
    statuses = {r.cell_id: r.status for r in outcome.results}
    assert sorted(s.value for s in statuses.values()) == ["failed", "ok", "ok"]
    ok = [r for r in outcome.results if r.status is Status.OK]
    for r in ok:
        assert r.metrics["train.total_ips"] > 0
        assert r.provenance["backend"] == "docker"
        assert r.provenance["image"].startswith("orchestrate/ngc-pytorch:")
        assert len(r.machine["start"]["loadavg"]) == 3 and "end" in r.machine  # this machine
        assert r.env["torch_version"].startswith("2.14.1")
        # the workload wrote its files through the mounted cell folder
        assert (outcome.paths.cell_dir(r.cell_id) / "iterations.csv").is_file()
    (bad,) = [r for r in outcome.results if r.status is not Status.OK]
    assert "/no/such_dataset" in bad.reason
    assert run_containers(docker_client, outcome.paths.run_id) == []
    assert len([m for m in logs if m.startswith("image ")]) == 1  # one image for three cells

    # second run: the image is reused, not rebuilt
    logs.clear()
    again = run_sweep(load_matrix(path).with_cells(
        [c for c in load_matrix(path).cells if c.params.arch == "resnet18"][:1]),
        results_root=tmp_path, events=Events())
    assert [r.status for r in again.results] == [Status.OK]
    assert any("up to date" in m for m in logs) and not any("built in" in m for m in logs)


@pytest.mark.docker
def test_oom_and_timeout_become_failed_cells(docker_client, base_image, write_matrix, tmp_path,
                                             standin):
    """The STAND-IN workload in the container: touching 200 MiB under a 48 MiB limit, then
    hanging past the timeout."""
    oom = write_matrix(container_matrix(base_image, extra=', mem_limit = "48m"',
                                        standin=standin, knobs="--standin-allocate-mb=200"),
                       name="oom.toml", cpu_profile=False)
    outcome = run_sweep(load_matrix(oom), results_root=tmp_path)
    (res,) = outcome.results
    assert res.status is Status.OOM, res.reason
    assert "out-of-memory" in res.reason and "48 MiB" in res.reason
    assert run_containers(docker_client, outcome.paths.run_id) == []

    slow = write_matrix(
        container_matrix(base_image, standin=standin).replace("timeout_s = 240", "timeout_s = 8")
        .replace("iterations = 2", "iterations = 1000000"),
        name="slow.toml", cpu_profile=False)
    outcome = run_sweep(load_matrix(slow), results_root=tmp_path)
    (res,) = outcome.results
    assert res.status is Status.TIMEOUT and "timed out after 8 s" in res.reason
    assert run_containers(docker_client, outcome.paths.run_id) == []


@pytest.mark.docker
def test_interrupt_removes_containers(docker_client, base_image, write_matrix, tmp_path, standin):
    path = write_matrix(
        container_matrix(base_image, standin=standin).replace("iterations = 2",
                                                              "iterations = 1000000")
        + '[axes]\nseed = [1, 2]\n', cpu_profile=False)
    results = tmp_path / "results"
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "matrix", str(path), "--results", str(results)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 120
    running = []
    while time.monotonic() < deadline and not running:  # this sweep's, not another test's
        running = [c for c in docker_client.containers.list(
            filters={"label": "io.orchestrate.matrix=dsmoke"})
            if f":{proc.pid}:" in c.labels.get(LABEL_CONTROLLER, "")]
        time.sleep(0.3)
    assert running, "no container started"
    run_id = running[0].labels[LABEL_RUN]
    proc.send_signal(signal.SIGINT)
    _, err = communicate_or_dump(proc, 120)
    assert proc.returncode == 130, err
    assert run_containers(docker_client, run_id) == []
    (run_dir,) = results.glob("dsmoke/*")
    statuses = [json.loads(p.read_text())["status"] for p in run_dir.glob("cells/*/result.json")]
    assert sorted(statuses) == ["cancelled", "cancelled"]


@pytest.mark.docker
def test_clean_removes_leftovers_of_a_crashed_run(docker_client, base_image, orchestrate_cli):
    leftover = docker_client.containers.run(
        base_image, ["sleep", "300"], detach=True,
        labels={LABEL_RUN: "crashed-run", "io.orchestrate.matrix": "x", LABEL_CELL: "c"},
    )
    try:
        proc = orchestrate_cli("clean", "--run", "crashed-run", timeout=60)
        assert proc.returncode == 0 and "removed 1 container" in proc.stdout
        assert run_containers(docker_client, "crashed-run") == []
    finally:
        subprocess.run(["docker", "rm", "-f", leftover.id], capture_output=True)


def test_dry_run_shows_images_and_resolves_files_next_to_the_matrix(write_matrix, tmp_path,
                                                                    capsys, gpu_machine):
    from orchestrator.cli import main

    gpu_machine("H100")  # the native profile's cells get this machine's GPU (a stand-in)

    path = write_matrix("""
        [matrix]
        backend = "docker"
        [axes]
        hardware = ["v100", "v100-bf"]
        [hardware.v100]
        device = "cuda"
        image = "ngc-pytorch"
        [hardware.v100-bf]
        device = "cuda"
        image = "bitfusion"
        wrapper = "bitfusion"
        image_vars = { client_deb = "bf/client.deb", ca_cert = "bf/ca.crt" }
    """)
    assert main(["matrix", str(path), "--dry-run", "--results", str(tmp_path / "r")]) == 3
    out = capsys.readouterr().out  # the plan, then what this machine lacks
    assert "image for v100-bf: not planned here" in out
    assert f"{path}: hardware.v100-bf.image_vars.client_deb: file " in out
    assert str(tmp_path / "bf" / "client.deb") in out

    (tmp_path / "bf").mkdir()
    (tmp_path / "bf" / "client.deb").write_bytes(b"deb")
    (tmp_path / "bf" / "ca.crt").write_text("cert")
    assert main(["matrix", str(path), "--dry-run", "--results", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "image for v100: orchestrate/ngc-pytorch:" in out
    assert "image for v100-bf: orchestrate/bitfusion:" in out
    assert not (tmp_path / "r").exists()
