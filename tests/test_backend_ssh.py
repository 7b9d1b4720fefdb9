"""The Docker-over-SSH backend: placement, and sweeps through real sshd "hosts" on loopback.

The sweeps' cells run the STAND-IN workload (tests/standin/, mounted into the containers): what
is tested is the transport, placement, retries, cancellation and the files copied back; the real
workload in a container is tests/test_backend_docker.py's end-to-end test.

Every "host" is an sshd on 127.0.0.1 with its own host key and port; behind all of them is this
machine's one Docker engine, reached through ``docker system dial-stdio`` over our verified SSH
connections. The GPU ids in the inventories are fake (the cells run on the CPU, so no device
request is made); they only drive placement. Because the engine is shared, a "lost" host's
container keeps running on it until the sweep's cleanup through the other host removes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from docker_support import cpu_container_matrix, run_containers
from ssh_support import SshdFactory, SshdServer, write_inventory
from standin_support import Standin

from orchestrator.backends.base import RunOptions
from orchestrator.backends.remote_executions import REMOTE_ROOT
from orchestrator.backends.ssh import SshDockerBackend
from orchestrator.errors import ConfigError
from orchestrator.plan.launch import NodeRole, rdzv_port
from orchestrator.plan.matrix import Cell, load_matrix
from orchestrator.plan.placement import Allocation, Slot
from orchestrator.remote.connection import UnknownHostKey
from orchestrator.results.folders.run_folder import CellResult, RunPaths, Status
from orchestrator.sweep import run_sweep


def write_matrix_file(tmp_path: Path, body: str, *, base: str = "unused:latest",
                      profile_extra: str = "", standin: Standin | None = None,
                      knobs: str = "", launcher: str = "self") -> Path:
    """The one-cell container matrix on the ssh backend (the STAND-IN workload with
    ``standin``), ``body`` appended."""
    path = tmp_path / "m.toml"
    path.write_text(cpu_container_matrix("ssh_test", base, backend="ssh", settings="retries = 1",
                                         profile_extra=profile_extra, standin=standin,
                                         knobs=knobs, launcher=launcher) + body)
    return path


class Recorder:
    """Sweep events, recorded; optional hooks on start and output."""

    def __init__(self) -> None:
        self.started: list[tuple[str, Allocation, float]] = []
        self.messages: list[str] = []
        self.on_started: Callable[[Cell, Allocation], None] | None = None
        self.on_output: Callable[[str, str], None] | None = None

    def sweep_started(self, paths: RunPaths, cells: list[Cell],
                      expected: dict[str, float]) -> None: ...

    def log(self, message: str) -> None:
        self.messages.append(message)

    def lock_wait(self, cell_id: str, message: str, waited_s: float | None) -> None:
        self.messages.append(f"{cell_id}: {message}")

    def cell_started(self, cell: Cell, allocation: Allocation) -> None:
        self.started.append((cell.id, allocation, time.monotonic()))
        if self.on_started:
            self.on_started(cell, allocation)

    def cell_output(self, cell_id: str, line: str) -> None:
        if self.on_output:
            self.on_output(cell_id, line)

    def cell_finished(self, cell: Cell, result: CellResult) -> None: ...


def kill_host(server: SshdServer) -> None:
    """Take a "host" off the network: stop its sshd and kill every session it forked."""
    assert server.proc is not None
    parents = {server.proc.pid}
    children: list[int] = []
    for _ in range(4):  # listener -> connection -> session -> commands
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat_text = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat_text.rsplit(")", 1)[1].split()[1])
            if ppid in parents and int(entry) not in children:
                found.append(int(entry))
        children += found
        parents = set(found)
    server.stop()
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# --- no engine needed ----------------------------------------------------------------------------


def make_backend(tmp_path: Path, matrix_path: Path, hosts: Path | None) -> SshDockerBackend:
    matrix = load_matrix(matrix_path)
    paths = RunPaths.create(tmp_path / "results", matrix.name)
    return SshDockerBackend(matrix, paths, RunOptions(timeout_s=60, hosts_file=hosts))


def fake_inventory(tmp_path: Path, hosts: dict[str, str]) -> Path:
    path = tmp_path / "hosts.toml"
    path.write_text("".join(
        f'[[hosts]]\nname = "{name}"\naddress = "127.0.0.1"\n{extra}\n'
        for name, extra in hosts.items()))
    return path


def test_ssh_config_is_read_once_per_sweep(tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text("Host lab-a\n  HostName 127.0.0.1\n  Port 2201\n  User bench\n")
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(
        f'[options]\nssh_config = "{config}"\n'
        '[[hosts]]\nname = "a"\naddress = "lab-a"\ntags = ["cpu"]\n'
    )
    backend = make_backend(tmp_path, write_matrix_file(tmp_path, ""), hosts)
    config.write_text("this is no longer an ssh config\n")  # cells must not read it again
    target = backend._ssh("a").target
    assert (target.hostname, target.port, target.user) == ("127.0.0.1", 2201, "bench")


class _BrokenWaitContainer:
    """A container whose engine connection broke (wait and reload raise) on a host that still
    answers: a stand-in, since a real connection cannot be cut while its host stays up."""

    short_id = "c0ffee"

    def wait(self) -> dict:
        raise ConnectionError("connection reset")

    def reload(self) -> None:
        raise ConnectionError("connection reset")


def test_a_broken_wait_probes_the_host_once(tmp_path: Path) -> None:
    from orchestrator.backends.remote_executions import RemoteExecution, RemoteNode

    probes: list[str] = []

    def reachable(host: str) -> bool:
        probes.append(host)
        return True

    node = RemoteNode("a", None, None, "/tmp/x", _BrokenWaitContainer())  # type: ignore[arg-type]
    execution = RemoteExecution("cell", [node], tmp_path, reachable)
    assert execution.wait(10.0)
    info = execution.exit_info()
    assert not info.host_lost and info.code is None and "unavailable" in info.detail
    assert probes == ["a"] and execution.lost_hosts == {}


def test_missing_inventory_is_a_config_error(tmp_path: Path) -> None:
    matrix = write_matrix_file(tmp_path, "")
    with pytest.raises(ConfigError, match="needs a hosts inventory: pass --hosts"):
        make_backend(tmp_path, matrix, None)
    with pytest.raises(ConfigError, match="nope.toml: no such file"):
        make_backend(tmp_path, matrix, tmp_path / "nope.toml")


def test_profile_hosts_must_exist(tmp_path: Path) -> None:
    matrix = write_matrix_file(tmp_path, "", profile_extra='hosts = ["a", "zz"]')
    hosts = fake_inventory(tmp_path, {"a": 'tags = ["cpu"]\ngpus = [0]'})
    with pytest.raises(ConfigError, match=r"hardware\.cpu\.hosts: no host named 'zz'"):
        make_backend(tmp_path, matrix, hosts)


def test_placement_never_double_books_and_follows_profile_hosts(tmp_path: Path) -> None:
    matrix = write_matrix_file(tmp_path, "[axes]\nseed = [1, 2, 3, 4]\n",
                               profile_extra='hosts = ["a", "b"]')
    hosts = fake_inventory(tmp_path, {
        "a": "gpus = [0, 1]", "b": "gpus = [3]", "c": 'tags = ["cpu"]\ngpus = [0, 1, 2, 3]'})
    backend = make_backend(tmp_path, matrix, hosts)
    cells = backend.matrix.cells
    assert backend.unplaceable(cells[0]) is None
    got = [backend.allocate(c) for c in cells]
    assert got[3] is None  # three GPUs on a and b; c is not in the profile's hosts
    taken = [(a.host, a.gpu_ids) for a in got[:3] if a is not None]
    assert sorted(taken) == [("a", (0,)), ("a", (1,)), ("b", (3,))]
    backend.release(cells[0], got[0])
    again = backend.allocate(cells[3])
    assert again is not None and got[0] is not None and again.slots == got[0].slots

    backend.mark_host_lost("b", "test")
    backend.mark_host_lost("a", "test")
    reason = backend.unplaceable(cells[1])
    assert reason is not None and "every host tagged 'cpu' is lost" in reason


def test_cpu_cells_without_gpu_ids_are_capped_by_max_concurrent(tmp_path: Path) -> None:
    matrix = write_matrix_file(tmp_path, "[axes]\nseed = [1, 2, 3]\n")
    hosts = fake_inventory(tmp_path, {"a": 'tags = ["cpu"]\nmax_concurrent = 2'})
    backend = make_backend(tmp_path, matrix, hosts)
    got = [backend.allocate(c) for c in backend.matrix.cells]
    assert [a is not None for a in got] == [True, True, False]
    assert got[0] == Allocation(backend.matrix.cells[0].id, (Slot("a", ()),))
    assert got[0].hosts == ("a",) and got[0].host == "a" and not got[0].multi_node


def test_multi_node_placement_and_command(tmp_path: Path) -> None:
    matrix = write_matrix_file(tmp_path, "[axes]\ngpus = [2, 4]\n",
                               profile_extra="multi_node = true")
    hosts = fake_inventory(tmp_path, {
        "a": 'tags = ["cpu"]\ngpus = [0, 1]', "b": 'tags = ["cpu"]\ngpus = [0, 1]'})
    backend = make_backend(tmp_path, matrix, hosts)
    two, four = backend.matrix.cells
    alloc = backend.allocate(four)
    assert alloc == Allocation(four.id, (Slot("a", (0, 1)), Slot("b", (0, 1))), exclusive=True)
    assert alloc.hosts == ("a", "b") and alloc.multi_node
    assert backend.allocate(two) is None  # both hosts held exclusively
    spec = backend.spec(four, alloc)
    port = rdzv_port(four.id)
    assert spec.container is not None and spec.container.network == "host"
    assert spec.argv[:9] == (
        "python3", "-m", "torch.distributed.run", "--nnodes=2", "--node_rank=0",
        "--nproc_per_node=2", "--rdzv_backend=static", f"--rdzv_endpoint=127.0.0.1:{port}",
        f"--rdzv_id={four.id}")
    assert spec.hosts == ("a", "b") and spec.to_json()["hosts"] == ["a", "b"]
    (node1,) = spec.peers
    assert node1.host == "b" and node1.gpu_ids == (0, 1) and "--node_rank=1" in node1.argv
    assert node1.container is not None and node1.container.network == "host"
    assert node1.output_dir == spec.output_dir and node1.labels == spec.labels
    with pytest.raises(ValueError, match="two or more nodes"):
        NodeRole(nnodes=1, rank=0, nproc=1, endpoint="h:1", rdzv_id="id")


# --- real sshd hosts, real engine ------------------------------------------------------------

docker_ssh = [pytest.mark.docker, pytest.mark.ssh, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def two_hosts(sshd_factory: SshdFactory) -> tuple[SshdServer, SshdServer]:
    return sshd_factory("bk-a"), sshd_factory("bk-b")


def cell_interval(result_dir: Path) -> tuple[str, tuple[int, ...], float, float]:
    command = json.loads((result_dir / "command.json").read_text())
    result = json.loads((result_dir / "result.json").read_text())
    return command["host"], tuple(command["gpu_ids"]), result["started_at"], result["finished_at"]


@pytest.mark.docker
@pytest.mark.ssh
@pytest.mark.timeout(300)
def test_sweep_over_two_hosts(
    tmp_path: Path, two_hosts: tuple[SshdServer, SshdServer], docker_client: Any, base_image: str,
    standin: Standin,
) -> None:
    a, b = two_hosts
    hosts = write_inventory(tmp_path, [a, b], gpus=[[0, 1], [0]])
    matrix = load_matrix(write_matrix_file(
        tmp_path, '[axes]\nseed = [1, 2, 3]\n[[include]]\ndata = "/no/such_dataset"\nseed = 9\n',
        base=base_image, standin=standin, knobs="--standin-step-s=1"))
    events = Recorder()
    t0 = time.monotonic()
    outcome = run_sweep(matrix, backend_name="ssh", results_root=tmp_path / "results",
                        hosts_file=hosts, events=events)
    took = time.monotonic() - t0
    by_id = {r.cell_id: r for r in outcome.results}
    bad = next(c.id for c in matrix.cells if c.params.data == "/no/such_dataset")
    assert by_id.pop(bad).status is Status.FAILED
    assert {r.status for r in by_id.values()} == {Status.OK}, [r.reason for r in by_id.values()]

    intervals = {}
    for cell_id, result in by_id.items():
        cell_dir = outcome.paths.cell_dir(cell_id)
        assert (cell_dir / "summary.json").is_file()  # copied back (a tar stream)
        assert (cell_dir / "iterations.csv").is_file()
        assert result.metrics and result.provenance["backend"] == "ssh"
        assert result.machine == {}  # the controller's state is not the cell's machine
        assert result.provenance["host"] in (a.name, b.name)
        intervals[cell_id] = cell_interval(cell_dir)
    # Never two live cells on one (host, GPU); and cells did run at the same time.
    items = list(intervals.values())
    overlapping = 0
    for i, (h1, g1, s1, e1) in enumerate(items):
        for h2, g2, s2, e2 in items[i + 1:]:
            if s1 < e2 and s2 < e1:
                overlapping += 1
                assert not (h1 == h2 and set(g1) & set(g2)), (items, "double booked")
    assert overlapping >= 1
    # both hosts ran cells: the failing cell counts too (it can be the one host b ran, CI saw)
    assert {r.provenance.get("host") for r in outcome.results} == {a.name, b.name}
    assert len({e[0] for e in events.started}) == 4
    assert run_containers(docker_client, outcome.paths.run_id) == []
    assert not Path(REMOTE_ROOT, outcome.paths.run_id).exists()
    print(f"\nsweep of 4 cells over 2 ssh hosts: {took:.1f} s; cells: "
          + ", ".join(f"{r.duration_s:.1f}s" for r in outcome.results))


@pytest.mark.docker
@pytest.mark.ssh
@pytest.mark.timeout(300)
def test_lost_host_mid_sweep_is_retried_elsewhere(
    tmp_path: Path, sshd_factory: SshdFactory, docker_client: Any, base_image: str,
    standin: Standin,
) -> None:
    x, y = sshd_factory("lost-x"), sshd_factory("lost-y")
    hosts = write_inventory(tmp_path, [x, y], gpus=[[0], [0]])
    matrix = load_matrix(write_matrix_file(
        tmp_path, "[axes]\niterations = [150, 1]\n", base=base_image, standin=standin,
        knobs="--standin-step-s=0.05"))
    long_cell = next(c.id for c in matrix.cells if c.params.iterations == 150)
    servers = {x.name: x, y.name: y}
    events = Recorder()
    where: dict[str, str] = {}
    killed = threading.Event()

    def started(cell: Cell, allocation: Allocation) -> None:
        if cell.id == long_cell and not where:
            where["host"] = allocation.host or ""

    def output(cell_id: str, line: str) -> None:
        if cell_id == long_cell and line.startswith("{") and not killed.is_set():
            killed.set()
            threading.Thread(target=kill_host, args=(servers[where["host"]],)).start()

    events.on_started, events.on_output = started, output
    outcome = run_sweep(matrix, backend_name="ssh", results_root=tmp_path / "results",
                        hosts_file=hosts, events=events)
    assert killed.is_set()
    by_id = {r.cell_id: r for r in outcome.results}
    retried = by_id[long_cell]
    assert retried.status is Status.OK, retried.reason
    assert retried.attempts == 2
    other = ({x.name, y.name} - {where["host"]}).pop()
    assert retried.provenance["host"] == other
    command = json.loads(outcome.paths.cell_command(long_cell).read_text())
    assert command["attempt"] == 2 and command["output_dir"].endswith("/attempt-2")
    assert any("retrying (attempt 2)" in m and "stopped answering" in m for m in events.messages)
    assert [r.status for r in outcome.results] == [Status.OK, Status.OK]
    assert run_containers(docker_client, outcome.paths.run_id) == []
    on_disk = {p.parent.name for p in outcome.paths.root.glob("cells/*/result.json")}
    planned = {c.id for c in matrix.cells}
    recorded = sum(1 for r in outcome.results if r.status is Status.OK and r.cell_id in on_disk)
    duplicated = len(outcome.results) - len({r.cell_id for r in outcome.results})
    # read by benchmarks/fault_suite.py --host-lost
    print(f"\nfault suite: host lost: cells={len(planned)} recorded={recorded} "
          f"lost={len(planned - on_disk)} duplicated={duplicated}")
    print("\nlost host: " + ", ".join(
        f"{m}" for m in events.messages if "retrying" in m) + "; durations: "
        + ", ".join(f"{r.cell_id} {r.duration_s:.1f}s" for r in outcome.results))


@pytest.mark.ssh
@pytest.mark.timeout(120)
def test_unknown_host_key_is_refused(
    tmp_path: Path, two_hosts: tuple[SshdServer, SshdServer]
) -> None:
    """Refused before any engine is contacted: needs sshd only, no Docker."""
    a, b = two_hosts
    hosts = write_inventory(tmp_path, [a, b], gpus=[[0], [0]], known=[a])
    matrix = load_matrix(write_matrix_file(tmp_path, ""))
    with pytest.raises(UnknownHostKey, match=r"host bk-b .* unknown .* host key SHA256:.*"
                                             r"ssh-keyscan"):
        run_sweep(matrix, backend_name="ssh", results_root=tmp_path / "results",
                  hosts_file=hosts)


@pytest.mark.docker
@pytest.mark.ssh
@pytest.mark.timeout(300)
def test_cancel_kills_and_removes_the_remote_container(
    tmp_path: Path, two_hosts: tuple[SshdServer, SshdServer], docker_client: Any, base_image: str,
    standin: Standin,
) -> None:
    a, _ = two_hosts
    hosts = write_inventory(tmp_path, [a], gpus=[[0]])
    matrix = load_matrix(write_matrix_file(
        tmp_path, "[axes]\niterations = [100000]\n", base=base_image, standin=standin))
    cancel = threading.Event()
    events = Recorder()
    seen: dict[str, float] = {}

    def output(cell_id: str, line: str) -> None:
        if not cancel.is_set():
            seen["at"] = time.monotonic()
            cancel.set()

    events.on_output = output
    outcome = run_sweep(matrix, backend_name="ssh", results_root=tmp_path / "results",
                        hosts_file=hosts, events=events, cancel=cancel)
    assert outcome.interrupted
    (result,) = outcome.results
    assert result.status is Status.CANCELLED
    assert time.monotonic() - seen["at"] < 30
    assert run_containers(docker_client, outcome.paths.run_id) == []
    assert not Path(REMOTE_ROOT, outcome.paths.run_id).exists()


@pytest.mark.docker
@pytest.mark.ssh
@pytest.mark.timeout(300)
def test_multi_node_cell_spans_two_hosts(
    tmp_path: Path, two_hosts: tuple[SshdServer, SshdServer], docker_client: Any, base_image: str,
    standin: Standin,
) -> None:
    """torchrun (from the image's torch) on each host starts one STAND-IN rank per node."""
    a, b = two_hosts
    hosts = write_inventory(tmp_path, [a, b], gpus=[[0], [0]])
    matrix = load_matrix(write_matrix_file(
        tmp_path, "[axes]\ngpus = [2]\n", base=base_image, profile_extra="multi_node = true",
        standin=standin, launcher="torchrun"))
    outcome = run_sweep(matrix, backend_name="ssh", results_root=tmp_path / "results",
                        hosts_file=hosts)
    (result,) = outcome.results
    assert result.status is Status.OK, (result.reason, result.log_tail)
    assert result.provenance["hosts"] == [a.name, b.name]
    assert result.metrics["world_size"] == 2
    cell_dir = outcome.paths.cell_dir(result.cell_id)
    command = json.loads((cell_dir / "command.json").read_text())
    assert "--nnodes=2" in command["argv"] and "--node_rank=0" in command["argv"]
    assert (cell_dir / "summary.json").is_file()
    assert run_containers(docker_client, outcome.paths.run_id) == []


def test_cell_whose_last_host_is_lost_becomes_unplaceable(tmp_path: Path) -> None:
    """The sweep retries a host_lost cell; with no host left it ends unplaceable, with why."""
    from orchestrator.sweep import NullEvents, run_cells

    matrix = write_matrix_file(tmp_path, "")
    backend = make_backend(tmp_path, matrix, fake_inventory(
        tmp_path, {"a": 'tags = ["cpu"]\ngpus = [0]'}))
    (cell,) = backend.matrix.cells

    def lost_run(cell: Cell, allocation: Allocation, attempt: int = 1) -> CellResult:
        backend.mark_host_lost("a", "host a stopped answering")
        return CellResult(cell_id=cell.id, group=cell.group, repeat=cell.repeat,
                          status=Status.HOST_LOST, reason="host a stopped answering",
                          params=cell.params.model_dump(), attempts=attempt)

    backend.run_cell = lost_run  # type: ignore[method-assign]
    (result,) = run_cells(backend, [cell], NullEvents(), retries=1)
    assert result.status is Status.UNPLACEABLE
    assert "its host was lost (attempt 1)" in result.reason
    assert "every host tagged 'cpu' is lost (a)" in result.reason
