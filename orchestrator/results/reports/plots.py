"""Plots of a run, of a matrix's history and of a comparison (matplotlib: the ``plots`` extra).

Like the tables, every plot is built only from what is on disk. Rules they share:

* **Colour** says precision where precision varies, else hardware where it varies (one legend
  entry per colour); the other varying parameters are in the labels. Where each line is a
  configuration (history), the lines of one colour differ by marker and dash
  (:func:`line_styles`): no two configurations look alike.
* **Subtitle**: the stack the numbers come from and the repeat count (:func:`stack_line`).
* **Error bars** (min..max over repeats) only where a configuration has 2 or more ok repeats:
  a single measurement has no spread to show.
* **Log scale** on the value axis when the values span more than a decade.

:func:`plot_run`: with a ``gpus`` axis, images/s against GPU count per configuration with the
ideal linear-scaling line from its 1-GPU point; otherwise one horizontal bar per configuration.
:func:`plot_history`: each configuration's median across runs, the newest point of a
regression circled. :func:`plot_compare`: the change of each configuration with its interval.
Every function writes ``out``: a path (format from its suffix) or a binary file object
(``fmt``: ``svg`` or ``png``), so reports can inline the picture.

:func:`draw_summary` draws a run folder's ``summary.png`` from its results on disk, the last
thing a sweep writes; :func:`warm` imports matplotlib ahead (a sweep calls it in a thread while
its cells run: the import is most of a plot's cost).
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from orchestrator.errors import OrchestratorError
from orchestrator.results.folders.run_folder import RunPaths, replacing, write_bytes
from orchestrator.results.reports.summary import GroupRow, summarize_run, varying_keys

if TYPE_CHECKING:
    from orchestrator.results.reports.compare import Comparison
    from orchestrator.results.reports.history import HistoryReport

Target = Path | str | IO[bytes]


def warm() -> None:
    """Import matplotlib and pyplot now (a sweep does it in a thread while its cells run), so
    that a later plot starts drawing at once; nothing where matplotlib is not installed."""
    with contextlib.suppress(OrchestratorError):
        _pyplot()


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise OrchestratorError(
            "plots need matplotlib: pip install -e '.[plots]' (or pip install matplotlib)"
        ) from exc
    plt.rcParams["svg.fonttype"] = "path"  # self-contained SVG: no font needed to view it
    plt.rcParams["svg.hashsalt"] = "orchestrate"  # stable ids: same input, same file
    return plt


_PREFIX = {"gpus": "g", "batch_size": "bs", "image_size": "px"}
_COLOUR_KEYS = ("precision", "hardware")


def _part(key: str, value: Any) -> str:
    """``bs256``, ``amp``; a flag's bare True/False says nothing, so ``cuda_graphs=True``."""
    if isinstance(value, bool) or value is None:
        return f"{key}={value}"
    return f"{_PREFIX.get(key, '')}{value}"


def _label(params: Mapping[str, Any], keys: Sequence[str]) -> str:
    return " ".join(_part(k, params[k]) for k in keys if k in params) or "all"


def colour_key(params: Sequence[Mapping[str, Any]]) -> str | None:
    """The parameter colours stand for: precision if it varies, else hardware, else none."""
    for key in _COLOUR_KEYS:
        if len({repr(p.get(key)) for p in params}) > 1:
            return key
    return None


def _colours(params: Sequence[Mapping[str, Any]], key: str | None, plt: Any) -> list[str]:
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    if key is None:
        return [cycle[0]] * len(params)
    values: list[str] = []
    for p in params:
        if str(p.get(key)) not in values:
            values.append(str(p.get(key)))
    return [cycle[values.index(str(p.get(key))) % len(cycle)] for p in params]


#: Markers and dashes that tell apart the lines of one colour.
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
_DASHES: tuple[Any, ...] = ("-", "--", "-.", ":")


def line_styles(params: Sequence[Mapping[str, Any]], plt: Any) -> list[tuple[str, str, Any]]:
    """A (colour, marker, dash) per line, each line its own: the colour from the colour key
    (:func:`colour_key`; none varying: a colour per line), the marker and dash numbering the
    lines that share a colour (10 markers, then the next dash)."""
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    key = colour_key(params)
    out: list[tuple[str, str, Any]] = []
    if key is None:
        for i in range(len(params)):
            nth = i // len(cycle)
            out.append((cycle[i % len(cycle)], _MARKERS[nth % len(_MARKERS)],
                        _DASHES[nth // len(_MARKERS) % len(_DASHES)]))
        return out
    groups: list[str] = []
    members: dict[str, int] = {}
    for p in params:
        value = str(p.get(key))
        if value not in groups:
            groups.append(value)
        nth = members.get(value, 0)
        members[value] = nth + 1
        out.append((cycle[groups.index(value) % len(cycle)], _MARKERS[nth % len(_MARKERS)],
                    _DASHES[nth // len(_MARKERS) % len(_DASHES)]))
    return out


def spans_decades(values: Sequence[float | None]) -> bool:
    """True when the positive values span more than a factor of 10."""
    vals = [v for v in values if v is not None and v > 0]
    return len(vals) > 1 and max(vals) / min(vals) > 10.0


def stack_line(stacks: Mapping[str, Sequence[str]], repeats: int | None) -> str:
    """``torch 2.4.0 · CUDA 12.4 · driver 550.54 · NVIDIA H100 · host dgx1 · 5 repeats``."""
    parts = []
    for name, prefix in (("image", "image "), ("torch", "torch "), ("cuda", "CUDA "),
                         ("driver", "driver "), ("gpu", ""), ("host", "host ")):
        values = list(stacks.get(name, ()))
        if values:
            shown = values[0] if len(values) == 1 else f"{values[0]} +{len(values) - 1} more"
            parts.append(prefix + shown)
    if repeats:
        parts.append(f"{repeats} repeat{'s' if repeats != 1 else ''}")
    return " · ".join(parts)


def _legend_for_colours(ax: Any, params: Sequence[Mapping[str, Any]], key: str | None,
                        plt: Any) -> None:
    if key is None:
        return
    from matplotlib.patches import Patch

    seen: dict[str, str] = {}
    for p, colour in zip(params, _colours(params, key, plt), strict=True):
        seen.setdefault(str(p.get(key)), colour)
    ax.legend(handles=[Patch(color=c, label=f"{key} {v}") for v, c in seen.items()],
              fontsize=8, loc="best")


def _spread(row: GroupRow) -> tuple[float, float]:
    """How far the slowest and the fastest repeat lie below and above a row's median."""
    assert row.ips is not None
    low = row.ips if row.ips_min is None else row.ips_min
    high = row.ips if row.ips_max is None else row.ips_max
    return row.ips - low, high - row.ips


def plot_run(rows: Sequence[GroupRow], out: Target, title: str, subtitle: str = "",
             fmt: str | None = None) -> Target:
    """Scaling plot (gpus axis) or bar chart of a run's groups."""
    plt = _pyplot()
    good = [r for r in rows if r.ips is not None]
    gpus = sorted({int(r.params["gpus"]) for r in rows if r.params.get("gpus") is not None})
    fig, ax = plt.subplots(figsize=(8, max(4.0, 1.5 + 0.32 * len(good))) if len(gpus) < 2
                           else (8, 5), dpi=120)
    if len(gpus) > 1:
        _scaling(ax, good, gpus, plt)
    else:
        _bars(ax, good, plt)
    _titles(ax, title, subtitle)
    return _save(plt, fig, ax, out, fmt)


def _scaling(ax: Any, rows: Sequence[GroupRow], gpus: list[Any], plt: Any) -> None:
    series_keys = varying_keys([r.params for r in rows], exclude=("gpus",))
    key = colour_key([r.params for r in rows])
    series: dict[str, list[GroupRow]] = {}
    for r in rows:
        series.setdefault(_label(r.params, series_keys), []).append(r)
    linestyles = ["-", "--", "-.", (0, (1, 1))]
    colour_of: dict[str, str] = {}
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for n, (label, items) in enumerate(series.items()):
        items = sorted(items, key=lambda r: r.params["gpus"])
        xs = [r.params["gpus"] for r in items]
        ys = [r.ips for r in items]
        group = str(items[0].params.get(key)) if key else label
        colour = colour_of.setdefault(group, cycle[len(colour_of) % len(cycle)])
        style = linestyles[n % len(linestyles)] if key else "-"
        line = ax.plot(xs, ys, marker="o", label=label, color=colour, linestyle=style)[0]
        rep = [(r, _spread(r)) for r in items if r.ok > 1]
        if rep:
            ax.errorbar([r.params["gpus"] for r, _ in rep], [r.ips for r, _ in rep],
                        yerr=[[below for _, (below, _) in rep], [above for _, (_, above) in rep]],
                        fmt="none", ecolor=line.get_color(), capsize=3)
        one = next((r.ips for r in items if r.params["gpus"] == 1), None)
        if one:
            ax.plot(xs, [one * x for x in xs], linestyle=":", color=line.get_color(), alpha=0.6)
    ax.set_xlabel("GPUs")
    ax.set_xticks(gpus)
    if spans_decades([r.ips for r in rows]):
        ax.set_yscale("log")
    ax.set_ylabel("images/s (median; bars: min..max; dotted: linear scaling)")
    ax.legend(fontsize=8)


def _bars(ax: Any, rows: Sequence[GroupRow], plt: Any) -> None:
    params = [r.params for r in rows]
    key = colour_key(params)
    keys = varying_keys(params) or ["hardware"]
    labels = [_label(r.params, keys) for r in rows]
    values = [r.ips for r in rows]
    colours = _colours(params, key, plt)
    ax.barh(range(len(rows)), values, color=colours)
    rep = [(i, r, _spread(r)) for i, r in enumerate(rows) if r.ok > 1]
    if rep:
        ax.errorbar([r.ips for _, r, _ in rep], [i for i, _, _ in rep],
                    xerr=[[below for _, _, (below, _) in rep], [above for _, _, (_, above) in rep]],
                    fmt="none", ecolor="black", capsize=3, linewidth=1)
    for i, r in enumerate(rows):
        text = f"{r.ips:,.1f}" + (f"  ({r.ratio:.2f}x)" if r.ratio is not None else "")
        ax.text(r.ips_max if r.ok > 1 and r.ips_max else r.ips, i, f" {text}", va="center",
                fontsize=8)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    if spans_decades(values):
        ax.set_xscale("log")
    ax.margins(x=0.2)
    ax.set_xlabel("images/s (median over repeats; bars: min..max where repeated)")
    _legend_for_colours(ax, params, key, plt)


def _titles(ax: Any, title: str, subtitle: str) -> None:
    ax.set_title(title + (f"\n{subtitle}" if subtitle else ""), fontsize=10)


def plot_history(report: HistoryReport, out: Target, title: str, fmt: str | None = None
                 ) -> Target:
    """Median images/s per configuration across the shown runs, each configuration its own
    colour, marker and dash (:func:`line_styles`; the ratio to the control, thin dashed, where a
    line is judged on it); regressions circled in red; the runs by their whole ids."""
    plt = _pyplot()
    runs = report.shown
    fig, ax = plt.subplots(figsize=(max(9.0, 3.5 + 0.55 * len(runs)), 5.5), dpi=120)
    lines = [ln for ln in report.lines if ln.newest or ln.medians]
    keys = varying_keys([ln.params for ln in lines]) or ["hardware"]
    xs = list(range(len(runs)))
    styles = line_styles([ln.params for ln in lines], plt)
    values: list[float] = []
    for ln, (colour, marker, dash) in zip(lines, styles, strict=True):
        ys = [statistics.median(ln.newest) if r.pk == report.newest.pk and ln.newest
              else ln.medians.get(r.pk) for r in runs]
        points = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
        if not points:
            continue
        values += [p[1] for p in points]
        ratio = ln.basis == "normalised"
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=marker, color=colour,
                linestyle=dash, linewidth=0.9 if ratio else 1.5,
                label=_label(ln.params, keys) + (" (÷control)" if ratio else ""))
        if ln.verdict == "regression" and ys[-1] is not None:
            ax.plot([xs[-1]], [ys[-1]], marker="o", markersize=14, fillstyle="none",
                    color="red", markeredgewidth=2)
    if spans_decades(values):
        ax.set_yscale("log")
    ax.set_xticks(xs, [r.run_id for r in runs], rotation=30, ha="right", fontsize=7)
    bases = {ln.basis for ln in lines}
    ax.set_ylabel("ratio to the control (median over repeats)" if bases == {"normalised"}
                  else "images/s (median over repeats)" if "normalised" not in bases
                  else "images/s; thin lines (÷control): ratio to the control")
    _titles(ax, title + " (red circle: regression)", "")
    if lines:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(plt, fig, ax, out, fmt)


def plot_compare(comp: Comparison, out: Target, title: str, subtitle: str = "",
                 fmt: str | None = None) -> Target:
    """Change B/A - 1 per configuration with its interval; red slower, green faster."""
    plt = _pyplot()
    pairs = [(r, r.change) for r in comp.rows if r.change is not None]
    rows = [r for r, _ in pairs]
    fig, ax = plt.subplots(figsize=(8, max(3.0, 1.5 + 0.3 * len(rows))), dpi=120)
    keys = varying_keys([r.params for r in rows]) or ["hardware"]
    colour = {"faster": "tab:green", "slower": "tab:red"}
    ys = range(len(rows))
    ax.barh(ys, [100 * c.change for _, c in pairs],
            color=[colour.get(r.verdict, "tab:gray") for r in rows])
    with_ci = [(i, c.change, c.low, c.high) for i, (_, c) in enumerate(pairs)
               if c.low is not None and c.high is not None]
    if with_ci:
        ax.errorbar([100 * mid for _, mid, _, _ in with_ci], [i for i, _, _, _ in with_ci],
                    xerr=[[100 * (mid - low) for _, mid, low, _ in with_ci],
                          [100 * (high - mid) for _, mid, _, high in with_ci]],
                    fmt="none", ecolor="black", capsize=3, linewidth=1)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(list(ys), [_label(r.params, keys) for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"change B/A - 1, % (bars: {comp.confidence:.0%} bootstrap interval)")
    _titles(ax, title, subtitle)
    return _save(plt, fig, ax, out, fmt)


def _save(plt: Any, fig: Any, ax: Any, out: Target, fmt: str | None) -> Target:
    """Grid, layout, write ``out`` and free the figure."""
    ax.grid(alpha=0.3)
    fig.tight_layout()
    if isinstance(out, str):
        out = Path(out)
    if isinstance(out, Path):  # atomically, never through a link or FIFO found there
        kind = fmt or out.suffix.lstrip(".").lower() or "png"
        with replacing(out, "wb") as fh:
            fig.savefig(fh, format=kind, metadata=_metadata(kind))
    else:
        fig.savefig(out, format=fmt or "svg", metadata=_metadata(fmt or "svg"))
    plt.close(fig)
    return out


def _metadata(fmt: str | None) -> dict[str, Any] | None:
    """No creation date in SVG/PDF: the same run gives the same file."""
    if fmt in ("svg",):
        return {"Date": None}
    if fmt in ("pdf",):
        return {"CreationDate": None}
    return None


def draw_summary(root: Path, title: str) -> Path | None:
    """``summary.png`` of the run folder ``root``, drawn from its results on disk (the rows of
    its table: :func:`~orchestrator.results.reports.summary.summarize_run`) and written
    atomically; None when no row has a figure to draw."""
    import io

    paths = RunPaths(root)
    rows, _ = summarize_run(paths)
    if not any(r.ips for r in rows):
        return None
    png = io.BytesIO()
    plot_run(rows, png, title, fmt="png")
    write_bytes(paths.summary_png, png.getvalue(), make_folder=False)
    return paths.summary_png
