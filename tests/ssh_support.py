"""Pytest fixtures: real OpenSSH servers on 127.0.0.1 for the SSH tests.

Each server is ``/usr/sbin/sshd -D`` with its own generated host key, a generated client key in
``AuthorizedKeysFile``, a free port and a PID file, all in a temporary directory. It runs as the
current user (root here: ``PermitRootLogin prohibit-password`` allows key logins). Traffic stays on
loopback.

Without ``/usr/sbin/sshd`` the tests are skipped with the reason shown, unless ``CI=true``: then
they fail, because CI must install openssh-server.

Register with ``pytest_plugins = ["ssh_support"]`` (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from service_support import unavailable

SSHD = Path("/usr/sbin/sshd")


def require_sshd() -> None:
    """Skip (or fail under CI=true) when openssh-server is not installed."""
    if SSHD.exists() and shutil.which("ssh-keygen"):
        return
    unavailable(f"{SSHD} or ssh-keygen missing: apt-get install -y openssh-server")


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "orchestrate-test", "-f", str(path)],
        check=True,
    )


@dataclass
class SshdServer:
    """One running sshd: where it listens and the keys to reach and verify it."""

    name: str
    port: int
    root: Path
    client_key: Path
    host_key_pub: Path
    proc: subprocess.Popen[bytes] | None = None
    log: Path = field(default=Path("/dev/null"))
    #: Environment of every session this sshd starts (``SetEnv``; e.g. a PATH that puts a
    #: per-host stand-in tool first: the loopback "hosts" are all this machine).
    setenv: dict[str, str] = field(default_factory=dict)

    @property
    def user(self) -> str:
        return getpass.getuser()

    def known_hosts_line(self) -> str:
        """The known_hosts line trusting this server's host key."""
        key_type, key_b64 = self.host_key_pub.read_text().split()[:2]
        return f"[127.0.0.1]:{self.port} {key_type} {key_b64}\n"

    def host_toml(self, *, tags: tuple[str, ...] = ("cpu",), extra: str = "") -> str:
        """A ``[[hosts]]`` table for this server (key file, no agent)."""
        tag_list = ", ".join(f'"{t}"' for t in tags)
        return (
            f'[[hosts]]\nname = "{self.name}"\naddress = "127.0.0.1"\nport = {self.port}\n'
            f'user = "{self.user}"\nkey_file = "{self.client_key}"\nagent = false\n'
            f"tags = [{tag_list}]\n{extra}\n"
        )

    def stop(self) -> None:
        """Stop the server (its port then refuses connections)."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def start(self) -> None:
        """Start sshd and wait until it accepts TCP connections."""
        config = self.root / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    "ListenAddress 127.0.0.1",
                    f"Port {self.port}",
                    f"HostKey {self.root / 'host_key'}",
                    f"AuthorizedKeysFile {self.client_key}.pub",
                    f"PidFile {self.root / 'sshd.pid'}",
                    "StrictModes no",
                    "UsePAM no",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PermitRootLogin prohibit-password",
                    "PrintMotd no",
                    "LogLevel VERBOSE",
                    # no "Subsystem sftp": many lab hosts turn it off, nothing may need it
                    # one SetEnv line: sshd uses the first of repeated SetEnv lines only
                    *(["SetEnv " + " ".join(f'"{k}={v}"' for k, v in self.setenv.items())]
                      if self.setenv else []),
                    "",
                ]
            )
        )
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege-separation dir
        self.log = self.root / "sshd.log"
        self.proc = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("ab"),
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {self.log.read_text()[-2000:]}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5),
            ):
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(
            f"sshd on port {self.port} did not start: {self.log.read_text()[-2000:]}"
        )


SshdFactory = Callable[..., SshdServer]


@pytest.fixture(scope="session")
def sshd_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdFactory]:
    """Start sshd instances by name: ``sshd_factory("lab-a")`` (``setenv={...}``: the
    environment of its sessions); all stopped at session end."""
    require_sshd()
    started: list[SshdServer] = []
    client_dir = tmp_path_factory.mktemp("ssh-client")
    client_key = client_dir / "id_ed25519"
    _keygen(client_key)

    def start(name: str, *, setenv: dict[str, str] | None = None) -> SshdServer:
        root = tmp_path_factory.mktemp(f"sshd-{name}")
        _keygen(root / "host_key")
        server = SshdServer(
            name=name,
            port=free_port(),
            root=root,
            client_key=client_key,
            host_key_pub=root / "host_key.pub",
            setenv=dict(setenv or {}),
        )
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def sshd_server(sshd_factory: SshdFactory) -> SshdServer:
    """One sshd shared by the session's tests."""
    return sshd_factory("lab-a")


@pytest.fixture(scope="session")
def sshd_pair(sshd_factory: SshdFactory, sshd_server: SshdServer) -> tuple[SshdServer, SshdServer]:
    """Two sshd hosts (the shared one and a second)."""
    return sshd_server, sshd_factory("lab-b")


def write_inventory(
    tmp_path: Path,
    servers: list[SshdServer],
    *,
    trust: bool = False,
    known: list[SshdServer] | None = None,
    options: str = "",
    tags: tuple[str, ...] = ("cpu",),
    gpus: list[list[int]] | None = None,
) -> Path:
    """Write hosts.toml + known_hosts for ``servers``; ``known`` (default: all) are pre-trusted;
    ``options``: more ``[options]`` lines; ``tags`` of every host; ``gpus``: each host's (fake)
    GPU ids, in the order of ``servers``."""
    known_hosts = tmp_path / "known_hosts"
    trusted = servers if known is None else known
    known_hosts.write_text("".join(s.known_hosts_line() for s in trusted))
    extras = [""] * len(servers) if gpus is None else [f"gpus = {ids}" for ids in gpus]
    path = tmp_path / "hosts.toml"
    path.write_text(
        "[options]\n"
        f'known_hosts = "{known_hosts}"\n'
        'ssh_config = ""\n'
        "connect_timeout = 5\n"
        f"trust_on_first_use = {'true' if trust else 'false'}\n"
        f"{options}\n"
        + "".join(s.host_toml(tags=tags, extra=extra)
                  for s, extra in zip(servers, extras, strict=True))
    )
    return path
