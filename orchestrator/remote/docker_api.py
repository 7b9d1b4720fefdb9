"""The Docker API over our own verified SSH connection.

A lab host's engine is reached with the Docker SDK through ``docker system dial-stdio`` run in a
channel of *our own* paramiko connection (:class:`~orchestrator.remote.connection.SshHost`), so
host keys are
verified against the inventory's known_hosts (refused when unknown unless
``trust_on_first_use``), with the inventory's key file, user and port. docker-py's own ``ssh://``
URL is not used: it reads only ``~/.ssh/known_hosts`` and ``~/.ssh/config`` and cannot take our
known_hosts file or key. The remote host needs the ``docker`` CLI (for ``dial-stdio``) and its
engine; nothing else.

Every HTTP connection of the client is one SSH channel; :data:`POOL_SIZE` idle ones are kept per
client. Nothing here places cells or knows about backends.
"""

from __future__ import annotations

from typing import Any

import urllib3.connection
import urllib3.connectionpool

from orchestrator.remote.connection import SshHost

#: The command that turns an SSH channel into a connection to the host's engine.
DIAL_STDIO = ("docker", "system", "dial-stdio")
#: The URL prefix the Docker SDK uses for engines behind an SSH channel.
SSH_BASE_URL = "http+docker://ssh"
#: Idle engine connections (SSH channels) kept per client.
POOL_SIZE = 4
#: A placeholder the SDK parses but never connects to (the adapter carries every request).
_PLACEHOLDER_URL = "tcp://orchestrate-ssh.invalid:2375"


class _ChannelConnection(urllib3.connection.HTTPConnection):
    """An HTTP connection whose socket is an SSH channel running ``docker system dial-stdio``."""

    def __init__(self, ssh: SshHost, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._ssh = ssh
        self._channel_timeout = timeout

    def connect(self) -> None:
        channel = self._ssh.open_stream(DIAL_STDIO)
        channel.settimeout(self._channel_timeout)
        self.sock = channel  # a paramiko Channel acts as the socket


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

        def get_connection(self, url: str | bytes, proxies: Any = None) -> _ChannelPool:
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
    from docker.constants import MINIMUM_DOCKER_API_VERSION

    if version is None:
        probe = docker.APIClient(base_url=_PLACEHOLDER_URL, version=MINIMUM_DOCKER_API_VERSION)
        probe.base_url = SSH_BASE_URL
        probe.mount(SSH_BASE_URL, _adapter(ssh, timeout, 1))
        try:
            version = str(probe.version(api_version=False)["ApiVersion"])
        finally:
            probe.close()
    client = docker.DockerClient(base_url=_PLACEHOLDER_URL, version=version, timeout=int(timeout))
    # docker-py reads streamed output from the channel when base_url names an SSH engine.
    client.api.base_url = SSH_BASE_URL
    client.api.mount(SSH_BASE_URL, _adapter(ssh, timeout, maxsize))
    return client
