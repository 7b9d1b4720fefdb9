"""Where runs are published: ``[publish]`` of a matrix file or of the user's config file.

One table, read the same in both places::

    [publish]
    mlflow = "http://mlflow.lab.example:5000"    # an MLflow tracking server
    http = "https://collector.lab.example/bench"  # an HTTP collector: one JSON document per cell
    experiment = "nightly-v100"                   # MLflow experiment (default: the matrix name)
    timeout_s = 30                                # a request that takes longer: target down
    after_sweep = true                            # publish every sweep when it ends (default false)

Each key is looked up first in the run's matrix (its copy in the run folder: the matrix as it
was), then in the user's config file (:mod:`orchestrator.config.defaults`); a command-line flag
(``orchestrate publish --mlflow URI``) wins over both, and where nothing names a target,
``$MLFLOW_TRACKING_URI`` (MLflow's own variable) does (:func:`resolve`).

A target is an ``http://`` or ``https://`` URL with a host and no credentials in it: user names,
passwords and tokens come from the environment only (MLflow's ``MLFLOW_TRACKING_TOKEN``,
``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``; ``ORCHESTRATE_HTTP_HEADER_<NAME>``
for the collector), so a URL can be written into a matrix file, a run's ``matrix.toml`` copy,
a log line or ``publish.json`` without leaking one (:func:`url_problem`).
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field, ValidationError
from pydantic_core import PydanticCustomError

from orchestrator.config.files import NOT_SHOWN, StrictModel, problems_from_validation, read_toml
from orchestrator.config.redact import looks_secret
from orchestrator.errors import ConfigError, Problem

#: MLflow's own variable for its tracking server: the last default of ``mlflow``.
MLFLOW_URI_ENV = "MLFLOW_TRACKING_URI"
#: Longest target URL accepted.
MAX_URL = 2048


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a publishing target (None: it can): not http(s), no host,
    credentials in it (``user:password@``, a query parameter named like a secret), spaces or
    control characters."""
    if not url or len(url) > MAX_URL:
        return f"give an http:// or https:// URL of at most {MAX_URL} characters"
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        return "spaces and control characters are not allowed in a URL"
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as exc:
        return f"not a URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return "give an http:// or https:// URL (MLflow's tracking server, a collector)"
    if not parts.hostname:
        return "the URL names no host"
    if parts.username is not None or parts.password is not None:
        return ("credentials do not go into the URL (they would be written where the URL is): "
                "use MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD or "
                "MLFLOW_TRACKING_TOKEN for MLflow, ORCHESTRATE_HTTP_HEADER_AUTHORIZATION for a "
                "collector")
    secret = [k for k, _ in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
              if looks_secret(k)]
    if secret:
        return (f"the query parameter {secret[0]!r} looks like a credential: send it as a "
                "header from the environment (ORCHESTRATE_HTTP_HEADER_<NAME>) instead")
    if parts.fragment:
        return "a URL fragment (#...) is never sent; leave it out"
    return None


def _checked_url(url: str) -> str:
    problem = url_problem(url)
    if problem:
        # the URL is not repeated in the message: it may hold the credential it is refused for
        raise PydanticCustomError(NOT_SHOWN, problem)
    return url


TargetURL = Annotated[str, Field(max_length=MAX_URL), AfterValidator(_checked_url)]
#: An MLflow experiment name: printable, 1..500 characters (MLflow's limit).
ExperimentName = Annotated[str, Field(min_length=1, max_length=500,
                                      pattern=r"^[^\x00-\x1f\x7f]+$")]


class PublishSettings(StrictModel):
    """``[publish]``: where a matrix's runs are published, and whether every sweep is."""

    mlflow: TargetURL | None = Field(
        None, description="MLflow tracking server (http:// or https://, no credentials: those "
        "come from MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME/PASSWORD).")
    http: TargetURL | None = Field(
        None, description="HTTP collector receiving one JSON document per cell (POST; headers "
        "from ORCHESTRATE_HTTP_HEADER_<NAME> variables).")
    experiment: ExperimentName | None = Field(
        None, description="MLflow experiment of the runs (default: the matrix name).")
    timeout_s: Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)] | None = Field(
        None, description="Seconds a request may take before the target counts as down "
        "(default 30; `orchestrate publish --timeout` wins).")
    after_sweep: bool | None = Field(
        None, description="Publish every sweep (and import) of the matrix when it ends; a "
        "server that is down or refuses leaves the results and the exit status alone "
        "(default false).")


@dataclass(frozen=True)
class Targets:
    """Where one run goes, resolved: an MLflow server, a collector, or both."""

    mlflow: str | None = None
    http: str | None = None
    experiment: str | None = None
    timeout_s: float | None = None

    def __bool__(self) -> bool:
        return bool(self.mlflow or self.http)


def settings_from(data: Any, file: str) -> PublishSettings:
    """``[publish]`` of a parsed file (absent: empty settings); a ConfigError naming ``file``
    and the key."""
    if data is None:
        return PublishSettings()
    try:
        return PublishSettings.model_validate(data)
    except ValidationError as exc:
        problems = problems_from_validation(file, exc, model=PublishSettings,
                                            keys_hint="known keys: mlflow, http, experiment, "
                                            "timeout_s, after_sweep")
        raise ConfigError([Problem(p.file, f"publish.{p.field}".rstrip("."), p.message)
                           for p in problems]) from None


def run_settings(matrix_copy: Path) -> PublishSettings:
    """``[publish]`` of a run's matrix copy (``matrix.toml`` in the run folder); a run without
    one (an old or imported run) has none."""
    if not matrix_copy.exists():
        return PublishSettings()
    data = read_toml(matrix_copy)  # a regular file only (a FIFO planted there cannot hang it)
    return settings_from(data.get("publish"), str(matrix_copy))


def resolve(*layers: PublishSettings, mlflow: str | None = None, http: str | None = None,
            experiment: str | None = None, timeout_s: float | None = None,
            environ: Mapping[str, str] | None = None) -> Targets:
    """The targets of a run: the flags given here, else each key from the first of ``layers``
    that sets it (the run's matrix, then the user's config); where none names a target,
    ``$MLFLOW_TRACKING_URI``. The flags and the environment's URI are checked as the files'
    are (a ConfigError naming the flag or the variable)."""
    environ = os.environ if environ is None else environ
    problems = [Problem("", flag, problem) for flag, value in (("--mlflow", mlflow),
                                                               ("--http", http))
                if value is not None and (problem := url_problem(value))]
    if experiment is not None and not _experiment_ok(experiment):
        problems.append(Problem("", "--experiment", "give 1 to 500 printable characters"))
    if problems:
        raise ConfigError(problems)

    def first(key: str) -> Any:
        return next((getattr(s, key) for s in layers if getattr(s, key) is not None), None)

    uri, url = mlflow or first("mlflow"), http or first("http")
    if uri is None and url is None and environ.get(MLFLOW_URI_ENV):
        uri = environ[MLFLOW_URI_ENV]
        problem = url_problem(uri)
        if problem:
            raise ConfigError(problem, field=f"${MLFLOW_URI_ENV}")
    return Targets(mlflow=uri, http=url, experiment=experiment or first("experiment"),
                   timeout_s=timeout_s or first("timeout_s"))


def after_sweep(*layers: PublishSettings) -> bool:
    """Whether a sweep publishes when it ends: ``after_sweep`` of the first layer that sets it
    (the matrix, then the user's config), else no."""
    return bool(next((s.after_sweep for s in layers if s.after_sweep is not None), False))


def _experiment_ok(name: str) -> bool:
    return 0 < len(name) <= 500 and not any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in name)
