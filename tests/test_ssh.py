"""SshHost against real sshd servers on 127.0.0.1 (see tests/ssh_support.py)."""

from __future__ import annotations

import dataclasses
import random
import time
from pathlib import Path

import pytest
from ssh_support import SshdServer, _keygen, write_inventory

from orchestrator.config.inventory import load_hosts
from orchestrator.errors import HostError, HostUnreachable
from orchestrator.remote.connection import RemoteTimeout, SshHost, UnknownHostKey, build_command

pytestmark = pytest.mark.ssh


def _host(tmp_path: Path, server: SshdServer, **kwargs: object) -> SshHost:
    inventory = load_hosts(write_inventory(tmp_path, [server], **kwargs))  # type: ignore[arg-type]
    return SshHost.from_inventory(inventory, server.name)


def _processes_with(marker: str) -> list[int]:
    """Local pids whose command line contains ``marker`` (the sshd 'remote' is this machine)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline:
            found.append(int(entry.name))
    return found


def test_build_command_quotes_every_word() -> None:
    cmd = build_command(["echo", "a b", "$(id)"], env={"X": "1 2"})
    assert "'a b'" in cmd and "'$(id)'" in cmd and "'X=1 2'" in cmd
    with pytest.raises(ValueError):
        build_command(["true"], env={"BAD NAME": "x"})
    with pytest.raises(ValueError):
        build_command([])


def test_connect_with_known_key_and_run(tmp_path: Path, sshd_server: SshdServer) -> None:
    with _host(tmp_path, sshd_server) as host:
        assert host.connected
        code, out, err = host.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (code, out, err) == (3, "out\n", "err\n")


def test_unknown_host_key_is_refused_with_advice(tmp_path: Path, sshd_server: SshdServer) -> None:
    host = _host(tmp_path, sshd_server, known=[])
    with pytest.raises(UnknownHostKey) as info:
        host.connect()
    msg = str(info.value)
    assert sshd_server.name in msg and "ssh-ed25519" in msg and "SHA256:" in msg
    assert "ssh-keyscan" in msg and "trust_on_first_use" in msg
    assert not host.connected


def test_trust_on_first_use_records_key(tmp_path: Path, sshd_server: SshdServer) -> None:
    host = _host(tmp_path, sshd_server, known=[], trust=True)
    with host:
        assert host.run(["true"]).exit_code == 0
    recorded = (tmp_path / "known_hosts").read_text()
    assert recorded == sshd_server.known_hosts_line()
    # The recorded key now verifies without trust_on_first_use.
    strict = SshHost(host.target, known_hosts=tmp_path / "known_hosts")
    with strict:
        assert strict.run(["true"]).exit_code == 0


def test_changed_host_key_is_refused(tmp_path: Path, sshd_pair: tuple[SshdServer, ...]) -> None:
    a, b = sshd_pair
    # known_hosts lists b's key under a's address: a now looks like a changed key.
    (tmp_path / "kh").write_text(b.known_hosts_line().replace(str(b.port), str(a.port)))
    host = SshHost(_host(tmp_path, a).target, known_hosts=tmp_path / "kh", trust_on_first_use=True)
    with pytest.raises(HostError, match="CHANGED"):
        host.connect()


def test_arguments_arrive_verbatim(tmp_path: Path, sshd_server: SshdServer) -> None:
    words = ["a b", "it's", '"dq"', "$(touch /tmp/pwned)", "x; rm -rf /", "`id`", "*", "", "\\n"]
    with _host(tmp_path, sshd_server) as host:
        result = host.run(["printf", "%s\\n", *words])
        env_result = host.run(["sh", "-c", 'printf %s "$V"'], env={"V": "$(id); 'q'"})
    assert result.exit_code == 0
    assert result.stdout.split("\n")[:-1] == words
    assert env_result.stdout == "$(id); 'q'"
    assert not Path("/tmp/pwned").exists()


def test_fetch_dir_copies_a_tree_without_sftp(tmp_path: Path, sshd_server: SshdServer) -> None:
    # the test sshd has no SFTP subsystem: fetch_dir must not need one
    remote = tmp_path / "remote"
    (remote / "sub" / "deeper").mkdir(parents=True)
    (remote / "log.txt").write_text("line\n")
    (remote / "sub" / "a b.csv").write_text("x,y\n1,2\n")
    (remote / "sub" / "deeper" / "trace.json").write_bytes(bytes(range(256)) * 400)
    local = tmp_path / "local"
    with _host(tmp_path, sshd_server) as host:
        assert host.fetch_dir(str(remote), local) == 3
        with pytest.raises(HostError, match="copying .*/nope back failed: .*No such file"):
            host.fetch_dir(str(tmp_path / "nope"), tmp_path / "other")
    assert (local / "log.txt").read_text() == "line\n"
    assert (local / "sub" / "a b.csv").read_text() == "x,y\n1,2\n"
    assert (local / "sub" / "deeper" / "trace.json").read_bytes() == bytes(range(256)) * 400


def test_missing_command_is_exit_127_not_crash(tmp_path: Path, sshd_server: SshdServer) -> None:
    with _host(tmp_path, sshd_server) as host:
        code, _, err = host.run(["no-such-tool-xyz", "--version"])
    assert code == 127 and "no-such-tool-xyz" in err


def test_command_timeout_kills(tmp_path: Path, sshd_server: SshdServer) -> None:
    marker = f"{random.randint(10**6, 10**7)}"
    started = time.monotonic()
    with _host(tmp_path, sshd_server) as host, pytest.raises(RemoteTimeout) as info:
        host.run(["sh", "-c", f"echo begun; sleep {marker}"], timeout=1.0)
    assert time.monotonic() - started < 8
    assert info.value.stdout == "begun\n"
    assert _wait_gone(marker)


def test_streaming_output_arrives_while_running(tmp_path: Path, sshd_server: SshdServer) -> None:
    script = "for i in 1 2 3; do echo line$i; sleep 0.3; done; echo oops >&2"
    with _host(tmp_path, sshd_server) as host:
        proc = host.start(["sh", "-c", script], combine_stderr=True)
        assert proc.pgid is not None
        arrivals = []
        data = b""
        for chunk in proc.output():
            arrivals.append(time.monotonic())
            data += chunk
        assert proc.wait(5) == 0
    assert data == b"line1\nline2\nline3\noops\n"
    assert len(arrivals) >= 3 and arrivals[-1] - arrivals[0] > 0.4  # not one chunk at the end


def _wait_gone(marker: str, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while _processes_with(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_kill_leaves_no_process_behind(tmp_path: Path, sshd_server: SshdServer) -> None:
    marker = f"{random.randint(10**6, 10**7)}"
    # A tree: a shell, two background sleeps, one of them ignoring SIGTERM (needs SIGKILL).
    script = f"sleep {marker} & sh -c 'trap \"\" TERM; sleep {marker}1' & echo ready; wait"
    with _host(tmp_path, sshd_server) as host:
        proc = host.start(["sh", "-c", script], env={"CELL": "x"})
        first = next(proc.output())
        assert first.startswith(b"ready")
        assert len(_processes_with(marker)) >= 2
        proc.kill(grace=0.5)
        assert proc.killed and proc.exit_code is not None
        assert _wait_gone(marker), f"left behind: {_processes_with(marker)}"
        assert host.run(["true"]).exit_code == 0  # the connection is still usable


def test_unreachable_host_is_host_error(tmp_path: Path, sshd_factory) -> None:
    down = sshd_factory("lab-gone")
    down.stop()
    host = _host(tmp_path, down)
    with pytest.raises(HostUnreachable, match="unreachable"):
        host.connect()


def test_wrong_key_is_authentication_error(tmp_path: Path, sshd_server: SshdServer) -> None:
    other = tmp_path / "other_key"
    _keygen(other)
    host = _host(tmp_path, sshd_server)
    host.target = dataclasses.replace(host.target, key_files=(str(other),))
    with pytest.raises(HostError, match="authentication failed") as info:
        host.connect()
    assert not isinstance(info.value, HostUnreachable)  # the user must act: no other host
