"""A lab's own benchmark program, as ``orchestrate`` runs any program: it prints its figures as
text, which a matrix's regex ``[figures]`` reads (examples/fake_bench.toml).

It measures nothing real: each step of ``--batch-size`` images sleeps for as long as a model
doing ``--rate`` images/s would take, so its throughput is the same on every machine (within a
few per cent), and a docs example, a CI job or a cron recipe runs in seconds anywhere. Set
``FAKE_BENCH_SLOWDOWN=0.15`` to make each step take 15 % longer (13 % fewer images/s: a
regression for the nightly gate to find).
Standard library only.
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rate", type=float, default=100.0, help="images/s it pretends to reach")
    args = p.parse_args()
    slowdown = float(os.environ.get("FAKE_BENCH_SLOWDOWN", "0") or 0)
    step_s = args.batch_size / args.rate * (1.0 + slowdown)
    print(f"fake_bench: batch {args.batch_size}, {args.steps} steps after {args.warmup} warmup",
          flush=True)
    timed = 0.0
    for step in range(1, args.warmup + args.steps + 1):
        start = time.perf_counter()
        time.sleep(step_s)
        took = time.perf_counter() - start
        print(f"step {step}: {args.batch_size / took:.1f} images/s", flush=True)
        if step > args.warmup:
            timed += took
    print(f"throughput: {args.batch_size * args.steps / timed:.1f} images/s", flush=True)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
