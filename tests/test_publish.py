"""Publishing runs (issue 35): to a real MLflow tracking server and a real HTTP collector.

The unit tests check the pure parts: target URLs, where the targets come from, the ``[publish]``
tables, what a run folder becomes (:mod:`orchestrator.publish.documents`), the header
variables, the message without the MLflow client.

The integration tests publish real run folders (made by sweeps of the stand-in workload,
tests/standin/) to a real ``mlflow server`` and to tests/infra/http_collector.py
(tests/publish_support.py starts both), and read back through MLflow's REST API, with plain
HTTP, what arrived: the round trip has no difference, publishing twice creates nothing twice, a
``--resume``d cell replaces its child run (marked), a server down, slow or refusing leaves the
sweep's results and exit status alone in one line, credentials never reach a file or a log, an
imported run publishes the same way, and the MLflow UI (headless Chromium) shows the sweep's
runs. One cell's ``telemetry.csv`` is written by the test (the format of workload/telemetry.py):
no GPU here samples one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from publish_support import MlflowServer, round_trip_differences
from results_support import Config, params, write_run
from test_report_html import chromium  # noqa: F401 - the fixture (headless Chromium)

from orchestrator.cli import main
from orchestrator.config.publish import (
    PublishSettings,
    Targets,
    after_sweep,
    resolve,
    run_settings,
    url_problem,
)
from orchestrator.errors import ConfigError
from orchestrator.publish import to_http, to_mlflow
from orchestrator.publish.documents import flatten_figures, metric_name, read_run
from orchestrator.publish.outcome import PublishError
from orchestrator.publish.publisher import publish_run
from orchestrator.results.folders.run_folder import RunPaths, find_run

TOKEN = "tok-0123456789-secret-bearer"
USER, PASSWORD = "bench-bot", "pw-0123456789-secret"
HEADER_SECRET = "ApiKey 0123456789-collector-secret"
SECRETS = (TOKEN, PASSWORD, HEADER_SECRET.split()[1])

TELEMETRY = """timestamp,gpu,power_w,temp_c,sm_clock_mhz,util_pct,mem_used_mib,throttled
1795800648.50,0,250.5,61.0,1410.0,98.0,30000.0,False
1795800648.50,1,248.0,60.0,1410.0,97.0,30010.0,False
1795800649.00,0,300.25,63.0,1395.0,99.0,30100.0,True
1795800649.00,1,251.0,61.0,1410.0,98.0,30120.0,False
"""


# --- unit: targets and settings --------------------------------------------------------------


@pytest.mark.parametrize("url, ok", [
    ("http://127.0.0.1:5000", True), ("https://mlflow.lab.example/", True),
    ("https://collector.lab/bench?index=nightly", True),
    ("ftp://host/x", False), ("file:///tmp/mlruns", False), ("databricks", False),
    ("http://user:pass@host:5000", False), ("https://bot@host", False),
    ("https://host/x?token=abc", False), ("https://host/x?api_key=abc", False),
    ("http:///nohost", False), ("http://host/a b", False), ("http://host:99999", False),
    ("http://host/#frag", False), ("", False),
])
def test_which_urls_can_be_targets(url: str, ok: bool) -> None:
    assert (url_problem(url) is None) is ok


def test_a_url_with_credentials_is_refused_saying_where_they_go() -> None:
    problem = url_problem("http://me:hunter22@mlflow.lab:5000") or ""
    assert "MLFLOW_TRACKING_PASSWORD" in problem and "hunter22" not in problem


def test_targets_come_from_the_flags_then_the_matrix_then_the_config_then_mlflows_variable():
    matrix = PublishSettings(mlflow="http://matrix:5000", experiment="nightly")
    user = PublishSettings(mlflow="http://user:5000", http="http://collector/x",
                           after_sweep=True)
    env = {"MLFLOW_TRACKING_URI": "http://env:5000"}
    assert resolve(matrix, user, environ=env) == Targets(
        "http://matrix:5000", "http://collector/x", "nightly")
    assert resolve(matrix, user, mlflow="http://flag:1", experiment="e", environ=env) == Targets(
        "http://flag:1", "http://collector/x", "e")
    assert resolve(PublishSettings(), user, environ=env).mlflow == "http://user:5000"
    assert resolve(PublishSettings(), PublishSettings(), environ=env) == Targets("http://env:5000")
    # MLflow's variable is a default of MLflow only where nothing names a target
    assert resolve(PublishSettings(), PublishSettings(), http="http://c/x",
                   environ=env) == Targets(None, "http://c/x")
    assert not resolve(PublishSettings(), environ={})
    slow = PublishSettings(timeout_s=5)
    assert resolve(matrix, slow, environ={}).timeout_s == 5
    assert resolve(matrix, slow, timeout_s=1.5, environ={}).timeout_s == 1.5
    assert after_sweep(PublishSettings(), user) is True
    assert after_sweep(PublishSettings(after_sweep=False), user) is False
    assert after_sweep(PublishSettings(), PublishSettings()) is False


def test_flags_and_mlflows_variable_are_checked_as_the_files_are() -> None:
    with pytest.raises(ConfigError) as err:
        resolve(mlflow="http://u:p@h", http="gopher://x", experiment="", environ={})
    assert [p.field for p in err.value.problems] == ["--mlflow", "--http", "--experiment"]
    with pytest.raises(ConfigError, match=r"\$MLFLOW_TRACKING_URI"):
        resolve(environ={"MLFLOW_TRACKING_URI": "file:./mlruns"})


def test_the_publish_table_is_strict_in_the_matrix_and_the_user_config(write_matrix, tmp_path,
                                                                     monkeypatch) -> None:
    from orchestrator.config.defaults import load_user_config
    from orchestrator.plan.matrix import load_matrix

    path = write_matrix("""
        [workload]
        hardware = "cpu"
        [publish]
        mlflow = "http://me:secret@mlflow:5000"
        experimnt = "x"
    """)
    with pytest.raises(ConfigError) as err:
        load_matrix(path)
    fields = sorted(p.field for p in err.value.problems)
    assert fields == ["publish.experimnt", "publish.mlflow"], err.value
    assert "secret" not in str(err.value)
    config = tmp_path / "config.toml"
    config.write_text('[publish]\nmlflow = "http://mlflow.lab:5000"\nafter_sweep = "yes"\n')
    with pytest.raises(ConfigError, match="after_sweep"):
        load_user_config(config)
    config.write_text('[publish]\nmlflow = "http://mlflow.lab:5000"\nafter_sweep = true\n')
    assert load_user_config(config)[0].publish == PublishSettings(
        mlflow="http://mlflow.lab:5000", after_sweep=True)


def test_a_runs_settings_are_those_of_its_matrix_copy(tmp_path: Path) -> None:
    copy = tmp_path / "matrix.toml"
    assert run_settings(copy) == PublishSettings()  # an old or imported run: none
    copy.write_text('[matrix]\nname = "m"\n[publish]\nhttp = "http://c:1/x"\n')
    assert run_settings(copy) == PublishSettings(http="http://c:1/x")
    copy.write_text('[publish]\nhttp = 3\n')
    with pytest.raises(ConfigError, match="publish.http"):
        run_settings(copy)


# --- unit: what a run folder becomes ---------------------------------------------------------


def test_figures_are_flattened_into_numbers_series_and_text() -> None:
    figures, series, texts = flatten_figures({
        "train.total_ips": 100.0, "iterations": 8, "telemetry.throttled": True,
        "iteration_times": [0.1, 0.2], "per_gpu.iteration_times": {"0": [0.1], "1": [0.3]},
        "missing": None, "mixed": [1, "x"], "note": "fell back to fp32"})
    assert figures == {"train.total_ips": 100.0, "iterations": 8.0, "telemetry.throttled": 1.0}
    assert series == {"iteration_times": [0.1, 0.2], "per_gpu.iteration_times.0": [0.1],
                      "per_gpu.iteration_times.1": [0.3]}
    assert texts == {"note": "fell back to fp32"}


@pytest.mark.parametrize("name, valid", [
    ("train.total_ips", "train.total_ips"), ("ncu/sm__inst.sum", "ncu/sm__inst.sum"),
    ("a//b", "a/_/b"), ("../x", "_/x"), ("gpu 0: power (W)", "gpu 0: power _W_"), ("", "_"),
])
def test_names_are_made_valid_for_mlflow(name: str, valid: str) -> None:
    assert metric_name(name) == valid


def test_a_run_folder_becomes_documents_with_stable_fingerprints(tmp_path: Path) -> None:
    paths = write_run(tmp_path, "m", "20261101-000000-aaaa",
                      [Config(params(batch_size=64), [100.0, None]),
                       Config(params(batch_size=128), [190.0, 200.0])])
    run = read_run(paths)
    assert [c.cell_id for c in run.cells] == [c.cell_id for c in paths.results()]
    assert len(run.cells) == 4
    failed = next(c for c in run.cells if c.status == "failed")
    assert failed.tags["orchestrate.reason"].startswith("exit code 1")
    assert failed.figures == {}
    ok = next(c for c in run.cells if c.status == "ok")
    assert ok.params["batch_size"] in ("64", "128") and ok.params["stack.torch"] == "2.4.0"
    assert ok.tags["orchestrate.git_revision"] == "0123456789abcdef"
    assert ok.tags["orchestrate.table_rule"] == "median"
    assert ok.document["figures"]["train.total_ips"] in (100.0, 190.0, 200.0)
    assert run.status == "FAILED" and run.tags["orchestrate.cells_failed"] == "1"
    assert read_run(paths).fingerprint == run.fingerprint  # nothing changed: same fingerprint
    result = paths.cell_result(ok.cell_id)
    data = json.loads(result.read_text())
    data["metrics"]["train.total_ips"] += 1
    result.write_text(json.dumps(data))
    again = read_run(paths)
    changed = {c.cell_id for c, d in zip(run.cells, again.cells, strict=True)
               if c.fingerprint != d.fingerprint}
    assert changed == {ok.cell_id} and again.fingerprint != run.fingerprint


def test_links_in_a_run_folder_are_never_followed_into_what_is_published(tmp_path) -> None:
    """A shared results folder may hold a link planted in a run: its target is not sent."""
    secret = tmp_path / "elsewhere.txt"
    secret.write_text("private key material\n")
    paths = write_run(tmp_path / "results", "m", "20261101-000000-aaaa",
                      [Config(params(), [100.0])])
    (cell_id,) = [r.cell_id for r in paths.results()]
    folder = paths.cell_dir(cell_id)
    for name in ("summary.json", "log.txt", "telemetry.csv", "plot.png"):
        (folder / name).symlink_to(secret)
    (paths.root / "summary.txt").symlink_to(secret)
    run = read_run(paths)
    (cell,) = run.cells
    assert set(cell.files) == {"result.json"} and "summary.txt" not in run.files
    assert "private" not in json.dumps(cell.texts) and not cell.series


def test_a_large_summary_table_is_cut_to_what_mlflow_keeps_of_a_description(tmp_path) -> None:
    configs = [Config(params(batch_size=b, arch=f"arch_with_a_long_name_{b}"), [100.0 + b])
               for b in range(1, 201)]
    run = read_run(write_run(tmp_path, "big", "20261101-000000-aaaa", configs))
    assert len(run.note) <= 8000 and run.note.count("\n") > 20
    assert "summary.txt among the artifacts" in run.note


def test_collector_headers_come_from_the_environment_and_are_checked() -> None:
    env = {"ORCHESTRATE_HTTP_HEADER_AUTHORIZATION": "Bearer x",
           "ORCHESTRATE_HTTP_HEADER_X_SCOPE_ORGID": "lab", "OTHER": "y"}
    assert to_http.headers_from_env(env) == {"Authorization": "Bearer x", "X-Scope-Orgid": "lab"}
    with pytest.raises(ConfigError) as err:
        to_http.headers_from_env({"ORCHESTRATE_HTTP_HEADER_BAD": "a\r\nInjected: 1",
                                  "ORCHESTRATE_HTTP_HEADER_": "v"})
    text = str(err.value)
    assert "$ORCHESTRATE_HTTP_HEADER_BAD" in text and "Injected" not in text


def test_without_the_mlflow_client_publish_says_how_to_install_it(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)  # as if it were not installed
    with pytest.raises(PublishError, match=r"not installed: .*orchestrate\[publish\]"):
        to_mlflow.make_client("http://127.0.0.1:1")


def test_client_settings_are_restored_and_the_users_own_win(monkeypatch) -> None:
    import os

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "5")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    with to_mlflow.client_environment(7):
        assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "5"
        assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "7"
        assert os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] == "true"
    assert "MLFLOW_HTTP_REQUEST_TIMEOUT" not in os.environ


# --- integration: real servers -----------------------------------------------------------------


@pytest.fixture(scope="module")
def sweep_folder(tmp_path_factory, standin) -> Path:
    """A run folder made by a real sweep of the stand-in: 2 configurations x 2 repeats, one
    cell with a telemetry.csv (written here: no GPU samples one), kept as the template the
    tests copy."""
    from orchestrator.plan.matrix import load_matrix
    from orchestrator.sweep import run_sweep

    root = tmp_path_factory.mktemp("publish-sweep")
    path = root / "pub.toml"
    text = standin.matrix("pub").replace("iterations = 2", "iterations = 12").replace(
        '[matrix]\nname = "pub"\n', '[matrix]\nname = "pub"\nrepeats = 2\n')
    path.write_text(text + '\n[axes]\nbatch_size = [2, 4]\n\n[hardware.cpu]\ndevice = "cpu"\n')
    outcome = run_sweep(load_matrix(path), results_root=root / "results")
    assert outcome.exit_code == 0, outcome.problems
    first = sorted((outcome.paths.root / "cells").iterdir())[0]
    (first / "telemetry.csv").write_text(TELEMETRY)
    return outcome.paths.root


def copy_run(template: Path, tmp_path: Path, matrix: str | None = None) -> RunPaths:
    """The template run folder copied under ``tmp_path/results/<matrix>/``."""
    target = tmp_path / "results" / (matrix or template.parent.name) / template.name
    shutil.copytree(template, target, symlinks=True)
    return RunPaths(target)


def all_runs(server: MlflowServer, experiment: str) -> list[dict[str, Any]]:
    exp = server.rest.experiment(experiment)
    assert exp is not None, f"no experiment {experiment}"
    return server.rest.runs(exp["experiment_id"], view="ALL")


def test_round_trip_through_mlflow_has_no_difference(mlflow_server, sweep_folder, tmp_path,
                                                     capsys, monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", TOKEN)  # sent; this server asks for none
    paths = copy_run(sweep_folder, tmp_path)
    code = main(["publish", f"pub:{paths.run_id}", "--results", str(tmp_path / "results"),
                 "--mlflow", mlflow_server.uri, "--experiment", "round-trip"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out.startswith(f"published to MLflow {mlflow_server.uri} (experiment round-trip)"
                              ": 4 cells: 4 new; http://") and out.err == ""
    assert round_trip_differences(mlflow_server.rest, "round-trip", paths.root) == []
    runs = all_runs(mlflow_server, "round-trip")
    (parent,) = [r for r in runs if r["tags"].get("orchestrate.kind") == "sweep"]
    assert parent["name"] == paths.run_id and parent["info"]["status"] == "FINISHED"
    assert parent["tags"]["orchestrate.cells_ok"] == "4"
    assert "| batch_size" in parent["tags"]["mlflow.note.content"]
    assert {"run.json", "matrix.toml", "summary.txt", "summary.csv"} <= set(
        mlflow_server.rest.artifacts(parent["id"]))
    child = next(r for r in runs if r["tags"].get("orchestrate.cell_id", "").endswith("-r1"))
    assert child["tags"]["mlflow.parentRunId"] == parent["id"]
    assert child["params"]["stack.torch"] == "0.0.0+standin"
    # 2 repeats are judged (issue 31): stable or not, as the stand-in's timing went
    assert child["tags"]["orchestrate.unstable"] in ("false", "true")
    assert mlflow_server.rest.artifact(child["id"], "log_tail.txt").decode().strip()


def test_publishing_twice_creates_nothing_twice(mlflow_server, sweep_folder, tmp_path) -> None:
    paths = copy_run(sweep_folder, tmp_path)
    targets = Targets(mlflow=mlflow_server.uri, experiment="twice")
    (first,) = publish_run(paths, targets)
    before = all_runs(mlflow_server, "twice")
    (second,) = publish_run(paths, targets)
    after = all_runs(mlflow_server, "twice")
    assert first.ok and first.counts.new == 4
    assert second.ok and (second.counts.new, second.counts.unchanged) == (0, 4)
    assert len(before) == len(after) == 5
    assert {r["id"]: r["info"]["lifecycle_stage"] for r in before} == {
        r["id"]: r["info"]["lifecycle_stage"] for r in after}
    # a publish cut short (the parent without its fingerprint) is finished by the next one
    parent = next(r for r in after if r["tags"].get("orchestrate.kind") == "sweep")
    from mlflow.tracking import MlflowClient

    MlflowClient(mlflow_server.uri).delete_tag(parent["id"], "orchestrate.fingerprint")
    (third,) = publish_run(paths, targets)
    assert third.ok and third.counts.unchanged == 4 and len(all_runs(mlflow_server, "twice")) == 5
    assert round_trip_differences(mlflow_server.rest, "twice", paths.root) == []
    # two publishes at the same moment made a second parent with a child: one is kept
    client = MlflowClient(mlflow_server.uri)
    exp_id = parent["info"]["experiment_id"]
    stray = client.create_run(exp_id, run_name=paths.run_id, tags={
        "orchestrate.kind": "sweep", "orchestrate.run_id": paths.run_id})
    client.create_run(exp_id, tags={"mlflow.parentRunId": stray.info.run_id,
                                    "orchestrate.cell_id": "stray-cell"})
    (fourth,) = publish_run(paths, targets)
    assert fourth.ok and fourth.counts.duplicates_removed == 2
    live = [r for r in all_runs(mlflow_server, "twice") if r["info"]["lifecycle_stage"] == "active"]
    assert len(live) == 5 and parent["id"] in {r["id"] for r in live}
    assert round_trip_differences(mlflow_server.rest, "twice", paths.root) == []


def test_a_resumed_cell_replaces_its_child_run_marked(mlflow_server, standin, write_matrix,
                                                      tmp_path) -> None:
    from orchestrator.plan.matrix import load_matrix
    from orchestrator.sweep import NullEvents, run_sweep

    path = write_matrix(standin.matrix("resumed", timeout_s=240) + """
        [axes]
        seed = [1, 2, 3]
    """)
    cancel = threading.Event()

    class StopAfterFirst(NullEvents):
        def cell_finished(self, cell, result) -> None:
            cancel.set()  # as if Ctrl-C came right after the first cell

    first = run_sweep(load_matrix(path), results_root=tmp_path, events=StopAfterFirst(),
                      cancel=cancel)
    targets = Targets(mlflow=mlflow_server.uri, experiment="resumed")
    (before,) = publish_run(first.paths, targets)
    assert before.ok and before.counts.new == 3
    old = {r["tags"]["orchestrate.cell_id"]: r for r in all_runs(mlflow_server, "resumed")
           if r["tags"].get("orchestrate.kind") == "cell"}
    assert sorted(r["info"]["status"] for r in old.values()) == ["FINISHED", "KILLED", "KILLED"]

    again = run_sweep(load_matrix(path), results_root=tmp_path, resume="")
    assert again.exit_code == 0
    (after,) = publish_run(again.paths, targets)
    assert after.ok and (after.counts.replaced, after.counts.unchanged) == (2, 1)
    runs = all_runs(mlflow_server, "resumed")
    live = {r["tags"]["orchestrate.cell_id"]: r for r in runs
            if r["tags"].get("orchestrate.kind") == "cell" and r["info"]["lifecycle_stage"]
            == "active"}
    assert sorted(r["info"]["status"] for r in live.values()) == ["FINISHED"] * 3
    for cell_id, was in old.items():
        now = live[cell_id]
        if was["info"]["status"] == "FINISHED":
            assert now["id"] == was["id"]  # the ok cell was not run again: left alone
            continue
        assert now["tags"]["orchestrate.replaces"] == was["id"]
        assert "run again" in now["tags"]["orchestrate.replaced_because"]
        gone = next(r for r in runs if r["id"] == was["id"])
        assert gone["info"]["lifecycle_stage"] == "deleted"
        assert gone["tags"]["orchestrate.replaced_by"] == now["id"]
    parent = next(r for r in runs if r["tags"].get("orchestrate.kind") == "sweep")
    assert parent["info"]["status"] == "FINISHED"
    assert round_trip_differences(mlflow_server.rest, "resumed", again.paths.root) == []


def test_the_collector_gets_one_document_per_cell_once(http_collector, sweep_folder, tmp_path,
                                                       monkeypatch) -> None:
    monkeypatch.setenv("ORCHESTRATE_HTTP_HEADER_AUTHORIZATION", HEADER_SECRET)
    paths = copy_run(sweep_folder, tmp_path)
    url = f"{http_collector.url}/ok/{tmp_path.name}"
    targets = Targets(http=url)
    (first,) = publish_run(paths, targets)
    (second,) = publish_run(paths, targets)
    got = [r for r in http_collector.received() if r["path"] == f"/ok/{tmp_path.name}"]
    assert first.ok and first.counts.new == 4 and second.counts.unchanged == 4
    assert len(got) == 4 and all(r["headers"]["Authorization"] == HEADER_SECRET for r in got)
    cells = {r["body"]["cell_id"]: r["body"] for r in got}
    for folder in (paths.root / "cells").iterdir():
        result = json.loads((folder / "result.json").read_text())
        doc = cells[folder.name]
        assert doc["params"] == result["params"] and doc["status"] == result["status"]
        assert doc["id"] == f"pub/{paths.run_id}/{folder.name}"
        assert doc["figures"]["train.total_ips"] == result["metrics"]["train.total_ips"]
    record = json.loads((paths.root / "publish.json").read_text())
    assert set(record["http"][url]["cells"]) == set(cells)
    assert HEADER_SECRET.split()[1] not in (paths.root / "publish.json").read_text()
    # a cell whose data changed is sent again, saying what it replaces
    changed = sorted((paths.root / "cells").iterdir())[0] / "result.json"
    data = json.loads(changed.read_text())
    data["reason"] = "edited"
    changed.write_text(json.dumps(data))
    (third,) = publish_run(paths, targets)
    assert (third.counts.replaced, third.counts.unchanged) == (1, 3)
    last = [r for r in http_collector.received() if r["path"] == f"/ok/{tmp_path.name}"][-1]
    assert last["body"]["reason"] == "edited"
    assert last["body"]["replaces"] == cells[changed.parent.name]["fingerprint"]


def test_a_collector_failing_half_way_is_finished_by_the_next_publish(
        http_collector, sweep_folder, tmp_path) -> None:
    paths = copy_run(sweep_folder, tmp_path)
    url = f"{http_collector.url}/fail/2/{tmp_path.name}"  # 503 twice, then 200
    (first,) = publish_run(paths, Targets(http=url))
    assert not first.ok and "HTTP 503" in (first.error or "")
    (second,) = publish_run(paths, Targets(http=url))  # the second 503
    assert not second.ok
    (third,) = publish_run(paths, Targets(http=url))
    assert third.ok and third.counts.new == 4
    got = [r for r in http_collector.received() if r["path"] == f"/fail/2/{tmp_path.name}"]
    assert len(got) == 4 and len({r["body"]["cell_id"] for r in got}) == 4


def run_sweep_cli(orchestrate_cli, standin, tmp_path: Path, publish: str,
                  env: dict[str, str] | None = None, *extra: str) -> Any:
    matrix = tmp_path / "nightly.toml"
    matrix.write_text(standin.matrix("nightly") + '\n[hardware.cpu]\ndevice = "cpu"\n\n'
                      f"[publish]\n{publish}\nafter_sweep = true\n")
    return orchestrate_cli("matrix", str(matrix), "--results", str(tmp_path / "results"),
                           *extra, env={"ORCHESTRATE_CONFIG": str(tmp_path / "none.toml"),
                                        **(env or {})}, timeout=300)


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "publish.json"}


@pytest.mark.parametrize("target", ["down", "slow", "refusing"])
def test_a_target_down_slow_or_refusing_leaves_the_sweep_alone(
        target, orchestrate_cli, standin, http_collector, mlflow_server, tmp_path) -> None:
    """The sweep ends with its own exit status, one warning line per target, every result on
    disk; `orchestrate publish` later (server back) publishes the same run completely."""
    from publish_support import free_port

    base = {"down": f"http://127.0.0.1:{free_port()}",  # nothing listens there
            "slow": f"{http_collector.url}/slow/5", "refusing": f"{http_collector.url}/refuse"
            }[target]
    env = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "1", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
    done = run_sweep_cli(orchestrate_cli, standin, tmp_path,
                         f'mlflow = "{base}/mlflow"\nhttp = "{base}/collect"\ntimeout_s = 1', env)
    assert done.returncode == 0, done.stderr  # the sweep's own status: every cell ok
    warnings = [ln for ln in done.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 2, done.stderr
    assert warnings[0].startswith(f"warning: not published to MLflow {base}/mlflow")
    assert warnings[1].startswith(f"warning: not published to HTTP collector {base}/collect")
    why = {"down": "connection refused", "slow": "no answer", "refusing": "refused"}[target]
    assert all(why in w for w in warnings), warnings
    assert "Traceback" not in done.stderr and "Retrying" not in done.stderr
    assert "results: " in done.stdout and "1 cell: 1 ok" in done.stdout
    paths = find_run(tmp_path / "results", "nightly")
    files = tree(paths.root)
    assert any(k.endswith("result.json") for k in files)
    # published later, when a server answers: the same run, complete
    again = orchestrate_cli("publish", "nightly", "--results", str(tmp_path / "results"),
                            "--mlflow", mlflow_server.uri, "--experiment", f"later-{target}",
                            "--http", f"{http_collector.url}/ok/later-{target}")
    assert again.returncode == 0, again.stderr
    assert len([r for r in http_collector.received()
                if r["path"] == f"/ok/later-{target}"]) == 1
    assert round_trip_differences(mlflow_server.rest, f"later-{target}", paths.root) == []
    assert tree(paths.root) == files  # nothing of the run changed but publish.json


def test_publish_exits_1_with_one_line_per_target_and_the_way_to_repeat_it(
        orchestrate_cli, sweep_folder, tmp_path) -> None:
    from publish_support import free_port

    paths = copy_run(sweep_folder, tmp_path)
    down = f"http://127.0.0.1:{free_port()}"
    done = orchestrate_cli("publish", "pub", "--results", str(tmp_path / "results"),
                           "--mlflow", down, "--http", f"{down}/x", "--timeout", "2")
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 3, done.stderr
    assert lines[0] == (f"error: not published to MLflow {down} (experiment pub): cannot "
                        "connect: connection refused (is the tracking server running?)")
    assert lines[1].startswith(f"error: not published to HTTP collector {down}/x: cannot "
                               "connect: connection refused")
    assert lines[2].endswith(f"orchestrate publish pub:{paths.run_id} --results "
                             f"{tmp_path / 'results'}")
    assert not (paths.root / "publish.json").exists() or json.loads(
        (paths.root / "publish.json").read_text())["http"][f"{down}/x"]["cells"] == {}


def test_credentials_reach_the_servers_and_no_file_or_log(
        orchestrate_cli, standin, mlflow_server, http_collector, tmp_path) -> None:
    """Basic auth (MLFLOW_TRACKING_USERNAME/PASSWORD) to the real server, a token to a server
    that refuses (the collector, which records the headers it got: they did arrive), a header
    to the collector; -vv shows the client's own debug lines. Then every file of the run, the
    output, the MLflow server's database and artifacts are searched for the secrets."""
    url = f"{http_collector.url}/ok/creds"
    env = {"MLFLOW_TRACKING_USERNAME": USER, "MLFLOW_TRACKING_PASSWORD": PASSWORD,
           "ORCHESTRATE_HTTP_HEADER_AUTHORIZATION": HEADER_SECRET}
    done = run_sweep_cli(orchestrate_cli, standin, tmp_path,
                         f'mlflow = "{mlflow_server.uri}"\nhttp = "{url}"\n'
                         'experiment = "creds"', env, "-q")
    assert done.returncode == 0 and "published to MLflow" in done.stdout, done.stderr
    refused = orchestrate_cli("-vv", "publish", "nightly", "--results",
                              str(tmp_path / "results"), "--mlflow",
                              f"{http_collector.url}/refuse", env={
                                  "MLFLOW_TRACKING_TOKEN": TOKEN,
                                  "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"})
    assert refused.returncode == 1 and "403" in refused.stderr
    seen = [r for r in http_collector.received() if r["path"].startswith(("/refuse", "/ok/creds"))]
    headers = json.dumps([r["headers"] for r in seen])
    assert f"Bearer {TOKEN}" in headers and HEADER_SECRET in headers  # they were sent
    outputs = done.stdout + done.stderr + refused.stdout + refused.stderr
    assert not [s for s in SECRETS if s in outputs]
    bodies = json.dumps([r["body"] for r in seen])
    assert not [s for s in SECRETS if s in bodies]
    places = [tmp_path / "results", mlflow_server.root]
    leaked = [str(p) for root in places for p in root.rglob("*") if p.is_file()
              and any(s.encode() in p.read_bytes() for s in SECRETS)]
    assert leaked == []


def test_an_imported_run_publishes_the_same_way(mlflow_server, sweep_folder, tmp_path) -> None:
    from results_support import import_results

    from orchestrator.results.importer import ImportOptions

    target, _ = import_results([sweep_folder], ImportOptions(
        matrix=None, results_root=tmp_path / "elsewhere"))
    (outcome,) = publish_run(target, Targets(mlflow=mlflow_server.uri, experiment="imported"))
    assert outcome.ok and outcome.counts.new == 4
    assert round_trip_differences(mlflow_server.rest, "imported", target.root) == []
    parent = next(r for r in all_runs(mlflow_server, "imported")
                  if r["tags"].get("orchestrate.kind") == "sweep")
    assert parent["tags"]["orchestrate.imported"] == "true"


def test_publish_help_and_an_http_publish_never_import_mlflow(orchestrate_cli, sweep_folder,
                                                              http_collector, tmp_path) -> None:
    copy_run(sweep_folder, tmp_path)
    code = ("import contextlib, io, sys\nfrom orchestrator.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        main(['publish', '--help'])\n    except SystemExit:\n        pass\n"
            f"    code = main(['publish', 'pub', '--results', {str(tmp_path / 'results')!r}, "
            f"'--http', {http_collector.url + '/ok/noimport'!r}])\n"
            "print(code, any(m == 'mlflow' or m.startswith('mlflow.') for m in sys.modules))")
    done = orchestrate_cli("-c", code, module=None)
    assert done.stdout.split()[-2:] == ["0", "False"], done.stderr


def test_the_mlflow_ui_shows_the_sweeps_runs(chromium, mlflow_server,  # noqa: F811
                                             sweep_folder, tmp_path) -> None:
    """Headless Chromium opens the experiment's runs page and the sweep's parent run: the run
    id and every cell id are on them (the UI fetched them from the server's REST API)."""
    paths = copy_run(sweep_folder, tmp_path)
    (outcome,) = publish_run(paths, Targets(mlflow=mlflow_server.uri, experiment="ui"))
    assert outcome.ok
    experiment = mlflow_server.rest.experiment("ui")
    assert experiment is not None
    exp_id = experiment["experiment_id"]
    cells = sorted(p.name for p in (paths.root / "cells").iterdir())

    def page(fragment: str) -> str:
        argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
                "--virtual-time-budget=30000", "--dump-dom", f"{mlflow_server.uri}/#/{fragment}"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    runs_page = page(f"experiments/{exp_id}/runs")
    assert paths.run_id in runs_page
    parent_page = page(f"experiments/{exp_id}/runs/{outcome.counts.link.rsplit('/', 1)[1]}")
    assert [c for c in cells if c not in parent_page] == []
