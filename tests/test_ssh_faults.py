"""SSH set-up faults are named, not called "unreachable": a missing, odd or broken key file, a
corrupt known_hosts line, an SSH library error during ``hosts check``. Real sshd on 127.0.0.1
(tests/ssh_support.py); an unreadable (mode 000) key is not tested: the tests run as root here,
and root reads any file.
"""

from __future__ import annotations

from pathlib import Path

import paramiko
import pytest
from ssh_support import SshdServer, write_inventory

from orchestrator.cli import main
from orchestrator.config.inventory import load_hosts, parse_hosts
from orchestrator.errors import HostError, HostUnreachable
from orchestrator.remote.connection import SshHost, key_file_problem


def _inventory_with_key(tmp_path: Path, server: SshdServer, key: Path) -> Path:
    path = write_inventory(tmp_path, [server])
    path.write_text(path.read_text().replace(str(server.client_key), str(key)))
    return path


@pytest.mark.ssh
@pytest.mark.parametrize(("make", "needle"), [
    (lambda d: d / "missing_key", "does not exist"),
    (lambda d: d, "is not a file"),
    (lambda d: _write(d / "garbage_key", "not a key\n"), "not a private key paramiko can read"),
])
def test_a_bad_key_file_is_named(tmp_path: Path, sshd_server: SshdServer, make, needle) -> None:
    key = make(tmp_path)
    inventory = load_hosts(_inventory_with_key(tmp_path, sshd_server, key))
    host = SshHost.from_inventory(inventory, sshd_server.name)
    with pytest.raises(HostError) as err:
        host.connect()
    assert not isinstance(err.value, HostUnreachable)
    message = str(err.value)
    assert needle in message and str(key) in message and "unreachable" not in message


@pytest.mark.ssh
def test_hosts_check_reports_a_missing_key_as_such(
    tmp_path: Path, sshd_server: SshdServer, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _inventory_with_key(tmp_path, sshd_server, tmp_path / "nope")
    assert main(["hosts", "check", str(path)]) == 1
    captured = capsys.readouterr()
    assert "NO: key file unusable" in captured.out
    assert "could not check:" in captured.out and "does not exist" in captured.out
    assert "1 of 1 hosts could not be checked" in captured.out
    assert "unreachable" not in captured.out and "Traceback" not in captured.err


@pytest.mark.ssh
@pytest.mark.parametrize("bad_line", [
    "[127.0.0.1]:22 ssh-ed25519 !!!notbase64",
    "[127.0.0.1]:22 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI",
])
def test_a_corrupt_known_hosts_line_is_named(
    tmp_path: Path, sshd_server: SshdServer, bad_line: str
) -> None:
    path = write_inventory(tmp_path, [sshd_server])
    known = tmp_path / "known_hosts"
    known.write_text("# lab hosts\n" + bad_line + "\n" + known.read_text())
    host = SshHost.from_inventory(load_hosts(path), sshd_server.name)
    with pytest.raises(HostError) as err:
        host.connect()
    message = str(err.value)
    assert not isinstance(err.value, HostUnreachable)
    assert f"known_hosts {known}: line 2 is corrupt" in message and "ssh-keygen -R" in message


@pytest.mark.ssh
def test_missing_identity_files_of_the_ssh_config_are_passed_over(
    tmp_path: Path, sshd_server: SshdServer
) -> None:
    """As OpenSSH does: a shared config lists several IdentityFile entries; those missing are
    skipped, the one that exists is used."""
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host lab\n  HostName 127.0.0.1\n  Port {sshd_server.port}\n"
        f"  IdentityFile {tmp_path / 'id_missing'}\n  IdentityFile {sshd_server.client_key}\n"
    )
    known = tmp_path / "known_hosts"
    known.write_text(sshd_server.known_hosts_line())
    inventory = parse_hosts(
        f'[options]\nssh_config = "{config}"\nknown_hosts = "{known}"\n'
        '[[hosts]]\nname = "lab"\naddress = "lab"\nagent = false\n',
        tmp_path / "hosts.toml",
    )
    with SshHost.from_inventory(inventory, "lab") as host:
        assert host.run(["true"]).exit_code == 0


def test_an_ssh_library_error_in_hosts_check_is_the_hosts_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fake: discover() raising what paramiko raises outside the wrapped calls (an SSH
    protocol error half-way through a probe) must become that host's reason."""
    from orchestrator.cli import host_commands as hosts_command

    def broken(host: object, timeout: float) -> None:
        raise paramiko.SSHException("Channel closed.")

    monkeypatch.setattr(hosts_command, "discover", broken)
    path = tmp_path / "hosts.toml"
    path.write_text('[options]\nssh_config = ""\n[[hosts]]\nname = "a"\naddress = "10.0.0.1"\n')
    assert main(["hosts", "check", str(path)]) == 1
    captured = capsys.readouterr()
    assert "NO: SSH error" in captured.out and "Channel closed." in captured.out
    assert "Traceback" not in captured.err


@pytest.mark.ssh
def test_key_file_problem_accepts_a_real_key(tmp_path: Path) -> None:
    from ssh_support import _keygen

    path = tmp_path / "id"
    _keygen(path)
    assert key_file_problem(path) == ""
    assert "does not exist" in key_file_problem(tmp_path / "nope")


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
