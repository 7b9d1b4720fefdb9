"""Scale-out on a real two-node Slurm cluster: multi-node cells, job arrays, preemption,
requeue, node failure, and Slurm's accounting in the results.

The cluster (``multinode_cluster``, tests/infra/start-slurm-multinode.sh) runs beside the
single-node one: nodes ``mn1`` and ``mn2`` are slurmd daemons in network namespaces of their own
(own addresses and hostnames; a torchrun rendezvous really crosses between them), 4 CPUs and 4
placeholder GPUs each, accounting in slurmdbd (``sacct`` answers), partitions ``batch``
(preemptable) and ``urgent``. The sweeps reach it through their profile's ``slurm.conf``.

What runs: our workload (two CPU ranks over two nodes, gloo), a stand-in cell program
(tests/standin/slurm_task.py: when and where it ran) for the array and fault tests, and the
Apptainer stand-in (tests/standin/apptainer, see tests/test_apptainer.py: no real Apptainer can
be installed here) for a two-node Apptainer cell. Faults are Slurm's own: an ``urgent`` job
preempting a cell's job, ``scontrol update state=down`` of a node running one, an
administrator's ``scontrol requeue``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from slurm_support import (  # noqa: F401 - multinode_cluster is a fixture
    MultiNodeCluster,
    multinode_cluster,
    squeue_ids,
    wait_until_gone,
)
from workload_support import TINY_WORKLOAD

import orchestrator.backends.slurm as slurm
from orchestrator.backends.base import RunOptions
from orchestrator.cli import main as cli_main
from orchestrator.errors import RequirementsUnmet
from orchestrator.plan.matrix import load_matrix
from orchestrator.results.folders.run_folder import CellResult, RunPaths, Status
from orchestrator.sweep import SweepOutcome, run_sweep

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

TESTS = Path(__file__).resolve().parent
TASK = TESTS / "standin" / "slurm_task.py"
STANDIN = TESTS / "standin"
PROBE = STANDIN / "probe.py"

#: Cells of the stand-in task; ``{...}`` filled per test.
TASK_MATRIX = """
[matrix]
name = "mn_tasks"
backend = "slurm"
timeout_s = {timeout}
retries = {retries}
[workload]
hardware = "cpu"
program = "task"
[axes]
seed = {seeds}
[hardware.cpu]
device = "cpu"
[hardware.cpu.slurm]
conf = "{conf}"
{slurm}
[commands.task]
command = "{command}"
[commands.task.figures]
parser = "regex"
regex = [{{ name = "task.ips", pattern = 'task images/s: (\\d+\\.\\d+)' }}]
"""


def task_matrix(tmp_path: Path, cluster: MultiNodeCluster, *, cells: int = 1, sleep: float = 0,
                slurm_options: str = "", fail: int = -1, retries: int = 0,
                timeout: int = 240) -> Path:
    path = tmp_path / "tasks.toml"
    command = (f"{{python}} {TASK} --out {{output_dir}} --seed {{seed}} --fail-seed {fail} "
               f"--sleep {sleep}")
    path.write_text(TASK_MATRIX.format(
        timeout=timeout, retries=retries, seeds=list(range(cells)), conf=cluster.conf,
        slurm=slurm_options, command=command))
    return path


@pytest.fixture
def slurm_calls(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Every Slurm command the backend runs, as argv (sbatch, squeue, sacct, scancel ...)."""
    calls: list[list[str]] = []
    real = slurm._slurm

    def counting(args: Any, *rest: Any, **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append(list(args))
        return real(args, *rest, **kw)

    monkeypatch.setattr(slurm, "_slurm", counting)
    return calls


@pytest.fixture
def cluster(multinode_cluster: MultiNodeCluster) -> Any:  # noqa: F811 - the fixture
    """The two-node cluster, for a test that must leave no job of ours in its queue and every
    node up."""
    before = set(squeue_ids(conf=multinode_cluster.conf))
    yield multinode_cluster
    left = wait_until_gone([j for j in squeue_ids(conf=multinode_cluster.conf)
                            if j not in before], timeout=60, conf=multinode_cluster.conf)
    multinode_cluster.wait_idle()
    assert left == [], f"jobs left in Slurm's queue: {left}"


def sacct(cluster: MultiNodeCluster, job: str) -> list[list[str]]:
    """``sacct -X`` lines of ``job`` (an array: one per task): JobID, State, ExitCode,
    NodeList."""
    out = cluster.run("sacct", "-X", "-n", "-P", "-j", job, "-o",
                      "JobID,State,ExitCode,NodeList").stdout
    return [line.split("|") for line in out.splitlines() if line.strip()]


def peak_overlap(intervals: list[tuple[float, float]]) -> int:
    """Most intervals open at one instant."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
                    key=lambda e: (e[0], e[1]))
    peak = now = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def in_thread(matrix_path: Path, results: Path) -> tuple[threading.Thread, threading.Event,
                                                         dict[str, SweepOutcome]]:
    """A sweep running in a thread: its thread, cancel flag and (once it ended) outcome."""
    cancel = threading.Event()
    box: dict[str, SweepOutcome] = {}
    thread = threading.Thread(target=lambda: box.update(outcome=run_sweep(
        load_matrix(matrix_path), results_root=results, cancel=cancel)))
    thread.start()
    return thread, cancel, box


def wait_for(what: str, check: Callable[[], Any], timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def running_job(results: Path) -> str:
    """The job id of the one cell of a sweep under ``results``, once its job runs (its output
    file is there)."""
    def seen() -> str | None:
        for command in results.rglob("command.json"):
            job = json.loads(command.read_text()).get("slurm", {}).get("job_id")
            if job and list(command.parent.glob("slurm-*.out")):
                return str(job)
        return None

    return str(wait_for("the cell's job to start", seen))


# --- multi-node cells ---------------------------------------------------------------------------


def test_two_node_ddp_cell_of_the_workload(tmp_path: Path, cluster: MultiNodeCluster) -> None:
    """Our workload on two nodes, one CPU rank each (gloo): one job of --nodes=2, torchrun on
    each node, the rendezvous on the first; every rank's host and Slurm's node list recorded."""
    path = tmp_path / "ddp.toml"
    path.write_text(f"""
[matrix]
name = "mn_ddp"
backend = "slurm"
timeout_s = 240
[workload]
hardware = "cpu"
gpus = 2
nodes = 2
{TINY_WORKLOAD}
[hardware.cpu]
device = "cpu"
env = {{ OMP_NUM_THREADS = "1" }}
slurm = {{ conf = "{cluster.conf}" }}
""")
    outcome = run_sweep(load_matrix(path), results_root=tmp_path / "results")
    (res,) = outcome.results
    assert res.status is Status.OK, (res.reason, res.log_tail)
    assert res.env["world_size"] == 2
    assert res.env["rank_hosts"] == ["mn1", "mn2"]  # the ranks really ran on both nodes
    prov = res.provenance
    assert prov["hosts"] == ["mn1", "mn2"] and prov["host"] == "mn1"
    assert prov["slurm_node_list"] == "mn[1-2]" and prov["slurm_state"] == "COMPLETED"
    assert prov["slurm_accounting"] == "sacct" and prov["slurm_exit_code"] == "0:0"
    assert isinstance(prov["slurm_elapsed_s"], int) and prov["slurm_elapsed_s"] >= 1
    cell = outcome.paths.cell_dir(res.cell_id)
    script = (cell / "job.sbatch").read_text()
    assert "#SBATCH --nodes=2\n" in script and "#SBATCH --ntasks-per-node=1\n" in script
    log = (cell / "log.txt").read_text()
    port = 29400 + int(prov["slurm_job_id"]) % 500
    assert f"# rendezvous mn1:{port} of nodes mn[1-2]" in log
    assert sacct(cluster, prov["slurm_job_id"]) == [
        [prov["slurm_job_id"], "COMPLETED", "0:0", "mn[1-2]"]]


def test_two_node_apptainer_cell(tmp_path: Path, cluster: MultiNodeCluster,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """An Apptainer cell on two nodes (the stand-in runtime): `apptainer exec` on each node
    under srun, torchrun inside it; each node's rank and GPUs reach the "container" through
    the runtime's prefix (--cleanenv passes nothing else)."""
    record = tmp_path / "standin-calls"
    monkeypatch.setenv("PATH", f"{STANDIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("ORCHESTRATE_STANDIN_RECORD", str(record))
    monkeypatch.setenv("ORCHESTRATE_STANDIN_PATH",
                       f"{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin")
    image = tmp_path / "probe.sif"
    image.write_text("a stand-in image\n")
    path = tmp_path / "appt.toml"
    path.write_text(f"""
[matrix]
name = "mn_appt"
backend = "slurm"
timeout_s = 240
[workload]
hardware = "node"
program = "probe"
gpus = 4
nodes = 2
[hardware.node]
device = "cuda"
runtime = "apptainer"
slurm = {{ conf = "{cluster.conf}" }}
[hardware.node.apptainer]
sif = "{image}"
[commands.probe]
command = "{{python}} {PROBE} --out {{output_dir}}"
[commands.probe.figures]
parser = "regex"
regex = [{{ name = "probe.ips", pattern = 'probe images/s: (\\d+\\.\\d+)' }}]
""")
    outcome = run_sweep(load_matrix(path), results_root=tmp_path / "results")
    (res,) = outcome.results
    assert res.status is Status.OK, (res.reason, res.log_tail)
    assert res.provenance.get("hosts") == ["mn1", "mn2"], res.provenance
    cell = outcome.paths.cell_dir(res.cell_id)
    ranks = [json.loads(p.read_text()) for p in sorted(cell.glob("probe-rank*.json"))]
    assert [r["env"]["RANK"] for r in ranks] == ["0", "1", "2", "3"]
    assert {r["env"]["WORLD_SIZE"] for r in ranks} == {"4"}
    assert sorted(r["host"] for r in ranks) == ["mn1", "mn1", "mn2", "mn2"]
    for rank in ranks:  # each node's own 2 of its 4 placeholder GPUs, passed in
        assert len(rank["env"]["CUDA_VISIBLE_DEVICES"].split(",")) == 2
    calls = [json.loads(line) for line in (record / "calls.jsonl").read_text().splitlines()]
    assert len(calls) == 2 and {c["slurm_job_id"] for c in calls} == {
        res.provenance["slurm_job_id"]}
    assert all("APPTAINERENV_PET_NODE_RANK" in c["prefixed"] for c in calls)


def test_a_profile_names_its_cluster_and_a_wrong_one_is_refused_first(
        tmp_path: Path, cluster: MultiNodeCluster) -> None:
    """The profile's slurm.conf is what every command uses (this process's SLURM_CONF points
    at the single-node cluster, or at nothing); a conf whose cluster does not answer is refused
    before a run folder exists."""
    outcome = run_sweep(load_matrix(task_matrix(tmp_path, cluster)),
                        results_root=tmp_path / "results")
    (res,) = outcome.results
    assert res.status is Status.OK and res.provenance["host"] in cluster.nodes
    assert json.loads(outcome.paths.cell_command(res.cell_id).read_text())["slurm"]["conf"] == \
        cluster.conf
    bad = tmp_path / "nowhere.conf"
    bad.write_text("ClusterName=nowhere\nSlurmctldHost=localhost(127.0.0.1)\n"
                   "SlurmctldPort=1\n")
    path = task_matrix(tmp_path, dataclasses.replace(cluster, conf=str(bad)))
    with pytest.raises(RequirementsUnmet, match=r"hardware.cpu.slurm.conf: the Slurm cluster "
                       r".*does not answer"):
        run_sweep(load_matrix(path), results_root=tmp_path / "results2")
    assert not (tmp_path / "results2").exists()


# --- arrays ---------------------------------------------------------------------------------


def test_an_array_of_twenty_cells_runs_four_at_a_time(tmp_path: Path, cluster: MultiNodeCluster,
                                                      slurm_calls: list[list[str]]) -> None:
    """20 cells of one shape: one sbatch (an array, %4), never more than 4 tasks at once on a
    cluster with room for 8, each task its own cell and result; the task that fails leaves a
    failed result; sacct's accounting of every task in its result, `runs` and `export`."""
    path = task_matrix(tmp_path, cluster, cells=20, sleep=3, fail=13,
                       slurm_options="array_limit = 4")
    outcome = run_sweep(load_matrix(path), results_root=tmp_path / "results")
    by_seed = {r.params["seed"]: r for r in outcome.results}
    assert len(by_seed) == 20
    failed = by_seed.pop(13)
    assert failed.status is Status.FAILED and failed.exit_code == 3, failed.reason
    assert "seed 13 fails on purpose" in "\n".join(failed.log_tail)
    assert all(r.status is Status.OK for r in by_seed.values()), \
        [(r.cell_id, r.reason) for r in by_seed.values() if r.status is not Status.OK]
    submits = [c for c in slurm_calls if c[0] == "sbatch"]
    assert len(submits) == 1, submits
    array = outcome.results[0].provenance["slurm_array_job_id"]
    tasks = {r.provenance["slurm_job_id"] for r in outcome.results}
    assert tasks == {f"{array}_{i}" for i in range(20)}
    intervals = []
    for res in outcome.results:
        seen = json.loads((outcome.paths.cell_dir(res.cell_id) / "task.json").read_text())
        assert seen["env"]["SLURM_ARRAY_JOB_ID"] == array
        assert res.provenance["slurm_job_id"] == f"{array}_{seen['env']['SLURM_ARRAY_TASK_ID']}"
        assert res.provenance["host"] == seen["host"] in cluster.nodes
        intervals.append((seen["started"], seen["ended"]))
    assert peak_overlap(intervals) == 4  # the limit, reached and never passed
    # slurmdbd records a job a moment after it ended: the last tasks' results may come from
    # scontrol (the same fields), and this check waits for sacct to have them all
    def recorded() -> dict[str, list[str]] | None:
        lines = [line for line in sacct(cluster, array) if line[1] in ("COMPLETED", "FAILED")]
        return {line[0]: line for line in lines} if len(lines) == 20 else None

    accounted = wait_for("sacct to record every task", recorded, timeout=60)
    for res in outcome.results:
        prov = res.provenance
        line = accounted[prov["slurm_job_id"]]
        assert [prov["slurm_state"], prov["slurm_exit_code"], prov["slurm_node_list"]] == \
            line[1:]
        assert prov["slurm_accounting"] in ("sacct", "scontrol")
        assert prov["slurm_elapsed_s"] >= 3
    assert sum(r.provenance["slurm_accounting"] == "sacct" for r in outcome.results) >= 10
    assert failed.provenance["slurm_state"] == "FAILED"
    assert failed.provenance["slurm_exit_code"] == "3:0"


def test_runs_and_export_show_the_jobs(tmp_path: Path, cluster: MultiNodeCluster,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = task_matrix(tmp_path, cluster, cells=3, fail=2)
    outcome = run_sweep(load_matrix(path), results_root=tmp_path / "results")
    array = outcome.results[0].provenance["slurm_array_job_id"]
    results = str(tmp_path / "results")
    capsys.readouterr()
    assert cli_main(["runs", "--results", results]) == 0
    table = capsys.readouterr().out
    assert "slurm jobs" in table.splitlines()[0] and array in table
    assert cli_main(["runs", "--results", results, "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)
    assert run["slurm_jobs"] == [array]
    assert cli_main(["export", "mn_tasks", "--results", results, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_cell = {row["cell_id"]: row for row in rows}
    for res in outcome.results:
        row = by_cell[res.cell_id]
        assert row["slurm.job_id"] == res.provenance["slurm_job_id"]
        assert row["slurm.state"] == ("FAILED" if res.params["seed"] == 2 else "COMPLETED")
        assert row["slurm.exit_code"] == ("3:0" if res.params["seed"] == 2 else "0:0")
        assert row["slurm.node_list"] in cluster.nodes
        assert isinstance(row["slurm.elapsed_s"], int)


def test_cancelling_the_sweep_cancels_the_array(tmp_path: Path, cluster: MultiNodeCluster,
                                                slurm_calls: list[list[str]]) -> None:
    """Interrupted: one scancel of the array (not one per task); every cell cancelled."""
    path = task_matrix(tmp_path, cluster, cells=6, sleep=120, slurm_options="array_limit = 2")
    results = tmp_path / "results"
    thread, cancel, box = in_thread(path, results)
    wait_for("two tasks to run", lambda: len(list(results.rglob("slurm-*_*.out"))) >= 2)
    cancel.set()
    thread.join(timeout=120)
    assert not thread.is_alive()
    outcome = box["outcome"]
    assert [r.status for r in outcome.results] == [Status.CANCELLED] * 6
    array = json.loads(next(results.rglob("command.json")).read_text())["slurm"]["array_job_id"]
    scancels = [c for c in slurm_calls if c[0] == "scancel"]
    assert scancels == [["scancel", array]], scancels
    assert {line[1].split()[0] for line in sacct(cluster, array)} == {"CANCELLED"}


def test_an_array_task_past_its_timeout_is_cancelled_alone(
        tmp_path: Path, cluster: MultiNodeCluster, slurm_calls: list[list[str]]) -> None:
    """One task of an array runs past the per-cell timeout: that task alone is cancelled
    (scancel ARRAY_TASK), its cell times out; the other tasks run on to ok."""
    path = task_matrix(tmp_path, cluster, cells=3, timeout=12)
    text = path.read_text().replace("--sleep 0", "--sleep {nap}")
    path.write_text(text + """
[commands.task.placeholders.nap]
param = "seed"
values = { "0" = "120", "1" = "1", "2" = "1" }
""")
    outcome = run_sweep(load_matrix(path), results_root=tmp_path / "results")
    by_seed = {r.params["seed"]: r for r in outcome.results}
    assert by_seed[0].status is Status.TIMEOUT, by_seed[0].reason
    assert [by_seed[i].status for i in (1, 2)] == [Status.OK, Status.OK]
    slow = by_seed[0].provenance["slurm_job_id"]
    assert [c for c in slurm_calls if c[0] == "scancel"] == [["scancel", slow]]
    assert len([c for c in slurm_calls if c[0] == "sbatch"]) == 1
    assert sacct(cluster, slow)[0][1].split()[0] == "CANCELLED"


def test_cells_that_never_reach_launch_do_not_hold_up_the_array(
        tmp_path: Path, cluster: MultiNodeCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three cells placed, two reach launch, the third never does (its worker failed before
    it): after the batch window the two go as one array of two, without it."""
    monkeypatch.setattr(slurm, "BATCH_WINDOW_S", 1.5)
    matrix = load_matrix(task_matrix(tmp_path, cluster, cells=3))
    paths = RunPaths.create(tmp_path / "results", matrix.name)
    backend = slurm.SlurmBackend(matrix, paths, RunOptions(timeout_s=60))
    cells = list(matrix.cells)
    allocations = [backend.allocate(cell) for cell in cells]
    assert all(allocations)
    got: dict[str, Any] = {}

    def launch(cell: Any) -> None:
        paths.cell_dir(cell.id).mkdir(parents=True)
        got[cell.id] = backend.launch(backend.spec(cell, allocations[0]))

    started = time.monotonic()
    threads = [threading.Thread(target=launch, args=(cell,)) for cell in cells[:2]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    waited = time.monotonic() - started
    assert 1.4 <= waited < 30, waited
    jobs = sorted(execution.job_id for execution in got.values())
    array = jobs[0].partition("_")[0]
    assert jobs == [f"{array}_0", f"{array}_1"]
    for execution in got.values():
        assert execution.wait(60)
    backend.release(cells[2], allocations[2])
    backend.close()


# --- preemption, requeue, node failure ----------------------------------------------------------


def lost_and_retried(outcome: SweepOutcome) -> tuple[CellResult, dict[str, Any]]:
    """The one cell of ``outcome``: ok on its second attempt; its lost first attempt."""
    (res,) = outcome.results
    assert res.status is Status.OK, (res.reason, res.log_tail)
    assert res.attempts == 2 and res.provenance["attempt"] == 2
    (lost,) = res.provenance["lost_attempts"]
    assert lost["attempt"] == 1 and lost["status"] == "host_lost"
    kept = outcome.paths.root / lost["folder"]  # the lost attempt's folder, kept aside
    first = CellResult.from_json(json.loads((kept / "result.json").read_text()))
    assert first.status is Status.HOST_LOST and first.reason == lost["reason"]
    log = (outcome.paths.cell_dir(res.cell_id) / "log.txt").read_text()
    assert log.count("task images/s") == 1  # the figures of one run only
    return res, lost


def test_a_preempted_cell_is_recorded_and_run_again(tmp_path: Path,
                                                    cluster: MultiNodeCluster) -> None:
    """A job of partition urgent preempts the cell's job (PREEMPTED: --no-requeue, so Slurm
    cancels it): host_lost, kept aside, submitted again as a new job, ok; counted once."""
    path = task_matrix(tmp_path, cluster, sleep=8, retries=1,
                       slurm_options='extra_args = ["--nodelist=mn2"]')
    results = tmp_path / "results"
    thread, _, box = in_thread(path, results)
    job = running_job(results)
    urgent = cluster.run("sbatch", "--parsable", "-p", cluster.urgent, "-w", "mn2",
                         "--exclusive", "--output=/dev/null", "--wrap", "sleep 4").stdout.strip()
    thread.join(timeout=180)
    assert not thread.is_alive()
    res, lost = lost_and_retried(box["outcome"])
    assert f"job {job} PREEMPTED on mn2" in lost["reason"], lost
    assert "higher priority" in lost["reason"]
    assert res.provenance["slurm_job_id"] != job
    assert sacct(cluster, job)[0][1] == "PREEMPTED"
    assert sacct(cluster, urgent)[0][1] == "COMPLETED"
    export = subprocess.run([sys.executable, "-m", "orchestrator", "export", "mn_tasks",
                             "--results", str(results), "--format", "json"],
                            capture_output=True, text=True, check=True)
    assert len(json.loads(export.stdout)) == 1  # one row: the cell counted once


def test_a_requeued_job_is_cancelled_and_the_cell_run_again(tmp_path: Path,
                                                            cluster: MultiNodeCluster) -> None:
    """An administrator makes the running job requeueable and requeues it: the sweep sees it
    back in the queue, cancels it (its two runs would share an id and an output) and runs
    the cell again as a new job."""
    path = task_matrix(tmp_path, cluster, sleep=8, retries=1)
    results = tmp_path / "results"
    thread, _, box = in_thread(path, results)
    job = running_job(results)
    cluster.run("scontrol", "update", f"jobid={job}", "requeue=1")
    cluster.run("scontrol", "requeue", job)
    thread.join(timeout=180)
    assert not thread.is_alive()
    res, lost = lost_and_retried(box["outcome"])
    assert f"Slurm requeued job {job}" in lost["reason"], lost
    assert res.provenance["slurm_job_id"] != job


def test_a_failed_node_gives_host_lost_and_the_cell_runs_again(
        tmp_path: Path, cluster: MultiNodeCluster) -> None:
    """The node running the cell goes down (scontrol update state=down): NODE_FAIL, host_lost;
    the cell runs again as a new job."""
    path = task_matrix(tmp_path, cluster, sleep=8, retries=1)
    results = tmp_path / "results"
    thread, _, box = in_thread(path, results)
    job = running_job(results)
    node = cluster.run("squeue", "-h", "-j", job, "-o", "%N").stdout.strip()
    assert node in cluster.nodes
    try:
        cluster.run("scontrol", "update", f"nodename={node}", "state=down",
                    "reason=orchestrate-test")
        thread.join(timeout=180)
    finally:
        cluster.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
    assert not thread.is_alive()
    res, lost = lost_and_retried(box["outcome"])
    assert f"job {job} NODE_FAIL on {node}" in lost["reason"], lost
    assert "a node of the job failed" in lost["reason"]
    assert res.provenance["slurm_job_id"] != job and res.provenance["host"] in cluster.nodes
    assert sacct(cluster, job)[0][1] == "NODE_FAIL"
