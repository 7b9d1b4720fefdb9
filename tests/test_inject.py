"""The off-by-default slowdown injection of the regression benchmark (workload/inject.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from workload.errors import ConfigError


@pytest.fixture(scope="module")
def inject(torch: Any) -> Any:
    """``workload.inject`` (it imports workload.device, hence torch: workload tier)."""
    from workload import inject

    return inject


def step(x: float) -> float:
    time.sleep(0.05)
    return x * 2


def test_off_by_default_returns_the_step_itself(inject: Any, monkeypatch):
    monkeypatch.delenv(inject.VARIABLE, raising=False)
    assert inject.slowed(step, "cpu") is step
    monkeypatch.setenv(inject.VARIABLE, "0")
    assert inject.slowed(step, "cpu") is step


def test_the_step_sleeps_the_given_fraction_of_its_duration(inject: Any, monkeypatch):
    monkeypatch.setenv(inject.VARIABLE, "1.0")
    slowed = inject.slowed(step, "cpu")
    t0 = time.perf_counter()
    assert slowed(3.0) == 6.0
    took = time.perf_counter() - t0
    assert took >= 0.1  # the step (>= 0.05 s) and as long again asleep


@pytest.mark.parametrize("text", ["ten", "-0.1", "50"])
def test_bad_values_are_config_errors(inject: Any, monkeypatch, text):
    monkeypatch.setenv(inject.VARIABLE, text)
    with pytest.raises(ConfigError, match=inject.VARIABLE):
        inject.fraction()
