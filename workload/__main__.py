"""``python -m workload`` (also under ``torchrun ... -m workload``)."""

from __future__ import annotations

from workload.cli import run_cli

if __name__ == "__main__":
    raise SystemExit(run_cli())
