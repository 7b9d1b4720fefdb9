"""Container releases: which NGC PyTorch or Intel Gaudi release a host's driver can run.

The NGC table is ``orchestrator/data/ngc_releases.toml`` (its header documents the keys and where
each value was checked): one ``[releases."YY.MM"]`` table per release with its ``cuda`` version,
the ``min_driver`` it needs, where known the older driver branches that work through CUDA forward
compatibility (``forward_compat``) and the oldest GPU architecture it supports
(``min_compute_capability``), the ``torch`` and ``torchvision`` it ships, NVIDIA's notes
(``source``), where known its Ubuntu and Python, and, on releases below the workload's floor,
why they are ``refused`` for the workload (another program brings its own code and may run on
them: the seeds' own stacks, 20.03-22.06, are listed for that); and the
``[floor]``: the oldest torch/torchvision pair CI proves the workload on; ``[container]``: what
every release's container ships besides torch (the profilers). The Gaudi table is
``orchestrator/data/habana_releases.toml``: the PyTorch of each Intel Gaudi software release's
installer image. This module is the one reader of both files; :mod:`orchestrator.catalog.stacks`
answers questions about the stacks they list.

:func:`resolve_release` picks the newest offered NGC release a driver supports (``images build
--driver``, profiles with ``release = "auto"``), skipping releases that dropped the host's GPU
architecture; a driver that only a refused release supports is refused with that release's
reason. :func:`resolve_habana` picks the Gaudi installer of a host's own software version.
Pure apart from reading the packaged tables; a malformed driver string is a
:class:`~orchestrator.errors.ConfigError` naming ``--driver``.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from orchestrator.errors import ConfigError

_DRIVER_RE = re.compile(r"^\d+(\.\d+){0,2}$")
#: ``hl-smi``'s driver version: the Intel Gaudi software version and its build (``1.15.1-62f612b``).
_HABANA_DRIVER_RE = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:-[0-9A-Za-z.]+)?$")


#: What an NGC PyTorch release's image tag adds to its name (``24.05`` -> ``24.05-py3``).
_TAG_SUFFIX = "-py3"


def ngc_tag(release: str) -> str:
    """The image tag of an NGC PyTorch release: ``24.05`` -> ``24.05-py3``."""
    return f"{release}{_TAG_SUFFIX}"


def tag_release(tag: str) -> str:
    """The release an NGC PyTorch image tag names: ``24.05-py3`` -> ``24.05`` (a tag without
    the suffix, as it is). The inverse of :func:`ngc_tag`."""
    return tag.removesuffix(_TAG_SUFFIX)


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
    #: The oldest GPU architecture it supports, as its notes say (None: not recorded on this
    #: row; :func:`load_releases` fills it in from the previous release).
    min_compute_capability: str | None = None
    #: The container's Ubuntu release (``"22.04"``) and Python (``"3.10"``); None: not recorded.
    ubuntu: str | None = None
    python: str | None = None

    @property
    def base_tag(self) -> str:
        """The image tag of this release, e.g. ``24.05-py3``."""
        return ngc_tag(self.name)

    @property
    def offered(self) -> bool:
        """False for releases below the workload's floor (``refused`` says why). Such a release
        still runs other programs, which bring their own code (a ``[commands.NAME]`` cell)."""
        return self.refused is None

    @classmethod
    def from_table(cls, name: str, table: dict[str, Any]) -> Release:
        """A release from its TOML table; keys other than the fields (``verified``) are ignored."""
        return cls(name, table["cuda"], table["min_driver"],
                   tuple(table.get("forward_compat", ())), table.get("torch"),
                   table.get("torchvision"), table.get("refused"), table.get("source"),
                   table.get("min_compute_capability"), table.get("ubuntu"), table.get("python"))

    def runs_on(self, compute_capability: str | None) -> bool:
        """Whether the release supports a GPU of ``compute_capability`` (None: unknown, yes)."""
        if compute_capability is None or self.min_compute_capability is None:
            return True
        return parse_capability(compute_capability) >= parse_capability(self.min_compute_capability)

    def driver_runs(self, driver: str, *, datacenter: bool = False) -> bool:
        """Whether ``driver`` runs this release: at or above its minimum driver or, with
        ``datacenter``, at or above a forward-compatible version of the same branch."""
        have = driver_key(driver)
        return have >= driver_key(self.min_driver) or (datacenter and any(
            have[0] == driver_key(fc)[0] and have >= driver_key(fc)
            for fc in self.forward_compat
        ))


def parse_capability(text: str) -> tuple[int, int]:
    """A compute capability's text as numbers: ``"9.0"`` -> ``(9, 0)`` (``"9"``: ``(9, 0)``)."""
    major, _, minor = text.partition(".")
    return int(major), int(minor or 0)


def driver_key(driver: str) -> tuple[int, ...]:
    """A driver version as a comparable tuple: ``"535.129"`` -> ``(535, 129, 0)``."""
    parts = tuple(int(p) for p in driver.split("."))
    return parts + (0,) * (3 - len(parts))


@functools.cache
def _table() -> dict[str, Any]:
    """``data/ngc_releases.toml``, parsed once per process (callers only read it)."""
    text = resources.files("orchestrator").joinpath("data/ngc_releases.toml").read_text("utf-8")
    return tomllib.loads(text)


@functools.cache
def _releases() -> tuple[Release, ...]:
    raw = _table()["releases"]
    releases = [Release.from_table(name, table) for name, table in raw.items()]
    releases.sort(key=lambda r: tuple(int(p) for p in r.name.split(".")))
    inherited: str | None = None
    for i, release in enumerate(releases):
        if release.min_compute_capability is None and inherited is not None:
            releases[i] = dataclasses.replace(release, min_compute_capability=inherited)
        inherited = releases[i].min_compute_capability
    return tuple(releases)


def load_releases() -> list[Release]:
    """Every NGC PyTorch release of the table (refused ones too), oldest first; a release
    without ``min_compute_capability`` carries the previous release's."""
    return list(_releases())


@functools.cache
def _by_name() -> dict[str, Release]:
    return {r.name: r for r in _releases()}


def find_release(name: str) -> Release | None:
    """The release called ``name`` (``"23.10"`` or its tag ``"23.10-py3"``), or None."""
    return _by_name().get(tag_release(name))


@functools.cache
def container_profilers() -> frozenset[str]:
    """The profilers every NGC PyTorch container of the table ships (``[container]``)."""
    return frozenset(_table().get("container", {}).get("profilers", ()))


@functools.cache
def floor() -> dict[str, str]:
    """The oldest supported pair CI proves: ``{"release", "torch", "torchvision"}``."""
    return dict(_table()["floor"])


def check_driver(driver: str, what: str = "--driver") -> str:
    """``driver`` stripped, or a :class:`ConfigError` naming ``what`` if it is not a driver
    version such as ``535.129.03``."""
    text = driver.strip()
    if not _DRIVER_RE.match(text):
        raise ConfigError(
            f"malformed driver version {driver!r}; expected e.g. 535.129.03 "
            "(see `nvidia-smi --query-gpu=driver_version --format=csv,noheader`)",
            file=what,
        )
    return text


def resolve_release(
    driver: str, *, datacenter: bool = False, compute_capability: str | None = None,
    what: str = "--driver",
) -> Release:
    """The newest offered NGC PyTorch release whose minimum driver is <= ``driver``
    (e.g. "535.129.03") and that supports a GPU of ``compute_capability`` (None: unknown, not
    filtered).

    With ``datacenter=True``, releases usable through CUDA forward compatibility count too
    (the driver is at or above a listed version of the same branch). A malformed driver string,
    one older than every release, or one that only a refused release supports (below the
    workload's floor: the message says why and what to do) is a :class:`ConfigError` naming
    ``what`` (the flag or field the driver came from).
    """
    text = check_driver(driver, what)
    releases = [r for r in load_releases() if r.runs_on(compute_capability)]
    for release in reversed(releases):
        supported = release.driver_runs(text, datacenter=datacenter)
        if supported and release.offered:
            return release
        if supported:
            raise ConfigError(
                f"driver {text} runs NGC PyTorch {release.name} at the newest, which is no "
                f"longer offered: {release.refused}; upgrade the driver"
                + ("" if datacenter else " (or, on a data-center GPU, try --datacenter)"),
                file=what,
            )
    oldest = releases[0] if releases else load_releases()[0]
    gpu = (f" for a GPU of compute capability {compute_capability}"
           if compute_capability is not None and len(releases) < len(load_releases()) else "")
    raise ConfigError(
        f"driver {text} is older than every known NGC PyTorch release{gpu} (the oldest, "
        f"{oldest.name}, needs >= {oldest.min_driver}); upgrade the driver or set base_tag "
        "explicitly",
        file=what,
    )


# --- Intel Gaudi ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class HabanaRelease:
    """One Intel Gaudi software series (``1.18``) and the PyTorch of its installer image."""

    name: str
    torch: str
    source: str | None = None


@functools.cache
def load_habana_releases() -> tuple[HabanaRelease, ...]:
    """Every Intel Gaudi release of ``data/habana_releases.toml``, oldest first."""
    text = resources.files("orchestrator").joinpath("data/habana_releases.toml").read_text(
        "utf-8")
    raw = tomllib.loads(text)["releases"]
    found = [HabanaRelease(name, row["torch"], row.get("source")) for name, row in raw.items()]
    return tuple(sorted(found, key=lambda r: tuple(int(p) for p in r.name.split("."))))


def habana_version(driver: str, what: str = "--driver") -> str:
    """The Intel Gaudi software version of an ``hl-smi`` driver version: ``"1.15.1-62f612b"``
    -> ``"1.15.1"``; a :class:`ConfigError` naming ``what`` if it is not one."""
    match = _HABANA_DRIVER_RE.match(driver.strip())
    if match is None or int(match[1]) >= 100:  # NVIDIA's branches are 3-digit (535, 550, ...)
        nvidia = " (that is an NVIDIA driver version)" if match is not None else ""
        raise ConfigError(
            f"not an Intel Gaudi driver version: {driver!r}{nvidia}; the habana template takes "
            "the Gaudi software version, e.g. 1.18.0-524 (see `hl-smi -Q driver_version -f "
            "csv,noheader`)", file=what)
    return ".".join(match.groups())


def resolve_habana(driver: str, what: str = "--driver") -> tuple[str, HabanaRelease]:
    """``(software version, release)`` of the installer image for a host whose ``hl-smi``
    reports ``driver``: the same Intel Gaudi software version. A series not in the table is a
    :class:`ConfigError` saying what to set instead."""
    version = habana_version(driver, what)
    series = ".".join(version.split(".")[:2])
    for release in load_habana_releases():
        if release.name == series:
            return version, release
    known = ", ".join(r.name for r in load_habana_releases())
    raise ConfigError(
        f"Intel Gaudi software {version} (driver {driver.strip()}) is not in "
        f"orchestrator/data/habana_releases.toml (known series: {known}); set synapse_version "
        "and torch_version of the habana template explicitly", file=what)
