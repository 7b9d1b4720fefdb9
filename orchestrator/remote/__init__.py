"""Lab hosts over SSH: the verified connection, the Docker API through it, the GPU locks there.

* :mod:`~orchestrator.remote.connection` — a paramiko connection that verifies host keys, runs
  argv (every word quoted) and kills what it started;
* :mod:`~orchestrator.remote.docker_api` — the Docker SDK over that connection
  (``docker system dial-stdio``);
* :mod:`~orchestrator.remote.ssh_locker` — the GPU locks of :mod:`orchestrator.local.locks`,
  taken on the lab host.

May import: errors, config, catalog, local.
"""
