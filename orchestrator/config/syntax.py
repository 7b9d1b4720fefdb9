"""The small syntaxes a user writes in several places, each parsed by one function here.

* Matrix names and run ids (:func:`check_name`, :func:`check_run_id`): a matrix name and a run id
  become folder names under the results root, so both must match
:data:`NAME_PATTERN` (letters, digits, ``_ . -``, starting with a letter or digit, at most 64
characters: never ``..``, a ``/`` or a hidden name). :func:`check_name` / :func:`check_run_id`
are the one check, used wherever a name or run id becomes a path.
* ``KEY=VALUE`` parameter matches (:func:`param_matches`, :func:`parse_baseline`): ``--only``,
  ``--where``, ``--baseline`` and a matrix's ``baseline``.
* Percentages (:func:`parse_percent`): thresholds and reference bounds, the unit required.
* Counts in words (:func:`plural`): ``1 cell``, ``2 cells`` (never ``cell(s)``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from orchestrator.errors import ConfigError, Problem

#: The cell parameter that pins a cell's NGC release (``CellParams.ngc_release`` in
#: :mod:`orchestrator.config.matrix_file`): here, where reports read it without loading the
#: matrix models (the slowest import; ``runs``/``compare``/``export`` stay without them).
RELEASE_PARAM = "ngc_release"

#: Matrix names and run ids: they become folder names under the results root.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_NAME_RE = re.compile(NAME_PATTERN)


def name_problem(value: object) -> str:
    """Why ``value`` cannot be a matrix name or run id ('' if it can)."""
    if not isinstance(value, str):
        return f"expected a string, got {type(value).__name__}"
    if _NAME_RE.fullmatch(value):
        return ""
    return (f"{value!r} cannot be a folder name: use letters, digits, '_', '.' and '-' "
            "(starting with a letter or digit, at most 64 characters)")


def check_name(value: str, what: str = "matrix") -> str:
    """``value`` if it is a valid matrix name; else a :class:`ConfigError` naming ``what``."""
    problem = name_problem(value)
    if problem:
        raise ConfigError([Problem("", what, problem)])
    return value


def check_run_id(value: str, what: str = "run id (--run / --resume)") -> str:
    """``value`` if it is a valid run id (e.g. ``20261122-031500-ab12``); else ConfigError."""
    return check_name(value, what)


def param_matches(value: Any, text: str) -> bool:
    """Whether a parameter's value is what ``KEY=TEXT`` names: ``cuda_graphs=false`` matches
    False (a bool is written as TOML writes it), ``gpus=1`` matches 1."""
    if isinstance(value, bool):
        return text.strip().lower() == ("true" if value else "false")
    return str(value) == text


def parse_baseline(text: str | None) -> tuple[str, str] | None:
    """``KEY=VALUE`` of ``--baseline`` (e.g. ``hardware=v100``)."""
    if not text:
        return None
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError("expected KEY=VALUE, e.g. --baseline hardware=v100", field="--baseline")
    return key.strip(), value.strip()


def parse_percent(text: str, signed: bool = False) -> float:
    """``"5%"`` -> 0.05 (``"-10%"``, ``"+15%"`` with ``signed``). The unit is required: a bare
    ``5`` is refused (ValueError) rather than read as 500 %."""
    raw = str(text).strip()
    if not raw.endswith("%"):
        raise ValueError(f"{text!r} has no unit: write a percentage, e.g. "
                         f"{'-10%' if signed else '5%'}")
    number = raw[:-1].strip()
    if not signed and number[:1] in "+-" and number:
        raise ValueError(f"{text!r}: expected a percentage without a sign, e.g. 5%")
    try:
        value = float(number) / 100.0
    except ValueError:
        raise ValueError(f"{text!r} is not a percentage (e.g. 5%)") from None
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite percentage")
    return value


def plural(n: int, word: str, many: str | None = None) -> str:
    """``n`` and ``word`` in its number: ``1 cell``, ``0 cells``, ``2 matches`` (``many``: an
    irregular plural)."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def words(items: Sequence[str], last: str = "and") -> str:
    """``items`` as a list in a sentence: ``a``, ``a and b``, ``a, b and c`` (``last``: the
    word before the last item, e.g. ``or``)."""
    items = list(items)
    if len(items) < 2:
        return "".join(items)
    return f"{', '.join(items[:-1])} {last} {items[-1]}"
