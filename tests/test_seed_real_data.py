"""Real data, the way the seed programs read it: a generated ImageFolder of real JPEG files
(``python -m workload.make_dataset``; ImageNet's layout: ``train/<class>/*.jpg``,
``val/<class>/*.jpg``) through DeepLearningExamples' own data loaders (the ConvNets snapshot in
the peers folder, which seeds 000 and 003 run) and through our workload's, on the CPU.

What cannot run here, said so:

* DLE's ``PrefetchedWrapper`` moves every batch to the GPU on a CUDA stream: the test reads the
  ``torch.utils.data.DataLoader`` inside it (DLE's ImageFolder, transforms and ``fast_collate``,
  its workers), which is where the files are read and decoded;
* DALI (``--data-backend dali-cpu``, DLE's default in seed 000's snapshot and seed 003's flag)
  does not install here: the package index serves only NVIDIA's stub, which downloads the wheel
  from NVIDIA's own index (no network to it), and DLE's DALI pipelines end in a GPU operator
  (``CropMirrorNormalize(device="gpu")``) even for dali-cpu, so they need a GPU anyway. DALI reads
  the same folder layout (its FileReader labels by sub-folder, sorted).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from service_support import unavailable

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve()


def dle_dir() -> Path:
    for base in (os.environ.get("ORCHESTRATE_PEERS"), HERE.parents[2] / "shared" / "peers",
                 "/work/shared/peers"):
        if base and (Path(base) / "dle-convnets" / "image_classification").is_dir():
            return Path(base) / "dle-convnets"
    unavailable("no peers folder with dle-convnets (set ORCHESTRATE_PEERS)")
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def imagenet_like(tmp_path_factory: pytest.TempPathFactory, torch: Any) -> Path:
    from workload.make_dataset import make_dataset  # (imports torch)

    root = tmp_path_factory.mktemp("imagenet")
    make_dataset(root / "train", classes=3, per_class=6, size=80, seed=1)
    make_dataset(root / "val", classes=3, per_class=2, size=80, seed=2)
    return root


def dle_dataloaders(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """DLE's ``image_classification.dataloaders``, imported from the peers snapshot.

    The module defines its DALI pipeline classes at import (``class HybridTrainPipe(Pipeline)``)
    and fails with a NameError without DALI, which cannot be installed here: an empty stand-in
    ``nvidia.dali`` (a base class and empty modules, nothing that runs) lets it import; the test
    then uses only the PyTorch loaders, which never touch DALI."""
    stand_in = {name: ModuleType(name) for name in (
        "nvidia", "nvidia.dali", "nvidia.dali.plugin", "nvidia.dali.plugin.pytorch",
        "nvidia.dali.pipeline", "nvidia.dali.ops", "nvidia.dali.types")}
    stand_in["nvidia.dali.pipeline"].Pipeline = type("Pipeline", (), {})  # type: ignore[attr-defined]
    stand_in["nvidia.dali.plugin.pytorch"].DALIClassificationIterator = object  # type: ignore[attr-defined]
    if importlib.util.find_spec("nvidia.dali") is None:
        for name, module in stand_in.items():
            if name == "nvidia" and importlib.util.find_spec("nvidia") is not None:
                continue  # the CUDA libraries' namespace package: keep it
            monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.syspath_prepend(str(dle_dir()))
    for name in [m for m in sys.modules if m.startswith("image_classification")]:
        monkeypatch.delitem(sys.modules, name)
    return importlib.import_module("image_classification.dataloaders")


def test_dle_pytorch_loaders_read_real_jpegs(imagenet_like: Path, torch: Any,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    loaders = dle_dataloaders(monkeypatch)
    train, steps = loaders.get_pytorch_train_loader(
        str(imagenet_like), 64, 4, 1000, False, workers=1,
        memory_format=torch.channels_last)
    assert steps == 18 // 4  # drop_last: 18 images, batch 4
    images, labels = next(iter(train.dataloader))  # the CPU part of DLE's pipeline
    assert images.dtype == torch.uint8 and tuple(images.shape) == (4, 3, 64, 64)
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert set(labels.tolist()) <= {0, 1, 2} and images.float().std() > 1.0  # real pixels
    val, val_steps = loaders.get_pytorch_val_loader(str(imagenet_like), 64, 2, 1000, False,
                                                    workers=1)
    images, labels = next(iter(val.dataloader))
    assert tuple(images.shape) == (2, 3, 64, 64) and val_steps == 3
    assert sorted(val.dataloader.dataset.classes) == ["class_000", "class_001", "class_002"]


def test_our_workload_trains_on_the_same_folder(imagenet_like: Path, tmp_path: Path,
                                                workload_python: str) -> None:
    """Our workload's loader on the same ImageFolder (its train/ split): decoded JPEGs, a real
    training step, the data path and decoder recorded."""
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [workload_python, "-m", "workload", "--arch", "resnet18", "--image-size", "64",
         "--batch-size", "4", "--warmup", "1", "--iterations", "2", "--device", "cpu",
         "--data", str(imagenet_like / "train"), "--workers", "1", "--output-dir", str(out)],
        capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["data"]["train.total_ips"] > 0
    assert summary["env"]["data"] == str(imagenet_like / "train")
    assert summary["env"]["decoder"] != "synthetic"


def test_the_benchmarks_dle_compat_path_runs_dle_on_todays_stack(workload_python: str) -> None:
    """benchmarks/dle_nodali, which workload_vs_dle.py puts on DLE's path: without it, DLE's
    dataloaders fail at import without DALI and its --evaluate logger on NumPy 2 (both seen on
    the H100, 2026-11-25); with it, both work, unchanged DLE code."""
    code = ("from image_classification import dataloaders\n"
            "from image_classification.logger import QuantileMeter\n"
            "m = QuantileMeter(0.5); m.record([3.0, 1.0, 2.0]); print(float(m.get_val()[0]))\n")
    dllogger = dle_dir().parents[0] / "dllogger"
    base = [str(dle_dir()), str(dllogger)]
    runs = {}
    for name, path in (("without", base), ("with", [*base, str(ROOT / "benchmarks" /
                                                              "dle_nodali")])):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        runs[name] = subprocess.run([workload_python, "-c", code], capture_output=True,
                                    text=True, env=env, cwd=dle_dir(), timeout=300)
    # here (no DALI; NumPy 2): DLE fails without the compat path, on one of the two
    assert runs["without"].returncode != 0
    assert "'Pipeline' is not defined" in runs["without"].stderr or \
        "'interpolation'" in runs["without"].stderr
    assert runs["with"].returncode == 0, runs["with"].stderr[-2000:]
    assert runs["with"].stdout.split()[-1] == "2.0"
