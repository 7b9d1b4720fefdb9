"""GPU and host discovery: what a lab host has (Docker, NVIDIA GPUs or Gaudi, driver, CUDA).

The parsers are pure functions over the text ``nvidia-smi`` and ``hl-smi`` print; :func:`discover`
runs those tools over SSH (anything with ``run(argv, timeout)`` and ``name`` will do, so tests can
pass a fake). A tool that is missing or fails yields ``None`` / no GPUs, never an exception; an
unreachable host yields ``HostFacts(reachable=False, reason=...)``.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from orchestrator.errors import HostError, RemoteTimeout

log = logging.getLogger(__name__)

NVIDIA_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,name,memory.total,driver_version",
    "--format=csv,noheader,nounits",
]
NVIDIA_SUMMARY = ["nvidia-smi"]
HL_QUERY = ["hl-smi", "-Q", "index,name,memory.total,driver_version", "-f", "csv,noheader"]
DOCKER_VERSION = ["docker", "version", "--format", "{{.Server.Version}}"]

_NA = {"", "[n/a]", "n/a", "[not supported]", "[unknown error]"}
_DRIVER = re.compile(r"Driver Version:\s*([0-9A-Za-z][0-9A-Za-z.\-]*)")
_CUDA = re.compile(r"CUDA Version:\s*([0-9]+(?:\.[0-9]+)*)")
_MEMORY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(MiB|MB|GiB|GB)?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class GpuInfo:
    """One accelerator as the vendor tool reports it."""

    index: int
    model: str
    memory_mib: int | None


@dataclass(frozen=True)
class HostFacts:
    """What :func:`discover` learned about one host."""

    name: str
    reachable: bool
    reason: str = ""
    docker_version: str | None = None
    gpus: tuple[GpuInfo, ...] = ()
    driver: str | None = None
    cuda: str | None = None
    accelerator: str | None = None  # "nvidia", "gaudi" or None
    notes: tuple[str, ...] = field(default=())

    @property
    def gpu_ids(self) -> list[int]:
        """Indices of the discovered GPUs."""
        return [g.index for g in self.gpus]


class CommandResult(NamedTuple):
    """Outcome of a command on a host; unpacks as ``(exit_code, stdout, stderr)``."""

    exit_code: int
    stdout: str
    stderr: str


class CommandRunner(Protocol):
    """What :func:`discover` needs from a host (:class:`orchestrator.remote.connection.SshHost`
    fits)."""

    @property
    def name(self) -> str:
        """The host's name, for messages."""
        ...

    def run(self, argv: list[str], timeout: float | None = None) -> CommandResult: ...


def _parse_memory(value: str) -> int | None:
    if value.strip().lower() in _NA:
        return None
    match = _MEMORY.match(value)
    if not match:
        return None
    number, unit = float(match.group(1)), (match.group(2) or "MiB").lower()
    if unit in ("gib", "gb"):
        number *= 1024
    return int(round(number))


def _csv_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.split(",")] for line in text.splitlines() if line.strip()]


def parse_gpu_csv(text: str) -> tuple[list[GpuInfo], str | None]:
    """Parse ``index, name, memory.total, driver_version`` CSV rows (no header).

    Works for ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits`` and
    ``hl-smi -Q ... -f csv,noheader`` alike: memory may carry a unit (``98304 MiB``).
    Returns the GPUs in index order and the driver version (None if no row had one).
    Rows that do not parse are skipped with a debug log line.
    """
    gpus: list[GpuInfo] = []
    driver: str | None = None
    for row in _csv_rows(text):
        if len(row) < 3 or not row[0].isdigit():
            log.debug("skipping GPU row %r", row)
            continue
        gpus.append(GpuInfo(index=int(row[0]), model=row[1], memory_mib=_parse_memory(row[2])))
        if len(row) >= 4 and row[3].lower() not in _NA:
            driver = driver or row[3]
    gpus.sort(key=lambda g: g.index)
    return gpus, driver


def parse_smi_header(text: str) -> tuple[str | None, str | None]:
    """``(driver, cuda)`` from the banner of plain ``nvidia-smi`` (or ``hl-smi``: cuda None)."""
    driver = _DRIVER.search(text)
    cuda = _CUDA.search(text)
    return (driver.group(1) if driver else None, cuda.group(1) if cuda else None)


def _try(host: CommandRunner, argv: list[str], timeout: float, notes: list[str]) -> str | None:
    """stdout of ``argv`` if it ran and exited 0, else None (with a note saying why)."""
    try:
        code, out, err = host.run(argv, timeout=timeout)
    except RemoteTimeout:
        notes.append(f"{argv[0]}: timed out after {timeout}s")
        return None
    if code == 127:
        return None  # not installed: normal on hosts without that hardware
    if code != 0:
        first = (err.strip() or out.strip()).splitlines()
        notes.append(f"{argv[0]}: exit {code}" + (f": {first[0][:120]}" if first else ""))
        return None
    return out


def probe(host: CommandRunner, timeout: float = 30.0) -> HostFacts:
    """Run the discovery commands on an already reachable ``host`` (HostError propagates)."""
    notes: list[str] = []
    docker = _try(host, DOCKER_VERSION, timeout, notes)
    docker_version = (docker.strip() or None) if docker is not None else None
    query = _try(host, NVIDIA_QUERY, timeout, notes)
    gpus, driver = parse_gpu_csv(query) if query is not None else ([], None)
    if gpus:
        banner = _try(host, NVIDIA_SUMMARY, timeout, notes) or ""
        banner_driver, cuda = parse_smi_header(banner)
        return HostFacts(
            name=host.name,
            reachable=True,
            gpus=tuple(gpus),
            driver=driver or banner_driver,
            cuda=cuda,
            accelerator="nvidia",
            notes=tuple(notes),
            docker_version=docker_version,
        )
    hl = _try(host, HL_QUERY, timeout, notes)
    devices, hl_driver = parse_gpu_csv(hl) if hl is not None else ([], None)
    if devices:
        return HostFacts(
            name=host.name,
            reachable=True,
            gpus=tuple(devices),
            driver=hl_driver,
            accelerator="gaudi",
            notes=tuple(notes),
            docker_version=docker_version,
        )
    return HostFacts(
        name=host.name, reachable=True, docker_version=docker_version, notes=tuple(notes)
    )


def discover(host: CommandRunner, timeout: float = 30.0) -> HostFacts:
    """Connect (if the host has ``connect()``) and probe; unreachable -> ``reachable=False``."""
    try:
        connect = getattr(host, "connect", None)
        if connect is not None:
            connect()
        return probe(host, timeout)
    except HostError as exc:
        log.info("host %s unreachable: %s", host.name, exc)
        return HostFacts(name=host.name, reachable=False, reason=str(exc))


class LocalHost:
    """This machine as a :class:`CommandRunner` (for discovering the local GPUs)."""

    name = "localhost"

    def run(self, argv: list[str], timeout: float | None = None) -> CommandResult:
        import subprocess

        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except FileNotFoundError:
            return CommandResult(127, "", f"{argv[0]}: not found")
        except subprocess.TimeoutExpired as exc:
            raise RemoteTimeout(f"{argv[0]} timed out after {timeout}s") from exc
        return CommandResult(proc.returncode, proc.stdout, proc.stderr)


@functools.cache
def local_facts() -> HostFacts:
    """This machine's accelerators, probed once per process."""
    return probe(LocalHost(), timeout=20.0)


def local_accelerator_ids(device: str) -> list[int] | None:
    """Ids of this machine's GPUs (``cuda``) or Gaudi cards (``hpu``), from nvidia-smi or
    hl-smi; None when no such tool answers (unknown: nothing is assumed)."""
    facts = local_facts()
    wanted = {"cuda": "nvidia", "hpu": "gaudi"}.get(device)
    if facts.accelerator != wanted:
        return None
    return facts.gpu_ids


# --- accelerator facts -------------------------------------------------------------------------
# What a hardware profile's ``gpu = "V100"`` tells ``validate`` (orchestrator/backends/checks.py).

#: CUDA compute capability of the GPUs labs benchmark (NVIDIA's "CUDA GPUs" list), keyed by the
#: model as nvidia-smi names it without the vendor words ("Tesla V100-SXM2-32GB" is a V100).
COMPUTE_CAPABILITY: dict[str, str] = {
    "P100": "6.0", "P40": "6.1", "P4": "6.1", "TITAN V": "7.0", "V100": "7.0", "T4": "7.5",
    "A100": "8.0", "A30": "8.0", "A10": "8.6", "A10G": "8.6", "A16": "8.6", "A2": "8.6",
    "A40": "8.6", "L4": "8.9", "L40": "8.9", "L40S": "8.9", "H100": "9.0", "H200": "9.0",
    "GH200": "9.0", "B200": "10.0", "GB200": "10.0",
}
#: Intel Gaudi (Habana) cards: model -> generation (every generation computes in bf16).
GAUDI_MODELS: dict[str, str] = {
    "HL-205": "Gaudi", "HL-225": "Gaudi2", "HL-325": "Gaudi3",
    "GAUDI": "Gaudi", "GAUDI2": "Gaudi2", "GAUDI3": "Gaudi3",
}
_VENDOR_WORDS = re.compile(r"^(?:NVIDIA\s+|TESLA\s+|INTEL\s+|HABANA\s+)+")


def _model_key(name: str, table: dict[str, str]) -> str | None:
    """The table key ``name`` names: the longest key it starts with, not followed by a digit
    (``A100-SXM4-80GB`` is an A100, not an A10; ``V100S`` is a V100)."""
    text = _VENDOR_WORDS.sub("", " ".join(name.upper().split()))
    found = [k for k in table if text.startswith(k)
             and (len(text) == len(k) or not text[len(k)].isdigit())]
    return max(found, key=len) if found else None


def compute_capability(gpu: str) -> str | None:
    """The CUDA compute capability of GPU model ``gpu`` ("V100" -> "7.0"), None if unknown."""
    key = _model_key(gpu, COMPUTE_CAPABILITY)
    return COMPUTE_CAPABILITY[key] if key else None


def gaudi_generation(name: str) -> str | None:
    """The Gaudi generation of card ``name`` ("HL-205" -> "Gaudi"), None if not a Gaudi."""
    key = _model_key(name, GAUDI_MODELS)
    return GAUDI_MODELS[key] if key else None


def known_accelerators() -> list[str]:
    """Every model name the tables know (for did-you-mean suggestions)."""
    return sorted({*COMPUTE_CAPABILITY, *GAUDI_MODELS})
