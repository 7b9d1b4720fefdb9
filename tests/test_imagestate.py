"""The image state next to the results, and the refresh step's parts that need no engine.

The whole refresh against real sshd hosts and the real engine is tests/test_drivers.py; here: the
state file's rules (round trip, a damaged file named, concurrent updates keep every record), the
report a refresh prints, and a host that cannot be reached (a closed port on loopback).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from ssh_support import free_port

from orchestrator import cli
from orchestrator.cli.image_commands import refresh_lines
from orchestrator.config.inventory import load_hosts
from orchestrator.errors import ConfigError
from orchestrator.images import state as imagestate
from orchestrator.images.refresh import (
    HostRefresh,
    ImageRefresh,
    RefreshReport,
    refresh,
    wanted_images,
)
from orchestrator.images.state import (
    ImageRecord,
    ImageState,
    load_state,
    state_path,
    update_state,
)
from orchestrator.plan import selection
from orchestrator.plan.matrix import load_matrix


def record(host: str = "a", hardware: str = "h100", **kw: object) -> ImageRecord:
    values: dict[str, object] = dict(
        host=host, matrix="m", matrix_file="/lab/m.toml", hardware=hardware,
        template="ngc-pytorch", tag=f"orchestrate/ngc-pytorch:{host}{hardware}", how="auto",
        family="ngc", release="24.05", driver="550.54.15",
        base_image="nvcr.io/nvidia/pytorch:24.05-py3", base_image_id="sha256:1")
    values.update(kw)
    return ImageRecord(**values)  # type: ignore[arg-type]


def test_the_state_round_trips_and_replaces_a_keys_older_build(tmp_path: Path) -> None:
    path = state_path(tmp_path)
    update_state(path, lambda s: (s.put(record()), s.host_seen("a", "550.54.15", "nvidia",
                                                                 "9.0")))
    update_state(path, lambda s: s.put(record(release="24.10", tag="t2")))
    update_state(path, lambda s: s.put(record(hardware="v100")))
    state = load_state(path)
    assert [(r.hardware, r.release) for r in state.of_host("a")] == [("h100", "24.10"),
                                                                     ("v100", "24.05")]
    assert state.hosts["a"]["driver"] == "550.54.15"
    prov = record(base_digest="nvcr.io/nvidia/pytorch@sha256:9").provenance()
    assert prov["base_digest"] == "nvcr.io/nvidia/pytorch@sha256:9"
    assert set(prov) == {"image_id", "image_template", "base_image", "base_digest",
                         "base_image_id", "release", "release_family", "release_how",
                         "release_reason", "host_driver"}


def test_concurrent_updates_keep_every_record(tmp_path: Path) -> None:
    path = state_path(tmp_path)
    threads = [threading.Thread(target=update_state,
                                args=(path, lambda s, i=i: s.put(record(host=f"h{i}"))))
               for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert {r.host for r in load_state(path).images.values()} == {f"h{i}" for i in range(8)}


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"images": [{"host": 1}]}'])
def test_a_damaged_state_is_named(tmp_path: Path, text: str) -> None:
    path = state_path(tmp_path)
    path.write_text(text)
    with pytest.raises(ConfigError, match=imagestate.STATE_NAME):
        load_state(path)


def test_the_report_says_what_changed_and_why() -> None:
    old = record()
    new = record(release="25.01", driver="570.86.15", tag="orchestrate/ngc-pytorch:new")
    report = RefreshReport([
        HostRefresh("a", old_driver="550.54.15",
                    driver=selection.HostDriver("a", "570.86.15", "nvidia", "9.0"),
                    images=[ImageRefresh("m", "h100", None, "built", old, new,
                                         "driver 550.54.15 -> 570.86.15, release 24.05 -> 25.01",
                                         12.25)]),
        HostRefresh("b", reachable=False, reason="host b: connection refused"),
    ], ["x.toml: not refreshed"], Path("/r/.orchestrate-images.json"))
    assert refresh_lines(report) == [
        "a: driver 550.54.15 -> 570.86.15",
        "  m/h100: 24.05 -> 25.01: rebuilt orchestrate/ngc-pytorch:new in 12.2 s (driver "
        "550.54.15 -> 570.86.15, release 24.05 -> 25.01)",
        "b: not reached: host b: connection refused",
        "note: x.toml: not refreshed",
        "1 image(s) rebuilt, 0 up to date on 2 host(s), 1 host(s) not reached",
    ]
    assert not report.ok


MATRIX = """
[matrix]
name = "nightly"
backend = "ssh"
[workload]
hardware = "gpu"
[hardware.gpu]
device = "cuda"
image = "ngc-pytorch"
release = "auto"
"""


def test_a_host_that_cannot_be_reached_is_reported_and_left_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(f'[options]\nknown_hosts = "{tmp_path}/kh"\nssh_config = ""\n'
                     f'connect_timeout = 2\n[[hosts]]\nname = "gone"\naddress = "127.0.0.1"\n'
                     f'port = {free_port()}\ntags = ["gpu"]\n')
    matrix = tmp_path / "nightly.toml"
    matrix.write_text(MATRIX)
    results = tmp_path / "results"
    update_state(state_path(results), lambda s: s.host_seen("gone", "550.54.15", "nvidia", None))
    before = state_path(results).read_text()
    report = refresh(load_hosts(hosts), [load_matrix(matrix)], results)
    (host,) = report.hosts
    assert not host.reachable and "gone" in host.reason and not report.ok
    assert load_state(state_path(results)).hosts["gone"]["driver"] == "550.54.15"
    assert cli.main(["images", "refresh", "--hosts", str(hosts), str(matrix), "--results",
                     str(results), "--check"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("gone: not reached: ") and "1 host(s) not reached" in out
    assert state_path(results).read_text() == before  # a check writes nothing


def _closes_at_once() -> tuple[int, threading.Thread]:
    """A TCP port whose listener accepts and closes at once (no SSH banner), as a firewall or
    a port forwarded to nothing does."""
    import socket

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        with server:
            server.settimeout(30)
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return port, thread


def test_a_host_without_an_ssh_banner_is_said_in_words_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 23: paramiko logged "Error reading SSH protocol banner" with its traceback from its
    transport thread; the host's failure is one line of the report."""
    port, thread = _closes_at_once()
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(f'[options]\nknown_hosts = "{tmp_path}/kh"\nssh_config = ""\n'
                     f'connect_timeout = 5\n[[hosts]]\nname = "mute"\naddress = "127.0.0.1"\n'
                     f'port = {port}\ntags = ["gpu"]\n')
    matrix = tmp_path / "nightly.toml"
    matrix.write_text(MATRIX)
    assert cli.main(["images", "refresh", "--hosts", str(hosts), str(matrix), "--results",
                     str(tmp_path / "results"), "--check"]) == 1
    thread.join(30)
    captured = capsys.readouterr()
    assert captured.out.startswith("mute: not reached: ") and "banner" in captured.out
    assert "Traceback" not in captured.err and "paramiko" not in captured.err, captured.err


def test_a_dry_run_connects_to_nothing_and_says_what_it_would_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    tried: list[object] = []

    def refuse(sock: socket.socket, address: object) -> None:
        tried.append(address)
        raise OSError("a dry run must not connect anywhere")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(f'[options]\nknown_hosts = "{tmp_path}/kh"\nssh_config = ""\n'
                     '[[hosts]]\nname = "a"\naddress = "10.9.9.9"\nuser = "bench"\n'
                     'tags = ["gpu"]\n[[hosts]]\nname = "b"\naddress = "10.9.9.8"\n'
                     'tags = ["gpu"]\n')
    matrix = tmp_path / "nightly.toml"
    matrix.write_text(MATRIX)
    results = tmp_path / "results"
    update_state(state_path(results), lambda s: s.host_seen("a", "550.54.15", "nvidia", None))
    before = state_path(results).read_bytes()
    assert cli.main(["images", "refresh", "--hosts", str(hosts), str(matrix), "--results",
                     str(results), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert tried == []
    assert "a (bench@10.9.9.9:22, driver 550.54.15 when last probed): would probe" in out
    assert "b (10.9.9.8:22, never probed)" in out and "no build recorded" in out
    assert "nothing connected, built or written" in out.splitlines()[-1]
    assert state_path(results).read_bytes() == before


def test_refresh_keeps_docker_images_fresh_not_apptainer_profiles(tmp_path: Path) -> None:
    """As the ssh backend: a runtime = "apptainer" profile runs a .sif (here a ready one, no
    image template), which its sweep makes; refresh neither refuses the matrix nor builds a
    Docker image for it."""
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[options]\nssh_config = ""\n[[hosts]]\nname = "a"\n'
                     'address = "127.0.0.1"\ntags = ["gpu", "sifgpu"]\n')
    matrix = tmp_path / "mix.toml"
    matrix.write_text(MATRIX.replace('hardware = "gpu"\n', "") + """
[axes]
hardware = ["gpu", "sifgpu"]
[hardware.sifgpu]
device = "cuda"
runtime = "apptainer"
apptainer = { sif = "/shared/images/pytorch.sif" }
""")
    wanted, notes = wanted_images(load_hosts(hosts), [load_matrix(matrix)], ImageState())
    assert [(w.host, w.key) for w in wanted] == [("a", selection.ImageKey("gpu"))]
    assert notes == []


def test_refresh_needs_an_inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("ORCHESTRATE_HOSTS", raising=False)
    monkeypatch.setenv("ORCHESTRATE_CONFIG", str(tmp_path / "none.toml"))
    assert cli.main(["images", "refresh", "--results", str(tmp_path)]) == 2
    assert "--hosts: give the inventory" in capsys.readouterr().err


def test_a_build_made_with_set_is_refreshed_with_it(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 31: a sweep run with --set builds the images of the overridden file; its record
    keeps the overrides (a secret's masked), and a refresh without matrices reads the file with
    them again (a masked one is not replayed: said)."""
    from orchestrator.images.prepare import record_of
    from orchestrator.images.refresh import _recorded_matrices

    matrix = tmp_path / "nightly.toml"
    matrix.write_text(MATRIX)
    overridden = load_matrix(matrix, overrides=[
        "hardware.gpu.image_vars.base_repository=mirror.lab:5000/nvidia/pytorch",
        "hardware.gpu.env.HF_TOKEN=hf_abcdefgh"])
    path = state_path(tmp_path)
    built = record(matrix_file=str(matrix.resolve()), hardware="gpu",
                   overrides=tuple(o.shown for o in overridden.overrides))
    update_state(path, lambda state: state.put(built))
    text = path.read_text()
    assert '"hardware.gpu.env.HF_TOKEN=***"' in text and "hf_abcdefgh" not in text
    state = load_state(path)
    assert state.images[built.key].overrides == built.overrides
    (again,), notes = _recorded_matrices(state, ["a"])
    assert again.profiles["gpu"].image_vars == {
        "base_repository": "mirror.lab:5000/nvidia/pytorch"}
    assert "HF_TOKEN" not in again.profiles["gpu"].env
    assert notes == [f"{matrix.resolve()}: a --set of a secret is not replayed (recorded as ***)"]
    from orchestrator.images.build import BuildOutcome
    from orchestrator.plan.selection import ImageChoice

    made = record_of("a", overridden, selection.ImageKey("gpu"),
                     ImageChoice("gpu", "ngc-pytorch", {}, "24.05", "ngc", "auto"),
                     BuildOutcome("orchestrate/ngc-pytorch:x", True, 1.0))
    assert made.overrides == built.overrides  # what a sweep's build records
    # `images refresh MATRIX --set ...` reads the named files with them; --set alone is refused
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[options]\nssh_config = ""\n[[hosts]]\nname = "a"\n'
                     'address = "127.0.0.1"\ntags = ["gpu"]\n')
    assert cli.main(["images", "refresh", "--hosts", str(hosts), "--results", str(tmp_path),
                     "--set", "workload.iterations=3"]) == 2
    assert "--set: --set sets a field of the MATRIX files named" in capsys.readouterr().err
    assert cli.main(["images", "refresh", str(matrix), "--hosts", str(hosts), "--results",
                     str(tmp_path), "--dry-run", "--set", "hardware.gpu.device=gpu"]) == 2
    assert "(from --set hardware.gpu.device=gpu)" in capsys.readouterr().err
