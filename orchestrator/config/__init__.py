"""Every file a user writes, read and validated: nothing here runs anything.

* :mod:`~orchestrator.config.files` — how a user file is read (size and nesting bounds, TOML
  errors with line numbers), the strict pydantic base model, nearest-key suggestions;
* :mod:`~orchestrator.config.syntax` — the small syntaxes written in several places: names that
  become folders, ``KEY=VALUE`` parameter matches, percentages;
* :mod:`~orchestrator.config.matrix_file` — a matrix file (``matrices/*.toml``): workload
  parameters, hardware profiles, ``[commands.NAME]`` templates, settings;
* :mod:`~orchestrator.config.argv_template` — how a command template becomes argv words;
* :mod:`~orchestrator.config.figures` — the ``[figures]`` table (how a figure is read from a
  program's output);
* :mod:`~orchestrator.config.inventory` — a host inventory (``hosts/*.toml``);
* :mod:`~orchestrator.config.defaults` — the user's defaults (``~/.config/orchestrate``);
* :mod:`~orchestrator.config.references` — absolute reference figures for the nightly gate;
* :mod:`~orchestrator.config.redact` — which values are secret, and masking them.

Errors name the file and the field and report every problem at once.

May import: errors.
"""
