"""One run to its targets: read once, sent to each, one outcome per target.

A target that is down, slow or refuses gives an outcome with an ``error`` line; nothing in the
run folder changes but ``publish.json``, the record of what was published where (beside
``run.json``; a folder that cannot be written loses only the record: an HTTP collector then
gets every cell again next time)::

    {"mlflow": {"http://mlflow.lab:5000": {"experiment": "demo", "link": "...", "at": ...}},
     "http": {"https://collector.lab/bench": {"cells": {"<cell id>": "<fingerprint>"},
                                              "at": ...}}}

URLs hold no credentials (:func:`orchestrator.config.publish.url_problem`), so the record holds
none either.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config.publish import Targets
from orchestrator.errors import ConfigError
from orchestrator.publish import to_http, to_mlflow
from orchestrator.publish.documents import RunDoc, read_run
from orchestrator.publish.outcome import Counts, PublishError
from orchestrator.results.folders.run_folder import RunPaths, read_json, write_json

log = logging.getLogger(__name__)

#: Seconds a request to a target may take (connect, then each answer).
DEFAULT_TIMEOUT_S = 30.0


@dataclass
class TargetOutcome:
    """What publishing one run to one target did."""

    kind: str  # "MLflow" or "HTTP collector"
    url: str
    counts: Counts = field(default_factory=Counts)
    #: Why it stopped (one line); None: done.
    error: str | None = None
    experiment: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def target(self) -> str:
        where = f"{self.kind} {self.url}"
        return f"{where} (experiment {self.experiment})" if self.experiment else where

    def line(self) -> str:
        """One line: what was published, or why not."""
        if self.error is None:
            link = f"; {self.counts.link}" if self.counts.link else ""
            return f"published to {self.target}: {self.counts.words()}{link}"
        done = (f" ({self.counts.sent} cell(s) sent before it stopped)"
                if self.counts.sent else "")
        return f"not published to {self.target}: {self.error}{done}"


def publish_run(paths: RunPaths, targets: Targets, *,
                environ: Mapping[str, str] | None = None) -> list[TargetOutcome]:
    """Publish the run folder ``paths`` to each of ``targets``; one outcome per target, in the
    order MLflow, HTTP. A ConfigError for what the user must fix first (a header variable HTTP
    cannot carry); everything a target does is in its outcome."""
    timeout_s = targets.timeout_s or DEFAULT_TIMEOUT_S
    if targets.http:
        to_http.headers_from_env(environ)  # a bad variable is the user's to fix: before anything
    run = read_run(paths)
    record = read_record(paths)
    outcomes = []
    if targets.mlflow:
        outcomes.append(_to_mlflow(run, targets.mlflow, targets.experiment or run.matrix,
                                   timeout_s, record))
    if targets.http:
        outcomes.append(_to_http(run, targets.http, timeout_s, record, environ))
    try:
        write_json(paths.published, record)
    except OSError as exc:
        log.warning("what was published is not recorded in %s (%s): an HTTP collector gets "
                    "every cell again next time", paths.published, exc.strerror or exc)
    return outcomes


def read_record(paths: RunPaths) -> dict[str, Any]:
    """``publish.json`` of a run (empty where there is none or it cannot be read)."""
    path = paths.published
    if not path.exists():
        return {}
    try:
        data = read_json(path)
    except ConfigError as exc:
        log.warning("%s; publishing as if nothing had been", exc)
        return {}
    return data if isinstance(data, dict) else {}


def _to_mlflow(run: RunDoc, uri: str, experiment: str, timeout_s: float,
               record: dict[str, Any]) -> TargetOutcome:
    outcome = TargetOutcome("MLflow", uri, experiment=experiment)
    try:
        outcome.counts = to_mlflow.publish(run, uri, experiment, timeout_s)
    except PublishError as exc:
        outcome.counts, outcome.error = exc.counts, str(exc)
        return outcome
    entry = {"experiment": experiment, "link": outcome.counts.link, "at": time.time()}
    _section(record, "mlflow")[uri] = entry
    return outcome


def _to_http(run: RunDoc, url: str, timeout_s: float, record: dict[str, Any],
             environ: Mapping[str, str] | None) -> TargetOutcome:
    outcome = TargetOutcome("HTTP collector", url)
    section = _section(record, "http")
    entry = section.get(url)
    cells = entry.get("cells") if isinstance(entry, dict) else None
    sent = {str(k): str(v) for k, v in cells.items()} if isinstance(cells, dict) else {}
    try:
        outcome.counts = to_http.publish(run, url, sent, timeout_s, environ)
    except PublishError as exc:
        outcome.counts, outcome.error = exc.counts, str(exc)
    section[url] = {"cells": sent, "at": time.time()}
    return outcome


def _section(record: dict[str, Any], name: str) -> dict[str, Any]:
    section = record.get(name)
    if not isinstance(section, dict):
        section = record[name] = {}
    return section
