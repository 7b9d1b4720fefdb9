"""Argv templates: a command line with ``{placeholders}``, turned into argv items, never a shell
string.

The mechanics of ``[commands.NAME] command``
(:class:`orchestrator.config.matrix_file.CommandTemplate` says
which names a template may use and what they stand for). Pure: no I/O.

Rules:

* A template is split into words once, when the matrix is loaded (:func:`parse`), by
  :func:`shlex.split`'s rules: white space (line breaks too) separates words, quotes group,
  a backslash escapes. It is never handed to a shell, then or later.
* A word is literal text and ``{name}`` placeholders (``name``: lower-case letters, digits and
  ``_``); ``{{`` and ``}}`` are literal braces. No format specs (``{x:>4}``), conversions
  (``{x!r}``), attribute or index access (``{x.y}``, ``{x[0]}``): a template is not Python.
  A word holding a control character (a quoted line break) is refused: it would forge lines of
  the cell's log.
* :func:`render`: a word that is exactly one placeholder becomes as many argv items as its value
  has (a list: zero or more items; a text: one item); a word with other text around its
  placeholders becomes exactly one item, and its placeholders' values must be texts. A value is
  never split, parsed or quoted again: spaces, quotes, ``;``, ``$(...)`` reach the program as
  the characters they are, in the one item they belong to.
"""

from __future__ import annotations

import re
import shlex
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass

#: A placeholder's name.
NAME_RE = re.compile(r"^[a-z_][a-z0-9_]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Ref:
    """A ``{name}`` placeholder inside a word."""

    name: str


#: A word of a template: literal texts and placeholders, in order.
Word = tuple[str | Ref, ...]
#: What a placeholder stands for: one argv item (a text) or several (a list of texts).
Value = str | Sequence[str]


class TemplateError(ValueError):
    """A template that cannot be split into words, or a value that does not fit its word."""


def parse(text: str) -> tuple[Word, ...]:
    """The words of template ``text``. Raises :class:`TemplateError` with the first problem."""
    text = re.sub(r"\\\r?\n", " ", text)  # a line continued as a shell continues it
    try:
        raw_words = shlex.split(text, comments=False, posix=True)
    except ValueError as exc:  # "No closing quotation", "No escaped character"
        raise TemplateError(f"cannot be split into words: {exc} (quote as a shell would: "
                            "'...' or \"...\")") from None
    if not raw_words:
        raise TemplateError("is empty: give the program and its arguments")
    return tuple(_word(raw) for raw in raw_words)


def _word(raw: str) -> Word:
    if _CONTROL.search(raw):
        raise TemplateError(f"word {raw!r} holds a control character (a quoted line break?); "
                            "a command's words are single lines")
    parts: list[str | Ref] = []
    try:
        pieces = list(string.Formatter().parse(raw))
    except ValueError as exc:  # a lone '{' or '}'
        raise TemplateError(f"word {raw!r}: {exc} (write {{{{ and }}}} for literal braces)"
                            ) from None
    for literal, name, spec, conversion in pieces:
        if literal:
            parts.append(literal)
        if name is None:
            continue
        if spec or conversion:
            raise TemplateError(f"word {raw!r}: {{{name}{'!' + conversion if conversion else ''}"
                                f"{':' + spec if spec else ''}}} has a format; a placeholder "
                                "is a bare {name}")
        if not NAME_RE.match(name):
            raise TemplateError(f"word {raw!r}: {{{name}}} is no placeholder name (lower-case "
                                "letters, digits and _, e.g. {batch_size})")
        parts.append(Ref(name))
    return tuple(parts)


def names(words: Sequence[Word]) -> list[str]:
    """The placeholders of ``words``, each once, in order of first use."""
    seen: dict[str, None] = {}
    for word in words:
        for part in word:
            if isinstance(part, Ref):
                seen.setdefault(part.name)
    return list(seen)


def whole(word: Word) -> str | None:
    """The placeholder's name when ``word`` is exactly one placeholder, else None."""
    if len(word) == 1 and isinstance(word[0], Ref):
        return word[0].name
    return None


def embedded(words: Sequence[Word]) -> set[str]:
    """Placeholders used inside a word with other text (each must stand for one text there)."""
    return {part.name for word in words if whole(word) is None
            for part in word if isinstance(part, Ref)}


def text(word: Word) -> str:
    """A word as the template wrote it (for messages)."""
    return "".join(p if isinstance(p, str) else f"{{{p.name}}}" for p in word)


def render(words: Sequence[Word], value: Callable[[str], Value]) -> list[str]:
    """The argv items of ``words``, each placeholder replaced by ``value(name)`` (see the module
    docstring). Raises :class:`TemplateError` for a list value inside a word with other text."""
    items: list[str] = []
    for word in words:
        name = whole(word)
        if name is not None:
            got = value(name)
            items += [got] if isinstance(got, str) else list(got)
            continue
        out = []
        for part in word:
            if isinstance(part, str):
                out.append(part)
                continue
            got = value(part.name)
            if not isinstance(got, str):
                raise TemplateError(f"{{{part.name}}} stands for {len(got)} argv items, but "
                                    f"word {text(word)!r} has other text around it: use it as "
                                    "a word of its own")
            out.append(got)
        items.append("".join(out))
    return items
