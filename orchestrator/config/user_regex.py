"""Regular expressions users write (``[[figures.regex]] pattern``, ``import --pattern``), run by
RE2 (the ``google-re2`` package): matching takes time linear in the text, whatever the pattern.

Python's ``re`` backtracks: a pattern such as ``(?P<value>[0-9]+)(a+)+$`` takes exponential time
on a line it almost matches, and a sweep reading a cell's log with it would hang after the cell
ended (no timeout applies there, and the regex engine holds the interpreter, so not even SIGTERM
is handled). RE2 has no backtracking, so no pattern can do that; the price is its syntax, a
subset of Python's: no backreferences (``\\1``) and no lookaround (``(?=``, ``(?<=``), and
``\\d``, ``\\w`` are ASCII. A pattern RE2 cannot compile is refused when the matrix (or
``--pattern``) is read, saying so; named groups are ``(?P<name>...)`` as in Python. Chosen over
matching in a worker process with a time limit: no pattern can hang at all (nothing to tune),
nothing to start per cell, and the same engine serves validation and matching.
"""

from __future__ import annotations

from typing import Any

import re2

#: What the documentation calls the syntax of user patterns.
SYNTAX = "RE2 syntax (https://github.com/google/re2/wiki/Syntax)"


class PatternError(ValueError):
    """A pattern RE2 cannot compile (the message says why)."""


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # RE2 would print every refusal on stderr itself
    return options


def compile_pattern(pattern: str, multiline: bool = False) -> Any:
    """``pattern`` compiled by RE2 (``multiline``: ``^``/``$`` match at every line, as Python's
    ``re.MULTILINE``); :class:`PatternError` saying why RE2 refuses it. The result has the
    ``re.Pattern`` methods used here: ``finditer``, ``fullmatch``, ``search``, ``groupindex``,
    ``groups``."""
    try:
        return re2.compile(("(?m)" if multiline else "") + pattern, _options())
    except re2.error as exc:
        raw = exc.args[0] if exc.args else exc
        reason = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        if multiline:
            reason = reason.replace("(?m)", "", 1)
        hint = ""
        if "invalid escape" in reason or "perl operator" in reason:
            hint = " (backreferences and lookaround are not part of RE2's syntax)"
        raise PatternError(f"does not compile: {reason}{hint}; patterns use {SYNTAX}") from None
    except (TypeError, UnicodeError) as exc:
        raise PatternError(f"does not compile: {exc}") from None
