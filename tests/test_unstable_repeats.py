"""A configuration whose ok repeats spread beyond the stated bound is flagged unstable (issue 23,
item 6): ``?`` after its images/s and a footnote in the summary table, summary.csv's
``unstable``, ``compare`` (text, csv, json) and the HTML reports. Synthetic run folders
(tests/results_support.py): the numbers are the test's."""

from __future__ import annotations

import csv
import io

import pytest
from results_support import Config, day, params, run_id, write_run

from orchestrator.results.folders.store import open_store
from orchestrator.results.reports.compare import compare_runs, render_compare, render_compare_csv
from orchestrator.results.reports.report_html import compare_report, run_report
from orchestrator.results.reports.summary import UNSTABLE_NOTE, render_csv, summarize_run
from orchestrator.results.statistics import stats

G1, G2, G4, G8 = (params(gpus=g) for g in (1, 2, 4, 8))


@pytest.mark.parametrize("values, expected", [
    ([100.0, 105.0, 109.0], False),  # 9 %: ordinary noise
    ([100.0, 100.0, 111.0], True),  # 11 %
    ([8.0, 21.0, 37.0], True),  # the CPU repeat set going 8 -> 37 images/s
    ([100.0, 130.0], True),  # two repeats are judged by the same bound
    ([100.0, 105.0], False),
    ([2.9, 16.9], True),  # issue 31: two repeats 2.9..16.9 images/s went unflagged
    ([100.0], None),  # one repeat has no spread
    ([0.0, 0.0, 5.0], None),  # no median to relate the range to
])
def test_the_rule(values, expected):
    assert stats.unstable(values) is expected


def test_the_bound_is_ten_percent_of_the_median_over_two_repeats_or_more():
    assert stats.spread([90.0, 100.0, 100.0]) == pytest.approx(0.10)
    assert stats.unstable([90.0, 100.0, 100.0]) is False  # exactly the bound: not beyond it
    assert "> 10 %" in stats.UNSTABLE_RULE and "at least 2 ok repeats" in stats.UNSTABLE_RULE


def test_two_steady_repeats_are_flagged_less_often_than_three():
    """Why the rule may judge two repeats: with steady noise (5 %, normal) the range of two
    values exceeds the bound less often than the range of three, so the rule is no weaker at
    two. Exact figures by simulation (seeded)."""
    import random

    rng = random.Random(31)

    def flagged(n: int) -> float:
        trials = 4000
        return sum(bool(stats.unstable([100 * rng.gauss(1, 0.05) for _ in range(n)]))
                   for _ in range(trials)) / trials

    two, three = flagged(2), flagged(3)
    assert two < three
    assert 0.10 < two < 0.22 and 0.2 < three < 0.4  # P(|N(0, 2 x 0.05^2)| > 0.1) = 15.7 %


def a_run(root):
    return write_run(root, "m", run_id(1), [
        Config(G1, [100.0, 101.0, 99.0]),  # steady
        Config(G2, [8.0, 21.0, 37.0]),  # unstable
        Config(G4, [400.0, 300.0, None]),  # 2 ok repeats: judged too
        Config(G8, [800.0, None, None]),  # 1 ok repeat: not judged
    ], started=day(1))


def test_the_summary_marks_an_unstable_row_and_says_why(tmp_path):
    rows, table = summarize_run(a_run(tmp_path))
    by_gpus = {r.params["gpus"]: r for r in rows}
    assert [by_gpus[g].unstable for g in (1, 2, 4, 8)] == [False, True, True, None]
    lines = {line.split("|")[2].strip(): line for line in table.splitlines()
             if line.startswith("| h100")}
    assert "21.0?" in lines["2"] and "350.0?" in lines["4"]
    assert "?" not in lines["1"] and "?" not in lines["8"]
    assert UNSTABLE_NOTE in table and "(max - min) / median > 10 %" in table
    written = {r["gpus"]: r for r in csv.DictReader(io.StringIO(render_csv(rows)))}
    assert [written[g]["unstable"] for g in ("1", "2", "4", "8")] == [
        "False", "True", "True", ""]


def test_a_steady_run_has_no_note_and_no_mark(tmp_path):
    paths = write_run(tmp_path, "m", run_id(1), [Config(G1, [100.0, 101.0, 99.0])])
    rows, table = summarize_run(paths)
    assert "?" not in table and UNSTABLE_NOTE not in table
    assert rows[0].unstable is False


def test_compare_marks_the_side_that_was_unstable(tmp_path):
    a_run(tmp_path)
    write_run(tmp_path, "m", run_id(2), [
        Config(G1, [100.0, 140.0, 99.0]), Config(G2, [20.0, 21.0, 20.5]),
        Config(G4, [400.0, 401.0, 399.0]),
    ], started=day(2))
    with open_store(tmp_path) as store:
        comp = compare_runs(store, *store.runs())
    rows = {r.params["gpus"]: r for r in comp.rows}
    assert (rows[1].a.unstable, rows[1].b.unstable) == (False, True)
    assert (rows[2].a.unstable, rows[2].b.unstable) == (True, False)
    text = render_compare(comp)
    assert "21.0?" in text and "100.0?" in text and "unstable" in text
    data = {r["params"]["gpus"]: r for r in comp.to_json()["rows"]}
    assert data[2]["a_unstable"] is True and data[4]["a_unstable"] is True
    assert data[8]["a_unstable"] is None
    written = {r["gpus"]: r for r in csv.DictReader(io.StringIO(render_compare_csv(comp)))}
    assert (written["1"]["a_unstable"], written["1"]["b_unstable"]) == ("False", "True")
    html = compare_report(comp)
    assert "21.0?" in html and "unstable" in html


def test_the_html_report_carries_the_mark_and_the_note(tmp_path):
    paths = a_run(tmp_path)
    rows, _ = summarize_run(paths)
    html = run_report(paths, rows, paths.results())
    assert "21.0?" in html and "? unstable: the ok repeats spread too far" in html
