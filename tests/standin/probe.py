"""A tiny program for the Apptainer-path tests: says what it sees from inside the "container".

Writes ``probe-rank<RANK>.json`` (its environment's GPU, rank and marker variables, the SHA-256
of the secret, its working directory and host, whether each ``--check`` path exists) into
``--out``, prints one line the tests' regex figures read (``probe images/s: 100.0``), then sleeps
``--sleep`` seconds (timeout and cancel tests). Stdlib only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import time

KEYS = ("CUDA_VISIBLE_DEVICES", "RANK", "LOCAL_RANK", "WORLD_SIZE", "PUBLIC_VAR", "TRICKY_VAR",
        "ORCHESTRATE_CELL", "PYTHONUNBUFFERED")
#: A secret the test passes: recorded as its SHA-256 only (the test checks no file holds it).
SECRET_KEY = "PROBE_TOKEN"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--check", action="append", default=[])
    args = parser.parse_args()
    rank = os.environ.get("RANK", "0")
    seen = {
        "env": {k: os.environ.get(k) for k in KEYS},
        "secret_sha256": hashlib.sha256(os.environ.get(SECRET_KEY, "").encode()).hexdigest(),
        "env_names": sorted(os.environ),
        "cwd": os.getcwd(),
        "host": socket.gethostname(),
        "exists": {p: os.path.exists(p) for p in args.check},
    }
    with open(os.path.join(args.out, f"probe-rank{rank}.json"), "w", encoding="utf-8") as fh:
        json.dump(seen, fh)
    if rank == "0":
        print("probe images/s: 100.0", flush=True)
    time.sleep(args.sleep)


if __name__ == "__main__":
    main()
