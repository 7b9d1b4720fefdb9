"""Plots are drawn from run folders on disk (matplotlib: the `plots` extra, installed by make)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.results.folders.run_folder import CellResult, RunPaths, Status, write_json
from orchestrator.results.reports.summary import GroupRow

pytest.importorskip("matplotlib", reason="the plots extra is not installed")

PNG = b"\x89PNG\r\n\x1a\n"


def write_run(root: Path, run_id: str, scale: float = 1.0) -> RunPaths:
    paths = RunPaths.create(root, "scaling", run_id)
    write_json(paths.plan, {"cells": [], "varying": ["gpus", "precision"], "repeats": 2})
    for precision, base in (("fp32", 400.0), ("amp", 1200.0)):
        for gpus in (1, 2, 4):
            group = f"v100-g{gpus}-{precision}"
            for rep, jitter in ((1, 1.0), (2, 1.01)):
                res = CellResult(
                    cell_id=f"{group}-r{rep}", group=group, repeat=rep, status=Status.OK,
                    params={"hardware": "v100", "gpus": gpus, "precision": precision},
                    metrics={"train.total_ips": base * gpus * 0.9 * scale * jitter},
                    env={"torch_version": "2.4.0", "device": "cuda",
                         "device_name": "Tesla V100"},
                )
                write_json(paths.cell_result(res.cell_id), res.to_json())
    return paths


def test_report_and_history_plots(tmp_path, capsys):
    for day in range(1, 5):
        write_run(tmp_path, f"2026110{day}-000000-aaaa")
    write_run(tmp_path, "20261105-000000-aaaa", scale=0.8)
    out = tmp_path / "scaling.png"
    assert main(["report", "scaling", "--results", str(tmp_path), "--plot", str(out)]) == 0
    assert out.read_bytes().startswith(PNG) and out.stat().st_size > 10_000
    trend = tmp_path / "trend.svg"
    assert main(["history", "scaling", "--results", str(tmp_path), "--plot", str(trend)]) == 0
    assert "<svg" in trend.read_text()[:500]
    assert "REGRESSION" in capsys.readouterr().out


def row(precision: str, batch: int, ips: float, ok: int, spread: float = 0.1) -> GroupRow:
    return GroupRow(f"cpu-{precision}-{batch}", {"hardware": "cpu", "precision": precision,
                                                   "batch_size": batch},
                    runs=ok, ok=ok, ips=ips, ips_min=ips * (1 - spread),
                    ips_max=ips * (1 + spread))


def axes_of(draw, rows):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from orchestrator.results.reports import plots

    fig, ax = plt.subplots()
    draw(ax, rows, plt)
    return fig, ax, plots


def test_bars_are_coloured_by_precision_with_error_bars_only_for_repeats():
    from orchestrator.results.reports.plots import _bars

    rows = [row("fp32", 8, 100.0, ok=3), row("bf16", 8, 150.0, ok=1), row("fp32", 16, 180.0, 3)]
    fig, ax, _ = axes_of(_bars, rows)
    bars = [p for p in ax.patches]
    assert len(bars) == 3
    assert bars[0].get_facecolor() == bars[2].get_facecolor() != bars[1].get_facecolor()
    (errors,) = ax.containers[1:]  # one errorbar container beside the bars
    segments = errors.lines[2][0].get_segments()
    assert len(segments) == 2  # the two repeated rows, not the single measurement
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["precision fp32",
                                                                    "precision bf16"]
    assert ax.get_xscale() == "linear"


def test_values_spanning_decades_get_a_log_scale():
    from orchestrator.results.reports.plots import _bars, spans_decades

    rows = [row("fp32", 1, 5.0, ok=1), row("fp32", 256, 4000.0, ok=1)]
    _, ax, _ = axes_of(_bars, rows)
    assert ax.get_xscale() == "log"
    assert spans_decades([1.0, 11.0]) and not spans_decades([1.0, 9.0, None])


def test_subtitle_names_the_stack_and_repeats():
    from orchestrator.results.reports.plots import stack_line

    line = stack_line({"torch": ["2.4.0"], "cuda": ["12.4"], "gpu": ["NVIDIA H100"],
                       "host": ["dgx1", "dgx2"]}, 5)
    assert line == "torch 2.4.0 · CUDA 12.4 · NVIDIA H100 · host dgx1 +1 more · 5 repeats"


def test_a_flag_axis_is_labelled_with_its_name():
    """Seen on the H100 sweep (2026-11-25): h100_speed's cuda_graphs rows were labelled 'False'
    and 'True', which says nothing; a bool (or missing) value carries its key."""
    from orchestrator.results.reports.plots import _label

    assert _label({"batch_size": 256, "cuda_graphs": True}, ["batch_size", "cuda_graphs"]) \
        == "bs256 cuda_graphs=True"
    assert _label({"precision": "amp", "gpus": 8}, ["gpus", "precision"]) == "g8 amp"


def test_the_subtitle_counts_the_repeats_that_ran(tmp_path):
    """Seen on the H100 sweep: `--only repeat=1` of a 3-repeat matrix ran one repeat, yet the
    plot and the HTML report said '3 repeats' (the plan's number)."""
    from orchestrator.results.reports.report_html import repeats_of

    one = [CellResult(cell_id=f"c{i}-r1", group=f"c{i}", repeat=1, status=Status.OK)
           for i in range(3)]
    assert repeats_of(one) == 1
    assert repeats_of([*one, CellResult(cell_id="c0-r2", group="c0", repeat=2,
                                        status=Status.OK)]) == 2
    assert repeats_of([]) is None


def history_axes(tmp_path: Path, configs: list[dict], monkeypatch) -> tuple[object, list[str]]:
    """The axes plot_history draws for 4 runs of ``configs`` (captured before saving), and the
    runs' ids."""
    from results_support import Config, day, write_run

    from orchestrator.results.folders.store import open_store
    from orchestrator.results.reports import plots
    from orchestrator.results.reports.history import Options, analyze

    ids = [f"20261127-1541{n:02d}-ab{n:02d}" for n in range(1, 5)]  # one minute: issue 31
    for n, run in enumerate(ids, start=1):
        write_run(tmp_path, "m", run, [Config(p, [100.0 * (i + 1)] * 3)
                                       for i, p in enumerate(configs)], started=day(n))
    seen = {}

    def keep(plt, fig, ax, out, fmt):
        seen["ax"] = ax
        plt.close(fig)
        return out

    monkeypatch.setattr(plots, "_save", keep)
    with open_store(tmp_path) as store:
        report = analyze(store, "m", Options())
    plots.plot_history(report, tmp_path / "h.png", "m")
    return seen["ax"], ids


def test_history_lines_that_differ_only_in_batch_size_look_different(tmp_path, monkeypatch):
    """Issue 31: lines that differed only in batch size shared one colour and marker, and the
    x labels were cut to the minute (20261127-1541 four times)."""
    from results_support import params

    batches = [params(batch_size=b) for b in (64, 128, 256)]
    ax, ids = history_axes(tmp_path / "a", batches, monkeypatch)
    looks = [(ln.get_color(), ln.get_marker(), ln.get_linestyle()) for ln in ax.get_lines()
             if ln.get_label() and not ln.get_label().startswith("_")]
    assert len(looks) == 3 and len(set(looks)) == 3
    assert len({c for c, _, _ in looks}) == 3  # nothing else varies: a colour each
    assert [t.get_text() for t in ax.get_xticklabels()] == ids  # whole run ids, all different


def test_history_lines_of_one_colour_differ_by_marker(tmp_path, monkeypatch):
    from results_support import params

    configs = [params(batch_size=b, precision=p) for p in ("amp", "fp32") for b in (64, 128, 256)]
    ax, _ = history_axes(tmp_path / "b", configs, monkeypatch)
    lines = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
    looks = {(ln.get_color(), ln.get_marker(), ln.get_linestyle()) for ln in lines}
    assert len(lines) == 6 and len(looks) == 6
    assert len({ln.get_color() for ln in lines}) == 2  # colour still says precision


def test_line_styles_stay_distinct_beyond_the_colour_cycle():
    import matplotlib.pyplot as plt

    from orchestrator.results.reports.plots import line_styles

    many = [{"batch_size": b} for b in range(1, 26)]
    assert len(set(line_styles(many, plt))) == 25
    one_colour = [{"precision": "amp" if b else "fp32", "batch_size": b} for b in range(41)]
    assert len(set(line_styles(one_colour, plt))) == 41  # 40 of one colour: 10 markers x 4
