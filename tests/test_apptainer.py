"""Apptainer / SingularityCE: the argv every path builds, the batch script, the .sif cache, the
checks, and real sweeps through the process, ssh and slurm backends.

A STAND-IN RUNTIME: Apptainer and SingularityCE are not packaged for Debian 12 and not on the
package index, and this machine reaches no other source, so no real runtime runs here or in CI.
``tests/standin/apptainer`` takes its place on PATH: it parses the options orchestrate passes,
refuses what apptainer refuses (an unknown option, a missing image, a bind source that does not
exist, an ``--env`` value apptainer would change), records each call, and then runs the command
WITHOUT a container, with the environment a ``--cleanenv`` container would get (its
``APPTAINERENV_*`` and ``--env`` variables; the "image's" PATH from
``ORCHESTRATE_STANDIN_PATH``). Its ``build`` writes a small JSON file naming its inputs. What a
real container adds (the image's filesystem, ``--nv``'s driver libraries, a bind whose target
differs from its source) is NOT exercised by these tests.

What is real: the argv and the batch script (golden files, UPDATE_GOLDEN=1 rewrites them), the
process backend's processes (timeout and cancel kill them), an sshd on loopback (the ``ssh``
test: the stand-in on that host's PATH through sshd's SetEnv), and Slurm: the ``slurm``-marked tests
submit the generated scripts to the single-node test cluster, whose ``--gres=gpu:N`` allocation
(placeholder GPUs) sets the ``CUDA_VISIBLE_DEVICES`` the script passes into the "container".
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from golden_support import check_golden
from slurm_support import (  # noqa: F401 - slurm_cluster is a fixture
    SlurmCluster,
    job_state,
    slurm_cluster,
    squeue_ids,
    wait_until_gone,
)
from ssh_support import write_inventory

from orchestrator.backends.base import RunOptions
from orchestrator.backends.checks import check_matrix
from orchestrator.backends.process import ProcessBackend
from orchestrator.backends.slurm import SlurmBackend, render_sbatch
from orchestrator.cli import main as cli_main
from orchestrator.errors import BuildError, ConfigError
from orchestrator.images import build, sif
from orchestrator.plan.matrix import Matrix, load_matrix
from orchestrator.plan.placement import Allocation
from orchestrator.plan.selection import ImageKey
from orchestrator.results.folders.run_folder import RunPaths, Status
from orchestrator.runtimes import apptainer
from orchestrator.sweep import SweepOutcome, run_sweep

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
STANDIN = TESTS / "standin"
PROBE = STANDIN / "probe.py"
SECRET = "s3cr3t-value-0123456789"
SECRET_SHA = hashlib.sha256(SECRET.encode()).hexdigest()

#: A CUDA profile under Apptainer running our workload (argv and script goldens).
WORKLOAD_MATRIX = """
[matrix]
name = "appt"
backend = "slurm"
timeout_s = 600
[workload]
hardware = "node"
arch = "resnet50"
gpus = 4
batch_size = 64
iterations = 500
data = "synthetic"
[hardware.node]
device = "cuda"
runtime = "apptainer"
image = "singularity"
image_vars = { base_tag = "23.10-py3" }
env = { NCCL_DEBUG = "WARN", HF_TOKEN = "$env:HF_TOKEN", ODD = "a=b" }
slurm = { partition = "gpu", cpus_per_gpu = 8 }
[hardware.node.container]
mounts = [{ source = "/scratch/imagenet", target = "/imagenet", read_only = true }]
[hardware.node.apptainer]
sif = "/images/resnet.sif"
extra_args = ["--writable-tmpfs"]
"""

#: The probe program under Apptainer (the integration sweeps). ``{...}``: filled per test.
PROBE_MATRIX = """
[matrix]
name = "appt_probe"
backend = "{backend}"
timeout_s = {timeout}
[workload]
hardware = "{hardware}"
program = "probe"
{workload}
[hardware.{hardware}]
device = "{device}"
runtime = "apptainer"
env = {{ PUBLIC_VAR = "hello", TRICKY_VAR = "a=b", PROBE_TOKEN = "{secret}" }}
[hardware.{hardware}.apptainer]
sif = "{sif}"
binds = [{{ source = "{data}", target = "/data", read_only = true }}]
[commands.probe]
command = "{{python}} {probe} --out {{output_dir}} --check {data} --sleep {sleep}"
[commands.probe.figures]
parser = "regex"
regex = [{{ name = "probe.ips", pattern = 'probe images/s: (\\d+\\.\\d+)' }}]
"""


def probe_matrix(tmp_path: Path, *, backend: str = "process", device: str = "cpu",
                 hardware: str = "cpu", workload: str = "", timeout: int = 120,
                 sleep: float = 0) -> Path:
    image = tmp_path / "probe.sif"
    image.write_text("a stand-in image\n")
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    path = tmp_path / "probe.toml"
    path.write_text(PROBE_MATRIX.format(
        backend=backend, timeout=timeout, hardware=hardware, workload=workload, device=device,
        secret=SECRET, sif=image, data=data, probe=PROBE, sleep=sleep))
    return path


@pytest.fixture
def apptainer_standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in ``apptainer`` first on PATH; its calls recorded in the returned folder."""
    record = tmp_path / "standin-calls"
    monkeypatch.setenv("PATH", f"{STANDIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("ORCHESTRATE_STANDIN_RECORD", str(record))
    monkeypatch.setenv("ORCHESTRATE_STANDIN_PATH",
                       f"{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin")
    monkeypatch.setenv("ORCHESTRATE_STANDIN_PYTHONPATH", str(ROOT))
    monkeypatch.setenv("HF_TOKEN", SECRET)
    return record


def calls(record: Path) -> list[dict]:
    path = record / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# --- the argv and the script ------------------------------------------------------------------


def test_process_argv_matches_golden(write_matrix, monkeypatch) -> None:
    """The process backend: GPUs pinned by an --env argument, binds, --pwd, the image last
    before the program (torchrun inside the container for 4 GPUs)."""
    monkeypatch.setenv("HF_TOKEN", SECRET)
    matrix = load_matrix(write_matrix(WORKLOAD_MATRIX, cpu_profile=False))
    backend = ProcessBackend(matrix, RunPaths(Path("/results/appt/RUN")), RunOptions(600))
    (cell,) = matrix.cells
    spec = backend.spec(cell, Allocation.local(cell.id, (4, 5, 6, 7)))
    check_golden("apptainer-process.argv", "\n".join(spec.argv) + "\n")
    assert spec.argv[:4] == ("apptainer", "exec", "--nv", "--cleanenv")
    assert "CUDA_VISIBLE_DEVICES=4,5,6,7" in spec.argv
    assert "--nproc_per_node=4" in spec.argv
    assert SECRET not in " ".join(spec.argv) and "HF_TOKEN" not in " ".join(spec.argv)
    assert spec.runtime == {"name": "apptainer", "binary": "apptainer",
                            "image": "/images/resnet.sif", "env_prefix": "APPTAINERENV_"}
    record = spec.to_json()
    assert record["env"]["HF_TOKEN"] == "$env:HF_TOKEN" and SECRET not in json.dumps(record)


def test_sbatch_script_matches_golden(write_matrix, monkeypatch) -> None:
    """The slurm backend: ``srun apptainer exec`` with the job's GPUs passed in at run time;
    the secret named in a comment only; ``ODD`` (an --env value apptainer would change) exported
    with the prefix."""
    monkeypatch.setenv("HF_TOKEN", SECRET)
    matrix = load_matrix(write_matrix(WORKLOAD_MATRIX, cpu_profile=False))
    backend = SlurmBackend(matrix, RunPaths(Path("/results/appt/RUN")), RunOptions(600))
    (cell,) = matrix.cells
    job = backend.sbatch_job(cell)
    script = render_sbatch(job)
    check_golden("sbatch-apptainer.sh", script)
    assert "#SBATCH --gres=gpu:4" in script
    assert 'export APPTAINERENV_CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES-}"' in script
    assert "export APPTAINERENV_ODD=a=b" in script
    assert SECRET not in script and "export APPTAINERENV_HF_TOKEN" not in script
    assert job.argv[:3] == ("srun", "apptainer", "exec")
    assert not any(a.startswith("CUDA_VISIBLE_DEVICES=") for a in job.argv)


def test_singularity_flavour_reads_its_own_prefix(write_matrix) -> None:
    matrix = load_matrix(write_matrix(WORKLOAD_MATRIX.replace(
        'runtime = "apptainer"', 'runtime = "singularity"'), cpu_profile=False))
    backend = SlurmBackend(matrix, RunPaths(Path("/r/appt/RUN")), RunOptions(600))
    job = backend.sbatch_job(matrix.cells[0])
    assert job.argv[1] == "singularity" and job.gpu_env == "SINGULARITYENV_CUDA_VISIBLE_DEVICES"
    assert "SINGULARITYENV_ODD" in job.env


def test_env_split_between_flags_and_prefixed_variables() -> None:
    env = {"A": "1", "ODD": "x=y", "Q": '"quoted"', "HF_TOKEN": "abc", "REF": "$env:FOO"}
    assert apptainer.flag_env(env) == {"A": "1"}
    launcher = apptainer.launcher_env(env, "APPTAINERENV_", environ={"FOO": "from-env"})
    assert launcher == {"APPTAINERENV_ODD": "x=y", "APPTAINERENV_Q": '"quoted"',
                        "APPTAINERENV_HF_TOKEN": "abc", "APPTAINERENV_REF": "from-env"}


@pytest.mark.parametrize(("path", "problem"), [
    ("/data/imagenet", ""),
    ("data", "not an absolute path"),
    ("/data/a,b", "','"),
    ("/data/a:b", "':'"),
])
def test_bind_problem(path: str, problem: str) -> None:
    found = apptainer.bind_problem(path)
    assert (problem in found) and (bool(found) == bool(problem))


# --- the .sif cache ----------------------------------------------------------------------------


def test_sif_from_definition_is_cached_by_content_hash(tmp_path, apptainer_standin) -> None:
    """`apptainer build` runs once in the rendered context; unchanged inputs never rebuild; a
    changed variable is another image."""
    plan = sif.plan_sif(build.plan_image("singularity", {"base_tag": "23.10-py3"}),
                        directory=str(tmp_path / "sif"))
    assert plan.path == str(tmp_path / "sif" / f"singularity-{plan.image.content_hash[:12]}.sif")
    first = sif.ensure_sif(plan, sif.LocalMachine())
    again = sif.ensure_sif(plan, sif.LocalMachine())
    assert first.built and not again.built and first.path == again.path == plan.path
    made = json.loads(Path(plan.path).read_text())
    assert made["spec"] == "Singularity.def" and made["fakeroot"] is True
    assert "workload/run.py" in made["context"]
    (call,) = calls(apptainer_standin)
    assert call["argv"][:2] == ["build", "--fakeroot"] and call["argv"][-1] == "Singularity.def"
    assert call["out"].startswith(plan.path + ".building-")
    other = sif.plan_sif(build.plan_image("singularity", {"base_tag": "24.05-py3"}),
                         directory=str(tmp_path / "sif"))
    assert other.path != plan.path
    assert list((tmp_path / "sif").iterdir()) == [Path(plan.path)]  # nothing half-built left


def test_images_build_singularity_cli(tmp_path, apptainer_standin, capsys) -> None:
    argv = ["images", "build", "singularity", "--set", "base_tag=23.10-py3",
            "--sif-dir", str(tmp_path / "sif")]
    assert cli_main(argv) == 0
    assert "built in" in capsys.readouterr().out
    assert cli_main(argv) == 0
    assert "up to date" in capsys.readouterr().out
    assert len(calls(apptainer_standin)) == 1


def test_failed_build_leaves_nothing(tmp_path, apptainer_standin, monkeypatch) -> None:
    plan = sif.plan_sif(build.plan_image("singularity", {}), binary=str(STANDIN / "apptainer"),
                        directory=str(tmp_path / "sif"))
    Path(plan.path).parent.mkdir()
    monkeypatch.setattr(sif.SifPlan, "build_argv",
                        lambda self, out: [self.binary, "build", "--bogus", out, "x"])
    with pytest.raises(BuildError) as err:
        sif.ensure_sif(plan, sif.LocalMachine())
    assert "exit status 255" in str(err.value) and "expected [--fakeroot] OUT SPEC" in str(
        err.value)
    assert list(Path(plan.path).parent.iterdir()) == []


def test_prepare_refuses_missing_binary_and_bind_source_at_once(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    path = probe_matrix(tmp_path)
    (tmp_path / "data").rmdir()
    matrix = load_matrix(path)
    with pytest.raises(ConfigError) as err:
        apptainer.prepare(matrix, matrix.cells, sif.LocalMachine())
    fields = {p.field: p.message for p in err.value.problems}
    assert set(fields) == {"hardware.cpu.apptainer.binary",
                           "hardware.cpu.apptainer.binds[0].source"}
    assert "not on PATH on localhost" in fields["hardware.cpu.apptainer.binary"]
    assert "does not exist on localhost" in fields["hardware.cpu.apptainer.binds[0].source"]


def test_a_given_sif_that_is_missing_is_refused(tmp_path, apptainer_standin) -> None:
    path = probe_matrix(tmp_path)
    (tmp_path / "probe.sif").unlink()
    matrix = load_matrix(path)
    with pytest.raises(ConfigError) as err:
        apptainer.prepare(matrix, matrix.cells, sif.LocalMachine())
    (problem,) = err.value.problems
    assert problem.field == "hardware.cpu.apptainer.sif" and "does not exist" in problem.message


def test_sif_plans_follow_the_ngc_release_axis(write_matrix) -> None:
    matrix = load_matrix(write_matrix(WORKLOAD_MATRIX.replace('sif = "/images/resnet.sif"', "")
                                      + '[axes]\nngc_release = ["23.10", "24.05"]\n',
                                      cpu_profile=False))
    plans = apptainer.plan_sifs(matrix, matrix.cells)
    assert set(plans) == {ImageKey("node", "23.10"), ImageKey("node", "24.05")}
    assert len({p.path for p in plans.values()}) == 2
    assert plans[ImageKey("node", "24.05")].image.base_image.endswith(":24.05-py3")


# --- checks ------------------------------------------------------------------------------------


def test_shipped_seed_002_matrix_is_clean_and_dry_runs(capsys, apptainer_standin) -> None:
    """`orchestrate matrix --dry-run` shows each cell's apptainer command and its batch script,
    on a machine with an apptainer (the stand-in: without one the sweep, so the dry run,
    refuses)."""
    path = ROOT / "matrices" / "apptainer_slurm.toml"
    matrix = load_matrix(path)
    (cell,) = matrix.cells
    assert (cell.params.gpus, cell.params.batch_size, cell.params.iterations) == (4, 64, 500)
    assert cell.params.telemetry_interval > 0
    found = check_matrix(matrix)
    assert found.errors == [] and found.warnings == []
    assert found.stacks["gpu-node"].release == "23.10"
    assert cli_main(["matrix", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"  {cell.id}:\n" in out
    assert "    command: srun apptainer exec --nv --cleanenv " in out
    assert "      #SBATCH --gres=gpu:4" in out
    assert 'export APPTAINERENV_CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES-}"' in out
    assert "written:" not in out  # a dry run writes nothing (the script is shown in full)
    assert "--nproc_per_node=4 -m workload --batch-size 64" in out


# --- real sweeps through the stand-in ----------------------------------------------------------


def test_process_sweep_runs_in_the_standin(tmp_path, apptainer_standin) -> None:
    """A CPU cell through the process backend: --cleanenv, binds, --pwd, the environment as
    the container sees it; the secret reaches the program and no file of the run."""
    matrix = load_matrix(probe_matrix(tmp_path))
    outcome = run_sweep(matrix, results_root=tmp_path / "results")
    (res,) = outcome.results
    assert res.status is Status.OK, res.reason
    assert res.metrics["probe.ips"] == 100.0
    assert res.provenance["runtime"]["image"] == str(tmp_path / "probe.sif")
    cell = outcome.paths.cell_dir(res.cell_id)
    seen = json.loads((cell / "probe-rank0.json").read_text())
    assert seen["env"]["PUBLIC_VAR"] == "hello" and seen["env"]["TRICKY_VAR"] == "a=b"
    assert seen["secret_sha256"] == SECRET_SHA and seen["cwd"] == str(cell.resolve())
    assert seen["exists"] == {str(tmp_path / "data"): True}
    assert "HF_TOKEN" not in seen["env_names"]  # --cleanenv: the launcher's variables stay out
    (call,) = calls(apptainer_standin)
    assert call["flags"] == ["--cleanenv"]
    assert call["binds"][0] == {"source": str(tmp_path / "data"), "target": "/data",
                                "read_only": True}
    assert "APPTAINERENV_PROBE_TOKEN" in call["prefixed"]
    for path in outcome.paths.root.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


def cancelled_once_started(matrix: Matrix, results: Path, join_s: float) -> SweepOutcome:
    """Run ``matrix`` in a thread, set its cancel flag once the probe has written its file (it
    must within 60 s), and return the outcome (the sweep must end within ``join_s``)."""
    cancel = threading.Event()
    box: dict = {}
    sweep = threading.Thread(target=lambda: box.update(outcome=run_sweep(
        matrix, results_root=results, cancel=cancel)))
    sweep.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list(results.rglob("probe-rank0.json")):
        time.sleep(0.2)
    assert list(results.rglob("probe-rank0.json")), "the probe never started"
    cancel.set()
    sweep.join(timeout=join_s)
    assert not sweep.is_alive()
    return box["outcome"]


def test_process_sweep_timeout_and_cancel(tmp_path, apptainer_standin) -> None:
    matrix = load_matrix(probe_matrix(tmp_path, timeout=3, sleep=120))
    started = time.monotonic()
    (res,) = run_sweep(matrix, results_root=tmp_path / "r1").results
    assert res.status is Status.TIMEOUT and time.monotonic() - started < 60
    matrix = load_matrix(probe_matrix(tmp_path, timeout=300, sleep=120))
    (res,) = cancelled_once_started(matrix, tmp_path / "r2", join_s=60).results
    assert res.status is Status.CANCELLED
    pids = [c["pid"] for c in calls(apptainer_standin)]
    # one `apptainer exec` per sweep, both through it
    assert len(pids) == 2, calls(apptainer_standin)
    for pid in pids:  # the stand-in exec'd the probe: the same pid
        assert not Path(f"/proc/{pid}").exists() or \
            "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


@pytest.mark.slurm
def test_slurm_sweep_pins_the_jobs_gpus_in_the_standin(tmp_path, apptainer_standin,
                                                        no_jobs_left) -> None:
    """Real jobs: 1 and 2 GPUs (torchrun inside the "container"); each rank sees the
    CUDA_VISIBLE_DEVICES Slurm gave its job, passed in by the script; binds and secrets."""
    matrix = load_matrix(probe_matrix(tmp_path, backend="slurm", device="cuda",
                                      hardware="node", workload="[axes]\ngpus = [1, 2]"))
    outcome = run_sweep(matrix, results_root=tmp_path / "results")
    assert [r.status for r in outcome.results] == [Status.OK, Status.OK], \
        [r.reason for r in outcome.results]
    by_call = {Path(c["pwd"]).name: c for c in calls(apptainer_standin)}
    for res in outcome.results:
        cell = outcome.paths.cell_dir(res.cell_id)
        gpus = 2 if "-g2-" in res.cell_id else 1
        call = by_call[res.cell_id]
        assert call["flags"] == ["--nv", "--cleanenv"] and call["slurm_job_id"] == \
            res.provenance["slurm_job_id"]
        allocated = call["launcher_cuda_visible_devices"]
        assert allocated and len(allocated.split(",")) == gpus
        assert call["container_cuda_visible_devices"] == allocated
        assert "APPTAINERENV_CUDA_VISIBLE_DEVICES" in call["prefixed"]
        ranks = sorted(cell.glob("probe-rank*.json"))
        assert len(ranks) == gpus
        for rank in ranks:
            seen = json.loads(rank.read_text())
            assert seen["env"]["CUDA_VISIBLE_DEVICES"] == allocated
            assert seen["secret_sha256"] == SECRET_SHA
            assert seen["exists"] == {str(tmp_path / "data"): True}
        script = (cell / "job.sbatch").read_text()
        assert f"--gres=gpu:{gpus}" in script and SECRET not in script
        assert SECRET not in outcome.paths.cell_command(res.cell_id).read_text()
        assert res.metrics["probe.ips"] == 100.0


@pytest.mark.slurm
def test_slurm_timeout_and_cancel_in_the_standin(tmp_path, apptainer_standin, no_jobs_left) -> None:
    matrix = load_matrix(probe_matrix(tmp_path, backend="slurm", timeout=8, sleep=300))
    (res,) = run_sweep(matrix, results_root=tmp_path / "r1").results
    assert res.status is Status.TIMEOUT, res.reason
    assert job_state(res.provenance["slurm_job_id"]) == "CANCELLED"
    matrix = load_matrix(probe_matrix(tmp_path, backend="slurm", timeout=300, sleep=300))
    outcome = cancelled_once_started(matrix, tmp_path / "r2", join_s=120)
    (res,) = outcome.results
    assert res.status is Status.CANCELLED
    job_id = json.loads(outcome.paths.cell_command(res.cell_id).read_text())["slurm"]["job_id"]
    assert job_state(job_id) == "CANCELLED"


def test_standin_refuses_a_missing_bind_source(tmp_path, apptainer_standin) -> None:
    """The stand-in's own refusals are what the sweep's checks must catch first."""
    (tmp_path / "img.sif").write_text("x")
    proc = subprocess.run(["apptainer", "exec", "--bind", "/no/such:/x", str(tmp_path / "img.sif"),
                           "true"], capture_output=True, text=True)
    assert proc.returncode == 255 and "doesn't exist" in proc.stderr


@pytest.mark.docker
def test_sif_converted_from_the_docker_image(tmp_path, apptainer_standin, docker_client, base_image,
                                             capsys) -> None:
    """A Dockerfile template's .sif: the Docker image the docker backend would run is made
    (pinned to its base's bits) and converted from docker-daemon://; the .sif carries that
    image's hash; a second build converts nothing."""
    argv = ["images", "build", "ngc-pytorch", "--sif", "--sif-dir", str(tmp_path / "sif"),
            "--set", f"base_image={base_image}", "--set", "install_nvml=false"]
    assert cli_main(argv) == 0
    assert "built in" in capsys.readouterr().out
    (call,) = calls(apptainer_standin)
    tag = call["docker_image"]
    assert call["argv"][-1] == f"docker-daemon://{tag}" and "--fakeroot" not in call["argv"]
    (made,) = (tmp_path / "sif").iterdir()
    assert made.name == f"ngc-pytorch-{tag.rpartition(':')[2]}.sif"
    assert cli_main(argv) == 0
    assert "up to date" in capsys.readouterr().out and len(calls(apptainer_standin)) == 1


# --- the ssh backend: a real sshd on loopback, the stand-in on the host's PATH ------------------


@pytest.fixture(scope="session")
def standin_host(sshd_factory, tmp_path_factory):
    """An sshd "host" whose sessions find the stand-in first on PATH (SetEnv) and record its
    calls in a folder of their own."""
    record = tmp_path_factory.mktemp("standin-ssh-calls")
    python_dir = str(Path(sys.executable).parent)
    server = sshd_factory("appt-host", setenv={
        "PATH": f"{STANDIN}:{python_dir}:/usr/bin:/bin",
        "ORCHESTRATE_STANDIN_RECORD": str(record),
        "ORCHESTRATE_STANDIN_PATH": f"{python_dir}:/usr/bin:/bin",
    })
    return server, record


@pytest.mark.ssh
@pytest.mark.timeout(300)
def test_ssh_sweep_runs_in_the_standin_on_the_host(tmp_path, standin_host, monkeypatch) -> None:
    """Apptainer cells on an SSH host (no engine used): GPUs placed and pinned by --env, the
    other variables and the secret over stdin (never in a command line or a file), output
    copied back, the remote folder removed; a timed-out cell's processes are stopped there."""
    server, record = standin_host
    monkeypatch.setenv("HF_TOKEN", SECRET)
    hosts = write_inventory(tmp_path, [server], tags=("node",), gpus=[[0, 1, 2, 3]])
    matrix = load_matrix(probe_matrix(tmp_path, backend="ssh", device="cuda", hardware="node",
                                      workload="[axes]\ngpus = [1, 2]"))
    outcome = run_sweep(matrix, results_root=tmp_path / "results", hosts_file=hosts)
    assert [r.status for r in outcome.results] == [Status.OK, Status.OK], \
        [r.reason for r in outcome.results]
    by_cell = {Path(c["pwd"]).parent.name: c for c in calls(record)}
    for res in outcome.results:
        gpus = 2 if "-g2-" in res.cell_id else 1
        cell = outcome.paths.cell_dir(res.cell_id)
        command = json.loads(outcome.paths.cell_command(res.cell_id).read_text())
        pinned = ",".join(map(str, command["gpu_ids"]))
        assert len(command["gpu_ids"]) == gpus and command["host"] == server.name
        call = by_cell[res.cell_id]
        assert call["flags"] == ["--nv", "--cleanenv"]
        assert call["container_cuda_visible_devices"] == pinned
        assert "APPTAINERENV_PROBE_TOKEN" in call["prefixed"]
        assert SECRET not in " ".join(call["argv"])
        ranks = sorted(cell.glob("probe-rank*.json"))  # copied back from the host
        assert len(ranks) == gpus
        for rank in ranks:
            seen = json.loads(rank.read_text())
            assert seen["env"]["CUDA_VISIBLE_DEVICES"] == pinned
            assert seen["secret_sha256"] == SECRET_SHA and seen["env"]["TRICKY_VAR"] == "a=b"
            assert seen["exists"] == {str(tmp_path / "data"): True}
        assert res.metrics["probe.ips"] == 100.0 and res.provenance["host"] == server.name
        assert not Path(call["pwd"]).exists()  # the remote folder is gone
        for path in cell.rglob("*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), path

    matrix = load_matrix(probe_matrix(tmp_path, backend="ssh", device="cuda", hardware="node",
                                      timeout=5, sleep=300))
    before = len(calls(record))
    (res,) = run_sweep(matrix, results_root=tmp_path / "r2", hosts_file=hosts).results
    assert res.status is Status.TIMEOUT, res.reason
    (call,) = calls(record)[before:]
    deadline = time.monotonic() + 20
    while Path(f"/proc/{call['pid']}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not Path(f"/proc/{call['pid']}").exists(), "the cell's process outlived its timeout"


@pytest.mark.ssh
@pytest.mark.timeout(120)
def test_sif_from_definition_is_built_on_an_ssh_host(tmp_path, standin_host) -> None:
    """SshMachine: the build context goes to the host as a tar stream, the stand-in builds
    there in a folder of its own (removed after), its output is heard line by line, the image
    is moved into place; a second ensure_sif finds it up to date and builds nothing."""
    from orchestrator.config.inventory import load_hosts
    from orchestrator.remote.connection import SshHost

    server, record = standin_host
    hosts = write_inventory(tmp_path, [server], tags=("node",), gpus=[[0, 1, 2, 3]])
    ssh = SshHost.from_inventory(load_hosts(hosts), server.name)
    plan = sif.plan_sif(build.plan_image("singularity", {"base_tag": "23.10-py3"}),
                        directory=str(tmp_path / "sif"))
    before = len(calls(record))
    contexts = set(Path("/tmp").glob("orchestrate-sif-??????"))
    heard: list[str] = []
    try:
        first = sif.ensure_sif(plan, sif.SshMachine(ssh), on_log=heard.append)
        again = sif.ensure_sif(plan, sif.SshMachine(ssh))
    finally:
        ssh.close()
    assert first.built and not again.built and first.path == again.path == plan.path
    made = json.loads(Path(plan.path).read_text())
    assert made["spec"] == "Singularity.def" and "workload/run.py" in made["context"]
    (call,) = calls(record)[before:]
    assert call["argv"][:2] == ["build", "--fakeroot"] and call["out"].startswith(
        plan.path + ".building-")
    assert heard == [f"INFO:    stand-in build of {call['out']} from Singularity.def"]
    assert list((tmp_path / "sif").iterdir()) == [Path(plan.path)]
    assert set(Path("/tmp").glob("orchestrate-sif-??????")) == contexts  # the context is removed
