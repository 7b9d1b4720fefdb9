"""NGC PyTorch releases: which container release a host's driver can run.

The table is ``orchestrator/data/ngc_releases.toml``: one ``[releases."YY.MM"]`` table per
release with its ``cuda`` version, the ``min_driver`` it needs and, where known, the older driver
branches that work through CUDA forward compatibility (``forward_compat``). A release may carry
more keys than these (other tools read them); the loader ignores what it does not use.

:func:`resolve_release` picks the newest release a driver supports (``images build --driver``).
Pure apart from reading the packaged table; a malformed driver string is a
:class:`~orchestrator.errors.ConfigError` naming ``--driver``.
"""

from __future__ import annotations

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

    @property
    def base_tag(self) -> str:
        """The image tag of this release, e.g. ``24.05-py3``."""
        return f"{self.name}-py3"

    @classmethod
    def from_table(cls, name: str, table: dict[str, Any]) -> Release:
        """A release from its TOML table; keys other than the fields are ignored."""
        return cls(name, table["cuda"], table["min_driver"],
                   tuple(table.get("forward_compat", ())))


def driver_key(driver: str) -> tuple[int, ...]:
    """A driver version as a comparable tuple: ``"535.129"`` -> ``(535, 129, 0)``."""
    parts = tuple(int(p) for p in driver.split("."))
    return parts + (0,) * (3 - len(parts))


def load_releases() -> list[Release]:
    """NGC PyTorch releases from ``orchestrator/data/ngc_releases.toml``, oldest first."""
    text = resources.files("orchestrator").joinpath("data/ngc_releases.toml").read_text("utf-8")
    raw = tomllib.loads(text)["releases"]
    releases = [Release.from_table(name, table) for name, table in raw.items()]
    return sorted(releases, key=lambda r: tuple(int(p) for p in r.name.split(".")))


def resolve_release(driver: str, *, datacenter: bool = False) -> Release:
    """The newest NGC PyTorch release whose minimum driver is <= ``driver`` (e.g. "535.129.03").

    With ``datacenter=True``, releases usable through CUDA forward compatibility count too
    (the driver is at or above a listed version of the same branch). A malformed driver string
    or one older than every release is a :class:`ConfigError`.
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
        if have >= driver_key(release.min_driver):
            return release
        if datacenter and any(
            have[0] == driver_key(fc)[0] and have >= driver_key(fc)
            for fc in release.forward_compat
        ):
            return release
    oldest = releases[0]
    raise ConfigError(
        f"driver {text} is older than every known NGC PyTorch release (the oldest, "
        f"{oldest.name}, needs >= {oldest.min_driver}); upgrade the driver or set base_tag "
        "explicitly",
        file="--driver",
    )
