"""A small paramiko wrapper: connect to a lab host, run commands, stream and kill them.

:class:`SshHost` mirrors a local subprocess the way fabric's ``Remote`` mirrors ``Local``:
``run(argv)`` is ``subprocess.run`` (exit code, stdout, stderr; a timeout kills the command) and
``start(argv)`` is ``subprocess.Popen`` (:class:`RemoteProcess`: ``output()``, ``wait()``,
``kill()``, ``exit_code``).

Safety rules:

* Host keys are verified against known_hosts; an unknown key is refused with a
  :class:`UnknownHostKey` saying how to trust it, unless ``trust_on_first_use`` is set (then the
  key is recorded in known_hosts and a warning is logged). A changed key is always refused.
  A known_hosts line paramiko cannot read is refused naming the file and the line.
* A key file written in the inventory that is missing, unreadable or not a private key is a
  :class:`HostError` naming the file (not "unreachable": another host would not help).
* Commands are argv lists; every word is ``shlex.quote``-d, so no user string reaches the remote
  shell unquoted. Environment variables travel as ``env NAME=VALUE`` words, not via ``AcceptEnv``.
* Every command runs as the leader of its own process group (``setsid``; the remote login shell
  must be POSIX). Its process-group id is reported on the first line of stdout, which this module
  strips, so :meth:`RemoteProcess.kill` can signal the whole tree, not only close the channel.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
import select
import shlex
import socket
import tarfile
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import paramiko

from orchestrator.catalog.gpus import CommandResult
from orchestrator.config.inventory import ConnectTarget, Inventory, known_hosts_path, resolve_host
from orchestrator.errors import HostError, HostUnreachable, RemoteTimeout

log = logging.getLogger(__name__)

_PID_MARKER = b"__orchestrate_pgid__="
_PID_LINE = re.compile(rb"__orchestrate_pgid__=(\d+)\n")
_WRAPPER = 'printf "%s%s\\n" "' + _PID_MARKER.decode() + '" "$$"; exec "$@"'
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_CHUNK = 32768


class UnknownHostKey(HostError):
    """The host offered a key that known_hosts does not list (and trust_on_first_use is off)."""


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style fingerprint: ``SHA256:<base64 without padding>``."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def build_command(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """The remote command line for ``argv``: every word quoted, run as a process-group leader.

    The result first prints ``__orchestrate_pgid__=<pid>`` then ``exec``-s the command, so the
    process-group id is known before any output of the command itself.
    """
    if not argv:
        raise ValueError("argv must not be empty")
    words = [str(a) for a in argv]
    if env:
        bad = [k for k in env if not _ENV_NAME.match(k)]
        if bad:
            raise ValueError(f"invalid environment variable names: {bad}")
        words = ["env", *(f"{k}={v}" for k, v in env.items()), *words]
    tail = " ".join(shlex.quote(w) for w in ["sh", "-c", _WRAPPER, "orchestrate", *words])
    # setsid makes the command lead a fresh process group (-w: keep its exit status); sshd already
    # gives each session its own group, so hosts without setsid still work.
    return f"if command -v setsid >/dev/null 2>&1; then exec setsid -w {tail}; else exec {tail}; fi"


def key_file_problem(path: Path) -> str:
    """Why ``path`` cannot be used as an SSH private key ('' when it can).

    A key protected by a passphrase counts as usable (ssh-agent may hold it).
    """
    try:
        if not path.is_file():
            return (f"key file {path} does not exist" if not path.exists()
                    else f"key file {path} is not a file")
        with path.open("rb") as fh:
            fh.read(1)
    except OSError as exc:
        return f"cannot read key file {path}: {exc.strerror or exc}"
    try:
        paramiko.PKey.from_path(str(path))
    except paramiko.PasswordRequiredException:
        return ""
    except Exception as exc:  # paramiko and cryptography raise several types for a bad key
        return f"key file {path} is not a private key paramiko can read ({exc})"
    return ""


def _line_number(path: Path, line: str) -> int | None:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for number, text in enumerate(lines, 1):
        if text.strip() == line:
            return number
    return None


class _RefuseUnknownKey(paramiko.MissingHostKeyPolicy):
    def __init__(self, target: ConnectTarget, known_hosts: Path):
        self.target = target
        self.known_hosts = known_hosts

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        t = self.target
        raise UnknownHostKey(
            f"host {t.name} ({t.hostname}:{t.port}) offered an unknown {key.get_name()} host key "
            f"{fingerprint(key)}; refusing to connect. After checking the fingerprint with the "
            f"machine's admin, either add it with "
            f"`ssh-keyscan -p {t.port} -t {key.get_name()} {t.hostname} >> {self.known_hosts}` "
            f"or set trust_on_first_use = true under [options] of the hosts file "
            f"(records unknown keys in {self.known_hosts} on first connection)"
        )


class _TrustOnFirstUse(paramiko.MissingHostKeyPolicy):
    def __init__(self, target: ConnectTarget, known_hosts: Path):
        self.target = target
        self.known_hosts = known_hosts

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        new = not self.known_hosts.exists()
        with self.known_hosts.open("a", encoding="ascii") as fh:
            fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        if new:
            self.known_hosts.chmod(0o600)
        log.warning(
            "trust_on_first_use: recorded %s host key %s of %s (%s) in %s",
            key.get_name(),
            fingerprint(key),
            self.target.name,
            hostname,
            self.known_hosts,
        )


class RemoteProcess:
    """A command started by :meth:`SshHost.start`; the remote twin of ``subprocess.Popen``."""

    def __init__(
        self,
        host: SshHost,
        channel: paramiko.Channel,
        argv: Sequence[str],
        combine_stderr: bool,
        marker_timeout: float,
    ):
        self.host = host
        self.argv = list(argv)
        self.pgid: int | None = None
        self.killed = False
        self._channel = channel
        self._combine = combine_stderr
        self._out: deque[bytes] = deque()
        self._head = bytearray()  # stdout before the pgid marker was seen
        self._err = bytearray()
        self._await_marker(marker_timeout)

    # -- reading ---------------------------------------------------------------------------
    def _feed_stdout(self, data: bytes) -> None:
        if self.pgid is not None or not data:
            if data:
                self._out.append(data)
            return
        self._head += data
        match = _PID_LINE.search(self._head)
        if match:
            self.pgid = int(match.group(1))
            before, after = bytes(self._head[: match.start()]), bytes(self._head[match.end() :])
            self._head.clear()
            for part in (before, after):
                if part:
                    self._out.append(part)

    def _pump(self, wait: float) -> bool:
        """Read whatever has arrived, waiting up to ``wait`` seconds for something."""
        ch = self._channel
        if not (ch.recv_ready() or ch.recv_stderr_ready()) and not self._reading_done():
            select.select([ch], [], [], wait)
        got = False
        while ch.recv_ready():
            data = ch.recv(_CHUNK)
            if not data:
                break
            self._feed_stdout(data)
            got = True
        while ch.recv_stderr_ready():
            data = ch.recv_stderr(_CHUNK)
            if not data:
                break
            self._err += data
            got = True
        return got

    def _reading_done(self) -> bool:
        ch = self._channel
        ended = bool(ch.eof_received) or ch.closed
        return ended and not ch.recv_ready() and not ch.recv_stderr_ready()

    def _await_marker(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.pgid is None and not self._reading_done():
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("%s: no process-group id from %s", self.host.name, self.argv[:1])
                return
            self._pump(min(left, 0.2))
        if self.pgid is None and self._head:  # no marker at all: treat as plain output
            self._out.append(bytes(self._head))
            self._head.clear()

    def output(self) -> Iterator[bytes]:
        """Yield stdout chunks as they arrive (stderr too if started with combine_stderr)."""
        while True:
            while self._out:
                yield self._out.popleft()
            if self._reading_done():
                if self._head:
                    yield bytes(self._head)
                    self._head.clear()
                return
            self._pump(0.2)

    @property
    def stderr(self) -> bytes:
        """Stderr received so far (empty when started with combine_stderr)."""
        return bytes(self._err)

    def read_stdout(self) -> bytes:
        """Everything on stdout not yet yielded by :meth:`output` (call after :meth:`wait`)."""
        data = b"".join(self._out) + bytes(self._head)
        self._out.clear()
        self._head.clear()
        return data

    # -- status ----------------------------------------------------------------------------
    @property
    def exit_code(self) -> int | None:
        """Exit status once the command finished; None while it runs; -1 if none was sent."""
        if not self._channel.exit_status_ready():
            return None
        return self._channel.recv_exit_status()

    def ended(self) -> bool:
        """Whether the command finished or its session is gone (neither blocks nor reads, so
        another thread may be reading :meth:`output`)."""
        ch = self._channel
        transport = ch.get_transport()
        return (ch.exit_status_ready() or ch.closed or transport is None
                or not transport.is_active())

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the command to finish (keeping its output); :class:`RemoteTimeout` if not."""
        deadline = None if timeout is None else time.monotonic() + timeout
        eof_grace: float | None = None
        while True:
            if self._channel.exit_status_ready():
                if self._reading_done():
                    break
                # Output may trail the exit status; a background child holding stdout open
                # must not hold us forever.
                eof_grace = eof_grace or time.monotonic() + 2.0
                if time.monotonic() > eof_grace:
                    break
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise RemoteTimeout(
                    f"{self.host.name}: {shlex.join(self.argv)} still running after {timeout}s"
                )
            self._pump(0.2 if deadline is None else max(0.0, min(0.2, deadline - now)))
        return self._channel.recv_exit_status()

    def kill(self, grace: float = 2.0) -> None:
        """Stop the remote command and everything it started, then close the channel.

        Sends SIGTERM to the remote process group, SIGKILL after ``grace`` seconds, and waits for
        that to be done before closing the channel.
        """
        if self.pgid is not None and not self._channel.exit_status_ready():
            self.killed = True
            steps = max(1, int(grace / 0.1))
            g = int(self.pgid)
            script = (
                f"kill -TERM -- -{g} 2>/dev/null || exit 0; i=0; "
                f"while [ $i -lt {steps} ]; do kill -0 -- -{g} 2>/dev/null || exit 0; "
                f"sleep 0.1; i=$((i+1)); done; kill -KILL -- -{g} 2>/dev/null; exit 0"
            )
            try:
                self.host._exec_raw(script, timeout=grace + 10)
            except HostError as exc:
                log.warning("%s: could not kill process group %d: %s", self.host.name, g, exc)
        elif self.pgid is None and not self._channel.exit_status_ready():
            self.killed = True
            log.warning("%s: process group unknown; only closing the channel", self.host.name)
        # Give the exit status a moment to arrive so exit_code is meaningful.
        deadline = time.monotonic() + 2.0
        while not self._channel.exit_status_ready() and time.monotonic() < deadline:
            self._pump(0.1)
        self._channel.close()

    def close(self) -> None:
        """Close the channel (does not stop a running command: use :meth:`kill`)."""
        self._channel.close()

    def __enter__(self) -> RemoteProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.exit_code is None:
            self.kill()
        else:
            self.close()


def _read_stderr(channel: paramiko.Channel) -> str:
    """What an ended command wrote to stderr."""
    try:
        return channel.makefile_stderr("rb").read().decode(errors="replace").strip()
    except (OSError, paramiko.SSHException, EOFError):
        return ""


class SshHost:
    """One lab host reached over SSH. Connects lazily; use as a context manager to close."""

    def __init__(
        self,
        target: ConnectTarget,
        *,
        known_hosts: str | Path = "~/.ssh/known_hosts",
        trust_on_first_use: bool = False,
        connect_timeout: float = 10.0,
        command_timeout: float = 300.0,
        keepalive: int = 30,
    ):
        self.target = target
        self.known_hosts = Path(known_hosts).expanduser()
        self.trust_on_first_use = trust_on_first_use
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self.keepalive = keepalive
        self._client: paramiko.SSHClient | None = None

    @classmethod
    def from_inventory(
        cls, inventory: Inventory, name: str, target: ConnectTarget | None = None
    ) -> SshHost:
        """The host ``name`` of ``inventory``, with the inventory's global options.

        ``target``: the host's already resolved connection parameters (saves reading the ssh
        config again); resolved from the inventory when not given.
        """
        opts = inventory.options
        return cls(
            target or resolve_host(inventory, name),
            known_hosts=known_hosts_path(inventory),
            trust_on_first_use=opts.trust_on_first_use,
            connect_timeout=opts.connect_timeout,
            command_timeout=opts.command_timeout,
            keepalive=opts.keepalive,
        )

    @property
    def name(self) -> str:
        """The host's inventory name."""
        return self.target.name

    @property
    def connected(self) -> bool:
        """Whether an SSH transport is open and active."""
        transport = self._client.get_transport() if self._client else None
        return bool(transport and transport.is_active())

    # -- connection ------------------------------------------------------------------------
    def connect(self) -> SshHost:
        """Open the connection (verifying the host key); :class:`HostError` with the reason."""
        if self.connected:
            return self
        t = self.target
        where = f"host {t.name} ({t.display})"
        key_files = self._usable_key_files(where)
        client = paramiko.SSHClient()
        if self.known_hosts.is_file():
            self._load_known_hosts(client, where)
        policy_cls = _TrustOnFirstUse if self.trust_on_first_use else _RefuseUnknownKey
        client.set_missing_host_key_policy(policy_cls(t, self.known_hosts))
        try:
            client.connect(
                t.hostname,
                port=t.port,
                username=t.user,
                # paramiko takes a list of key files; its stubs say one str
                key_filename=key_files or None,  # type: ignore[arg-type]
                allow_agent=t.allow_agent,
                look_for_keys=not t.key_files,
                timeout=self.connect_timeout,
                banner_timeout=self.connect_timeout,
                auth_timeout=self.connect_timeout,
            )
        except HostError:
            client.close()
            raise
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostError(
                f"{where}: host key CHANGED: got {exc.key.get_name()} {fingerprint(exc.key)}, "
                f"known_hosts has {fingerprint(exc.expected_key)}. This may be an attack or a "
                f"reinstalled machine; if you are sure, remove the old entry with "
                f"`ssh-keygen -R '{exc.hostname}' -f {self.known_hosts}`"
            ) from None
        except paramiko.AuthenticationException as exc:
            client.close()
            keys = ", ".join(t.key_files) or "default keys"
            agent = "and ssh-agent" if t.allow_agent else "without ssh-agent"
            raise HostError(
                f"{where}: authentication failed ({exc}); tried {keys} {agent}. "
                f"Check user and key_file in the hosts file"
            ) from None
        except paramiko.ssh_exception.NoValidConnectionsError:
            client.close()
            raise HostUnreachable(f"{where}: unreachable: connection refused") from None
        except TimeoutError:
            client.close()
            raise HostUnreachable(
                f"{where}: unreachable: no answer within {self.connect_timeout}s"
            ) from None
        except socket.gaierror as exc:
            client.close()
            raise HostUnreachable(f"{where}: unreachable: cannot resolve name ({exc})") from None
        except (OSError, paramiko.SSHException, EOFError) as exc:
            client.close()
            raise HostUnreachable(f"{where}: unreachable: {exc or type(exc).__name__}") from None
        transport = client.get_transport()
        if transport is not None and self.keepalive:
            transport.set_keepalive(self.keepalive)
        self._client = client
        log.debug("connected to %s", where)
        return self

    def _usable_key_files(self, where: str) -> list[str]:
        """The key files to offer. A key file written in the inventory must be a readable
        private key (else :class:`HostError` naming it); IdentityFile entries of the ssh config
        that do not exist are passed over, as OpenSSH does."""
        usable = []
        for path in self.target.key_files:
            problem = key_file_problem(Path(path))
            if not problem:
                usable.append(path)
            elif self.target.key_file_required or Path(path).exists():
                raise HostError(f"{where}: {problem}; check key_file in the hosts file")
            else:
                log.debug("%s: IdentityFile %s does not exist; passed over", self.name, path)
        return usable

    def _load_known_hosts(self, client: paramiko.SSHClient, where: str) -> None:
        path = self.known_hosts
        try:
            client.load_host_keys(str(path))
        except paramiko.hostkeys.InvalidHostKey as exc:
            line = str(exc.line).strip()
            number = _line_number(path, line)
            at = f"line {number}" if number else "a line"
            raise HostError(
                f"{where}: known_hosts {path}: {at} is corrupt ({line[:60]!r}: {exc.exc}); "
                f"fix or delete that line (`ssh-keygen -R HOST -f {path}` removes a host's "
                f"lines), then add the key again with ssh-keyscan"
            ) from None
        except (OSError, ValueError, paramiko.SSHException) as exc:
            raise HostError(f"{where}: cannot read known_hosts {path}: {exc}") from None

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> SshHost:
        return self.connect()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _open_channel(self, command: str, combine_stderr: bool = False) -> paramiko.Channel:
        self.connect()
        assert self._client is not None
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise HostUnreachable(f"host {self.name}: connection lost")
        try:
            channel = transport.open_session(timeout=self.connect_timeout)
            channel.set_combine_stderr(combine_stderr)
            channel.exec_command(command)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise HostError(f"host {self.name}: cannot start command: {exc}") from None
        return channel

    def _exec_raw(self, script: str, timeout: float) -> int:
        """Run a trusted, module-built shell snippet and return its exit status."""
        channel = self._open_channel(script)
        try:
            deadline = time.monotonic() + timeout
            while not channel.exit_status_ready():
                if time.monotonic() > deadline:
                    raise HostError(f"host {self.name}: helper command timed out")
                while channel.recv_ready():
                    channel.recv(_CHUNK)
                while channel.recv_stderr_ready():
                    channel.recv_stderr(_CHUNK)
                time.sleep(0.05)
            return channel.recv_exit_status()
        finally:
            channel.close()

    def open_stream(self, argv: Sequence[str]) -> paramiko.Channel:
        """A raw channel running ``argv`` (every word quoted), stdin/stdout as a byte stream.

        No process-group wrapper and no marker line: for protocols spoken over the channel
        itself, such as ``docker system dial-stdio``. :class:`HostError` if it cannot start.
        """
        if not argv:
            raise ValueError("argv must not be empty")
        return self._open_channel(shlex.join(str(a) for a in argv))

    def fetch_dir(self, remote_dir: str, local_dir: Path) -> int:
        """Copy the tree under ``remote_dir`` into ``local_dir`` as one ``tar`` stream.

        Needs only ``tar`` on the host (no SFTP subsystem, which labs often turn off). Members
        are extracted with tarfile's ``data`` filter: nothing lands outside ``local_dir``, no
        devices, no set-uid bits. Returns the number of files; :class:`HostError` on failure.
        """
        channel = self.open_stream(["tar", "-C", remote_dir, "-cf", "-", "."])
        channel.settimeout(self.command_timeout)
        local_dir.mkdir(parents=True, exist_ok=True)
        failed = f"host {self.name}: copying {remote_dir} back failed"
        count = 0
        try:
            with channel.makefile("rb") as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
                for member in tar:
                    tar.extract(member, local_dir, filter="data")
                    count += member.isfile()
        except (tarfile.TarError, OSError, paramiko.SSHException, EOFError) as exc:
            # tar's own complaint (no such folder) explains an empty stream best; its exit
            # status may arrive just after the end of the stream
            ended = channel.status_event.wait(2.0)
            why = (_read_stderr(channel) if ended else "") or str(exc)
            channel.close()
            raise HostError(f"{failed}: {why}") from None
        code = channel.recv_exit_status()
        err = _read_stderr(channel)
        channel.close()
        if code == 1:  # GNU tar: some file changed while read; what was read arrived
            log.warning("%s: tar of %s: %s", self.name, remote_dir, err or "exit status 1")
        elif code != 0:
            raise HostError(f"{failed}: {err or f'tar exited with {code}'}")
        return count

    def push_tar(self, data: bytes, remote_dir: str) -> None:
        """Unpack the tar archive ``data`` into the existing folder ``remote_dir`` (one
        ``tar -x`` stream; no SFTP). :class:`HostError` when tar fails."""
        channel = self.open_stream(["tar", "-x", "-C", remote_dir, "-f", "-"])
        channel.settimeout(self.command_timeout)
        try:
            channel.sendall(data)
            channel.shutdown_write()
            code = channel.recv_exit_status()
            err = _read_stderr(channel)
        except (OSError, paramiko.SSHException, EOFError) as exc:
            raise HostError(f"host {self.name}: sending files to {remote_dir} failed: "
                            f"{exc}") from None
        finally:
            channel.close()
        if code != 0:
            raise HostError(f"host {self.name}: unpacking files into {remote_dir} failed: "
                            f"{err or f'tar exited with {code}'}")

    # -- commands --------------------------------------------------------------------------
    def start(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        combine_stderr: bool = False,
        stdin: bytes | None = None,
    ) -> RemoteProcess:
        """Start ``argv`` on the host and return at once; read with ``output()``.

        ``stdin``: bytes written to the command's standard input, which is then closed (what
        must not appear on a command line, e.g. secrets the command reads and exports)."""
        command = build_command(argv, env)
        channel = self._open_channel(command, combine_stderr)
        if stdin is not None:
            try:
                channel.sendall(stdin)
                channel.shutdown_write()
            except (OSError, paramiko.SSHException, EOFError) as exc:
                channel.close()
                raise HostError(f"host {self.name}: cannot write to the command: {exc}") from None
        log.debug("%s: started %s", self.name, shlex.join(argv))
        return RemoteProcess(self, channel, argv, combine_stderr, self.connect_timeout)

    def run(
        self,
        argv: Sequence[str],
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        """Run ``argv`` to completion: ``(exit_code, stdout, stderr)``.

        ``timeout`` defaults to the inventory's ``command_timeout``; past it the command (its
        whole process group) is killed and :class:`RemoteTimeout` is raised with partial output.
        """
        limit = self.command_timeout if timeout is None else timeout
        proc = self.start(argv, env)
        try:
            code = proc.wait(limit)
        except RemoteTimeout:
            proc.kill()
            out = proc.read_stdout().decode(errors="replace")
            err = proc.stderr.decode(errors="replace")
            raise RemoteTimeout(
                f"host {self.name}: {shlex.join(argv)} did not finish within {limit}s; killed",
                out,
                err,
            ) from None
        out = proc.read_stdout().decode(errors="replace")
        err = proc.stderr.decode(errors="replace")
        proc.close()
        return CommandResult(code, out, err)
