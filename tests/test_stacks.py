"""The release table and the model table as data: complete, ordered, parseable, and true.

``orchestrator/data/ngc_releases.toml`` must give every release every required key, parseable
driver and version numbers, and obey the floor rule (every offered release ships torch and
torchvision at or above ``[floor]``; every older one is refused with a reason that names an
offered release).  ``orchestrator/data/torchvision_models.toml`` must list exactly the models
``torchvision.models.list_models`` gives, under the running torchvision and under the floor
interpreter (``ORCHESTRATE_FLOOR_PYTHON``), plus the workload's own DeepLearningExamples models.
"""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
from workload_support import REPO, env

from orchestrator.catalog import releases, stacks

DATA = REPO / "orchestrator" / "data"
TABLE: dict[str, Any] = tomllib.loads((DATA / "ngc_releases.toml").read_text())
RELEASES: dict[str, dict[str, Any]] = TABLE["releases"]
MODELS: dict[str, Any] = tomllib.loads((DATA / "torchvision_models.toml").read_text())

REQUIRED = {"cuda", "min_driver", "torch", "torchvision", "source", "verified"}
OPTIONAL = {"forward_compat", "refused", "min_compute_capability", "ubuntu", "python"}
DRIVER = re.compile(r"^\d+\.\d+(\.\d+)?$")
HABANA: dict[str, dict[str, Any]] = tomllib.loads(
    (DATA / "habana_releases.toml").read_text())["releases"]


def _release(name: str) -> releases.Release:
    found = releases.find_release(name)
    assert found is not None, name
    return found


def _key(release: str) -> tuple[int, int]:
    year, month = release.split(".")
    return int(year), int(month)


# --------------------------------------------------------------------------- the release table


def test_releases_are_ordered_in_the_file_and_well_named() -> None:
    names = list(RELEASES)
    assert all(re.fullmatch(r"\d\d\.\d\d", n) for n in names)
    assert names == sorted(names, key=_key) and len(set(names)) == len(names)
    assert [r.name for r in releases.load_releases()] == names


@pytest.mark.parametrize("release", list(RELEASES))
def test_every_release_is_complete_and_parses(release: str) -> None:
    row = RELEASES[release]
    assert set(row) >= REQUIRED, REQUIRED - set(row)
    assert set(row) <= REQUIRED | OPTIONAL, set(row) - REQUIRED - OPTIONAL
    assert DRIVER.match(row["min_driver"])
    assert all(DRIVER.match(v) for v in row.get("forward_compat", []))
    assert re.fullmatch(r"\d+\.\d+\.\d+", row["cuda"])
    stacks.parse_version(row["torch"])
    stacks.parse_version(row["torchvision"])
    # NVIDIA's pages are rel_YY-MM.html up to 22.xx, rel-YY-MM.html after
    sep = "_" if _key(release) < (22, 12) else "-"
    assert row["source"] == (
        "https://docs.nvidia.com/deeplearning/frameworks/pytorch-release-notes/"
        f"rel{sep}{release.replace('.', '-')}.html"
    )
    if "ubuntu" in row:
        assert re.fullmatch(r"\d\d\.04", row["ubuntu"])
    if "python" in row:
        assert re.fullmatch(r"3\.\d+", row["python"])
    assert set(row["verified"]) <= set(row) - {"source", "verified", "refused"}


def test_drivers_never_go_backwards() -> None:
    keys = [stacks.parse_version(r["min_driver"]) for r in RELEASES.values()]
    assert keys == sorted(keys)


def test_architectures_are_only_ever_dropped() -> None:
    """A release's oldest GPU architecture is never older than an earlier release's (the
    resolver lets a release without the key inherit the previous one's)."""
    seen = [tuple(map(int, r["min_compute_capability"].split(".")))
            for r in RELEASES.values() if "min_compute_capability" in r]
    assert seen == sorted(seen) and seen[0] == (6, 0)
    inherited = [r.min_compute_capability for r in releases.load_releases()]
    assert all(inherited) and inherited[-1] == "7.5"


def test_newest_rows_have_their_driver_from_the_cuda_table() -> None:
    """From 24.12 on, min_driver is the driver of the release's CUDA toolkit (Table 3 of the
    CUDA release notes), checked: never the release notes' stale branch ("560 or later")."""
    toolkit = {"12.6.3": "560.35.05", "12.8.0": "570.26", "12.8.1": "570.124.06",
               "13.0.2": "580.95.05", "13.1.0": "590.44.01"}
    newer = {n: r for n, r in RELEASES.items() if _key(n) >= (24, 12)}
    assert list(newer) == ["24.12", "25.01", "25.03", "25.10", "25.12"]
    for name, row in newer.items():
        assert row["min_driver"] == toolkit[row["cuda"]], name
        assert {"cuda", "min_driver", "torch"} <= set(row["verified"]), name
        if row["cuda"].startswith("13."):  # the notes' R470.. list was copied text: left out
            assert "forward_compat" not in row, name


def test_habana_table_is_ordered_complete_and_above_the_floor() -> None:
    names = list(HABANA)
    assert names == sorted(names, key=_key)
    for name, row in HABANA.items():
        assert set(row) == {"torch", "source", "verified"}, name
        assert re.fullmatch(r"\d+\.\d+", name)
        assert re.fullmatch(r"\d+\.\d+\.\d+", row["torch"]), name  # names the installer image
        assert stacks.series(row["torch"]) >= stacks.series(TABLE["floor"]["torch"]), name
        assert row["source"].endswith(f"Support_Matrix_v{name}.0.html"), name
        assert set(row["verified"]) <= {"torch"}
    torches = [stacks.parse_version(r["torch"]) for r in HABANA.values()]
    assert torches == sorted(torches)


@pytest.mark.parametrize("release", [n for n in RELEASES if _key(n) >= (22, 12)])
def test_torchvision_pairs_with_torch(release: str) -> None:
    """torchvision 0.(N+15) goes with torch 2.N (torch 1.14 was the pre-release of 2.0). The
    seeds' torch 1.x rows (20.03-22.06, for foreign programs only) give what was seen in the
    containers, where NVIDIA's source builds need not follow the pairing (21.03: 0.9.0a0)."""
    torch_major, torch_minor = stacks.series(RELEASES[release]["torch"])
    vision = stacks.series(RELEASES[release]["torchvision"])
    torch_minor = 0 if (torch_major, torch_minor) == (1, 14) else torch_minor
    assert vision == (0, torch_minor + 15)


def test_floor_rule() -> None:
    floor = TABLE["floor"]
    floor_torch, floor_vision = stacks.series(floor["torch"]), stacks.series(floor["torchvision"])
    offered = [n for n, r in RELEASES.items() if "refused" not in r]
    assert offered and offered[0] == floor["release"]
    assert stacks.series(RELEASES[offered[0]]["torch"]) == floor_torch
    assert offered == [n for n in RELEASES if _key(n) >= _key(floor["release"])]
    for name in offered:
        assert stacks.series(RELEASES[name]["torch"]) >= floor_torch, name
        assert stacks.series(RELEASES[name]["torchvision"]) >= floor_vision, name
    torch_series = [stacks.series(RELEASES[n]["torch"]) for n in offered]
    assert torch_series == sorted(torch_series)  # offered releases never go back in torch


@pytest.mark.parametrize("release", [n for n, r in RELEASES.items() if "refused" in r])
def test_refused_releases_say_why_and_what_to_pick(release: str) -> None:
    reason = RELEASES[release]["refused"]
    assert RELEASES[release]["torch"] in reason or "Python 3.8" in reason
    picks = re.findall(r"pick (\d\d\.\d\d)", reason)
    assert picks and all("refused" not in RELEASES[p] for p in picks)
    pick = RELEASES[picks[0]]
    # the suggested release runs wherever the refused one did
    assert stacks.parse_version(pick["min_driver"]) <= max(
        stacks.parse_version(RELEASES[release]["min_driver"]), (530, 30, 2)
    )
    assert not _release(release).offered


def test_unverified_torch_lies_between_its_verified_neighbours() -> None:
    names = list(RELEASES)
    verified = [n for n in names if "torch" in RELEASES[n]["verified"]]
    for name in names:
        if name in verified:
            continue
        before = [v for v in verified if _key(v) < _key(name)]
        after = [v for v in verified if _key(v) > _key(name)]
        assert before and after, f"{name}: no verified neighbour on one side"
        low, high = (stacks.series(RELEASES[v]["torch"]) for v in (before[-1], after[0]))
        assert low <= stacks.series(RELEASES[name]["torch"]) <= high, name


def test_most_torch_versions_are_verified() -> None:
    """Guards the table's honesty note: unverified rows stay the exception."""
    unverified = [n for n, r in RELEASES.items() if "torch" not in r["verified"]]
    assert len(unverified) <= len(RELEASES) // 4, unverified


# --------------------------------------------------------------------------- stacks helpers


def test_stack_lookup_and_versions() -> None:
    s = _release("23.10-py3")
    assert (s.name, s.torch, s.torchvision, s.offered) == ("23.10", "2.1.0a0+32f93b1", "0.16",
                                                              True)  # fmt: skip
    assert stacks.parse_version("2.1.0a0+32f93b1") == (2, 1, 0)
    assert stacks.parse_version("0.16") == (0, 16, 0)
    assert stacks.series("2.15.0+cu132") == (2, 15)
    for bad in ("", "2", "abc", "2.x.0"):
        with pytest.raises(ValueError, match="not a version number"):
            stacks.parse_version(bad)
    assert releases.find_release("19.01") is None


def test_feature_facts() -> None:
    assert stacks.feature_missing("compile", "1.14.0a0+44dac51") == (
        "compile needs torch >= 2.0; this stack has torch 1.14.0a0+44dac51"
    )
    assert stacks.feature_missing("compile", "2.1.0a0+32f93b1") is None
    assert stacks.feature_missing("something-unknown", "1.0.0") is None


def test_arch_availability() -> None:
    assert stacks.arch_available("resnext101_32x4d", "0.16.0a0")
    assert stacks.arch_available("resnet50", _release("24.10").torchvision)
    assert not stacks.arch_available("resnet5o", "0.29.2")
    assert stacks.archs("0.15") == []  # below the floor nothing is recorded


# --------------------------------------------------------------------------- the model table


def _expected_torchvision(version: str) -> list[str]:
    return sorted(set(stacks.archs(version)) - set(stacks.workload_archs()))


def test_models_table_matches_the_running_torchvision(torch: Any) -> None:
    import torchvision

    have = sorted(torchvision.models.list_models(module=torchvision.models))
    assert have == _expected_torchvision(torchvision.__version__)


def test_models_table_lists_the_workloads_own_models(torch: Any) -> None:
    from workload.dle_models import BUILDERS, DLE_NAMES

    assert stacks.workload_archs() == DLE_NAMES
    assert set(BUILDERS) == set(DLE_NAMES)
    assert MODELS["range"]["floor"] == TABLE["floor"]["torchvision"]


def test_models_table_matches_the_floor_torchvision(floor_python: str) -> None:
    python = floor_python
    code = ("import json, torchvision; print(json.dumps([torchvision.__version__, "
            "sorted(torchvision.models.list_models(module=torchvision.models))]))")  # fmt: skip
    proc = subprocess.run([python, "-W", "ignore", "-c", code], capture_output=True, text=True,
                          env=env(), timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    version, names = json.loads(proc.stdout.strip().splitlines()[-1])
    assert stacks.series(version) == stacks.series(TABLE["floor"]["torchvision"])
    assert names == _expected_torchvision(version)


def test_data_files_are_package_data() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["orchestrator"]
    assert any(Path("data/torchvision_models.toml").match(p) for p in patterns)
