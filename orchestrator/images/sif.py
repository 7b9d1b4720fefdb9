"""Apptainer / SingularityCE images (``.sif``), cached by the content hash of what goes in.

A ``.sif`` is made one of two ways, both named by the content hash of
:func:`orchestrator.images.build.plan_image` (the hash over the exact build context):

* **from a Singularity definition** (``kind = "singularity"`` templates, ``images/singularity``):
  the planned build context (``Singularity.def``, ``workload/``, file variables) is written into
  a temporary folder and ``apptainer build [--fakeroot] OUT Singularity.def`` runs there;
* **from the Docker image** of a Dockerfile template: the image the docker backend would run
  (``orchestrate/<template>:<hash>``, made first by :func:`orchestrator.images.build.ensure_image`
  on
  the engine of the machine that builds) is converted with ``apptainer build OUT
  docker-daemon://TAG``. One content hash then names both the Docker image and the ``.sif``.

**Cache**: ``<image dir>/<template>-<hash>.sif``. A file of that name is up to date: unchanged
inputs never rebuild, a changed input gives another name. A build writes
``<name>.building-<pid>`` and renames it into place only after the build succeeded, so a
half-built image never passes for a cached one. The image dir is the profile's
``apptainer.image_dir``, else ``$ORCHESTRATE_SIF_DIR``, else ``~/.cache/orchestrate/sif`` of the
machine that builds. A profile's ``apptainer.sif`` names a ready image instead (built elsewhere,
kept on a shared filesystem): nothing is built, the file must exist.

**Where**: a :class:`Machine` runs the steps: :class:`LocalMachine` (the process and slurm
backends, ``orchestrate images build``) or :class:`SshMachine` (the ssh backend: each lab host
makes its own image, a definition's build context sent over our verified SSH connection as a
tar stream, a conversion from that host's engine). Which ``.sif`` the cells need, and checking
a machine before the first cell, are the Apptainer runtime's
(:mod:`orchestrator.runtimes.apptainer`: ``plan_sifs``, ``prepare``).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import io
import logging
import os
import posixpath
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator.catalog import templates
from orchestrator.errors import BuildError, ConfigError, HostError
from orchestrator.images import build

if TYPE_CHECKING:
    from orchestrator.remote.connection import SshHost

log = logging.getLogger(__name__)

#: The image dir when neither the profile nor ``$ORCHESTRATE_SIF_DIR`` names one.
DEFAULT_IMAGE_DIR = "~/.cache/orchestrate/sif"
#: Environment variable naming the image dir.
IMAGE_DIR_ENV = "ORCHESTRATE_SIF_DIR"
LOG_TAIL_LINES = 20


@dataclass(frozen=True)
class SifPlan:
    """Where a profile's ``.sif`` is and how it is made: ``source`` is ``definition``,
    ``docker-daemon`` (converted from the Docker image of ``image``) or ``given`` (the profile's
    ``apptainer.sif``: nothing to build)."""

    path: str
    source: str
    image: build.ImagePlan | None = None
    binary: str = "apptainer"
    fakeroot: bool = True

    def build_argv(self, output: str) -> list[str]:
        """The build command writing ``output`` (run in the build context's folder)."""
        assert self.image is not None, "a given .sif is not built"
        if self.source == "docker-daemon":
            return [self.binary, "build", output, f"docker-daemon://{self.image.tag}"]
        fakeroot = ["--fakeroot"] if self.fakeroot else []
        return [self.binary, "build", *fakeroot, output, templates.KINDS["singularity"]]


@dataclass(frozen=True)
class SifOutcome:
    """Result of :func:`ensure_sif`: the image, whether it was built now, how long it took,
    and the Docker image it was converted from (when it was built now)."""

    path: str
    built: bool
    seconds: float
    docker: build.BuildOutcome | None = None

    @property
    def summary(self) -> str:
        """``built in 12.3 s`` or ``up to date``."""
        return f"built in {self.seconds:.1f} s" if self.built else "up to date"


def sif_name(plan: build.ImagePlan) -> str:
    """``<template>-<hash>.sif``: the same hash as the Docker image's tag."""
    return f"{plan.template}-{plan.content_hash[:build.HASH_LENGTH]}.sif"


def image_dir(configured: str | None = None, environ: dict[str, str] | None = None) -> str:
    """The image dir as written (``~`` unexpanded: the machine that builds expands it)."""
    return configured or (os.environ if environ is None else environ).get(IMAGE_DIR_ENV) \
        or DEFAULT_IMAGE_DIR


def plan_sif(plan: build.ImagePlan, *, binary: str = "apptainer", directory: str | None = None,
             fakeroot: bool = True) -> SifPlan:
    """The ``.sif`` of an image plan in ``directory`` (default :func:`image_dir`). Pure."""
    source = "definition" if plan.kind == "singularity" else "docker-daemon"
    path = posixpath.join(image_dir(directory), sif_name(plan))
    return SifPlan(path, source, plan, binary, fakeroot)


# --- machines that build and run -------------------------------------------------------------


class Machine(Protocol):
    """Where images are built and cells run: this machine or a lab host."""

    name: str

    def expand(self, path: str) -> str:
        """``path`` with a leading ``~`` expanded on that machine."""

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists there."""

    def which(self, binary: str) -> str | None:
        """Where ``binary`` is there (a name on PATH, or an absolute path), or None."""

    def build(self, plan: SifPlan, output: str, on_log: Callable[[str], None] | None
              ) -> tuple[int, list[str]]:
        """Write the plan's context into a fresh folder, run its build there (writing
        ``output``), remove the folder; the exit status and the last log lines."""

    def commit(self, temporary: str, final: str) -> None:
        """Move a built image into place (atomically: same folder)."""

    def discard(self, path: str) -> None:
        """Remove a half-built image (no error when it is not there)."""


class LocalMachine:
    """This machine."""

    name = "localhost"

    def expand(self, path: str) -> str:
        return os.path.expanduser(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def which(self, binary: str) -> str | None:
        if binary.startswith("/"):
            return binary if os.access(binary, os.X_OK) else None
        return shutil.which(binary)

    def build(self, plan: SifPlan, output: str, on_log: Callable[[str], None] | None
              ) -> tuple[int, list[str]]:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        assert plan.image is not None
        with tempfile.TemporaryDirectory(prefix=f"orchestrate-sif-{plan.image.template}-") as tmp:
            if plan.source == "definition":
                templates.write_context(plan.image.files, tmp)
            try:
                proc = subprocess.Popen(plan.build_argv(output), cwd=tmp, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            except OSError as exc:
                return 127, [f"cannot start {plan.binary}: {exc}"]
            assert proc.stdout is not None
            tail = _follow(proc.stdout, on_log)
            return proc.wait(), tail

    def commit(self, temporary: str, final: str) -> None:
        os.replace(temporary, final)

    def discard(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class SshMachine:
    """A lab host over our verified SSH connection (``ssh`` is connected on first use)."""

    def __init__(self, ssh: SshHost):
        self.ssh = ssh
        self.name = ssh.name
        self._home: str | None = None

    def _run(self, argv: list[str], timeout: float | None = 120) -> tuple[int, str, str]:
        code, out, err = self.ssh.run(argv, timeout=timeout)
        return code, out, err

    def expand(self, path: str) -> str:
        if path != "~" and not path.startswith("~/"):
            return path
        if self._home is None:
            code, out, err = self._run(["sh", "-c", 'printf %s "$HOME"'])
            if code != 0 or not out.startswith("/"):
                raise HostError(f"host {self.name}: cannot tell its home folder: {err.strip()}")
            self._home = out
        return self._home + path[1:]

    def exists(self, path: str) -> bool:
        return self._run(["test", "-e", path])[0] == 0

    def which(self, binary: str) -> str | None:
        if binary.startswith("/"):
            return binary if self._run(["test", "-x", binary])[0] == 0 else None
        code, out, _ = self._run(["sh", "-c", 'command -v "$1"', "sh", binary])
        return out.strip() or None if code == 0 else None

    def build(self, plan: SifPlan, output: str, on_log: Callable[[str], None] | None
              ) -> tuple[int, list[str]]:
        assert plan.image is not None
        code, out, err = self._run(["mktemp", "-d", "/tmp/orchestrate-sif-XXXXXX"])
        folder = out.strip()
        if code != 0 or not folder.startswith("/tmp/orchestrate-sif-"):
            return code or 1, [f"mktemp on {self.name}: {err.strip()}"]
        try:
            self._run(["mkdir", "-p", "--", posixpath.dirname(output)])
            if plan.source == "definition":
                self.ssh.push_tar(_tar_bytes(plan.image.files), folder)
            line = shlex.join(plan.build_argv(output))
            proc = self.ssh.start(["sh", "-c", f"cd {shlex.quote(folder)} && exec {line}"],
                                  combine_stderr=True)
            tail = _follow(_lines(proc.output()), on_log)
            return proc.wait(), tail
        finally:
            self._run(["rm", "-rf", "--", folder])

    def commit(self, temporary: str, final: str) -> None:
        code, _, err = self._run(["mv", "-f", "--", temporary, final])
        if code != 0:
            raise BuildError(f"host {self.name}: cannot move {temporary} to {final}: "
                             f"{err.strip()}")

    def discard(self, path: str) -> None:
        self._run(["rm", "-f", "--", path])


def _lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The lines of a stream of chunks (the last one even without its newline)."""
    pending = b""
    for chunk in chunks:
        *lines, pending = (pending + chunk).split(b"\n")
        yield from lines
    if pending:
        yield pending


def _follow(lines: Iterable[bytes], on_log: Callable[[str], None] | None) -> list[str]:
    """Hand a build's output to ``on_log`` line by line; its last :data:`LOG_TAIL_LINES`."""
    tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
    for raw in lines:
        line = raw.decode(errors="replace").rstrip()
        tail.append(line)
        if on_log is not None:
            on_log(line)
    return list(tail)


def _tar_bytes(files: dict[str, bytes]) -> bytes:
    """A build context as an uncompressed tar archive."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for rel, data in sorted(files.items()):
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


# --- building --------------------------------------------------------------------------------


def ensure_sif(plan: SifPlan, machine: Machine, on_log: Callable[[str], None] | None = None,
               docker: Any = None) -> SifOutcome:
    """Make sure ``plan``'s image is on ``machine``, building it only when missing.

    A given ``.sif`` that is missing is a :class:`ConfigError`. A conversion first makes sure
    of the Docker image on ``docker`` (an engine client on that machine; None: this machine's),
    pinned to its base's bits, and names the ``.sif`` by that image's hash. A failing build is
    a :class:`BuildError` with the command and the last log lines.
    """
    start = time.monotonic()
    converted = None
    if plan.source == "docker-daemon":
        assert plan.image is not None
        converted = build.ensure_image(plan.image, docker, on_log)
        if converted.plan is not None:
            plan = dataclasses.replace(plan, path=posixpath.join(
                posixpath.dirname(plan.path), sif_name(converted.plan)), image=converted.plan)
    path = machine.expand(plan.path)
    if machine.exists(path):
        log.info("%s: %s is up to date", machine.name, path)
        return SifOutcome(path, False, time.monotonic() - start, converted)
    if plan.source == "given":
        raise ConfigError(f"{path} does not exist on {machine.name}", field="apptainer.sif")
    temporary = f"{path}.building-{os.getpid()}"
    machine.discard(temporary)
    code, tail = machine.build(plan, temporary, on_log)
    if code != 0:
        machine.discard(temporary)
        shown = shlex.join(plan.build_argv(temporary))
        lines = [f"building {path} on {machine.name} failed ({shown}: exit status {code})"]
        if tail:
            lines += [f"last {len(tail)} log lines:", *(f"  {t}" for t in tail)]
        raise BuildError("\n".join(lines))
    if not machine.exists(temporary):
        raise BuildError(f"building {path} on {machine.name}: {plan.binary} build reported "
                         "success but wrote no image")
    machine.commit(temporary, path)
    seconds = time.monotonic() - start
    log.info("%s: built %s in %.1f s", machine.name, path, seconds)
    return SifOutcome(path, True, seconds, converted)
