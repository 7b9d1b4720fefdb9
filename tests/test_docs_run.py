"""Every command in the docs works as written on a fresh clone, against files the repository
ships (issue 31, item 7). The convention is :mod:`docs_support`'s docstring (and
docs/contributing.md): fenced ``sh`` blocks run, one shell session per page, in a fresh copy of
the repository, unless they say ``# not run: <reason>``; ``# file: <path>`` blocks are the text
of a shipped file; inline commands are checked against the parser.

The runs are the integration tier (they start processes: ``orchestrate`` itself, sweeps of the
stand-in program ``examples/fake_bench.py``); the checks of blocks, markers, files and inline
commands are unit tests."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest
from docs_support import ROOT, blocks, cli_parsers, commands, page_commands, pages, run_page

RUN_PAGES = [p for p in pages() if page_commands(p)]


def test_the_docs_have_commands_to_run_and_every_sh_block_runs_or_says_why() -> None:
    assert {p.name for p in RUN_PAGES} >= {"results.md", "operations.md", "matrix-files.md"}
    wrong = []
    for path in pages():
        for block in blocks(path):
            if block.lang in ("bash", "shell", "console"):
                wrong.append(f"{block.page}:{block.line}: tag shell commands `sh` (run) or "
                             "leave the fence untagged (output)")
            if block.lang != "sh":
                continue
            first = block.lines[0] if block.lines else ""
            if first.lstrip().startswith("# not run") and block.not_run is None:
                wrong.append(f"{block.page}:{block.line}: write `# not run: <the reason>`")
            if block.runs and not commands(block):
                wrong.append(f"{block.page}:{block.line}: an sh block with no command")
    assert not wrong, "\n".join(wrong)


def test_a_file_block_is_the_shipped_file() -> None:
    shown = [b for p in pages() for b in blocks(p) if b.file]
    assert {b.file for b in shown} >= {"examples/nightly.sh", "examples/nightly_publish.sh"}
    for block in shown:
        assert block.file is not None
        path = ROOT / block.file
        assert path.is_file(), f"{block.page}:{block.line}: {block.file} is not shipped"
        assert "\n".join(block.lines[1:]) + "\n" == path.read_text(), (
            f"{block.page}:{block.line}: the block differs from {block.file}")
        if path.suffix == ".sh":
            assert path.stat().st_mode & 0o111, f"{block.file} is not executable"


def test_every_import_format_the_docs_use_is_shipped() -> None:
    """The import examples name files of examples/ (issue 31: raport.json, dle_stdout.log and
    dlperf_logs/ were named, never shipped)."""
    imports = [c for p in RUN_PAGES for c in page_commands(p)
               if c.text.startswith("orchestrate import ")]
    sources = {shlex.split(c.text)[2] for c in imports}
    assert sources >= {"examples/logs/raport.json", "examples/logs/dle_stdout.log",
                       "examples/logs/dlperf_logs/"}
    for source in sources:
        assert (ROOT / source).exists(), source


def test_matrix_files_shows_a_regex_figures_example_that_is_a_shipped_matrix() -> None:
    text = (ROOT / "docs" / "matrix-files.md").read_text()
    (example,) = [b for b in blocks(ROOT / "docs" / "matrix-files.md")
                  if b.lang == "toml" and any("figures.regex" in ln for ln in b.lines)]
    shipped = (ROOT / "examples" / "fake_bench.toml").read_text()
    for line in example.lines:  # every line of the example is in the file that runs
        if line.strip() and not line.lstrip().startswith("#"):
            assert line.split("#")[0].rstrip() in shipped, line
    assert "examples/fake_bench.toml" in text


# --- inline commands ---------------------------------------------------------------------------


INLINE = re.compile(r"`(orchestrate [^`]+)`")
PROMPT = re.compile(r"^\$ (orchestrate .+)$")


def inline_commands() -> list[tuple[str, int, str]]:
    """(page, line, text) of every inline `orchestrate ...` and ``$ orchestrate`` line."""
    out = []
    for path in pages():
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            rel = str(path.relative_to(ROOT))
            out += [(rel, number, m) for m in INLINE.findall(line)]
            prompt = PROMPT.match(line)
            if prompt:
                out.append((rel, number, prompt.group(1)))
    return out


def problems_of(text: str, parsers: dict[str, argparse.ArgumentParser]) -> list[str]:
    """What is wrong with ``orchestrate ...`` as a command line: an unknown command or option
    (placeholders in capitals, ``[...]`` and ``|`` alternatives are the page's notation)."""
    words = [w for w in re.sub(r"\[[^\]]*\]", " ", text).split()[1:]]
    if words and all(w == "|" or re.fullmatch(r"[a-z]+", w) for w in words) and "|" in words:
        return [f"no command {w!r}" for w in words if w != "|" and w not in parsers]
    while words and words[0] in ("-q", "-v", "-vv", "--quiet", "--verbose"):
        words = words[1:]
    if not words or not re.fullmatch(r"[a-z]+", words[0]):
        return []  # orchestrate COMMAND --help: the notation for any command
    command = words[0]
    if command not in parsers:
        return [f"no command {command!r}"]
    if len(words) > 1 and f"{command} {words[1]}" in parsers:
        command = f"{command} {words[1]}"
    parser = parsers[command]
    known = {s for a in parser._actions for s in a.option_strings}
    flags = [w.split("=")[0] for w in words if re.fullmatch(r"--?[a-z][a-z0-9-]*(=.*)?", w)]
    return [f"orchestrate {command} has no option {f}" for f in flags if f not in known]


def test_every_inline_command_names_a_real_command_and_real_options() -> None:
    parsers = cli_parsers()
    found = inline_commands()
    assert len(found) > 40
    wrong = [f"{page}:{line}: `{text}`: {problem}" for page, line, text in found
             for problem in problems_of(text, parsers)]
    assert not wrong, "\n".join(wrong)


def test_the_inline_check_finds_a_wrong_command_and_a_wrong_option() -> None:
    parsers = cli_parsers()
    assert problems_of("orchestrate run M.toml", parsers) == ["no command 'run'"]
    assert problems_of("orchestrate matrix M.toml --dryrun", parsers) == [
        "orchestrate matrix has no option --dryrun"]
    assert problems_of("orchestrate images build NAME --set k=v", parsers) == []
    assert problems_of("orchestrate report | runs | nope", parsers) == ["no command 'nope'"]


# --- running them ------------------------------------------------------------------------------


@pytest.mark.subprocess
@pytest.mark.parametrize("page", RUN_PAGES, ids=[p.name for p in RUN_PAGES])
def test_the_commands_of_a_page_run_as_written(page: Path, tmp_path: Path) -> None:
    outcomes = run_page(page, tmp_path)
    print(f"\n{page.name}: {len(outcomes)} commands in {outcomes[0].seconds:.1f} s")
    failed = [f"{o.command.page}:{o.command.line}: `{o.command.text}` exited {o.status} "
              f"(expected {o.command.expect}):\n{o.output[-3000:]}"
              for o in outcomes if not o.ok]
    assert not failed, "\n\n".join(failed)


@pytest.mark.subprocess
def test_a_page_runs_in_one_session_and_a_wrong_exit_status_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```sh\ncd examples\ntest -f fake_bench.py\nfalse   # exits 1\n```\n\n"
                    "```sh\n# not run: an example\nfalse\n```\n\n```sh\nfalse\n"
                    "echo one \\\n  two\n```\n")
    outcomes = run_page(page, tmp_path / "work")
    assert [(o.command.text, o.status, o.ok) for o in outcomes] == [
        ("cd examples", 0, True), ("test -f fake_bench.py", 0, True),
        ("false   # exits 1", 1, True), ("false", 1, False), ("echo one two", 0, True)]
    assert outcomes[-1].output == "one two\n"
