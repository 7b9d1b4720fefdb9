"""Cell order from expected durations (longest first within a repeat) and the sweep's ETA."""

from __future__ import annotations

import pytest

from orchestrator.config.matrix_file import CellParams
from orchestrator.plan.eta import Eta
from orchestrator.plan.matrix import Cell
from orchestrator.plan.ordering import order_cells


def cells(specs: list[tuple[str, int]], repeats: int = 2) -> list[Cell]:
    """Plan order: repeat 1 of every configuration, then repeat 2."""
    return [Cell(f"{name}-r{r}", name, r, CellParams(hardware="cpu", gpus=gpus), name)
            for r in range(1, repeats + 1) for name, gpus in specs]


SPECS = [("short", 1), ("long", 1), ("mid", 2), ("mid1", 1), ("new", 1)]
EXPECTED = {"short": 10.0, "long": 100.0, "mid": 50.0, "mid1": 50.0}


def test_longest_first_within_each_repeat_unknown_first_repeats_interleaved():
    order = [c.id for c in order_cells(cells(SPECS), EXPECTED)]
    assert order == ["new-r1", "long-r1", "mid-r1", "mid1-r1", "short-r1",
                     "new-r2", "long-r2", "mid-r2", "mid1-r2", "short-r2"]


def test_without_history_the_plan_order_stays():
    plan = cells(SPECS)
    assert order_cells(plan, {}) == plan


def test_eta_counts_what_is_left_at_todays_pace():
    plan = cells([("a", 1), ("b", 1)], repeats=1)
    eta = Eta(plan, {"a": 100.0, "b": 50.0})
    assert eta.remaining_s() == pytest.approx(150.0)
    eta.started("a-r1")
    assert eta.remaining_s({"a-r1": 40.0}) == pytest.approx(110.0)
    eta.finished("a-r1", 200.0)  # today runs twice as slow as before
    assert eta.pace == pytest.approx(2.0)
    assert eta.remaining_s() == pytest.approx(100.0)
    eta.started("b-r1")
    eta.finished("b-r1", 90.0)
    assert eta.remaining_s() == 0.0


def test_eta_with_concurrency_is_never_shorter_than_the_longest_cell_left():
    plan = cells([("a", 1), ("b", 1), ("c", 1), ("d", 1)], repeats=1)
    eta = Eta(plan, {"a": 100.0, "b": 100.0, "c": 100.0, "d": 400.0}, concurrency=4)
    assert eta.remaining_s() == pytest.approx(400.0)  # not 700 / 4
    eta = Eta(plan, {"a": 100.0, "b": 100.0, "c": 100.0, "d": 100.0}, concurrency=2)
    assert eta.remaining_s() == pytest.approx(200.0)


def test_eta_for_unknown_configurations():
    plan = cells([("a", 1), ("new", 1)], repeats=1)
    eta = Eta(plan, {"a": 30.0})
    assert eta.remaining_s() == pytest.approx(60.0)  # new: a typical cell of the matrix
    blind = Eta(plan, {})
    assert blind.remaining_s() is None  # nothing known yet
    blind.started("a-r1")
    blind.finished("a-r1", 12.0)
    assert blind.remaining_s() == pytest.approx(12.0)  # learned from today's first cell
    with pytest.raises(ValueError):
        Eta(plan, {}, concurrency=0)


def test_eta_counts_the_controls_time_for_each_cell_left():
    plan = cells([("a", 1), ("b", 1), ("c", 1)], repeats=1)
    eta = Eta(plan, {"a": 10.0, "b": 10.0, "c": 10.0})
    eta.control_finished(5.0)  # the control before the first cell
    eta.started("a-r1")
    eta.finished("a-r1", 10.0)
    eta.control_finished(None)  # one that never ran adds nothing
    assert eta.remaining_s() == pytest.approx(2 * (10.0 + 5.0))
