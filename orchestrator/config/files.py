"""User files: how every file a user writes (matrix, hosts inventory, image manifest, figures
file, the user's config) is read and validated, standing on the errors module and pydantic alone.

It is small on purpose: commands that read only the user's config (``runs``, ``compare``,
``export``) import it without the matrix models of :mod:`orchestrator.config.matrix_file`.

Rules for every user file:

* It is read by :func:`read_config_text` only: a regular file (never a FIFO, a device or a
  folder: checked before opening, so reading never blocks) of at most :data:`MAX_FILE_BYTES`,
  UTF-8, nested at most :data:`MAX_NESTING` tables/lists deep.
* Its models derive from :class:`StrictModel`: unknown keys are errors, types are strict.
* Validation errors become :class:`~orchestrator.errors.Problem` values with readable field
  paths (:func:`problems_from_validation`); a misspelt key gets the nearest valid key.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
import tomllib
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, ValidationError

from orchestrator.errors import ConfigError, Problem

#: Largest user file read (matrix, hosts, manifest): the shipped ones are a few KB.
MAX_FILE_BYTES = 1024 * 1024
#: Deepest nesting of tables/lists, the file's own table included: the deepest real key
#: (hardware.X.container.mounts[0].source) sits 6 levels down.
MAX_NESTING = 16


#: The error type (``PydanticCustomError(NOT_SHOWN, message)``) of a value that must not be
#: repeated in the message: it holds a credential (a URL with a password in it).
NOT_SHOWN = "value_not_shown"


class StrictModel(BaseModel):
    """Base of every user-file model: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def field_path(loc: Iterable[Any]) -> str:
    """A path of keys and list indexes as every message writes a field: ``a.b[2].c``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def problems_from_validation(
    file: str,
    exc: ValidationError,
    keys_hint: str = "`orchestrate schema` lists the keys",
    model: type[BaseModel] | None = None,
) -> list[Problem]:
    """Turn pydantic's errors into :class:`Problem` values with readable field paths.

    ``model``: the validated model; an unknown key then gets the nearest valid key at its
    place suggested (``did you mean 'batch_size'?``).
    """
    problems = []
    for err in exc.errors(include_url=False):
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            guesses = nearest_keys(model, loc) if model is not None else []
            spelling = (f"did you mean {' or '.join(repr(g) for g in guesses)}?" if guesses
                        else "check the spelling")
            msg = f"unknown key ({spelling}; {keys_hint})"
        elif (
            "input" in err
            and err["type"] not in ("missing",)
            and not isinstance(err["input"], dict | list)
            # our own validators' messages already show the value
            and not (err["type"] == "value_error" and repr(err["input"]) in msg)
            and err["type"] != NOT_SHOWN
        ):
            msg = f"{msg} (got {err['input']!r})"
        problems.append(Problem(file, field_path(loc), msg))
    return problems


def nearest_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The valid key nearest to ``loc[-1]`` among the fields of the model at ``loc[:-1]``;
    else the dotted path from there of each table there that has a field of that name
    (``repeats`` at the top of a matrix file: ``matrix.repeats``; a key two tables have: both).
    Empty when nothing is near."""
    fields = _fields_at(model, loc[:-1])
    if not fields or not isinstance(loc[-1], str):
        return []
    found = difflib.get_close_matches(loc[-1], fields, n=1, cutoff=0.75)
    if found:
        return found
    return [f"{table}.{loc[-1]}" for table in fields
            if loc[-1] in (_fields_at(model, (*loc[:-1], table)) or ())]


def _fields_at(annotation: Any, path: tuple[Any, ...]) -> list[str] | None:
    """Field names of the model that ``path`` leads to from ``annotation`` (None if unknown)."""
    if not path:
        models = _models_in(annotation)
        return list(models[0].model_fields) if len(models) == 1 else None
    head, rest = path[0], path[1:]
    for model in _models_in(annotation):
        if isinstance(head, str) and head in model.model_fields:
            return _fields_at(model.model_fields[head].annotation, rest)
    for container in _containers_in(annotation):  # a list index or a dict key
        return _fields_at(container, rest)
    return None


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, Annotated):
        args = typing.get_args(annotation)
        args = args[:1] if typing.get_origin(annotation) is Annotated else args
        return [m for a in args for m in _models_in(a)]
    return []


def _containers_in(annotation: Any) -> list[Any]:
    """Item types of the list / dict types in ``annotation`` (unions and Annotated unwrapped)."""
    origin = typing.get_origin(annotation)
    if origin in (list, tuple):
        return list(typing.get_args(annotation)[:1])
    if origin is dict:
        return list(typing.get_args(annotation)[1:2])
    if origin in (typing.Union, types.UnionType, Annotated):
        args = typing.get_args(annotation)
        args = args[:1] if origin is Annotated else args
        return [c for a in args for c in _containers_in(a)]
    return []


def read_toml(path: Path) -> dict[str, Any]:
    """Read a TOML file; a missing or malformed file is a :class:`ConfigError`."""
    return parse_toml(read_config_text(path), str(path))


def _nearby(path: Path) -> str:
    """"; did you mean X?" for a missing file given without its ``.toml`` or its folder
    (``cpu_smoke`` for ``matrices/cpu_smoke.toml``); else ""."""
    name = path.name if path.suffix == ".toml" else f"{path.name}.toml"
    try:
        for candidate in (path.with_name(name), Path("matrices") / name, Path("hosts") / name):
            if candidate != path and candidate.is_file():
                return f"; did you mean {candidate}?"
    except (OSError, ValueError):  # a name that cannot be a file's: no guess
        pass
    return ""


def read_config_text(path: Path, limit: int = MAX_FILE_BYTES) -> str:
    """A user file's text: the one way every user file (matrix, hosts, manifest, template) is read.

    Only a regular file (a symlink to one is fine) of at most ``limit`` bytes, UTF-8. A FIFO, a
    device (``/dev/zero``), a folder, a missing, unreadable or oversized file is a
    :class:`ConfigError` naming it; nothing here blocks or reads without bound.
    """
    path = Path(path)
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"not a regular file ({_file_kind(st.st_mode)}); give a file",
                              file=str(path))
        if st.st_size > limit:
            raise ConfigError(_too_big(st.st_size, limit), file=str(path))
        # O_NONBLOCK: should it have been swapped for a FIFO since the stat, opening won't hang
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise ConfigError("not a regular file", file=str(path))
            data = fh.read(limit + 1)
    except FileNotFoundError:
        raise ConfigError(f"no such file (looked at {path.absolute()}){_nearby(path)}",
                          file=str(path)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", file=str(path)) from None
    if len(data) > limit:
        raise ConfigError(_too_big(len(data), limit), file=str(path))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text ({exc.reason} at byte {exc.start})",
                          file=str(path)) from None


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a plain file"


def _too_big(size: int, limit: int) -> str:
    return (f"too big ({size:,} bytes; a user file may have at most {limit:,} bytes = "
            f"{limit // 1024 // 1024} MiB)")


def parse_toml(text: str, file: str) -> dict[str, Any]:
    """Parse TOML text; malformed or absurdly nested TOML is a :class:`ConfigError`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"malformed TOML: {exc}", file=file) from None
    except RecursionError:  # tomllib recurses into nested arrays and inline tables
        raise ConfigError(too_deep(), file=file, field=_deep_line(text)) from None
    deep = too_deep_at(data)
    if deep is not None:  # nested [a.b.c...] headers do not recurse while parsing
        raise ConfigError(too_deep(), file=file, field=deep)
    return data


def too_deep() -> str:
    return (f"nested too deeply (at most {MAX_NESTING} levels of tables and lists; a matrix "
            "file needs 6)")


def too_deep_at(data: Any) -> str | None:
    """The field where ``data`` nests deeper than :data:`MAX_NESTING` (``a.b[0]...``; its first
    three steps), None where it does not."""
    stack: list[tuple[Any, int, list[str]]] = [(data, 1, [])]
    while stack:
        item, depth, path = stack.pop()
        if depth > MAX_NESTING:
            shown = "".join(p if p.startswith("[") else f".{p}" for p in path[:3]).lstrip(".")
            return shown + ("..." if len(path) > 3 else "")
        pairs = item.items() if isinstance(item, dict) else (
            (f"[{i}]", child) for i, child in enumerate(item))
        stack.extend((child, depth + 1, [*path, str(key)]) for key, child in pairs
                     if isinstance(child, dict | list))
    return None


def _deep_line(text: str) -> str:
    """Where text that tomllib could not even parse for its nesting nests too deeply: the key
    assigned on the first line whose brackets open past :data:`MAX_NESTING` (and that line)."""
    depth, key = 0, ""
    for number, line in enumerate(text.splitlines(), start=1):
        match = re.match(r"\s*([A-Za-z0-9_.\"'-]+)\s*=", line)
        if match:
            key = match.group(1).strip("\"'")
        for char in line:
            depth += 1 if char in "[{" else -1 if char in "]}" else 0
            if depth > MAX_NESTING:
                return f"{key} (line {number})" if key else f"line {number}"
    return ""
