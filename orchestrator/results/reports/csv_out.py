"""CSV that every reader splits into the same rows, whatever the text in a field.

Python's ``csv`` quotes a field (``QUOTE_MINIMAL``) only for the delimiter, the quote and the
characters of its line terminator (``\\n`` here): a carriage return in a ``--stack`` value or in
a failure reason (a program's progress bar) was written bare, and CSV readers (pandas, Excel,
Python's own) split the row there. :class:`RowWriter` quotes every field of a row that holds any
control character (C0, DEL, C1, the Unicode line and paragraph separators): the row is written
with ``QUOTE_ALL``, which the same readers read back as the one row it is; the others stay
minimally quoted, as before. Used by every CSV the project writes (``summary.csv``, ``export``,
``compare --csv``).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

#: What a field must not hold unquoted.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class RowWriter:
    """A ``csv.DictWriter`` (``\\n`` line ends) that quotes every control character."""

    def __init__(self, out: TextIO, fieldnames: Sequence[str]):
        self.plain = csv.DictWriter(out, fieldnames=fieldnames, lineterminator="\n")
        self.quoted = csv.DictWriter(out, fieldnames=fieldnames, lineterminator="\n",
                                     quoting=csv.QUOTE_ALL)

    def writeheader(self) -> None:
        if any(CONTROL.search(name) for name in self.plain.fieldnames):
            self.quoted.writeheader()
        else:
            self.plain.writeheader()

    def writerow(self, row: Mapping[str, Any]) -> None:
        control = any(isinstance(v, str) and CONTROL.search(v) for v in row.values())
        (self.quoted if control else self.plain).writerow(row)
