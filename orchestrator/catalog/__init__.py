"""What exists, as tables and templates: image templates, software stacks, accelerators.

* :mod:`~orchestrator.catalog.templates` — the image templates under ``images/<name>/``
  (manifest, variables and their kinds, rendering to a Dockerfile or Singularity definition,
  the build context); building them is :mod:`orchestrator.images`;
* :mod:`~orchestrator.catalog.releases` — the NGC and Habana release tables
  (``orchestrator/data/*.toml``): driver -> release -> torch, torchvision, profilers;
* :mod:`~orchestrator.catalog.stacks` — what a torch / torchvision version can do (features,
  models);
* :mod:`~orchestrator.catalog.gpus` — accelerators: ``nvidia-smi`` / ``hl-smi`` output parsed into
  host facts, compute capabilities;
* :mod:`~orchestrator.catalog.debs`, :mod:`~orchestrator.catalog.checkouts` — files a template
  copies in: which Ubuntu a ``.deb`` is built for (the Bitfusion client), which commit a lab's
  program checkout is at.

May import: errors, config.
"""
