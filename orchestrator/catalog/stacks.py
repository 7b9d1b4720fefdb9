"""Software stacks as data: which torch/torchvision a release ships and what that stack can run.

Never imports torch (the controller may have none). The releases, their torch/torchvision and
the ``[floor]`` of the workload's supported range come from :mod:`orchestrator.catalog.releases`
(the one
reader of ``data/ngc_releases.toml``); ``data/torchvision_models.toml`` lists the classification
models per torchvision version and the models the workload builds itself (DeepLearningExamples'
ResNeXt variants).

Rules: pure functions over those files (read once, cached); versions are compared by their
release numbers, so NGC's pre-releases (``2.1.0a0+32f93b1``) count as their series (``2.1``):
the floor is a series.  Feature facts here are only those a version number settles for sure
(:data:`FEATURES`); everything else the workload decides at run time by feature detection
(``workload/compat.py``) and records in the result's ``env.api``.
"""

from __future__ import annotations

import functools
import re
import tomllib
from importlib import resources
from typing import Any

from orchestrator.catalog.releases import floor

__all__ = ["arch_available", "archs", "feature_missing", "floor", "known_archs",
           "model_range", "parse_version", "series", "workload_archs"]

_VERSION_RE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?(?:(a|b|rc)\d+)?(?:\+[0-9A-Za-z.]+)?$")

#: Features a matrix may ask for and the first torch series that has them.
FEATURES: dict[str, tuple[int, int]] = {"compile": (2, 0)}


def parse_version(text: str) -> tuple[int, int, int]:
    """``"2.1.0a0+32f93b1"`` -> ``(2, 1, 0)``; ``"0.16"`` -> ``(0, 16, 0)``.

    Raises ValueError for anything that is not a (pre-)release version number.
    """
    match = _VERSION_RE.match(text.strip())
    if match is None:
        raise ValueError(f"not a version number: {text!r} (expected e.g. 2.1.0 or 2.1.0a0+abc)")
    return int(match[1]), int(match[2]), int(match[3] or 0)


def series(text: str) -> tuple[int, int]:
    """The release series of a version: ``"2.1.0a0+32f93b1"`` -> ``(2, 1)``."""
    major, minor, _ = parse_version(text)
    return major, minor


def feature_missing(feature: str, torch_version: str) -> str | None:
    """Why ``feature`` cannot run on ``torch_version``, or None when it can (or is unknown)."""
    need = FEATURES.get(feature)
    if need is None or series(torch_version) >= need:
        return None
    return f"{feature} needs torch >= {need[0]}.{need[1]}; this stack has torch {torch_version}"


@functools.cache
def _models() -> dict[str, Any]:
    text = resources.files("orchestrator").joinpath("data/torchvision_models.toml").read_text(
        "utf-8")
    return tomllib.loads(text)


def workload_archs() -> dict[str, str]:
    """Models the workload builds itself: ``--arch`` name -> DeepLearningExamples' name."""
    return dict(_models()["workload"])


def archs(torchvision_version: str) -> list[str]:
    """Every ``--arch`` the workload can build with this torchvision, sorted (below the floor
    nothing is recorded: the list is empty)."""
    return list(_archs(series(torchvision_version)))


@functools.cache
def _archs(have: tuple[int, int]) -> tuple[str, ...]:
    """:func:`archs` of a torchvision series, worked out once (checks ask per configuration)."""
    names = {name for name, since in _models()["torchvision"].items() if series(since) <= have}
    if have >= series(floor()["torchvision"]):
        names |= set(workload_archs())
    return tuple(sorted(names))


def model_range() -> tuple[str, str]:
    """The torchvision versions the model table covers: (floor, newest)."""
    table = _models()["range"]
    return table["floor"], table["newest"]


def known_archs() -> list[str]:
    """Every ``--arch`` some supported torchvision (floor..newest) can build, sorted."""
    return archs(model_range()[1])


def arch_available(arch: str, torchvision_version: str) -> bool:
    """Whether the workload can build ``arch`` on this torchvision."""
    return arch in _archs(series(torchvision_version))
