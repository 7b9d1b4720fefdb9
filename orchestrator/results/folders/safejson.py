"""JSON in and out of run folders, within bounds: reading a hostile file never crashes, and
nothing written is anything but standard JSON.

Reading (:func:`loads`): a file of the results folder or a line of a cell's output may come
from anywhere (a colleague's copy, a program's own output, an import). Python's ``json`` then
raises ``RecursionError`` on deep nesting (a 100k-deep ``[[[...``), ``ValueError`` (not a
``JSONDecodeError``) on an integer over 4300 digits, and reads ``NaN``, ``Infinity`` and
``1e999`` as floats that later break ``int()``, ``time.gmtime`` or a JSON export. Here each of
them is a :class:`JSONLimitError` (a ``ValueError``) saying which, or (non-finite numbers, by
default) ``None``. Nesting deeper than :data:`MAX_DEPTH` is refused whatever the recursion
limit: no file of a run comes near it.

Writing (:func:`dumps`): NaN and infinities become ``null`` (``Infinity`` is not JSON: other
tools refuse the file); what the caller writes is otherwise unchanged.
"""

from __future__ import annotations

import json
import math
from typing import Any

#: The deepest nesting read (a result.json is 4 deep, a DLLogger record 3).
MAX_DEPTH = 100


class JSONLimitError(ValueError):
    """JSON beyond what a run folder holds: nested too deeply, an integer too long."""


def loads(text: str | bytes, finite: bool = True) -> Any:
    """``json.loads`` within bounds (see the module docstring). ``finite``: NaN and infinite
    numbers are read as None (else kept as floats, for a caller that judges them itself).
    Raises ``json.JSONDecodeError`` for malformed text and :class:`JSONLimitError` beyond the
    bounds, both ValueErrors."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise JSONLimitError(f"nested too deeply (more than {MAX_DEPTH} levels)") from None
    except json.JSONDecodeError:
        raise
    except ValueError as exc:  # Python's limit on digits of an integer
        raise JSONLimitError(f"a number too long to read ({_first_line(exc)})") from None
    if not finite and _brackets(text) <= MAX_DEPTH:
        return value  # nothing to replace, and it cannot nest deeper than its brackets
    return _checked(value, finite)


def _brackets(text: str | bytes) -> int:
    """How many ``[`` and ``{`` the text holds (strings included: an upper bound of its
    nesting, counted at C speed)."""
    if isinstance(text, bytes):
        return text.count(b"[") + text.count(b"{")
    return text.count("[") + text.count("{")


def _first_line(exc: BaseException) -> str:
    return str(exc).split(";")[0].strip()


def _checked(value: Any, finite: bool) -> Any:
    """``value`` with its depth checked and (``finite``) non-finite floats made None; walked
    without recursion."""
    if not isinstance(value, dict | list):
        return None if finite and isinstance(value, float) and not math.isfinite(value) \
            else value
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise JSONLimitError(f"nested too deeply (more than {MAX_DEPTH} levels)")
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, item in items:
            if isinstance(item, dict | list):
                stack.append((item, depth + 1))
            elif finite and isinstance(item, float) and not math.isfinite(item):
                node[key] = None
    return value


def finite(data: Any) -> Any:
    """``data`` with every NaN or infinite float replaced by None (a copy where one was)."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: finite(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [finite(v) for v in data]
    return data


def dumps(data: Any, **kwargs: Any) -> str:
    """``json.dumps`` that writes standard JSON only: NaN and infinities as ``null``."""
    try:
        return json.dumps(data, allow_nan=False, **kwargs)
    except ValueError:  # a non-finite float somewhere: write it as null
        return json.dumps(finite(data), allow_nan=False, **kwargs)
