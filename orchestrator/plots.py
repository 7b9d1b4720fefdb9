"""Plots of a run or of a matrix's history (matplotlib, an optional extra: ``.[plots]``).

Like the tables, every plot is built only from what is on disk:

- :func:`plot_run`: with a ``gpus`` axis, images/s against GPU count per configuration with the
  ideal linear-scaling line from its 1-GPU point; otherwise one bar per cell group (median over
  repeats, min..max as error bars).
- :func:`plot_history`: each configuration's median images/s across runs, regressions marked.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.errors import OrchestratorError
from orchestrator.history import Trend
from orchestrator.results import RunPaths
from orchestrator.summary import GroupRow, varying_keys


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise OrchestratorError(
            "plots need matplotlib: pip install -e '.[plots]' (or pip install matplotlib)"
        ) from exc
    return plt


_PREFIX = {"gpus": "g", "batch_size": "bs", "image_size": "px"}


def _label(params: dict[str, Any], keys: Sequence[str]) -> str:
    return " ".join(f"{_PREFIX.get(k, '')}{params[k]}" for k in keys) or "all"


def _spread(row: GroupRow) -> tuple[float, float]:
    """How far the slowest and the fastest repeat lie below and above a row's median."""
    assert row.ips is not None
    return row.ips - (row.ips_min or row.ips), (row.ips_max or row.ips) - row.ips


def plot_run(rows: Sequence[GroupRow], out: Path, title: str) -> Path:
    """Scaling plot (gpus axis) or bar chart of a run's groups; writes ``out`` (png/svg/pdf)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    gpus = sorted({r.params["gpus"] for r in rows if "gpus" in r.params})
    if len(gpus) > 1:
        series_keys = varying_keys([r.params for r in rows], exclude=("gpus",))
        series: dict[str, list[GroupRow]] = {}
        for r in rows:
            series.setdefault(_label(r.params, series_keys), []).append(r)
        for label, items in series.items():
            items = sorted((r for r in items if r.ips is not None),
                           key=lambda r: r.params["gpus"])
            if not items:
                continue
            xs = [r.params["gpus"] for r in items]
            line = ax.plot(xs, [r.ips for r in items], marker="o", label=label)[0]
            one = next((r.ips for r in items if r.params["gpus"] == 1), None)
            if one:
                ax.plot(xs, [one * x for x in xs], linestyle=":", color=line.get_color(),
                        alpha=0.6)
        ax.set_xlabel("GPUs")
        ax.set_xticks(gpus)
        ax.set_ylabel("images/s (median over repeats; dotted: linear scaling)")
        ax.legend(fontsize=8)
    else:
        keys = varying_keys([r.params for r in rows]) or ["hardware"]
        good = [r for r in rows if r.ips is not None]
        labels = [_label(r.params, keys) for r in good]
        values = [r.ips for r in good]
        spreads = [_spread(r) for r in good]
        errors = [[below for below, _ in spreads], [above for _, above in spreads]]
        ax.barh(labels, values, xerr=errors, capsize=3)
        for i, r in enumerate(good):
            text = f"{r.ips:,.1f}" + (f"  ({r.ratio:.2f}x)" if r.ratio is not None else "")
            ax.text(r.ips, i, f" {text}", va="center", fontsize=8)
        ax.invert_yaxis()
        ax.margins(x=0.15)
        ax.set_xlabel("images/s (median over repeats; bars: min..max)")
    ax.set_title(title, fontsize=10)
    return _save(plt, fig, ax, out)


def plot_history(runs: Sequence[RunPaths], items: Sequence[Trend], out: Path, title: str
                 ) -> Path:
    """Median images/s per configuration across runs; the newest point of a regression in red."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 5), dpi=120)
    keys = varying_keys([t.params for t in items]) or ["hardware"]
    xs = list(range(len(runs)))
    for t in items:
        ys = [t.values.get(r.run_id) for r in runs]
        points = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
        if not points:
            continue
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                label=_label(t.params, keys))
        if t.regression and ys[-1] is not None:
            ax.plot([xs[-1]], [ys[-1]], marker="o", markersize=12, fillstyle="none",
                    color="red")
    ax.set_xticks(xs, [r.run_id[:13] for r in runs], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("images/s (median over repeats)")
    ax.set_title(title + " (red circle: regression)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(plt, fig, ax, out)


def _save(plt: Any, fig: Any, ax: Any, out: Path) -> Path:
    """Grid, layout, write ``out`` (format from its suffix) and free the figure."""
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
