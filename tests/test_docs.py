"""The README and docs/ stay true: links resolve, named files exist, the architecture page
matches the package docstrings, the CLI page matches the parser, the README stays a map.

* every relative link of ``README.md`` and ``docs/*.md`` points at a file that exists, and
  every ``#anchor`` at a heading of that file (GitHub's slugs);
* every repository path they name in backticks (``orchestrator/...``, ``tests/...``, ...) exists;
* ``docs/architecture.md`` has one section per layer of ``tests/test_layers.py``'s ``LAYERS``,
  in the same order, each with the very ``May import:`` line of its package's docstring, so a
  package added (or a line changed) without its doc entry fails here;
* its ``results`` section has a table of the results layer's parts (``RESULTS_PARTS``), in the
  same order, each with the text of its sub-package's ``May import:`` line;
* ``docs/cli.md``'s synopsis names exactly the options each command's parser has;
* the README is at most 150 lines, its example lines are those of the matrix it names, and its
  table has one row per cell of that matrix;
* the nightly cron script of ``docs/operations.md`` is silent when both commands pass and says
  which failed otherwise (run with a stand-in ``orchestrate`` that only exits with the status it
  is told: the real sweep and gate are the integration tests' and ``history``'s own tests').
"""

from __future__ import annotations

import itertools
import os
import re
import stat
import subprocess
import tomllib
from pathlib import Path

import pytest
from test_layers import LAYERS, RESULTS_PARTS, declared, modules

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
README_MAX_LINES = 150

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
#: Top-level folders whose files the docs may name in backticks.
TRACKED_ROOTS = ("orchestrator/", "workload/", "tests/", "benchmarks/", "images/", "matrices/",
                 "hosts/", "docs/", ".ci/")
#: Paths the docs name that a user makes, never shipped.
USERS_OWN = {"matrices/bitfusion/"}  # the lab's Bitfusion client .deb and CA certificate
PATH_IN_TICKS = re.compile(
    r"`((?:" + "|".join(re.escape(r) for r in TRACKED_ROOTS) + r")[^`\s]*)`")


def without_code_blocks(text: str) -> str:
    """The text outside fenced code blocks (links and headings there are not markdown)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = without_code_blocks(path.read_text(encoding="utf-8"))
    return {slug(m[1]) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(without_code_blocks(page.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    assert not broken, f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_named_exists(page: Path) -> None:
    """A module moved or renamed without its docs fails here (the text, not only links)."""
    missing = []
    for path in PATH_IN_TICKS.findall(page.read_text(encoding="utf-8")):
        if (any(ch in path for ch in "<>*{}$") or "..." in path or path in USERS_OWN
                or re.search(r"(?<![a-z])[A-Z]{2,}(?![a-z])", path)):
            continue  # a pattern: images/<name>/, tests/test_backend_*.py, matrices/NAME.toml
        if not (ROOT / path.rstrip(".,:;")).exists():
            missing.append(path)
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


def architecture_sections() -> list[tuple[str, str]]:
    """(layer heading, section text) of docs/architecture.md's layers, in order."""
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    start = text.index("\n## The layers")
    end = text.find("\n## ", start + 1)
    part = text[start:end if end > 0 else len(text)]
    found = re.split(r"^### (.+)$", part, flags=re.M)
    return list(zip(found[1::2], found[2::2], strict=True))


def docstring_may_import(index: int) -> str:
    """The ``May import:`` line of a layer's docstring, as written (test_layers reads it)."""
    import ast

    name = LAYERS[index][1][-1] if index == 0 else LAYERS[index][1][0]
    doc = ast.get_docstring(ast.parse(modules()[name].read_text(encoding="utf-8"))) or ""
    return next(line for line in doc.splitlines() if line.startswith("May import:"))


def test_architecture_lists_every_layer_in_order() -> None:
    assert [h.strip() for h, _ in architecture_sections()] == [name for name, _ in LAYERS]


def test_architecture_may_import_lines_are_the_docstrings() -> None:
    wrong = []
    for index, (heading, body) in enumerate(architecture_sections()):
        lines = [ln for ln in body.splitlines() if ln.startswith("May import:")]
        expected = docstring_may_import(index)
        if lines != [expected]:
            wrong.append(f"{heading}: doc has {lines}, the package says {expected!r}")
        declared(index)  # the docstring's line names only known layers (test_layers' own rule)
    assert not wrong, "\n".join(wrong)


def results_parts_table() -> list[tuple[str, str]]:
    """(part, its 'may import' cell) of the table in architecture.md's results section."""
    body = dict((h.strip(), b) for h, b in architecture_sections())["results"]
    return [(m[1], m[2].strip()) for m in re.finditer(
        r"^\| `results\.(\w+)` \|[^|]*\|([^|]*)\|$", body, re.M)]


def test_architecture_lists_the_results_parts_with_their_lines() -> None:
    import ast

    table = results_parts_table()
    assert [part for part, _ in table] == list(RESULTS_PARTS)
    wrong = []
    for part, cell in table:
        path = modules()[f"orchestrator.results.{part}"]
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        line = next(ln for ln in doc.splitlines() if ln.startswith("May import:"))
        if cell != line.partition(":")[2].strip().rstrip("."):
            wrong.append(f"results.{part}: doc has {cell!r}, the package says {line!r}")
    assert not wrong, "\n".join(wrong)


def test_contributing_lists_every_layer_in_order() -> None:
    """docs/contributing.md's one-line list of the layers is test_layers' LAYERS."""
    text = (DOCS / "contributing.md").read_text(encoding="utf-8")
    found = re.search(r"are layers, lowest first: ([a-z, \n]+)\.", text)
    assert found, "contributing.md no longer lists the layers"
    assert re.split(r",\s*", found[1].replace("\n", " ").strip()) == [n for n, _ in LAYERS]


def test_the_architecture_check_fails_without_a_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check itself: a layer added to LAYERS without a doc section is caught."""
    monkeypatch.setattr("test_docs.LAYERS", [*LAYERS[:3], ("extra", ("orchestrator.extra",)),
                                             *LAYERS[3:]])
    with pytest.raises(AssertionError):
        test_architecture_lists_every_layer_in_order()


def cli_synopsis() -> dict[str, set[str]]:
    """Options per command ('' for the global ones, 'images build' for a subcommand) in the
    synopsis block of docs/cli.md: a line starting ``orchestrate`` opens a command, indented
    lines continue it, and three spaces or more start its description."""
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    first = text.index("```\n") + 4
    block = text[first:text.index("\n```", first)]
    commands: dict[str, set[str]] = {}
    current = ""
    for line in block.splitlines():
        synopsis = re.split(r"\s{3,}", line.strip())[0]
        words = synopsis.split()
        if words[:1] == ["orchestrate"]:
            names = list(itertools.takewhile(lambda w: re.fullmatch(r"[a-z]+", w), words[1:3]))
            current = " ".join(names if names[:1] in (["images"], ["hosts"]) else names[:1])
        commands.setdefault(current, set()).update(
            re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", synopsis))
    return commands


def parser_options() -> dict[str, list[tuple[str, ...]]]:
    """The options of the real parser per command (keyed as :func:`cli_synopsis` keys them):
    each option's spellings (``("-v", "--verbose")``); a command with subcommands is keyed by
    them alone."""
    from docs_support import cli_parsers

    parsers = cli_parsers()
    grouped = {name.split(" ")[0] for name in parsers if " " in name}
    return {name: [tuple(action.option_strings) for action in parser._actions
                   if action.option_strings and "--help" not in action.option_strings]
            for name, parser in parsers.items() if name not in grouped}


def test_the_cli_page_names_exactly_the_parsers_options() -> None:
    """Every option of every command is in docs/cli.md's synopsis (one of its spellings), and
    the synopsis names no option the parser lacks."""
    documented, real = cli_synopsis(), parser_options()
    assert sorted(documented) == sorted(real), "the synopsis lists other commands than the CLI"
    wrong = []
    for command, opts in sorted(real.items()):
        doc = documented[command]
        missing = [spellings[-1] for spellings in opts if not doc & set(spellings)]
        unknown = sorted(doc - {s for spellings in opts for s in spellings})
        if missing or unknown:
            wrong.append(f"orchestrate {command}: not documented {missing}, no such option "
                         f"{unknown}")
    assert not wrong, "\n".join(wrong)


def test_the_readme_is_a_map() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move detail to docs/"


def test_the_readme_example_is_the_matrix_it_names() -> None:
    """The README's matrix lines are lines of matrices/cpu_smoke.toml, and its table (a real
    run, pasted) has one row per configuration of that matrix."""
    from orchestrator.plan.matrix import load_matrix

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("```toml\n") + len("```toml\n")
    example = [ln for ln in text[start:text.index("\n```", start)].splitlines() if ln.strip()]
    shipped = (ROOT / "matrices" / "cpu_smoke.toml").read_text(encoding="utf-8").splitlines()
    assert [ln for ln in example if ln not in shipped] == []
    rows = re.findall(r"^\| cpu +\| (\w+) +\| (\d+) +\| (\w+) +\|", text, re.M)
    matrix = load_matrix(ROOT / "matrices" / "cpu_smoke.toml")
    cells = {(c.params.arch, str(c.params.batch_size), c.params.precision) for c in matrix.cells}
    assert sorted(rows) == sorted(cells)


def test_the_readme_table_is_recomputed_from_its_kept_run_folder(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The README's table and load line are what `orchestrate report` prints from the run folder
    kept in examples/readme-run/ (a figure nobody can recompute is not shown)."""
    from orchestrator.cli import main

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    run = re.search(r"^results: results/cpu_smoke/(\S+)$", text, re.M)
    assert run and (ROOT / "examples" / "readme-run" / "cpu_smoke" / run[1]).is_dir()
    assert main(["report", f"cpu_smoke:{run[1]}", "--results",
                 str(ROOT / "examples" / "readme-run")]) == 0
    printed = [ln for ln in capsys.readouterr().out.splitlines()
               if ln.startswith(("|", "load of"))]
    start = text.index("\n```\n| hardware")
    shown = [ln for ln in text[start:text.index("\n```", start + 4)].splitlines()
             if ln.startswith(("|", "load of"))]
    assert len(shown) == 11 and shown == printed


def test_the_workload_page_states_the_floor_of_the_release_table() -> None:
    floor = tomllib.loads((ROOT / "orchestrator" / "data" / "ngc_releases.toml").read_text())[
        "floor"]
    text = (DOCS / "workload.md").read_text(encoding="utf-8")
    assert f"| floor | {floor['torch']} | {floor['torchvision']} |" in text


def nightly_script() -> str:
    """The shipped nightly script (docs/operations.md shows it as a ``# file:`` block, which
    the docs-run test holds equal to the file)."""
    return (ROOT / "examples" / "nightly.sh").read_text(encoding="utf-8")


@pytest.mark.subprocess  # runs the script under sh (a stand-in orchestrate, no sweep)
@pytest.mark.parametrize(("sweep", "gate", "says"), [
    (0, 0, None),
    (1, 0, "sweep exit 1, gate exit 0"),
    (0, 1, "sweep exit 0, gate exit 1"),
    (2, 0, "sweep exit 2, gate exit 0"),
    (130, 1, "sweep exit 130, gate exit 1"),
])
def test_the_nightly_cron_script(tmp_path: Path, sweep: int, gate: int, says: str | None) -> None:
    script = tmp_path / "nightly.sh"
    script.write_text(nightly_script())
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "orchestrate"  # stands in for the real CLI: records its argv, exits as told
    fake.write_text('#!/bin/sh\necho "orchestrate $*" >> "$CALLS"\necho "output of $*"\n'
                    'case " $* " in *" matrix "*) exit "$SWEEP";; *) exit "$GATE";; esac\n')
    fake.chmod(0o755)
    scratch = tmp_path / "scratch"  # mktemp's folder: the script leaves nothing there
    scratch.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TMPDIR": str(scratch),
           "CALLS": str(tmp_path / "calls"), "SWEEP": str(sweep), "GATE": str(gate)}
    done = subprocess.run([str(script), "matrices/nightly.toml"], env=env, capture_output=True,
                          text=True, timeout=30, cwd=tmp_path)
    assert (tmp_path / "calls").read_text().splitlines() == [
        "orchestrate -q matrix matrices/nightly.toml",
        "orchestrate history matrices/nightly.toml --fail-on-regression"]
    if says is None:
        assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    else:
        assert done.returncode == 1
        assert done.stdout.splitlines()[0] == f"nightly matrices/nightly.toml: {says}"
        assert "output of -q matrix" in done.stdout and "output of history" in done.stdout
    assert list(scratch.iterdir()) == []


def test_no_page_says_the_seeds_are_reproduced_as_written() -> None:
    """docs/seeds.md, generated from the translation tables, says that none of the five seeds
    is reproduced as written (each declares differences, issue 33): no other page may say they
    are (the README's table and matrix-files.md's shipped matrices did)."""
    assert "none of the five is" in (DOCS / "seeds.md").read_text(encoding="utf-8")
    claims = [str(page.relative_to(ROOT)) for page in PAGES if page.name != "seeds.md"
              and re.search(r"reproduced\s+\**as\s+written", page.read_text(encoding="utf-8"))]
    assert claims == []
