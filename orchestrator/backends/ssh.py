"""Docker over SSH: each cell in a container on a lab host's engine, placed GPU-aware.

This mirrors the local :mod:`~orchestrator.backends.docker` backend the way fabric's ``Remote``
mirrors ``Local``: the same containers (the Docker runtime's, :mod:`orchestrator.runtimes.docker`),
the same image preparation (:mod:`orchestrator.images.prepare`), the same labels, the same
run-folder shape. It shares those with the docker backend and nothing else (it never holds a
client for this machine's engine). What differs:

* **Transport.** Each host's engine is reached with the Docker SDK over our own verified SSH
  connection (:func:`orchestrator.remote.docker_api.remote_docker_client`): host keys, key file,
  user and port are the inventory's.
* **Placement.** A :class:`~orchestrator.plan.placement.GpuPool` over the inventory's hosts hands
  out :class:`~orchestrator.plan.placement.Allocation` values (hosts and GPU ids); several cells
  run at once, never two on one GPU. A profile runs on the hosts it lists (``hosts = [...]``),
  else on the hosts tagged with its name. The allocation travels with the cell: ``spec`` reads
  its hosts and GPU ids, ``release`` gives it back to the pool.
* **Locks.** Against other controllers' sweeps, each cell locks its GPUs on each of its hosts
  while it runs (:mod:`orchestrator.remote.ssh_locker`: the local locks' files, order and messages).
* **Images** are prepared on each host that may run them, once per host and image, in
  :meth:`SshDockerBackend.prepare` (:func:`orchestrator.images.prepare.prepare_images`:
  content-hash tags, so an up-to-date host builds nothing), each pinned to the bits of its base
  on that host's engine. A profile with ``release = "auto"`` gets, on every host, the release
  that host's driver runs (probed with ``nvidia-smi`` / ``hl-smi``:
  :mod:`orchestrator.plan.selection`), so hosts with different drivers run different images; a
  host whose driver runs none of them is taken out of that profile's hosts (said why). Every
  cell's result records the image it ran (image ID, base, release, the host's driver), and the
  builds are added to the results folder's image state (:mod:`orchestrator.images.state`) that
  ``orchestrate images refresh`` compares with.
* **Output.** A cell writes into ``/tmp/orchestrate/<run id>/<cell id>/attempt-<n>`` on its host
  (mounted at ``/orchestrate/out``); its log streams back live; when it ends the files are copied
  into the local cell folder (:class:`~orchestrator.backends.remote_executions.RemoteExecution`).
* **Lost hosts.** A host that stops answering ends its cells with ``host_lost``; the pool stops
  using it and the sweep retries those cells elsewhere.
* **Multi-node** cells (``multi_node = true`` and more GPUs than one host has) run one container
  per host, each with its :class:`~orchestrator.plan.launch.NodeRole` (torchrun ``--nnodes
  --node_rank --rdzv_endpoint=<first host>:PORT``), on the host network.

**Apptainer** profiles (``runtime = "apptainer"``: :mod:`orchestrator.runtimes.apptainer`) need
no engine on their hosts: ``prepare`` checks the runtime binary and bind sources on each host
and makes its ``.sif`` there (:class:`orchestrator.images.sif.SshMachine`); a cell is
``apptainer exec ... IMAGE.sif <argv>`` run over its own connection
(:class:`~orchestrator.backends.remote_executions.RemoteProcessExecution`), its GPUs pinned by an
``--env`` argument, the variables ``--env`` cannot carry (secrets among them) written to the
command's stdin (:func:`orchestrator.runtimes.apptainer.remote_command`). One host per cell.

Each running cell has its own SSH connection (sshd allows 10 sessions per connection by default;
a cell holds two long-lived channels), so many cells on one host never exhaust it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.backends.base import Backend, Execution, RunOptions
from orchestrator.backends.remote_executions import (
    LostExecution,
    RemoteExecution,
    RemoteNode,
    RemoteProcessExecution,
    close_node,
    remote_dir,
    remote_run_dir,
    remove_remote_dir,
)
from orchestrator.backends.target import HERE, Target
from orchestrator.catalog import gpus
from orchestrator.config.inventory import (
    ConnectTarget,
    HostEntry,
    HostOptions,
    Inventory,
    load_hosts,
    resolve_hosts,
)
from orchestrator.errors import (
    SHORT,
    ConfigError,
    HostError,
    HostUnreachable,
    LaunchError,
    Problem,
    Requirement,
)
from orchestrator.images import build, sif
from orchestrator.images.prepare import (
    Engine,
    Ledger,
    driver_too_old,
    plan_problems,
    planned_tag,
    prepare_images,
)
from orchestrator.images.state import ImageRecord
from orchestrator.local.engine import (
    LABEL_RUN,
    check_sdk,
    container_labels,
    is_engine_error,
    remove_containers,
)
from orchestrator.local.locks import Holder, Locker, LockRequest
from orchestrator.plan import placement, selection
from orchestrator.plan.launch import LaunchSpec, node_roles
from orchestrator.plan.matrix import Cell, Matrix
from orchestrator.plan.placement import Allocation
from orchestrator.remote.connection import SshHost
from orchestrator.remote.docker_api import remote_docker_client
from orchestrator.remote.ssh_locker import SshLocker, remote_lock_dir
from orchestrator.results.folders.run_folder import CellResult, RunPaths, Status
from orchestrator.runtimes import apptainer
from orchestrator.runtimes.docker import container_kwargs, container_spec

log = logging.getLogger(__name__)

NO_INVENTORY_HINT = (
    "the ssh backend needs a hosts inventory: pass --hosts FILE, or set hosts = \"FILE\" under "
    "[matrix] (see hosts/example.toml)"
)


@dataclass
class RemoteHost:
    """A lab host the sweep uses: its SSH connection and Docker client (for prepare/cleanup)."""

    name: str
    ssh: SshHost
    client: Any = None
    api_version: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def connect(self, engine: bool = True) -> RemoteHost:
        """Connect (verifying the host key) and open the engine client once (``engine``
        False: not needed, the host runs Apptainer cells only)."""
        with self.lock:
            self.ssh.connect()
            if self.client is None and engine:
                self.client = remote_docker_client(self.ssh)
                self.api_version = self.client.api.api_version
        return self

    def close(self) -> None:
        """Close the engine client and the connection."""
        with self.lock:
            if self.client is not None:
                try:
                    self.client.close()
                except Exception as exc:  # already broken
                    log.debug("closing the engine client of %s: %s", self.name, exc)
                self.client = None
            self.ssh.close()


def _unreachable(exc: BaseException) -> bool:
    """Cannot reach the host (as opposed to refused: host keys, login): try another."""
    return isinstance(exc, HostUnreachable)


def load_inventory(matrix: Matrix, hosts_file: Path | None
                   ) -> tuple[Inventory, dict[str, ConnectTarget]]:
    """The hosts inventory an ssh sweep of ``matrix`` reads, and every host resolved (its ssh
    config read once): no host is contacted. No inventory, or an invalid one, is a
    :class:`ConfigError` naming the file and field."""
    if hosts_file is None:
        raise ConfigError([Requirement(str(matrix.path), "matrix.hosts", NO_INVENTORY_HINT,
                                       kind="inventory")])
    inventory = load_hosts(hosts_file)
    return inventory, resolve_hosts(inventory)


def declared_driver(host: HostEntry, device: str) -> selection.HostDriver | None:
    """The driver an inventory declares for ``host`` (``driver``, and ``gpu`` for its
    accelerator and compute capability; else the profile's ``device``), None where it declares
    none: what picks an auto release there, before the sweep probes the host."""
    if host.driver is None:
        return None
    accelerator: str | None = {"cuda": "nvidia", "hpu": "gaudi"}.get(device)
    if host.gpu is not None:
        accelerator = "gaudi" if gpus.gaudi_generation(host.gpu) else "nvidia"
    cc = gpus.compute_capability(host.gpu) if host.gpu else None
    return selection.HostDriver(host.name, host.driver, accelerator, cc)


def inventory_shortfalls(matrix: Matrix, cells: list[Cell], inventory: Inventory,
                         tags: dict[str, set[str]]) -> list[Requirement]:
    """What the inventory says, without contacting a host, of cells it cannot place as planned
    (the sweep starts; the others run): a profile no host may run, cells that need more GPUs
    than any of its hosts lists (where every such host lists its ``gpus``), and, where hosts
    declare their ``driver``, a profile whose release none of them runs (an auto release: the
    driver picks none; its cells would be recorded unplaceable) or a pinned release a host's
    driver is older than (its cells may fail to start there)."""
    file = str(matrix.path)
    found: list[Requirement] = []
    by_hw: dict[str, list[Cell]] = {}
    for cell in cells:
        by_hw.setdefault(cell.hardware, []).append(cell)
    for hw, group in sorted(by_hw.items()):
        profile = matrix.profiles[hw]
        hosts = [h for h in inventory.hosts if hw in tags.get(h.name, set())]
        ids = tuple(c.id for c in group)
        if not hosts:
            found.append(Requirement(file, f"hardware.{hw}", (
                f"no host of {inventory.source} may run hardware {hw!r} (none carries the tag "
                f"{hw!r}, and the profile lists no hosts): its {len(group)} cells would be "
                "recorded unplaceable"), kind="inventory", cells=ids, state=SHORT))
            continue
        if profile.image is not None and not profile.apptainer_runtime:
            found += _declared_drivers(matrix, hw, group, hosts, inventory)
        if profile.multi_node or not placement.holds_local_gpus(profile) or \
                any(h.gpus is None for h in hosts):
            continue  # spans hosts, needs none of theirs, or some host's GPUs are discovered
        most = max(len(h.gpus or ()) for h in hosts)
        over = [c for c in group if c.params.gpus > most]
        if over:
            found.append(Requirement(file, f"hardware.{hw}", (
                f"{len(over)} cells ({', '.join(c.id for c in over[:2])}"
                f"{', ...' if len(over) > 2 else ''}) need more GPUs than any host of "
                f"{inventory.source} that may run them lists (at most {most}): they would be "
                "recorded unplaceable"), kind="GPUs", cells=tuple(c.id for c in over),
                state=SHORT))
    return found


def _declared_drivers(matrix: Matrix, hw: str, group: list[Cell], hosts: list[HostEntry],
                      inventory: Inventory) -> list[Requirement]:
    """A profile's image on the hosts that declare a driver (:func:`inventory_shortfalls`)."""
    file = str(matrix.path)
    device = matrix.profiles[hw].device
    declared = {h.name: d for h in hosts if (d := declared_driver(h, device)) is not None}
    if not declared:
        return []
    found: list[Requirement] = []
    excluded: dict[str, str] = {}
    for key in selection.needed_keys(matrix, group):
        for name, driver in declared.items():
            try:
                choice = selection.choose(matrix, key, driver)
            except selection.NoRelease as exc:
                excluded[name] = exc.why
                continue
            except ConfigError:
                continue  # the image's own problems: plan_problems says them
            old = driver_too_old(choice, driver)
            if old:
                cells = tuple(c.id for c in group if selection.image_key(matrix, c) == key)
                found.append(Requirement(file, f"hardware.{hw}", (
                    f"host {name} of {inventory.source}: its declared {old}"), kind="driver",
                    cells=cells, state=SHORT))
    if excluded and len(excluded) == len(hosts):
        why = "; ".join(f"{name}: {text}" for name, text in sorted(excluded.items()))
        found.append(Requirement(file, f"hardware.{hw}.release", (
            f"no host of {inventory.source} that may run hardware {hw!r} has a driver that "
            f"runs a release of its image ({why}): its {len(group)} cells would be recorded "
            "unplaceable"), kind="driver", cells=tuple(c.id for c in group), state=SHORT))
    return found


def _make_output_dir(ssh: SshHost, spec: LaunchSpec) -> None:
    """Make the cell attempt's folder on its host, writable by whoever the cell runs as."""
    assert spec.output_dir is not None
    code, _, err = ssh.run(["install", "-d", "-m", "0777", "--", spec.output_dir], timeout=60)
    if code != 0:
        raise LaunchError(f"{spec.cell_id}: cannot make {spec.output_dir} on {ssh.name}: "
                          f"{err.strip()}")


class _HostGone(Exception):
    """A host stopped answering while a cell's container was being started on it."""

    def __init__(self, host: str, detail: str):
        super().__init__(detail)
        self.host = host
        self.detail = detail


class SshDockerBackend(Backend):
    """Run cells in containers on lab hosts' Docker engines over SSH, several at once."""

    name = "ssh"

    def __init__(self, matrix: Matrix, paths: RunPaths, options: RunOptions):
        super().__init__(matrix, paths, options)
        self.inventory: Inventory
        self.targets: dict[str, ConnectTarget]
        if options.dry_run and options.hosts_file is None:  # shown with no host to go to
            self.inventory, self.targets = Inventory(matrix.path, HostOptions(), ()), {}
        else:
            self.inventory, self.targets = load_inventory(matrix, self.options.hosts_file)
        self.placement_tags = self._placement_tags()
        self.hosts: dict[str, RemoteHost] = {}
        #: every image prepared, by (host, key)
        self.images: dict[tuple[str, selection.ImageKey], ImageRecord] = {}
        #: each host's driver as probed in prepare (hosts not probed: absent)
        self.drivers: dict[str, selection.HostDriver] = {}
        #: hardware -> {host: why it cannot run that profile's image there}
        self.excluded: dict[str, dict[str, str]] = {}
        self._pool: placement.GpuPool | None = None
        self._lock = threading.RLock()
        self._lost: dict[str, str] = {}  # host -> why it was taken out
        #: the .sif of each Apptainer image on each host: host -> {key: path}
        self.host_sifs: dict[str, dict[selection.ImageKey, str]] = {}
        #: the lock folder on the hosts (None: no remote locks)
        self.lock_dir = remote_lock_dir(self.inventory)

    @classmethod
    def check_available(cls) -> None:
        check_sdk()

    @classmethod
    def runtime_problems(cls, matrix: Matrix, cells: Iterable[Cell]) -> list[Problem]:
        """None here: the cells run on the hosts, where :meth:`prepare` checks each one."""
        return []

    @classmethod
    def prepare_problems(cls, matrix: Matrix, cells: Iterable[Cell],
                         hosts_file: Path | None = None, *, target: Target = HERE
                         ) -> list[Problem]:
        """The hosts inventory (there, read and resolved, no host contacted:
        :func:`load_inventory`; every host a profile names in it), the Docker images' plans
        (:func:`orchestrator.images.prepare.plan_problems`) and the Apptainer images' (the base's).
        What only a host can tell (its driver, its runtime) is checked on it when the sweep
        reaches it."""
        cells = list(cells)
        problems: list[Problem] = []
        try:
            inventory, _ = load_inventory(matrix, hosts_file)
            problems += inventory_shortfalls(matrix, cells, inventory,
                                             selection.host_profiles(matrix, inventory))
        except ConfigError as exc:
            problems += exc.problems
        return (problems + plan_problems(matrix, cells, cls.name)
                + super().prepare_problems(matrix, cells, target=target))

    # --- hosts and placement ---------------------------------------------------------------

    def _placement_tags(self) -> dict[str, set[str]]:
        """host -> the profile names it may run: listed in ``hosts``, else tagged with the name."""
        return selection.host_profiles(self.matrix, self.inventory)

    def _host(self, name: str) -> RemoteHost:
        with self._lock:
            host = self.hosts.get(name)
            if host is None:
                host = self.hosts[name] = RemoteHost(name, self._ssh(name))
            return host

    def _ssh(self, name: str) -> SshHost:
        """A new (unconnected) SSH connection to ``name``."""
        return SshHost.from_inventory(self.inventory, name, self.targets[name])

    def _build_pool(self, discovered: dict[str, list[int]] | None = None) -> placement.GpuPool:
        specs = [
            dataclasses.replace(spec, tags=frozenset(self.placement_tags[spec.name]))
            for spec in placement.hosts_from_inventory(self.inventory, discovered)
        ]
        pool = placement.GpuPool(specs)
        for host, why in self._lost.items():
            pool.mark_host_lost(host)
            log.info("host %s out of the pool: %s", host, why)
        return pool

    @property
    def pool(self) -> placement.GpuPool:
        """The GPU pool (built in :meth:`prepare`; from the inventory's GPU lists before)."""
        with self._lock:
            if self._pool is None:
                self._pool = self._build_pool()
            return self._pool

    def _request(self, cell: Cell) -> placement.Request:
        profile = self.matrix.profile(cell)
        count = cell.params.gpus
        if profile.device == "cpu":  # GPU slots on hosts that have GPU ids, kept from GPU cells
            if not any(s.gpu_ids for s in self.pool.hosts if cell.hardware in s.tags):
                count = 0  # hosts with no GPU ids: limited by max_concurrent only
        elif not placement.holds_local_gpus(profile):
            count = 0  # remote GPUs, attached by the Bitfusion client
        return placement.Request(
            cell_id=cell.id, tag=cell.hardware, gpus=count,
            exclusive_host=self.matrix.settings.one_cell_per_host,
            allow_multi_node=profile.multi_node,
        )

    def unplaceable(self, cell: Cell) -> str | None:
        with self._lock:
            reason = self.pool.why_unplaceable(self._request(cell))
        excluded = self.excluded.get(cell.hardware)
        if reason and excluded and not any(cell.hardware in ts
                                           for ts in self.placement_tags.values()):
            return (f"no host runs an image of hardware {cell.hardware!r}: "
                    + "; ".join(f"{h}: {why}" for h, why in sorted(excluded.items())))
        if reason and cell.hardware not in {t for ts in self.placement_tags.values() for t in ts}:
            profile = self.matrix.profile(cell)
            return (f"no host in {self.inventory.source} may run hardware {cell.hardware!r}: "
                    + ("none of its hosts is in the inventory" if profile.hosts else
                       f"tag a host with {cell.hardware!r} or list hosts in "
                       f"hardware.{cell.hardware}.hosts"))
        return reason

    def allocate(self, cell: Cell) -> Allocation | None:
        with self._lock:
            return self.pool.try_acquire(self._request(cell))

    def lock_requests(self, cell: Cell, allocation: Allocation) -> tuple[LockRequest, ...]:
        """The GPUs (else the CPU; all of it for a cell that holds its hosts) of every host of
        the allocation, hosts in name order (so two sweeps cannot deadlock), each locked on
        that host (:mod:`orchestrator.remote.ssh_locker`); nothing when the inventory turns remote
        locks off (``lock_dir = ""``)."""
        if self.lock_dir is None:
            return ()
        return tuple(LockRequest(slot.host, slot.gpu_ids, allocation.exclusive)
                     for slot in sorted(allocation.slots, key=lambda s: s.host or "")
                     if slot.host is not None)

    def locker(self, request: LockRequest, holder: Holder) -> Locker:
        """``request``'s locks, held on its host over a connection of their own."""
        assert self.lock_dir is not None
        return SshLocker(request, holder, self._ssh(request.host), self.lock_dir)

    def release(self, cell: Cell, allocation: Allocation) -> None:
        with self._lock:
            self.pool.release(allocation)  # False (nothing to do) when its host was lost

    def mark_host_lost(self, host: str, why: str) -> None:
        """Stop placing cells on ``host`` (its running cells end as host_lost)."""
        with self._lock:
            if host in self._lost:
                return
            self._lost[host] = why
            if self._pool is not None:
                self._pool.mark_host_lost(host)
        log.warning("host %s lost: %s", host, why)

    def _reachable(self, name: str) -> bool:
        """Whether ``name`` answers a fresh SSH connection and its engine a ping."""
        ssh = self._ssh(name)
        client = None
        try:
            ssh.connect()
            client = remote_docker_client(ssh, version=self._host(name).api_version, timeout=15)
            return bool(client.ping())
        except Exception as exc:  # refused, timed out, engine gone
            log.info("host %s does not answer: %s", name, exc)
            return False
        finally:
            if client is not None:
                client.close()
            ssh.close()

    # --- prepare: connect, discover GPUs, build images per host --------------------------------

    def prepare(self, cells: list[Cell], on_log: Callable[[str], None] | None = None) -> None:
        """Connect to every host the cells may use, discover GPUs (and, for profiles whose
        release is auto, the driver), prepare each host's images on it
        (:func:`orchestrator.images.prepare.prepare_images`); record them."""
        say: Callable[[str], None] = on_log or (lambda _msg: None)
        build.check_image_templates(
            self.matrix, [c for c in cells if not self.matrix.profile(c).apptainer_runtime],
            self.name)
        every = selection.needed_keys(self.matrix, cells)
        needed = {k.hardware for k in every}
        sifs = apptainer.plan_sifs(self.matrix, cells)  # the Apptainer images, planned once
        keys = [k for k in every if k not in sifs]
        docker_profiles = {k.hardware for k in keys}
        auto = {k.hardware for k in keys
                if k.ngc_release is None and selection.is_auto(self.matrix, k.hardware)}
        wanted = [h for h in self.inventory.names
                  if self.placement_tags[h] & needed and h not in self._lost]
        discovered: dict[str, list[int]] = {}
        ledger = Ledger(self.paths.results_root)

        def connect(name: str) -> None:
            try:
                self._host(name).connect(engine=bool(self.placement_tags[name] & docker_profiles))
            except HostError as exc:
                if not _unreachable(exc):
                    raise  # unknown or changed host key, failed authentication: the user acts
                self.mark_host_lost(name, str(exc))
                say(f"host {name}: {exc}; not used in this sweep")

        def build_log(name: str) -> Callable[[str], None] | None:
            return (lambda line: say(f"{name} | {line}")) if on_log else None

        def probe(name: str, host: RemoteHost) -> gpus.HostFacts | None:
            """The host's GPUs and driver (None: it was lost while probing)."""
            try:
                facts = gpus.probe(host.ssh)  # connected above
            except HostError as exc:
                if not _unreachable(exc):
                    raise
                self.mark_host_lost(name, str(exc))
                say(f"host {name}: {exc}; not used in this sweep")
                return None
            driver = selection.HostDriver.from_facts(facts)
            with self._lock:
                self.drivers[name] = driver
            ledger.saw(driver)
            if self.inventory.get(name).gpus is None:
                discovered[name] = facts.gpu_ids
                say(f"host {name}: {len(facts.gpu_ids)} GPUs discovered")
            if self.placement_tags[name] & auto:
                say(f"host {name}: driver {driver.driver or '(none)'}"
                    + (f" ({driver.accelerator})" if driver.accelerator else ""))
            return facts

        def ready(name: str) -> None:
            host = self._host(name)
            driver = selection.HostDriver(name)
            if self.inventory.get(name).gpus is None or self.placement_tags[name] & auto:
                if probe(name, host) is None:
                    return
                driver = self.drivers[name]
            self._prepare_sifs(name, host, sifs, build_log(name), say)
            if not self.placement_tags[name] & docker_profiles:
                return
            engine = Engine(name, host.client, driver, remote=True)
            mine = [k for k in keys if k.hardware in self.placement_tags[name]]
            for prepared in prepare_images(self.matrix, mine, engine, ledger,
                                           skip_unrunnable=True, on_log=build_log(name),
                                           say=say):
                if prepared.record is None:  # skipped: the driver runs no release of it
                    self._exclude(name, prepared.key.hardware, prepared.why)
                    continue
                with self._lock:
                    self.images[(name, prepared.key)] = prepared.record

        # Every host is connected (host keys checked) before any of them builds anything.
        with ThreadPoolExecutor(max_workers=max(1, len(wanted)),
                                thread_name_prefix="prepare") as workers:
            for fut in [workers.submit(connect, name) for name in wanted]:
                fut.result()
            reached = [name for name in wanted if name not in self._lost]
            for fut in [workers.submit(ready, name) for name in reached]:
                fut.result()
        with self._lock:
            self._pool = self._build_pool(discovered)
        problem = ledger.save()
        if problem:
            say(problem)

    def _prepare_sifs(self, name: str, host: RemoteHost,
                      sifs: dict[selection.ImageKey, sif.SifPlan],
                      build_log: Callable[[str], None] | None, say: Callable[[str], None]
                      ) -> None:
        """The Apptainer images ``name`` runs (of ``sifs``): its runtime binary and bind
        sources checked there (a ConfigError naming the host), each .sif made there unless it
        is up to date (:func:`orchestrator.runtimes.apptainer.prepare`)."""
        plans = {k: p for k, p in sifs.items() if k.hardware in self.placement_tags[name]}
        if not plans:
            return
        paths = apptainer.prepare(self.matrix, (), sif.SshMachine(host.ssh), plans=plans,
                                  on_log=build_log, docker=host.client,
                                  say=lambda line: say(f"host {line}"))
        with self._lock:
            self.host_sifs[name] = paths

    def _exclude(self, host: str, hardware: str, why: str) -> None:
        """``host`` runs no image of ``hardware``: the pool places none of its cells there."""
        with self._lock:
            self.excluded.setdefault(hardware, {})[host] = why
            self.placement_tags[host].discard(hardware)

    def image_for(self, cell: Cell, host: str | None) -> ImageRecord | None:
        """What was built of ``cell``'s image on ``host`` (None: nothing was)."""
        if host is None:
            return None
        return self.images.get((host, selection.image_key(self.matrix, cell, host)))

    def _image_tag(self, cell: Cell, host: str | None) -> str | None:
        record = self.image_for(cell, host)
        return record.tag if record else None

    def provenance(self, spec: LaunchSpec) -> dict[str, Any]:
        """The base's provenance, and what the image's build on the cell's host recorded
        (image ID, base, release, the host's driver)."""
        info = super().provenance(spec)
        record = next((r for (host, _), r in self.images.items()
                       if host == spec.host and r.tag == spec.image), None)
        if record is not None:
            info.update(record.provenance())
        return info

    # --- cells --------------------------------------------------------------------------------

    def spec(self, cell: Cell, allocation: Allocation, attempt: int = 1,
             planned: str | None = None) -> LaunchSpec:
        """The cell's container on its host; a multi-node cell's spec is node 0's, with one peer
        spec per other host (each with its :class:`~orchestrator.plan.launch.NodeRole`).
        ``planned``: the image of a one-host cell as a dry run plans it (none is prepared)."""
        profile = self.matrix.profile(cell)
        program = self.matrix.program(cell)
        output_dir = remote_dir(self.paths.run_id, cell.id, attempt)
        if profile.apptainer_runtime:
            return self._apptainer_spec(cell, allocation, attempt, output_dir)
        labels = container_labels(self.matrix.name, self.paths.run_id, cell.id)
        if not allocation.multi_node:
            return container_spec(cell, profile, program,
                                  image=planned or self._image_tag(cell, allocation.host),
                                  output_dir=output_dir, labels=labels, attempt=attempt,
                                  host=allocation.host, gpu_ids=allocation.gpu_ids)
        assert allocation.host is not None  # a pool's allocation names its hosts
        self._one_release(cell, [slot.host for slot in allocation.slots if slot.host])
        roles = node_roles(allocation, self.targets[allocation.host].hostname)
        nodes = [
            container_spec(cell, profile, program, image=self._image_tag(cell, slot.host),
                           output_dir=output_dir, labels=labels, attempt=attempt,
                           host=slot.host, gpu_ids=slot.gpu_ids, node=role)
            for slot, role in zip(allocation.slots, roles, strict=True)
        ]
        return dataclasses.replace(nodes[0], peers=tuple(nodes[1:]))

    def dry_spec(self, cell: Cell) -> LaunchSpec:
        """The cell on the first host that may run it (its GPUs as an idle host would give
        them; the sweep places it on whichever such host is free), its image as planned
        (:func:`orchestrator.images.prepare.planned_tag`; ``release = "auto"``: each host's);
        no host is contacted."""
        hosts = [h for h in self.inventory.names if cell.hardware in self.placement_tags[h]
                 and self._runs_release(cell, h)]
        local = self.dry_allocation(cell)
        allocation = Allocation(cell.id, (placement.Slot(hosts[0] if hosts else None,
                                                          local.gpu_ids),))
        profile = self.matrix.profile(cell)
        if profile.apptainer_runtime:
            return self.spec(cell, allocation)
        driver = declared_driver(self.inventory.get(hosts[0]), profile.device) if hosts else None
        return self.spec(cell, allocation, planned=planned_tag(self.matrix, cell, driver,
                                                               self.image_plans))

    def _runs_release(self, cell: Cell, host: str) -> bool:
        """Whether ``host`` may run ``cell``'s image as far as the inventory tells: an auto
        release on a host whose declared driver runs none of it is not (the sweep skips it);
        anything else is, until the sweep probes the host."""
        if not selection.is_auto(self.matrix, cell.hardware) or cell.params.ngc_release:
            return True
        driver = declared_driver(self.inventory.get(host), self.matrix.profile(cell).device)
        if driver is None:
            return True
        try:
            selection.choose(self.matrix, selection.image_key(self.matrix, cell), driver)
        except selection.NoRelease:
            return False
        except ConfigError:
            return True  # the image's own problem: the decision says it
        return True

    def _apptainer_spec(self, cell: Cell, allocation: Allocation, attempt: int,
                        output_dir: str) -> LaunchSpec:
        """An Apptainer cell on its host: ``apptainer exec ... IMAGE.sif <argv>`` writing into
        its remote folder, its GPUs pinned by an ``--env`` argument (one host per cell)."""
        if allocation.multi_node or (allocation.host is None and not self.options.dry_run):
            raise LaunchError(f"{cell.id}: Apptainer cells run on one host each")
        # prepared on the host; a dry run: where it would be (~ left for the host to expand)
        image = self._dry_image(lambda: apptainer.image_path(
            self.matrix, cell, self.host_sifs.get(allocation.host or "", {}),
            images=self.image_plans, planned=self.planned_sifs.setdefault(allocation.host, {})))
        return apptainer.launch_spec(cell, self.matrix.profile(cell), self.matrix.program(cell),
                                     image=image, output_dir=output_dir,
                                     gpu_ids=allocation.gpu_ids, attempt=attempt,
                                     host=allocation.host)

    def _start_apptainer(self, spec: LaunchSpec) -> Execution:
        """Start an Apptainer cell's command on its host over a connection of its own; the
        variables ``--env`` does not carry (secrets among them) go over stdin, never into a
        command line (:func:`orchestrator.runtimes.apptainer.remote_command`)."""
        assert spec.host is not None and spec.output_dir is not None
        ssh = self._ssh(spec.host)
        node = RemoteNode(spec.host, ssh, None, spec.output_dir)
        try:
            _make_output_dir(ssh, spec)
            argv, stdin = apptainer.remote_command(spec)
            proc = ssh.start(argv, combine_stderr=True, stdin=stdin)
        except LaunchError:
            close_node(node)
            raise
        except HostError as exc:
            close_node(node)
            if _unreachable(exc) and not self._reachable(spec.host):
                return LostExecution(spec.host, f"host {spec.host} stopped answering while "
                                                f"starting the cell ({exc})")
            raise LaunchError(f"{spec.cell_id}: {exc}") from exc
        return RemoteProcessExecution(spec.cell_id, node, proc,
                                      self.paths.cell_dir(spec.cell_id), self._reachable)

    def _one_release(self, cell: Cell, hosts: list[str]) -> None:
        """A multi-node cell runs one release on all its hosts: a LaunchError if their drivers
        picked different ones (``release = "auto"`` on hosts with different drivers)."""
        found = {h: r.release for h in hosts if (r := self.image_for(cell, h)) is not None}
        if len(set(found.values())) > 1:
            shown = ", ".join(f"{h}: {rel}" for h, rel in sorted(found.items()))
            raise LaunchError(f"{cell.id}: its hosts' drivers run different releases ({shown});"
                              " one multi-node cell needs one: pin the release (image_vars "
                              "base_tag) or list hosts with equal drivers")

    def launch(self, spec: LaunchSpec) -> Execution:
        """Start the cell's container on every node's host (node 0 first); an Apptainer
        cell's command on its host."""
        if spec.runtime:
            return self._start_apptainer(spec)
        if spec.image is None:
            raise LaunchError(f"{spec.cell_id}: no image was prepared for it")
        nodes: list[RemoteNode] = []
        try:
            for node_spec in spec.nodes:
                nodes.append(self._start_node(node_spec))
        except _HostGone as gone:
            self._abandon(nodes)
            return LostExecution(gone.host, gone.detail)
        except BaseException:
            self._abandon(nodes)
            raise
        return RemoteExecution(spec.cell_id, nodes, self.paths.cell_dir(spec.cell_id),
                               self._reachable)

    def _start_node(self, spec: LaunchSpec) -> RemoteNode:
        """Open the cell's connection to ``spec.host``, make its folder, start its container."""
        assert spec.host is not None and spec.output_dir is not None
        name = spec.host
        ssh = self._ssh(name)
        node = RemoteNode(name, ssh, None, spec.output_dir)
        try:
            ssh.connect()
            node.client = remote_docker_client(ssh, version=self._host(name).api_version)
            _make_output_dir(ssh, spec)
            node.container = node.client.containers.run(**container_kwargs(spec))
        except LaunchError:
            close_node(node)
            raise
        except Exception as exc:
            close_node(node)
            if is_engine_error(exc):
                raise LaunchError(f"{spec.cell_id}: the engine on {name} refused the container: "
                                  f"{getattr(exc, 'explanation', None) or exc}") from exc
            if isinstance(exc, HostError) and not _unreachable(exc):
                raise LaunchError(f"{spec.cell_id}: {exc}") from exc
            if self._reachable(name):
                raise LaunchError(f"{spec.cell_id}: starting on {name} failed: {exc}") from exc
            raise _HostGone(name, f"host {name} stopped answering while starting the cell "
                                  f"({exc})") from exc
        return node

    def _abandon(self, nodes: list[RemoteNode]) -> None:
        for node in nodes:
            try:
                node.container.remove(force=True)
            except Exception as exc:
                log.debug("remove on %s: %s", node.host, exc)
            remove_remote_dir(node.ssh, node.remote_dir)
            close_node(node)

    def finish(self, cell: Cell, result: CellResult, execution: Execution) -> None:
        """A cell that lost its host takes that host out of the pool (the sweep retries it)."""
        if result.status is Status.HOST_LOST:
            assert isinstance(execution, RemoteExecution | RemoteProcessExecution | LostExecution)
            for host, why in execution.lost_hosts.items():
                self.mark_host_lost(host, why)

    def close(self) -> None:
        """Remove this run's containers and remote folders on every host (lost ones: tried)."""
        for name in self.inventory.names:
            host = self.hosts.get(name)
            if host is None or (host.client is None and name not in self._lost):
                continue  # never reached (refused, or not needed): nothing of ours is there
            try:
                if name in self._lost:
                    host.close()
                host.connect()
                removed = remove_containers(host.client, {LABEL_RUN: self.paths.run_id})
                if removed:
                    log.info("host %s: removed %d leftover containers", name, removed)
                remove_remote_dir(host.ssh, remote_run_dir(self.paths.run_id))
            except Exception as exc:  # a lost host: nothing more can be done from here
                log.warning("host %s: cleanup failed: %s", name, exc)
            finally:
                host.close()
