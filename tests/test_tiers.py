"""The test tiers (tests/tiers_support.py): derived from fixtures, one per test, and the unit
tier's guard. Each case runs a small test file in-process under the plugin (pytester)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tiers_support import tier_of

pytest_plugins = ["pytester"]

#: Stand-ins for the suite's fixtures (no service is touched: only the names matter).
CONFTEST = """
import pytest

@pytest.fixture
def docker_client(): return None

@pytest.fixture
def base_image(docker_client): return "img"

@pytest.fixture
def torch(): return None

@pytest.fixture
def standin(): return None
"""


def run(pytester: pytest.Pytester, source: str, *args: str) -> pytest.RunResult:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_it=source)
    return pytester.runpytest_inprocess("-p", "tiers_support", "--strict-markers", *args)


@pytest.mark.parametrize("marks, tier", [
    (set(), "unit"), ({"torch"}, "workload"), ({"subprocess"}, "integration"),
    ({"torch", "subprocess"}, "workload"), ({"docker"}, "integration"),
    ({"torch", "docker"}, "integration"), ({"chromium"}, "integration"),
])
def test_one_tier_from_the_capabilities(marks: set[str], tier: str) -> None:
    assert tier_of(marks) == tier


def test_tiers_come_from_the_fixtures_a_test_uses(pytester: pytest.Pytester) -> None:
    source = """
import pytest

def test_pure(): pass
def test_container(base_image): pass      # base_image uses docker_client
def test_model(torch): pass
def test_sweep(standin): pass
@pytest.mark.slurm
def test_explicit(): pass
"""
    for tier, expected in (("unit", ["test_pure"]), ("workload", ["test_model"]),
                           ("integration", ["test_container", "test_sweep", "test_explicit"])):
        result = run(pytester, source, "--collect-only", "-q", "-m", tier)
        got = [line.split("::")[1] for line in result.outlines if "::" in line]
        assert got == expected, (tier, result.outlines)
    result = run(pytester, source, "--collect-only", "-q", "-m", "docker")
    assert [line.split("::")[1] for line in result.outlines if "::" in line] == [
        "test_container"]


def test_a_tier_written_by_hand_is_refused(pytester: pytest.Pytester) -> None:
    result = run(pytester, "import pytest\n@pytest.mark.unit\ndef test_x(): pass\n",
                 "--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*tier markers (unit, workload, integration) are derived*"])


def test_an_unknown_marker_is_refused(pytester: pytest.Pytester) -> None:
    result = run(pytester, "import pytest\n@pytest.mark.dockr\ndef test_x(): pass\n")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*'dockr' not found in `markers` configuration option*"])


def test_a_unit_test_that_starts_a_process_fails_even_when_the_error_is_swallowed(
        pytester: pytest.Pytester) -> None:
    result = run(pytester, """
import os, subprocess

def test_runs():
    subprocess.run(["true"])

def test_swallows():
    try:
        subprocess.run(["true"], check=True)
    except Exception:
        pass  # as a backend that turns a failed launch into a failed cell

def test_system():
    os.system("true")
""")
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(["*a unit-tier test started a subprocess [[]'true'[]]*mark the "
                                 "test @pytest.mark.subprocess*"])
    result.stdout.fnmatch_lines(["*called os.system*"])


def test_a_fixture_of_a_unit_test_that_starts_a_process_fails_it_whatever_its_scope(
        pytester: pytest.Pytester) -> None:
    result = run(pytester, """
import subprocess, pytest

@pytest.fixture(scope="module")
def made():
    subprocess.run(["true"])

def test_uses(made): pass
""")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*a unit-tier test started a subprocess*"])


def test_a_fixture_teardown_that_starts_a_process_fails_it_even_when_swallowed(
        pytester: pytest.Pytester) -> None:
    result = run(pytester, """
import subprocess, pytest

@pytest.fixture(scope="module")
def made():
    yield
    try:
        subprocess.run(["true"], check=True)
    except Exception:
        pass

def test_uses(made): pass
""")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_uses*",
                                 "*a unit-tier test started a subprocess*"])


def test_a_unit_test_that_imports_torch_fails(pytester: pytest.Pytester,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in ``torch`` module is what gets imported (the real one costs seconds)."""
    for name in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
        monkeypatch.delitem(sys.modules, name)
    pytester.makepyfile(torch="VERSION = 'stand-in'\n")
    monkeypatch.syspath_prepend(str(pytester.path))
    result = run(pytester, "def test_imports():\n    import torch  # noqa: F401\n")
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*a unit-tier test imported torch: take the `torch` fixture*"])


def test_a_unit_test_that_sleeps_a_second_at_once_fails(pytester: pytest.Pytester,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[float] = []

    def no_sleep(seconds: float) -> None:
        asked.append(seconds)

    monkeypatch.setattr(time, "sleep", no_sleep)  # the guard's "real" sleep: nothing waits
    result = run(pytester, """
import time

def test_long():
    time.sleep(1.0)

def test_polls():
    for _ in range(30):
        time.sleep(0.05)
""")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*test_long*", "*slept 1 s at once*"])
    assert asked[0] == 1.0


def test_other_tiers_are_not_guarded(pytester: pytest.Pytester,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    monkeypatch.setattr("os.system", lambda command: calls.append(command) or 0)
    result = run(pytester, """
import os, pytest

@pytest.mark.subprocess
def test_allowed():
    assert os.system("true") == 0
""")
    result.assert_outcomes(passed=1)
    assert calls == ["true"]


@pytest.mark.subprocess
def test_a_unit_test_that_draws_passes_on_a_machine_without_a_font_cache(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh machine has no matplotlib font list: matplotlib makes it with ``fc-list`` the
    first time it draws. The plugin builds it before the guard goes on, so a unit test that
    draws passes there too (CI went red on a fresh machine before). A fresh pytest process with
    empty cache folders, as on that machine."""
    pytest.importorskip("matplotlib", reason="the plots extra is not installed")
    fresh = pytester.path / "fresh-home"
    monkeypatch.setenv("HOME", str(fresh))
    monkeypatch.setenv("XDG_CACHE_HOME", str(fresh / ".cache"))
    monkeypatch.setenv("MPLCONFIGDIR", str(fresh / "mpl"))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # tiers_support
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_it="""
def test_draws(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots()
    axes.plot([1, 2], [3, 4], label="a")
    axes.legend()
    figure.savefig(tmp_path / "a.png")
""")
    result = pytester.runpytest_subprocess("-p", "tiers_support", "--strict-markers",
                                           "-m", "unit", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert list((fresh / "mpl").glob("fontlist-*.json")), "the font list was not built"
