"""Host inventory validation, ssh_config resolution, and ``orchestrate hosts check`` end to end."""

from __future__ import annotations

import getpass
from pathlib import Path

import pytest
from ssh_support import SshdServer, write_inventory

from orchestrator.catalog.gpus import GpuInfo, HostFacts
from orchestrator.cli import main
from orchestrator.cli.host_commands import facts_from_host, render_check_table
from orchestrator.config.inventory import known_hosts_path, load_hosts, parse_hosts, resolve_host
from orchestrator.errors import ConfigError, HostError

ROOT = Path(__file__).resolve().parents[1]

MINIMAL = """
[[hosts]]
name = "a"
address = "10.0.0.1"
tags = ["v100"]
"""


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_hosts(text, "lab.toml")
    return [f"{p.field}: {p.message}" for p in info.value.problems]


def test_example_inventory_loads() -> None:
    inv = load_hosts(ROOT / "hosts" / "example.toml")
    assert inv.names == ["dgx-a", "v100-box", "gaudi-1"]
    dgx = inv.get("dgx-a")
    assert dgx.gpus == list(range(8)) and dgx.max_concurrent == 4 and "a100" in dgx.tags
    assert inv.get("v100-box").gpus is None  # discovered
    assert inv.options.trust_on_first_use is False
    assert [h.name for h in inv.tagged("gaudi2")] == ["gaudi-1"]


def test_defaults() -> None:
    inv = parse_hosts(MINIMAL)
    host = inv.hosts[0]
    assert (host.port, host.user, host.key_file, host.agent, host.max_concurrent) == (
        22,
        None,
        None,
        True,
        None,
    )
    assert inv.options.connect_timeout == 10 and inv.options.keepalive == 30


def test_every_problem_reported_at_once_with_field_paths() -> None:
    text = """
[options]
conect_timeout = 5
trust_on_first_use = "maybe"

[[hosts]]
name = "a"
address = "x"
port = 70000
tags = "v100"

[[hosts]]
name = "b"
address = "y"
gpus = [0, 1, 1]
max_concurrent = 0
colour = "red"

[[hosts]]
name = "a"
address = "z"
"""
    found = problems(text)
    expected = [
        "options.conect_timeout: unknown key",
        "options.trust_on_first_use: Input should be a valid boolean",
        "hosts[0] (a).port: Input should be less than or equal to 65535",
        "hosts[0] (a).tags: Input should be a valid list",
        "hosts[1] (b).gpus: GPU ids listed twice: [1]",
        "hosts[1] (b).max_concurrent: Input should be greater than or equal to 1",
        "hosts[1] (b).colour: unknown key",
        "hosts[2].name: duplicate host name 'a' (first used by hosts[0])",
    ]
    for want in expected:
        assert any(f.startswith(want) for f in found), (want, found)
    assert len(found) == len(expected)
    with pytest.raises(ConfigError, match=r"8 problems:\n  - lab.toml: "):
        parse_hosts(text, "lab.toml")


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("[[hosts]\nname=", "malformed TOML: "),
        ("", "hosts: Field required"),
        ("hosts = []", "hosts: List should have at least 1 item"),
        ('[[hosts]]\nname = ""\naddress = "x"', "hosts[0].name: String should have at least"),
        ('[[hosts]]\nname = "a"', "hosts[0] (a).address: Field required"),
        ('[[hosts]]\nname = "a"\naddress = "x"\nport = 0', "port: Input should be greater"),
        ('[[hosts]]\nname = "a"\naddress = "x"\ntags = [" "]', "tags must be non-empty"),
        ('[[hosts]]\nname = "a"\naddress = "x"\ngpus = [-1]', "GPU ids must be >= 0"),
        ('[[hosts]]\nname = "a"\naddress = "x"\nport = "22"', "port: Input should be a valid"),
    ],
)
def test_single_problems(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_hosts(text, "lab.toml")
    assert fragment in str(info.value)
    assert "lab.toml" in str(info.value)


def test_missing_file_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nope.toml: no such file"):
        load_hosts(tmp_path / "nope.toml")


def test_unknown_host_name_lists_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"no host named 'b' \(hosts: a\)"):
        parse_hosts(MINIMAL).get("b")


def test_ssh_config_is_honoured_and_inventory_wins(tmp_path: Path) -> None:
    (tmp_path / "ssh_config").write_text(
        "Host v100-box\n  HostName 192.0.2.7\n  Port 2222\n  User lab\n"
        "  IdentityFile ~/.ssh/lab_key\n"
        "Host *\n  User fallback\n"
    )
    inv_path = tmp_path / "hosts.toml"
    inv_path.write_text(
        f'[options]\nssh_config = "{tmp_path / "ssh_config"}"\nknown_hosts = "kh"\n'
        '[[hosts]]\nname = "v"\naddress = "v100-box"\n'
        '[[hosts]]\nname = "w"\naddress = "v100-box"\nport = 22\nuser = "me"\n'
        'key_file = "keys/id"\n'
        '[[hosts]]\nname = "x"\naddress = "10.0.0.9"\n'
    )
    inv = load_hosts(inv_path)
    v = resolve_host(inv, "v")
    assert (v.hostname, v.port, v.user) == ("192.0.2.7", 2222, "lab")
    assert v.key_files == (str(Path("~/.ssh/lab_key").expanduser()),)
    w = resolve_host(inv, "w")  # explicit values beat ssh_config; key relative to the inventory
    assert (w.hostname, w.port, w.user) == ("192.0.2.7", 22, "me")
    assert w.key_files == (str(tmp_path / "keys" / "id"),)
    x = resolve_host(inv, "x")
    assert (x.hostname, x.port, x.user, x.key_files) == ("10.0.0.9", 22, "fallback", ())
    assert known_hosts_path(inv) == tmp_path / "kh"


def test_no_ssh_config_defaults_to_local_user() -> None:
    inv = parse_hosts('[options]\nssh_config = ""\n' + MINIMAL)
    assert resolve_host(inv, "a").user == getpass.getuser()


def test_render_table_is_pure() -> None:
    inv = parse_hosts(MINIMAL + '[[hosts]]\nname = "b"\naddress = "10.0.0.2"\n')
    facts = [
        HostFacts(
            "a",
            True,
            docker_version="24.0.7",
            gpus=(GpuInfo(0, "Tesla V100", 32768), GpuInfo(1, "Tesla V100", 32768)),
            driver="470.223.02",
            cuda="11.4",
        ),
        HostFacts("b", False, reason="host b (u@10.0.0.2:22): unreachable: connection refused"),
    ]
    text = render_check_table(inv, facts)
    assert "2x Tesla V100 32 GiB" in text and "470.223.02" in text and "11.4" in text
    assert "NO: connection refused" in text and "unreachable:\n  b: host b" in text
    assert "auto release" in text


@pytest.mark.parametrize(("driver", "accelerator", "model", "shown"), [
    ("570.86.15", "nvidia", "NVIDIA H100 80GB HBM3", "NGC 25.01"),
    ("570.86.15", "nvidia", "Tesla V100-SXM2-32GB", "NGC 24.12"),  # 25.01 dropped Volta
    ("1.18.0-524", "gaudi", "HL-225", "Gaudi 1.18.0"),
    ("470.223.02", "nvidia", "Tesla V100", "none (driver too old or unknown)"),
    (None, None, "", "-"),
])
def test_hosts_check_says_which_release_auto_gives_a_host(
    driver: str | None, accelerator: str | None, model: str, shown: str
) -> None:
    inv = parse_hosts(MINIMAL)
    facts = HostFacts("a", True, driver=driver, accelerator=accelerator,
                      gpus=(GpuInfo(0, model, 1024),) if model else ())
    row = render_check_table(inv, [facts]).splitlines()[2]
    assert f" {shown} " in f"{row} "


# -- end to end against real sshd servers ------------------------------------------------------


@pytest.mark.ssh
def test_hosts_check_two_reachable_hosts(
    tmp_path: Path, sshd_pair: tuple[SshdServer, SshdServer], capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_inventory(tmp_path, list(sshd_pair))
    assert main(["hosts", "check", str(path)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for server in sshd_pair:
        row = next(line for line in lines if line.startswith(server.name))
        assert f"127.0.0.1:{server.port}" in row and " yes " in row and " none " in row
    assert "unreachable" not in out


@pytest.mark.ssh
def test_hosts_check_with_a_stopped_host_fails(
    tmp_path: Path, sshd_factory, sshd_server: SshdServer, capsys: pytest.CaptureFixture[str]
) -> None:
    down = sshd_factory("lab-down")
    down.stop()
    path = write_inventory(tmp_path, [sshd_server, down])
    assert main(["hosts", "check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "lab-down" in out and "connection refused" in out
    assert "1 of 2 hosts unreachable: lab-down" in out
    # Only the named host: the reachable one alone passes.
    assert main(["hosts", "check", str(path), "--host", sshd_server.name]) == 0


@pytest.mark.ssh
def test_hosts_check_unknown_host_key_is_reported(
    tmp_path: Path, sshd_server: SshdServer, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_inventory(tmp_path, [sshd_server], known=[])
    assert main(["hosts", "check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "unknown ssh-ed25519 host key SHA256:" in out and "ssh-keyscan" in out


def test_hosts_check_bad_inventory_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "hosts.toml"
    path.write_text('[[hosts]]\nname = "a"\nadress = "x"\n')
    assert main(["hosts", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "hosts[0] (a).adress: unknown key" in err and "hosts[0] (a).address" in err


@pytest.mark.ssh
def test_driver_from_host_without_gpu_is_clear_error(
    tmp_path: Path, sshd_server: SshdServer
) -> None:
    inv = load_hosts(write_inventory(tmp_path, [sshd_server]))
    with pytest.raises(HostError, match="reports no GPU driver"):
        facts_from_host(inv, sshd_server.name)


@pytest.mark.ssh
def test_images_build_driver_from_a_host(
    tmp_path: Path, sshd_server: SshdServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """`images build --driver-from HOST` reads the driver over SSH; this host has no GPU."""
    path = write_inventory(tmp_path, [sshd_server])
    argv = ["images", "build", "ngc-pytorch", "--dry-run", "--driver-from", sshd_server.name]
    assert main(argv) == 2
    assert "--driver-from needs --hosts" in capsys.readouterr().err
    assert main([*argv, "--hosts", str(path)]) == 1
    assert "reports no GPU driver" in capsys.readouterr().err
    assert main([*argv, "--hosts", str(path), "--driver", "535.104.05"]) == 2
    assert main(["images", "build", "ngc-pytorch", "--dry-run", "--driver", "535.104.05"]) == 0
    assert "23." in capsys.readouterr().out
