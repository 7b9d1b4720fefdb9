"""Docker over SSH: each cell in a container on a lab host's engine, placed GPU-aware.

This mirrors the local :mod:`~orchestrator.backends.docker` backend the way fabric's ``Remote``
mirrors ``Local``: the same :func:`~orchestrator.backends.docker.container_kwargs`, the same
labels, the same run-folder shape. What differs:

* **Transport.** Each host's engine is reached with the Docker SDK through ``docker system
  dial-stdio`` run in a channel of *our own* paramiko connection
  (:class:`~orchestrator.ssh.SshHost`), so host keys are verified against the inventory's
  known_hosts (refused when unknown unless ``trust_on_first_use``), with the inventory's key file,
  user and port. docker-py's own ``ssh://`` URL is not used: it reads only ``~/.ssh/known_hosts``
  and ``~/.ssh/config`` and cannot take our known_hosts file or key. The remote host needs the
  ``docker`` CLI (for ``dial-stdio``) and its engine; nothing else.
* **Placement.** A :class:`~orchestrator.placement.GpuPool` over the inventory's hosts hands out
  hosts and GPU ids; several cells run at once, never two on one GPU. A profile runs on the hosts
  it lists (``hosts = [...]``), else on the hosts tagged with its name.
* **Images** are built on each host that may run them, once per host and image, in
  :meth:`SshDockerBackend.prepare` (content-hash tags: an up-to-date host builds nothing).
* **Output.** A cell writes into ``/tmp/orchestrate/<run id>/<cell id>/attempt-<n>`` on its host
  (mounted at ``/orchestrate/out``); its log streams back live; when it ends the files are copied
  into the local cell folder as one ``tar`` stream (no SFTP needed) and the remote folder is
  removed.
* **Lost hosts.** A host that stops answering ends its cells with ``host_lost``; the pool stops
  using it and the sweep retries those cells elsewhere.
* **Multi-node** cells (``multi_node = true`` and more GPUs than one host has) run one container
  per host: ``torchrun --nnodes --node_rank --rdzv_endpoint=<first host>:PORT``, host network.

Each running cell has its own SSH connection (sshd allows 10 sessions per connection by default;
a cell holds two long-lived channels), so many cells on one host never exhaust it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import posixpath
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko
import urllib3
import urllib3.connection
import urllib3.connectionpool

from orchestrator import placement
from orchestrator.backends.base import Allocation, Execution, ExitInfo
from orchestrator.backends.docker import (
    LABEL_RUN,
    DockerBackend,
    DockerExecution,
    container_kwargs,
    plan_images,
    remove_containers,
)
from orchestrator.errors import (
    BackendUnavailable,
    ConfigError,
    HostError,
    HostUnreachable,
    LaunchError,
    Problem,
)
from orchestrator.hosts import Inventory, load_hosts, resolve_hosts
from orchestrator.launch import LaunchSpec
from orchestrator.matrix import Cell
from orchestrator.results import CellResult, Status
from orchestrator.ssh import SshHost

log = logging.getLogger("orchestrator.backends.ssh")

#: Where cells write on their host (one folder per run, cell and attempt).
REMOTE_ROOT = "/tmp/orchestrate"
#: The command that turns an SSH channel into a connection to the host's engine.
DIAL_STDIO = ("docker", "system", "dial-stdio")
#: The URL prefix the Docker SDK uses for engines behind an SSH channel.
SSH_BASE_URL = "http+docker://ssh"
#: Multi-node rendezvous ports: RDZV_PORT_BASE + (a hash of the cell id) % RDZV_PORT_SPAN.
RDZV_PORT_BASE = 29400
RDZV_PORT_SPAN = 500
#: Idle engine connections (SSH channels) kept per client.
POOL_SIZE = 4

NO_INVENTORY_HINT = (
    "the ssh backend needs a hosts inventory: pass --hosts FILE, or set hosts = \"FILE\" under "
    "[matrix] (see hosts/example.toml)"
)


# --- the Docker SDK over our own verified SSH connection -------------------------------------


class _ChannelConnection(urllib3.connection.HTTPConnection):
    """An HTTP connection whose socket is an SSH channel running ``docker system dial-stdio``."""

    def __init__(self, ssh: SshHost, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._ssh = ssh
        self._channel_timeout = timeout

    def connect(self) -> None:
        channel = self._ssh.open_stream(DIAL_STDIO)
        channel.settimeout(self._channel_timeout)
        self.sock = channel


class _ChannelPool(urllib3.connectionpool.HTTPConnectionPool):
    def __init__(self, ssh: SshHost, timeout: float, maxsize: int):
        super().__init__("localhost", timeout=timeout, maxsize=maxsize)
        self._ssh = ssh
        self._channel_timeout = timeout

    def _new_conn(self) -> _ChannelConnection:
        return _ChannelConnection(self._ssh, self._channel_timeout)


def _adapter(ssh: SshHost, timeout: float, maxsize: int) -> Any:
    """A requests adapter sending every request through channels of ``ssh``."""
    from docker.transport.basehttpadapter import BaseHTTPAdapter

    class _DialStdioAdapter(BaseHTTPAdapter):
        def __init__(self) -> None:
            super().__init__()
            self.pool = _ChannelPool(ssh, timeout, maxsize)

        def get_connection(self, url: str, proxies: Any = None) -> _ChannelPool:
            return self.pool

        def close(self) -> None:
            self.pool.close()
            super().close()

    return _DialStdioAdapter()


def remote_docker_client(
    ssh: SshHost, *, version: str | None = None, timeout: float = 120.0, maxsize: int = POOL_SIZE
) -> Any:
    """A ``docker.DockerClient`` for the engine of ``ssh``'s host, over ``ssh``'s connection.

    The connection (and its host-key check) is ``ssh``'s: nothing here reads ``~/.ssh``. Without
    ``version`` the API version is negotiated with the engine (one extra request).
    """
    import docker

    if version is None:
        probe = docker.APIClient(base_url="tcp://orchestrate-ssh.invalid:2375",
                                 version=docker.constants.MINIMUM_DOCKER_API_VERSION)
        probe.base_url = SSH_BASE_URL
        probe.mount(SSH_BASE_URL, _adapter(ssh, timeout, 1))
        try:
            version = str(probe.version(api_version=False)["ApiVersion"])
        finally:
            probe.close()
    client = docker.DockerClient(base_url="tcp://orchestrate-ssh.invalid:2375", version=version,
                                 timeout=int(timeout))
    # docker-py reads streamed output from the channel when base_url names an SSH engine.
    client.api.base_url = SSH_BASE_URL
    client.api.mount(SSH_BASE_URL, _adapter(ssh, timeout, maxsize))
    return client


def _is_engine_error(exc: BaseException) -> bool:
    """Whether the engine answered with an error (as opposed to the connection failing)."""
    import docker

    return isinstance(exc, docker.errors.APIError)


# --- hosts ------------------------------------------------------------------------------------


@dataclass
class RemoteHost:
    """A lab host the sweep uses: its SSH connection and Docker client (for prepare/cleanup)."""

    name: str
    ssh: SshHost
    client: Any = None
    api_version: str | None = None
    address: str = ""
    images: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def connect(self) -> RemoteHost:
        """Connect (verifying the host key) and open the engine client once."""
        with self.lock:
            self.ssh.connect()
            if self.client is None:
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


@dataclass
class _Node:
    """One container of a cell on one host, with the cell's own connection to that host."""

    host: str
    ssh: SshHost
    client: Any
    remote_dir: str
    container: Any = None


def _unreachable(exc: BaseException) -> bool:
    """Cannot reach the host (as opposed to refused: host keys, login): try another."""
    return isinstance(exc, HostUnreachable)


# --- executions -------------------------------------------------------------------------------


class RemoteExecution(Execution):
    """A cell's container(s) on remote hosts: one for a single-node cell, one per host else.

    Output of every node streams into the cell's log (node 0 first, then the others, each line
    as it comes). The cell ends when every container has ended, or when any host is lost (then
    the others are stopped). :meth:`close` copies each node's output folder back and removes
    containers and remote folders.
    """

    def __init__(self, cell_id: str, nodes: list[_Node], local_dir: Path,
                 reachable: Callable[[str], bool]):
        self.cell_id = cell_id
        self.nodes = nodes
        self.local_dir = local_dir
        self._reachable = reachable
        self._local = [DockerExecution(n.container) for n in nodes]
        self._lost: dict[str, str] = {}
        # Hosts probed after their wait broke, and alive: not probed again for the result. (One
        # that dies between the two ends the cell failed, not host_lost: it is not retried.)
        self._answered: set[str] = set()
        self._killed = False
        self._done = threading.Event()
        self._watch = threading.Thread(target=self._watch_nodes, daemon=True,
                                       name=f"watch-{cell_id}")
        self._watch.start()

    @property
    def lost_hosts(self) -> dict[str, str]:
        """Hosts found lost while the cell ran: name -> why."""
        return dict(self._lost)

    def _watch_nodes(self) -> None:
        try:
            pending = set(range(len(self.nodes)))
            while pending and not self._lost:
                for rank in sorted(pending):
                    ex = self._local[rank]
                    if not ex.wait(0):
                        continue
                    pending.discard(rank)
                    status = ex.wait_status
                    if status is None:
                        self._check_lost(self.nodes[rank])
                    elif len(self.nodes) > 1 and status.get("StatusCode", 0) != 0:
                        self._kill_all()  # one node failed: the others would wait forever
                if pending and not self._lost:
                    self._local[min(pending)].wait(0.2)
            if self._lost:
                self._kill_all()
        finally:
            self._done.set()

    def _check_lost(self, node: _Node) -> None:
        """The wait on ``node`` broke: is the host gone, or was it only the connection?"""
        if self._killed:
            return
        if self._reachable(node.host):
            self._answered.add(node.host)
        else:
            self._lost[node.host] = f"host {node.host} stopped answering while the cell ran"
            log.warning("%s: %s", self.cell_id, self._lost[node.host])

    def output(self) -> Iterator[bytes]:
        if len(self._local) == 1:
            yield from self._local[0].output()
            return
        # Several nodes: pump each stream in a thread into one queue.
        import queue

        chunks: queue.Queue[bytes | None] = queue.Queue()

        def pump(rank: int, ex: DockerExecution) -> None:
            prefix = f"[node{rank}] ".encode()
            pending = b""
            try:
                for chunk in ex.output():
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        chunks.put(line + b"\n" if rank == 0 else prefix + line + b"\n")
            except Exception as exc:  # a broken stream ends that node's output only
                log.debug("%s: output of node %d ended: %s", self.cell_id, rank, exc)
            finally:
                if pending:
                    chunks.put(pending if rank == 0 else prefix + pending)
                chunks.put(None)

        for rank, ex in enumerate(self._local):
            threading.Thread(target=pump, args=(rank, ex), daemon=True,
                             name=f"log-{self.cell_id}-{rank}").start()
        open_streams = len(self._local)
        while open_streams:
            item = chunks.get()
            if item is None:
                open_streams -= 1
            else:
                yield item

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    def _kill_all(self) -> None:
        for node, ex in zip(self.nodes, self._local, strict=True):
            if node.host in self._lost or ex.wait(0):
                continue
            try:
                node.container.kill()
            except Exception as exc:  # already stopped, or the host went away
                log.debug("kill %s on %s: %s", self.cell_id, node.host, exc)

    def kill(self) -> None:
        self._killed = True
        self._kill_all()
        self._done.wait(15.0)

    def exit_info(self) -> ExitInfo:
        if self._lost:
            return ExitInfo(code=None, host_lost=True, detail="; ".join(self._lost.values()))
        infos = [ex.exit_info() for ex in self._local]
        for node, info in zip(self.nodes, infos, strict=True):
            if (info.code is None and not self._killed and node.host not in self._answered
                    and not self._reachable(node.host)):
                self._lost[node.host] = f"host {node.host} stopped answering"
                return ExitInfo(code=None, host_lost=True, detail=self._lost[node.host])
        bad = next((i for i in infos if i.oom or i.code != 0), None)
        if bad is not None and len(infos) > 1:
            rank = infos.index(bad)
            bad = dataclasses.replace(bad, detail=f"node {rank} ({self.nodes[rank].host}): "
                                                  f"{bad.detail}".rstrip(": "))
        return bad or infos[0]

    def close(self) -> None:
        for rank, node in enumerate(self.nodes):
            if node.host in self._lost:
                continue
            target = self.local_dir if rank == 0 else self.local_dir / f"node{rank}"
            try:
                node.ssh.fetch_dir(node.remote_dir, target)
            except (HostError, OSError, paramiko.SSHException, EOFError) as exc:
                log.warning("%s: copying %s:%s back failed: %s", self.cell_id, node.host,
                            node.remote_dir, exc)
            try:
                node.container.remove(force=True)
            except Exception as exc:
                log.debug("remove %s on %s: %s", self.cell_id, node.host, exc)
            _remove_remote_dir(node.ssh, node.remote_dir)
        for node in self.nodes:
            _close_node(node)


class _LostExecution(Execution):
    """A cell whose host was lost before its container started: ends at once as host_lost."""

    def __init__(self, host: str, detail: str):
        self.host = host
        self.detail = detail

    @property
    def lost_hosts(self) -> dict[str, str]:
        return {self.host: self.detail}

    def output(self) -> Iterator[bytes]:
        yield f"# {self.detail}\n".encode()

    def wait(self, timeout: float) -> bool:
        return True

    def kill(self) -> None:
        pass

    def exit_info(self) -> ExitInfo:
        return ExitInfo(code=None, host_lost=True, detail=self.detail)


def _close_node(node: _Node) -> None:
    try:
        if node.client is not None:
            node.client.close()
    except Exception as exc:
        log.debug("closing the engine client of %s: %s", node.host, exc)
    node.ssh.close()


def _remove_remote_dir(ssh: SshHost, remote_dir: str) -> None:
    if not remote_dir.startswith(REMOTE_ROOT + "/"):
        raise ValueError(f"refusing to remove {remote_dir!r} outside {REMOTE_ROOT}")
    try:
        code, _, err = ssh.run(["rm", "-rf", "--", remote_dir], timeout=60)
        if code != 0:
            log.warning("%s: rm -rf %s: %s", ssh.name, remote_dir, err.strip())
    except HostError as exc:
        log.warning("%s: could not remove %s: %s", ssh.name, remote_dir, exc)


def multi_node_argv(argv: list[str], nnodes: int, node_rank: int, nproc: int,
                    endpoint: str, rdzv_id: str) -> list[str]:
    """One node's command of a multi-node cell, from its torchrun command.

    The launcher flags between ``torch.distributed.run`` and ``-m`` (``--standalone
    --nproc_per_node=N``, or another node's flags) become ``--nnodes --node_rank
    --nproc_per_node --rdzv_backend=static --rdzv_endpoint=HOST:PORT --rdzv_id`` (static
    rendezvous: node ranks are the ones given; rank 0 hosts the store at the endpoint).
    """
    try:
        at = argv.index("torch.distributed.run") + 1
        end = argv.index("-m", at)
    except ValueError:
        raise LaunchError("a multi-node cell needs the torchrun launcher (gpus > 1)") from None
    flags = [
        f"--nnodes={nnodes}", f"--node_rank={node_rank}", f"--nproc_per_node={nproc}",
        "--rdzv_backend=static", f"--rdzv_endpoint={endpoint}", f"--rdzv_id={rdzv_id}",
    ]
    return [*argv[:at], *flags, *argv[end:]]


def rdzv_port(cell_id: str) -> int:
    """A stable rendezvous port for a cell (distinct cells rarely share one)."""
    digest = hashlib.sha256(cell_id.encode()).digest()
    return RDZV_PORT_BASE + int.from_bytes(digest[:4], "big") % RDZV_PORT_SPAN


# --- the backend ------------------------------------------------------------------------------


class SshDockerBackend(DockerBackend):
    """Run cells in containers on lab hosts' Docker engines over SSH, several at once."""

    name = "ssh"
    concurrent = True

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        hosts_file = self.options.hosts_file
        if hosts_file is None:
            raise ConfigError(NO_INVENTORY_HINT, file=str(self.matrix.path), field="matrix.hosts")
        self.inventory: Inventory = load_hosts(hosts_file)
        # resolved once (inventory + ssh config): every cell's connection reuses them
        self.targets = resolve_hosts(self.inventory)
        self.placement_tags = self._placement_tags()
        self.hosts: dict[str, RemoteHost] = {}
        self._pool: placement.GpuPool | None = None
        self._lock = threading.RLock()
        self._lost: dict[str, str] = {}  # host -> why it was taken out
        self._slots: dict[str, placement.Allocation] = {}  # cell id -> the pool's allocation

    @classmethod
    def check_available(cls) -> None:
        try:
            import docker  # noqa: F401
        except ImportError as exc:  # pragma: no cover - a declared dependency
            raise BackendUnavailable(f"the docker SDK is not installed ({exc})") from exc

    # --- hosts and placement ---------------------------------------------------------------

    def _placement_tags(self) -> dict[str, set[str]]:
        """host -> the profile names it may run: listed in ``hosts``, else tagged with the name."""
        known = set(self.inventory.names)
        problems = []
        tags: dict[str, set[str]] = {h: set() for h in self.inventory.names}
        for name, profile in self.matrix.profiles.items():
            if profile.hosts:
                for host in profile.hosts:
                    if host in known:
                        tags[host].add(name)
                    else:
                        problems.append(Problem(
                            str(self.matrix.path), f"hardware.{name}.hosts",
                            f"no host named {host!r} in {self.inventory.source} "
                            f"(hosts: {', '.join(self.inventory.names)})"))
            else:
                for entry in self.inventory.tagged(name):
                    tags[entry.name].add(name)
        if problems:
            raise ConfigError(problems)
        return tags

    def _host(self, name: str) -> RemoteHost:
        with self._lock:
            host = self.hosts.get(name)
            if host is None:
                host = self.hosts[name] = RemoteHost(
                    name, self._ssh(name), address=self.targets[name].hostname
                )
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
        gpus = cell.params.gpus
        if profile.wrapper == "bitfusion":
            gpus = 0  # remote GPUs, attached by the Bitfusion client
        elif profile.device == "cpu" and not any(
            s.gpu_ids for s in self.pool.hosts if cell.hardware in s.tags
        ):
            gpus = 0  # CPU cells on hosts with no GPU ids: limited by max_concurrent only
        return placement.Request(
            cell_id=cell.id, tag=cell.hardware, gpus=gpus,
            exclusive_host=self.matrix.settings.one_cell_per_host,
            allow_multi_node=profile.multi_node,
        )

    def unplaceable(self, cell: Cell) -> str | None:
        with self._lock:
            reason = self.pool.why_unplaceable(self._request(cell))
        if reason and cell.hardware not in {t for ts in self.placement_tags.values() for t in ts}:
            profile = self.matrix.profile(cell)
            return (f"no host in {self.inventory.source} may run hardware {cell.hardware!r}: "
                    + ("none of its hosts is in the inventory" if profile.hosts else
                       f"tag a host with {cell.hardware!r} or list hosts in "
                       f"hardware.{cell.hardware}.hosts"))
        return reason

    def allocate(self, cell: Cell) -> Allocation | None:
        with self._lock:
            got = self.pool.try_acquire(self._request(cell))
            if got is None:
                return None
            self._slots[cell.id] = got
        return Allocation(host=got.host, gpu_ids=got.gpu_ids, hosts=got.hosts)

    def release(self, cell: Cell, allocation: Allocation) -> None:
        with self._lock:
            slots = self._slots.pop(cell.id, None)
            if slots is not None:
                self.pool.release(slots)

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
        """Connect to every host the cells may use, discover GPUs, build images on each host."""
        from orchestrator import build, gpus

        say = on_log or (lambda _msg: None)
        plans = plan_images(self.matrix, cells, self.name)
        needed = sorted(plans)
        self.image_tags = {hw: plan.tag for hw, plan in plans.items()}
        wanted = [h for h in self.inventory.names
                  if self.placement_tags[h] & set(needed) and h not in self._lost]
        discovered: dict[str, list[int]] = {}

        def connect(name: str) -> None:
            try:
                self._host(name).connect()
            except HostError as exc:
                if not _unreachable(exc):
                    raise  # unknown or changed host key, failed authentication: the user acts
                self.mark_host_lost(name, str(exc))
                say(f"host {name}: {exc}; not used in this sweep")

        def ready(name: str) -> None:
            host = self._host(name)
            if self.inventory.get(name).gpus is None:
                try:
                    facts = gpus.probe(host.ssh)  # connected above
                except HostError as exc:
                    if not _unreachable(exc):
                        raise
                    self.mark_host_lost(name, str(exc))
                    say(f"host {name}: {exc}; not used in this sweep")
                    return
                discovered[name] = facts.gpu_ids
                say(f"host {name}: {len(facts.gpu_ids)} GPUs discovered")
            for hw in sorted(self.placement_tags[name] & set(needed)):
                plan = plans[hw]
                if plan.tag in host.images:
                    continue
                outcome = build.ensure_image(
                    plan, host.client, (lambda line, n=name: say(f"{n} | {line}"))
                    if on_log else None)
                host.images.add(plan.tag)
                say(f"host {name}: image {plan.tag} ({plan.template}): {outcome.summary}")

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

    # --- cells --------------------------------------------------------------------------------

    def remote_dir(self, cell_id: str, attempt: int) -> str:
        """The cell's output folder on its host."""
        return posixpath.join(REMOTE_ROOT, self.paths.run_id, cell_id, f"attempt-{attempt}")

    def finish(self, cell: Cell, result: CellResult, execution: Execution) -> None:
        """A cell that lost its host takes that host out of the pool (the sweep retries it)."""
        if result.status is Status.HOST_LOST:
            assert isinstance(execution, RemoteExecution | _LostExecution)
            for host, why in execution.lost_hosts.items():
                self.mark_host_lost(host, why)

    def spec(self, cell: Cell, allocation: Allocation, attempt: int = 1) -> LaunchSpec:
        base = super().spec(cell, allocation, attempt)
        spec = dataclasses.replace(base, output_dir=self.remote_dir(cell.id, attempt),
                                   host=allocation.host)
        if len(spec.hosts) > 1:
            return self._node_spec(spec, 0)
        return spec

    def _node_spec(self, spec: LaunchSpec, rank: int) -> LaunchSpec:
        """Node ``rank``'s spec of a multi-node cell (its host, GPU ids and torchrun flags)."""
        hosts = spec.hosts
        cell_id = spec.cell_id
        with self._lock:
            slots = self._slots.get(cell_id)
        per_host = dict(slots.slots) if slots is not None else {}
        ids = per_host.get(hosts[rank], spec.gpu_ids)
        endpoint = f"{self._host(hosts[0]).address}:{rdzv_port(cell_id)}"
        argv = multi_node_argv(list(spec.argv), len(hosts), rank, len(ids), endpoint, cell_id)
        assert spec.container is not None
        return dataclasses.replace(
            spec, argv=tuple(argv), host=hosts[rank], gpu_ids=tuple(ids),
            container=spec.container.model_copy(update={"network": "host"}),
        )

    def launch(self, spec: LaunchSpec) -> Execution:
        if spec.image is None:
            raise LaunchError(f"{spec.cell_id}: no image was prepared for it")
        specs = [spec] + [self._node_spec(spec, r) for r in range(1, len(spec.hosts))]
        nodes: list[_Node] = []
        try:
            for node_spec in specs:
                nodes.append(self._start_node(node_spec))
        except _HostGone as gone:
            self._abandon(nodes)
            return _LostExecution(gone.host, gone.detail)
        except BaseException:
            self._abandon(nodes)
            raise
        return RemoteExecution(spec.cell_id, nodes, self.paths.cell_dir(spec.cell_id),
                               self._reachable)

    def _start_node(self, spec: LaunchSpec) -> _Node:
        """Open the cell's connection to ``spec.host``, make its folder, start its container."""
        assert spec.host is not None and spec.output_dir is not None
        name = spec.host
        ssh = self._ssh(name)
        node = _Node(name, ssh, None, spec.output_dir)
        try:
            ssh.connect()
            node.client = remote_docker_client(ssh, version=self._host(name).api_version)
            code, _, err = ssh.run(["install", "-d", "-m", "0777", "--", spec.output_dir],
                                   timeout=60)
            if code != 0:
                raise LaunchError(f"{spec.cell_id}: cannot make {spec.output_dir} on {name}: "
                                  f"{err.strip()}")
            node.container = node.client.containers.run(**container_kwargs(spec))
        except LaunchError:
            _close_node(node)
            raise
        except Exception as exc:
            _close_node(node)
            if _is_engine_error(exc):
                raise LaunchError(f"{spec.cell_id}: the engine on {name} refused the container: "
                                  f"{getattr(exc, 'explanation', None) or exc}") from exc
            if isinstance(exc, HostError) and not _unreachable(exc):
                raise LaunchError(f"{spec.cell_id}: {exc}") from exc
            if self._reachable(name):
                raise LaunchError(f"{spec.cell_id}: starting on {name} failed: {exc}") from exc
            raise _HostGone(name, f"host {name} stopped answering while starting the cell "
                                  f"({exc})") from exc
        return node

    def _abandon(self, nodes: list[_Node]) -> None:
        for node in nodes:
            try:
                node.container.remove(force=True)
            except Exception as exc:
                log.debug("remove on %s: %s", node.host, exc)
            _remove_remote_dir(node.ssh, node.remote_dir)
            _close_node(node)

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
                _remove_remote_dir(host.ssh, posixpath.join(REMOTE_ROOT, self.paths.run_id))
            except Exception as exc:  # a lost host: nothing more can be done from here
                log.warning("host %s: cleanup failed: %s", name, exc)
            finally:
                host.close()


class _HostGone(Exception):
    def __init__(self, host: str, detail: str):
        super().__init__(detail)
        self.host = host
        self.detail = detail
