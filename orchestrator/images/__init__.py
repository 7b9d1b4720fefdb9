"""Building and keeping images: Docker builds by content hash, ``.sif`` files, refresh per driver.

What an image *is* (its template, the release table) is :mod:`orchestrator.catalog`; which image
a cell needs is :mod:`orchestrator.plan.selection`. Here:

* :mod:`~orchestrator.images.build` — Docker builds on an engine (local or over SSH), skipped
  when the content-hash tag is there;
* :mod:`~orchestrator.images.prepare` — "make sure this engine has the images these cells
  need", the one way the docker and ssh backends and ``images refresh`` do it: the release per
  host driver, the base pinned on that engine, the build, the record of what was built;
* :mod:`~orchestrator.images.pulls` — how far a base-image pull has come (layers, bytes,
  rate), from the engine's events: a bar where the listener draws one, else a line every few
  seconds;
* :mod:`~orchestrator.images.sif` — Apptainer / Singularity ``.sif`` files, cached by hash;
* :mod:`~orchestrator.images.state` — what was built for which host and driver, kept beside the
  results;
* :mod:`~orchestrator.images.refresh` — ``orchestrate images refresh``: probe the hosts, rebuild
  what a new driver needs.

May import: errors, config, catalog, plan, results, local, remote.
"""
