"""Locks on a lab host's GPUs, taken on that host over SSH (issue 10, item 10, ssh backend).

The "lab hosts" are real sshd servers on loopback (tests/ssh_support.py): the lock script runs
in a real sshd session with this machine's ``sh`` and ``flock(1)``, so the lock folder "on the
host" is a folder of this machine, and a local :class:`~orchestrator.local.locks.FileLocker` on the
same folder meets the remote locks exactly as a local sweep on a lab host would. The sweeps at
the end are real ssh-backend sweeps (Docker over SSH, the tiny real workload on the CPU); their
inventories list fake GPU ids, which the cells lock as GPU cells do. The unit tests at the top
need no sshd: they check the command built and run the lock script itself with ``sh``.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from docker_support import cpu_container_matrix
from lock_support import acquire
from ssh_support import SshdFactory, SshdServer, write_inventory
from standin_support import Standin

from orchestrator.config.inventory import load_hosts, parse_hosts
from orchestrator.errors import ConfigError, LaunchError
from orchestrator.local.locks import (
    Holder,
    LockBusy,
    LockRequest,
    LockWaitCancelled,
    hold,
    user_name,
)
from orchestrator.remote.connection import SshHost
from orchestrator.remote.ssh_locker import LOCK_SCRIPT, SshLocker, lock_argv, remote_lock_dir

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = "/tmp/orchestrate lock's $(touch pwned) `x`;dir"


# --- the command, and the script alone (no sshd) -------------------------------------------------


def test_every_value_is_a_quoted_word_of_its_own() -> None:
    record = Holder("m/r1", "c'1 $(x)").to_json()
    argv = lock_argv(HOSTILE, record, LockRequest("lab-a", (3, 1)))
    assert argv[:6] == ["sh", "-c", LOCK_SCRIPT, "orchestrate-lock", HOSTILE, record]
    assert argv[6:] == ["s", "lab-a.lock", "x", "lab-a-gpu1.lock", "x", "lab-a-gpu3.lock"]
    assert shlex.split(shlex.join(argv)) == argv  # what open_stream sends parses back the same
    assert lock_argv("/l", "{}", LockRequest("h"))[6:] == ["s", "h.lock", "x", "h-cpu.lock"]
    assert lock_argv("/l", "{}", LockRequest("h", whole_host=True))[6:] == ["x", "h.lock"]


def run_script(argv: list[str], stdin: str) -> tuple[int, str]:
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30,
                          cwd="/tmp")
    return proc.returncode, proc.stdout


@pytest.mark.subprocess  # runs the lock script under sh
def test_the_script_takes_the_locks_of_a_hostile_folder_name_and_writes_the_holder(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "x y;$(touch pwned)"
    record = Holder("m/r1", "cell-1").to_json()
    code, out = run_script(lock_argv(str(folder), record, LockRequest("h", (0,))), "")
    assert (code, out.split()) == (0, ["TAKEN", "TAKEN", "HELD"])
    assert sorted(p.name for p in folder.iterdir()) == ["h-gpu0.lock", "h.lock"]
    assert oct(folder.stat().st_mode & 0o7777) == "0o1777"
    assert json.loads((folder / "h-gpu0.lock").read_text().splitlines()[0])["cell"] == "cell-1"
    assert not (tmp_path / "pwned").exists() and not Path("/tmp/pwned").exists()


@pytest.mark.subprocess  # runs the lock script under sh
def test_the_script_says_busy_with_the_holder_and_gives_up_when_its_stdin_ends(
    tmp_path: Path,
) -> None:
    with acquire(LockRequest("h", (0,)), Holder("m/first", "c0"), folder=tmp_path):
        code, out = run_script(lock_argv(str(tmp_path), "{}", LockRequest("h", (1, 0))),
                               "again\n")
    lines = out.splitlines()
    assert code == 0 and lines[0] == "TAKEN"  # the host's lock; GPU 0 comes before GPU 1
    assert [ln.split(" ", 1)[0] for ln in lines[1:]] == ["BUSY", "BUSY"]  # tried, again, EOF
    assert json.loads(lines[1].split(" ", 1)[1])["run"] == "m/first"
    # gave up: nothing is left held
    with acquire(LockRequest("h", (0, 1), whole_host=True), Holder("m/x", "c"), timeout_s=0,
                 folder=tmp_path):
        pass


@pytest.mark.subprocess  # runs the lock script under sh
def test_the_script_refuses_a_symlinked_folder_or_file(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    code, out = run_script(lock_argv(str(tmp_path / "link"), "{}", LockRequest("h")), "")
    assert code == 3 and out.startswith("ERROR the lock folder") and "symlink" in out
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "h.lock").symlink_to(tmp_path / "victim")
    code, out = run_script(lock_argv(str(tmp_path / "real"), "{}", LockRequest("h")), "")
    assert code == 3 and "is a symbolic link" in out and not (tmp_path / "victim").exists()


def test_the_lock_folder_on_the_hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = '[[hosts]]\nname = "a"\naddress = "h"\n'
    monkeypatch.setenv("ORCHESTRATE_LOCK_DIR", "/var/lock/orch")
    assert remote_lock_dir(parse_hosts(base)) == "/var/lock/orch"
    monkeypatch.delenv("ORCHESTRATE_LOCK_DIR")
    assert remote_lock_dir(parse_hosts(base)) == "/tmp/orchestrate-locks"
    assert remote_lock_dir(parse_hosts('[options]\nlock_dir = "/srv/l"\n' + base)) == "/srv/l"
    assert remote_lock_dir(parse_hosts('[options]\nlock_dir = ""\n' + base)) is None
    with pytest.raises(ConfigError) as err:
        parse_hosts('[options]\nlock_dir = "locks"\n' + base)
    assert "options.lock_dir" in str(err.value)


# --- through a real sshd ---------------------------------------------------------------------


def inventory(tmp_path: Path, server: SshdServer, lock_dir: Path,
              gpus: tuple[int, ...] = (0, 1)) -> Path:
    """One host with (fake) GPU ids ``gpus`` whose locks are in ``lock_dir``."""
    return write_inventory(tmp_path, [server], options=f'lock_dir = "{lock_dir}"',
                           gpus=[list(gpus)])


def remote(hosts: Path, name: str) -> Any:
    """A locker factory for :func:`hold`: the host's locks, over a fresh connection each."""
    inv = load_hosts(hosts)
    folder = remote_lock_dir(inv)
    assert folder is not None
    return lambda request, holder: SshLocker(request, holder,
                                             SshHost.from_inventory(inv, name), folder)


@pytest.fixture
def lab(sshd_factory: SshdFactory, tmp_path: Path) -> tuple[SshdServer, Path, Path]:
    server = sshd_factory("lock-lab")
    folder = tmp_path / "host-locks"
    return server, inventory(tmp_path, server, folder), folder


def lock_processes(folder: Path) -> list[int]:
    """Pids of lock scripts (sh or cat under them) still running for ``folder``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"orchestrate-lock" in cmd and str(folder).encode() in cmd:
                found.append(int(entry))
    return found


def steady_lock_processes(folder: Path) -> list[int]:
    """:func:`lock_processes`, sorted, once it holds still: a holder's last subshell says HELD
    just before it becomes ``cat`` (no longer counted), so a list taken at once may count it."""
    last = sorted(lock_processes(folder))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = sorted(lock_processes(folder))
        if now == last:
            break
        last = now
    return last


@pytest.mark.ssh
@pytest.mark.timeout(120)
def test_a_remote_lock_makes_others_wait_naming_the_holder(lab) -> None:
    server, hosts, folder = lab
    on_host = remote(hosts, server.name)
    first = hold([LockRequest(server.name, (0,))], Holder("nightly/r1", "g1-r1"), on_host)
    assert lock_processes(folder), "the lock script runs on the host while the lock is held"
    assert json.loads((folder / f"{server.name}-gpu0.lock").read_text().splitlines()[0])[
        "cell"] == "g1-r1"
    heard: list[str] = []
    with pytest.raises(LockBusy) as err:
        hold([LockRequest(server.name, (1, 0))], Holder("manual/r2", "g2-r1"), on_host,
             timeout_s=1.2, on_wait=heard.append)
    assert (f"GPUs 0,1 on {server.name} held by run nightly/r1 (user {user_name()}, "
            f"pid {os.getpid()} on ") in str(err.value)
    assert "cell g1-r1) since" in str(err.value) and "(--lock-timeout 1.2)" in str(err.value)
    assert heard == [f"g2-r1: waiting for GPUs 0,1 on {server.name}: "
                     + str(err.value).split(f"{server.name} ", 1)[1].split("; gave up")[0]]
    with pytest.raises(LockBusy, match=r"--lock-timeout 0\)"):  # --no-wait
        hold([LockRequest(server.name, (0,))], Holder("m/r3", "c"), on_host, timeout_s=0)
    # another GPU is free; the whole host is not; a local sweep on the host meets the same lock
    with hold([LockRequest(server.name, (1,))], Holder("m/r4", "c"), on_host, timeout_s=0):
        pass
    with pytest.raises(LockBusy):
        hold([LockRequest(server.name, whole_host=True)], Holder("m/r5", "c"), on_host,
             timeout_s=0)
    with pytest.raises(LockBusy, match="held by run nightly/r1"):
        acquire(LockRequest(server.name, (0,)), Holder("local/r6", "c"), timeout_s=0,
                folder=folder)
    first.release()  # the script has ended when release returns: the lock is free at once
    assert lock_processes(folder) == []
    with hold([LockRequest(server.name, (0, 1))], Holder("m/r7", "c"), on_host, timeout_s=0):
        pass


@pytest.mark.ssh
@pytest.mark.timeout(120)
def test_a_wait_ends_when_the_holder_releases_or_the_sweep_is_cancelled(lab) -> None:
    server, hosts, folder = lab
    on_host = remote(hosts, server.name)
    first = hold([LockRequest(server.name, (0,))], Holder("m/a", "c"), on_host)

    def release_later(_said: str) -> None:  # 1 s after the waiter found the lock held (its
        threading.Timer(1.0, first.release).start()  # SSH connection is not part of the wait)

    with hold([LockRequest(server.name, (0,))], Holder("m/b", "c"), on_host,
              on_wait=release_later) as second:
        assert second.waited_s >= 0.9
    blocker = hold([LockRequest(server.name, (0,))], Holder("m/a", "c"), on_host)
    holding = steady_lock_processes(folder)
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    with pytest.raises(LockWaitCancelled):
        hold([LockRequest(server.name, (0,))], Holder("m/b", "c"), on_host, cancel=cancel)
    assert sorted(lock_processes(folder)) == holding  # the waiter's script has left
    blocker.release()
    assert lock_processes(folder) == []


@pytest.mark.ssh
@pytest.mark.timeout(120)
def test_two_hosts_are_locked_in_name_order_and_an_error_releases_the_first(
    sshd_factory: SshdFactory, tmp_path: Path
) -> None:
    a, b = sshd_factory("lock-b"), sshd_factory("lock-a")  # name order: lock-a first
    folder = tmp_path / "host-locks"
    lockers = {s.name: remote(inventory(tmp_path / s.name, s, folder), s.name)
               for s in (a, b) if (tmp_path / s.name).mkdir() is None}
    made: list[str] = []

    def either(request: LockRequest, holder: Holder) -> Any:
        made.append(request.host)
        return lockers[request.host](request, holder)

    requests = sorted([LockRequest(a.name, (0,)), LockRequest(b.name, (0,))],
                      key=lambda r: r.host)
    with hold(requests, Holder("m/r", "mn"), either):
        assert sorted(p.name for p in folder.iterdir()) == [
            "lock-a-gpu0.lock", "lock-a.lock", "lock-b-gpu0.lock", "lock-b.lock"]
    assert made == ["lock-a", "lock-b"]
    (folder / "lock-b.lock").unlink()
    (folder / "lock-b.lock").symlink_to(tmp_path / "victim")
    with pytest.raises(LaunchError, match="is a symbolic link"):
        hold(requests, Holder("m/r", "mn"), either)
    assert lock_processes(folder) == []  # lock-a's locks went with the error


HOLDER = """
import sys, time
from orchestrator.config.inventory import load_hosts
from orchestrator.local.locks import Holder, LockRequest, hold
from orchestrator.remote.ssh_locker import SshLocker, remote_lock_dir
from orchestrator.remote.connection import SshHost
inv = load_hosts(sys.argv[1])
name = inv.names[0]
hold([LockRequest(name, (0,))], Holder("killed/r1", "c"),
     lambda r, h: SshLocker(r, h, SshHost.from_inventory(inv, name), remote_lock_dir(inv)))
print("held", flush=True)
time.sleep(600)
"""


@pytest.mark.ssh
@pytest.mark.timeout(120)
def test_the_remote_lock_of_a_controller_killed_with_sigkill_is_released(lab) -> None:
    server, hosts, folder = lab
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(hosts)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        on_host = remote(hosts, server.name)
        with pytest.raises(LockBusy, match=f"held by run killed/r1 \\(user {user_name()}, "
                           f"pid {proc.pid} on "):
            hold([LockRequest(server.name, (0,))], Holder("m/b", "c"), on_host, timeout_s=0)
        proc.send_signal(signal.SIGKILL)  # no cleanup of any kind
        proc.wait(10)
        # sshd sees the connection close and ends the session: the script's stdin ends
        with hold([LockRequest(server.name, (0,))], Holder("m/b", "c"), on_host,
                  timeout_s=30) as held:
            assert held.waited_s < 30
        assert lock_processes(folder) == []
    finally:
        proc.kill()
        proc.wait(10)


def test_flock_modes_match_the_local_ones() -> None:
    """The script's ``s``/``x`` are the local LOCK_SH/LOCK_EX of the same files."""
    request = LockRequest("h", (2,), whole_host=True)
    modes = {fcntl.LOCK_SH: "s", fcntl.LOCK_EX: "x"}
    assert lock_argv("/l", "{}", request)[6:] == [w for n, m in request.files()
                                                  for w in (modes[m], n)]


# --- real ssh-backend sweeps (Docker over SSH) ---------------------------------------------------


def sweep_matrix(tmp_path: Path, name: str, base: str, body: str = "",
                 standin: Standin | None = None) -> Path:
    """The one-cell container matrix on the ssh backend; its cells run the STAND-IN workload
    with ``standin`` (the sweeps below: what they test is the locking, not the workload)."""
    path = tmp_path / f"{name}.toml"
    path.write_text(cpu_container_matrix(name, base, backend="ssh", profile_extra=body,
                                         standin=standin))
    return path


def cli_sweep(matrix: Path, hosts: Path, results: Path) -> subprocess.Popen[str]:
    """``orchestrate matrix MATRIX --hosts HOSTS --results RESULTS`` started (stderr piped)."""
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "matrix", str(matrix), "--hosts", str(hosts),
         "--results", str(results)],
        cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)


class Said:
    """Sweep events: only what the run loop says (e.g. that a cell waits for a GPU)."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def log(self, message: str) -> None:
        self.messages.append(message)

    def lock_wait(self, cell_id: str, message: str, waited_s: float | None) -> None:
        if waited_s is None:  # the wait begins (SweepEvents.lock_wait)
            self.messages.append(f"{cell_id}: {message}")

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


@pytest.mark.docker
@pytest.mark.ssh
@pytest.mark.timeout(300)
def test_an_ssh_sweep_waits_for_its_gpu_held_on_the_host_and_not_for_another(
    lab, tmp_path: Path, docker_client: Any, base_image: str, standin: Standin
) -> None:
    from orchestrator.plan.matrix import load_matrix
    from orchestrator.results.folders.run_folder import Status
    from orchestrator.sweep import run_sweep

    server, hosts, folder = lab
    on_host = remote(hosts, server.name)
    other = hold([LockRequest(server.name, (0,))], Holder("nightly/r0", "held"), on_host)
    matrix = load_matrix(sweep_matrix(tmp_path, "overlap", base_image, "[axes]\nseed = [1, 2]",
                                      standin=standin))
    said = Said()
    released: dict[str, float] = {}

    def release() -> None:
        released["at"] = time.time()
        other.release()

    def release_when_waited() -> None:
        """GPU 0 is let go once the sweep says it waits for it (its other cell on GPU 1)."""
        deadline = time.monotonic() + 240
        while not any("waiting for" in m for m in said.messages):
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        time.sleep(1.0)
        release()

    threading.Thread(target=release_when_waited, daemon=True).start()
    outcome = run_sweep(matrix, backend_name="ssh", results_root=tmp_path / "results",
                        hosts_file=hosts, events=said)
    assert [r.status for r in outcome.results] == [Status.OK, Status.OK], [
        r.reason for r in outcome.results]
    by_gpu = {tuple(json.loads(outcome.paths.cell_command(r.cell_id).read_text())["gpu_ids"]): r
              for r in outcome.results}
    assert set(by_gpu) == {(0,), (1,)}
    waited, free = by_gpu[(0,)], by_gpu[(1,)]
    assert waited.provenance["lock_wait_s"] > 0 and waited.started_at >= released["at"]
    assert "lock_wait_s" not in free.provenance and free.started_at < released["at"]
    (message,) = [m for m in said.messages if "waiting for" in m]
    assert message.startswith(f"{waited.cell_id}: waiting for GPU 0 on {server.name}: held by "
                              f"run nightly/r0 (user {user_name()}, pid {os.getpid()} on ")
    assert lock_processes(folder) == []  # every cell's locks went when it ended


@pytest.mark.docker
@pytest.mark.ssh
@pytest.mark.timeout(300)
def test_no_wait_fails_the_ssh_cell_saying_who_holds_the_gpu(
    lab, tmp_path: Path, docker_client: Any, base_image: str, standin: Standin
) -> None:
    from orchestrator.plan.matrix import load_matrix
    from orchestrator.results.folders.run_folder import Status
    from orchestrator.sweep import run_sweep

    server, _, folder = lab
    hosts = inventory(tmp_path, server, folder, gpus=(0,))
    on_host = remote(hosts, server.name)
    with hold([LockRequest(server.name, (0,))], Holder("nightly/r0", "held"), on_host):
        outcome = run_sweep(load_matrix(sweep_matrix(tmp_path, "nowait", base_image,
                                                     standin=standin)),
                            backend_name="ssh", results_root=tmp_path / "results",
                            hosts_file=hosts, lock_timeout_s=0)
    (result,) = outcome.results
    assert result.status is Status.FAILED
    assert result.reason.startswith(f"waiting for GPU 0 on {server.name}: GPU 0 on "
                                    f"{server.name} held by run nightly/r0 (user "
                                    f"{user_name()}, pid {os.getpid()}")
    assert result.reason.endswith("(--lock-timeout 0)")
    assert lock_processes(folder) == []


@pytest.mark.docker
@pytest.mark.ssh
@pytest.mark.timeout(300)
def test_sigint_ends_an_ssh_sweep_waiting_for_its_gpu(
    lab, tmp_path: Path, docker_client: Any, base_image: str, standin: Standin
) -> None:
    server, _, folder = lab
    hosts = inventory(tmp_path, server, folder, gpus=(0,))
    on_host = remote(hosts, server.name)
    results = tmp_path / "results"
    with hold([LockRequest(server.name, (0,))], Holder("nightly/r0", "held"), on_host):
        holding = steady_lock_processes(folder)
        proc = cli_sweep(sweep_matrix(tmp_path, "sigint", base_image, standin=standin), hosts,
                         results)
        assert proc.stderr is not None
        lines = []
        for line in proc.stderr:  # until the cell says it waits (after the image is ready)
            lines.append(line)
            if "waiting for GPU 0 on" in line:
                break
        assert "held by run nightly/r0" in lines[-1], lines
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        rest = proc.stderr.read()
        code = proc.wait(60)
        took = time.monotonic() - t0
        assert code == 130, (lines, rest)
        assert sorted(lock_processes(folder)) == holding  # the waiter's script has left
    (path,) = results.glob("sigint/*/cells/*/result.json")
    result = json.loads(path.read_text())
    assert result["status"] == "cancelled" and "waiting for GPU 0" in result["reason"]
    assert "Traceback" not in rest
    print(f"\nSIGINT during a remote lock wait: exit 130 after {took:.1f} s")


def test_the_ssh_backend_locks_every_host_of_a_cell_in_name_order(tmp_path: Path) -> None:
    """No engine, no sshd: what the backend asks to lock, and where."""
    from orchestrator.backends.base import RunOptions
    from orchestrator.backends.ssh import SshDockerBackend
    from orchestrator.plan.matrix import load_matrix
    from orchestrator.plan.placement import Allocation, Slot
    from orchestrator.results.folders.run_folder import RunPaths

    matrix = load_matrix(sweep_matrix(tmp_path, "mn", "unused:1", "multi_node = true"))
    hosts = tmp_path / "hosts.toml"

    def backend(options: str) -> SshDockerBackend:
        hosts.write_text(options + "".join(
            f'[[hosts]]\nname = "{n}"\naddress = "127.0.0.1"\ntags = ["cpu"]\ngpus = [0, 1]\n'
            for n in ("zeta", "alpha")))
        return SshDockerBackend(matrix, RunPaths.create(tmp_path / "results", matrix.name),
                                RunOptions(timeout_s=60, hosts_file=hosts))

    cell = matrix.cells[0]
    one = Allocation(cell.id, (Slot("zeta", (1,)),))
    many = Allocation(cell.id, (Slot("zeta", (0, 1)), Slot("alpha", (1, 0))), exclusive=True)
    ssh = backend('[options]\nlock_dir = "/srv/locks"\n')
    assert ssh.lock_dir == "/srv/locks"
    assert ssh.lock_requests(cell, one) == (LockRequest("zeta", (1,)),)
    assert ssh.lock_requests(cell, many) == (LockRequest("alpha", (1, 0), whole_host=True),
                                             LockRequest("zeta", (0, 1), whole_host=True))
    assert backend('[options]\nlock_dir = ""\n').lock_requests(cell, many) == ()


@pytest.mark.docker
@pytest.mark.ssh
@pytest.mark.timeout(400)
def test_two_ssh_sweeps_on_one_gpu_and_the_first_killed_with_sigkill(
    lab, tmp_path: Path, docker_client: Any, base_image: str, standin: Standin
) -> None:
    """Two controllers (two CLI sweeps) on one GPU of one host: the second waits, naming the
    first; the first dies by SIGKILL; its host lock goes with its connection; the second runs."""
    from docker_support import run_containers

    from orchestrator.backends.remote_executions import REMOTE_ROOT

    server, _, folder = lab
    hosts = inventory(tmp_path, server, folder, gpus=(0,))
    results = tmp_path / "results"
    first = cli_sweep(sweep_matrix(tmp_path, "first", base_image,
                                   "[axes]\niterations = [1000000]", standin=standin),
                      hosts, results)
    second: subprocess.Popen[str] | None = None
    try:
        lock = folder / f"{server.name}-gpu0.lock"
        deadline = time.monotonic() + 240
        while f'"pid": {first.pid}' not in (lock.read_text() if lock.exists() else ""):
            assert time.monotonic() < deadline and first.poll() is None, "never held GPU 0"
            time.sleep(0.2)
        second = cli_sweep(sweep_matrix(tmp_path, "second", base_image, standin=standin), hosts,
                           results)
        assert second.stderr is not None
        for line in second.stderr:
            if "waiting for GPU 0 on" in line:
                break
        assert "held by run first/" in line and f"pid {first.pid} on " in line, line
        first.kill()  # SIGKILL: no cleanup of any kind
        first.wait(30)
        rest = second.stderr.read()
        assert second.wait(240) == 0, rest
        (path,) = results.glob("second/*/cells/*/result.json")
        result = json.loads(path.read_text())
        assert result["status"] == "ok" and result["provenance"]["lock_wait_s"] > 0
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(30)
        for run in results.glob("first/*"):  # the killed sweep's container and folder
            for container in run_containers(docker_client, run.name):
                container.remove(force=True)
            shutil.rmtree(Path(REMOTE_ROOT, run.name), ignore_errors=True)
