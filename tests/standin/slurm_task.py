"""A cell program for the Slurm array tests: says when and where it ran, then ends as told.

Writes ``task.json`` into ``--out``: its host, Slurm's job, array and node variables, and the
wall-clock times it started and ended (every node shares this machine's clock, so the tests
count how many tasks ran at once from them). Prints one line the tests' regex figures read
(``task images/s: 1.0``), sleeps ``--sleep`` seconds, and exits with ``--exit`` when ``--seed``
equals ``--fail-seed`` (a task that fails), else 0. Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

SLURM_KEYS = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_NODELIST",
              "SLURM_NODEID", "CUDA_VISIBLE_DEVICES")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fail-seed", type=int, default=-1)
    parser.add_argument("--exit", type=int, default=3)
    args = parser.parse_args()
    started = time.time()
    print("task images/s: 1.0", flush=True)
    time.sleep(args.sleep)
    record = {"host": socket.gethostname(), "started": started, "ended": time.time(),
              "env": {k: os.environ.get(k) for k in SLURM_KEYS}}
    with open(os.path.join(args.out, "task.json"), "w", encoding="utf-8") as fh:
        json.dump(record, fh)
    if args.seed == args.fail_seed:
        print(f"task: seed {args.seed} fails on purpose", file=sys.stderr, flush=True)
        sys.exit(args.exit)


if __name__ == "__main__":
    main()
