"""Pure planning: a matrix into cells, cells onto hosts and GPUs, each cell's command.

``load -> expand -> place -> argv``, with no I/O beyond reading the matrix file (whether each
cell can run where it is planned is :mod:`orchestrator.backends.checks`, which stands on this
package and on the runtimes):

* :mod:`~orchestrator.plan.matrix` — expansion (product, include, exclude, zip) into frozen
  :class:`~orchestrator.plan.matrix.Cell` values with stable ids and content hashes;
* :mod:`~orchestrator.plan.selection` — which image (template, release, content hash) a cell
  runs in on a host;
* :mod:`~orchestrator.plan.placement` — where a cell runs (hosts, GPU slots);
* :mod:`~orchestrator.plan.launch` — the argv that runs a cell (our workload or a command
  template, torchrun, profiler and Bitfusion wrappers); never a shell string. What it runs in
  (a container, an Apptainer image) wraps it: :mod:`orchestrator.runtimes`;
* :mod:`~orchestrator.plan.profilers` — the profilers' command lines and capture windows;
* :mod:`~orchestrator.plan.software` — the software a profile's cells run on
  (:class:`~orchestrator.plan.software.PlannedStack`: torch, torchvision, CUDA, profilers),
  known before anything is built;
* :mod:`~orchestrator.plan.ordering`, :mod:`~orchestrator.plan.eta` — the order cells start in
  and the time left, from earlier durations.

May import: errors, config, catalog.
"""
