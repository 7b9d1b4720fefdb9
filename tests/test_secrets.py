"""Secrets reach the workload and no file of the run (issue 10, item 7).

A profile's environment holds a secret literal (``HF_TOKEN = "..."``), a value taken from the
orchestrator's environment (``API_KEY = "$env:..."``) and a plain value. Real cells (a
process, a Docker container, a Slurm job) print a digest of what they received, to show the
secrets arrived, and the secret itself, to show the output is scrubbed; then every file of the
run folder is searched for the secret values. The container and the job run the STAND-IN
workload (tests/standin/, ``--standin-env``) through the real command path.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import sys
import tomllib
from pathlib import Path

import pytest
from slurm_support import slurm_cluster  # noqa: F401 - the fixture
from standin_support import Standin, container_mount
from workload_support import tiny_matrix

from orchestrator import sweep
from orchestrator.backends.base import Backend, RunOptions
from orchestrator.backends.docker import DockerBackend
from orchestrator.backends.process import ProcessBackend
from orchestrator.config.redact import MASK, looks_secret, redact_toml
from orchestrator.errors import ConfigError
from orchestrator.plan.launch import LaunchSpec
from orchestrator.plan.matrix import Matrix, load_matrix
from orchestrator.results.folders.run_folder import RunPaths, Status
from orchestrator.sweep import NullEvents, SweepOutcome

LITERAL = "hf_literal_secret_0123456789"
FROM_ENV = "key-from-the-environment-9876"
SOURCE = "ORCHESTRATE_TEST_API_KEY"

MATRIX = tiny_matrix("secrets", timeout_s=120) + f"""
[hardware.cpu]
device = "cpu"
# the token below must not survive in the run's copy of this file
env = {{ HF_TOKEN = "{LITERAL}", API_KEY = "$env:{SOURCE}", PLAIN = "visible" }}
"""

PRINT = """
import hashlib, os
for name in ("HF_TOKEN", "API_KEY"):
    value = os.environ[name]
    print(name, hashlib.sha256(value.encode()).hexdigest(), "value:", value, flush=True)
"""


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def files_with_secrets(root: Path) -> list[str]:
    return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()
            and any(s.encode() in p.read_bytes() for s in (LITERAL, FROM_ENV))]


@pytest.mark.parametrize("name, secret", [
    ("HF_TOKEN", True), ("WANDB_API_KEY", True), ("AWS_SECRET_ACCESS_KEY", True),
    ("DB_PASSWORD", True), ("DB_PASS", True), ("GITHUBTOKEN", True), ("MY_PASSWD", True),
    ("NCCL_AUTH", True), ("SSH_KEY", True), ("aws_session_token", True),
    ("api-key", True), ("CREDENTIALS_FILE", True),
    ("NCCL_DEBUG", False), ("OMP_NUM_THREADS", False), ("KEYBOARD_LAYOUT", False),
    ("MONKEY", False), ("PWD", False), ("PATH", False), ("AUTHOR", False),
])
def test_which_names_look_secret(name: str, secret: bool) -> None:
    assert looks_secret(name) is secret


def test_the_matrix_copy_is_masked_and_still_valid_toml() -> None:
    text = redact_toml(MATRIX)
    assert LITERAL not in text and f'HF_TOKEN = "{MASK}"' in text
    assert "# the token below" in text, "the file is kept as written where it can be"
    data = tomllib.loads(text)
    env = data["hardware"]["cpu"]["env"]
    assert env == {"HF_TOKEN": MASK, "API_KEY": f"$env:{SOURCE}", "PLAIN": "visible"}


@pytest.mark.parametrize("source", [
    '[hardware.x.env]\nHF_TOKEN = "abc\\u0041def"\n',  # an escape: masked by rewriting
    "[hardware.x.env]\nHF_TOKEN = '''multi\nline'''\n",
    'hardware.x.env.HF_TOKEN = "dotted-key-secret"\n',
    '[hardware.x]\nenv = { "HF_TOKEN" = "quoted-key-secret", B = "1" }\n',
    "[hardware.x.env]\nHF_TOKEN = 'literal-string-secret'\n",
    '[hardware.x]\nimage_vars = { pip_token = "in-image-vars" }\n',
])
def test_every_spelling_of_a_secret_is_masked(source: str) -> None:
    original = tomllib.loads(source)
    text = redact_toml(source)
    data = tomllib.loads(text)
    for value in ("abcAdef", "multi\nline", "dotted-key-secret", "quoted-key-secret",
                  "literal-string-secret", "in-image-vars"):
        assert value not in text
    assert set(data) == set(original) and MASK in json.dumps(data)
    if "B" in source:
        assert data["hardware"]["x"]["env"]["B"] == "1"


def test_a_missing_environment_reference_stops_the_sweep_before_it_starts(write_matrix,
                                                                          tmp_path,
                                                                          monkeypatch):
    monkeypatch.delenv(SOURCE, raising=False)
    matrix = load_matrix(write_matrix(MATRIX, cpu_profile=False))
    with pytest.raises(ConfigError) as err:
        sweep.run_sweep(matrix, results_root=tmp_path / "results")
    (problem,) = err.value.problems
    assert problem.field == "hardware.cpu.env.API_KEY" and f"export {SOURCE}" in problem.message
    assert not (tmp_path / "results").exists()


def run_with(backend: type[Backend], name: str, matrix: Matrix, results_root: Path,
             timeout_s: float) -> SweepOutcome:
    """The sweep's own steps (open the run, prepare the backend, run its cells and close the
    backend, finish the run) with ``backend`` in place of the backend ``name``'s class."""
    run = sweep.open_run(matrix, name, results_root, None)
    prepared = sweep.prepare_backend(backend, matrix, run, RunOptions(timeout_s=timeout_s),
                                     NullEvents())
    results, interrupted = sweep.run_all(prepared, run.cells, NullEvents())
    return sweep.finish_run(matrix, run, results, interrupted)


class PrintingProcess(ProcessBackend):
    """The real process backend running a script that prints what it received."""

    def spec(self, cell, allocation, attempt: int = 1) -> LaunchSpec:
        return dataclasses.replace(super().spec(cell, allocation, attempt),
                                   argv=(sys.executable, "-c", PRINT))


@pytest.mark.subprocess  # a real process cell
def test_process_cell_gets_its_secrets_and_no_file_of_the_run_has_them(write_matrix, tmp_path,
                                                                       monkeypatch):
    monkeypatch.setenv(SOURCE, FROM_ENV)
    matrix = load_matrix(write_matrix(MATRIX, cpu_profile=False))
    outcome = run_with(PrintingProcess, "process", matrix, tmp_path, 60)
    (result,) = outcome.results
    assert result.status is Status.FAILED and result.exit_code == 0  # no summary line: tail kept

    log_text = outcome.paths.cell_log(result.cell_id).read_text()
    assert f"HF_TOKEN {digest(LITERAL)} value: {MASK}" in log_text
    assert f"API_KEY {digest(FROM_ENV)} value: {MASK}" in log_text
    assert any(MASK in line for line in result.log_tail)
    command = json.loads(outcome.paths.cell_command(result.cell_id).read_text())
    assert command["env"]["HF_TOKEN"] == MASK
    assert command["env"]["API_KEY"] == f"$env:{SOURCE}" and command["env"]["PLAIN"] == "visible"
    assert files_with_secrets(outcome.paths.root) == []


def standin_matrix(standin: Standin, *, container: bool = False) -> str:
    """:data:`MATRIX` whose cell runs the STAND-IN workload, which prints the digest and the
    value of both secrets (``--standin-env``)."""
    text = MATRIX.replace("[workload]\n", '[workload]\nprogram = "standin"\n', 1)
    return text + standin.command("--standin-env=HF_TOKEN,API_KEY", container=container)


@pytest.mark.docker
def test_a_container_cell_gets_its_secrets_and_no_file_of_the_run_has_them(
        docker_client, base_image, write_matrix, tmp_path, monkeypatch, standin):
    """On a real engine, through the real command path: the container (the STAND-IN
    workload, mounted into it) receives both secrets (their digests in its output), its output
    is scrubbed, and no file of the run folder holds either value."""
    monkeypatch.setenv(SOURCE, FROM_ENV)
    text = standin_matrix(standin, container=True).replace('device = "cpu"\n', (
        'device = "cpu"\nimage = "ngc-pytorch"\n'
        f'image_vars = {{ base_image = "{base_image}", install_nvml = false }}\n'
        # as tests/test_backend_docker.py: this engine refuses the default unlimited memlock
        'container = { shm_size = "256m", ulimits = { stack = 67108864 }, '
        f'mounts = [{container_mount()}] }}\n'), 1)
    matrix = load_matrix(write_matrix(text, cpu_profile=False))
    outcome = run_with(DockerBackend, "docker", matrix, tmp_path, 120)
    (result,) = outcome.results
    assert result.exit_code == 0, result.reason
    log_text = outcome.paths.cell_log(result.cell_id).read_text()
    assert f"HF_TOKEN {digest(LITERAL)} value: {MASK}" in log_text
    assert f"API_KEY {digest(FROM_ENV)} value: {MASK}" in log_text
    command = json.loads(outcome.paths.cell_command(result.cell_id).read_text())
    assert command["env"]["HF_TOKEN"] == MASK and command["env"]["API_KEY"] == f"$env:{SOURCE}"
    assert files_with_secrets(outcome.paths.root) == []


def test_containers_get_resolved_secrets_at_launch_only(write_matrix, tmp_path, monkeypatch):
    """The container's environment (what the engine stores, `docker inspect` shows) has the
    values; the spec written as command.json does not. As built: no engine needed."""
    from orchestrator.plan.placement import Allocation
    from orchestrator.runtimes.docker import container_kwargs

    monkeypatch.setenv(SOURCE, FROM_ENV)
    matrix = load_matrix(write_matrix(MATRIX, cpu_profile=False))
    backend = DockerBackend(matrix, RunPaths.create(tmp_path, matrix.name),
                            RunOptions(timeout_s=60))
    backend.image_tags = {"cpu": "orchestrate/test:cpu"}
    (cell,) = matrix.cells
    spec = backend.spec(cell, Allocation.local(cell.id))
    environment = container_kwargs(spec)["environment"]
    assert environment["HF_TOKEN"] == LITERAL and environment["API_KEY"] == FROM_ENV
    assert LITERAL not in json.dumps(spec.to_json()) and FROM_ENV not in json.dumps(
        spec.to_json())


def test_the_batch_script_names_secrets_but_holds_none(write_matrix, tmp_path, monkeypatch):
    from orchestrator.backends.slurm import SlurmBackend, render_sbatch

    monkeypatch.setenv(SOURCE, FROM_ENV)
    matrix = load_matrix(write_matrix(MATRIX, cpu_profile=False))
    backend = SlurmBackend(matrix, RunPaths.create(tmp_path, matrix.name),
                           RunOptions(timeout_s=60))
    script = render_sbatch(backend.sbatch_job(matrix.cells[0]))
    assert LITERAL not in script and FROM_ENV not in script and SOURCE not in script
    assert ("# passed by sbatch from the submitting environment, not written here: "
            "API_KEY HF_TOKEN") in script
    assert "export PLAIN=visible" in script


@pytest.mark.slurm
def test_a_slurm_job_gets_its_secrets_from_sbatch(slurm_cluster, write_matrix,  # noqa: F811
                                                  tmp_path, monkeypatch, standin):
    """The STAND-IN workload as a real batch job, through the real command path."""
    from orchestrator.backends.slurm import SlurmBackend

    monkeypatch.setenv(SOURCE, FROM_ENV)
    matrix = load_matrix(write_matrix(standin_matrix(standin), cpu_profile=False))
    outcome = run_with(SlurmBackend, "slurm", matrix, tmp_path, 120)
    (result,) = outcome.results
    assert result.exit_code == 0, result.reason
    log_text = outcome.paths.cell_log(result.cell_id).read_text()
    assert f"HF_TOKEN {digest(LITERAL)} value: {MASK}" in log_text
    assert f"API_KEY {digest(FROM_ENV)} value: {MASK}" in log_text
    paths = outcome.paths
    assert "value: ***" in next(paths.cell_dir(result.cell_id).glob("slurm-*.out")).read_text()
    assert files_with_secrets(paths.root) == []


@pytest.mark.parametrize("comment", [
    '# HF_TOKEN = "hf_rotated_0123456789" (rotated)',
    "# wandb_api_key: 'wb_0123456789abcdef'",
    '  # old: { GITHUB_TOKEN = "ghp_0123456789abcdef" }',
])
@pytest.mark.parametrize("live", [True, False])
def test_a_commented_out_secret_is_masked_too(comment, live):
    """Issue 24, item 13: the live HF_TOKEN line was masked and the commented-out one, written
    beside it, kept in the run's copy of matrix.toml."""
    text = ('[matrix]\nname = "m"  # not a secret\n[hardware.cpu]\ndevice = "cpu"\n'
            + ('env = { HF_TOKEN = "hf_live_0123456789" }\n' if live else "")
            + comment + '\nnote = "a # inside = a string"\n')
    kept = redact_toml(text)
    secret = re.search(r"(hf|wb|ghp)_[0-9a-z_]+", comment).group(0)
    assert secret not in kept and "hf_live" not in kept
    assert MASK in kept and "# not a secret" in kept
    assert tomllib.loads(kept)["hardware"]["cpu"]["note"] == "a # inside = a string"
