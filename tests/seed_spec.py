"""The seeds' translation tables (``matrices/seeds/translation/NNN.toml``): each seed's own
command lines, every difference between them and the matrix's cells (the words, the seed's
value, the matrix's, the reason), and every other parameter (stack, image, data, mounts,
container, repeats, table rule) with its status: ``exact`` or ``declared`` (a difference, with
its reason).

The command tests (tests/test_seeds.py) take each cell's seed line from here -- a line of the
seed's own file in ``../shared/seeds`` (checked to be there, verbatim) or of a script at the
seed's pinned revision (quoted with its path and revision) -- apply the declared differences
that concern the cell, and compare the result with the cell's argv word for word: a difference
that is not in the table fails, and so does a declared one that no longer applies.

``docs/seeds.md`` is rendered from these tables by :func:`render_page` (``UPDATE_GOLDEN=1``
rewrites it; ``python tests/seed_spec.py`` prints it), so the page cannot say what the tables
do not.
"""

from __future__ import annotations

import re
import shlex
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TABLES = ROOT / "matrices" / "seeds" / "translation"
NUMBERS = ("000", "001", "002", "003", "004")
STATUSES = ("exact", "declared")
_VAR = re.compile(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class Line:
    """One of the seed's command lines, and the cells that run it."""

    name: str
    source: str
    text: str
    cells: dict[str, Any]
    vars: dict[str, Any]
    #: what the seed's line runs, where it is a script of the seed's program (seed 004's
    #: demo_resnet): the program's own command line, as that script builds it
    expands_to: str = ""
    expansion_source: str = ""


@dataclass(frozen=True)
class Difference:
    """Words of a seed line that the matrix's cells run otherwise."""

    parameter: str
    seed: str
    matrix: str
    reason: str
    cells: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Parameter:
    """A parameter that is not a word of a command line."""

    parameter: str
    seed: str
    matrix: str
    status: str
    reason: str = ""


@dataclass(frozen=True)
class Spec:
    number: str
    matrix: str
    file: str
    title: str
    summary: str
    lines: tuple[Line, ...]
    differences: tuple[Difference, ...]
    parameters: tuple[Parameter, ...]
    #: cells the matrix has and the seed has no line for, with the reason (by selector)
    extra_cells: tuple[Difference, ...] = ()


def load(number: str) -> Spec:
    data = tomllib.loads((TABLES / f"{number}.toml").read_text(encoding="utf-8"))
    seed = data["seed"]
    return Spec(
        number=number, matrix=seed["matrix"], file=seed["file"], title=seed["title"],
        summary=seed["summary"].strip(),
        lines=tuple(Line(name=ln["name"], source=ln["source"], text=_one_line(ln["text"]),
                         cells=ln.get("cells", {}), vars=ln.get("vars", {}),
                         expands_to=_one_line(ln.get("expands_to", "")),
                         expansion_source=ln.get("expansion_source", ""))
                    for ln in data.get("lines", [])),
        differences=tuple(Difference(parameter=d["parameter"], seed=d["seed"],
                                     matrix=d["matrix"], reason=d["reason"].strip(),
                                     cells=d.get("cells", {}))
                          for d in data.get("differences", [])),
        parameters=tuple(Parameter(parameter=p["parameter"], seed=p["seed"], matrix=p["matrix"],
                                   status=p["status"], reason=p.get("reason", "").strip())
                         for p in data.get("parameters", [])),
        extra_cells=tuple(Difference(parameter=d["parameter"], seed=d["seed"],
                                     matrix=d["matrix"], reason=d["reason"].strip(),
                                     cells=d.get("cells", {}))
                          for d in data.get("extra_cells", [])),
    )


def load_all() -> dict[str, Spec]:
    return {n: load(n) for n in NUMBERS}


def _one_line(text: str) -> str:
    return " ".join(text.split())


# --- cells against the seed's lines ------------------------------------------------------------


def cell_value(cell: Any, key: str) -> str:
    """A cell's value of ``key`` (a parameter, or ``hardware``) as text."""
    value = cell.hardware if key == "hardware" else getattr(cell.params, key)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def selects(selector: dict[str, Any], cell: Any) -> bool:
    return all(cell_value(cell, k) == (str(v).lower() if isinstance(v, bool) else str(v))
               for k, v in selector.items())


def fill(text: str, variables: dict[str, Any], cell: Any) -> str:
    """``{name}`` of the seed's line filled from the cell, as the seed's script fills it."""
    def value(match: re.Match[str]) -> str:
        name = match[1]
        if name not in variables:
            return match[0]
        rule = variables[name]
        if isinstance(rule, str):
            return cell_value(cell, rule)
        return str(rule["values"][cell_value(cell, rule["param"])])
    return _VAR.sub(value, text)


def line_of(spec: Spec, cell: Any) -> Line:
    found = [ln for ln in spec.lines if selects(ln.cells, cell)]
    assert len(found) == 1, (spec.number, cell.id, [ln.name for ln in found])
    return found[0]


def seed_argv(spec: Spec, cell: Any) -> list[str]:
    """What the seed ran for this cell: its line (or what its script runs), filled."""
    line = line_of(spec, cell)
    return shlex.split(fill(line.expands_to or line.text, line.vars, cell))


def translate(spec: Spec, cell: Any, argv: list[str]) -> tuple[list[str], list[str]]:
    """The seed's argv with every difference that concerns ``cell`` applied, and the problems
    (a declared difference whose seed words are not in the line: stale)."""
    line = line_of(spec, cell)
    out = list(argv)
    stale = []
    for diff in spec.differences + spec.extra_cells:
        if not selects(diff.cells, cell) or not diff.seed and not diff.matrix:
            continue
        theirs = shlex.split(fill(diff.seed, line.vars, cell))
        ours = shlex.split(fill(diff.matrix, line.vars, cell))
        at = _find(out, theirs)
        if at is None:
            stale.append(f"{diff.parameter}: {diff.seed!r} is not in {line.name}")
            continue
        out[at:at + len(theirs)] = ours
    return out, stale


def _find(words: list[str], part: list[str]) -> int | None:
    if not part:
        return len(words)
    for i in range(len(words) - len(part) + 1):
        if words[i:i + len(part)] == part:
            return i
    return None


# --- counts --------------------------------------------------------------------------------------


def line_parameters(text: str) -> int:
    """The parameters of a command line: the program, and each option (a word that starts with
    ``-``) with its value(s)."""
    return 1 + sum(1 for w in shlex.split(text) if w.startswith("-"))


def counts(spec: Spec) -> dict[str, int]:
    """Exact and declared parameters: each line's (a difference counts once, where it applies),
    then every other parameter."""
    declared = len({d.parameter for d in spec.differences + spec.extra_cells})
    total = sum(line_parameters(ln.expands_to or ln.text) for ln in spec.lines)
    out = {"exact": max(total - declared, 0), "declared": declared}
    for p in spec.parameters:
        out[p.status] += 1
    return out


# --- docs/seeds.md -------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    return f"`{text}`" if text and "`" not in text else text


def render_seed(spec: Spec) -> str:
    n = counts(spec)
    out = [f"## Seed {spec.number}", "", spec.summary, "",
           f"Matrix `matrices/seeds/{spec.matrix}`, seed `../shared/seeds/{spec.file}`, table "
           f"`matrices/seeds/translation/{spec.number}.toml`. **{n['exact']} parameters exact, "
           f"{n['declared']} declared differences**"
           + (" (as written)." if n["declared"] == 0 else "."), ""]
    if spec.lines:
        out += ["The seed's command lines (each cell's command is compared with its line, word "
                "for word, through the differences below):", ""]
        for ln in spec.lines:
            where = ", ".join(f"{k} = {v}" for k, v in ln.cells.items()) or "every cell"
            out += [f"* {ln.name} ({where}; from {ln.source}):", "", "  ```", f"  {ln.text}",
                    "  ```", ""]
            if ln.expands_to:
                out += [f"  which runs ({ln.expansion_source}):", "", "  ```",
                        f"  {ln.expands_to}", "  ```", ""]
    rows = [("command: " + d.parameter, _code(d.seed), _code(d.matrix), "declared", d.reason)
            for d in spec.differences]
    rows += [("cells: " + d.parameter, d.seed, d.matrix, "declared", d.reason)
             for d in spec.extra_cells]
    rows += [(p.parameter, p.seed, p.matrix, p.status, p.reason) for p in spec.parameters]
    out += ["| parameter | seed | matrix | status | reason |", "| --- | --- | --- | --- | --- |"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out) + "\n"


def render_page(specs: dict[str, Spec] | None = None) -> str:
    specs = specs or load_all()
    index = tomllib.loads((TABLES / "index.toml").read_text(encoding="utf-8"))
    out = ["# The seed experiments, reproduced", "",
           "<!-- Generated from matrices/seeds/translation/*.toml by tests/seed_spec.py "
           "(UPDATE_GOLDEN=1 make test PYTEST_ARGS=tests/test_seeds.py rewrites it): edit the "
           "tables, not this page. -->", "", index["intro"].strip(), ""]
    out += ["| seed | matrix | program (revision) | exact | declared |",
            "| --- | --- | --- | --- | --- |"]
    for number, spec in specs.items():
        n = counts(spec)
        out.append(f"| {number} | `matrices/seeds/{spec.matrix}` | {_cell(spec.title)} | "
                   f"{n['exact']} | {n['declared']} |")
    out += ["", index["checks"].strip(), ""]
    for spec in specs.values():
        out.append(render_seed(spec))
    out += ["## Modern equivalents (our workload)", "", index["modern"].strip(), ""]
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(render_page())
