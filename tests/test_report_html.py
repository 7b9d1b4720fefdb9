"""HTML reports, checked in a real headless browser (Chromium from Debian's packages).

The report must be viewable from disk with no server: the test loads it from a file:// URL in
headless Chromium, reads back what the browser rendered (the DOM after load, with a small
checking script added to a copy of the report: the shipped report has no script), and takes a
screenshot. It checks that the images were decoded and drawn, that the table shows the run's
numbers, and that nothing points outside the file.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from results_support import Config, day, params, run_id, write_run
from service_support import unavailable

from orchestrator.cli import main
from orchestrator.results.folders.run_folder import RunPaths
from orchestrator.results.reports.summary import summarize, table_cells

pytest.importorskip("matplotlib", reason="the plots extra is not installed")

CHECK = """
<script>
window.addEventListener("load", () => {
  const images = [...document.images].map(img => ({
    complete: img.complete, width: img.naturalWidth, height: img.naturalHeight,
    shown: img.getBoundingClientRect().width}));
  const tables = [...document.querySelectorAll("table")].map(t => ({
    css: t.className,
    headers: [...t.querySelectorAll("thead th")].map(th => th.textContent.trim()),
    rows: [...t.querySelectorAll("tbody tr")].map(tr =>
      [...tr.querySelectorAll("td")].map(td => td.textContent.trim()))}));
  const pre = document.createElement("pre");
  pre.id = "browser-check";
  pre.textContent = JSON.stringify({images, tables, title: document.title});
  document.body.appendChild(pre);
});
</script>
"""


@pytest.fixture(scope="session")
def chromium() -> str:
    """The headless browser's executable (marks the test ``chromium``: integration tier)."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    unavailable("chromium is not installed (apt-get install chromium)")
    raise AssertionError  # unreachable


def browse(chromium: str, html: Path, tmp_path: Path,
           *extra: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--no-first-run", f"--user-data-dir={profile}", "--virtual-time-budget=10000",
            *extra, html.as_uri()]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def rendered(chromium: str, report: Path, tmp_path: Path) -> dict:
    """What the browser shows of ``report``: images and tables after load."""
    probe = tmp_path / f"probe-{report.name}"
    probe.write_text(report.read_text().replace("</body>", CHECK + "</body>"))
    done = browse(chromium, probe, tmp_path, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'<pre id="browser-check">(.*?)</pre>', done.stdout, re.S)
    assert found, done.stdout[-2000:]
    import html

    return json.loads(html.unescape(found.group(1)))


def screenshot_colours(chromium: str, report: Path, tmp_path: Path) -> tuple[int, int]:
    """(pixels that are not near-white, of them the ones in matplotlib's bar colours)."""
    from PIL import Image

    shot = tmp_path / "shot.png"
    done = browse(chromium, report, tmp_path, f"--screenshot={shot}", "--window-size=1200,2400",
                  "--hide-scrollbars")
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    counts = image.getcolors(maxcolors=image.width * image.height)
    palette = [(0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)]  # tab:blue, tab:orange
    ink = coloured = 0
    for n, colour in counts:
        if sum(colour) < 3 * 235:
            ink += n
            if any(sum(abs(a - b) for a, b in zip(colour, c, strict=True)) < 40
                   for c in palette):
                coloured += n
    return ink, coloured


def the_run(root: Path) -> RunPaths:
    configs = [Config(params(precision=p, batch_size=b), [v, v * 1.02, v * 0.98])
               for p, b, v in (("fp32", 64, 410.5), ("amp", 64, 1220.25), ("fp32", 256, 455.0),
                               ("amp", 256, 1390.75))]
    configs.append(Config(params(precision="bf16", batch_size=64), [None, None, None]))
    return write_run(root, "lab", run_id(1), configs, started=day(1))


def test_run_report_renders_in_chromium_with_the_runs_numbers(chromium, tmp_path):
    results = tmp_path / "results"
    paths = the_run(results)
    out = tmp_path / "report.html"
    assert main(["report", "lab", "--results", str(results), "--html", str(out)]) == 0
    text = out.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//|url\(\s*["']?(https?:)?//""",
                         text), "the report must not load anything from outside the file"
    assert "<script" not in text

    seen = rendered(chromium, out, tmp_path)
    assert seen["title"] == f"lab — run {run_id(1)}"
    (image,) = seen["images"]
    assert image["complete"] and image["width"] > 300 and image["height"] > 200
    assert image["shown"] > 300
    summary = next(t for t in seen["tables"] if t["css"] == "summary")
    rows = summarize(paths.results())
    headers, cells = table_cells(rows, [], None)
    assert summary["headers"] == headers
    assert summary["rows"] == cells  # the very numbers of the run, as summary.txt shows them
    assert any(r[-3] == "1,220.2" or r[-2] == "1,220.2" for r in summary["rows"])
    cells_table = next(t for t in seen["tables"] if "reason" in t["headers"])
    failed = [r for r in cells_table["rows"] if r[2] == "failed"]
    assert len(failed) == 3 and all("out of memory" in r[-1] for r in failed)
    stack = next(t for t in seen["tables"] if t["headers"] == ["field", "values"])
    assert ["torch", "2.4.0"] in stack["rows"]

    ink, coloured = screenshot_colours(chromium, out, tmp_path)
    assert ink > 20_000  # text, tables and the plot were painted
    assert coloured > 2_000  # the bars, in the precision colours


def test_compare_report_renders_in_chromium(chromium, tmp_path):
    results = tmp_path / "results"
    write_run(results, "lab", run_id(1), [  # 4 repeats: the fewest for a verdict at 95 %
        Config(params(gpus=g), [100.0 * g, 101.0 * g, 99.0 * g, 100.0 * g]) for g in (1, 2)],
              started=day(1))
    write_run(results, "lab", run_id(2), [
        Config(params(gpus=g), [90.0 * g, 91.0 * g, 89.0 * g, 90.0 * g],
               env={"driver_version": "555.1"}) for g in (1, 2)], started=day(2))
    out = tmp_path / "compare.html"
    assert main(["compare", "lab:latest~1", "lab:latest", "--results", str(results),
                 "--html", str(out)]) == 0
    seen = rendered(chromium, out, tmp_path)
    (image,) = seen["images"]
    assert image["complete"] and image["width"] > 300
    table = next(t for t in seen["tables"] if t["css"] == "compare")
    assert [r[-1] for r in table["rows"]] == ["slower", "slower"]
    assert [r[table["headers"].index("change")] for r in table["rows"]] == ["-10.0%", "-10.0%"]
    stacks = next(t for t in seen["tables"] if t["headers"] == ["field", "A", "B"])
    assert stacks["rows"] == [["driver", "550.54", "555.1"]]
