"""``--set KEY=VALUE``: a field of a matrix file set from the command line, as if the file said
it (ReFrame's ``-S NAME=VALUE``, Ramble's workspace variables): the lab's checkout path, the
dataset mount, the iterations of tonight's run, without a copy of the file to keep in step.

The grammar (docs/matrix-files.md, "Overrides from the command line"):

* ``KEY`` is the field's path as the file's tables spell it: TOML's dotted keys (bare words of
  letters, digits, ``_`` and ``-``; any other name quoted, ``hardware."v1.00".gpu``), and
  ``[N]`` after a key for item N of a list (``hardware.v100.container.mounts[0].source``; the
  index one past the end adds an item). A table that is not there yet is made
  (``hardware.a100.device=cuda`` adds a profile).
* ``VALUE`` is read as a TOML value where it is one (``20``, ``true``, ``[1, 2]``,
  ``{ source = "/x", target = "/y" }``, ``"quoted text"``), else as the text itself
  (``/srv/dle``, ``resnet50``, ``23.10-py3``). Where the field takes text and the TOML value is
  a number, a boolean or a date (``ngc_release=23.10``, ``name=2026``), it is the text as
  written; a date is always text (no matrix field takes one).

Overrides are applied to the file's parsed TOML in the order given (a later one wins) before
anything is validated, so a value is checked exactly as the file's would be, and every problem
at or under (or above) an overridden field says ``(from --set KEY=VALUE)``. Pure: no I/O.

What is recorded (plan.json, run.json, the report's line) is :func:`shown`: the text as given,
with the value masked where the key looks secret (:func:`orchestrator.config.redact.looks_secret`)
or the value holds a secret-named key.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
import re
import tomllib
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel

from orchestrator.config.files import MAX_NESTING, field_path, too_deep, too_deep_at
from orchestrator.config.redact import MASK, looks_secret, masked_values, toml_value
from orchestrator.errors import Problem

#: The option, as problems and records name it.
OPTION = "--set"

#: One key of a dotted path: a bare TOML key or a quoted one, then any ``[N]`` indexes.
_SEGMENT = re.compile(r"""\s*(?:(?P<bare>[A-Za-z0-9_-]+)|"(?P<basic>(?:[^"\\]|\\.)*)"|"""
                      r"""'(?P<literal>[^']*)')\s*(?P<indexes>(?:\[\s*\d+\s*\]\s*)*)""")
_INDEX = re.compile(r"\[\s*(\d+)\s*\]")
#: The longest list index a key may give (a matrix list has at most 10,000 items).
MAX_INDEX = 100_000

#: The longest ``--set`` text a message repeats (the rest is counted).
MAX_SHOWN = 200

Path = tuple[str | int, ...]


@dataclass(frozen=True)
class Override:
    """One ``--set KEY=VALUE``: the text as given, the field's path and the value to set."""

    text: str
    key: str
    path: Path
    value: Any
    #: How VALUE was read: ``"toml"`` (a TOML value), ``"toml-any"`` (a TOML number or
    #: boolean for a field of any type, such as a template variable), ``"text"`` (not TOML:
    #: the text itself) or ``"text-for-field"`` (TOML, but the field takes text: the text as
    #: written).
    read_as: str = "toml"

    @property
    def field(self) -> str:
        """The path as problems name fields (``hardware.v100.container.mounts[0].source``)."""
        return field_path(self.path)

    @property
    def shown(self) -> str:
        """``KEY=VALUE`` as records and messages show it: a secret's value masked."""
        return shown(self)


def parse_key(key: str) -> Path | str:
    """The path of ``KEY`` (a tuple), or what is wrong with it (a message)."""
    path: list[str | int] = []
    pos = 0
    while True:
        match = _SEGMENT.match(key, pos)
        if match is None or match.end() == pos:
            return (f"{key[pos:]!r} is not a key: keys are dotted TOML keys (letters, digits, "
                    "'_' and '-'; quote any other name: hardware.\"v1.00\".gpu), [N] for a "
                    "list's item N")
        if match.group("bare") is not None:
            path.append(match.group("bare"))
        elif match.group("basic") is not None:
            try:
                path.append(json.loads(f'"{match.group("basic")}"'))
            except ValueError:
                return f"{match.group(0).strip()!r}: not a valid quoted key"
        else:
            path.append(match.group("literal"))
        for index in _INDEX.findall(match.group("indexes")):
            if int(index) > MAX_INDEX:
                return f"[{index}]: an index is at most {MAX_INDEX}"
            path.append(int(index))
        pos = match.end()
        if pos == len(key):
            return tuple(path)
        if key[pos] != ".":
            return (f"expected '.' or the end after {key[:pos].strip()!r}, got {key[pos:]!r} "
                    "(quote a name with other characters: hardware.\"v1.00\".gpu)")
        pos += 1


def read_value(text: str, annotation: Any = None) -> tuple[Any, str]:
    """VALUE as the field at ``annotation`` (None: unknown) takes it: (value, how it was read).
    See the module docstring."""
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):  # nested past reason: the text, refused
        return text, "text"                             # by the field's type
    if isinstance(value, datetime.date | datetime.time):  # datetime is a date too
        return text.strip(), "text-for-field"
    if isinstance(value, bool | int | float) and annotation is not None:
        kinds = _scalar_kinds(annotation)
        if kinds is None:  # a field of any type (a template variable): TOML's reading stands
            return value, "toml-any"
        if str in kinds and not _takes(kinds, value):
            return text.strip(), "text-for-field"
    return value, "toml"


def read_overrides(items: Sequence[str], model: type[BaseModel] | None = None
                    ) -> tuple[list[Override], list[Problem]]:
    """``--set`` texts as overrides, and a problem for each that is no ``KEY=VALUE`` (the
    problems name ``--set`` and the text). ``model``: the file's model, whose field types
    direct how a VALUE is read (:func:`read_value`)."""
    out: list[Override] = []
    problems: list[Problem] = []
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            problems.append(Problem(OPTION, item, "expected KEY=VALUE, e.g. --set "
                                    "workload.iterations=20 (docs/matrix-files.md)"))
            continue
        path = parse_key(key.strip())
        if not isinstance(path, str) and len(path) > MAX_NESTING:
            path = f"a key of at most {MAX_NESTING} parts (a matrix file nests 6 deep)"
        if isinstance(path, str):
            problems.append(Problem(OPTION, item, path))
            continue
        annotation = annotation_at(model, path) if model is not None else None
        value, how = read_value(text, annotation)
        out.append(Override(item, key.strip(), path, value, how))
    return out, problems


def apply_overrides(raw: dict[str, Any], overrides: Sequence[Override], file: str
                    ) -> tuple[dict[str, Any], list[Problem]]:
    """A copy of the parsed file ``raw`` with every override applied in order, and a problem
    for each that cannot be (a key through a value that is not a table, an index past a list's
    end), naming ``file`` and the field."""
    out = copy.deepcopy(raw)
    problems = []
    for override in overrides:
        problem = _apply(out, override)
        if problem is None:
            deep = too_deep_at(out)
            problem = (deep, too_deep()) if deep is not None else None
        if problem is not None:
            where, message = problem
            problems.append(Problem(file, where, f"{message} {origin(override)}"))
    return out, problems


def _apply(raw: dict[str, Any], override: Override) -> tuple[str, str] | None:
    node: Any = raw
    path = override.path
    for depth, part in enumerate(path):
        last = depth == len(path) - 1
        where = field_path(path[:depth + 1])
        value: Any = copy.deepcopy(override.value) if last else (
            [] if isinstance(path[depth + 1], int) else {})
        if isinstance(part, int):
            if not isinstance(node, list):
                return field_path(path[:depth]), _not_a("list", node, f"[{part}]")
            if part > len(node):
                return where, (f"past the end: {field_path(path[:depth])} has "
                               f"{len(node)} items ([0]..[{len(node) - 1}] set one, "
                               f"[{len(node)}] adds one)" if node else
                               f"past the end: {field_path(path[:depth])} is empty ([0] adds "
                               "an item)")
            if part == len(node):
                node.append(value)
            elif last:
                node[part] = value
        else:
            if not isinstance(node, dict):
                return field_path(path[:depth]), _not_a("table", node, part)
            if last or part not in node:
                node[part] = value
        node = node[part]
        if not last and isinstance(path[depth + 1], int) and not isinstance(node, list):
            return where, _not_a("list", node, f"[{path[depth + 1]}]")
    return None


def _not_a(kind: str, value: Any, step: str) -> str:
    what = {dict: "a table", list: "a list", str: "text", bool: "a boolean", int: "a number",
            float: "a number"}.get(type(value), type(value).__name__)
    if kind == "list":
        return f"is {what} here, not a list: {step} cannot index it"
    return f"is {what} here, not a table: {step!r} cannot be a key under it"


def origin(override: Override) -> str:
    """``(from --set KEY=VALUE)``, with a hint where VALUE was read as a TOML number or
    boolean for a field that may not take one."""
    hint = ""
    if override.read_as == "toml-any":
        kind = "a boolean" if isinstance(override.value, bool) else "a number"
        value = override.text.partition("=")[2]
        hint = f"; VALUE was read as {kind}: for text, quote it: {override.key}='\"{value}\"'"
    elif override.read_as == "text" and override.text.partition("=")[2].lstrip()[:1] in "[{":
        hint = ("; VALUE is not valid TOML, so it was read as text: a list or table is TOML, "
                "with strings quoted (--set 'axes.arch=[\"resnet50\", \"resnet18\"]')")
    text = override.shown
    if len(text) > MAX_SHOWN:
        text = f"{text[:MAX_SHOWN]}... ({len(text):,} characters)"
    return f"(from {OPTION} {text}{hint})"


def attribute(problems: Sequence[Problem], overrides: Sequence[Override]) -> list[Problem]:
    """``problems`` with ``(from --set KEY=VALUE)`` added to each one whose field is an
    overridden field, lies under one or above one (the table it belongs to)."""
    if not overrides:
        return list(problems)
    out = []
    for problem in problems:
        words = _words(problem.field)
        causes = [o for o in overrides if words and _related(words, _words(o.field))
                  and OPTION not in problem.message]
        out.append(dataclasses.replace(  # a requirement of the target stays one
            problem, message=f"{problem.message} {' '.join(origin(o) for o in causes)}")
                   if causes else problem)
    return out


def _words(field: str) -> list[str]:
    return re.findall(r"\[\d+\]|[^.\[\]\s]+", field.split(" (")[0])


def _related(a: list[str], b: list[str]) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def shown(override: Override) -> str:
    """``KEY=VALUE`` as given, its value masked (``***``) where a key of the path looks secret,
    or the value is a table or list holding a secret-named string."""
    if any(isinstance(p, str) and looks_secret(p) for p in override.path):
        return f"{override.key}={MASK}"
    if isinstance(override.value, dict | list):
        masked = masked_values(override.value)
        if masked != override.value:
            return f"{override.key}={toml_value(masked)}"
    return override.text


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line as run.json records it: every ``--set KEY=VALUE`` shown as :func:`shown`
    does (a secret is not written to a results folder)."""
    out = list(argv)
    for i, word in enumerate(out):
        if word == OPTION and i + 1 < len(out):
            out[i + 1] = _shown_text(out[i + 1])
        elif word.startswith(f"{OPTION}="):
            out[i] = f"{OPTION}={_shown_text(word[len(OPTION) + 1:])}"
    return out


def _shown_text(item: str) -> str:
    found, problems = read_overrides([item])
    return found[0].shown if found and not problems else item


# --- the type of a field -------------------------------------------------------------------


def annotation_at(model: Any, path: Path) -> Any:
    """The type of the field that ``path`` leads to from ``model`` (None where it leads to no
    known field: an unknown key, which validation then reports)."""
    annotation: Any = model
    for part in path:
        annotation = _step(annotation, part)
        if annotation is None:
            return None
    return annotation


def _step(annotation: Any, part: str | int) -> Any:
    for arg in _alternatives(annotation):
        if (isinstance(part, str) and isinstance(arg, type) and issubclass(arg, BaseModel)
                and part in arg.model_fields):
            return arg.model_fields[part].annotation
        origin_ = typing.get_origin(arg)
        if isinstance(part, int) and origin_ in (list, tuple):
            return typing.get_args(arg)[0] if typing.get_args(arg) else Any
        if isinstance(part, str) and origin_ is dict:
            args = typing.get_args(arg)
            return args[1] if len(args) == 2 else Any
    return None


def _alternatives(annotation: Any) -> list[Any]:
    """The members of a union (Optional included), Annotated unwrapped."""
    origin_ = typing.get_origin(annotation)
    if origin_ is Annotated:
        return _alternatives(typing.get_args(annotation)[0])
    if origin_ in (typing.Union, types.UnionType):
        return [a for arg in typing.get_args(annotation) for a in _alternatives(arg)]
    return [annotation]


def _scalar_kinds(annotation: Any) -> set[Any] | None:
    """The Python types a field's value may have (None: any)."""
    kinds: set[Any] = set()
    for arg in _alternatives(annotation):
        if arg is Any:
            return None
        if typing.get_origin(arg) is Literal:
            kinds.update(type(v) for v in typing.get_args(arg))
        elif isinstance(arg, type):
            kinds.add(arg)
        else:
            kinds.add(typing.get_origin(arg))
    return kinds


def _takes(kinds: set[Any], value: Any) -> bool:
    if isinstance(value, bool):
        return bool in kinds
    if isinstance(value, int):
        return int in kinds or float in kinds
    return type(value) in kinds
