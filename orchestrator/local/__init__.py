"""This machine: the Docker engine client, a cell's processes, the GPU locks.

* :mod:`~orchestrator.local.engine` — the Docker SDK client and the containers a sweep labels;
* :mod:`~orchestrator.local.cell_processes` — every process a cell starts, stopped when it ends
  (a cgroup per cell, else a marker scan);
* :mod:`~orchestrator.local.locks` — per-GPU locks shared by every sweep on a machine.

May import: errors.
"""
