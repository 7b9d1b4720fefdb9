"""Orchestrator overhead per cell on the Docker backend, beside a bare `docker run`.

    .venv/bin/python benchmarks/docker_overhead.py [--cells 4] [--base-image REF]

Needs a Docker engine and the local base image (tests/infra/make-base-image.sh). Runs, in one
process, the same workload command for the same cells twice, alternating:

- bare: ``docker run --rm --ipc=host --shm-size=1g IMAGE <argv>`` (the docker CLI, as a lab
  types it), wall time per cell;
- orchestrated: ``run_sweep`` with the docker backend on a matrix of those cells (image check,
  container create/start, live log streaming, result parsing, files, cleanup), wall time of the
  whole sweep divided by the cells, plus the one-off parts (planning, image up-to-date check).

Prints both side by side and the difference: seconds of orchestrator time per cell. Because a
cell's time is dominated by `import torch` (noisy on a loaded machine),
it also times the container lifecycle alone with a trivial command (`python3 -c pass`): bare CLI
vs the backend's path (create+start through the SDK, log streaming, wait, state, remove).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import cannot_run, docker_problem, dry_option  # noqa: E402
from orchestrator.backends.containers import DockerExecution  # noqa: E402
from orchestrator.config.matrix_file import ContainerOptions  # noqa: E402
from orchestrator.images import build  # noqa: E402
from orchestrator.local.engine import docker_client  # noqa: E402
from orchestrator.plan.launch import LaunchSpec, workload_argv  # noqa: E402
from orchestrator.plan.matrix import load_matrix  # noqa: E402
from orchestrator.runtimes.docker import CONTAINER_PYTHON, container_kwargs  # noqa: E402
from orchestrator.sweep import run_sweep  # noqa: E402

MATRIX = """
[matrix]
name = "overhead"
backend = "docker"
timeout_s = 600
[workload]
hardware = "box"
arch = "resnet18"
image_size = 32
batch_size = 4
warmup = 1
iterations = 5
workers = 0
num_classes = 10
[axes]
seed = {seeds}
[hardware.box]
device = "cpu"
image = "ngc-pytorch"
# the local test base has no pip, and a CPU cell samples no NVML telemetry
image_vars = {{ base_image = "{base}", install_nvml = false }}
container = {{ ipc = "host", shm_size = "1g", ulimits = {{ stack = 67108864 }} }}
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2, help="bare/orchestrated alternations")
    ap.add_argument("--base-image", default="orchestrate-test/base:bookworm-torch2.14.1")
    dry_option(ap, "the engine and the base image checked, the matrix planned, nothing run")
    args = ap.parse_args()
    problem = docker_problem(args.base_image)
    if problem:
        return cannot_run(f"{problem} (its cells run in containers built on it)")
    if args.dry:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "overhead.toml"
            path.write_text(MATRIX.format(seeds=list(range(args.cells)), base=args.base_image))
            cells = len(load_matrix(path).cells)
        print(f"would run {cells} cells x {args.rounds} rounds, bare and through a sweep")
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "overhead.toml"
        path.write_text(MATRIX.format(seeds=list(range(args.cells)), base=args.base_image))
        t0 = time.perf_counter()
        matrix = load_matrix(path)
        plan_s = time.perf_counter() - t0
        profile = matrix.profiles["box"]
        assert profile.image is not None  # the matrix above names its template
        plan = build.plan_image(profile.image, profile.image_vars)
        first = build.ensure_image(plan)  # may build once; not part of the per-cell figure
        t0 = time.perf_counter()
        again = build.ensure_image(plan)  # pins the base (one inspect) and finds the tag
        check_s = time.perf_counter() - t0
        assert not again.built and again.tag == first.tag

        bare: list[float] = []
        orch: list[float] = []
        inside: list[float] = []
        for _ in range(args.rounds):
            for cell in matrix.cells:
                argv = workload_argv(cell, profile, python=CONTAINER_PYTHON)
                t0 = time.perf_counter()
                subprocess.run(["docker", "run", "--rm", "--ipc=host", "--shm-size=1g",
                                first.tag, *argv], check=True, capture_output=True)
                bare.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            outcome = run_sweep(matrix, results_root=Path(tmp) / "results")
            orch.append((time.perf_counter() - t0) / len(matrix.cells))
            assert outcome.ok, [r.reason for r in outcome.results]
            inside += [r.duration_s for r in outcome.results if r.duration_s is not None]

        life_bare, life_ours = lifecycle(first.tag, profile.container, Path(tmp), args.cells * 3)

    b, o = statistics.median(bare), statistics.median(orch)
    print(f"image: {first.tag} ({'built now' if first.built else 'already there'})")
    print(f"cells: {args.cells} x {args.rounds} rounds, workload: resnet18 32px bs4, "
          "1 warmup + 5 iterations, CPU")
    print()
    print(f"{'per cell':44} {'seconds':>9}")
    print(f"{'bare docker run (CLI, --rm), median':44} {b:9.3f}")
    print(f"{'orchestrate sweep / cells, median':44} {o:9.3f}")
    print(f"{'  of which launch->exit+cleanup (result)':44} {statistics.median(inside):9.3f}")
    print(f"{'orchestrator overhead per cell':44} {o - b:+9.3f}  ({(o - b) / b:+.1%})")
    lb, lo = statistics.median(life_bare), statistics.median(life_ours)
    print(f"{'container lifecycle only (python3 -c pass):':44}")
    print(f"{'  bare docker run (CLI, --rm), median':44} {lb:9.3f}")
    print(f"{'  backend: SDK run+logs+wait+remove, median':44} {lo:9.3f}  ({lo - lb:+.3f})")
    print()
    print(f"{'once per sweep':44} {'seconds':>9}")
    print(f"{'load + validate + expand matrix':44} {plan_s:9.3f}")
    print(f"{'image up-to-date check (no build)':44} {check_s:9.3f}")
    return 0


def lifecycle(image: str, options: ContainerOptions, tmp: Path, n: int
              ) -> tuple[list[float], list[float]]:
    """Time a trivial container n times both ways, alternating."""
    client = docker_client()
    argv = [CONTAINER_PYTHON, "-c", "pass"]
    bare, ours = [], []
    out = tmp / "lifecycle"
    out.mkdir()
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(["docker", "run", "--rm", "--ipc=host", "--shm-size=1g", image, *argv],
                       check=True, capture_output=True)
        bare.append(time.perf_counter() - t0)
        spec = LaunchSpec(cell_id="lifecycle", argv=tuple(argv), env={}, device="cpu",
                          image=image, container=options, output_dir=str(out))
        t0 = time.perf_counter()
        execution = DockerExecution(client.containers.run(**container_kwargs(spec)))
        for _chunk in execution.output():
            pass
        execution.wait(30)
        execution.exit_info()
        execution.close()
        ours.append(time.perf_counter() - t0)
    client.close()
    return bare, ours


if __name__ == "__main__":
    raise SystemExit(main())
