"""Seed 003 ran its 15 runs in one long-lived container (``docker run -d``, then each run a new
``multiproc.py`` process in it); orchestrate starts a fresh container per run. Does that change
the figure DLPerf's rule reads (the time of iterations 21..N of each run, timed inside the run)?

This measures it on this machine's CPU with a DLPerf-style window: a ResNet training loop of
``--iterations`` steps timed from step ``--warmup`` on, ``--runs`` runs each way, alternating
(fresh container, then a new process in the long-lived one), on the same image. It prints the
images/s of every run and the two medians. CPU only (the project's machines have no GPU and the
GPU machine has no Docker): it shows what the container's life does to a timed window, not what
a V100 does.

    python benchmarks/container_reuse.py [--image orchestrate-test/base:bookworm-torch2.14.1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (
    cannot_run,
    docker_problem,
    dry_option,
    stop_on_sigterm,
)

PROGRAM = """
import time, torch, torchvision
torch.set_num_threads(2)
model = torchvision.models.resnet18(num_classes=10)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn({batch}, 3, 64, 64), torch.randint(0, 10, ({batch},))
for i in range({iterations}):
    if i == {warmup}:
        t0 = time.perf_counter()
    opt.zero_grad(); torch.nn.functional.cross_entropy(model(x), y).backward(); opt.step()
print({batch} * ({iterations} - {warmup}) / (time.perf_counter() - t0))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", default="orchestrate-test/base:bookworm-torch2.14.1")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch", type=int, default=16)
    dry_option(parser, "the engine and the image checked, nothing run")
    args = parser.parse_args()
    problem = docker_problem(args.image)
    if problem:
        return cannot_run(f"{problem} (it runs a training step in containers of it)")
    if args.dry:
        print(f"would run {args.runs} x (a fresh container, an exec in a long-lived one) of "
              f"{args.image}: {args.iterations} iterations, batch {args.batch}")
        return 0
    stop_on_sigterm()
    import docker

    code = PROGRAM.format(batch=args.batch, iterations=args.iterations, warmup=args.warmup)
    argv = ["python3", "-c", code]
    client = docker.from_env()
    kept = client.containers.run(args.image, ["sleep", "infinity"], detach=True, remove=True)
    fresh, reused = [], []
    try:
        for run in range(1, args.runs + 1):
            start = time.monotonic()
            printed = client.containers.run(args.image, argv, remove=True)
            assert isinstance(printed, bytes)  # not detached, not streamed: the output
            fresh.append(float(printed.decode().split()[-1]))
            took_fresh = time.monotonic() - start
            start = time.monotonic()
            code_, answer = kept.exec_run(argv)
            assert code_ == 0 and isinstance(answer, bytes), answer
            reused.append(float(answer.decode().split()[-1]))
            print(f"run {run}: fresh {fresh[-1]:.1f} img/s ({took_fresh:.1f} s wall), "
                  f"long-lived {reused[-1]:.1f} img/s ({time.monotonic() - start:.1f} s wall)",
                  flush=True)
    finally:
        kept.kill()
    med_f, med_r = statistics.median(fresh), statistics.median(reused)
    print(f"median images/s, iterations {args.warmup + 1}..{args.iterations}: fresh container "
          f"{med_f:.1f}, long-lived container {med_r:.1f} (long-lived / fresh = "
          f"{med_r / med_f:.3f}); spread of the fresh runs {min(fresh):.1f}..{max(fresh):.1f}, "
          f"of the long-lived {min(reused):.1f}..{max(reused):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
