"""The regression check: matched by configuration and stack, noise-aware, minimum history,
failures and missing configurations, absolute references. Synthetic run folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from results_support import Config, day, params, run_id, write_run

from orchestrator.cli import main
from orchestrator.config.references import load_references
from orchestrator.errors import ConfigError
from orchestrator.results.folders.store import open_store
from orchestrator.results.reports.history import Options, analyze, render_history

G1, G8 = params(gpus=1), params(gpus=8)
STEADY = [(100.0, 101.0, 99.0), (101.0, 100.0, 102.0), (99.0, 100.0, 98.0),
          (100.5, 99.5, 101.0), (100.0, 100.0, 99.0)]


def nightly(root: Path, newest: list[Config], history: int = 5, **kw) -> None:
    """``history`` steady runs of two configurations (~100 and ~800 images/s), then ``newest``."""
    for n in range(history):
        g1 = STEADY[n % len(STEADY)]
        write_run(root, "nightly", run_id(n + 1), [Config(G1, g1), Config(G8, [8 * v for v in g1])],
                  started=day(n + 1), **kw)
    write_run(root, "nightly", run_id(history + 1), newest, started=day(history + 1), **kw)


def check(root: Path, **options) -> dict[str, object]:
    with open_store(root) as store:
        report = analyze(store, "nightly", Options(**options))
    return {ln.params["gpus"]: ln for ln in report.lines}, report


def test_a_real_drop_is_a_regression_and_the_rest_is_not(tmp_path):
    nightly(tmp_path, [Config(G1, [99.0, 100.0, 101.0]), Config(G8, [700.0, 702.0, 698.0])])
    lines, report = check(tmp_path)
    assert lines[8].verdict == "regression" and lines[8].failing
    assert lines[8].check.change == pytest.approx(700 / 800 - 1)
    assert lines[1].verdict == "no significant change" and not lines[1].failing
    assert [len(ln.used_runs) for ln in report.lines] == [5, 5]
    text = render_history(report)
    assert "REGRESSION" in text and "-12.5%" in text


def test_many_configurations_do_not_multiply_false_alarms(tmp_path):
    """40 configurations, nothing changed: one by one, some pass p < 0.05 by chance; Holm's
    adjustment keeps the run's family-wise level, so none is called a regression."""
    import random

    rng = random.Random(3)
    configs = [params(batch_size=b) for b in range(1, 41)]
    for n in range(6):
        write_run(tmp_path, "nightly", run_id(n + 1), [
            Config(c, [100 * rng.gauss(1, 0.02) for _ in range(3)]) for c in configs],
            started=day(n + 1))
    write_run(tmp_path, "nightly", run_id(9), [
        Config(c, [100 * rng.gauss(1, 0.02) for _ in range(3)]) for c in configs],
        started=day(9))
    with open_store(tmp_path) as store:
        report = analyze(store, "nightly", Options(threshold=0.0))
    raw = [ln.check.p_slower for ln in report.lines]
    assert sum(p < 0.05 for p in raw) >= 1  # would be flagged one by one
    assert all(ln.p_slower >= p for ln, p in zip(report.lines, raw, strict=True))
    assert not [ln for ln in report.lines if ln.verdict == "regression"]


def test_noise_alone_is_not_a_regression(tmp_path):
    """Earlier runs scatter by +-10 %: a newest run 7 % low is within that noise."""
    for n, scale in enumerate((1.0, 1.1, 0.9, 1.05, 0.93)):
        write_run(tmp_path, "nightly", run_id(n + 1),
                  [Config(G1, [100 * scale, 101 * scale, 99 * scale])], started=day(n + 1))
    write_run(tmp_path, "nightly", run_id(9), [Config(G1, [93.0, 92.0, 94.0])], started=day(9))
    lines, _ = check(tmp_path)
    assert lines[1].check.change < -0.05
    assert lines[1].verdict == "no significant change"
    # ... and the report says why: at this noise only a much larger drop is caught reliably
    assert lines[1].detectable > 0.15


def test_the_report_says_which_drop_the_check_can_catch(tmp_path, capsys):
    """Steady history (about 1 % noise): a 10 % drop is well within reach, and the table, the
    notes and --json say so."""
    nightly(tmp_path, [Config(G1, [99.0, 100.0, 101.0]), Config(G8, [700.0, 702.0, 698.0])])
    lines, report = check(tmp_path)
    assert all(0.05 <= ln.detectable < 0.10 for ln in lines.values())
    text = render_history(report)
    assert "detects" in text and f"-{lines[1].detectable:.1%}" in text
    assert "smallest drop flagged 95 % of the time" in text
    assert main(["history", "nightly", "--results", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [ln["detectable_drop"] for ln in out["lines"]] == pytest.approx(
        [ln.detectable for ln in report.lines])


def test_too_few_earlier_runs_is_insufficient_history_never_a_regression(tmp_path):
    nightly(tmp_path, [Config(G1, [50.0, 50.0, 50.0]), Config(G8, [400.0, 400.0, 400.0])],
            history=2)
    lines, _ = check(tmp_path)
    assert {ln.verdict for ln in lines.values()} == {"insufficient history"}
    assert not any(ln.failing for ln in lines.values())
    lines, _ = check(tmp_path, min_history=2)
    assert lines[1].verdict == "regression"


def test_a_stack_change_is_reported_as_such_not_as_a_regression(tmp_path):
    new_torch = {"torch_version": "2.5.0"}
    nightly(tmp_path, [Config(G1, [80.0, 81.0, 79.0], env=new_torch),
                       Config(G8, [800.0, 801.0, 799.0])])
    lines, report = check(tmp_path)
    assert lines[1].verdict == "stack changed" and not lines[1].failing
    assert lines[1].stack_change == {"torch": ("2.4.0", "2.5.0")}
    assert lines[8].verdict == "no significant change"
    assert "stack changed (torch 2.4.0 -> 2.5.0)" in render_history(report)


def test_ignored_stack_fields_do_not_split_history(tmp_path):
    nightly(tmp_path, [Config(G1, [70.0, 71.0, 69.0], env={"hostname": "dgx2"}),
                       Config(G8, [800.0, 801.0, 799.0], env={"hostname": "dgx2"})])
    lines, _ = check(tmp_path)
    assert lines[1].verdict == "stack changed"
    assert lines[1].stack_change == {"host": ("dgx1", "dgx2")}
    lines, _ = check(tmp_path, ignore_stack=("host",))
    assert lines[1].verdict == "regression"


def test_changed_parameters_are_another_configuration(tmp_path):
    """Same display id, other iterations: another content hash, so no mixed history."""
    more = Config(params(gpus=1), [50.0, 50.0, 50.0], config_hash="f00df00df00d")
    nightly(tmp_path, [more, Config(G8, [800.0, 801.0, 799.0])])
    lines, report = check(tmp_path)
    by_config = {ln.config: ln for ln in report.lines}
    assert by_config["f00df00df00d"].verdict == "insufficient history"
    assert by_config["f00df00df00d"].newest == [50.0, 50.0, 50.0]
    # the old configuration is not in the newest plan any more: dropped, not failing
    old = [ln for ln in report.lines if ln.verdict == "dropped"]
    assert len(old) == 1 and old[0].params["gpus"] == 1 and not old[0].failing


def test_failed_and_missing_configurations_are_failures(tmp_path):
    nightly(tmp_path, [Config(G1, [None, None, None]), Config(G8, [800.0, None, 801.0])])
    lines, report = check(tmp_path)
    assert lines[1].verdict == "failed" and lines[1].failing
    assert "out of memory" in lines[1].failed_cells[0].reason
    assert lines[8].verdict == "no significant change" and lines[8].failing  # 1 repeat failed
    text = render_history(report)
    assert "FAILED" in text and "out of memory" in text


def test_missing_versus_dropped(tmp_path):
    # planned in the newest run but no result: missing (a failure)
    nightly(tmp_path, [Config(G1, [100.0, 100.0, 100.0])],
            plan_extra=[Config(G8, [0.0])])
    lines, _ = check(tmp_path)
    assert lines[8].verdict == "missing" and lines[8].failing


def test_a_fifo_planted_as_the_newest_plan_json_does_not_hang_history(tmp_path):
    """The newest run's plan is read again for what it planned: a FIFO there is no plan (its
    unplanned configurations are then missing, as in a hand-made run), not a hang."""
    import os
    import threading

    nightly(tmp_path, [Config(G1, [100.0, 100.0, 100.0])])
    plan = tmp_path / "nightly" / run_id(6) / "plan.json"
    plan.unlink()
    os.mkfifo(plan)
    found: list[dict[str, object]] = []
    worker = threading.Thread(target=lambda: found.append(check(tmp_path)[0]), daemon=True)
    worker.start()
    worker.join(timeout=60)  # a hang stays in the thread: the test fails
    assert len(found) == 1
    assert found[0][8].verdict == "missing" and found[0][8].failing


def test_a_sweep_that_died_is_judged_not_skipped(tmp_path, capsys):
    nightly(tmp_path, [])
    write_run(tmp_path, "nightly", run_id(9), [Config(G1, [100.0, 100.0, 100.0])],
              started=day(9), finished=False, plan_extra=[Config(G8, [0.0])])
    lines, report = check(tmp_path)
    assert report.newest.run_id == run_id(9)
    assert lines[8].verdict == "missing" and lines[8].failing
    assert "has not finished" in render_history(report)
    assert main(["history", "nightly", "--results", str(tmp_path), "--fail-on-regression"]) == 1


def test_a_configuration_taken_out_of_the_matrix_is_dropped_not_failing(tmp_path):
    nightly(tmp_path, [Config(G1, [100.0, 100.0, 100.0])])
    lines, report = check(tmp_path)
    assert lines[8].verdict == "dropped" and not lines[8].failing
    assert lines[8].dropped_by == "the matrix"
    assert "no longer in the matrix" in render_history(report)


def _stray_only(root: Path, **kw) -> None:
    """Five nightly runs of both configurations, then one made with ``--only gpus=1``."""
    nightly(root, [Config(G1, [100.0, 100.0, 100.0]), Config(G8, [800.0, 800.0, 800.0])],
            history=4)
    write_run(root, "nightly", run_id(6), [Config(G1, [100.0, 100.0, 100.0])], started=day(6),
              **kw)


@pytest.mark.parametrize("recorded", [
    {"only": ["gpus=1"]},  # plan.json's selection (runs made from now on)
    {"argv": ["orchestrate", "matrix", "m.toml", "--only", "gpus=1"]},  # older runs: argv
    {"argv": ["orchestrate", "matrix", "m.toml", "--only=gpus=1"]},
    {"argv": ["orchestrate", "matrix", "m.toml", "--onl", "gpus=1"]},  # argparse's prefix
])
def test_a_configuration_left_out_by_only_fails_the_gate(tmp_path, capsys, recorded):
    """Issue 23: a nightly run made with a stray --only went green ("1 dropped")."""
    _stray_only(tmp_path, **recorded)
    lines, report = check(tmp_path)
    assert lines[8].verdict == "dropped" and lines[8].failing
    assert lines[8].dropped_by == "--only gpus=1"
    assert lines[1].verdict == "no significant change"
    text = render_history(report)
    assert "DROPPED (--only)" in text
    assert "left out of 20261106-000000-aaaa by --only gpus=1: fails --fail-on-regression " \
        "unless --allow-dropped" in text
    args = ["history", "nightly", "--results", str(tmp_path), "--fail-on-regression"]
    assert main(args) == 1
    capsys.readouterr()
    assert main([*args, "--allow-dropped"]) == 0
    assert "allowed (--allow-dropped)" in capsys.readouterr().out
    lines, _ = check(tmp_path, allow_dropped=True)
    assert lines[8].verdict == "dropped" and not lines[8].failing


def test_a_configuration_left_out_by_exclude_fails_the_gate_as_by_only(tmp_path, capsys):
    """--exclude is a selection as --only is: what it left out is dropped by it, not by the
    matrix, and fails the gate unless --allow-dropped."""
    _stray_only(tmp_path, only=["precision=fp32"], exclude=["gpus=8"])
    lines, report = check(tmp_path)
    assert lines[8].verdict == "dropped" and lines[8].failing
    assert lines[8].dropped_by == "--only precision=fp32 --exclude gpus=8"
    text = render_history(report)
    assert "DROPPED (--only/--exclude)" in text
    assert "by --only precision=fp32 --exclude gpus=8: fails --fail-on-regression" in text
    assert main(["history", "nightly", "--results", str(tmp_path), "--fail-on-regression",
                 "--allow-dropped"]) == 0


def test_missing_and_dropped_lines_show_their_earlier_figures(tmp_path, capsys):
    """history hid the earlier values of a configuration the newest run lacks."""
    _stray_only(tmp_path, only=["gpus=1"])
    lines, report = check(tmp_path)
    shown_earlier = [r.pk for r in report.shown if r.pk != report.newest.pk]
    assert shown_earlier and all(pk in lines[8].medians for pk in shown_earlier)
    assert sorted(lines[8].medians.values())[0] == pytest.approx(8 * 99.0)
    row = next(r for r in render_history(report).splitlines() if "DROPPED" in r)
    assert "800.0" in row and "792.0" in row
    assert main(["history", "nightly", "--results", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    dropped = next(ln for ln in out["lines"] if ln["verdict"] == "dropped")
    assert dropped["dropped_by"] == "--only gpus=1" and dropped["failing"] is True
    assert out["options"]["allow_dropped"] is False
    # a missing configuration (planned, no result) too
    root = tmp_path / "missing"
    nightly(root, [Config(G1, [100.0, 100.0, 100.0])], plan_extra=[Config(G8, [0.0])])
    lines, report = check(root)
    assert lines[8].verdict == "missing" and len(lines[8].medians) == 5


def test_a_sweep_with_only_records_its_selection_in_the_plan(write_matrix):
    from orchestrator.plan.matrix import filter_cells, load_matrix
    from orchestrator.sweep import plan_json

    matrix = load_matrix(write_matrix("""
        [axes]
        hardware = ["cpu"]
        batch_size = [8, 16]
    """))
    picked = filter_cells(matrix, ["batch_size=8"])
    assert len(picked.cells) == 1
    assert plan_json(picked, "process")["only"] == ["batch_size=8"]
    assert "only" not in plan_json(matrix, "process")


def test_window_and_options_are_validated():
    with pytest.raises(ConfigError, match="--window"):
        Options(window=0).validate()
    with pytest.raises(ConfigError, match="--window"):
        Options(window=2, min_history=3).validate()
    with pytest.raises(ConfigError, match="--min-history"):
        Options(min_history=1).validate()
    with pytest.raises(ConfigError, match="unknown field"):
        Options(ignore_stack=("gpu_model",)).validate()
    with pytest.raises(ConfigError, match="throughput"):
        Options(metric="train.compute_latency_at99").validate()
    Options(metric="train.step_ips_p90").validate()


def test_window_limits_the_earlier_runs_used(tmp_path):
    nightly(tmp_path, [Config(G1, [100.0, 100.0, 100.0])], history=5)
    lines, report = check(tmp_path, window=3)
    assert len(report.earlier) == 3 and len(lines[1].used_runs) == 3


# --- references --------------------------------------------------------------------------------


REFS = """
[[reference]]
match = { gpus = 8 }
value = 800.0
lower = "-5%"
upper = "+10%"

[[reference]]
match = { gpus = 1 }
metric = "train.compute_ips"
min = 200.0
"""


def test_references_are_a_second_check(tmp_path):
    refs = tmp_path / "nightly.references.toml"
    refs.write_text(REFS)
    nightly(tmp_path / "results", [Config(G1, [100.0, 100.0, 100.0]),
                                   Config(G8, [800.0, 801.0, 799.0])])
    with open_store(tmp_path / "results") as store:
        report = analyze(store, "nightly", references=load_references(refs),
                         references_file=str(refs))
    lines = {ln.params["gpus"]: ln for ln in report.lines}
    (r8,) = lines[8].references
    assert (r8.verdict, r8.low, r8.high) == ("within", pytest.approx(760.0), pytest.approx(880.0))
    (r1,) = lines[1].references
    assert r1.metric == "train.compute_ips" and r1.verdict == "below" and lines[1].failing
    assert r1.value == pytest.approx(105.0)
    assert "reference train.compute_ips 105: below [200, -]" in render_history(report)


def test_a_references_file_reports_every_problem_at_once(tmp_path):
    bad = tmp_path / "bad.references.toml"
    bad.write_text("""
[[reference]]
match = { gpu = 8, batch_size = "big" }
value = 100.0
lower = "5"

[[reference]]
match = { gpus = 1 }
lower = "-5%"

[[reference]]
match = { gpus = 2 }
min = 10.0
typo = 1

[[reference]]
match = { gpus = 4 }
""")
    with pytest.raises(ConfigError) as info:
        load_references(bad)
    text = str(info.value)
    for expected in ("reference[0].match.gpu: unknown parameter",
                     "reference[0].match.batch_size", "reference[0].lower: '5' has no unit",
                     "reference[1].value: lower/upper need the value",
                     "reference[2].typo: Extra inputs are not permitted",
                     "reference[3]: no bound", "6 problems"):
        assert expected in text, expected
    assert str(bad) in text
    bad.write_text('[[reference]]\nmatch = { gpus = 2 }\nmin = 10.0\nmax = 5.0\n')
    with pytest.raises(ConfigError, match=r"reference\[0\]: min 10.0 is above max 5.0"):
        load_references(bad)


def test_equally_specific_references_for_one_configuration_are_an_error(tmp_path):
    refs = tmp_path / "r.references.toml"
    refs.write_text('[[reference]]\nmatch = { gpus = 8 }\nmin = 1.0\n'
                    '[[reference]]\nmatch = { batch_size = 64 }\nmin = 2.0\n')
    nightly(tmp_path / "results", [Config(G8, [800.0, 800.0, 800.0])])
    with open_store(tmp_path / "results") as store, pytest.raises(ConfigError,
                                                                  match="as specific"):
        analyze(store, "nightly", references=load_references(refs))


# --- the CLI -----------------------------------------------------------------------------------


def test_cli_exit_codes_and_messages(tmp_path, capsys):
    results = tmp_path / "results"
    nightly(results, [Config(G1, [99.0, 100.0, 101.0]), Config(G8, [700.0, 702.0, 698.0])])
    base = ["history", "nightly", "--results", str(results)]
    assert main(base) == 0
    assert main([*base, "--fail-on-regression"]) == 1
    out = capsys.readouterr().out
    assert "1 configuration(s) failing" in out and "REGRESSION" in out
    assert main([*base, "--threshold", "5"]) == 2
    err = capsys.readouterr().err
    assert "--threshold" in err and "no unit" in err and "5%" in err
    assert main([*base, "--window", "0"]) == 2
    assert "--window" in capsys.readouterr().err
    assert main([*base, "--threshold", "20%", "--fail-on-regression"]) == 0
    assert main(["history", "nope", "--results", str(results)]) == 2
    assert "no runs of 'nope'" in capsys.readouterr().err
    assert main([*base, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["failing"] == 1 and data["options"]["threshold"] == 0.05
    assert {ln["verdict"] for ln in data["lines"]} == {"regression", "no significant change"}


def test_cli_picks_up_references_next_to_the_matrix(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "matrices").mkdir()
    (tmp_path / "matrices" / "nightly.references.toml").write_text(REFS)
    nightly(tmp_path / "results", [Config(G1, [100.0, 100.0, 100.0]),
                                   Config(G8, [800.0, 800.0, 800.0])])
    base = ["history", "nightly", "--results", "results", "--fail-on-regression"]
    assert main(base) == 1  # gpus=1 misses its compute_ips reference
    out = capsys.readouterr().out
    assert "references: matrices/nightly.references.toml (2 check(s))" in out
    assert main([*base, "--no-references"]) == 0
    (tmp_path / "matrices" / "nightly.references.toml").write_text("[[reference]]\nbad = 1\n")
    assert main(base) == 2
    assert "nightly.references.toml" in capsys.readouterr().err


def _without_stack(folder: Path) -> None:
    """The run's results as an import of a log that states no stack writes them."""
    for result in folder.glob("cells/*/result.json"):
        data = json.loads(result.read_text())
        data["env"], data["provenance"] = {}, {"backend": "import"}
        result.write_text(json.dumps(data))


def test_a_run_without_a_stack_names_what_changed_and_ignore_stack_joins_it(tmp_path):
    """Issue 23: an imported log (no stack) was 'stack changed' against every sweep, naming
    nothing, and --ignore-stack on all nine fields did not join it."""
    from orchestrator.results.folders.store import RecordedStack

    nightly(tmp_path, [Config(G1, [99.0, 100.0, 101.0])])
    _without_stack(tmp_path / "nightly" / run_id(6))
    lines, report = check(tmp_path)
    assert lines[1].verdict == "stack changed"
    assert lines[1].stack_change["torch"] == ("2.4.0", None)
    assert "torch 2.4.0 -> (not recorded)" in render_history(report)
    lines, _ = check(tmp_path, ignore_stack=RecordedStack.names())
    assert lines[1].verdict == "no significant change" and len(lines[1].used_runs) == 5
