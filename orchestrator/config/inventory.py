"""Lab host inventory: a TOML file listing the machines a sweep may run on.

Example (see ``hosts/example.toml``)::

    [options]
    connect_timeout = 10
    trust_on_first_use = false

    [[hosts]]
    name = "dgx-a"
    address = "10.0.0.11"
    user = "bench"
    key_file = "~/.ssh/id_ed25519"
    tags = ["a100", "a100-80g"]
    gpus = [0, 1, 2, 3, 4, 5, 6, 7]

Every problem in the file is reported at once as a :class:`~orchestrator.errors.ConfigError`
naming the file and the field path (``hosts[1].port``), a misspelt key with the nearest valid one.
Types are strict and every number has a range (see each field's description): a timeout is finite,
so a silent host cannot hang a sweep. Connection details missing from the
inventory are taken from ``~/.ssh/config`` (``HostName``, ``Port``, ``User``, ``IdentityFile``);
values written in the inventory win, as values on the ``ssh`` command line do.
"""

from __future__ import annotations

import getpass
import logging
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko
from pydantic import Field, ValidationError, field_validator

from orchestrator.config.files import (
    StrictModel,
    parse_toml,
    problems_from_validation,
    read_config_text,
)
from orchestrator.errors import ConfigError, Problem

log = logging.getLogger(__name__)

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
DEFAULT_SSH_CONFIG = "~/.ssh/config"


#: No NUL, no line break: a string that becomes a path or a word of a command.
_NO_CONTROL = r"^[^\x00-\x1f\x7f]*$"
#: Most GPUs (and cells at once) of one host: more than any machine has.
MAX_HOST_GPUS = 256


class HostOptions(StrictModel):
    """Options shared by every host of an inventory (the ``[options]`` table)."""

    connect_timeout: float = Field(
        10.0, gt=0, le=600, allow_inf_nan=False,
        description="seconds to open TCP + SSH handshake, 0 < t <= 600 (a host that needs "
        "longer is as good as down; inf would hang on a silent host)",
    )
    command_timeout: float = Field(
        300.0, gt=0, le=86400, allow_inf_nan=False,
        description="default seconds a short remote command (a probe) may take, 0 < t <= 86400",
    )
    keepalive: int = Field(
        30, ge=0, le=3600, description="seconds between SSH keepalives, 0..3600; 0 disables"
    )
    trust_on_first_use: bool = Field(
        False, description="accept and record unknown host keys instead of refusing them"
    )
    known_hosts: str = Field(
        DEFAULT_KNOWN_HOSTS, min_length=1, max_length=4096, pattern=_NO_CONTROL,
        description="known_hosts file to verify against",
    )
    ssh_config: str | None = Field(
        DEFAULT_SSH_CONFIG, description="OpenSSH client config to honour; empty string disables"
    )
    lock_dir: str | None = Field(
        None, max_length=4096, pattern=r"^(/[^\x00-\x1f\x7f]*)?$",
        description="absolute path of the folder, on every host, where cells lock the GPUs they "
        "use (else the controller's: $ORCHESTRATE_LOCK_DIR, else /tmp/orchestrate-locks); "
        "empty string: no locks on the hosts",
    )


class HostEntry(StrictModel):
    """One lab machine (a ``[[hosts]]`` table)."""

    name: str = Field(
        min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",  # as _NAME
        description="short unique name used in tables and results (letters, digits, _ . -)",
    )
    address: str = Field(
        min_length=1, max_length=255, pattern=r"^[A-Za-z0-9_.:%\[\]-]+$",
        description="DNS name, IP, or a Host alias of ssh_config",
    )
    port: int = Field(22, ge=1, le=65535)
    user: str | None = Field(
        None, min_length=1, max_length=256, pattern=r"^[^\s\x00-\x1f\x7f]+$",
        description="login user; else ssh_config User, else you",
    )
    key_file: str | None = Field(
        None, min_length=1, max_length=4096, pattern=_NO_CONTROL,
        description="private key; relative to the inventory file",
    )
    agent: bool = Field(True, description="also offer keys held by ssh-agent")
    tags: list[str] = Field(
        default_factory=list, max_length=64, description="hardware tags profiles match"
    )
    gpus: list[int] | None = Field(
        None, max_length=MAX_HOST_GPUS,
        description=f"GPU ids to use, each 0..{MAX_HOST_GPUS - 1}; else discovered",
    )
    max_concurrent: int | None = Field(
        None, ge=1, le=MAX_HOST_GPUS,
        description=f"most cells at once on this host, 1..{MAX_HOST_GPUS}",
    )
    gpu: str | None = Field(
        None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9 _.-]*$",
        description="the model of its accelerators (e.g. V100, Gaudi2), declared: plan and "
        "validate check the cells against it without contacting the host (the sweep asks the "
        "host itself)",
    )
    driver: str | None = Field(
        None, pattern=r"^\d+(\.\d+){1,3}(-\d+)?$",
        description="its accelerator driver (e.g. 535.104.05), declared: plan shows the image an "
        "auto release picks there and whether a pinned release runs on it, without contacting "
        "the host (the sweep reads the host's own)",
    )

    @field_validator("tags")
    @classmethod
    def _tags_not_blank(cls, tags: list[str]) -> list[str]:
        for tag in tags:
            if not tag.strip():
                raise ValueError("tags must be non-empty strings")
            if len(tag) > 64 or any(ord(c) < 32 or ord(c) == 127 for c in tag):
                raise ValueError(f"tag {tag!r}: at most 64 characters, no control characters")
        return tags

    @field_validator("gpus")
    @classmethod
    def _gpus_unique(cls, gpus: list[int] | None) -> list[int] | None:
        if gpus is None:
            return None
        if any(g < 0 for g in gpus):
            raise ValueError("GPU ids must be >= 0")
        if any(g >= MAX_HOST_GPUS for g in gpus):
            raise ValueError(f"GPU ids must be at most {MAX_HOST_GPUS - 1}")
        dupes = sorted(g for g, n in Counter(gpus).items() if n > 1)
        if dupes:
            raise ValueError(f"GPU ids listed twice: {dupes}")
        return gpus

    def explicitly_set(self, field: str) -> bool:
        """Whether ``field`` was written in the inventory (as opposed to defaulted)."""
        return field in self.model_fields_set


class _InventoryFile(StrictModel):
    options: HostOptions = Field(default_factory=HostOptions)
    hosts: list[HostEntry] = Field(min_length=1)


@dataclass(frozen=True)
class Inventory:
    """A validated inventory: global options plus hosts in file order."""

    source: Path
    options: HostOptions
    hosts: tuple[HostEntry, ...]

    @property
    def names(self) -> list[str]:
        """Host names in file order."""
        return [h.name for h in self.hosts]

    def get(self, name: str) -> HostEntry:
        """The host called ``name``; :class:`ConfigError` listing known names if absent."""
        for host in self.hosts:
            if host.name == name:
                return host
        raise ConfigError(
            f"no host named {name!r} (hosts: {', '.join(self.names)})", file=str(self.source)
        )

    def tagged(self, tag: str) -> list[HostEntry]:
        """Hosts carrying hardware tag ``tag``."""
        return [h for h in self.hosts if tag in h.tags]


@dataclass(frozen=True)
class ConnectTarget:
    """Where and how to connect to one host, after ``~/.ssh/config`` has been applied."""

    name: str
    hostname: str
    port: int
    user: str
    key_files: tuple[str, ...]
    allow_agent: bool
    #: True when the key was written in the inventory (it must exist); IdentityFile entries of
    #: the ssh config that do not exist are passed over, as OpenSSH does.
    key_file_required: bool = False

    @property
    def display(self) -> str:
        """``user@host:port`` for messages."""
        return f"{self.user}@{self.hostname}:{self.port}"


_HOST_INDEX = re.compile(r"^hosts\[(\d+)\]")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def _with_host_name(problem: Problem, raw: dict[str, Any]) -> Problem:
    """``hosts[1].port`` -> ``hosts[1] (lab-b).port``: which host, by its name."""
    match = _HOST_INDEX.match(problem.field)
    hosts = raw.get("hosts")
    if not match or not isinstance(hosts, list) or int(match.group(1)) >= len(hosts):
        return problem
    entry = hosts[int(match.group(1))]
    name = entry.get("name") if isinstance(entry, dict) else None
    if not isinstance(name, str) or not _NAME.fullmatch(name):  # a name fit to show
        return problem
    field = f"{match.group(0)} ({name}){problem.field[match.end():]}"
    return Problem(problem.file, field, problem.message)


def _duplicate_names(raw: dict[str, Any], file: str) -> list[Problem]:
    hosts = raw.get("hosts")
    if not isinstance(hosts, list):
        return []
    seen: dict[str, int] = {}
    problems = []
    for i, host in enumerate(hosts):
        name = host.get("name") if isinstance(host, dict) else None
        if not isinstance(name, str):
            continue
        if name in seen:
            problems.append(
                Problem(
                    file,
                    f"hosts[{i}].name",
                    f"duplicate host name {name!r} "
                    f"(first used by hosts[{seen[name]}]); names must be unique",
                )
            )
        else:
            seen[name] = i
    return problems


def parse_hosts(text: str, source: str | Path = "<hosts>") -> Inventory:
    """Validate inventory TOML ``text``; ``source`` names the file in error messages."""
    return _validate(parse_toml(text, str(source)), source)


def load_hosts(path: str | Path) -> Inventory:
    """Read and validate the inventory at ``path``; every problem at once as ConfigError."""
    inventory = parse_hosts(read_config_text(Path(path)), path)
    log.debug("loaded %d hosts from %s", len(inventory.hosts), path)
    return inventory


#: Top-level tables of a matrix file: a hosts file made of them is a mix-up, not a typo.
_MATRIX_TABLES = frozenset({"matrix", "workload", "axes", "zip", "include", "exclude",
                            "hardware", "commands", "figures"})


def _validate(raw: dict[str, Any], source: str | Path) -> Inventory:
    file = str(source)
    if "hosts" not in raw and raw and set(raw) <= _MATRIX_TABLES:
        raise ConfigError("this is a matrix file, not a hosts inventory (see "
                          "hosts/example.toml; `orchestrate validate FILE` reads a matrix)",
                          file=file)
    problems = _duplicate_names(raw, file)
    try:
        parsed = _InventoryFile.model_validate(raw)
    except ValidationError as exc:
        problems += [
            _with_host_name(p, raw)
            for p in problems_from_validation(
                file, exc, keys_hint="see hosts/example.toml", model=_InventoryFile
            )
        ]
        raise ConfigError(problems) from None
    if problems:
        raise ConfigError(problems)
    return Inventory(source=Path(source), options=parsed.options, hosts=tuple(parsed.hosts))


def _load_ssh_config(path: str | None) -> paramiko.SSHConfig | None:
    if not path:
        return None
    p = Path(path).expanduser()
    if not p.is_file():
        return None
    try:
        return paramiko.SSHConfig.from_path(str(p))
    except Exception as exc:  # paramiko raises several types for odd configs
        raise ConfigError(f"cannot parse ssh config: {exc}", file=str(p)) from None


def _resolve_path(value: str, base: Path) -> str:
    p = Path(value).expanduser()
    if not p.is_absolute():
        p = base / p
    return str(p)


def resolve_host(inventory: Inventory, name: str) -> ConnectTarget:
    """Connection parameters for host ``name``: inventory values, then ssh_config, then defaults.

    Pure apart from reading the ssh config file named in the inventory options.
    """
    return _resolve(inventory, inventory.get(name), _load_ssh_config(inventory.options.ssh_config))


def resolve_hosts(inventory: Inventory) -> dict[str, ConnectTarget]:
    """:func:`resolve_host` for every host, reading the ssh config file once."""
    cfg = _load_ssh_config(inventory.options.ssh_config)
    return {entry.name: _resolve(inventory, entry, cfg) for entry in inventory.hosts}


def _resolve(
    inventory: Inventory, entry: HostEntry, cfg: paramiko.SSHConfig | None
) -> ConnectTarget:
    looked: dict[str, Any] = dict(cfg.lookup(entry.address)) if cfg else {}
    hostname = str(looked.get("hostname", entry.address))
    if entry.explicitly_set("port") or "port" not in looked:
        port = entry.port
    else:
        try:
            port = int(looked["port"])
        except ValueError:
            raise ConfigError(
                f"ssh config Port {looked['port']!r} for {entry.address!r} is not a number",
                file=str(inventory.options.ssh_config),
            ) from None
    user = entry.user or looked.get("user") or getpass.getuser()
    base = inventory.source.parent
    if entry.key_file:
        keys: tuple[str, ...] = (_resolve_path(entry.key_file, base),)
    else:
        keys = tuple(str(Path(k).expanduser()) for k in looked.get("identityfile", []))
    return ConnectTarget(
        name=entry.name,
        hostname=hostname,
        port=port,
        user=str(user),
        key_files=keys,
        allow_agent=entry.agent,
        key_file_required=bool(entry.key_file),
    )


def known_hosts_path(inventory: Inventory) -> Path:
    """The known_hosts file of ``inventory`` (``~`` expanded, relative to the inventory file)."""
    return Path(_resolve_path(inventory.options.known_hosts, inventory.source.parent))
