"""Logs in the seed experiments' own formats, written from known numbers (for the parsers' and
the oracles' tests). Each writer is ours; it prints what the seed's program prints, as its
source shows (cited per writer), so the seeds' own analysis scripts can read the result.

* :func:`dlperf_examples_log` — pytorch/examples' ``ProgressMeter`` lines (old DLE ``main.py``):
  ``Epoch: [0][ 6/53]\\tTime  0.403 ( 2.123)\\tData ...`` (``AverageMeter`` ``:6.3f``);
* :func:`dlperf_dllogger_log` — DLE ``main.py`` with DLLogger's ``StdOutBackend`` and DLE's
  ``format_step``: ``DLL 2020-08-28 10:11:12.123456 - Epoch: 0 Iteration: 7  train.loss : ...``;
* :func:`ncu_csv` — ``ncu --csv`` (details page): one row per kernel and metric, after the
  program's output and ncu's ``==PROF==`` lines;
* :func:`iteration_duration_log` — seed 002's ``engine.py``: every rank prints ``Iteration
  Duration <n> <device> : <seconds>`` (with blank lines and tqdm noise between);
* :func:`habana_log` — Model-References ``train.py``'s ``MetricLogger`` lines.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path


def dlperf_examples_log(times: Sequence[float], *, epoch: int = 0, per_epoch: int = 0,
                        seed: int = 0) -> str:
    """pytorch/examples-style training lines, one per iteration (index from 0), ``Time`` =
    ``times[i]`` and its running mean."""
    rng = random.Random(seed)
    n = per_epoch or len(times)
    width = len(str(n))
    lines = ["=> creating model 'resnet50'", "=> using DALI CPU pipeline"]
    total = 0.0
    for i, t in enumerate(times):
        total += t
        data = rng.uniform(0.0005, 0.003)
        lines.append(
            f"Epoch: [{epoch}][{i:>{width}}/{n}]\tTime {t:6.3f} ({total / (i + 1):6.3f})\t"
            f"Data {data:6.3f} ({data:6.3f})\tLoss {6.9 - i * 1e-3:.4e} ({6.9:.4e})\t"
            f"Acc@1 {rng.uniform(0, 1):6.2f} ({0.1:6.2f})\tAcc@5 {rng.uniform(0, 2):6.2f} "
            f"({0.5:6.2f})")
    return "\n".join(lines) + "\n"


def dlperf_dllogger_log(times: Sequence[float], start: datetime, *, global_batch: int,
                        seed: int = 0) -> str:
    """DLE ``main.py`` stdout through DLLogger (``--print-freq 1``): a PARAMETER line, one line
    per iteration (numbered from 1) timestamped when the iteration ends, then the run summary."""
    rng = random.Random(seed)
    lines = [f"DLL {start} - PARAMETER arch : resnet50  batch_size : {global_batch}  "]
    now = start
    for i, t in enumerate(times, start=1):
        now += timedelta(seconds=t)
        lines.append(f"DLL {now} - Epoch: 0 Iteration: {i}  train.loss : "
                     f"{6.9 - i * 1e-3:.5f}  train.total_ips : {global_batch / t:.2f} img/s")
        if rng.random() < 0.05:
            lines.append("some warning the program printed")
    lines.append(f"DLL {now} - Epoch: 0  train.loss : 6.80000  train.total_ips : 1.00 img/s")
    lines.append(f"DLL {now} - Summary: train.loss : 6.80000  train.total_ips : 1.00 img/s")
    return "\n".join(lines) + "\n"


NCU_HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Kernel Time",'
              '"Context","Stream","Section Name","Metric Name","Metric Unit","Metric Value"')


def ncu_csv(kernels: Sequence[Mapping[str, float]], *, thousands: bool = False) -> str:
    """``ncu --csv`` output for ``kernels`` (each a metric -> value mapping), IDs from 0, after
    some program output and ncu's connection lines."""
    out = ["I0318 12:00:00.000 training started", '==PROF== Connected to process 4242 (python3)',
           "==PROF== Profiling \"volta_scudnn_128x64_relu\": 0%....50%....100% - 5 passes",
           "==PROF== Disconnected from process 4242", NCU_HEADER]
    for ident, metrics in enumerate(kernels):
        for name, value in metrics.items():
            unit = "cycle" if name.startswith("gpc__") else "%"
            text = f"{value:,.0f}" if thousands and unit == "cycle" else (
                f"{value:.0f}" if unit == "cycle" else f"{value:.2f}")
            out.append(",".join(f'"{v}"' for v in (
                ident, 4242, "python3", "127.0.0.1", f"kernel_{ident % 7}", "2021-Mar-18 "
                "12:00:00", 1, 7, "Command line profiler metrics", name, unit, text)))
    return "\n".join(out) + "\n"


def iteration_duration_log(series: Mapping[int, Sequence[float]], seed: int = 0) -> str:
    """Seed 002's iteration log: every device's lines, interleaved as four ranks print them."""
    rng = random.Random(seed)
    pending = {d: list(enumerate(ts)) for d, ts in series.items()}
    out = ["Launching torch.distributed: nproc_per_node=4, nnodes=1, local_rank=, "
           "using_mvapich=false"]
    while any(pending.values()):
        device = rng.choice([d for d, left in pending.items() if left])
        i, t = pending[device].pop(0)
        out += ["", f"Iteration Duration {i} {device} : {t!r}"]
        if rng.random() < 0.02:
            out.append("Epoch   1/  1:  10%|#         | 500/5005 [01:00<09:00,  8.33it/s]")
    return "\n".join(out) + "\n"


def habana_log(img_per_s: Sequence[float], total_steps: int = 5005) -> str:
    """Model-References train.py (1.6.1): MetricLogger lines of the main process."""
    lines = ["Namespace(batch_size=256, device='hpu', model='resnet50', ...)"]
    width = len(str(total_steps))
    for i, v in enumerate(img_per_s):
        lines.append(f"Epoch: [0]  [{i:>{width}}/{total_steps}]  eta: 1:00:00  lr: 0.1  "
                     f"img/s: {v}  loss: 6.9000 (6.9000)  acc1: 0.0000 (0.0000)  acc5: 0.3906 "
                     "(0.3906)  time: 0.4000  data: 0.0100  max mem: 12345")
    lines.append("Epoch: [0] Total time: 0:10:00")
    return "\n".join(lines) + "\n"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
