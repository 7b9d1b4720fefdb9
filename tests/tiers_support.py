"""Test tiers: every test lands in exactly one of ``unit``, ``workload`` or ``integration``.

The tier is **derived** from what a test needs, never written by hand:

* what a test needs is a *capability marker*: ``docker``, ``ssh``, ``slurm``, ``chromium``
  (a real service or program), ``torch`` (imports torch or runs the real workload, also under
  the floor venv) or ``subprocess`` (starts processes: the CLI, a sweep on the process backend,
  the stand-in workload, a tool stand-in on PATH, a mount);
* most capability markers come from the **fixtures** a test uses (:data:`FIXTURE_MARKS`: the
  ``docker_client`` fixture marks ``docker``, the ``torch`` fixture marks ``torch``, the
  ``standin`` fixture marks ``subprocess``, ...; a fixture's own dependencies count); an explicit
  ``@pytest.mark.<capability>`` is written only where no fixture tells;
* the tier follows (:func:`tier_of`): a service -> ``integration``; else ``torch`` ->
  ``workload`` (running the real workload in a subprocess included); else ``subprocess`` ->
  ``integration``; else ``unit``. A test that runs torch and needs a service (the real
  workload in a container) is ``integration``.

``make test-fast`` runs ``-m unit`` in parallel (pytest-xdist); ``make test`` runs the unit tier,
then ``-m workload``, then ``-m integration`` serially.

**The unit tier is guarded** (:func:`pytest_runtest_setup` to the end of its teardown: its
fixtures too, whatever their scope): a unit test that starts a process
(``subprocess``, ``os.system``, ``os.fork``, ``multiprocessing``), imports torch, or asks for a
sleep of :data:`UNIT_LONGEST_SLEEP_S` seconds or more at once fails with a message saying which
marker or fixture it lacks. (A sleep is judged by what was asked, never by the clock, so the
guard does not depend on how loaded the machine is; polling loops of short sleeps pass.) The
process guard records the attempt even when the code under test catches the error it raises (a
backend turning a failed launch into a failed cell), so a swallowed attempt still fails the
test.

**Caches a library builds once per machine** are built before the guard goes on
(:func:`_warm_machine_caches`): matplotlib lists the system's fonts with ``fc-list`` the first
time it draws on a machine and keeps the list in its cache folder, so a unit test that draws
would start a process on a fresh machine only (where CI runs). The list is made once per test
process, outside every test, as a user's first ``report`` would make it.

Stdlib and pytest only: the floor venv (torch 2.1, pytest, no orchestrator dependencies) runs
some test modules with this plugin loaded. Registered by ``pytest_plugins`` in conftest.py.
"""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

#: Real services and programs: a test that needs one is integration-tier, whatever else it needs.
SERVICES = ("docker", "ssh", "slurm", "chromium")
CAPABILITIES: dict[str, str] = {
    "docker": "needs a running Docker engine (CI starts one); integration tier",
    "ssh": "needs openssh-server (sshd on loopback, started per test); integration tier",
    "slurm": "needs Slurm (slurm-wlm; CI starts a single-node and a two-node cluster); "
             "integration tier",
    "chromium": "renders in headless Chromium (Debian's chromium); integration tier",
    "subprocess": "starts processes (the CLI, a process-backend sweep, the stand-in workload, "
                  "a tool stand-in on PATH, a mount); integration tier",
    "torch": "imports torch or runs the real workload (also under the floor venv); "
             "workload tier",
}
TIERS: dict[str, str] = {
    "unit": "derived: no process, no torch, no service; runs in parallel (make test-fast)",
    "workload": "derived: torch / the real workload, no service (make test)",
    "integration": "derived: real services, processes, sweeps; serial (make test)",
}

#: Fixtures that tell what a test needs (their dependants inherit it: ``base_image`` uses
#: ``docker_client``, ``no_jobs_left`` uses ``slurm_cluster``).
FIXTURE_MARKS: dict[str, str] = {
    "docker_client": "docker",
    "sshd_factory": "ssh",
    "slurm_cluster": "slurm",
    "chromium": "chromium",
    "torch": "torch",
    "workload_python": "torch",
    "floor_python": "torch",
    "standin": "subprocess",
    "apptainer_standin": "subprocess",
    "orchestrate_cli": "subprocess",
    "dllogger_program": "subprocess",
    "bitfusion_files": "subprocess",
    "gpu_machine": "subprocess",  # the probe runs the stand-in nvidia-smi
    "tmpfs": "subprocess",
}

#: A unit test asking ``time.sleep`` for this many seconds or more at once fails.
UNIT_LONGEST_SLEEP_S = 1.0


def tier_of(capabilities: set[str]) -> str:
    """The one tier of a test with these capability markers."""
    if capabilities & set(SERVICES):
        return "integration"
    if "torch" in capabilities:
        return "workload"
    if "subprocess" in capabilities:
        return "integration"
    return "unit"


def pytest_configure(config: pytest.Config) -> None:
    for name, text in {**CAPABILITIES, **TIERS}.items():
        config.addinivalue_line("markers", f"{name}: {text}")


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by these markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its capabilities (from its fixtures) and its one tier."""
    wrong: list[str] = []
    for item in items:
        written = {m.name for m in item.iter_markers()}
        if written & set(TIERS):
            wrong.append(f"{item.nodeid}: marked {sorted(written & set(TIERS))}")
        fixtures = set(getattr(item, "fixturenames", ()))
        derived = {mark for name, mark in FIXTURE_MARKS.items() if name in fixtures}
        for mark in sorted(derived - written):
            item.add_marker(mark)
        item.add_marker(tier_of((written | derived) & set(CAPABILITIES)))
    if wrong:
        raise pytest.UsageError(
            "tier markers (unit, workload, integration) are derived, not written: mark what "
            "the test needs instead (" + ", ".join(CAPABILITIES) + ") or use the fixture that "
            "provides it:\n  " + "\n  ".join(wrong))


# --- the unit tier's guard --------------------------------------------------------------------


class UnitTierViolation(RuntimeError):
    """A unit test did what only another tier may do."""


class _Guard:
    """What one unit test attempted that its tier forbids."""

    def __init__(self) -> None:
        self.attempts: list[str] = []
        self.longest_sleep = 0.0
        self.lock = threading.Lock()

    def refuse(self, what: str) -> UnitTierViolation:
        """Record the attempt and return the error to raise (the code under test may catch it:
        the record still fails the test)."""
        message = (
            f"a unit-tier test {what[:300]}: unit tests start no process. Use the fixture that "
            "starts it (standin, orchestrate_cli, sshd_factory, docker_client, ...) or mark "
            "the test @pytest.mark.subprocess (integration tier); see tests/tiers_support.py"
        )
        with self.lock:
            self.attempts.append(message)
        return UnitTierViolation(message)

    def problems(self, had_torch: bool) -> list[str]:
        """Everything the test did that its tier forbids."""
        found = list(dict.fromkeys(self.attempts))
        if not had_torch and "torch" in sys.modules:
            found.append("a unit-tier test imported torch: take the `torch` fixture (workload "
                         "tier), or import nothing that imports torch")
        if self.longest_sleep >= UNIT_LONGEST_SLEEP_S:
            found.append(f"a unit-tier test slept {self.longest_sleep:g} s at once (unit "
                         f"tests sleep less than {UNIT_LONGEST_SLEEP_S:g} s): wait on an event "
                         "instead, or mark what it needs")
        return found


_GUARD = pytest.StashKey[_Guard]()


def _refusing(guard: _Guard, what: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise guard.refuse(f"{what} {args[:1]!r}")

    return refuse


def _install(guard: _Guard, monkeypatch: pytest.MonkeyPatch) -> None:
    """Block every way of starting a process at the point where it is started (the checks
    before it, e.g. subprocess refusing a NUL byte in an environment value, still run)."""

    def posix_spawn(self: Any, args: Any, *rest: Any, **kwargs: Any) -> None:
        raise guard.refuse(f"started a subprocess {args!r}")

    def fork_exec(args: Any, *rest: Any, **kwargs: Any) -> int:
        raise guard.refuse(f"started a subprocess {args!r}")

    monkeypatch.setattr(subprocess, "_fork_exec", fork_exec)
    monkeypatch.setattr(subprocess.Popen, "_posix_spawn", posix_spawn)
    monkeypatch.setattr(_posixsubprocess, "fork_exec", fork_exec)  # multiprocessing's spawn
    for name in ("system", "fork", "forkpty", "posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, _refusing(guard, f"called os.{name}"))
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        with guard.lock:
            guard.longest_sleep = max(guard.longest_sleep, float(seconds))
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", sleep)


_PATCHES = pytest.StashKey[pytest.MonkeyPatch]()
_WARMED: list[bool] = []


def _warm_machine_caches() -> None:
    """Build, once per process and outside every test, the caches a library makes the first time
    it runs on a machine by starting a process: matplotlib's font list (``fc-list``), kept in
    its cache folder (``MPLCONFIGDIR``, else ``~/.cache/matplotlib``). Where matplotlib is not
    installed (the floor venv) there is nothing to build."""
    if _WARMED:
        return
    _WARMED.append(True)
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.font_manager  # importing it loads or builds the font list


def _problems_after(item: pytest.Item, had_torch: bool, outcome: Any) -> None:
    """Fail the phase (setup, call, teardown) with what was attempted in it (each attempt is
    reported once, by the phase that made it)."""
    guard = item.stash.get(_GUARD, None)
    if guard is None:
        return
    problems = guard.problems(had_torch)
    guard.attempts.clear()
    guard.longest_sleep = 0.0
    if problems:
        outcome.force_exception(pytest.fail.Exception("\n".join(problems), pytrace=False))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    """Unit tests: the guard is on from the start of their setup (so a module- or
    session-scoped fixture that starts a process for them is caught too) to the end of their
    teardown."""
    if item.get_closest_marker("unit") is not None:
        _warm_machine_caches()
        guard, patches = _Guard(), pytest.MonkeyPatch()
        _install(guard, patches)
        item.stash[_GUARD], item.stash[_PATCHES] = guard, patches
    had_torch = "torch" in sys.modules
    outcome = yield
    _problems_after(item, had_torch, outcome)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Fail a unit test that did what its tier forbids, even where the code under test caught
    the error the guard raised (the guard's message replaces whatever the test raised)."""
    had_torch = "torch" in sys.modules
    outcome = yield
    _problems_after(item, had_torch, outcome)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """The guard comes off at the end of the teardown, and fails it for what its fixtures'
    teardowns attempted (caught or not)."""
    had_torch = "torch" in sys.modules
    outcome = yield
    patches = item.stash.get(_PATCHES, None)
    if patches is not None:
        patches.undo()
    _problems_after(item, had_torch, outcome)
