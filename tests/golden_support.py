"""Golden files: rendered text compared with a file under tests/golden/.

``UPDATE_GOLDEN=1`` rewrites the files from what the code renders now (after an intended change;
then review the diff); without it a missing file fails the test.
"""

from __future__ import annotations

import os
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "golden"


def check_golden(name: str, text: str) -> None:
    """Assert that ``text`` is exactly tests/golden/``name`` (written first if UPDATE_GOLDEN=1)."""
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"{path} missing: run with UPDATE_GOLDEN=1"
    assert text == path.read_text(encoding="utf-8"), f"{name}: differs from {path}"
