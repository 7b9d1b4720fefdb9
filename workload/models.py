"""Model construction by name, with offline-only pretrained weights.

The names are torchvision's classification models plus the DeepLearningExamples ConvNets that
torchvision lacks (:mod:`workload.dle_models`: ``resnext101_32x4d``, ``se_resnext101_32x4d``).
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import torch
import torchvision
from torch import nn

from workload import compat
from workload.dle_models import BUILDERS, DLE_NAMES
from workload.errors import ArchError, ConfigError, WeightsError


def torchvision_archs() -> list[str]:
    """Names of torchvision's classification models (``torchvision.models.get_model`` names)."""
    return sorted(torchvision.models.list_models(module=torchvision.models))


def classification_archs() -> list[str]:
    """Every ``--arch`` the workload builds: torchvision's models and :mod:`dle_models`'."""
    return sorted({*torchvision_archs(), *BUILDERS})


def check_arch(arch: str) -> None:
    """Raise ArchError unless the workload can build ``arch``."""
    known = classification_archs()
    if arch in known:
        return
    close = difflib.get_close_matches(arch, known, n=4)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise ArchError(
        f"unknown --arch {arch!r}: not a torchvision classification model nor one of "
        f"DeepLearningExamples' ({', '.join(sorted(BUILDERS))}); {hint}"
        f"known: {', '.join(known)}"
    )


def default_checkpoint_dir() -> Path:
    """torchvision's download cache: ``$TORCH_HOME/hub/checkpoints`` (default ~/.cache/torch)."""
    return Path(torch.hub.get_dir()) / "checkpoints"


def weights_filename(arch: str) -> str:
    """The file name torchvision stores ``arch``'s DEFAULT weights under (the URL's basename)."""
    if arch in BUILDERS:
        raise WeightsError(
            f"--pretrained {arch}: torchvision has no weights for DeepLearningExamples' "
            f"{DLE_NAMES[arch]} (NVIDIA's NGC checkpoint is not supported here); "
            "run it without --pretrained (the benchmark does not need trained weights)"
        )
    try:
        weights = torchvision.models.get_model_weights(arch).DEFAULT
    except Exception as exc:
        raise WeightsError(f"torchvision has no pretrained weights for --arch {arch}") from exc
    return os.path.basename(weights.url)


def build_model(
    arch: str, num_classes: int, pretrained: bool, checkpoint_dir: str | None
) -> nn.Module:
    """Build ``arch``; with ``pretrained`` load the weights file from ``checkpoint_dir``.

    Weights are never downloaded: the run has no network. A missing file is a WeightsError
    that names the file and the directory.
    """
    check_arch(arch)
    if not pretrained:
        if arch in BUILDERS:
            return BUILDERS[arch](num_classes)
        return torchvision.models.get_model(arch, weights=None, num_classes=num_classes)
    directory = Path(checkpoint_dir) if checkpoint_dir else default_checkpoint_dir()
    filename = weights_filename(arch)
    path = directory / filename
    if not path.is_file():
        raise WeightsError(
            f"pretrained weights for {arch} not found: expected file {filename} in checkpoint "
            f"dir {directory}. Weights are never downloaded at run time; copy the file there "
            "(e.g. from a machine with network: torchvision.models.get_model("
            f"'{arch}', weights='DEFAULT') caches it in ~/.cache/torch/hub/checkpoints) "
            "or pass --checkpoint-dir DIR"
        )
    categories = torchvision.models.get_model_weights(arch).DEFAULT.meta.get("categories")
    if categories is not None and num_classes != len(categories):
        raise ConfigError(
            f"--pretrained {arch} weights have {len(categories)} classes but --num-classes is "
            f"{num_classes}; use --num-classes {len(categories)}"
        )
    model = torchvision.models.get_model(arch, weights=None, num_classes=num_classes)
    try:
        state = compat.weights_loader()(path, map_location="cpu")
        model.load_state_dict(state)
    except Exception as exc:
        raise WeightsError(f"could not load pretrained weights {path}: {exc}") from exc
    return model
