"""Which software a profile's cells run on, as far as it is known before anything is built:
the :class:`PlannedStack` (torch, torchvision, CUDA, the profilers its image ships).

Where the stack comes from depends on what the cells run in (their runtime,
:mod:`orchestrator.runtimes`):

* with no container (the process and slurm backends), this interpreter's torch and torchvision,
  read from the package metadata, torch never imported (:func:`host_stack`);
* in an image (docker, ssh; Apptainer), the base image at the root of the profile's template
  chain (``bitfusion`` -> ``ngc-pytorch`` -> its base, :func:`root_base_image`): an NGC PyTorch
  release (torch, torchvision and tools from ``data/ngc_releases.toml``; the template's
  ``base_tag`` names it, from nvcr.io or a mirror's ``base_repository``), a Habana PyTorch
  installer (its torch version), or something else (unknown): :func:`template_stack`;
* a cell's ``ngc_release`` replaces its profile's release: :func:`pinned_stack`;
* ``release = "auto"`` (a release per host's driver, chosen when the sweep runs): every release
  a host may get, oldest first (:func:`auto_stack`: the offered NGC releases that support the
  profile's GPU, or the Intel Gaudi releases of ``data/habana_releases.toml``).

Pure: it reads the template and release tables and this interpreter's package metadata, and
decides nothing. A stack that cannot be told says why (:attr:`PlannedStack.unknown_why`); what
that means for a matrix (an error, a warning, a note) is :mod:`orchestrator.backends.checks`'
to say.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
from dataclasses import dataclass
from typing import Any

from orchestrator.catalog import gpus, releases, stacks, templates, torch_builds
from orchestrator.config.matrix_file import HardwareProfile
from orchestrator.errors import BuildError, ConfigError
from orchestrator.plan import selection

#: Where the NGC PyTorch releases come from (a lab mirror's ``base_repository`` aside).
_NGC_REPOSITORY = "nvcr.io/nvidia/pytorch"
#: An NGC release's name (``24.05``).
_NGC_RELEASE = re.compile(r"\d\d\.\d\d")

_HABANA_BASE = re.compile(
    r"^vault\.habana\.ai/gaudi-docker/([^/]+)/([^/]+)/habanalabs/pytorch-installer-([^/:]+)"
    r":[A-Za-z0-9_][A-Za-z0-9_.-]*$"
)


def _release_of_tag(tag: str) -> str | None:
    """The NGC release a ``YY.MM-py3`` tag names (from nvcr.io or a mirror's
    ``base_repository``); None for any other tag."""
    release = releases.tag_release(tag)
    return release if release != tag and _NGC_RELEASE.fullmatch(release) else None


#: Why a stack is not known, where a check has something to say about it.
UNRESOLVED = "unresolved"  # the template's base image could not be worked out (``detail``)
UNLISTED = "unlisted"  # an NGC release the table does not have (``detail``: its name)
UNKNOWN_BASE = "unknown base"  # a base image outside the NGC and Habana tables


@dataclass(frozen=True)
class PlannedStack:
    """The software a profile's cells run on, as far as it is known before anything is built
    (what a result recorded it ran on is
    :class:`orchestrator.results.folders.store.RecordedStack`)."""

    #: For people: ``NGC PyTorch 23.10 (torch 2.1.0a0+32f93b1, torchvision 0.16, CUDA 12.2.2)``.
    label: str
    #: The base image at the root of the template chain; None for this machine's Python.
    base: str | None = None
    #: The NGC release of the base, where it is one.
    release: str | None = None
    torch: str | None = None
    torchvision: str | None = None
    #: The CUDA toolkit of the stack, where known (nvprof left CUDA 12 toolkits).
    cuda: str | None = None
    #: Profilers the stack ships; None where that is not known.
    profilers: frozenset[str] | None = None
    #: The GPU architectures a torch build of this machine carries (``sm_75``, ...); None
    #: where not known (an image's torch: its release's ``min_compute_capability`` says).
    cuda_archs: tuple[str, ...] | None = None
    #: This machine's torch (the process and slurm backends): ``cuda`` None means a CPU build.
    host_build: bool = False
    #: False where the stack could not be told (an unknown base image or backend).
    known: bool = True
    #: ``release = "auto"``: the stacks a host may get, oldest first (the stack itself is
    #: decided per host when the sweep runs).
    candidates: tuple[PlannedStack, ...] = ()
    #: Why it could not be told, where there is something to say: :data:`UNRESOLVED`,
    #: :data:`UNLISTED`, :data:`UNKNOWN_BASE` ("" otherwise).
    unknown_why: str = ""
    #: The error that left the base unresolved; the name of an unlisted release.
    detail: str = ""
    #: Why our workload cannot run on this stack (an NGC release below its floor), and the
    #: fields that pick it: the checks refuse it for the workload; another program
    #: ([commands.NAME]) brings its own code and may run there.
    refused: str | None = None
    refused_at: tuple[str, ...] = ()
    #: The base image's Ubuntu release, where the release table records it.
    ubuntu: str | None = None

    @property
    def identity(self) -> tuple[str | None, str | None]:
        """What two profiles must share to be compared: the base image and the torch."""
        return self.base, self.torch


#: A stack these checks do not tell (the reason is said where it is decided).
NOT_CHECKED = PlannedStack("not checked", known=False)


@functools.cache
def host_stack() -> PlannedStack:
    """This interpreter's torch and torchvision (the process and slurm backends run it), read
    from the package metadata and torch's own files without importing torch: the version, the
    CUDA it was built for and the GPU architectures it carries
    (:func:`orchestrator.catalog.torch_builds.installed`)."""
    try:
        vision: str | None = importlib.metadata.version("torchvision")
    except importlib.metadata.PackageNotFoundError:
        vision = None
    build = torch_builds.installed()
    if build is None:
        return PlannedStack("this machine's Python (no torch installed)", known=False)
    if build.cuda is None:
        kind = f"ROCm {build.hip}" if build.hip else "CPU-only build"
    else:
        archs = " ".join(build.archs) if build.archs else "GPU architectures not read"
        kind = f"CUDA {build.cuda}: {archs}"
    return PlannedStack(f"this machine's Python (torch {build.version}, torchvision {vision}; "
                        f"{kind})", torch=build.version, torchvision=vision, cuda=build.cuda,
                        cuda_archs=build.archs, host_build=True)


def template_stack(profile: HardwareProfile, template: templates.Template) -> PlannedStack:
    """The stack ``template`` builds on with the profile's variables: its chain's root base,
    classified (an NGC release named by ``base_tag`` or an ``nvcr.io`` base, a Habana
    installer, else unknown)."""
    try:
        root, resolved = chain_root(template, profile.image_vars)
        base = root.base_ref(resolved)
    except (ConfigError, BuildError) as exc:
        return PlannedStack("not checked", known=False, unknown_why=UNRESOLVED, detail=str(exc))
    tagged = _ngc_tag(root, resolved)
    if tagged is not None:  # nvcr.io's or a mirror's (base_repository) release
        return ngc_stack(base, tagged)
    return _classify_base(base)


def pinned_stack(profile: HardwareProfile, template: templates.Template,
                 release: str) -> PlannedStack:
    """The stack of the profile's cells that pin ``ngc_release = release`` (the template's
    ``base_tag`` set to it)."""
    try:
        base = root_base_image(template, {**profile.image_vars,
                                          "base_tag": releases.ngc_tag(release)})
    except (ConfigError, BuildError) as exc:
        return PlannedStack(f"NGC PyTorch {release} (not checked)", known=False,
                            unknown_why=UNRESOLVED, detail=str(exc))
    return ngc_stack(base, release)


def auto_stack(profile: HardwareProfile, family: str) -> PlannedStack:
    """The stacks a host may get for a profile whose release is chosen per host from its driver,
    of the template's release ``family`` (``ngc`` or ``habana``)."""
    if family == "habana":
        candidates = tuple(
            PlannedStack(f"Intel Gaudi {r.name} (torch {r.torch})", torch=r.torch,
                         profilers=frozenset(), release=r.name)
            for r in releases.load_habana_releases())
    else:
        cc = capability(profile)
        shown = f"{cc[0]}.{cc[1]}" if cc else None
        candidates = tuple(release_stack(r, r.base_tag) for r in releases.load_releases()
                           if r.offered and r.runs_on(shown))
    label = selection.FAMILY_LABEL[family]
    return PlannedStack(f"{label} chosen per host from its driver (release = 'auto')",
                        known=False, candidates=candidates)


def release_stack(release: releases.Release, base: str) -> PlannedStack:
    """The stack of an NGC release of the table, on ``base`` (nvcr.io's or a mirror's)."""
    return PlannedStack(
        f"NGC PyTorch {release.name} (torch {release.torch}, torchvision {release.torchvision},"
        f" CUDA {release.cuda})",
        base=base, release=release.name, torch=release.torch, torchvision=release.torchvision,
        cuda=release.cuda, profilers=releases.container_profilers(), ubuntu=release.ubuntu,
    )


def ngc_stack(base: str, name: str) -> PlannedStack:
    """The stack of NGC release ``name`` on ``base`` (unknown: :data:`UNLISTED`, when the table
    does not have it). A release the table refuses is still its stack: the check refuses it."""
    release = releases.find_release(name)
    if release is None:
        return PlannedStack(f"{base} (not in the release table)", base=base, known=False,
                            unknown_why=UNLISTED, detail=name)
    return release_stack(release, base)


def _classify_base(base: str) -> PlannedStack:
    repository, _, tag = base.rpartition(":")
    ngc = _release_of_tag(tag) if repository == _NGC_REPOSITORY else None
    if ngc:
        return ngc_stack(base, ngc)
    habana = _HABANA_BASE.match(base)
    if habana:
        torch = habana[3] if parses(habana[3]) else None
        return PlannedStack(
            f"Habana PyTorch installer {habana[1]} (torch {habana[3]}, {habana[2]})",
            base=base, torch=torch, profilers=frozenset())
    return PlannedStack(f"{base} (not checked)", base=base, known=False,
                        unknown_why=UNKNOWN_BASE)


def chain_root(template: templates.Template, values: dict[str, Any]
               ) -> tuple[templates.Template, dict[str, Any]]:
    """The template at the root of ``template``'s chain and its resolved values (a template
    whose parent image is left to the build is built FROM its parent's image)."""
    resolved = template.resolve(values)
    while template.parent and not resolved.get(template.parent.variable):
        forwarded = {k: resolved[k] for k in template.parent.forward}
        template = templates.load_template(template.parent.template)
        resolved = template.resolve(forwarded)
    return template, resolved


def _ngc_tag(root: templates.Template, resolved: dict[str, Any]) -> str | None:
    """The NGC release a root template's ``base_tag`` names, where no ``base_image`` replaces
    it (the repository may be a lab mirror); None otherwise."""
    if selection.family(root) != "ngc" or resolved.get("base_image"):
        return None
    return _release_of_tag(str(resolved.get("base_tag", "")))


def root_base_image(template: templates.Template, values: dict[str, Any]) -> str:
    """The base image at the root of ``template``'s chain for the profile's ``values``: a
    template whose parent image is left to the build (``bitfusion``) is built FROM its parent's
    image, which is built FROM the parent's base."""
    root, resolved = chain_root(template, values)
    return root.base_ref(resolved)


def release_key(name: str) -> tuple[int, int]:
    """``"23.10"`` -> ``(23, 10)``: NGC releases in order."""
    year, month = name.split(".")
    return int(year), int(month)


def parses(version: str) -> bool:
    """Whether ``version`` is a version number the model and feature tables can compare."""
    try:
        stacks.parse_version(version)
    except ValueError:
        return False
    return True


def capability(profile: HardwareProfile) -> tuple[int, int] | None:
    """The profile's CUDA compute capability, where it says or its ``gpu`` tells."""
    text = profile.compute_capability
    if text is None and profile.gpu is not None and profile.device == "cuda":
        text = gpus.compute_capability(profile.gpu)
    return None if text is None else releases.parse_capability(text)


