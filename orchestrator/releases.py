"""NGC PyTorch releases: which container release a host's driver can run.

The table is ``orchestrator/data/ngc_releases.toml`` (its header documents the keys and where
each value was checked): one ``[releases."YY.MM"]`` table per release with its ``cuda`` version,
the ``min_driver`` it needs, where known the older driver branches that work through CUDA forward
compatibility (``forward_compat``), the ``torch`` and ``torchvision`` it ships, NVIDIA's notes
(``source``) and, on releases below the workload's floor, why they are ``refused``; and the
``[floor]``: the oldest torch/torchvision pair CI proves the workload on; ``[container]``: what
every release's container ships besides torch (the profilers). This module is the one
reader of that file; :mod:`orchestrator.stacks` answers questions about the stacks it lists.

:func:`resolve_release` picks the newest offered release a driver supports (``images build
--driver``); a driver that only a refused release supports is refused with that release's reason.
Pure apart from reading the packaged table; a malformed driver string is a
:class:`~orchestrator.errors.ConfigError` naming ``--driver``.
"""

from __future__ import annotations

import functools
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from orchestrator.errors import ConfigError

_DRIVER_RE = re.compile(r"^\d+(\.\d+){0,2}$")


@dataclass(frozen=True)
class Release:
    """One NGC PyTorch container release."""

    name: str
    cuda: str
    min_driver: str
    forward_compat: tuple[str, ...] = ()
    #: ``torch.__version__`` / the torchvision series in the container (None: not recorded).
    torch: str | None = None
    torchvision: str | None = None
    #: Why the release is no longer offered, and what to pick instead (None: offered).
    refused: str | None = None
    source: str | None = None

    @property
    def base_tag(self) -> str:
        """The image tag of this release, e.g. ``24.05-py3``."""
        return f"{self.name}-py3"

    @property
    def offered(self) -> bool:
        """False for releases below the workload's floor (``refused`` says why)."""
        return self.refused is None

    @classmethod
    def from_table(cls, name: str, table: dict[str, Any]) -> Release:
        """A release from its TOML table; keys other than the fields (``verified``) are ignored."""
        return cls(name, table["cuda"], table["min_driver"],
                   tuple(table.get("forward_compat", ())), table.get("torch"),
                   table.get("torchvision"), table.get("refused"), table.get("source"))


def driver_key(driver: str) -> tuple[int, ...]:
    """A driver version as a comparable tuple: ``"535.129"`` -> ``(535, 129, 0)``."""
    parts = tuple(int(p) for p in driver.split("."))
    return parts + (0,) * (3 - len(parts))


def _table() -> dict[str, Any]:
    text = resources.files("orchestrator").joinpath("data/ngc_releases.toml").read_text("utf-8")
    return tomllib.loads(text)


def load_releases() -> list[Release]:
    """Every NGC PyTorch release of the table (refused ones too), oldest first."""
    raw = _table()["releases"]
    releases = [Release.from_table(name, table) for name, table in raw.items()]
    return sorted(releases, key=lambda r: tuple(int(p) for p in r.name.split(".")))


@functools.cache
def _by_name() -> dict[str, Release]:
    return {r.name: r for r in load_releases()}


def find_release(name: str) -> Release | None:
    """The release called ``name`` (``"23.10"`` or its tag ``"23.10-py3"``), or None."""
    return _by_name().get(name.removesuffix("-py3"))


@functools.cache
def container_profilers() -> frozenset[str]:
    """The profilers every NGC PyTorch container of the table ships (``[container]``)."""
    return frozenset(_table().get("container", {}).get("profilers", ()))


@functools.cache
def floor() -> dict[str, str]:
    """The oldest supported pair CI proves: ``{"release", "torch", "torchvision"}``."""
    return dict(_table()["floor"])


def resolve_release(driver: str, *, datacenter: bool = False) -> Release:
    """The newest offered NGC PyTorch release whose minimum driver is <= ``driver``
    (e.g. "535.129.03").

    With ``datacenter=True``, releases usable through CUDA forward compatibility count too
    (the driver is at or above a listed version of the same branch). A malformed driver string,
    one older than every release, or one that only a refused release supports (below the
    workload's floor: the message says why and what to do) is a :class:`ConfigError`.
    """
    text = driver.strip()
    if not _DRIVER_RE.match(text):
        raise ConfigError(
            f"malformed driver version {driver!r}; expected e.g. 535.129.03 "
            "(see `nvidia-smi --query-gpu=driver_version --format=csv,noheader`)",
            file="--driver",
        )
    have = driver_key(text)
    releases = load_releases()
    for release in reversed(releases):
        supported = have >= driver_key(release.min_driver) or (datacenter and any(
            have[0] == driver_key(fc)[0] and have >= driver_key(fc)
            for fc in release.forward_compat
        ))
        if supported and release.offered:
            return release
        if supported:
            raise ConfigError(
                f"driver {text} runs NGC PyTorch {release.name} at the newest, which is no "
                f"longer offered: {release.refused}; upgrade the driver"
                + ("" if datacenter else " (or, on a data-center GPU, try --datacenter)"),
                file="--driver",
            )
    oldest = releases[0]
    raise ConfigError(
        f"driver {text} is older than every known NGC PyTorch release (the oldest, "
        f"{oldest.name}, needs >= {oldest.min_driver}); upgrade the driver or set base_tag "
        "explicitly",
        file="--driver",
    )
