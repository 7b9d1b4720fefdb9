"""GPU discovery: parsers over captured tool output, and ``discover`` over a fake runner.

No GPU or Gaudi accelerator exists on the machines that run these tests, so the files in
tests/data (``nvidia-smi*``, ``hl-smi*``) are SAMPLES in the formats of ``nvidia-smi`` (R470 and
R550 drivers) and ``hl-smi`` (SynapseAI 1.15): the ``--query-gpu`` / ``-Q`` CSV forms and the
banner of the plain table. ``FakeHost`` stands in for a lab host with that hardware; the real SSH
path is covered by tests/test_hosts.py against real sshd servers (which have no GPUs).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.catalog.gpus import (
    DOCKER_VERSION,
    HL_QUERY,
    NVIDIA_QUERY,
    NVIDIA_SUMMARY,
    GpuInfo,
    discover,
    parse_gpu_csv,
    parse_smi_header,
)
from orchestrator.remote.connection import CommandResult, RemoteTimeout

DATA = Path(__file__).parent / "data"


def sample(name: str) -> str:
    return (DATA / name).read_text()


def test_nvidia_query_8xh100() -> None:
    gpus, driver = parse_gpu_csv(sample("nvidia-smi-query-8xh100.csv"))
    assert [g.index for g in gpus] == list(range(8))
    assert gpus[0] == GpuInfo(0, "NVIDIA H100 80GB HBM3", 81559)
    assert driver == "550.54.15"


def test_nvidia_query_unsorted_and_na_memory() -> None:
    gpus, driver = parse_gpu_csv(sample("nvidia-smi-query-mixed.csv"))
    assert [g.index for g in gpus] == [0, 1, 2]
    assert gpus[2].model == "NVIDIA A100-PCIE-40GB" and gpus[2].memory_mib is None
    assert driver == "470.223.02"


@pytest.mark.parametrize(
    "name, expected",
    [
        ("nvidia-smi-8xh100.txt", ("550.54.15", "12.4")),
        ("nvidia-smi-old-v100.txt", ("470.223.02", "11.4")),
        ("hl-smi-gaudi2.txt", ("1.15.1-62f612b", None)),
    ],
)
def test_banner(name: str, expected: tuple[str | None, str | None]) -> None:
    assert parse_smi_header(sample(name)) == expected


def test_hl_smi_query_with_units() -> None:
    gpus, driver = parse_gpu_csv(sample("hl-smi-query-8xgaudi2.csv"))
    assert len(gpus) == 8 and gpus[7] == GpuInfo(7, "HL-225", 98304)
    assert driver == "1.15.1-62f612b"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n",
        "No devices were found\n",
        "NVIDIA-SMI has failed because it couldn't communicate",
    ],
)
def test_garbage_gives_no_gpus(text: str) -> None:
    assert parse_gpu_csv(text) == ([], None)


def test_memory_units() -> None:
    gpus, _ = parse_gpu_csv("0, X, 80 GiB, d\n1, Y, 1024 MiB, d\n2, Z, weird, d\n")
    assert [g.memory_mib for g in gpus] == [81920, 1024, None]


class FakeHost:
    """A lab host answering from a table of argv -> result (exit 127 for anything else)."""

    def __init__(self, name: str, answers: dict[tuple[str, ...], CommandResult | Exception]):
        self.name = name
        self.answers = answers
        self.calls: list[list[str]] = []

    def run(self, argv: list[str], timeout: float | None = None) -> CommandResult:
        self.calls.append(list(argv))
        answer = self.answers.get(tuple(argv), CommandResult(127, "", f"{argv[0]}: not found"))
        if isinstance(answer, Exception):
            raise answer
        return answer


def ok(text: str) -> CommandResult:
    return CommandResult(0, text, "")


def test_discover_nvidia_host() -> None:
    host = FakeHost(
        "dgx",
        {
            tuple(DOCKER_VERSION): ok("24.0.7\n"),
            tuple(NVIDIA_QUERY): ok(sample("nvidia-smi-query-8xh100.csv")),
            tuple(NVIDIA_SUMMARY): ok(sample("nvidia-smi-8xh100.txt")),
        },
    )
    facts = discover(host)
    assert facts.reachable and facts.accelerator == "nvidia"
    assert facts.docker_version == "24.0.7"
    assert facts.gpu_ids == list(range(8))
    assert (facts.driver, facts.cuda) == ("550.54.15", "12.4")
    assert list(HL_QUERY) not in host.calls  # no need to look for Gaudi


def test_discover_gaudi_host_without_docker_daemon() -> None:
    host = FakeHost(
        "gaudi",
        {
            tuple(DOCKER_VERSION): CommandResult(1, "", "Cannot connect to the Docker daemon\n"),
            tuple(HL_QUERY): ok(sample("hl-smi-query-8xgaudi2.csv")),
        },
    )
    facts = discover(host)
    assert facts.reachable and facts.accelerator == "gaudi" and len(facts.gpus) == 8
    assert facts.docker_version is None and facts.cuda is None
    assert facts.driver == "1.15.1-62f612b"
    assert any("Cannot connect" in n for n in facts.notes)


def test_a_hung_nvidia_smi_is_not_a_crash() -> None:
    # A stand-in for a hung nvidia-smi (no GPU tools here). A plain reachable host and an
    # unreachable one run against real sshd servers in test_hosts.py.
    host = FakeHost("cpu", {tuple(NVIDIA_QUERY): RemoteTimeout("slow")})
    facts = discover(host)
    assert facts.reachable and facts.gpus == () and facts.docker_version is None
    assert facts.driver is None and facts.accelerator is None
    assert "nvidia-smi: timed out after 30.0s" in facts.notes
