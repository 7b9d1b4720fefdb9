"""NGC PyTorch releases: the packaged table and which release a driver can run."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.catalog import releases
from orchestrator.catalog.releases import Release, driver_key, load_releases, resolve_release
from orchestrator.errors import ConfigError


@pytest.mark.parametrize(
    ("driver", "release"),
    [
        ("535.104.05", "23.10"),
        ("535.129.03", "23.10"),
        ("535.86.10", "23.09"),
        ("545.23.08", "24.02"),
        ("550.54.15", "24.05"),
        ("555.42.06", "24.07"),
        ("560.35.03", "24.10"),
        ("560.35.05", "24.12"),
        ("570.86.15", "25.01"),
        ("570.124.06", "25.03"),
        ("575.57.08", "25.03"),  # 25.04-25.09 are not in the table (their torch is not known)
        ("580.95.05", "25.10"),
        ("590.48.01", "25.12"),
        ("550", "24.02"),  # 550.0.0 is below 550.54.14
    ],
)
def test_resolve_release_picks_newest_supported(driver: str, release: str) -> None:
    assert resolve_release(driver).name == release


@pytest.mark.parametrize(("driver", "gpu", "release"), [
    ("570.86.15", "7.0", "24.12"),   # V100: 25.01 dropped Volta
    ("590.48.01", "7.0", "24.12"),
    ("590.48.01", "7.5", "25.12"),   # T4 (Turing) stays
    ("590.48.01", "9.0", "25.12"),
    ("590.48.01", None, "25.12"),    # unknown GPU: not filtered
])
def test_a_release_that_dropped_the_gpu_is_never_picked(driver: str, gpu: str | None,
                                                        release: str) -> None:
    assert resolve_release(driver, compute_capability=gpu).name == release


def test_a_gpu_too_old_for_every_release_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match="compute capability 5.2"):
        resolve_release("590.48.01", compute_capability="5.2")


def test_habana_driver_picks_its_own_software_release() -> None:
    version, series = releases.resolve_habana("1.15.1-62f612b")  # hl-smi's driver_version
    assert (version, series.name, series.torch) == ("1.15.1", "1.15", "2.2.0")
    assert releases.resolve_habana("1.18.0")[1].torch == "2.4.0"
    with pytest.raises(ConfigError, match=r"1\.20\.1.*not in .*habana_releases.*synapse_version"):
        releases.resolve_habana("1.20.1-97")
    with pytest.raises(ConfigError, match="NVIDIA driver version"):
        releases.resolve_habana("550.54.15")
    with pytest.raises(ConfigError, match="not an Intel Gaudi driver version"):
        releases.resolve_habana("latest")


def test_release_data_is_consistent() -> None:
    releases = load_releases()
    names = [r.name for r in releases]
    assert names[0] == "20.03" and names[-1] == "25.12" and "23.05" in names
    by_name = {r.name: r for r in releases}
    # the seeds' own stacks, for programs that bring their own code (never offered to ours)
    assert [n for n in names if n < "22.12"] == ["20.03", "21.03", "22.06"]
    assert by_name["20.03"].torch == "1.5.0a0+8f84ded" and by_name["20.03"].ubuntu == "18.04"
    assert by_name["21.03"].cuda == "11.2.1" and by_name["21.03"].ubuntu == "20.04"
    assert all(not by_name[n].offered for n in ("20.03", "21.03", "22.06"))
    assert by_name["23.10"].ubuntu == "22.04"
    assert by_name["22.12"].cuda == "11.8.0" and by_name["22.12"].min_driver.startswith("520")
    assert by_name["23.10"].cuda.startswith("12.2") and by_name["23.10"].min_driver.startswith(
        "535"
    )
    # A newer release never needs an older driver.
    keys = [driver_key(r.min_driver) for r in releases]
    assert keys == sorted(keys)


def test_datacenter_forward_compat() -> None:
    assert resolve_release("535.161.08").name == "23.10"
    # the CUDA 12.8 releases list the same forward-compatible branches; the CUDA 13 ones none
    assert resolve_release("535.161.08", datacenter=True).name == "25.03"
    assert resolve_release("470.57.02", datacenter=True).name == "25.03"
    assert resolve_release("535.161.08", datacenter=True, compute_capability="7.0").name == (
        "24.12")
    # R515 left the forward-compatible branches with 23.08, R450 with 24.03
    assert resolve_release("515.65.01", datacenter=True).name == "23.07"
    assert resolve_release("450.51.06", datacenter=True).name == "23.12"


@pytest.mark.parametrize("driver", ["", "abc", "535.x", "5 35", "-1"])
def test_malformed_driver(driver: str) -> None:
    with pytest.raises(ConfigError, match="malformed driver version"):
        resolve_release(driver)


@pytest.mark.parametrize(("driver", "release"), [("520.61.05", "22.12"), ("525.147.05", "23.02"),
                                                 ("530.30.02", None)])
def test_driver_below_the_floor_is_refused_with_the_reason(driver: str, release: str | None
                                                         ) -> None:
    """22.12-23.05 ship torch below the workload's floor: a driver that runs nothing newer is
    refused with the release's reason (530.30.02 runs 23.06, the floor release)."""
    if release is None:
        assert resolve_release(driver).name == "23.07"
        return
    with pytest.raises(ConfigError, match=rf"runs NGC PyTorch {release} at the newest.*floor"):
        resolve_release(driver)


def test_releases_carry_their_stack() -> None:
    r = releases.find_release("23.10-py3")
    assert r is not None and r.offered and r.torch and r.torch.startswith("2.1.")
    old = releases.find_release("23.02")
    assert old is not None and not old.offered and "pick 23.06" in (old.refused or "")
    assert releases.floor()["release"] == "23.06"


def test_too_old_driver() -> None:
    with pytest.raises(ConfigError, match="older than every known NGC PyTorch release"):
        resolve_release("418.39.01")
    # a driver that runs only the seeds' old releases: refused with the reason (never offered to
    # the workload), not silently given 21.03
    with pytest.raises(ConfigError, match=r"runs NGC PyTorch 21\.03 at the newest.*floor"):
        resolve_release("470.82.01")


def test_release_tables_may_carry_more_keys(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path,
                                            request: pytest.FixtureRequest) -> None:
    """Keys the resolver does not use (torch versions, a source URL) are ignored, not refused."""
    assert Release.from_table("24.05", {
        "cuda": "12.4.1", "min_driver": "550.54.15", "torch": "2.4.0a0", "source": "https://x",
    }) == Release("24.05", "12.4.1", "550.54.15", torch="2.4.0a0", source="https://x")
    data = tmp_path / "data"
    data.mkdir()
    (data / "ngc_releases.toml").write_text(
        '[releases."24.05"]\ncuda = "12.4.1"\nmin_driver = "550.54.15"\ntorchvision = "0.19"\n')
    monkeypatch.setattr(releases.resources, "files", lambda _package: tmp_path)
    releases._table.cache_clear()
    releases._releases.cache_clear()
    request.addfinalizer(releases._releases.cache_clear)  # later tests read the real table
    request.addfinalizer(releases._table.cache_clear)
    assert [r.name for r in load_releases()] == ["24.05"]
