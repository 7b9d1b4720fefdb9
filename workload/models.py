"""Model construction by torchvision name, with offline-only pretrained weights."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import torch
import torchvision
from torch import nn

from workload.errors import ArchError, ConfigError, WeightsError


def classification_archs() -> list[str]:
    """Names of torchvision's classification models (``torchvision.models.get_model`` names)."""
    return sorted(torchvision.models.list_models(module=torchvision.models))


def check_arch(arch: str) -> None:
    """Raise ArchError unless ``arch`` is a torchvision classification model."""
    known = classification_archs()
    if arch in known:
        return
    close = difflib.get_close_matches(arch, known, n=4)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise ArchError(
        f"unknown --arch {arch!r}: not a torchvision classification model; {hint}"
        f"known: {', '.join(known)}"
    )


def default_checkpoint_dir() -> Path:
    """torchvision's download cache: ``$TORCH_HOME/hub/checkpoints`` (default ~/.cache/torch)."""
    return Path(torch.hub.get_dir()) / "checkpoints"


def weights_filename(arch: str) -> str:
    """The file name torchvision stores ``arch``'s DEFAULT weights under (the URL's basename)."""
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
        state = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    except Exception as exc:
        raise WeightsError(f"could not load pretrained weights {path}: {exc}") from exc
    return model
