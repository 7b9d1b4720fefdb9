"""Make sure an engine has the images some cells need: written once for the docker backend (this
machine's engine), the ssh backend (each lab host's engine, over SSH) and ``orchestrate images
refresh`` (each inventory host's).

The inputs are the engine and the record of what was built:

* :class:`Engine` — a Docker engine (its client, local or over SSH), its name in the image state
  (``localhost`` or the inventory host), its host's driver as probed;
* :class:`Ledger` — what was built and which drivers were seen, written to the image state
  (:mod:`orchestrator.images.state`) once, when the caller is done with every engine
  (:meth:`Ledger.save`; none for a dry run).

For each image key (:class:`~orchestrator.plan.selection.ImageKey`: a profile, and the release a
cell pins), :func:`prepare_image`

1. chooses the release: the profile's, the cell's ``ngc_release``, or for ``release = "auto"``
   the one the engine's driver runs (:func:`orchestrator.plan.selection.choose`; an auto key
   carries its host on a remote engine) — a driver that runs none is
   :class:`~orchestrator.plan.selection.NoRelease`;
2. plans the image and pins its base to its bits on that engine
   (:func:`orchestrator.images.build.plan_key`, :func:`orchestrator.images.build.pin`);
3. builds it unless the engine has that tag (:func:`orchestrator.images.build.ensure_image`;
   a dry run only asks the engine);
4. notes what it made (:func:`record_of`) in the ledger.

What goes wrong with one image is raised, or, as the caller asks, kept in its :class:`Prepared`
value: a host whose driver runs no release of an image is ``skipped`` (the ssh backend places
none of those cells there; refresh reports it), any other error ``failed`` (refresh goes on with
the next image). :func:`prepare_images` says one line per image (``image TAG (template, release):
built in 12.3 s``, ``host NAME:`` first on a remote engine).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.catalog import releases
from orchestrator.errors import UNCHECKED, BuildError, ConfigError, Problem, Requirement
from orchestrator.images import build
from orchestrator.images.state import ImageRecord, ImageState, state_path, update_state
from orchestrator.local.engine import EngineProbe
from orchestrator.plan import selection
from orchestrator.plan.selection import HostDriver, ImageChoice, ImageKey

if TYPE_CHECKING:
    from orchestrator.plan.matrix import Cell, Matrix

log = logging.getLogger(__name__)

#: What became of one image: built now, already there, would be built (a dry run), not for this
#: host (its driver runs no release of it), or failed.
ACTIONS = ("built", "up to date", "would build", "skipped", "failed")


@dataclass
class Engine:
    """A Docker engine images are prepared on."""

    #: The engine's machine in the image state and in messages: ``localhost``, or the inventory
    #: host it is reached on.
    name: str
    #: Its client (this machine's engine, or a lab host's over SSH).
    client: Any
    #: Its host's driver as probed; None where it was not (no auto profile needed it).
    driver: HostDriver | None = None
    #: Reached over SSH: an auto profile's key carries the host, messages name it.
    remote: bool = False
    #: Pull a registry base the engine does not have (a dry run does not).
    pull: bool = True
    _resolve: Callable[[str], build.BasePin] | None = field(default=None, repr=False)

    @property
    def where(self) -> str:
        """``this machine`` or ``host NAME`` (in the messages of a base that is not there)."""
        return f"host {self.name}" if self.remote else "this machine"

    def resolver(self, on_log: Callable[[str], None] | None = None
                 ) -> Callable[[str], build.BasePin]:
        """The engine's base-image resolver (made once: each base is inspected once)."""
        if self._resolve is None:
            self._resolve = build.engine_resolver(self.client, pull=self.pull, where=self.where,
                                                  on_log=on_log)
        return self._resolve

    def key(self, matrix: Matrix, key: ImageKey) -> ImageKey:
        """``key`` as prepared here: an auto profile's key carries a remote engine's host."""
        return selection.host_key(matrix, key, self.name if self.remote else None)


@dataclass
class Prepared:
    """What became of one image on one engine (:data:`ACTIONS`)."""

    #: The image's key on this engine (an auto profile's carries a remote engine's host).
    key: ImageKey
    action: str = "failed"
    choice: ImageChoice | None = None
    #: The image's plan, pinned to its base once the base was resolved.
    plan: build.ImagePlan | None = None
    outcome: build.BuildOutcome | None = None
    #: What the image state keeps of it (None: nothing was made or found).
    record: ImageRecord | None = None
    #: Why it was skipped or failed.
    why: str = ""
    #: A dry run: the base is not on the engine yet (it would be pulled first).
    base_missing: bool = False


@dataclass
class Ledger:
    """What preparing images made, for the image state of a results folder: every image's
    record and every driver seen, written once by :meth:`save` (thread-safe: the ssh backend
    prepares its hosts at once)."""

    results_root: Path
    records: list[ImageRecord] = field(default_factory=list)
    drivers: list[HostDriver] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, record: ImageRecord) -> None:
        with self._lock:
            self.records.append(record)

    def saw(self, driver: HostDriver) -> None:
        """A host's driver as probed (kept in the state's ``hosts``)."""
        with self._lock:
            self.drivers.append(driver)

    def save(self) -> str | None:
        """Add the records and drivers to the image state (:mod:`orchestrator.images.state`).
        Returns why it could not (a sweep goes on without: the state only serves ``images
        refresh``), None when it did."""
        with self._lock:
            records = sorted(self.records, key=lambda r: r.key)
            drivers = list(self.drivers)

        def change(state: ImageState) -> None:
            for record in records:
                state.put(record)
            for host in drivers:
                state.host_seen(host.name, host.driver, host.accelerator,
                                host.compute_capability)

        path = state_path(self.results_root)
        try:
            update_state(path, change)
        except (OSError, ConfigError) as exc:
            log.warning("image state %s not updated: %s", path, exc)
            return f"image state {path} not updated: {exc}"
        return None


def prepare_images(
    matrix: Matrix, keys: Iterable[ImageKey], engine: Engine, ledger: Ledger | None = None, *,
    dry_run: bool = False, skip_unrunnable: bool = False, keep_going: bool = False,
    on_log: Callable[[str], None] | None = None, say: Callable[[str], None] | None = None,
) -> list[Prepared]:
    """Make sure ``engine`` has the image of each key of ``matrix`` (:func:`prepare_image`),
    in order; ``say`` hears one line per image, ``on_log`` the builds' output."""
    return [prepare_image(matrix, key, engine, ledger, dry_run=dry_run,
                          skip_unrunnable=skip_unrunnable, keep_going=keep_going,
                          on_log=on_log, say=say)
            for key in keys]


def prepare_image(
    matrix: Matrix, key: ImageKey, engine: Engine, ledger: Ledger | None = None, *,
    dry_run: bool = False, skip_unrunnable: bool = False, keep_going: bool = False,
    on_log: Callable[[str], None] | None = None, say: Callable[[str], None] | None = None,
) -> Prepared:
    """Make sure ``engine`` has the image of ``key`` (the steps of the module docstring); its
    record goes into ``ledger``. ``dry_run``: build nothing, say nothing, only tell whether the
    engine has the image.

    A driver that runs no release of the image raises
    :class:`~orchestrator.plan.selection.NoRelease` (``skip_unrunnable``: the image is
    ``skipped``); a bad template variable (:class:`~orchestrator.errors.ConfigError`), a base
    that is not there or a failed build (:class:`~orchestrator.errors.BuildError`) raise too
    (``keep_going``: the image ``failed``, with the error as its ``why``)."""
    done = Prepared(engine.key(matrix, key))
    prefix = f"host {engine.name}: " if engine.remote else ""
    try:
        _prepare(matrix, done, engine, dry_run, on_log, say, prefix)
    except selection.NoRelease as exc:
        if not (skip_unrunnable or keep_going):
            raise
        done.action, done.why = "skipped", exc.why
        if say is not None:
            say(f"{prefix}not used for hardware {key.hardware!r}: {exc.why}")
        return done
    except (ConfigError, BuildError) as exc:
        if not keep_going:
            raise
        done.action, done.why = "failed", str(exc)
        return done
    if ledger is not None and done.record is not None:
        ledger.add(done.record)
    return done


def _prepare(matrix: Matrix, done: Prepared, engine: Engine, dry_run: bool,
             on_log: Callable[[str], None] | None, say: Callable[[str], None] | None,
             prefix: str) -> None:
    """The steps of :func:`prepare_image`, filling in ``done`` as they go."""
    choice, plan = build.plan_key(matrix, done.key, engine.driver)
    done.choice, done.plan = choice, plan
    old = driver_too_old(choice, engine.driver)
    if old and say is not None and not dry_run:
        say(f"{prefix}warning: {old}")
    resolve = engine.resolver(on_log)
    if dry_run:
        try:
            pinned = build.pin(plan, resolve)
        except BuildError:
            done.action, done.base_missing = "would build", True
            return
        present = build.image_id_of(build.docker_api(engine.client), pinned.tag) is not None
        outcome = build.BuildOutcome(pinned.tag, False, 0.0, image_id=None, plan=pinned)
        action = "up to date" if present else "would build"
    else:
        outcome = build.ensure_image(plan, engine.client, on_log, resolve=resolve)
        action = "built" if outcome.built else "up to date"
    done.plan = outcome.plan or plan
    done.outcome, done.action = outcome, action
    driver = engine.driver.driver if engine.driver else None
    done.record = record_of(engine.name, matrix, done.key, choice, outcome, driver)
    if say is not None and not dry_run:
        say(f"{prefix}image {outcome.tag} ({plan.template}, {choice.label}): {outcome.summary}")


def record_of(host: str, matrix: Matrix, key: ImageKey, choice: ImageChoice,
              outcome: build.BuildOutcome, driver: str | None = None) -> ImageRecord:
    """What a build of ``key``'s image on ``host`` says about it (provenance, image state).
    ``driver``: the host's driver as probed, where the release did not come from it."""
    pin_ = outcome.base_pin
    plan = outcome.plan
    return ImageRecord(
        host=host, matrix=matrix.name, matrix_file=str(matrix.path.resolve()),
        hardware=key.hardware, template=choice.template, tag=outcome.tag,
        ngc_release=key.ngc_release, how=choice.how, family=choice.family,
        release=choice.release, driver=choice.driver or driver, reason=choice.reason,
        base_image=pin_.ref if pin_ else (plan.root.base_image if plan else ""),
        base_digest=pin_.digest if pin_ else None,
        base_image_id=pin_.image_id if pin_ else None,
        image_id=outcome.image_id, built=outcome.built,
        overrides=tuple(o.shown for o in matrix.overrides),
    )


def driver_too_old(choice: ImageChoice, driver: HostDriver | None) -> str | None:
    """Why a host's driver (where probed) may not run a release the profile or a cell pins
    (None: it does, or it is not known)."""
    if driver is None or choice.how == "auto" or choice.family != "ngc" \
            or driver.accelerator != "nvidia":
        return None
    release = releases.find_release(choice.release or "")
    if release is None or driver.driver is None or release.driver_runs(driver.driver):
        return None
    return (f"driver {driver.driver} is older than NGC PyTorch {release.name} needs "
            f"(>= {release.min_driver}) for hardware {choice.hardware!r}: its cells there "
            "may fail to start (unless CUDA forward compatibility covers it; release = "
            "'auto' picks what the driver runs)")


def plan_problems(matrix: Matrix, cells: Iterable[Cell], backend: str,
                  host: HostDriver | None = None) -> list[Problem]:
    """What preparing the Docker images of ``cells`` would refuse, decided without an engine:
    a profile without an image template (:func:`orchestrator.images.build.check_image_templates`)
    and every image's plan (its template variables, the files it copies into the build context:
    :func:`orchestrator.images.build.plan_key`). A release chosen per host's driver is planned
    for ``host`` (this machine, for the docker backend: a driver that runs no release is
    refused here too); with no host, when each host is known (the ssh sweep, per host)."""
    cells = [c for c in cells if not matrix.profile(c).apptainer_runtime]
    try:
        build.check_image_templates(matrix, cells, backend)
    except ConfigError as exc:
        return list(exc.problems)
    problems: list[Problem] = []
    for key in selection.needed_keys(matrix, cells):
        if key.ngc_release is None and selection.is_auto(matrix, key.hardware) and host is None:
            continue
        try:
            build.plan_key(matrix, key, host)
        except ConfigError as exc:
            problems += [p for p in exc.problems if p not in problems]
    return problems


def base_problems(matrix: Matrix, cells: Iterable[Cell], engine: EngineProbe,
                  host: HostDriver | None = None, where: str = "this machine"
                  ) -> list[Requirement]:
    """The base images of the Docker images ``cells`` need, against ``engine``
    (:func:`orchestrator.local.engine.engine_probe`; each base asked for once): one it does not
    have and cannot pull (built or imported locally: no registry in its name) is a requirement
    of kind ``image`` that is not met (the sweep's build would stop on it:
    :func:`orchestrator.images.build.engine_resolver`); a registry base it does not have is
    pulled when the sweep prepares, a requirement to check there (registry access). Images
    whose plan fails are :func:`plan_problems`' to report."""
    cells = [c for c in cells if not matrix.profile(c).apptainer_runtime]
    have: dict[str, bool] = {}
    problems: list[Requirement] = []
    for key in selection.needed_keys(matrix, cells):
        if key.ngc_release is None and selection.is_auto(matrix, key.hardware) and host is None:
            continue
        try:
            ref = build.plan_key(matrix, key, host)[1].root.base_image
        except ConfigError:
            continue
        if ref not in have:
            have[ref] = engine.image_exists(ref)
        if have[ref]:
            continue
        profile = matrix.profiles[key.hardware]
        fld = (f"hardware.{key.hardware}.image_vars.base_image"
               if "base_image" in profile.image_vars else f"hardware.{key.hardware}.image")
        if build.registry_ref(ref):
            problems.append(Requirement(str(matrix.path), fld, (
                f"base image {ref} is not on {where}'s Docker engine: the sweep pulls it "
                "first (registry access; NGC images are 10-20 GB)"), kind="image",
                state=UNCHECKED))
        else:
            problems.append(Requirement(str(matrix.path), fld, (
                f"base image {ref} is not on {where} and it is not a registry reference to "
                "pull: build or load it there (`docker load`, `docker tag`; the test stand-ins: "
                "tests/infra/make-base-image.sh), or set base_image to one the engine has"),
                kind="image"))
    return list(dict.fromkeys(problems))


def planned_tag(matrix: Matrix, cell: Cell, host: HostDriver | None = None,
                plans: build.ImagePlans | None = None) -> str:
    """The tag of the image ``cell`` runs, as planned without an engine (a dry run): it covers
    the build context; the build pins it to the base's digest or ID. A release chosen per
    host's driver (``release = "auto"``) is planned for ``host``'s, and is said to be chosen
    so when no host is given (or the host's driver runs no release). ``plans``: the matrix's
    image plans made so far (each image planned once however many cells run it)."""
    key = selection.image_key(matrix, cell)
    if key.ngc_release is None and selection.is_auto(matrix, key.hardware) and host is None:
        return f"<release chosen from each host's driver: template {matrix.profile(cell).image}>"
    try:
        return (plans or build.ImagePlans(matrix)).get(key, host)[1].tag
    except ConfigError as exc:  # e.g. this machine's driver runs no release of it
        return f"<no image: {exc.problems[0].message}>"
