"""Self-contained HTML reports of a run and of a comparison, for a lab to publish.

One file, viewable from disk without a server: CSS inline, plots inline as base64 SVG
(matplotlib, fonts as paths), no script and no external URL. Rendered by Jinja2 with
autoescaping on (``data/report.html.j2``), so no parameter, reason or path from a run reaches
the page unescaped. The context is built here, from the run folder (run report: the same
summary rows and number formatting as ``summary.txt``) or from a
:class:`~orchestrator.results.reports.compare.Comparison`. Without matplotlib the report has no plot
and says so.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from orchestrator import __version__
from orchestrator.results.folders.run_folder import CellResult, RunPaths, read_json, write_file
from orchestrator.results.folders.store import RecordedStack, stack_field_values
from orchestrator.results.reports.summary import (
    GroupRow,
    options_line,
    rule_line,
    table_cells,
    table_notes,
    throughput_key,
)

log = logging.getLogger(__name__)


@dataclass
class Cell:
    text: str
    css: str = ""


@dataclass
class Table:
    headers: list[str]
    rows: list[list[Cell]]
    css: str = ""


@dataclass
class Image:
    data: str  # base64
    alt: str
    caption: str
    mime: str = "image/svg+xml"


@dataclass
class Section:
    id: str
    heading: str
    text: str = ""
    meta: list[tuple[str, str]] = field(default_factory=list)
    table: Table | None = None
    image: Image | None = None
    pre: str = ""
    pre_label: str = ""
    open: bool = False


def _env() -> Environment:
    return Environment(loader=PackageLoader("orchestrator", "data"),
                       autoescape=select_autoescape(default=True, default_for_string=True),
                       undefined=StrictUndefined, keep_trailing_newline=True)


def render_page(title: str, subtitle: str, sections: Sequence[Section]) -> str:
    """The HTML text of a report."""
    return _env().get_template("report.html.j2").render(
        title=title, subtitle=subtitle, sections=list(sections), version=__version__)


def _plain(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric_from: int,
           css: str = "") -> Table:
    return Table(list(headers), [[Cell(str(v), "num" if i >= numeric_from else "")
                                  for i, v in enumerate(row)] for row in rows], css)


def _svg(draw: Any, data: Any, title: str, subtitle: str = "") -> str | None:
    """A plot as base64 SVG, or None without matplotlib (or when drawing fails)."""
    if importlib.util.find_spec("matplotlib") is None:
        return None
    buf = io.BytesIO()
    try:
        draw(data, buf, title, subtitle, fmt="svg")
    except Exception as exc:  # a picture must never cost the report
        log.warning("plot not drawn: %s", exc)
        return None
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _utc(ts: Any) -> str:
    from orchestrator.results.reports.export import iso

    return iso(ts) if isinstance(ts, int | float) else ""


def repeats_of(results: Sequence[CellResult]) -> int | None:
    """The repeats the run holds (``--only repeat=1`` runs one of the matrix's three)."""
    return len({r.repeat for r in results}) or None


def stacks_of(results: Sequence[CellResult]) -> dict[str, list[str]]:
    """Per stack field, the distinct values recorded by a run's cells."""
    return stack_field_values(RecordedStack.from_result(res.env, res.provenance) for res in results)


# --- run report ------------------------------------------------------------------------------


def run_report(paths: RunPaths, rows: Sequence[GroupRow], results: Sequence[CellResult],
               baseline: str | None = None) -> str:
    """The HTML report of one run folder (``rows``: its summary, as ``write_summary`` made)."""
    from orchestrator.results.reports.plots import plot_run, stack_line

    meta = read_json(paths.run_meta) if paths.run_meta.exists() else {}
    plan = read_json(paths.plan) if paths.plan.exists() else {}
    matrix = meta.get("matrix") or plan.get("matrix") or paths.root.parent.name
    baseline = baseline or plan.get("baseline")
    stacks = stacks_of(results)
    repeats = repeats_of(results) or plan.get("repeats")
    subtitle = stack_line(stacks, repeats)
    counts: dict[str, int] = {}
    for res in results:
        counts[res.status.value] = counts.get(res.status.value, 0) + 1
    started, finished = meta.get("started_at"), meta.get("finished_at")
    duration = (f"{finished - started:,.0f} s" if isinstance(started, int | float)
                and isinstance(finished, int | float) else "")
    sections = [Section("run", "Run", meta=[
        ("matrix", str(matrix)), ("run id", paths.run_id),
        ("cells", ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none"),
        ("started (UTC)", _utc(started)), ("finished (UTC)", _utc(finished)),
        ("duration", duration), ("backend", str(meta.get("backend") or plan.get("backend", ""))),
        ("git revision", str(meta.get("git_revision") or "")),
        ("orchestrate", str(meta.get("orchestrate_version") or "")),
        ("controller host", str(meta.get("controller_host") or "")),
        ("command", " ".join(str(a) for a in meta.get("argv", []))),
        ("folder", str(paths.root)),
    ])]
    headers, table = table_cells(rows, plan.get("varying", []), baseline)
    first_number = headers.index("ok") if "ok" in headers else len(headers)
    rule = rule_line(rows)
    intro = (f"One row per configuration, by the {rule}." if rule else
             "One row per configuration: the median over the repeats that ended ok, and their "
             "min..max.")
    notes = table_notes(rows, mixed_releases="release" in headers)
    made_with = options_line(plan)  # --set / --only / --exclude, as under the text table
    sections.append(Section(
        "summary", "Summary", text=" ".join([intro, *notes, *([made_with] if made_with else [])]),
        table=_plain(headers, table, first_number, "summary")))
    svg = _svg(plot_run, [r for r in rows if r.ips is not None], f"{matrix} {paths.run_id}",
               subtitle) if any(r.ips is not None for r in rows) else None
    sections.append(Section("plot", "Plot", image=Image(
        svg, f"images/s of {matrix} {paths.run_id}",
        "Median images/s per configuration; error bars (min..max) only where there are "
        "repeats.") if svg else None,
        text="" if svg else "No plot: matplotlib is not installed, or nothing ended ok."))
    sections.append(Section("stack", "Stack", table=_plain(
        ["field", "values"], [[k, ", ".join(v)] for k, v in stacks.items() if v], 99)))
    sections.append(_cells_section(results))
    if paths.matrix_file.exists():
        label = "matrix.toml as run" + (f", {made_with}" if made_with else "")
        sections.append(Section("matrix", "Matrix file", pre=paths.matrix_file.read_text(
            encoding="utf-8"), pre_label=label))
    return render_page(f"{matrix} — run {paths.run_id}", subtitle, sections)


def _cells_section(results: Sequence[CellResult]) -> Section:
    rows = []
    for res in results:
        ips = res.metrics.get(throughput_key(str(res.params.get("mode", "train"))))
        prov = res.provenance
        rows.append([
            Cell(res.cell_id), Cell(res.role),
            Cell(res.status.value, "" if res.status.value == "ok" else "bad"),
            Cell("" if res.duration_s is None else f"{res.duration_s:,.1f}", "num"),
            Cell(f"{ips:,.1f}" if isinstance(ips, int | float) else "", "num"),
            Cell(str(prov.get("host") or "")), Cell(str(prov.get("image") or "")),
            Cell(",".join(str(g) for g in prov.get("gpu_ids") or [])),
            Cell(res.reason),
        ])
    return Section("cells", "Cells and provenance", table=Table(
        ["cell", "role", "status", "duration s", "images/s", "host", "image", "GPUs", "reason"],
        rows))


# --- compare report --------------------------------------------------------------------------


def compare_report(comp: Any) -> str:
    """The HTML report of a :class:`~orchestrator.results.reports.compare.Comparison`."""
    from orchestrator.results.reports.compare import compare_notes, table_rows
    from orchestrator.results.reports.plots import plot_compare

    a, b = comp.a, comp.b
    sections = []
    for name, run in (("A", a), ("B", b)):
        sections.append(Section(f"run-{name.lower()}", f"Run {name}: {run.label}", meta=[
            ("status", run.status), ("cells", f"{run.ok} ok of {run.cells}"),
            ("started (UTC)", _utc(run.started_at)), ("backend", run.backend or ""),
            ("git revision", run.git_revision or ""), ("folder", run.path)]))
    headers, rows = table_rows(comp)
    first_number = headers.index("A images/s")
    table = _plain(headers, rows, first_number, "compare")
    for row in table.rows:
        verdict = row[-1]
        verdict.css = ("bad" if verdict.text.startswith(("slower", "failed", "missing"))
                       else "good" if verdict.text.startswith("faster") else "")
    counts = ", ".join(f"{n} {v}" for v, n in sorted(comp.counts().items()))
    sections.append(Section(
        "comparison", "Comparison", table=table,
        text=f"{len(comp.rows)} configurations: {counts}. Change = B/A - 1 of the medians over "
        f"ok repeats; interval: {comp.confidence:.0%} percentile interval of the exact bootstrap "
        f"over repeats; significant when it excludes 0, the change is beyond "
        f"{comp.threshold:.1%} and the exact rank-sum test of the repeats agrees."
        + "".join(f" {n}" for n in compare_notes(comp))))
    svg = _svg(plot_compare, comp, compare_title(comp)) if any(
        r.change is not None for r in comp.rows) else None
    if svg:
        sections.append(Section("plot", "Plot", image=Image(
            svg, "change per configuration", "Change per configuration with its interval "
            "(red: slower, green: faster).")))
    stack_rows = [[k, ", ".join(va) or "-", ", ".join(vb) or "-"]
                  for k, (va, vb) in comp.stacks.items()]
    sections.append(Section("stacks", "Stack differences",
                            text="" if stack_rows else "The two runs' stacks are identical.",
                            table=_plain(["field", "A", "B"], stack_rows, 99)
                            if stack_rows else None))
    sections.append(Section("json", "Data", pre=json.dumps(comp.to_json(), indent=1,
                                                           default=str), pre_label="JSON"))
    return render_page(compare_title(comp), "orchestrate compare", sections)


def compare_title(comp: Any) -> str:
    """``A: RUN vs B: RUN``: the runs in the order the page and the text show them (change is
    B/A - 1)."""
    return f"A: {comp.a.label} vs B: {comp.b.label}"


def write(path: Path, html: str) -> Path:
    """Write a report file (atomically, never through a link or FIFO found there)."""
    path = Path(path)
    write_file(path, html)
    return path
