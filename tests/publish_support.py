"""The publish tests' real services: an MLflow tracking server and an HTTP collector, one each
per test session, on loopback ports of their own.

* ``mlflow_server``: the full ``mlflow`` package's ``mlflow server`` (SQLite backend store, a
  local folder behind the server's artifact proxy), from a venv of its own outside the
  repository: ``ORCHESTRATE_MLFLOW_SERVER`` names its ``mlflow`` executable (``.ci/run`` makes
  the venv and sets it). Without it the tests skip, or fail under ``CI=true``. The tests read
  back what was published through the server's REST API (:class:`MlflowRest`: plain HTTP, not
  the client that published it).
* ``http_collector``: ``tests/infra/http_collector.py``, a stdlib server in a process of its own
  that stores every request (``/ok``, ``/refuse``, ``/slow/S``, ``/fail/N``; ``GET /received``).

Each server runs in a session (process group) of its own and is stopped, group and all, at the
end of the test session. Taking ``mlflow_server`` marks a test ``mlflow`` (integration tier);
``http_collector`` marks it ``subprocess``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from service_support import unavailable

SERVER_ENV = "ORCHESTRATE_MLFLOW_SERVER"
COLLECTOR = Path(__file__).resolve().parent / "infra" / "http_collector.py"
START_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stop(proc: subprocess.Popen[Any]) -> None:
    """Stop a server and everything it started (its own process group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=15)
    with contextlib.suppress(ProcessLookupError):  # children that outlived their parent
        os.killpg(proc.pid, signal.SIGKILL)


def get_json(url: str, timeout: float = 30) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def post_json(url: str, data: Any, timeout: float = 30) -> Any:
    request = urllib.request.Request(url, data=json.dumps(data).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


@dataclass
class MlflowRest:
    """What an MLflow server holds, read through its REST API (plain HTTP)."""

    uri: str

    def api(self, path: str, **query: Any) -> Any:
        return get_json(f"{self.uri}/api/2.0/mlflow/{path}?{urllib.parse.urlencode(query)}")

    def experiment(self, name: str) -> dict[str, Any] | None:
        try:
            return self.api("experiments/get-by-name", experiment_name=name)["experiment"]
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def runs(self, experiment_id: str, filter_string: str = "", view: str = "ACTIVE_ONLY"
             ) -> list[dict[str, Any]]:
        """Every run matching, with ``tags``/``params``/``metrics`` as plain dicts."""
        out, token = [], None
        while True:
            body = {"experiment_ids": [experiment_id], "filter": filter_string,
                    "run_view_type": view, "max_results": 1000}
            if token:
                body["page_token"] = token
            page = post_json(f"{self.uri}/api/2.0/mlflow/runs/search", body)
            out += [_plain(r) for r in page.get("runs", [])]
            token = page.get("next_page_token")
            if not token:
                return out

    def history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """A metric's every value, as (step, value), by step."""
        out, token = [], None
        while True:
            query = {"run_id": run_id, "metric_key": key, "max_results": 25000}
            if token:
                query["page_token"] = token
            page = self.api("metrics/get-history", **query)
            out += [(int(m.get("step", 0)), float(m["value"])) for m in page.get("metrics", [])]
            token = page.get("next_page_token")
            if not token:
                return sorted(out)

    def artifacts(self, run_id: str) -> list[str]:
        return [f["path"] for f in self.api("artifacts/list", run_id=run_id).get("files", [])]

    def artifact(self, run_id: str, path: str) -> bytes:
        query = urllib.parse.urlencode({"path": path, "run_uuid": run_id})
        with urllib.request.urlopen(f"{self.uri}/get-artifact?{query}", timeout=30) as response:
            return bytes(response.read())


def _plain(run: dict[str, Any]) -> dict[str, Any]:
    data = run.get("data", {})
    return {
        "info": run["info"],
        "id": run["info"]["run_id"],
        "name": run["info"].get("run_name", ""),
        "tags": {t["key"]: t.get("value", "") for t in data.get("tags", [])},
        "params": {p["key"]: p.get("value", "") for p in data.get("params", [])},
        "metrics": {m["key"]: float(m["value"]) for m in data.get("metrics", [])},
    }


@dataclass
class MlflowServer:
    """A running ``mlflow server``: its URI, its REST reader and its folder (backend store and
    artifacts)."""

    uri: str
    root: Path
    rest: MlflowRest


@dataclass
class Collector:
    """A running http_collector.py."""

    url: str
    store: Path

    def received(self) -> list[dict[str, Any]]:
        return list(get_json(f"{self.url}/received"))


def _wait(url: str, proc: subprocess.Popen[Any], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _stop(proc)
            raise RuntimeError(f"the server ended at start (exit {proc.returncode}):\n"
                               f"{log.read_text(errors='replace')[-3000:]}")
        with contextlib.suppress(OSError):
            urllib.request.urlopen(url, timeout=2).read()
            return
        time.sleep(0.2)
    _stop(proc)
    raise RuntimeError(f"the server did not answer {url} within {START_TIMEOUT_S:g} s:\n"
                       f"{log.read_text(errors='replace')[-3000:]}")


def start_mlflow_server(executable: str, root: Path) -> tuple[subprocess.Popen[Any], str]:
    """``mlflow server`` on a free loopback port, its store and artifacts under ``root``, in a
    session of its own (the job runner it would start is off: nothing here uses it); its
    process and URI once it answers ``/health``."""
    port = free_port()
    log = root / "server.log"
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(executable), "server", "--host", "127.0.0.1", "--port", str(port),
             "--workers", "1", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
             "--artifacts-destination", str(root / "artifacts")],
            cwd=root, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    _wait(f"{uri}/health", proc, log)
    return proc, uri


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """A real ``mlflow server`` for the session (see the module docstring)."""
    executable = os.environ.get(SERVER_ENV)
    if not executable or not os.access(executable, os.X_OK):
        unavailable(f"no MLflow server: ${SERVER_ENV} names no mlflow executable (.ci/run makes "
                    "its venv and sets it)")
    root = tmp_path_factory.mktemp("mlflow-server")
    proc, uri = start_mlflow_server(str(executable), root)
    try:
        yield MlflowServer(uri=uri, root=root, rest=MlflowRest(uri))
    finally:
        _stop(proc)


@pytest.fixture(scope="session")
def http_collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    """tests/infra/http_collector.py for the session (see the module docstring)."""
    root = tmp_path_factory.mktemp("collector")
    port_file, store, log = root / "port", root / "received.jsonl", root / "collector.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(COLLECTOR), "--port-file", str(port_file), "--store",
             str(store)], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        if not port_file.exists():
            raise RuntimeError(f"the collector did not start:\n{log.read_text(errors='replace')}")
        url = f"http://127.0.0.1:{port_file.read_text()}"
        _wait(f"{url}/received", proc, log)
        yield Collector(url=url, store=store)
    finally:
        _stop(proc)


# --- the round trip: what the server holds against the run folder ----------------------------


def expected_cell(folder: Path) -> dict[str, Any]:
    """What a cell folder says MLflow should hold, by the rules of docs/results.md, written out
    here on their own (not by the code that published): params (strings as they are, other
    values as JSON), figures (numbers; booleans 1/0; nested tables joined with '.'), series
    (lists of numbers, step 1..N)."""
    result = json.loads((folder / "result.json").read_text(encoding="utf-8"))
    params = {k: v if isinstance(v, str) else json.dumps(v) for k, v in result["params"].items()}
    figures: dict[str, float] = {}
    series: dict[str, list[tuple[int, float]]] = {}

    def walk(key: str, value: Any) -> None:
        if isinstance(value, bool | int | float):  # a boolean is 1 or 0
            figures[key] = float(value)
        elif isinstance(value, list) and value and all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in value):
            series[key] = [(i + 1, float(v)) for i, v in enumerate(value)]
        elif isinstance(value, dict):
            for sub, inner in value.items():
                walk(f"{key}.{sub}", inner)

    for key, value in result["metrics"].items():
        walk(key, value)
    telemetry = folder / "telemetry.csv"
    if telemetry.exists():
        import csv

        steps: dict[str, int] = {}
        for row in csv.DictReader(telemetry.read_text().splitlines()):
            gpu = row["gpu"]
            step = steps.get(gpu, 0)
            steps[gpu] = step + 1
            for name in ("power_w", "temp_c", "sm_clock_mhz", "util_pct", "mem_used_mib",
                         "throttled"):
                value = {"True": 1.0, "False": 0.0}.get(row[name]) if row[name] in (
                    "True", "False") else float(row[name])
                series.setdefault(f"telemetry.gpu{gpu}.{name}", []).append((step, value))
    return {"result": result, "params": params, "figures": figures, "series": series}


def round_trip_differences(rest: MlflowRest, experiment: str, run_root: Path) -> list[str]:
    """Every difference between what the MLflow server holds of the run folder ``run_root``
    (read back through its REST API) and the folder itself: cells, params, figures, step series,
    the tags the issue names, status, artifacts. Empty: the round trip is exact."""
    diffs: list[str] = []
    exp = rest.experiment(experiment)
    if exp is None:
        return [f"no experiment {experiment!r}"]
    run_id = run_root.name
    parents = rest.runs(exp["experiment_id"], f"tags.`orchestrate.run_id` = '{run_id}' and "
                        "tags.`orchestrate.kind` = 'sweep'")
    if len(parents) != 1:
        return [f"{len(parents)} parent runs of {run_id}"]
    parent = parents[0]
    children = rest.runs(exp["experiment_id"], f"tags.`mlflow.parentRunId` = '{parent['id']}'")
    by_cell = {c["tags"].get("orchestrate.cell_id"): c for c in children}
    folders = sorted(p.parent for p in (run_root / "cells").glob("*/result.json"))
    if len(children) != len(by_cell) or set(by_cell) != {f.name for f in folders}:
        diffs.append(f"cells: server {sorted(by_cell)} ({len(children)} runs), folder "
                     f"{sorted(f.name for f in folders)}")
    for folder in folders:
        child = by_cell.get(folder.name)
        if child is None:
            continue
        want = expected_cell(folder)
        result = want["result"]
        got_params = {k: v for k, v in child["params"].items() if not k.startswith("stack.")}
        if got_params != want["params"]:
            diffs.append(f"{folder.name}: params differ: "
                         f"{sorted(set(got_params.items()) ^ set(want['params'].items()))}")
        for key, value in want["figures"].items():
            got = child["metrics"].get(key)
            if got is None or not _close(got, value):
                diffs.append(f"{folder.name}: figure {key}: server {got}, folder {value}")
        for key, points in want["series"].items():
            got_points = rest.history(child["id"], key)
            if len(got_points) != len(points) or any(
                    a[0] != b[0] or not _close(a[1], b[1]) for a, b in zip(got_points, points,
                                                                         strict=False)):
                diffs.append(f"{folder.name}: series {key}: {len(got_points)} points on the "
                             f"server, {len(points)} in the folder, or values differ")
        extra = set(child["metrics"]) - set(want["figures"]) - set(want["series"])
        if extra:
            diffs.append(f"{folder.name}: metrics the folder does not have: {sorted(extra)}")
        tags = child["tags"]
        for tag, value in (("orchestrate.run_id", run_id), ("orchestrate.cell_id", folder.name),
                           ("orchestrate.config_hash", result.get("config_hash", "")),
                           ("orchestrate.status", result["status"]),
                           ("orchestrate.reason", result.get("reason", ""))):
            if tags.get(tag, "") != value:
                diffs.append(f"{folder.name}: tag {tag}: server {tags.get(tag)!r}, "
                             f"folder {value!r}")
        for tag in ("orchestrate.table_rule", "orchestrate.git_revision",
                    "orchestrate.unstable"):
            if not tags.get(tag):
                diffs.append(f"{folder.name}: tag {tag} missing")
        status = {"ok": "FINISHED", "cancelled": "KILLED"}.get(result["status"], "FAILED")
        if child["info"]["status"] != status:
            diffs.append(f"{folder.name}: status {child['info']['status']}, want {status}")
        artifacts = rest.artifacts(child["id"])
        if "result.json" not in artifacts or "log_tail.txt" not in artifacts:
            diffs.append(f"{folder.name}: artifacts {artifacts}")
        elif rest.artifact(child["id"], "result.json") != (folder / "result.json").read_bytes():
            diffs.append(f"{folder.name}: result.json artifact differs from the file")
    return diffs


def _close(a: float, b: float) -> bool:
    return a == b or abs(a - b) <= 1e-12 * max(abs(a), abs(b))
