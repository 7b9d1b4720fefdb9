"""A cell running in containers on lab hosts: one :class:`RemoteNode` per host it spans.

The ssh backend starts the containers (:mod:`orchestrator.backends.ssh`); what runs is a
:class:`RemoteExecution`, whatever the number of nodes:

* **Output** of every node streams into the cell's log, node 0's lines as they are, the others'
  prefixed ``[nodeN]``.
* **The end**: the cell ends when every container has ended; when one node of a multi-node cell
  fails, the others are stopped (they would wait for it forever).
* **Lost hosts**: a wait that breaks is followed by a probe of the host (a fresh connection and
  an engine ping, the ``reachable`` callable); a host that does not answer ends the cell as
  ``host_lost`` (:attr:`RemoteExecution.lost_hosts`), the others' containers are stopped.
* **Files**: :meth:`RemoteExecution.close` copies each node's output folder back (node 0 into the
  cell folder, node N into ``nodeN/``) as one tar stream, then removes containers and folders.
  Remote folders live under :data:`REMOTE_ROOT` only; nothing outside it is ever removed.

:class:`RemoteProcessExecution` is a cell that runs as a plain command on its host (the ssh
backend's Apptainer cells); :class:`LostExecution` is a cell whose host was lost before it started.
"""

from __future__ import annotations

import dataclasses
import logging
import posixpath
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko

from orchestrator.backends.base import Execution, ExitInfo
from orchestrator.backends.containers import DockerExecution
from orchestrator.errors import HostError
from orchestrator.remote.connection import RemoteProcess, SshHost

log = logging.getLogger(__name__)

#: Where cells write on their host (one folder per run, cell and attempt).
REMOTE_ROOT = "/tmp/orchestrate"


def remote_dir(run_id: str, cell_id: str, attempt: int) -> str:
    """A cell attempt's output folder on its host(s)."""
    return posixpath.join(REMOTE_ROOT, run_id, cell_id, f"attempt-{attempt}")


def remote_run_dir(run_id: str) -> str:
    """Every cell folder of a run on a host (removed when the sweep ends)."""
    return posixpath.join(REMOTE_ROOT, run_id)


@dataclass
class RemoteNode:
    """One container of a cell on one host, with the cell's own connection to that host."""

    host: str
    ssh: SshHost
    client: Any
    remote_dir: str
    container: Any = None


class RemoteExecution(Execution):
    """A cell's container(s) on remote hosts: one for a single-node cell, one per host else.

    ``reachable(host)`` tells whether a host still answers (probed only after a wait broke).
    """

    def __init__(self, cell_id: str, nodes: list[RemoteNode], local_dir: Path,
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

    def _check_lost(self, node: RemoteNode) -> None:
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
            fetch_back(self.cell_id, node,
                       self.local_dir if rank == 0 else self.local_dir / f"node{rank}")
            try:
                node.container.remove(force=True)
            except Exception as exc:
                log.debug("remove %s on %s: %s", self.cell_id, node.host, exc)
            remove_remote_dir(node.ssh, node.remote_dir)
        for node in self.nodes:
            close_node(node)


class RemoteProcessExecution(Execution):
    """A cell run as a plain command on one host over its own SSH connection (the ssh
    backend's Apptainer cells: ``apptainer exec ...`` is the command; no engine involved).

    Output streams from the command's channel; a kill stops the remote process group
    (:meth:`~orchestrator.remote.connection.RemoteProcess.kill`); :meth:`close` copies the output
    folder back
    and removes it there, like :class:`RemoteExecution`.
    """

    def __init__(self, cell_id: str, node: RemoteNode, proc: RemoteProcess, local_dir: Path,
                 reachable: Callable[[str], bool]):
        self.cell_id = cell_id
        self.node = node
        self.proc = proc
        self.local_dir = local_dir
        self._reachable = reachable
        self._lost: dict[str, str] = {}

    @property
    def lost_hosts(self) -> dict[str, str]:
        """The host, when it stopped answering while the cell ran: name -> why."""
        return dict(self._lost)

    def output(self) -> Iterator[bytes]:
        try:
            yield from self.proc.output()
        except (OSError, paramiko.SSHException, EOFError) as exc:
            log.debug("%s: output from %s ended: %s", self.cell_id, self.node.host, exc)

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.proc.ended():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(0.1, left))
        return True

    def kill(self) -> None:
        try:
            self.proc.kill()
        except (HostError, OSError, paramiko.SSHException, EOFError) as exc:
            log.debug("kill %s on %s: %s", self.cell_id, self.node.host, exc)

    def exit_info(self) -> ExitInfo:
        code = self.proc.exit_code
        if code is not None and code >= 0:
            return ExitInfo(code=code)
        if not self._reachable(self.node.host):
            self._lost[self.node.host] = f"host {self.node.host} stopped answering"
            return ExitInfo(code=None, host_lost=True, detail=self._lost[self.node.host])
        return ExitInfo(code=None, detail="the SSH session ended without an exit status")

    def close(self) -> None:
        node = self.node
        if node.host not in self._lost:
            fetch_back(self.cell_id, node, self.local_dir)
            remove_remote_dir(node.ssh, node.remote_dir)
        close_node(node)


class LostExecution(Execution):
    """A cell whose host was lost before its container started: ends at once as host_lost."""

    def __init__(self, host: str, detail: str):
        self.host = host
        self.detail = detail

    @property
    def lost_hosts(self) -> dict[str, str]:
        """The host that was lost: name -> why."""
        return {self.host: self.detail}

    def output(self) -> Iterator[bytes]:
        yield f"# {self.detail}\n".encode()

    def wait(self, timeout: float) -> bool:
        return True

    def kill(self) -> None:
        pass

    def exit_info(self) -> ExitInfo:
        return ExitInfo(code=None, host_lost=True, detail=self.detail)


def fetch_back(cell_id: str, node: RemoteNode, target: Path) -> None:
    """Copy a node's output folder into ``target`` (a failure is logged: the cell's result
    says what it can without those files)."""
    try:
        node.ssh.fetch_dir(node.remote_dir, target)
    except (HostError, OSError, paramiko.SSHException, EOFError) as exc:
        log.warning("%s: copying %s:%s back failed: %s", cell_id, node.host, node.remote_dir,
                    exc)


def close_node(node: RemoteNode) -> None:
    """Close a node's engine client and its connection (errors of a broken one are logged)."""
    try:
        if node.client is not None:
            node.client.close()
    except Exception as exc:
        log.debug("closing the engine client of %s: %s", node.host, exc)
    node.ssh.close()


def remove_remote_dir(ssh: SshHost, path: str) -> None:
    """``rm -rf`` a folder under :data:`REMOTE_ROOT` on ``ssh``'s host (refuses any other)."""
    if not path.startswith(REMOTE_ROOT + "/"):
        raise ValueError(f"refusing to remove {path!r} outside {REMOTE_ROOT}")
    try:
        code, _, err = ssh.run(["rm", "-rf", "--", path], timeout=60)
        if code != 0:
            log.warning("%s: rm -rf %s: %s", ssh.name, path, err.strip())
    except HostError as exc:
        log.warning("%s: could not remove %s: %s", ssh.name, path, exc)
