"""How fast is planning? Prints measured figures; claims nothing it did not measure.

    .venv/bin/python benchmarks/plan_speed.py [--runs 5]

1. `orchestrate plan matrices/v100_scaling.toml --json` as a user runs it (a fresh interpreter:
   start-up, imports, load, validate, expand, print), wall time per run.
2. The same in-process (load + validate + expand + JSON), without interpreter start-up.
3. A large synthetic matrix (5 axes, 9,000 cells) expanded in-process, per cell.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.plan.matrix import load_matrix  # noqa: E402

BIG = """
[matrix]
name = "big"
repeats = 5
[workload]
hardware = "h100"
[axes]
gpus = [1, 2, 4, 8]
batch_size = [16, 32, 64, 128, 256, 512]
precision = ["fp32", "amp", "bf16"]
arch = ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnext50_32x4d",
        "resnext101_32x4d", "wide_resnet50_2", "vgg16", "vgg19", "densenet121", "densenet169",
        "mobilenet_v2", "mobilenet_v3_large", "efficientnet_b0", "efficientnet_b4",
        "convnext_tiny", "regnet_y_8gf", "vit_b_16", "swin_t"]
mode = ["train", "infer"]
[[exclude]]
mode = "infer"
gpus = [2, 4, 8]
[hardware.h100]
device = "cuda"
"""


def timed(fn: Callable[[], object], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    matrix = ROOT / "matrices" / "v100_scaling.toml"

    def cli() -> None:
        subprocess.run([sys.executable, "-m", "orchestrator", "plan", str(matrix), "--json"],
                       check=True, capture_output=True, cwd=ROOT)

    def inproc() -> None:
        json.dumps([c.to_json() for c in load_matrix(matrix).cells])

    cli_t = timed(cli, args.runs)
    inproc()  # warm imports
    in_t = timed(inproc, args.runs)
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "big.toml"
        big.write_text(BIG)
        cells = len(load_matrix(big).cells)
        big_t = timed(lambda: load_matrix(big), max(1, args.runs // 2))
    n = len(load_matrix(matrix).cells)
    print(f"{'what':58} {'median':>10} {'min':>10}")
    print(f"{f'orchestrate plan v100_scaling --json (CLI, {n} cells)':58} "
          f"{statistics.median(cli_t):9.3f}s {min(cli_t):9.3f}s")
    print(f"{f'load+validate+expand+json in-process ({n} cells)':58} "
          f"{statistics.median(in_t) * 1e3:8.2f}ms {min(in_t) * 1e3:8.2f}ms")
    med = statistics.median(big_t)
    print(f"{f'synthetic matrix, {cells} cells, in-process':58} {med:9.3f}s {min(big_t):9.3f}s"
          f"   ({med / cells * 1e6:.1f} us/cell)")


if __name__ == "__main__":
    main()
