"""Which image a cell runs, on which host: its profile's template and variables, with the release
the cell pins, the profile names, or the host's driver picks.

Rules (the docker and ssh backends, ``orchestrate images refresh`` and ``validate`` follow them):

* A profile's image variables are its ``image_vars``; a relative path of a file variable (a
  client .deb) is taken from the matrix file's folder (:func:`profile_image_vars`).
* The release *family* of a template is what its variables name: NGC PyTorch when it has
  ``base_tag`` (``ngc-pytorch``, ``bitfusion`` through its parent, ``singularity``), Intel Gaudi
  when it has ``synapse_version`` and ``torch_version`` (``habana``), none otherwise.
* A cell's ``ngc_release = "YY.MM"`` sets ``base_tag = "YY.MM-py3"``: the release is an axis.
* A profile's ``release = "auto"`` leaves the release to each host's driver
  (:class:`HostDriver`): NGC, the newest offered release of ``data/ngc_releases.toml`` the driver
  runs (``forward_compat = true``: also through CUDA forward compatibility) that still supports
  the host's oldest GPU; Gaudi, the installer of the host's own Intel Gaudi software version.
  A host whose driver is unknown or too old cannot run the profile (:class:`NoRelease`, naming
  the host and what to do); the other hosts still do.
* Otherwise the profile's own variables name the release (``base_tag``, or ``synapse_version``).

Cells with equal :class:`ImageKey` share one image; "auto" keys carry the host. Pure: no engine, no
SSH (host facts come in as values).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.catalog import gpus, releases, templates
from orchestrator.config.syntax import RELEASE_PARAM
from orchestrator.errors import ConfigError, Problem, Requirement

if TYPE_CHECKING:
    from orchestrator.config.inventory import Inventory
    from orchestrator.plan.matrix import Cell, Matrix

log = logging.getLogger(__name__)

AUTO = "auto"
#: What the families are called in tables and messages.
FAMILY_LABEL = {"ngc": "NGC PyTorch", "habana": "Intel Gaudi"}


class NoRelease(ConfigError):
    """No release of a profile's family runs on a host (its driver is unknown or too old)."""

    def __init__(self, host: str, hardware: str, why: str, file: str = ""):
        self.host = host
        self.hardware = hardware
        self.why = why
        super().__init__([Requirement(file, f"hardware.{hardware}.release",
                                      f"host {host}: {why}", kind="driver")])


@dataclass(frozen=True)
class HostDriver:
    """What decides a host's release: its accelerator driver and GPUs (None: unknown)."""

    name: str
    driver: str | None = None
    accelerator: str | None = None  # "nvidia", "gaudi" or None
    #: The compute capability of its oldest GPU (what a release must still support).
    compute_capability: str | None = None

    @classmethod
    def from_facts(cls, facts: gpus.HostFacts) -> HostDriver:
        """The driver facts of a probed host (:func:`orchestrator.catalog.gpus.probe`)."""
        found = [gpus.compute_capability(g.model) for g in facts.gpus]
        known = [c for c in found if c is not None]
        oldest = min(known, key=lambda c: tuple(int(p) for p in c.split("."))) if known else None
        return cls(facts.name, facts.driver, facts.accelerator, oldest)


@dataclass(frozen=True)
class ImageKey:
    """Which image a cell needs: its profile, the release it pins, and (auto) the host."""

    hardware: str
    ngc_release: str | None = None
    host: str | None = None


@dataclass(frozen=True)
class ImageChoice:
    """The template variables of one image and the release they stand for."""

    hardware: str
    template: str
    values: dict[str, Any]
    #: ``"24.05"`` (NGC), ``"1.18.0"`` (Intel Gaudi software); None when not known (a
    #: base_image of the lab's own).
    release: str | None
    family: str | None
    #: How the release was decided: "auto" (the host's driver), "axis" (the cell's ngc_release)
    #: or "profile" (the profile's image_vars).
    how: str
    driver: str | None = None
    #: For people: why this release (``driver 550.54.15 runs NGC PyTorch 24.05 at the newest``).
    reason: str = ""

    @property
    def label(self) -> str:
        """``NGC PyTorch 24.05``, ``Intel Gaudi 1.18.0``, or the template when unknown."""
        if self.release is None or self.family is None:
            return f"{self.template} (release not known)"
        return f"{FAMILY_LABEL[self.family]} {self.release}"


def family(template: templates.Template) -> str | None:
    """The release family a template's variables name: ``ngc``, ``habana`` or None."""
    names = set(template.variables)
    if "base_tag" in names:
        return "ngc"
    if {"synapse_version", "torch_version"} <= names:
        return "habana"
    return None


def fixed_base(template: templates.Template, values: dict[str, Any]) -> list[str]:
    """The variables of ``values`` that fix ``template``'s base image, leaving no release to
    choose: a full ``base_image``, a parent image given outright, the release variables."""
    names = ["base_image", "base_tag", "synapse_version", "torch_version"]
    if template.parent is not None:
        names.insert(0, template.parent.variable)
    return [v for v in names if values.get(v) and v in template.variables]


def profile_image_vars(matrix: Matrix, hardware: str) -> dict[str, Any]:
    """A profile's image variables; relative paths of file variables (a client .deb, a CA
    certificate) are taken relative to the matrix file's folder, not the current directory."""
    profile = matrix.profiles[hardware]
    values = dict(profile.image_vars)
    if profile.image is None:
        return values
    for name, var in templates.load_template(profile.image).variables.items():
        value = values.get(name)
        if var.file and isinstance(value, str) and value:
            path = Path(value).expanduser()
            if not path.is_absolute():
                values[name] = str((matrix.path.parent / path).resolve())
    return values


def is_auto(matrix: Matrix, hardware: str) -> bool:
    """Whether a profile's release is decided per host (``release = "auto"``)."""
    return matrix.profiles[hardware].release == AUTO


def host_key(matrix: Matrix, key: ImageKey, host: str | None) -> ImageKey:
    """``key`` on ``host``: it carries the host where the profile's release is auto and the key
    pins none (each host's driver picks its image); otherwise it is host-free."""
    auto = is_auto(matrix, key.hardware) and key.ngc_release is None
    return ImageKey(key.hardware, key.ngc_release, host if auto else None)


def image_key(matrix: Matrix, cell: Cell, host: str | None = None) -> ImageKey:
    """The key of the image ``cell`` runs (on ``host``, where the profile's release is auto)."""
    return host_key(matrix, ImageKey(cell.hardware, cell.params.ngc_release), host)


def needed_keys(matrix: Matrix, cells: Iterable[Cell]) -> list[ImageKey]:
    """The host-free keys of every image the cells need, sorted (auto keys get their host
    later)."""
    pinned = {(cell.hardware, cell.params.ngc_release) for cell in cells}  # a few, of many
    keys = {host_key(matrix, ImageKey(hardware, release), None) for hardware, release in pinned}
    return sorted(keys, key=lambda k: (k.hardware, k.ngc_release or ""))


def choose(matrix: Matrix, key: ImageKey, host: HostDriver | None = None) -> ImageChoice:
    """The image variables and release of ``key`` (on ``host`` where the release is auto).

    A profile without an image or a release the template cannot take is a :class:`ConfigError`
    naming the field (``validate`` refuses those first); an auto profile on a host without a
    usable driver is :class:`NoRelease`.
    """
    file = str(matrix.path)
    profile = matrix.profiles[key.hardware]
    if profile.image is None:
        raise ConfigError([Problem(file, f"hardware.{key.hardware}.image",
                                   "needs an image template")])
    template = templates.load_template(profile.image)
    kind = family(template)
    values = profile_image_vars(matrix, key.hardware)
    if key.ngc_release is not None:
        _check_pinnable(file, key.hardware, template, kind, values, RELEASE_PARAM)
        values["base_tag"] = releases.ngc_tag(key.ngc_release)
        return ImageChoice(key.hardware, profile.image, values, key.ngc_release, kind, "axis",
                           reason=f"ngc_release = {key.ngc_release}")
    if profile.release == AUTO:
        _check_pinnable(file, key.hardware, template, kind, values, "release")
        if host is None:
            raise ConfigError([Problem(file, f"hardware.{key.hardware}.release", (
                "release = 'auto' is decided per host from its driver when the sweep reaches it "
                "(give the host)"))])
        return _auto(file, key.hardware, profile.image, kind, values, host,
                     profile.forward_compat)
    return _named(key.hardware, profile.image, template, kind, values)


def _check_pinnable(file: str, hardware: str, template: templates.Template, kind: str | None,
                    values: dict[str, Any], what: str) -> None:
    where = f"hardware.{hardware}"
    if kind is None:
        raise ConfigError([Problem(file, f"{where}.image", (
            f"{what}: the template {template.name!r} names no release (it has neither base_tag "
            "nor synapse_version/torch_version)"))])
    fixed = [v for v in fixed_base(template, values)
             if not (kind == "ngc" and what == RELEASE_PARAM and v == "base_tag")]
    if kind == "habana" and what == RELEASE_PARAM:
        raise ConfigError([Problem(file, f"{where}.image", (
            f"ngc_release picks an NGC PyTorch base; {template.name!r} builds on Intel Gaudi's "
            "installer image"))])
    if fixed:
        raise ConfigError([Problem(file, f"{where}.image_vars.{fixed[0]}", (
            f"{fixed[0]} fixes the base image, which {what} is to choose: remove it"))])


def _auto(file: str, hardware: str, template: str, kind: str | None, values: dict[str, Any],
          host: HostDriver, datacenter: bool) -> ImageChoice:
    where = f"hardware.{hardware}.release"
    wanted = {"ngc": "nvidia", "habana": "gaudi"}[kind or "ngc"]
    tool = {"nvidia": "nvidia-smi", "gaudi": "hl-smi"}[wanted]
    if host.driver is None or host.accelerator != wanted:
        seen = (f"it reports a {host.accelerator} driver" if host.accelerator else
                f"{tool} did not answer")
        raise NoRelease(host.name, hardware, (
            f"release = 'auto' needs its {FAMILY_LABEL[kind or 'ngc']} driver, but {seen}; "
            "pin the release in image_vars for such hosts, or leave them out of the profile"),
            file)
    try:
        if kind == "habana":
            version, series = releases.resolve_habana(host.driver, what=where)
            values.update(synapse_version=version, torch_version=series.torch)
            return ImageChoice(hardware, template, values, version, kind, "auto", host.driver,
                               f"Intel Gaudi driver {host.driver}: its own software {version} "
                               f"(PyTorch {series.torch})")
        release = releases.resolve_release(host.driver, datacenter=datacenter,
                                           compute_capability=host.compute_capability,
                                           what=where)
    except ConfigError as exc:
        raise NoRelease(host.name, hardware, exc.problems[0].message, file) from None
    values["base_tag"] = release.base_tag
    gpu = (f", GPUs of compute capability {host.compute_capability}+"
           if host.compute_capability else "")
    compat = " (with CUDA forward compatibility)" if datacenter else ""
    return ImageChoice(hardware, template, values, release.name, kind, "auto", host.driver,
                       f"driver {host.driver}{gpu}: NGC PyTorch {release.name} is the newest it "
                       f"runs{compat}")


def _named(hardware: str, template_name: str, template: templates.Template, kind: str | None,
           values: dict[str, Any]) -> ImageChoice:
    resolved = template.resolve(values)
    if resolved.get("base_image"):
        return ImageChoice(hardware, template_name, values, None, kind, "profile",
                           reason=f"base_image = {resolved['base_image']}")
    if kind == "ngc":
        name = releases.tag_release(str(resolved["base_tag"]))
        found = releases.find_release(name)
        return ImageChoice(hardware, template_name, values, found.name if found else name,
                           kind, "profile", reason=f"base_tag = {resolved['base_tag']}")
    if kind == "habana":
        return ImageChoice(hardware, template_name, values, str(resolved["synapse_version"]),
                           kind, "profile",
                           reason=f"synapse_version = {resolved['synapse_version']}")
    return ImageChoice(hardware, template_name, values, None, None, "profile")


def newest_release(host: HostDriver) -> str:
    """For people (``hosts check``): the release ``release = "auto"`` gives the host —
    ``NGC 24.10``, ``Gaudi 1.18.0``, ``none (...)`` when its driver runs none, ``-`` without a
    driver."""
    if host.driver is None or host.accelerator not in ("nvidia", "gaudi"):
        return "-"
    try:
        if host.accelerator == "gaudi":
            return f"Gaudi {releases.resolve_habana(host.driver)[0]}"
        found = releases.resolve_release(host.driver, compute_capability=host.compute_capability)
        return f"NGC {found.name}"
    except ConfigError:
        return "none (driver too old or unknown)"


def host_profiles(matrix: Matrix, inventory: Inventory) -> dict[str, set[str]]:
    """host -> the profile names it may run: those listing it in ``hosts``, and those without a
    ``hosts`` list whose name the host carries as a tag. A listed host missing from the
    inventory is a :class:`ConfigError` naming the profile's ``hosts``."""
    known = set(inventory.names)
    problems = []
    tags: dict[str, set[str]] = {h: set() for h in inventory.names}
    for name, profile in matrix.profiles.items():
        if profile.hosts:
            for host in profile.hosts:
                if host in known:
                    tags[host].add(name)
                else:
                    problems.append(Problem(
                        str(matrix.path), f"hardware.{name}.hosts",
                        f"no host named {host!r} in {inventory.source} "
                        f"(hosts: {', '.join(inventory.names)})"))
        else:
            for entry in inventory.tagged(name):
                tags[entry.name].add(name)
    if problems:
        raise ConfigError(problems)
    return tags
