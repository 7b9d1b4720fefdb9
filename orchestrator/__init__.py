"""orchestrate: run GPU benchmark experiment matrices in containers, locally or over SSH.

The packages are layers, lowest first; a package imports only the ones its docstring names,
all of them lower (``tests/test_layers.py`` checks it; ``docs/architecture.md`` draws the flow):

``errors`` -> ``config`` -> ``catalog`` -> ``plan`` -> ``results`` -> ``local`` -> ``remote`` ->
``images`` -> ``runtimes`` -> ``backends`` -> ``sweep`` -> ``cli``

``workload/`` (the program inside the images) imports nothing of ``orchestrator`` and the other
way round: JSON lines on stdout are the only contract.

May import: nothing.
"""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"

#: The checkout this package runs from: ``images/``, ``workload/`` and ``matrices/`` beside it.
REPO_ROOT = Path(__file__).resolve().parent.parent
