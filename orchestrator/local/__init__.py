"""This machine: the Docker engine client, a cell's processes, the GPU locks.

* :mod:`~orchestrator.local.engine` — the Docker SDK client and the containers a sweep labels;
* :mod:`~orchestrator.local.cell_processes` — every process a cell starts, stopped when it ends
  (a cgroup per cell, else a marker scan);
* :mod:`~orchestrator.local.locks` — per-GPU locks shared by every sweep on a machine;
* :mod:`~orchestrator.local.machine_state` — load, CPU and GPU clocks at an instant (recorded
  at a cell's start and end).

May import: errors.
"""
