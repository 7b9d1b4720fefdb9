"""Secrets in a cell's environment: passed at launch only, never written by the run.

Which values are secret:

* a value whose **name looks secret** (:func:`looks_secret`): a word of the name (split at
  ``_``, ``-``, ``.``) is TOKEN, PASSWORD, PASSWD, PASS, PASSPHRASE, SECRET, KEY, APIKEY,
  CREDENTIAL(S), AUTH, COOKIE or PRIVATE, or the name contains TOKEN, PASSWORD, PASSWD, SECRET,
  CREDENTIAL or APIKEY anywhere: ``HF_TOKEN``, ``WANDB_API_KEY``, ``AWS_SECRET_ACCESS_KEY``,
  ``DB_PASS``, ``GITHUBTOKEN``;
* a value taken from the orchestrator's environment when the cell starts: ``env = { HF_TOKEN =
  "$env:HF_TOKEN" }`` (:data:`ENV_REF`). The secret is then never in the matrix file at all,
  and any name can be made secret this way. A missing variable stops the sweep before it
  starts (:func:`missing_references`).

What the run writes instead: ``command.json`` shows a secret literal as ``***`` and a reference
as itself (``$env:HF_TOKEN``); the saved ``matrix.toml`` copy has every secret-named string
masked (:func:`redact_toml`, still valid TOML); Slurm batch scripts name the secret variables in
a comment and sbatch passes them from its own environment; the cell's output (``log.txt``, the
result's log tail) has each secret value of 8 characters or more replaced by ``***``
(:class:`Scrubber`; shorter values are masked in files but not searched for in output).

Limits: a container's environment is visible to whoever may ``docker inspect`` it on its
engine, and Slurm keeps a job's environment in its state files (and in accounting where
``AccountingStoreFlags=job_env``); a secret the workload prints split across lines, encoded or
transformed is not recognised.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from typing import Any

#: What a masked value reads as.
MASK = "***"
#: ``"$env:NAME"``: the value of NAME in the orchestrator's environment when the cell starts.
ENV_REF = "$env:"
#: Secret values shorter than this are not searched for in the cell's output.
MIN_SCRUB_LENGTH = 8

_SECRET_WORDS = frozenset({
    "TOKEN", "TOKENS", "PASSWORD", "PASSWORDS", "PASSWD", "PASS", "PASSPHRASE", "SECRET",
    "SECRETS", "KEY", "KEYS", "APIKEY", "CREDENTIAL", "CREDENTIALS", "AUTH", "COOKIE", "PRIVATE",
})
_SECRET_PARTS = ("TOKEN", "PASSWORD", "PASSWD", "SECRET", "CREDENTIAL", "APIKEY")


@functools.lru_cache(maxsize=4096)
def looks_secret(name: str) -> bool:
    """Whether a variable or key named ``name`` holds a secret (see the module docstring).
    Asked once per name (every cell's environment names the same few)."""
    upper = name.upper()
    words = set(re.split(r"[^A-Z0-9]+", upper))
    return bool(words & _SECRET_WORDS) or any(part in upper for part in _SECRET_PARTS)


def is_reference(value: str) -> bool:
    """Whether ``value`` is ``$env:NAME``."""
    return value.startswith(ENV_REF)


def is_secret(name: str, value: str) -> bool:
    """Whether the variable ``name = value`` of a cell's environment is secret."""
    return is_reference(value) or looks_secret(name)


def resolve_env(env: Mapping[str, str], environ: Mapping[str, str] | None = None
                ) -> dict[str, str]:
    """``env`` with every ``$env:NAME`` replaced by NAME's value in ``environ`` (default: this
    process's environment); a missing one is left out (:func:`missing_references` catches it
    before a sweep starts)."""
    environ = os.environ if environ is None else environ
    out = {}
    for name, value in env.items():
        if is_reference(value):
            source = value[len(ENV_REF):]
            if source in environ:
                out[name] = environ[source]
        else:
            out[name] = value
    return out


def missing_references(env: Mapping[str, str], environ: Mapping[str, str] | None = None
                       ) -> list[tuple[str, str]]:
    """``(name, source)`` of each ``name = "$env:source"`` whose source is not set."""
    environ = os.environ if environ is None else environ
    return [(name, value[len(ENV_REF):]) for name, value in env.items()
            if is_reference(value) and value[len(ENV_REF):] not in environ]


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` as files show it: secret literals masked, references shown as they are."""
    return {name: value if is_reference(value) or not looks_secret(name) else MASK
            for name, value in env.items()}


def secret_env(env: Mapping[str, str], environ: Mapping[str, str] | None = None
               ) -> dict[str, str]:
    """The secret variables of ``env``, resolved: what is passed at launch only."""
    resolved = resolve_env(env, environ)
    return {name: resolved[name] for name, value in env.items()
            if is_secret(name, value) and name in resolved}


def public_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that are not secret (safe to write into a script)."""
    return {name: value for name, value in env.items() if not is_secret(name, value)}


# --- output ------------------------------------------------------------------------------------


class Scrubber:
    """Replaces secret values in a cell's output lines by :data:`MASK`."""

    def __init__(self, values: Iterable[str]):
        found = {v.encode() for v in values if len(v) >= MIN_SCRUB_LENGTH}
        self.values = sorted(found, key=len, reverse=True)

    def __bool__(self) -> bool:
        return bool(self.values)

    def __call__(self, data: bytes) -> bytes:
        for value in self.values:
            data = data.replace(value, MASK.encode())
        return data


# --- the matrix file's saved copy --------------------------------------------------------------


def _secret_entries(data: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str]]:
    """``(key path, value)`` of every secret string in parsed TOML (references are not)."""
    out: list[tuple[tuple[str, ...], str]] = []
    if isinstance(data, dict):
        for key, value in data.items():
            if isinstance(value, str) and looks_secret(key) and not is_reference(value):
                out.append(((*path, key), value))
            else:
                out += _secret_entries(value, (*path, key))
    elif isinstance(data, list):
        for i, item in enumerate(data):
            out += _secret_entries(item, (*path, str(i)))
    return out


def masked_values(data: Any) -> Any:
    """Parsed TOML (a table, a list, a value) with every secret-named string masked."""
    return _masked(data)


def toml_value(value: Any) -> str:
    """A parsed TOML value written as TOML (an inline table for a table)."""
    return _value(value)


def _masked(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: MASK if isinstance(v, str) and looks_secret(k) and not is_reference(v)
                else _masked(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_masked(item) for item in data]
    return data


def redact_toml(text: str) -> str:
    """The matrix file's text with every secret string masked, still valid TOML.

    The text is kept as written (comments, order) where each secret can be replaced where it
    is assigned; otherwise it is written out again from its values, masked. Either way the
    result is checked: it parses to the original values with the secrets masked."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return "# the matrix file was not valid TOML; not kept (it may hold secrets)\n"
    entries = _secret_entries(data)
    want = _masked(data)
    redacted = _mask_comments(text)  # "# HF_TOKEN = '...' (rotated)" is still a secret
    if not entries and redacted == text:
        return text
    for path, value in entries:
        redacted = _mask_assignment(redacted, path[-1], value)
    if _parses_to(redacted, want):
        return redacted
    rewritten = ("# orchestrate: secrets masked; the file is written out again from its "
                 "values\n" + dump_toml(want))
    if _parses_to(rewritten, want):
        return rewritten
    return "# orchestrate: the matrix file held secrets and could not be masked; not kept\n"


#: ``KEY = value`` (or ``KEY: value``) as written in a comment.
_COMMENTED = re.compile(r"""(?P<key>[A-Za-z0-9_.'"-]+)(?P<eq>\s*[=:]\s*)"""
                        r"""(?P<value>"[^"]*"|'[^']*'|[^\s,}#]+)""")


def _mask_comments(text: str) -> str:
    """``text`` with the value of every secret-looking ``KEY = value`` after a ``#`` masked (a
    commented-out token is still a token). A ``#`` inside a string is no comment: such a change
    alters the file's values, which :func:`redact_toml`'s check catches (it then writes the
    file out again from its values, without comments)."""
    def mask(match: re.Match[str]) -> str:
        if not looks_secret(match.group("key").strip("'\"")):
            return match.group(0)
        return f'{match.group("key")}{match.group("eq")}"{MASK}"'

    lines = []
    for line in text.splitlines(keepends=True):
        head, sign, comment = line.partition("#")
        lines.append(head + sign + _COMMENTED.sub(mask, comment) if sign else line)
    return "".join(lines)


def _parses_to(text: str, want: Any) -> bool:
    try:
        return tomllib.loads(text) == want
    except tomllib.TOMLDecodeError:
        return False


def _mask_assignment(text: str, key: str, value: str) -> str:
    """Replace ``key = <value as any TOML string literal>`` by ``key = "***"`` in ``text``."""
    literals = {json.dumps(value, ensure_ascii=False), json.dumps(value)}
    if "'" not in value and "\n" not in value:
        literals.add(f"'{value}'")
    keys = {re.escape(key), re.escape(json.dumps(key)), re.escape(f"'{key}'")}
    pattern = re.compile(
        r"(?<![\w\"'.-])(" + "|".join(keys) + r")(\s*=\s*)("
        + "|".join(re.escape(lit) for lit in sorted(literals, key=len, reverse=True)) + ")")
    return pattern.sub(lambda m: f'{m.group(1)}{m.group(2)}"{MASK}"', text)


def dump_toml(data: Mapping[str, Any]) -> str:
    """Parsed TOML written out again (values only: comments and layout are not kept)."""
    return "\n".join(_table(data, ())).strip() + "\n"


def _table(data: Mapping[str, Any], path: tuple[str, ...]) -> list[str]:
    lines = [f"{_key(k)} = {_value(v)}" for k, v in data.items()
             if not isinstance(v, dict) and not _table_array(v)]
    for key, value in data.items():
        sub = (*path, key)
        header = ".".join(_key(k) for k in sub)
        if isinstance(value, dict):
            lines += ["", f"[{header}]", *_table(value, sub)]
        elif _table_array(value):
            for item in value:
                lines += ["", f"[[{header}]]", *_table(item, sub)]
    return lines


def _table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _string(key)


def _string(value: str) -> str:
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }"
    return value.isoformat() if hasattr(value, "isoformat") else _string(str(value))
