"""Publishing runs where labs already look: an MLflow tracking server, an HTTP collector.

A run folder is read once into plain values (:mod:`~orchestrator.publish.documents`: what a run
and each of its cells become, and a fingerprint of each), then sent to each target:

* :mod:`~orchestrator.publish.to_mlflow` — one experiment per matrix, a parent run per sweep,
  a child run per cell (params, figures, step series, tags, artifacts). Idempotent: what the
  server already has with the same fingerprint is left alone; a cell whose data changed (run
  again with ``--resume``) gets a new child run that replaces the old one, both tagged so. The
  MLflow client (``mlflow-skinny``, the ``publish`` extra) is imported only here, only when
  used.
* :mod:`~orchestrator.publish.to_http` — one JSON document per cell, POSTed to a URL, with
  headers from ``ORCHESTRATE_HTTP_HEADER_<NAME>`` variables; what was sent is recorded in the
  run folder (``publish.json``), so a repeat sends only what changed.
* :mod:`~orchestrator.publish.publisher` — both for one run: a target that is down, slow or
  refuses is one line (:class:`~orchestrator.publish.publisher.TargetOutcome`), never a lost
  result or a changed sweep status; the publish can be repeated at any time.

Credentials come from the environment only and are never written: not into the run folder, a
log line or what is sent besides the request's own headers.

May import: errors, config, results.
"""
