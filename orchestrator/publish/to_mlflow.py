"""A run on an MLflow tracking server: one experiment per matrix, a parent run per sweep, a child
run per cell.

What the server gets (:mod:`orchestrator.publish.documents` makes the values):

* the experiment named after the matrix (or ``experiment``), created when missing;
* a **parent run** named after the run id, tagged ``orchestrate.kind = sweep`` and
  ``orchestrate.run_id``, with the sweep's tags (backend, git revision, table rule, counts), its
  summary table as the run's description, and ``run.json``, ``matrix.toml``, ``summary.*`` as
  artifacts; its status is the sweep's (FINISHED: every cell ok, FAILED, KILLED: interrupted,
  RUNNING: not ended);
* a **child run** per cell (``mlflow.parentRunId``), named after the cell id: its params, its
  figures as metrics (step 0), its series as step series, its tags (run id, cell id,
  configuration hash, status and reason, table rule, git revision, unstable flag, ...) and
  ``result.json``, ``summary.json``, plots and ``log_tail.txt`` as artifacts; status FINISHED
  (ok), KILLED (cancelled) or FAILED.

Cells are published :data:`WORKERS` at a time (the client's HTTP session is shared; each
request waits on the server). Publishing is idempotent and resumable. Each run carries
``orchestrate.fingerprint`` (the hash of everything sent of it), written last: a child whose
fingerprint equals the cell's is left alone; a parent whose fingerprint equals the run's means
nothing at all is to do (two requests: the experiment, the parent).
A cell whose data changed — run again with ``--resume``, or an earlier publish cut short before
its fingerprint was written — gets a new child run, tagged ``orchestrate.replaces`` (the old
run's id) and ``orchestrate.replaced_because``; the old one is tagged
``orchestrate.replaced_by`` and deleted (MLflow keeps deleted runs until ``mlflow gc``; the UI
shows them under "Deleted"). Params cannot change in MLflow and metrics only add up, so a new
run is the one way to replace a cell's data. Two children of one cell (two publishes at the
same moment) are brought back to one.

The client is ``mlflow-skinny`` (the ``publish`` extra), imported here only. It reads its
credentials from its own variables (``MLFLOW_TRACKING_TOKEN``, ``MLFLOW_TRACKING_USERNAME`` /
``MLFLOW_TRACKING_PASSWORD``, ...); nothing here reads, logs or writes them. Its retries are
set to fail in about a minute against a server that is down (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``
2, ``..._BACKOFF_FACTOR`` 1, ``..._TIMEOUT`` the publish's timeout) unless those variables are
set; its own log lines are kept below warnings (``-v`` shows them).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from orchestrator.publish.documents import TAG, CellDoc, RunDoc, mlflow_status
from orchestrator.publish.outcome import Counts, PublishError

log = logging.getLogger(__name__)

FINGERPRINT = f"{TAG}fingerprint"
REPLACES = f"{TAG}replaces"
REPLACED_BY = f"{TAG}replaced_by"
REPLACED_BECAUSE = f"{TAG}replaced_because"
#: What the client retries, unless the user's environment says otherwise.
CLIENT_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                   "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                   "MLFLOW_CONFIGURE_LOGGING": "false"}
#: Always set for one publish: the client prints each run's link on stdout when it ends one
#: (ours is one line per target), and asks the server for the run to make it.
CLIENT_FORCED = {"MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
#: Loggers of the client that say each retry: below warnings unless -v.
NOISY_LOGGERS = ("mlflow", "urllib3", "requests")
#: Runs asked for per page.
PAGE = 1000
#: Cells published at once (each is a few requests, each waiting on the server's answer).
WORKERS = 4


def publish(run: RunDoc, uri: str, experiment: str, timeout_s: float = 30.0) -> Counts:
    """Bring the server at ``uri`` to hold ``run`` (see the module docstring); PublishError in
    one line when it cannot."""
    with client_environment(timeout_s), quiet_client_logs():
        client = make_client(uri)
        counts = Counts()
        try:
            return _publish(client, run, uri, experiment, counts)
        except PublishError as exc:
            exc.counts = counts
            raise
        except Exception as exc:  # the client's errors: MlflowException, requests', OSError
            if not _client_error(exc):
                raise
            raise PublishError(why(exc), counts) from None


def make_client(uri: str) -> Any:
    """An ``MlflowClient`` for ``uri``; PublishError when the client is not installed."""
    try:
        from mlflow.tracking import MlflowClient
    except ImportError as exc:
        missing = getattr(exc, "name", "") or ""
        what = ("the MLflow client is not installed" if missing.split(".")[0] == "mlflow"
                else f"the MLflow client cannot be imported ({exc})")
        raise PublishError(f"{what}: install the publish extra into orchestrate's environment "
                           "(pip install 'orchestrate[publish]', which is mlflow-skinny)"
                           ) from None
    return MlflowClient(tracking_uri=uri)


@contextlib.contextmanager
def client_environment(timeout_s: float) -> Iterator[None]:
    """The client's retry and timeout settings for one publish (the user's own
    ``MLFLOW_HTTP_REQUEST_*`` variables win), restored after."""
    wanted = {**CLIENT_DEFAULTS, "MLFLOW_HTTP_REQUEST_TIMEOUT": str(max(1, round(timeout_s)))}
    changes = {k: v for k, v in wanted.items() if k not in os.environ} | CLIENT_FORCED
    saved = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def quiet_client_logs() -> Iterator[None]:
    """The client's loggers at errors only (a retry is not the user's concern: the outcome is
    one line), unless the user asked for more (``-v``: the root logger at info or below)."""
    if logging.getLogger().getEffectiveLevel() <= logging.INFO:
        yield
        return
    loggers = [logging.getLogger(name) for name in NOISY_LOGGERS]
    saved = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, saved, strict=True):
            lg.setLevel(level)


def _publish(client: Any, run: RunDoc, uri: str, experiment: str, counts: Counts) -> Counts:
    exp_id = experiment_id(client, experiment, run.matrix)
    parents = find_parents(client, exp_id, run.run_id)
    parent = parents[0] if parents else None
    for extra in parents[1:]:  # two publishes of the run at the same moment: keep one
        counts.duplicates_removed += remove_sweep(client, exp_id, extra, parents[0])
    if parent is not None and parent.data.tags.get(FINGERPRINT) == run.fingerprint:
        counts.unchanged = len(run.cells)
        counts.link = ui_link(uri, exp_id, parent.info.run_id)
        return counts
    if parent is None:
        parent = client.create_run(exp_id, start_time=run.started_ms, run_name=run.run_id,
                                   tags=dict(run.tags))
    parent_id = parent.info.run_id
    children = children_of(client, exp_id, parent_id)
    with ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="publish") as pool:
        futures = [pool.submit(publish_cell, client, exp_id, parent_id, cell,
                               children.get(cell.cell_id, [])) for cell in run.cells]
        try:
            for future in as_completed(futures):
                what, duplicates = future.result()
                setattr(counts, what, getattr(counts, what) + 1)
                counts.duplicates_removed += duplicates
        except BaseException:
            for future in futures:  # the cells not started yet: the server is failing
                future.cancel()
            raise
    client.log_batch(parent_id, tags=_tags({**run.tags, "mlflow.note.content": run.note}),
                     synchronous=True)
    for path in run.files.values():
        client.log_artifact(parent_id, str(path))
    client.set_tag(parent_id, FINGERPRINT, run.fingerprint)
    if run.status != "RUNNING":
        client.set_terminated(parent_id, run.status, end_time=run.finished_ms)
    counts.link = ui_link(uri, exp_id, parent_id)
    return counts


def experiment_id(client: Any, name: str, matrix: str) -> str:
    """The id of the experiment ``name``, created when missing; PublishError when it was
    deleted (the server refuses the name until it is restored or purged)."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is None:
        try:
            return str(client.create_experiment(name, tags={f"{TAG}matrix": matrix}))
        except MlflowException as exc:
            if getattr(exc, "error_code", "") != "RESOURCE_ALREADY_EXISTS":
                raise
            found = client.get_experiment_by_name(name)  # made at the same moment elsewhere
            if found is None:
                raise PublishError(f"the experiment {name!r} exists on the server but cannot "
                                   "be read (deleted?): restore it (mlflow experiments restore) "
                                   "or publish into another with --experiment") from None
    if found.lifecycle_stage == "deleted":
        raise PublishError(f"the experiment {name!r} (id {found.experiment_id}) is deleted on "
                           "the server: restore it (mlflow experiments restore --experiment-id "
                           f"{found.experiment_id}) or publish into another with --experiment")
    return str(found.experiment_id)


def find_parents(client: Any, exp_id: str, run_id: str) -> list[Any]:
    """The active parent runs of the sweep ``run_id``: one, or none yet; more only after two
    publishes at the same moment (the one to keep first: a complete one, then by id)."""
    runs = _search(client, exp_id, f"tags.`{TAG}kind` = 'sweep' and "
                   f"tags.`{TAG}run_id` = '{_quoted(run_id)}'")
    runs.sort(key=lambda r: (FINGERPRINT not in r.data.tags, r.info.run_id))
    return runs


def remove_sweep(client: Any, exp_id: str, extra: Any, keep: Any) -> int:
    """Delete a duplicate parent run and its children, each tagged ``replaced_by`` the parent
    kept; how many runs were removed."""
    keep_id = keep.info.run_id
    runs = [c for group in children_of(client, exp_id, extra.info.run_id).values()
            for c in group] + [extra]
    for run in runs:
        client.set_tag(run.info.run_id, REPLACED_BY, keep_id)
        client.delete_run(run.info.run_id)
    return len(runs)


def children_of(client: Any, exp_id: str, parent_id: str) -> dict[str, list[Any]]:
    """The active child runs of a parent, by cell id."""
    out: dict[str, list[Any]] = {}
    for child in _search(client, exp_id, f"tags.`mlflow.parentRunId` = '{_quoted(parent_id)}'"):
        cell_id = child.data.tags.get(f"{TAG}cell_id")
        if cell_id:
            out.setdefault(cell_id, []).append(child)
    return out


def publish_cell(client: Any, exp_id: str, parent_id: str, cell: CellDoc,
                 existing: Sequence[Any]) -> tuple[str, int]:
    """One cell: left alone when a child has its fingerprint, else a new child replacing the
    old ones (see the module docstring). What was done (``new``, ``replaced`` or
    ``unchanged``: a field of :class:`Counts`) and how many duplicate children were removed."""
    current = [r for r in existing if r.data.tags.get(FINGERPRINT) == cell.fingerprint]
    if current:
        extras = [r for r in existing if r is not current[0]]
        for extra in extras:
            client.set_tag(extra.info.run_id, REPLACED_BY, current[0].info.run_id)
            client.delete_run(extra.info.run_id)
        return "unchanged", len(extras)
    tags = {**cell.tags, "mlflow.parentRunId": parent_id}
    if existing:
        tags[REPLACES] = ",".join(r.info.run_id for r in existing)
        tags[REPLACED_BECAUSE] = replaced_because(existing, cell)
    child = client.create_run(exp_id, start_time=cell.started_ms, run_name=cell.cell_id,
                              tags=tags)
    child_id = child.info.run_id
    when = cell.finished_ms or cell.started_ms or int(time.time() * 1000)
    _log_values(client, child_id, cell, when)
    for path in cell.files.values():
        client.log_artifact(child_id, str(path))
    for name, text in cell.texts.items():
        client.log_text(child_id, text, name)
    client.set_tag(child_id, FINGERPRINT, cell.fingerprint)
    client.set_terminated(child_id, mlflow_status(cell.status), end_time=cell.finished_ms)
    for old in existing:
        client.set_tag(old.info.run_id, REPLACED_BY, child_id)
        client.delete_run(old.info.run_id)
    return ("replaced" if existing else "new"), 0


def replaced_because(existing: Sequence[Any], cell: CellDoc) -> str:
    """Why a cell's earlier child run is replaced, in words."""
    if all(FINGERPRINT not in r.data.tags for r in existing):
        return "an earlier publish of this cell was cut short"
    started = cell.tags.get(f"{TAG}started_at", "")
    if any(r.data.tags.get(f"{TAG}started_at", "") != started for r in existing):
        return "the cell was run again (orchestrate matrix --resume)"
    return "the cell's files changed since it was published"


def ui_link(uri: str, exp_id: str, run_id: str) -> str:
    """The MLflow UI's page of a run."""
    return f"{uri.rstrip('/')}/#/experiments/{exp_id}/runs/{run_id}"


def why(exc: BaseException) -> str:
    """A client error in one line: what the server (or the network) did."""
    text = " ".join(str(e) for e in _chain(exc))
    status = getattr(exc, "error_code", None)
    if re.search(r"Connection refused|ECONNREFUSED", text):
        return "cannot connect: connection refused (is the tracking server running?)"
    if re.search(r"Name or service not known|nodename nor servname|getaddrinfo failed|"
                 r"Temporary failure in name resolution", text):
        return "cannot connect: the host name does not resolve"
    if re.search(r"timed out|Timeout|ReadTimeout", text):
        return "no answer in time (the server is slow or unreachable; --timeout S waits longer)"
    found = re.search(r"too many (\d{3}) error responses", text)
    if found:
        return f"the server kept answering HTTP {found.group(1)}"
    found = re.search(r"failed with error code (\d{3})", text)
    if found:
        return f"the server refused: HTTP {found.group(1)}{_body(text)}"
    if status and isinstance(status, str) and status not in ("INTERNAL_ERROR",):
        message = _first_line(str(exc)).removeprefix(f"{status}: ")
        return f"the server refused ({status}): {message}"
    if re.search(r"Max retries exceeded|Connection aborted|RemoteDisconnected|"
                 r"ConnectionError|Connection reset", text):
        return f"cannot connect: {_first_line(_innermost(text))}"
    return _first_line(str(exc))


def _client_error(exc: BaseException) -> bool:
    """Whether ``exc`` comes from the client or the network (not a bug of ours)."""
    kinds: list[type[BaseException]] = [OSError]
    with contextlib.suppress(ImportError):
        from mlflow.exceptions import MlflowException

        kinds.append(MlflowException)
    with contextlib.suppress(ImportError):
        import requests

        kinds.append(requests.RequestException)
    return isinstance(exc, tuple(kinds))


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _innermost(text: str) -> str:
    found = re.findall(r"\(Caused by \w+\((?:'[^']*',\s*)?'?(.*?)'?\)\)", text)
    return found[-1] if found else text


def _body(text: str) -> str:
    found = re.search(r"Response body: '(.*)'", text, re.S)
    return f": {_first_line(found.group(1))}" if found and found.group(1).strip() else ""


def _first_line(text: str, limit: int = 200) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _quoted(value: str) -> str:
    """A value inside a search filter's single quotes (run ids are names: no quote in them)."""
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _search(client: Any, exp_id: str, filter_string: str) -> list[Any]:
    out: list[Any] = []
    token = None
    while True:
        page = client.search_runs([exp_id], filter_string=filter_string, max_results=PAGE,
                                  page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


def _tags(tags: Mapping[str, str]) -> list[Any]:
    from mlflow.entities import RunTag

    return [RunTag(k, v) for k, v in tags.items()]


def _log_values(client: Any, run_id: str, cell: CellDoc, when: int) -> None:
    from mlflow.entities import Metric, Param

    metrics = [Metric(k, v, when, 0) for k, v in cell.figures.items()]
    for key, points in cell.series.items():
        metrics += [Metric(key, p.value, p.timestamp_ms, p.step) for p in points]
    params = [Param(k, v) for k, v in cell.params.items()]
    client.log_batch(run_id, metrics=metrics, params=params, synchronous=True)
