"""The nightly rebuild step (``orchestrate images refresh``): rebuild, host by host, exactly the
images whose inputs changed since the last build recorded, and say what changed and why.

The steps, each a plain function over plain values:

1. :func:`wanted_images` — which images to keep fresh: those the given matrices need (every
   profile and pinned ``ngc_release`` their cells use, on every inventory host that may run the
   profile: :func:`orchestrator.plan.selection.host_profiles`; Docker images only, as the ssh
   backend builds them: a ``runtime = "apptainer"`` profile's .sif is its sweep's to make), else
   those the image state recorded for the inventory's hosts (their matrix files read again,
   with the ``--set`` overrides each build had: a sweep's builds are kept fresh without naming
   its matrix).
2. :func:`refresh_host` — per host, over a verified SSH connection: probe its GPUs and driver
   (:func:`orchestrator.catalog.gpus.probe`), then prepare each image on the host's engine as a
   sweep does (:func:`orchestrator.images.prepare.prepare_image`: the release the driver runs
   now, the base pinned there; a tag the host already has is up to date, any other is built;
   ``dry_run``: only said). Each image says what changed against the record of its last build:
   driver old -> new, release old -> new, base old -> new, or other inputs (workload, variables).
3. :meth:`orchestrator.images.prepare.Ledger.save` — the new records and the hosts' drivers go
   into the state (``<results>/.orchestrate-images.json``, :mod:`orchestrator.images.state`); a
   dry run writes nothing.

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
from orchestrator.config.redact import MASK
from orchestrator.errors import ConfigError, HostError, OrchestratorError
from orchestrator.images import build
from orchestrator.images.prepare import Engine, Ledger, Prepared, prepare_image
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
    """The matrix files the state's records name, each read with the ``--set`` overrides its
    build had (one a secret was set by is read without it: the record masks the value)."""
    files = sorted({(r.matrix_file, r.overrides) for h in hosts for r in state.of_host(h)})
    matrices, notes = [], []
    for file, overrides in files:
        replayed = [o for o in overrides if MASK not in o]
        if len(replayed) < len(overrides):
            notes.append(f"{file}: a --set of a secret is not replayed (recorded as {MASK})")
        try:
            matrices.append(load_matrix(Path(file), overrides=replayed))
        except ConfigError as exc:
            notes.append(f"{file}: not refreshed, the matrix recorded by an earlier build "
                         f"cannot be read: {exc}")
    return matrices, notes


# --- 2. one host --------------------------------------------------------------------------------


def refresh_host(
    inventory: Inventory, name: str, wanted: Sequence[Wanted], state: ImageState,
    ledger: Ledger | None = None, *, dry_run: bool = False,
    on_log: Callable[[str], None] | None = None,
) -> HostRefresh:
    """Probe host ``name``, then bring each of its ``wanted`` images up to date (see the module
    docstring; what was built goes into ``ledger``). A host that cannot be reached (or refuses
    us) is reported, never raised."""
    report = HostRefresh(name, old_driver=(state.hosts.get(name) or {}).get("driver"))
    ssh = SshHost.from_inventory(inventory, name, resolve_hosts(inventory)[name])
    client = None
    try:
        ssh.connect()
        facts = gpus.probe(ssh, timeout=inventory.options.command_timeout)
        report.driver = selection.HostDriver.from_facts(facts)
        if ledger is not None:
            ledger.saw(report.driver)
        client = remote_docker_client(ssh)
        engine = Engine(name, client, report.driver, remote=True, pull=not dry_run)
        for item in wanted:
            prepared = prepare_image(item.matrix, item.key, engine, ledger, dry_run=dry_run,
                                     keep_going=True, on_log=on_log)
            report.images.append(_refreshed(item, prepared, report.driver, state))
    except HostError as exc:
        report.reachable, report.reason = False, str(exc)
    except OrchestratorError as exc:  # the engine over SSH answers nothing usable
        report.reachable, report.reason = False, f"host {name}: {exc}"
    finally:
        if client is not None:
            client.close()
        ssh.close()
    return report


def _refreshed(item: Wanted, prepared: Prepared, driver: selection.HostDriver,
               state: ImageState) -> ImageRefresh:
    """What ``prepared`` means for the refresh report: the action, and why, against the record
    of the image's last build."""
    key, choice = prepared.key, prepared.choice
    old = state.images.get((item.host, str(item.matrix.path.resolve()), key.hardware,
                            key.ngc_release))
    result = ImageRefresh(item.matrix.name, key.hardware, key.ngc_release, prepared.action, old,
                          prepared.record, prepared.why)
    if choice is None or prepared.action in ("skipped", "failed"):
        return result
    if prepared.base_missing:
        assert prepared.plan is not None
        base = prepared.plan.root.base_image
        result.why = f"{_why(old, None, choice, driver)}; base {base} to pull"
    elif prepared.action == "up to date":
        if old is not None and prepared.outcome is not None and old.tag != prepared.outcome.tag:
            result.why = "already on the host (built by another sweep or for another host)"
    else:
        result.why = _why(old, prepared.record, choice, driver)
        if prepared.action == "built" and prepared.outcome is not None:
            result.seconds = prepared.outcome.seconds
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


@dataclass(frozen=True)
class PlannedHost:
    """What a refresh would do on one host, decided without connecting to it (``--dry-run``)."""

    host: str
    address: str
    #: The driver the state last saw there (None: never probed).
    last_driver: str | None
    #: Each image to check: its name (``matrix/hardware[@release]``) and its last build (None:
    #: none recorded).
    images: list[tuple[str, ImageRecord | None]]


def plan_refresh(inventory: Inventory, matrices: Sequence[Matrix], results_root: Path, *,
                 hosts: Sequence[str] | None = None) -> tuple[list[PlannedHost], list[str]]:
    """The refresh's plan from the inventory, the matrices and the image state alone: the hosts
    it would probe and the images it would check on each (with their last builds). Connects to
    nothing and writes nothing; what would be rebuilt depends on each host's driver now, which
    only the refresh itself (or ``dry_run``: probe and compare) learns."""
    state = load_state(state_path(results_root))
    for name in hosts or []:
        inventory.get(name)
    wanted, notes = wanted_images(inventory, matrices, state, hosts)
    out = []
    for name in (h for h in inventory.names if hosts is None or h in hosts):
        entry = inventory.get(name)
        where = f"{entry.user + '@' if entry.user else ''}{entry.address}" + (
            f":{entry.port}" if entry.port else "")
        images = []
        for item in (w for w in wanted if w.host == name):
            label = ImageRefresh(item.matrix.name, item.key.hardware, item.key.ngc_release,
                                 "planned").name
            old = state.images.get((name, str(item.matrix.path.resolve()), item.key.hardware,
                                    item.key.ngc_release))
            images.append((label, old))
        out.append(PlannedHost(name, where, (state.hosts.get(name) or {}).get("driver"),
                               images))
    return out, notes


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

    ledger = None if dry_run else Ledger(results_root)

    def one(name: str) -> HostRefresh:
        log_line = (lambda line: on_log(f"{name} | {line}")) if on_log else None
        return refresh_host(inventory, name, by_host[name], state, ledger, dry_run=dry_run,
                            on_log=log_line)

    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(names)))) as pool:
        reports = list(pool.map(one, names))
    report = RefreshReport(reports, notes, path)
    if ledger is not None:
        report.problem = ledger.save()
    return report
