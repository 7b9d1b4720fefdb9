"""Build images from templates, tagged by a content hash of everything that goes in.

The tag of an image is ``orchestrate/<template>:<12 hex>``, a SHA-256 over exactly what is sent
to the engine: every build-context file, path and bytes — the rendered Dockerfile (so the base
image reference and every variable that reaches it), ``workload/`` and file variables. The same
context gives the same tag, so :func:`ensure_image` builds only when that tag is missing; a
change that alters the context rebuilds, one that does not (a description) keeps the image. The
plan holds the context it hashed and the build sends that, never a second reading of the disk.
A template with a parent (``bitfusion`` on ``ngc-pytorch``) builds FROM the parent's
content-hash tag, so a change in the parent changes both tags; :func:`ensure_image` ensures the
parent first.

:func:`plan_image` (one template) and :func:`plan_images` (every image a matrix's cells need, by
hardware profile) need no Docker engine: ``--dry-run`` and every backend that runs images plan
with them. :func:`ensure_image` builds on the engine client it is given (this machine's, or a lab
host's over SSH). Which NGC release a driver can run is :mod:`orchestrator.releases`.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import re
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import images
from orchestrator.engine import docker_client
from orchestrator.errors import BuildError, ConfigError, Problem

if TYPE_CHECKING:
    from orchestrator.matrix import Cell, Matrix

log = logging.getLogger(__name__)

TAG_PREFIX = "orchestrate"
HASH_LENGTH = 12
LABEL_TEMPLATE = "org.orchestrate.template"
LABEL_HASH = "org.orchestrate.content-hash"
LOG_TAIL_LINES = 20

_STEP_RE = re.compile(r"^Step (\d+/\d+) : (.*)$")


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


@dataclass(frozen=True)
class BuildOutcome:
    """Result of :func:`ensure_image`: the tag, whether it was built now, and how long it took."""

    tag: str
    built: bool
    seconds: float
    parent: BuildOutcome | None = None

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
    template = images.load_template(name)
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


def plan_images(matrix: Matrix, cells: Iterable[Cell], backend: str) -> dict[str, ImagePlan]:
    """The image plan of every hardware profile the cells use, by profile (no engine needed).

    A profile without an image template cannot run in a container: a :class:`ConfigError`
    naming each such profile (``backend`` says who needs it). A bad template variable is
    reported where the matrix sets it (``hardware.NAME.image_vars.VAR``).
    """
    needed = sorted({c.hardware for c in cells})
    missing = [h for h in needed if matrix.profiles[h].image is None]
    if missing:
        raise ConfigError([
            Problem(str(matrix.path), f"hardware.{h}.image",
                    f"the {backend} backend needs an image template for this profile")
            for h in missing
        ])
    plans = {}
    for hw in needed:
        template = matrix.profiles[hw].image
        assert template is not None  # checked above
        try:
            plans[hw] = plan_image(template, profile_image_vars(matrix, hw))
        except ConfigError as exc:  # say where in the matrix the variable comes from
            raise ConfigError([
                Problem(str(matrix.path), f"hardware.{hw}.image_vars.{p.field}", p.message)
                for p in exc.problems
            ]) from None
    return plans


def profile_image_vars(matrix: Matrix, hardware: str) -> dict[str, Any]:
    """A profile's image variables; relative paths of file variables (a client .deb, a CA
    certificate) are taken relative to the matrix file's folder, not the current directory."""
    profile = matrix.profiles[hardware]
    values = dict(profile.image_vars)
    if profile.image is None:
        return values
    for name, var in images.load_template(profile.image).variables.items():
        value = values.get(name)
        if var.file and isinstance(value, str) and value:
            path = Path(value).expanduser()
            if not path.is_absolute():
                values[name] = str((matrix.path.parent / path).resolve())
    return values


def content_hash(template: str, files: dict[str, bytes]) -> str:
    """SHA-256 hex digest over a template's name and its whole build context."""
    h = hashlib.sha256()

    def put(label: str, data: bytes) -> None:
        h.update(label.encode() + b"\0" + len(data).to_bytes(8, "big") + data)

    put("template-name", template.encode())
    for rel, data in sorted(files.items()):
        put(f"file:{rel}", data)
    return h.hexdigest()


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


def image_exists(api: Any, tag: str) -> bool:
    """Whether ``tag`` exists in the engine behind ``api``."""
    import docker

    try:
        api.inspect_image(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def ensure_image(
    plan: ImagePlan,
    client: Any = None,
    on_log: Callable[[str], None] | None = None,
) -> BuildOutcome:
    """Make sure ``plan.tag`` exists locally, building it (parents first) only when missing.

    Build log lines stream to ``on_log``. A failing build raises :class:`BuildError` naming the
    step and the last log lines; no reachable engine raises :class:`BackendUnavailable`.
    """
    if plan.kind != "dockerfile":
        raise BuildError(
            f"template {plan.template} is a {plan.kind} definition: render it with "
            f"`orchestrate images render {plan.template} --out DIR` and build the .sif there "
            "with `apptainer build` (or `singularity build`)"
        )
    api = docker_api(client)
    parent_outcome = ensure_image(plan.parent, api, on_log) if plan.parent else None
    start = time.monotonic()
    if image_exists(api, plan.tag):
        log.info("image %s is up to date", plan.tag)
        return BuildOutcome(plan.tag, False, time.monotonic() - start, parent_outcome)
    with tempfile.TemporaryDirectory(prefix=f"orchestrate-{plan.template}-") as tmp:
        images.write_context(plan.files, tmp)
        _build(api, plan, tmp, on_log)
    seconds = time.monotonic() - start
    log.info("built %s in %.1f s", plan.tag, seconds)
    return BuildOutcome(plan.tag, True, seconds, parent_outcome)


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
            labels={LABEL_TEMPLATE: plan.template, LABEL_HASH: plan.content_hash},
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
