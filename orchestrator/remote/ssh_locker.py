"""Locks on a lab host's GPUs, taken on that host over SSH (the ssh backend's side of
:mod:`orchestrator.local.locks`).

Two controllers (two users' cron entries, a manual sweep during the nightly) that drive the same
lab host's GPUs must not overlap any more than two sweeps on one machine. So a cell of the ssh
backend takes the very locks a local sweep takes, **on the lab host**: the same files
(``<host>-gpu<N>.lock``, ``<host>-cpu.lock``, ``<host>.lock``; ``<host>`` is the inventory name),
the same modes and order (:meth:`~orchestrator.local.locks.LockRequest.files`), the same holder line
(run, cell, pid and host of the controller, since), the same wait loop, messages,
``--lock-timeout`` / ``--no-wait`` and cancel (:func:`orchestrator.local.locks.hold`). Only the
:class:`~orchestrator.local.locks.Locker` differs: :class:`SshLocker`.

How it holds them: over its own verified SSH connection
(:class:`~orchestrator.remote.connection.SshHost`), it
runs :data:`LOCK_SCRIPT` — POSIX ``sh``, coreutils and ``flock(1)`` of util-linux — with every
word quoted (:func:`lock_argv`). The script opens each file in turn (refusing symlinks), tries a
non-blocking ``flock`` and answers on one line:

* ``TAKEN`` — the lock is held (its holder line written into the file);
* ``BUSY <first line of the file>`` — someone else holds it; the script then reads a line from
  its stdin: ``again`` tries once more, anything else or the end of stdin gives up;
* ``HELD`` — every lock is held; the script then reads stdin until it ends (``cat``);
* ``ERROR <why>`` — no flock(1), the folder is a symlink, a file cannot be opened.

Each lock lives in a nested subshell that keeps its file open, so the locks are held exactly as
long as the script runs, and the script runs until its stdin ends: when the cell ends
(:meth:`SshLocker.release` closes the channel and waits for the script's exit), when the
controller dies (even by ``kill -9``: its TCP connection closes, sshd closes the session's pipes)
or when the connection drops (as soon as sshd notices: at once for a closed connection; for a
silent network only after its ``ClientAliveInterval``, or TCP's own timeout). No remote lock
outlives its controller by more than that.

Where: the inventory's ``[options] lock_dir`` when written (``lock_dir = ""`` turns remote locks
off, e.g. for a host without flock(1)), else the same path as this machine's lock folder
(:func:`orchestrator.local.locks.lock_dir`: ``$ORCHESTRATE_LOCK_DIR``, else /tmp/orchestrate-locks).
A folder the script makes is sticky and world-writable, like /tmp, so every user's sweeps meet.
"""

from __future__ import annotations

import fcntl
import logging
import time

import paramiko

from orchestrator.config.inventory import Inventory
from orchestrator.errors import HostError, LaunchError
from orchestrator.local import locks
from orchestrator.local.locks import Holder, Locker, LockRequest
from orchestrator.remote.connection import SshHost

log = logging.getLogger(__name__)

#: The program run on the lab host: ``sh -c LOCK_SCRIPT orchestrate-lock FOLDER RECORD
#: (MODE NAME)...``, MODE ``s`` (shared) or ``x`` (exclusive). Fixed text: every value comes in
#: as a positional parameter, never pasted into it.
LOCK_SCRIPT = r"""umask 0
dir=$1 record=$2
shift 2
command -v flock >/dev/null 2>&1 || { echo "ERROR flock(1) is not installed (util-linux)"; exit 3; }
[ -d "$dir" ] || { mkdir -p -- "$dir" && chmod 1777 -- "$dir"; } 2>/dev/null
if [ -L "$dir" ] || [ ! -d "$dir" ]; then
  echo "ERROR the lock folder $dir is not a folder (or is a symlink)"; exit 3
fi
take() {
  if [ $# -eq 0 ]; then echo HELD; exec cat >/dev/null; fi
  f=$dir/$2
  if [ -L "$f" ]; then echo "ERROR $f is a symbolic link"; exit 3; fi
  ( exec 3<>"$f" ) 2>/dev/null || { echo "ERROR cannot open $f for writing"; exit 3; }
  exec 3<>"$f"
  until flock -n "-$1" 3; do
    rc=$?
    [ "$rc" -eq 1 ] || { echo "ERROR flock on $f failed (exit status $rc)"; exit 3; }
    printf 'BUSY %s\n' "$(head -c 4096 -- "$f" 2>/dev/null | head -n 1)"
    read -r reply || exit 0
    [ "$reply" = again ] || exit 0
  done
  printf '%s\n' "$record" >&3
  echo TAKEN
  shift 2
  ( take "$@" )
  exit $?
}
take "$@"
"""

#: How long to wait for the script's exit after closing its stdin (a release).
RELEASE_WAIT_S = 10.0


def remote_lock_dir(inventory: Inventory) -> str | None:
    """The lock folder on the inventory's hosts (None: remote locks turned off)."""
    written = inventory.options.lock_dir
    if written is not None:
        return written or None
    return str(locks.lock_dir())


def lock_argv(folder: str, record: str, request: LockRequest) -> list[str]:
    """The words of the command that takes ``request``'s locks in ``folder`` on its host."""
    words = ["sh", "-c", LOCK_SCRIPT, "orchestrate-lock", folder, record]
    for name, mode in request.files():
        words += ["x" if mode == fcntl.LOCK_EX else "s", name]
    return words


class SshLocker(Locker):
    """A request's locks on its lab host, held by :data:`LOCK_SCRIPT` over ``ssh`` (a connection
    of its own, which this locker opens and closes)."""

    def __init__(self, request: LockRequest, holder: Holder, ssh: SshHost, folder: str):
        self.request = request
        self.ssh = ssh
        self.folder = folder
        self._buffer = b""
        self._busy = False
        self._channel: paramiko.Channel | None = None
        try:
            self._channel = ssh.open_stream(lock_argv(folder, holder.to_json(), request))
            self._channel.settimeout(ssh.command_timeout)
        except BaseException:
            ssh.close()
            raise

    def _fail(self, why: str) -> LaunchError:
        return LaunchError(f"locks on host {self.ssh.name} (in {self.folder}): {why}")

    def _line(self) -> str:
        """The script's next protocol line (other lines, e.g. a login banner, are passed over)."""
        assert self._channel is not None
        while True:
            while b"\n" not in self._buffer:
                try:
                    data = self._channel.recv(4096)
                except TimeoutError:
                    raise HostError(f"host {self.ssh.name}: the lock command did not answer "
                                    f"within {self.ssh.command_timeout:g} s") from None
                except (OSError, paramiko.SSHException, EOFError) as exc:
                    raise HostError(f"host {self.ssh.name}: connection lost while taking "
                                    f"locks: {exc}") from None
                if not data:
                    err = b""
                    while self._channel.recv_stderr_ready():
                        err += self._channel.recv_stderr(4096)
                    raise self._fail("the lock command ended unexpectedly"
                                     + (f": {err.decode(errors='replace').strip()}" if err
                                        else ""))
                self._buffer += data
            raw, _, self._buffer = self._buffer.partition(b"\n")
            line = raw.decode(errors="replace")
            word = line.split(" ", 1)[0]
            if word in ("TAKEN", "BUSY", "HELD", "ERROR"):
                return line
            log.debug("%s: lock command said %r", self.ssh.name, line)

    def _answer(self) -> tuple[str, str]:
        word, _, rest = self._line().partition(" ")
        if word == "ERROR":
            raise self._fail(rest)
        return word, rest

    def take(self, name: str, mode: int) -> str | None:
        assert self._channel is not None
        if self._busy:
            try:
                self._channel.sendall(b"again\n")
            except (OSError, paramiko.SSHException, EOFError) as exc:
                raise HostError(f"host {self.ssh.name}: connection lost while waiting for "
                                f"locks: {exc}") from None
        word, rest = self._answer()
        self._busy = word == "BUSY"
        if word == "TAKEN":
            return None
        if word == "BUSY":
            return rest
        raise self._fail(f"unexpected answer {word!r} while taking {name}")

    def taken(self) -> None:
        word, _ = self._answer()
        if word != "HELD":
            raise self._fail(f"unexpected answer {word!r} after the last lock")

    def release(self) -> None:
        """Close the script's stdin, wait (a while) until it has let go, close the connection."""
        channel, self._channel = self._channel, None
        if channel is None:
            return
        try:
            channel.shutdown_write()
            deadline = time.monotonic() + RELEASE_WAIT_S
            while not channel.status_event.wait(0.05):
                if channel.closed or not self.ssh.connected:
                    break  # the connection went, and the locks with it
                if time.monotonic() > deadline:
                    log.warning("%s: the lock command did not end within %g s; closing",
                                self.ssh.name, RELEASE_WAIT_S)
                    break
        except (OSError, paramiko.SSHException, EOFError) as exc:
            log.debug("%s: releasing locks: %s", self.ssh.name, exc)  # the session went too
        finally:
            channel.close()
            self.ssh.close()
