"""Build images from templates, tagged by a content hash of everything that goes in.

The tag of an image is ``orchestrate/<template>:<12 hex>``, a SHA-256 over exactly what is sent
to the engine — every build-context file, path and bytes: the rendered Dockerfile (so the base
image reference and every variable that reaches it), ``workload/`` and file variables — and over
the bits of the base image itself (:class:`BasePin`): its registry digest (``RepoDigests``) or,
for a base built or imported on that engine, its image ID, resolved once per build from the
engine the image is built on (:func:`pin`; a registry base that is not there yet is pulled
first). So a base tag that moves (``latest``, a re-pushed release, another machine's import of
the "same" tag) gives another image, and two runs "on 23.10" that ran different bits show it.
The same context on the same base gives the same tag, so :func:`ensure_image` builds only when
that tag is missing; a change that alters the context rebuilds, one that does not (a description)
keeps the image. The plan holds the context it hashed and the build sends that, never a second
reading of the disk. A template with a parent (``bitfusion`` on ``ngc-pytorch``) builds FROM the
parent's content-hash tag, so a change in the parent (or its base) changes both tags;
:func:`ensure_image` ensures the parent first.

:func:`plan_image` (one template) and :func:`plan_key` (one image of a matrix: its profile, the
release the cell or the host's driver picks, :mod:`orchestrator.plan.selection`) need no Docker
engine: ``--dry-run`` and every backend that runs images plan with them; such a
plan is *unpinned* (its tag covers the context only) until :func:`pin` resolves its base on an
engine. :func:`ensure_image` pins and builds on the engine client it is given (this machine's, or
a lab host's over SSH) and says which image it made (:class:`BuildOutcome`: tag, image ID, base).
Which NGC release a driver can run is :mod:`orchestrator.catalog.releases`.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.catalog import templates
from orchestrator.errors import BuildError, ConfigError, Problem, Requirement
from orchestrator.images.pulls import PullReport
from orchestrator.local.engine import docker_client, image_exists
from orchestrator.plan.selection import HostDriver, ImageChoice, ImageKey, choose

if TYPE_CHECKING:
    from orchestrator.plan.matrix import Cell, Matrix

log = logging.getLogger(__name__)

TAG_PREFIX = "orchestrate"
HASH_LENGTH = 12
LABEL_TEMPLATE = "org.orchestrate.template"
LABEL_HASH = "org.orchestrate.content-hash"
#: The base image reference and the digest or image ID it was pinned to when built.
LABEL_BASE = "org.orchestrate.base-image"
LABEL_BASE_PIN = "org.orchestrate.base-pin"

__all__ = ["BasePin", "BuildOutcome", "ImagePlan", "ImagePlans", "content_hash", "ensure_image",
           "pin", "plan_image", "plan_key"]
LOG_TAIL_LINES = 20

_STEP_RE = re.compile(r"^Step (\d+/\d+) : (.*)$")


@dataclass(frozen=True)
class BasePin:
    """The bits a base image reference stood for on one engine when an image was built on it."""

    #: The reference as the template wrote it (``nvcr.io/nvidia/pytorch:24.05-py3``).
    ref: str
    #: The engine's image ID of it (``sha256:...``).
    image_id: str
    #: ``repository@sha256:...`` when the engine knows the base from a registry; None for a base
    #: built or imported there (then the image ID is what pins it).
    digest: str | None = None

    @property
    def identity(self) -> str:
        """What the content hash covers: the registry digest, else the image ID."""
        return self.digest or self.image_id


@dataclass(frozen=True)
class ImagePlan:
    """What would be built: template, resolved variables, base image, content-hash tag."""

    template: str
    values: dict[str, Any]
    base_image: str
    tag: str
    content_hash: str
    kind: str = "dockerfile"
    parent: ImagePlan | None = None
    #: The build context that was hashed (relative path -> bytes); the build sends exactly this.
    files: dict[str, bytes] = field(default_factory=dict, repr=False, compare=False)
    #: The base's bits, once :func:`pin` resolved them (a child's base is its parent's tag).
    base_pin: BasePin | None = None

    @property
    def root(self) -> ImagePlan:
        """The plan at the root of the chain (the one built FROM a base that is not ours)."""
        node = self
        while node.parent is not None:
            node = node.parent
        return node

    @property
    def pinned(self) -> bool:
        """Whether the tag covers the base's bits (the chain's root base was resolved)."""
        return self.root.base_pin is not None


@dataclass(frozen=True)
class BuildOutcome:
    """Result of :func:`ensure_image`: the tag, whether it was built now, how long it took, the
    engine's image ID of it and the plan it was built from (pinned)."""

    tag: str
    built: bool
    seconds: float
    parent: BuildOutcome | None = None
    image_id: str | None = None
    plan: ImagePlan | None = field(default=None, repr=False, compare=False)

    @property
    def base_pin(self) -> BasePin | None:
        """The base the image chain was built on (its root's)."""
        return self.plan.root.base_pin if self.plan is not None else None

    @property
    def summary(self) -> str:
        """``built in 12.3 s`` or ``up to date``."""
        return f"built in {self.seconds:.1f} s" if self.built else "up to date"


# --------------------------------------------------------------------------- planning


def plan_image(
    name: str, values: dict[str, Any] | None = None, *, workload_dir: Path | None = None
) -> ImagePlan:
    """Resolve template ``name`` with ``values`` into an :class:`ImagePlan`. Needs no Docker.

    If the template has a parent whose variable is left empty, the parent is planned first (with
    the forwarded variables) and its content-hash tag becomes this image's base.
    """
    template = templates.load_template(name)
    resolved = template.resolve(values)
    parent_plan: ImagePlan | None = None
    if template.parent and not resolved.get(template.parent.variable):
        forwarded = {k: resolved[k] for k in template.parent.forward}
        parent_plan = plan_image(template.parent.template, forwarded, workload_dir=workload_dir)
        resolved[template.parent.variable] = parent_plan.tag
    base = template.base_ref(resolved)
    files = template.files(resolved, workload_dir=workload_dir)
    # File variables are hashed by their bytes (in ``files``) and context name, not host path.
    digest = content_hash(name, files)
    tag = f"{TAG_PREFIX}/{name}:{digest[:HASH_LENGTH]}"
    log.debug("planned %s -> %s (base %s)", name, tag, base)
    return ImagePlan(
        template=name,
        values=resolved,
        base_image=base,
        tag=tag,
        content_hash=digest,
        kind=template.kind,
        parent=parent_plan,
        files=files,
    )


def check_image_templates(matrix: Matrix, cells: Iterable[Cell], backend: str) -> None:
    """A :class:`ConfigError` naming every profile of ``cells`` without an image template (it
    cannot run in a container; ``backend`` says who needs it)."""
    missing = sorted({c.hardware for c in cells if matrix.profiles[c.hardware].image is None})
    if missing:
        raise ConfigError([
            Problem(str(matrix.path), f"hardware.{h}.image",
                    f"the {backend} backend needs an image template for this profile")
            for h in missing
        ])


def plan_key(
    matrix: Matrix, key: ImageKey, host: HostDriver | None = None
) -> tuple[ImageChoice, ImagePlan]:
    """The release choice and the (unpinned) plan of one image of a matrix (no engine needed).

    ``host``: the host's driver, for a profile with ``release = "auto"``
    (:class:`~orchestrator.plan.selection.NoRelease` when it runs none). A bad template variable is
    reported where the matrix sets it (``hardware.NAME.image_vars.VAR``).
    """
    choice = choose(matrix, key, host)
    try:
        return choice, plan_image(choice.template, choice.values)
    except ConfigError as exc:  # say where in the matrix the variable comes from
        raise ConfigError([
            dataclasses.replace(p, file=str(matrix.path),
                                field=f"hardware.{key.hardware}.image_vars.{p.field}",
                                message=p.message + _revision(p, choice.values))
            for p in exc.problems
        ]) from None


def _revision(problem: Problem, values: dict[str, Any]) -> str:
    """For a program checkout that is not there: the revision it must be at."""
    revision = values.get("program_revision")
    if not isinstance(problem, Requirement) or problem.kind != "checkout" or not revision:
        return ""
    return f"; check it out there at revision {revision} (image_vars.program_revision)"


class ImagePlans:
    """The plans of one matrix's images, each made once (:func:`plan_key` per image key and
    host): a dry run asks for the image of every cell, and thousands of cells share a few
    images (each plan renders its template and reads and hashes its whole build context).

    A plan reads the files it copies when it is first asked for; a memo lives as long as the
    command that plans with it (a dry run's backend), never across builds. A plan that is
    refused (a :class:`ConfigError`) is refused again, without planning again."""

    def __init__(self, matrix: Matrix) -> None:
        self.matrix = matrix
        self._made: dict[tuple[ImageKey, HostDriver | None],
                         tuple[ImageChoice, ImagePlan] | ConfigError] = {}

    def get(self, key: ImageKey, host: HostDriver | None = None
            ) -> tuple[ImageChoice, ImagePlan]:
        """:func:`plan_key` of ``key`` (on ``host``), made the first time it is asked for."""
        made = self._made.get((key, host))
        if made is None:
            try:
                made = plan_key(self.matrix, key, host)
            except ConfigError as exc:
                made = exc
            self._made[(key, host)] = made
        if isinstance(made, ConfigError):
            raise made.with_traceback(None)
        return made


def content_hash(template: str, files: dict[str, bytes], base: str | None = None) -> str:
    """SHA-256 hex digest over a template's name, its whole build context and, for a pinned
    plan, the identity of its base (:attr:`BasePin.identity`)."""
    h = hashlib.sha256()

    def put(label: str, data: bytes) -> None:
        h.update(label.encode() + b"\0" + len(data).to_bytes(8, "big") + data)

    put("template-name", template.encode())
    for rel, data in sorted(files.items()):
        put(f"file:{rel}", data)
    if base is not None:
        put("base-image", base.encode())
    return h.hexdigest()


def pin(plan: ImagePlan, resolve: Callable[[str], BasePin]) -> ImagePlan:
    """``plan`` with its base's bits in its hash and tag: the chain's root base is resolved by
    ``resolve`` (e.g. :func:`engine_resolver`), and every child is rendered again FROM its
    pinned parent's tag. A pinned plan is returned as it is."""
    if plan.pinned:
        return plan
    if plan.parent is None:
        base = resolve(plan.base_image)
        digest = content_hash(plan.template, plan.files, base.identity)
        return dataclasses.replace(plan, base_pin=base, content_hash=digest,
                                   tag=f"{TAG_PREFIX}/{plan.template}:{digest[:HASH_LENGTH]}")
    parent = pin(plan.parent, resolve)
    template = templates.load_template(plan.template)
    assert template.parent is not None  # a plan has a parent only through its template's
    values = {**plan.values, template.parent.variable: parent.tag}
    files = {**plan.files, template.output_name: template.render(values).encode()}
    digest = content_hash(plan.template, files)
    return dataclasses.replace(plan, values=values, base_image=parent.tag, parent=parent,
                               files=files, content_hash=digest,
                               tag=f"{TAG_PREFIX}/{plan.template}:{digest[:HASH_LENGTH]}")


def plan_chain(plan: ImagePlan) -> list[ImagePlan]:
    """The plan and its parents, outermost parent first (the order to build in)."""
    chain: list[ImagePlan] = []
    node: ImagePlan | None = plan
    while node is not None:
        chain.append(node)
        node = node.parent
    return list(reversed(chain))


# --------------------------------------------------------------------------- engine


def docker_api(client: Any = None) -> Any:
    """The low-level API of ``client`` (an ``APIClient`` or a ``DockerClient``), or of a new
    client for the engine in the environment (:class:`BackendUnavailable` when none answers)."""
    if client is not None:
        return getattr(client, "api", client)
    return docker_client().api


def split_ref(ref: str) -> tuple[str, str | None, str | None]:
    """``(repository, tag, digest)`` of an image reference: ``registry:5000/a/b:1@sha256:x``
    -> ``("registry:5000/a/b", "1", "sha256:x")`` (a port is not a tag)."""
    name, _, digest = ref.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        return name[:colon], name[colon + 1:], digest or None
    return name, None, digest or None


def _repo_digest(ref: str, repo_digests: Iterable[str]) -> str | None:
    """The ``repository@sha256:...`` of ``ref`` among an image's RepoDigests: the one of the
    same repository (the engine lists one per repository it was pulled from); None for a base
    built or imported locally (no RepoDigests)."""
    repository, _, digest = split_ref(ref)
    if digest:
        return f"{repository}@{digest}"
    for entry in repo_digests:
        if entry.partition("@")[0] == repository:
            return entry
    return None


def registry_ref(ref: str) -> bool:
    """Whether ``ref`` names a registry to pull from (its first component has a dot or a port,
    or is localhost): a short name such as ``orchestrate-test/base:1`` would go to Docker Hub,
    which a lab's local stand-in never comes from."""
    first, sep, _ = ref.partition("/")
    return bool(sep) and ("." in first or ":" in first or first == "localhost")


def engine_resolver(
    client: Any = None, *, pull: bool = True, where: str = "this machine",
    on_log: Callable[[str], None] | None = None,
) -> Callable[[str], BasePin]:
    """A resolver for :func:`pin` on the engine of ``client``: inspects the base (once per
    reference: repeated calls answer from memory) and, for a registry base the engine does not
    have, pulls it first (``pull``). A base it neither has nor can pull is a
    :class:`BuildError` naming the engine (``where``) and what to do.

    A pull reports its progress (layers, bytes, rate) to ``on_log``
    (:class:`~orchestrator.images.pulls.PullReport`). The project's machines reach no registry:
    tests/test_image_pull.py pulls from a stand-in on loopback (the registry API's pull side),
    through the real engine, to its RepoDigests."""
    import docker

    api = docker_api(client)
    seen: dict[str, BasePin] = {}
    lock = threading.Lock()

    def inspect(ref: str) -> dict[str, Any] | None:
        try:
            return dict(api.inspect_image(ref))
        except docker.errors.ImageNotFound:
            return None

    def resolve(ref: str) -> BasePin:
        with lock:
            if ref in seen:
                return seen[ref]
            info = inspect(ref)
            if info is None and pull and registry_ref(ref):
                _pull(api, ref, where, on_log)
                info = inspect(ref)
            if info is None:
                how = ("pulling it failed" if pull and registry_ref(ref) else
                       "it is not a registry reference to pull")
                raise BuildError(
                    f"base image {ref} is not on {where} and {how}: pull it there, or `docker "
                    "load` / `docker tag` a copy (air-gapped labs: set base_image to a mirror)")
            found = BasePin(ref, str(info["Id"]),
                            _repo_digest(ref, info.get("RepoDigests") or []))
            log.info("base %s on %s is %s", ref, where, found.identity)
            seen[ref] = found
            return found

    return resolve


def _pull(api: Any, ref: str, where: str, on_log: Callable[[str], None] | None) -> None:
    """Pull ``ref`` on the engine of ``api``, its progress (layers, bytes, rate) reported to
    ``on_log`` as :class:`~orchestrator.images.pulls.PullReport` does: a bar where the listener
    draws one, else a line every few seconds."""
    import docker

    repository, tag, digest = split_ref(ref)
    report = PullReport(ref, on_log)
    failed = "interrupted"  # what the report says if anything else stops the pull (Ctrl-C)
    try:
        for chunk in api.pull(repository, tag=digest or tag or "latest", stream=True,
                              decode=True):
            if isinstance(chunk, dict) and chunk.get("error"):
                failed = str(chunk["error"])
                raise BuildError(f"pulling base image {ref} on {where} failed: {failed}")
            if isinstance(chunk, dict):
                report.event(chunk)
        failed = ""
    except docker.errors.APIError as exc:
        failed = str(exc.explanation or exc)
        raise BuildError(f"pulling base image {ref} on {where} failed: {failed}") from exc
    finally:
        report.finish(failed)


def ensure_image(
    plan: ImagePlan,
    client: Any = None,
    on_log: Callable[[str], None] | None = None,
    *,
    resolve: Callable[[str], BasePin] | None = None,
) -> BuildOutcome:
    """Make sure the image of ``plan`` exists on the engine, building it (parents first) only
    when its tag is missing. An unpinned plan is pinned first on that engine (``resolve``, or
    :func:`engine_resolver` of ``client``): the outcome's tag and plan are the pinned ones.

    Build log lines stream to ``on_log``. A failing build raises :class:`BuildError` naming the
    step and the last log lines; a base that is not there and cannot be pulled is a
    :class:`BuildError` too; no reachable engine raises :class:`BackendUnavailable`.
    """
    if plan.kind != "dockerfile":
        raise BuildError(
            f"template {plan.template} is a {plan.kind} definition: render it with "
            f"`orchestrate images render {plan.template} --out DIR` and build the .sif there "
            "with `apptainer build` (or `singularity build`)"
        )
    api = docker_api(client)
    if not plan.pinned:
        plan = pin(plan, resolve or engine_resolver(api, on_log=on_log))
    return _ensure_pinned(plan, api, on_log)


def _ensure_pinned(plan: ImagePlan, api: Any, on_log: Callable[[str], None] | None
                   ) -> BuildOutcome:
    parent_outcome = _ensure_pinned(plan.parent, api, on_log) if plan.parent else None
    start = time.monotonic()
    image_id = image_id_of(api, plan.tag)
    if image_id is not None:
        log.info("image %s is up to date", plan.tag)
        return BuildOutcome(plan.tag, False, time.monotonic() - start, parent_outcome,
                            image_id, plan)
    with tempfile.TemporaryDirectory(prefix=f"orchestrate-{plan.template}-") as tmp:
        templates.write_context(plan.files, tmp)
        _build(api, plan, tmp, on_log)
    seconds = time.monotonic() - start
    log.info("built %s in %.1f s", plan.tag, seconds)
    return BuildOutcome(plan.tag, True, seconds, parent_outcome, image_id_of(api, plan.tag),
                        plan)


def image_id_of(api: Any, tag: str) -> str | None:
    """The engine's image ID of ``tag``, None when the engine has no such image."""
    import docker

    try:
        return str(api.inspect_image(tag)["Id"])
    except docker.errors.ImageNotFound:
        return None


def _build(
    api: Any, plan: ImagePlan, context_dir: str, on_log: Callable[[str], None] | None
) -> None:
    import docker

    tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
    step = "(before the first step)"

    def emit(line: str) -> None:
        tail.append(line)
        log.debug("%s | %s", plan.tag, line)
        if on_log is not None:
            on_log(line)

    log.info("building %s from template %s (base %s)", plan.tag, plan.template, plan.base_image)
    try:
        stream = api.build(
            path=context_dir,
            tag=plan.tag,
            rm=True,
            forcerm=True,
            pull=False,
            decode=True,
            labels=build_labels(plan),
        )
        for chunk in stream:
            text = chunk.get("stream") or chunk.get("status") or ""
            for line in text.splitlines():
                line = line.rstrip()
                if not line:
                    continue
                match = _STEP_RE.match(line)
                if match:
                    step = f"step {match.group(1)}: {match.group(2)}"
                emit(line)
            if "error" in chunk or "errorDetail" in chunk:
                detail = chunk.get("errorDetail") or {}
                message = str(chunk.get("error") or detail.get("message") or "unknown error")
                emit(message)
                raise BuildError(_failure_message(plan, step, message, tail))
    except docker.errors.APIError as exc:
        raise BuildError(_failure_message(plan, step, exc.explanation or str(exc), tail)) from exc
    if not image_exists(api, plan.tag):
        raise BuildError(_failure_message(plan, step, "the engine reported no image", tail))


def build_labels(plan: ImagePlan) -> dict[str, str]:
    """The labels of a built image: template, content hash, and the base it was pinned to."""
    labels = {LABEL_TEMPLATE: plan.template, LABEL_HASH: plan.content_hash,
              LABEL_BASE: plan.base_image}
    if plan.base_pin is not None:
        labels[LABEL_BASE_PIN] = plan.base_pin.identity
    return labels


def _failure_message(plan: ImagePlan, step: str, message: str, tail: collections.deque[str]) -> str:
    lines = [f"building {plan.tag} (template {plan.template}) failed at {step}: {message.strip()}"]
    if tail:
        lines.append(f"last {len(tail)} log lines:")
        lines += [f"  {line}" for line in tail]
    return "\n".join(lines)


def local_tags(client: Any = None) -> dict[str, list[str]]:
    """Content-hash tags that exist locally, by template name (needs an engine)."""
    api = docker_api(client)
    found: dict[str, list[str]] = {}
    for image in api.images(filters={"label": LABEL_TEMPLATE}):
        template = (image.get("Labels") or {}).get(LABEL_TEMPLATE, "")
        for tag in image.get("RepoTags") or []:
            if tag.startswith(f"{TAG_PREFIX}/"):
                found.setdefault(template, []).append(tag)
    return {k: sorted(v) for k, v in sorted(found.items())}
