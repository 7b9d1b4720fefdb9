"""Figures of merit: parsers (our JSON lines, DLLogger, regex), declarations, success criteria.

DLLogger input is written by the real NVIDIA DLLogger (tests/dllogger_support.py runs a small
program that logs through it like DLE's main.py); the parsers are checked against the raw
per-iteration times that program measured.
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dllogger_support import dle_logger_path
from pydantic import ValidationError

from orchestrator.config.files import problems_from_validation
from orchestrator.errors import ConfigError, LogFormatError
from orchestrator.results.figures import figure_parsers as fp
from orchestrator.results.figures.dllogger import read_dllogger
from orchestrator.results.figures.figure_parsers import (
    CellOutput,
    FiguresConfig,
    evaluate,
    load_figures_file,
    parse_figures,
)
from workload import metrics as wm
from workload.output import Reporter

DLL = FiguresConfig(parser="dllogger")


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory,
             dllogger_program: Callable[..., Any]) -> dict[str, tuple[Path, Path, dict]]:
    """Real DLLogger output of a few runs: name -> (raport, stdout log, truth)."""
    base = tmp_path_factory.mktemp("dllogger")
    variants = {
        "train": ["--amp"],
        "infer": ["--evaluate", "--val-iterations", "25"],
        "pf5": ["--print-freq", "5", "--epochs", "2", "--iterations", "20",
                "--val-iterations", "10"],
        "default_steps": ["--default-steps", "--training-only"],
        "json_stdout": ["--json-to-stdout", "--training-only"],
        "nan": ["--nan-loss", "--training-only"],
    }
    out = {}
    for name, args in variants.items():
        raport, log, truth, _ = dllogger_program(base, *args, name=name)
        out[name] = (raport, log, json.loads(truth.read_text()))
    return out


def output(path: Path, mode: str = "train", warmup: int = 5, **params) -> CellOutput:
    return CellOutput(path.read_text(), path.name, None, {"mode": mode, "warmup": warmup,
                                                          **params})


def expected(truth: dict, prefix: str, warmup: int) -> dict[str, float]:
    """Our rule applied to the times the program really measured."""
    key = "train" if prefix == "train" else "val"
    return wm.summarize(prefix, truth[key]["data"][warmup:], truth[key]["compute"][warmup:],
                        truth["global_batch"])


# --- DLLogger ----------------------------------------------------------------------------


def test_raport_recomputes_throughput_by_our_rule_after_warmup(programs):
    raport, _, truth = programs["train"]
    ev = evaluate(output(raport), DLL)
    assert ev.ok, ev.reason
    m = ev.figures.metrics
    want = expected(truth, "train", 5)
    for key in ("train.total_ips", "train.compute_ips", "train.compute_latency_at50",
                "train.compute_latency_at99", "train.data_time"):
        assert m[key] == pytest.approx(want[key], rel=1e-9), key
    assert m["iterations"] == 25 and m["warmup"] == 5 and m["global_batch_size"] == 32
    assert ev.figures.info()["train"]["rule"] == "times"


def test_raport_keeps_dllogger_own_figures_labelled(programs):
    raport, _, truth = programs["train"]
    m = evaluate(output(raport), DLL).figures.metrics
    # the program's own summary: mean of per-iteration ips, warmup included
    ips = [32 / (d + c) for d, c in zip(truth["train"]["data"], truth["train"]["compute"],
                                         strict=True)]
    assert m["dle.train.total_ips"] == pytest.approx(wm.mean(ips), rel=1e-9)
    assert m["dle.train.total_ips"] != pytest.approx(wm.mean(ips[5:]), rel=1e-6)  # warmup in
    assert m["dle.val.compute_latency_at99"] == pytest.approx(
        wm.percentile(truth["val"]["compute"], 99), rel=1e-9)


def test_validation_pass_gives_inference_latency_percentiles(programs):
    raport, _, truth = programs["train"]
    m = evaluate(output(raport), DLL).figures.metrics
    want = expected(truth, "val", 5)
    for q in (50, 90, 95, 99):
        assert m[f"val.compute_latency_at{q}"] == pytest.approx(
            want[f"val.compute_latency_at{q}"], rel=1e-9)
    assert m["val.total_ips"] == pytest.approx(want["val.total_ips"], rel=1e-9)


def test_infer_mode_requires_val_throughput(programs):
    raport, _, truth = programs["infer"]
    ev = evaluate(output(raport, mode="infer", warmup=3), DLL)
    assert ev.ok, ev.reason
    assert ev.figures.metrics["val.total_ips"] == pytest.approx(
        expected(truth, "val", 3)["val.total_ips"], rel=1e-9)
    assert ev.figures.metrics["iterations"] == 22
    assert "train.total_ips" not in ev.figures.metrics
    # the same log judged as a training cell has no training figure
    ev = evaluate(output(raport, mode="train"), DLL)
    assert not ev.ok and "no figure train.total_ips" in ev.reason
    assert "no per-iteration train records" in ev.reason


def test_stdout_log_gives_the_same_figures_to_its_printed_precision(programs):
    raport, log, truth = programs["train"]
    from_raport = evaluate(output(raport), DLL).figures
    from_log = evaluate(output(log), DLL)
    assert from_log.ok, from_log.reason
    m = from_log.figures.metrics
    assert from_log.figures.info()["train"]["rule"] == "ips"
    # ips printed with 2 decimals, latency with 5 (10 us)
    assert m["train.total_ips"] == pytest.approx(from_raport.metrics["train.total_ips"],
                                                 rel=1e-5)
    for q in (50, 99):
        assert m[f"val.compute_latency_at{q}"] == pytest.approx(
            from_raport.metrics[f"val.compute_latency_at{q}"], abs=6e-6)
    assert m["dle.train.total_ips"] == pytest.approx(
        from_raport.metrics["dle.train.total_ips"], abs=0.006)
    params = from_log.figures.parameters
    assert params["arch"] == "resnet50" and params["batch_size"] == 32
    assert params["amp"] is True and params["evaluate"] is False


def test_records_averaging_several_iterations(programs):
    """--print-freq 5 over 2 epochs: each record is the mean of 5 iterations."""
    raport, log, truth = programs["pf5"]
    ev = evaluate(output(raport), DLL)
    assert ev.ok, ev.reason
    m = ev.figures.metrics
    want = expected(truth, "train", 5)
    # times are interval means: the totals are still exact
    assert m["train.total_ips"] == pytest.approx(want["train.total_ips"], rel=1e-9)
    assert m["iterations"] == 35 and m["warmup"] == 5
    assert "train.compute_latency_at99" not in m  # cannot be recomputed from means
    assert any("percentiles not recomputed" in n for n in ev.figures.notes)
    # stdout has no times: mean ips per record, flagged approximate (an upper bound)
    ev_log = evaluate(output(log), DLL)
    assert ev_log.figures.info()["train"]["rule"] == "ips-approximate"
    assert ev_log.figures.metrics["train.total_ips"] >= m["train.total_ips"] * (1 - 1e-5)


def test_warmup_straddling_a_record_drops_the_whole_record(programs):
    raport, _, truth = programs["pf5"]
    m = evaluate(output(raport, warmup=7), DLL).figures.metrics
    assert m["warmup"] == 10 and m["iterations"] == 30
    assert m["train.total_ips"] == pytest.approx(expected(truth, "train", 10)["train.total_ips"],
                                                 rel=1e-9)


def test_dllogger_default_step_format_on_stdout(programs):
    raport, log, _ = programs["default_steps"]
    assert "DLL " in log.read_text() and "- (0, 1) " in log.read_text()
    ev = evaluate(output(log), DLL)
    assert ev.ok, ev.reason
    assert ev.figures.metrics["train.total_ips"] == pytest.approx(
        evaluate(output(raport), DLL).figures.metrics["train.total_ips"], rel=1e-5)


def test_dlll_lines_among_other_output(programs):
    _, log, truth = programs["json_stdout"]
    text = log.read_text()
    assert text.startswith("program starting") and "\nDLLL {" in text
    ev = evaluate(output(log), DLL)
    assert ev.ok, ev.reason
    assert ev.figures.source == "json_stdout.log (DLLL JSON lines)"
    assert ev.figures.metrics["train.total_ips"] == pytest.approx(
        expected(truth, "train", 5)["train.total_ips"], rel=1e-9)


def test_raport_named_in_the_cell_folder(programs, tmp_path):
    raport, _, _ = programs["train"]
    (tmp_path / "raport.json").write_bytes(raport.read_bytes())
    (tmp_path / "log.txt").write_text("Training process 0 affinity: {0}\n")
    out = CellOutput.from_cell_dir(tmp_path, {"mode": "train", "warmup": 5})
    config = FiguresConfig(parser="dllogger", raport="raport.json", warmup=2)
    ev = evaluate(out, config)
    assert ev.ok and ev.figures.metrics["warmup"] == 2
    ev = evaluate(out, FiguresConfig(parser="dllogger", raport="missing.json"))
    assert not ev.ok and "missing.json" in ev.reason and "not found" in ev.reason


def test_truncated_raport_is_an_error_with_its_line(programs, tmp_path):
    raport, _, _ = programs["train"]
    lines = raport.read_text().splitlines()
    cut = tmp_path / "cut.json"
    cut.write_text("\n".join(lines[:40]) + "\n" + lines[40][:50])
    with pytest.raises(LogFormatError) as info:
        read_dllogger(cut.read_text(), "cut.json")
    (problem,) = info.value.problems
    assert (problem.file, problem.field) == ("cut.json", "line 41")
    assert "malformed DLLogger record" in problem.message and "ends here" in problem.message
    # a cell's evaluation never raises: the problem becomes its failure reason
    ev = evaluate(CellOutput(cut.read_text(), "cut.json", None, {"mode": "train"}), DLL)
    assert not ev.ok and ev.failures[0].kind == "format" and "line 41" in ev.reason


def test_raport_with_foreign_lines_lists_every_one(programs, tmp_path):
    raport, _, _ = programs["train"]
    lines = raport.read_text().splitlines()
    lines[3], lines[7] = "garbage", 'DLLL {"type": "LOG"}'
    with pytest.raises(LogFormatError) as info:
        read_dllogger("\n".join(lines), "r.json")
    assert [p.field for p in info.value.problems] == ["line 4", "line 8"]
    assert "not a DLLogger record" in info.value.problems[0].message
    assert "needs 'step'" in info.value.problems[1].message


def test_log_without_run_summary_is_incomplete(tmp_path, dllogger_program):
    raport, log, _, proc = dllogger_program(tmp_path, "--stop-after", "12", check=False)
    assert proc.returncode == 3
    ev = evaluate(output(raport), DLL)
    assert [f.kind for f in ev.failures] == ["incomplete"]
    assert "run summary" in ev.reason and f"line {len(raport.read_text().splitlines())}" in \
        ev.reason
    # figures of what it logged are there; require_end = false accepts them
    assert ev.figures.metrics["iterations"] == 7
    assert evaluate(output(raport), FiguresConfig(parser="dllogger", require_end=False)).ok


def test_nan_loss_fails_only_where_declared(programs):
    raport, log, _ = programs["nan"]
    for path in (raport, log):
        m = evaluate(output(path), DLL).figures.metrics
        assert math.isnan(m["train.loss"])
    bounded = FiguresConfig(parser="dllogger", bounds={"train.loss": {"upper": 100.0}})
    ev = evaluate(output(raport), bounded)
    assert not ev.ok and ev.failures[0].kind == "nonfinite"
    assert "train.loss is nan, not a finite number" in ev.reason


def test_no_dllogger_records_at_all():
    ev = evaluate(CellOutput("hello\nworld\n", "log.txt", None, {"mode": "train"}), DLL)
    assert not ev.ok
    assert ev.reason == "log.txt: no DLLogger records (no DLLL or DLL lines)"
    relaxed = FiguresConfig(parser="dllogger", require_end=False)
    assert evaluate(CellOutput("hello\n", params={"mode": "train"}), relaxed).reason == (
        "the program exited 0 but produced no figure train.total_ips "
        "(no DLLogger records in log.txt)")


@pytest.mark.parametrize(("print_freq", "epochs", "iterations"), [(1, 1, 20), (3, 2, 9)])
def test_raport_of_dle_own_logger(tmp_path, dllogger_program, print_freq, epochs, iterations):
    """The raport DLE's own Logger/TrainingMetrics write (its per-interval means, its two
    verbosity levels, its epoch and run summaries)."""
    raport, log, truth_file, _ = dllogger_program(
        tmp_path, "--dle-logger", str(dle_logger_path()), "--print-freq", str(print_freq),
        "--epochs", str(epochs), "--iterations", str(iterations), "--batch-size", "64")
    truth = json.loads(truth_file.read_text())
    ev = evaluate(output(raport, warmup=3), DLL)
    assert ev.ok, ev.reason
    m = ev.figures.metrics
    want = expected(truth, "train", 3)
    assert m["train.total_ips"] == pytest.approx(want["train.total_ips"], rel=1e-9)
    assert m["train.compute_ips"] == pytest.approx(want["train.compute_ips"], rel=1e-9)
    assert m["iterations"] == epochs * iterations - 3 and m["global_batch_size"] == 64
    assert ("train.compute_latency_at99" in m) == (print_freq == 1)
    # DLE's own figure: the mean of its per-iteration ips, warmup included
    ips = [64 / (d + c) for d, c in zip(truth["train"]["data"], truth["train"]["compute"],
                                         strict=True)]
    assert m["dle.train.total_ips"] == pytest.approx(wm.mean(ips), rel=1e-9)
    from_log = evaluate(output(log, warmup=3), DLL).figures.metrics["train.total_ips"]
    if print_freq == 1:
        assert from_log == pytest.approx(m["train.total_ips"], rel=1e-5)
    else:  # interval means of ips, no times on stdout: an upper bound
        assert from_log >= m["train.total_ips"] * (1 - 1e-5)


# --- our workload's JSON lines -------------------------------------------------------------


def workload_log(summary_data: dict | None, error: str | None = None) -> str:
    """Lines as the workload's own Reporter writes them (non-finite floats become null)."""
    buf = io.StringIO()
    rep = Reporter(buf)
    buf.write("# python -m workload ...\nsome warning\n")
    rep.emit({"type": "meta", "env": {"device": "cpu", "arch": "resnet18"}})
    rep.emit({"type": "iter", "step": 1, "data": {"train.total_ips": 10.0}})
    if error:
        rep.emit({"type": "error", "message": error})
    if summary_data is not None:
        rep.emit({"type": "summary", "status": "ok", "data": summary_data,
                  "iteration_times": [0.1, 0.2], "env": {"device": "cpu", "hostname": "h"}})
    return buf.getvalue()


def test_workload_summary_is_the_figures():
    out = CellOutput(workload_log({"train.total_ips": 123.0, "train.loss": 2.0}),
                     params={"mode": "train"})
    ev = evaluate(out)
    assert ev.ok
    assert ev.figures.metrics == {"train.total_ips": 123.0, "train.loss": 2.0,
                                  "iteration_times": [0.1, 0.2]}
    assert ev.figures.env == {"device": "cpu", "hostname": "h"}
    assert [r["type"] for r in ev.figures.records] == ["meta", "iter", "summary"]


@pytest.mark.parametrize("hostile", ["[" * 200_000 + "]" * 200_000,
                                     '{"type": "note", "n": ' + "7" * 5000 + "}",
                                     '{"type": "note", "deep": ' + "[" * 150 + "]" * 150 + "}"])
def test_a_hostile_json_line_in_the_output_does_not_fail_an_ok_cell(hostile):
    """Issue 24, item 8: a 200k-deep JSON line or a 5000-digit integer among a program's lines
    failed an ok cell with a traceback; such a line is no metric line, and is skipped."""
    log = workload_log({"train.total_ips": 123.0})
    ev = evaluate(CellOutput(hostile + "\n" + log + hostile + "\n", params={"mode": "train"}))
    assert ev.ok, ev.reason
    assert ev.figures.metrics["train.total_ips"] == 123.0


@pytest.mark.parametrize(("date", "why"), [("2024-13-45 10:00:00", "is not a date"),
                                           ("0000-01-01 00:00:00", "is not a date"),
                                           ("2150-01-01 00:00:00", "from 1970 to 2099")])
def test_a_bad_dllogger_date_fails_the_cell_naming_its_line(date, why):
    text = (f"DLL 2026-01-01 00:00:00 - PARAMETER arch : resnet50  batch_size : 64\n"
            f"DLL {date} - Epoch: 0 Iteration: 1  train.total_ips : 1000 images/s\n")
    ev = evaluate(CellOutput(text, params={"mode": "train"}), FiguresConfig(parser="dllogger"))
    assert not ev.ok and ev.failures[0].problem is not None
    assert ev.failures[0].problem.field == "line 2" and why in ev.reason


def test_workload_without_summary_fails_with_the_old_reason():
    ev = evaluate(CellOutput(workload_log(None), params={"mode": "train"}))
    assert ev.reason == "the workload exited 0 but printed no summary line"
    assert ev.figures.env == {"device": "cpu", "arch": "resnet18"}  # from the meta line


def test_workload_nan_throughput_fails():
    ev = evaluate(CellOutput(workload_log({"train.total_ips": float("inf")}),
                             params={"mode": "train"}))
    assert not ev.ok and ev.failures[0].kind == "nonfinite"
    assert "null (NaN or infinite" in ev.reason


def test_failed_program_keeps_its_error_message_and_is_not_judged():
    ev = evaluate(CellOutput(workload_log(None, error="CUDA out of memory"),
                             params={"mode": "train"}), exited_ok=False)
    assert ev.ok and ev.figures.program_error == "CUDA out of memory"


def test_infer_cell_requires_val_total_ips():
    out = CellOutput(workload_log({"train.total_ips": 1.0}), params={"mode": "infer"})
    assert "no figure val.total_ips" in evaluate(out).reason


def test_from_cell_dir_reads_from_the_attempts_offset(tmp_path):
    first = workload_log({"train.total_ips": 1.0})
    (tmp_path / "log.txt").write_text(first + workload_log(None))
    out = CellOutput.from_cell_dir(tmp_path, {"mode": "train"}, log_offset=len(first.encode()))
    assert evaluate(out).reason == "the workload exited 0 but printed no summary line"
    assert evaluate(CellOutput.from_cell_dir(tmp_path, {"mode": "train"})).ok


# --- regex figures ---------------------------------------------------------------------------

LOG = """\
epoch 1 throughput: 90.0 img/s latency 12.0 ms
epoch 2 throughput: 100.0 img/s latency 10.0 ms
epoch 3 throughput: 110.0 img/s latency 11.0 ms
epoch 4 throughput: 130.0 img/s latency 9.0 ms
done
"""


def regex(**fig) -> FiguresConfig:
    fig.setdefault("name", "train.total_ips")
    fig.setdefault("pattern", r"throughput: (?P<value>[0-9.]+) img/s")
    return FiguresConfig(parser="regex", regex=[fig])


@pytest.mark.parametrize(("which", "warmup", "value"), [
    ("last", 0, 130.0), ("first", 0, 90.0), ("first", 1, 100.0), ("mean", 1, 340.0 / 3),
    ("median", 0, 105.0), ("median", 1, 110.0), ("all", 2, [110.0, 130.0]),
])
def test_regex_which_match_and_warmup(which, warmup, value):
    ev = evaluate(CellOutput(LOG), regex(which=which, warmup=warmup))
    assert ev.ok, ev.reason
    assert ev.figures.metrics["train.total_ips"] == pytest.approx(value)


def test_regex_scale_unit_and_unnamed_group():
    config = FiguresConfig(parser="regex", regex=[
        {"name": "latency_s", "pattern": r"latency ([0-9.]+) ms", "unit": "s",
         "scale": 0.001, "which": "median"},
        {"name": "train.total_ips", "pattern": r"throughput: ([0-9.]+)"},
    ])
    ev = evaluate(CellOutput(LOG), config)
    assert ev.figures.metrics["latency_s"] == pytest.approx(0.0105)
    assert ev.figures.units == {"latency_s": "s"}


def test_regex_figure_missing_or_all_warmup():
    ev = evaluate(CellOutput(LOG), regex(pattern=r"tput=(?P<value>\d+)"))
    assert ev.reason == ("the program exited 0 but produced no figure train.total_ips "
                         "(0 matches of its pattern in log.txt)")
    ev = evaluate(CellOutput(LOG), regex(warmup=4))
    assert "(4 matches of its pattern in log.txt, 4 dropped as warmup)" in ev.reason


def test_regex_capture_that_is_no_number_names_its_line():
    ev = evaluate(CellOutput(LOG), regex(pattern=r"epoch (?P<value>\d) (\w+)"))
    assert ev.ok  # digits only
    ev = evaluate(CellOutput(LOG), regex(pattern=r"epoch 3 (?P<value>\w+)"))
    assert not ev.ok and ev.failures[0].kind == "format"
    assert ev.failures[0].problem.field == "line 3" and "'throughput' is not a number" in \
        ev.reason


def test_regex_on_a_cell_file_and_next_to_another_parser(tmp_path):
    (tmp_path / "log.txt").write_text(workload_log({"train.total_ips": 5.0}))
    (tmp_path / "power.log").write_text("power 100 W\npower 300 W\npower 200 W\n")
    config = FiguresConfig(regex=[{"name": "gpu.power_w", "pattern": r"power (\d+) W",
                                   "which": "mean", "file": "power.log", "unit": "W"}])
    ev = evaluate(CellOutput.from_cell_dir(tmp_path, {"mode": "train"}), config)
    assert ev.ok, ev.reason
    assert ev.figures.metrics["gpu.power_w"] == 200.0
    assert ev.figures.metrics["train.total_ips"] == 5.0  # the workload parser's


def test_regex_nan_capture_fails():
    ev = evaluate(CellOutput("tput nan\n"), regex(pattern=r"tput (?P<value>\S+)"))
    assert not ev.ok and "train.total_ips is nan" in ev.reason


@pytest.mark.timeout(60)
def test_a_backtracking_pattern_cannot_hang_the_parse():
    """Issue 24, item 4: with Python's re this pattern takes 2**40 steps on the first line (the
    sweep hung after the cell ended, SIGTERM ignored); RE2 reads the log in linear time."""
    text = "1" + "a" * 40 + "b\n12aaa\n"
    ev = evaluate(CellOutput(text), regex(pattern=r"(?P<value>[0-9]+)(a+)+$"))
    assert ev.ok and ev.figures.metrics["train.total_ips"] == 12.0


#: A training log of about 1 MiB: a number on every line, words around it.
BIG_LOG = "".join(f"step {i} loss 0.{i % 97:02d} ips {1000 + i % 13}.5\n" for i in range(36000))
#: Its first 600 lines.
SMALL_LOG = "".join(BIG_LOG.splitlines(keepends=True)[:600])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("pattern", [r"(?P<value>)", r"(?P<value>[a-z]+)", r"(?P<value>\w*)"])
def test_a_pattern_matching_everywhere_but_no_number_stops_at_a_few_reports(pattern):
    """Issue 34, item 1: each match that was not a number rescanned the whole log for its line
    number (matches x log size: a 1 MiB log ran for more than 200 s, the sweep hung after the
    cell had ended). Now the line numbers come from one pass and the figure is not read further
    after NOT_NUMBERS_SHOWN such matches: the cell fails at once, naming the first lines."""
    ev = evaluate(CellOutput(BIG_LOG), regex(pattern=pattern))
    assert not ev.ok and {f.kind for f in ev.failures} == {"format"}
    assert len(ev.failures) == fp.NOT_NUMBERS_SHOWN
    assert ev.failures[0].problem.field == "line 1"
    assert "not read further" in ev.failures[-1].message


def test_line_numbers_of_matches_that_are_no_number_are_counted_in_one_pass():
    text = "ips 1\nips 2\n\nips x\nips 3\n\n\nips y\n"
    ev = evaluate(CellOutput(text), regex(pattern=r"ips (?P<value>\w+)"))
    assert [f.problem.field for f in ev.failures] == ["line 4", "line 8"]


def test_a_pattern_matching_more_than_the_limit_fails_its_figure_saying_so(monkeypatch):
    monkeypatch.setattr(fp, "MATCHES_READ", 1000)
    ev = evaluate(CellOutput(BIG_LOG), regex(pattern=r"ips (?P<value>[0-9.]+)"))
    assert not ev.ok
    assert ev.reason == ("the program exited 0 but produced no figure train.total_ips (its "
                         "pattern matches more than 1,000 times in log.txt, the most a figure "
                         "reads: make it match only the lines that state the figure)")
    ev = evaluate(CellOutput(SMALL_LOG), regex(pattern=r"ips (?P<value>[0-9.]+)"))
    assert ev.ok  # under the limit


def test_a_result_keeps_at_most_values_kept_numbers_and_says_what_it_left_out(monkeypatch):
    """``which = "all"`` on a pattern that matches every line kept every number: 4 million
    matches made a 45 MB result.json. A cell's figures keep VALUES_KEPT numbers, in order; the
    result says what was left out (provenance.figures: notes, values_left_out)."""
    monkeypatch.setattr(fp, "VALUES_KEPT", 100)
    config = FiguresConfig(parser="regex", regex=[
        {"name": "a.first", "pattern": r"^step (?P<value>\d+) ", "which": "first"},
        {"name": "b.all", "pattern": r"ips (?P<value>[0-9.]+)", "which": "all"},
        {"name": "c.last", "pattern": r"loss (?P<value>[0-9.]+)"},
    ], required=["a.first"])
    ev = evaluate(CellOutput(SMALL_LOG), config)
    assert ev.ok, ev.reason
    metrics = ev.figures.metrics
    assert metrics["a.first"] == 0 and len(metrics["b.all"]) == 99 and "c.last" not in metrics
    info = ev.figures.info()
    assert info["values_left_out"] == 600 - 99 + 1
    assert any("b.all: its first 99 of" in n for n in info["notes"])
    assert any("a result keeps at most 100" in n and "c.last" in n for n in info["notes"])


def test_figures_are_read_from_the_end_of_a_log_longer_than_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(fp, "READ_BYTES", 1000)
    (tmp_path / "log.txt").write_text("x" * 5000 + "\n" + workload_log({"train.total_ips": 5.0}))
    output = CellOutput.from_cell_dir(tmp_path, {"mode": "train"})
    assert len(output.log_text.encode()) == 1000 and output.log_cut > 0
    ev = evaluate(output)
    assert ev.ok, ev.reason
    assert any("figures read from the last" in n for n in ev.figures.notes)


@pytest.mark.timeout(30)
def test_a_fifo_where_a_figure_file_should_be_fails_the_cell_without_blocking(tmp_path):
    (tmp_path / "log.txt").write_text("")
    os.mkfifo(tmp_path / "power.log")
    config = FiguresConfig(parser="regex", regex=[
        {"name": "gpu.power_w", "pattern": r"power (\d+) W", "file": "power.log"}])
    ev = evaluate(CellOutput.from_cell_dir(tmp_path), config)
    assert not ev.ok and "power.log: not a regular file" in ev.reason
    os.remove(tmp_path / "log.txt")
    os.mkfifo(tmp_path / "log.txt")
    with pytest.raises(LogFormatError, match="log.txt: not a regular file"):
        CellOutput.from_cell_dir(tmp_path)


@pytest.mark.parametrize("pattern", [r"(?P<value>\d+) \1", r"(?<=ips )(?P<value>\d+)",
                                     r"(?P<value>\d+)(?= img)"])
def test_patterns_outside_re2_syntax_are_refused_saying_so(pattern):
    ((field, message),) = problems({"regex": [{"name": "a", "pattern": pattern}]})
    assert field == "regex[0].pattern"
    assert "backreferences and lookaround are not part of RE2's syntax" in message


# --- success criteria: bounds ----------------------------------------------------------------


def test_bounds_lower_and_upper():
    base = {"name": "train.total_ips", "pattern": r"throughput: (?P<value>[0-9.]+)"}
    ok = FiguresConfig(parser="regex", regex=[base], bounds={"train.total_ips": {
        "lower": 100, "upper": 200}})
    assert evaluate(CellOutput(LOG), ok).ok
    low = FiguresConfig(parser="regex", regex=[base], bounds={"train.total_ips": {
        "lower": 131.0}})
    ev = evaluate(CellOutput(LOG), low)
    assert ev.failures[0].kind == "bounds"
    assert ev.reason == "figure train.total_ips = 130 is below its declared lower bound 131"
    high = FiguresConfig(parser="regex", regex=[{**base, "which": "all"}],
                         bounds={"train.total_ips": {"upper": 120.0}})
    assert evaluate(CellOutput(LOG), high).reason == (
        "figure train.total_ips = 130 is above its declared upper bound 120")


def test_bounds_on_an_absent_optional_figure_do_not_fail():
    config = FiguresConfig(bounds={"val.compute_latency_at99": {"upper": 1.0}})
    out = CellOutput(workload_log({"train.total_ips": 1.0}), params={"mode": "train"})
    assert evaluate(out, config).ok


def test_required_list_replaces_the_default():
    config = FiguresConfig(required=["train.loss"])
    out = CellOutput(workload_log({"train.loss": 1.0}), params={"mode": "train"})
    assert evaluate(out, config).ok
    out = CellOutput(workload_log({"train.total_ips": 1.0}), params={"mode": "train"})
    assert "no figure train.loss" in evaluate(out, config).reason


# --- declarations --------------------------------------------------------------------------


def problems(data: dict) -> list[tuple[str, str]]:
    with pytest.raises(ValidationError) as info:
        FiguresConfig.model_validate(data)
    return [(p.field, p.message) for p in problems_from_validation("m.toml", info.value)]


def test_declaration_problems_each_with_its_field():
    found = problems({
        "parser": "regexp",
        "regex": [
            {"name": "a", "pattern": "(unclosed"},
            {"name": "b", "pattern": "no group"},
            {"name": "c", "pattern": r"(\d+) (\d+)"},
            {"name": "d", "pattern": r"(\d+)", "which": "max", "scale": 0.0, "colour": 1},
        ],
        "bounds": {"x": {"lower": 2.0, "upper": 1.0}, "y": {}},
        "warmup": -1,
    })
    fields = dict(found)
    assert "parser" in fields and "Input should be" in fields["parser"]
    assert "does not compile" in fields["regex[0].pattern"]
    assert "no group capturing the number" in fields["regex[1].pattern"]
    assert "2 groups" in fields["regex[2].pattern"]
    assert "regex[3].which" in fields and "regex[3].colour" in fields
    assert "unknown key" in fields["regex[3].colour"]
    assert "lower (2) is above upper (1)" in fields["bounds.x"]
    assert "give lower, upper or both" in fields["bounds.y"]
    assert "warmup" in fields


def test_declaration_consistency_rules():
    assert "needs at least one" in problems({"parser": "regex"})[0][1]
    assert "applies to parser 'dllogger' only" in problems({"raport": "r.json"})[0][1]
    assert "unique" in problems({"regex": [{"name": "a", "pattern": "(1)"},
                                           {"name": "a", "pattern": "(2)"}]})[0][1]
    assert "relative to the cell folder" in problems(
        {"parser": "dllogger", "raport": "../x.json"})[0][1]
    assert problems({"parser": "dllogger", "warmup": "5"})[0][0] == "warmup"  # strict


def test_figures_file(tmp_path):
    good = tmp_path / "f.toml"
    good.write_text('[figures]\nparser = "dllogger"\nwarmup = 3\n'
                    '[figures.bounds]\n"train.total_ips" = { lower = 1.0 }\n')
    assert load_figures_file(good).warmup == 3
    bad = tmp_path / "bad.toml"
    bad.write_text('[figures]\nparser = "dllogger"\nwarmpu = 3\n[other]\n')
    with pytest.raises(ConfigError) as info:
        load_figures_file(bad)
    assert "unknown tables: other" in str(info.value)
    bad.write_text('[figures]\nparser = "dllogger"\nwarmpu = 3\n')
    with pytest.raises(ConfigError) as info:
        load_figures_file(bad)
    (p,) = info.value.problems
    assert (p.file, p.field) == (str(bad), "figures.warmpu") and "unknown key" in p.message


def test_parse_figures_raises_for_a_malformed_log():
    with pytest.raises(LogFormatError):
        parse_figures(CellOutput('DLLL {"broken'), DLL)


def test_many_malformed_lines_are_counted_after_the_first_twenty(programs):
    raport, _, _ = programs["train"]
    lines = raport.read_text().splitlines()
    bad = [line[:30] if 10 <= i < 40 else line for i, line in enumerate(lines)]
    with pytest.raises(LogFormatError) as info:
        read_dllogger("\n".join(bad), "r.json")
    found = info.value.problems
    assert len(found) == 21 and found[0].field == "line 11" and found[19].field == "line 30"
    assert found[20].message == "... and 10 more malformed lines"


def test_validation_pass_shorter_than_the_warmup_gives_no_val_figures(programs):
    raport, _, _ = programs["train"]  # 30 training, 20 validation iterations
    ev = evaluate(output(raport, warmup=20), DLL)
    assert ev.ok and ev.figures.metrics["iterations"] == 10
    assert not any(k.startswith("val.") for k in ev.figures.metrics)
    assert "no val figures: all 20 val iterations in train.json are warmup (20)" in \
        ev.figures.notes


def test_the_documented_example_is_valid(tmp_path):
    import textwrap

    from orchestrator.results.figures import figure_parsers

    example = figure_parsers.__doc__.split("::\n", 1)[1]
    path = tmp_path / "figures.toml"
    path.write_text(textwrap.dedent(example))
    config = load_figures_file(path)
    assert config.parser == "dllogger" and config.regex[0].which == "median"
    assert config.bounds["val.compute_latency_at99"].upper == 0.5
