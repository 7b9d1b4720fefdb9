"""The nightly rebuild step (``orchestrate images refresh``): rebuild, host by host, exactly the
images whose inputs changed since the last build recorded, and say what changed and why.

The steps, each a plain function over plain values:

1. :func:`wanted_images` — which images to keep fresh: those the given matrices need (every
   profile and pinned ``ngc_release`` their cells use, on every inventory host that may run the
   profile: :func:`orchestrator.plan.selection.host_profiles`; Docker images only, as the ssh
   backend
   builds them: a ``runtime = "apptainer"`` profile's .sif is its sweep's to make), else those
   the image state recorded for the inventory's hosts (their matrix files read again: a sweep's
   builds are kept fresh without naming its matrix).
2. :func:`refresh_host` — per host, over a verified SSH connection: probe its GPUs and driver
   (:func:`orchestrator.catalog.gpus.probe`); for each image choose the release the driver runs now
   (:func:`orchestrator.plan.selection.choose`), plan it and pin its base on the host's engine; a
   tag
   the host already has is up to date, any other is built
   (:func:`orchestrator.images.build.ensure_image`;
   ``dry_run``: only said). Each image says what changed against the record of its last build:
   driver old -> new, release old -> new, base old -> new, or other inputs (workload, variables).
3. :func:`orchestrator.images.build.remember` — the new records and the hosts' drivers go into the
state
   (``<results>/.orchestrate-images.json``, :mod:`orchestrator.images.state`); a dry run writes
   nothing.

Idempotent: a second run with nothing changed finds every tag on its host and builds nothing.
A host that cannot be reached is reported and left as it was; the other hosts still refresh.
Nothing here prints: :class:`HostRefresh` values go to the CLI.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.catalog import gpus
from orchestrator.config.inventory import Inventory, resolve_hosts
from orchestrator.errors import BuildError, ConfigError, HostError, OrchestratorError
from orchestrator.images import build
from orchestrator.images.state import ImageRecord, ImageState, load_state, state_path
from orchestrator.plan import selection
from orchestrator.plan.matrix import Matrix, load_matrix
from orchestrator.remote.connection import SshHost
from orchestrator.remote.docker_api import remote_docker_client

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Wanted:
    """One image to keep fresh on one host: a matrix profile and the release its cells pin."""

    host: str
    matrix: Matrix
    key: selection.ImageKey  # host-free; an auto profile's key gets the host when planned


@dataclass
class ImageRefresh:
    """What happened to one image on one host."""

    matrix: str
    hardware: str
    ngc_release: str | None
    #: "built", "up to date", "would build", "skipped" (the host runs no release of it),
    #: "failed"
    action: str
    old: ImageRecord | None = None
    new: ImageRecord | None = None
    #: Why it was (or would be) built, or why it was skipped or failed.
    why: str = ""
    seconds: float | None = None

    @property
    def name(self) -> str:
        """``matrix/hardware`` (``@ngc_release`` where the cells pin one)."""
        pinned = f"@{self.ngc_release}" if self.ngc_release else ""
        return f"{self.matrix}/{self.hardware}{pinned}"

    @property
    def changed(self) -> bool:
        return self.action in ("built", "would build")


@dataclass
class HostRefresh:
    """What a refresh found and did on one host."""

    host: str
    reachable: bool = True
    reason: str = ""
    old_driver: str | None = None
    driver: selection.HostDriver | None = None
    images: list[ImageRefresh] = field(default_factory=list)

    @property
    def driver_changed(self) -> bool:
        new = self.driver.driver if self.driver else None
        return self.old_driver is not None and new != self.old_driver


# --- 1. which images -----------------------------------------------------------------------------


def wanted_images(inventory: Inventory, matrices: Sequence[Matrix], state: ImageState,
                  hosts: Sequence[str] | None = None) -> tuple[list[Wanted], list[str]]:
    """The images to keep fresh on the inventory's hosts (or ``hosts``), and notes on recorded
    images that cannot be (a matrix file gone or no longer valid). With no ``matrices``, the
    matrices of the state's records for those hosts are loaded again."""
    names = [h for h in inventory.names if hosts is None or h in hosts]
    notes: list[str] = []
    if not matrices:
        matrices, notes = _recorded_matrices(state, names)
    recorded = not matrices
    wanted: list[Wanted] = []
    for matrix in matrices:
        # Docker images only: an Apptainer profile's .sif is made by its sweep (ssh backend)
        cells = [c for c in matrix.cells if not matrix.profile(c).apptainer_runtime]
        try:
            profiles = selection.host_profiles(matrix, inventory)
            build.check_image_templates(matrix, cells, "ssh")
        except ConfigError as exc:
            if not recorded:
                raise  # a matrix the user named: its mistake is theirs to fix now
            notes.append(f"{matrix.path}: not refreshed with {inventory.source}: {exc}")
            continue
        for key in selection.needed_keys(matrix, cells):
            wanted += [Wanted(h, matrix, key) for h in names if key.hardware in profiles[h]]
    return wanted, notes


def _recorded_matrices(state: ImageState, hosts: Iterable[str]) -> tuple[list[Matrix], list[str]]:
    files = sorted({r.matrix_file for h in hosts for r in state.of_host(h)})
    matrices, notes = [], []
    for file in files:
        try:
            matrices.append(load_matrix(Path(file)))
        except ConfigError as exc:
            notes.append(f"{file}: not refreshed, the matrix recorded by an earlier build "
                         f"cannot be read: {exc}")
    return matrices, notes


# --- 2. one host --------------------------------------------------------------------------------


def refresh_host(
    inventory: Inventory, name: str, wanted: Sequence[Wanted], state: ImageState, *,
    dry_run: bool = False, on_log: Callable[[str], None] | None = None,
) -> HostRefresh:
    """Probe host ``name``, then bring each of its ``wanted`` images up to date (see the module
    docstring). A host that cannot be reached (or refuses us) is reported, never raised."""
    report = HostRefresh(name, old_driver=(state.hosts.get(name) or {}).get("driver"))
    ssh = SshHost.from_inventory(inventory, name, resolve_hosts(inventory)[name])
    client = None
    try:
        ssh.connect()
        facts = gpus.probe(ssh, timeout=inventory.options.command_timeout)
        report.driver = selection.HostDriver.from_facts(facts)
        client = remote_docker_client(ssh)
        resolve = build.engine_resolver(client, pull=not dry_run, where=f"host {name}",
                                        on_log=on_log)
        for item in wanted:
            report.images.append(_refresh_image(item, report.driver, client, resolve, state,
                                                dry_run, on_log))
    except HostError as exc:
        report.reachable, report.reason = False, str(exc)
    except OrchestratorError as exc:  # the engine over SSH answers nothing usable
        report.reachable, report.reason = False, f"host {name}: {exc}"
    finally:
        if client is not None:
            client.close()
        ssh.close()
    return report


def _refresh_image(item: Wanted, driver: selection.HostDriver, client: object,
                   resolve: Callable[[str], build.BasePin], state: ImageState, dry_run: bool,
                   on_log: Callable[[str], None] | None) -> ImageRefresh:
    host, matrix = item.host, item.matrix
    key = selection.host_key(matrix, item.key, host)
    old = state.images.get((host, str(matrix.path.resolve()), key.hardware, key.ngc_release))
    result = ImageRefresh(matrix.name, key.hardware, key.ngc_release, "failed", old)
    try:
        choice, plan = build.plan_key(matrix, key, driver)
    except selection.NoRelease as exc:
        result.action, result.why = "skipped", exc.why
        return result
    except ConfigError as exc:
        result.why = str(exc)
        return result
    try:
        pinned = build.pin(plan, resolve)
    except BuildError as exc:
        if not dry_run:
            result.why = str(exc)
            return result
        result.action = "would build"
        result.why = f"{_why(old, None, choice, driver)}; base {plan.root.base_image} to pull"
        return result
    present = build.image_id_of(build.docker_api(client), pinned.tag) is not None
    if dry_run:
        outcome = build.BuildOutcome(pinned.tag, False, 0.0, image_id=None, plan=pinned)
    else:
        try:
            outcome = build.ensure_image(pinned, client, on_log)
        except BuildError as exc:
            result.why = str(exc)
            return result
    result.new = build.record_of(host, matrix, key, choice, outcome, driver.driver)
    if present:
        result.action = "up to date"
        if old is not None and old.tag != pinned.tag:
            result.why = "already on the host (built by another sweep or for another host)"
    else:
        result.action = "would build" if dry_run else "built"
        result.why = _why(old, result.new, choice, driver)
        result.seconds = None if dry_run else outcome.seconds
    return result


def _why(old: ImageRecord | None, new: ImageRecord | None, choice: selection.ImageChoice,
         driver: selection.HostDriver) -> str:
    """What changed since ``old`` was built: driver, release, base bits, or other inputs."""
    if old is None:
        return f"no build recorded ({choice.label}: {choice.reason or 'as the profile says'})"
    parts = []
    if choice.how == "auto" and old.driver != driver.driver:
        parts.append(f"driver {old.driver or '(unknown)'} -> {driver.driver or '(none)'}")
    if old.release != choice.release:
        parts.append(f"release {old.release or '(unknown)'} -> {choice.release or '(unknown)'}")
    if new is not None and old.base_image != new.base_image:
        parts.append(f"base {old.base_image} -> {new.base_image}")
    elif new is not None and old.base_pin != new.base_pin:
        parts.append(f"base {new.base_image} now {_short(new.base_pin)} (was "
                     f"{_short(old.base_pin)})")
    if not parts:
        parts.append("its other inputs changed (workload, template or variables)")
    return ", ".join(parts)


def _short(pin: str | None) -> str:
    if not pin:
        return "(unknown)"
    return pin if len(pin) <= 24 else f"{pin[:19]}...{pin[-4:]}"


# --- the whole step ------------------------------------------------------------------------------


@dataclass
class RefreshReport:
    """Every host's refresh, in inventory order, and notes on what could not be considered."""

    hosts: list[HostRefresh]
    notes: list[str]
    state_file: Path
    problem: str | None = None  # the state could not be written

    @property
    def changed(self) -> list[ImageRefresh]:
        return [i for h in self.hosts for i in h.images if i.changed]

    @property
    def ok(self) -> bool:
        """Every host reached and no image failed."""
        return all(h.reachable and all(i.action != "failed" for i in h.images)
                   for h in self.hosts) and self.problem is None


def refresh(
    inventory: Inventory, matrices: Sequence[Matrix], results_root: Path, *,
    hosts: Sequence[str] | None = None, dry_run: bool = False, jobs: int = 8,
    on_log: Callable[[str], None] | None = None,
) -> RefreshReport:
    """Run the refresh over the inventory's hosts (see the module docstring)."""
    path = state_path(results_root)
    state = load_state(path)
    for name in hosts or []:
        inventory.get(name)  # a ConfigError naming the unknown host, before connecting anywhere
    wanted, notes = wanted_images(inventory, matrices, state, hosts)
    names = [h for h in inventory.names if hosts is None or h in hosts]
    by_host = {h: [w for w in wanted if w.host == h] for h in names}

    def one(name: str) -> HostRefresh:
        log_line = (lambda line: on_log(f"{name} | {line}")) if on_log else None
        return refresh_host(inventory, name, by_host[name], state, dry_run=dry_run,
                            on_log=log_line)

    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(names)))) as pool:
        reports = list(pool.map(one, names))
    report = RefreshReport(reports, notes, path)
    if not dry_run:
        records = [i.new for h in reports for i in h.images if i.new is not None]
        drivers = [h.driver for h in reports if h.driver is not None]
        report.problem = build.remember(results_root, records, drivers)
    return report
