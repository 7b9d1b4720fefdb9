"""``orchestrate import``: DLLogger raports and logs, DLPerf-style folders, our own run folders.

The DLLogger input is written by the real NVIDIA DLLogger (tests/dllogger_support.py). The
"earlier run" an import joins is a run folder written as a sweep writes it (plan from the
matrix expansion, one result per cell); running the real workload for it would only add time.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from results_support import import_results

from orchestrator.cli import main
from orchestrator.cli.app import EXIT_BROKEN_PIPE
from orchestrator.errors import ConfigError
from orchestrator.plan.matrix import load_matrix
from orchestrator.results import importer
from orchestrator.results.figures.figure_parsers import FiguresConfig
from orchestrator.results.folders.run_folder import (
    CellResult,
    RunPaths,
    Status,
    read_json,
    runs_of,
    write_json,
)
from orchestrator.results.importer import ImportOptions, plan_import
from orchestrator.results.reports.summary import summarize
from orchestrator.sweep import plan_json

MATRIX = """\
[matrix]
name = "dle_cal"

[workload]
hardware = "v100"
arch = "resnet50"
batch_size = 32
warmup = 5

[axes]
precision = ["fp32", "amp"]

[hardware.v100]
device = "cuda"
"""
EARLIER = "20260101-000000-aaaa"


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory,
         dllogger_program: Callable[..., Any]) -> dict[str, tuple[Path, Path]]:
    """name -> (raport, stdout log) written by the real DLLogger program."""
    base = tmp_path_factory.mktemp("logs")
    out = {}
    for name, args in {"amp": ["--amp"], "amp2": ["--amp"], "fp32": [],
                       "partial": ["--amp", "--stop-after", "12"]}.items():
        raport, log, _, _ = dllogger_program(base / name, *args, name=name,
                                             check=name != "partial")
        out[name] = (raport, log)
    return out


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A results root holding one earlier run of dle_cal, as a sweep writes it."""
    root = tmp_path / "results"
    matrix_file = tmp_path / "dle_cal.toml"
    matrix_file.write_text(MATRIX)
    matrix = load_matrix(matrix_file)
    paths = RunPaths.create(root, matrix.name, EARLIER)
    paths.matrix_file.write_text(matrix.source_text)
    write_json(paths.plan, plan_json(matrix, "process"))
    write_json(paths.run_meta, {"run_id": EARLIER, "matrix": matrix.name})
    for cell in matrix.cells:
        res = CellResult(cell.id, cell.group, cell.repeat, Status.OK,
                         params=cell.params.model_dump(), metrics={"train.total_ips": 5000.0})
        write_json(paths.cell_result(cell.id), res.to_json())
    return root


def options(results: Path, **kw) -> ImportOptions:
    return ImportOptions(matrix=kw.pop("matrix", "dle_cal"), results_root=results, **kw)


def entries_of(results: Path, name: str = "dle_cal") -> list[str]:
    base = results / name
    return sorted(p.name for p in base.iterdir()) if base.exists() else []


# --- the end-to-end check of the issue ------------------------------------------------------


def test_imported_raport_shows_in_report_and_joins_history(logs, results, capsys):
    raport, _ = logs["amp"]
    assert main(["import", str(raport), "--matrix", "dle_cal", "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert f"{raport} -> v100-g1-bs32-amp-r1 (dllogger-raport, ok)" in out
    (run,) = [r for r in runs_of(results, "dle_cal") if r.run_id != EARLIER]
    (res,) = run.results()
    ips = res.metrics["train.total_ips"]
    p50, p99 = (res.metrics[f"val.compute_latency_at{q}"] * 1000 for q in (50, 99))

    assert main(["report", "dle_cal", "--run", run.run_id, "--results", str(results)]) == 0
    report = capsys.readouterr().out
    row = next(line for line in report.splitlines() if "| amp" in line)
    assert f"{ips:,.1f}" in row and f"{p50:,.2f}" in row and f"{p99:,.2f}" in row
    assert "p50 ms" in report and "p99 ms" in report

    assert main(["history", "dle_cal", "--results", str(results)]) == 0
    history = capsys.readouterr().out
    row = next(line for line in history.splitlines() if "| amp" in line)
    assert "5,000.0" in row and f"{ips:,.1f}" in row  # one row: the earlier run and the import
    assert EARLIER[:15] in history and run.run_id[:15] in history


def test_run_folder_contents_and_provenance(logs, results):
    raport, _ = logs["amp"]
    paths, plan = import_results([raport], options(results, argv=["orchestrate", "import"]))
    assert (paths.root / "matrix.toml").read_text() == (results / "dle_cal" / EARLIER /
                                                        "matrix.toml").read_text()
    planned = read_json(paths.plan)
    assert planned["matrix"] == "dle_cal" and planned["backend"] == "import"
    assert planned["varying"] == ["precision"]
    (cell,) = planned["cells"]
    earlier = {c["group"]: c for c in read_json(results / "dle_cal" / EARLIER / "plan.json")
               ["cells"]}
    assert cell["hash"] == earlier["v100-g1-bs32-amp"]["hash"]
    result = read_json(paths.cell_result("v100-g1-bs32-amp-r1"))
    prov = result["provenance"]
    assert prov["imported"]["sha256"] == __import__("hashlib").sha256(
        raport.read_bytes()).hexdigest()
    assert prov["imported"]["path"] == str(raport.resolve())
    assert prov["imported"]["importer_version"] == importer.IMPORTER_VERSION
    assert prov["matched_on"] == {k: "log" for k in ("arch", "batch_size", "gpus", "precision",
                                                     "mode")}
    assert prov["log_parameters"]["batch_size"] == 32
    assert prov["figures"]["train"]["warmup_dropped"] == 5  # the matched cell's warmup
    assert result["metrics"]["warmup"] == 5 and result["status"] == "ok"
    assert (paths.cell_dir("v100-g1-bs32-amp-r1") / raport.name).read_bytes() == \
        raport.read_bytes()
    meta = read_json(paths.run_meta)
    assert meta["imported"]["sources"][0]["sha256"] == prov["imported"]["sha256"]
    # the run id is the log's time, so history orders it where it happened
    assert paths.run_id[:15] == __import__("time").strftime(
        "%Y%m%d-%H%M%S", __import__("time").gmtime(meta["started_at"]))
    assert (paths.root / "summary.txt").exists()


def test_stdout_log_imports_to_the_same_cell(logs, results):
    raport, log = logs["amp"]
    paths, _ = import_results([log], options(results))
    (res,) = paths.results()
    assert res.cell_id == "v100-g1-bs32-amp-r1"
    assert (paths.cell_dir(res.cell_id) / "log.txt").read_text() == log.read_text()
    paths2, _ = import_results([raport], options(results))
    assert res.metrics["train.total_ips"] == pytest.approx(
        paths2.results()[0].metrics["train.total_ips"], rel=1e-5)


def test_repeats_and_several_files_in_one_run(logs, results):
    paths, plan = import_results([logs["amp"][0], logs["amp2"][0], logs["fp32"][0]],
                                 options(results))
    assert plan.cell_ids == ["v100-g1-bs32-amp-r1", "v100-g1-bs32-amp-r2",
                             "v100-g1-bs32-fp32-r1"]
    rows = {r.group: r for r in summarize(paths.results())}
    assert rows["v100-g1-bs32-amp"].ok == 2


def test_new_matrix_is_generated_from_the_logs(logs, tmp_path):
    root = tmp_path / "r"
    raport, _ = logs["fp32"]
    with pytest.raises(ConfigError) as info:
        import_results([raport], options(root, matrix="fresh"))
    assert "give --param hardware=NAME" in str(info.value)
    paths, plan = import_results([raport], options(root, matrix="fresh",
                                                   params=["hardware=h100"], warmup=3))
    assert plan.cell_ids == ["h100-g1-bs32-fp32-r1"]
    assert load_matrix(paths.matrix_file).name == "fresh"  # a valid matrix file
    (res,) = paths.results()
    assert res.params["warmup"] == 3 and res.metrics["warmup"] == 3
    assert res.provenance["matched_on"]["warmup"] == "--warmup"


# --- DLPerf-style folders ------------------------------------------------------------------


def dlperf_folder(logs, tmp_path: Path) -> Path:
    folder = tmp_path / "dlperf"
    (folder / "sub").mkdir(parents=True)
    shutil.copy(logs["amp"][1], folder / "resnet50_amp_bs32_g1_r2.log")
    shutil.copy(logs["amp2"][1], folder / "sub" / "resnet50_amp_bs32_g1_r1.log")
    shutil.copy(logs["fp32"][1], folder / "resnet50_fp32_bs32_g1.log")
    (folder / "README.md").write_text("how we ran these\n")
    return folder


def test_dlperf_folder_named_by_configuration(logs, results, tmp_path, capsys):
    folder = dlperf_folder(logs, tmp_path)
    assert main(["import", str(folder), "--matrix", "dle_cal", "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert f"skipped (name does not match the naming rule): {folder / 'README.md'}" in out
    assert f"{folder / 'sub' / 'resnet50_amp_bs32_g1_r1.log'} -> v100-g1-bs32-amp-r1" in out
    assert f"{folder / 'resnet50_amp_bs32_g1_r2.log'} -> v100-g1-bs32-amp-r2" in out
    run = runs_of(results, "dle_cal")[-1]
    origin = {r.cell_id: r.provenance["matched_on"] for r in run.results()}
    assert origin["v100-g1-bs32-fp32-r1"]["precision"] == "log"


def test_file_name_contradicting_the_log(logs, results, tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    shutil.copy(logs["amp"][1], folder / "resnet50_fp32_bs64_g1.log")
    with pytest.raises(ConfigError) as info:
        plan_import([folder], options(results))
    fields = {(p.field, p.message) for p in info.value.problems}
    assert ("file name", "says precision=fp32 but the log says precision=amp") in fields
    assert ("file name", "says batch_size=64 but the log says batch_size=32") in fields


def test_pattern_override_for_nested_folders(logs, results, tmp_path):
    folder = tmp_path / "nested"
    for i, name in enumerate(("amp", "amp2"), start=1):
        (folder / "bz32" / "amp").mkdir(parents=True, exist_ok=True)
        shutil.copy(logs[name][0], folder / "bz32" / "amp" / f"{i}.json")
    pattern = r"bz(?P<batch_size>\d+)/(?P<precision>\w+)/(?P<repeat>\d+)\.json"
    _, plan = import_results([folder], options(results, pattern=pattern))
    assert plan.cell_ids == ["v100-g1-bs32-amp-r1", "v100-g1-bs32-amp-r2"]
    with pytest.raises(ConfigError, match="unknown: bz"):
        plan_import([folder], options(results, pattern=r"(?P<bz>\d+)"))
    with pytest.raises(ConfigError, match="does not compile"):
        plan_import([folder], options(results, pattern=r"(?P<bs"))


# --- our own run folders -------------------------------------------------------------------


def test_own_run_folder_round_trip(logs, results, tmp_path, capsys):
    paths, _ = import_results([logs["amp"][0], logs["fp32"][0]], options(results))
    copied = tmp_path / "elsewhere"
    assert main(["import", str(paths.root), "--results", str(copied)]) == 0
    again = RunPaths(copied / "dle_cal" / paths.run_id)
    assert [r.cell_id for r in again.results()] == [r.cell_id for r in paths.results()]
    for old, new in zip(paths.results(), again.results(), strict=True):
        assert new.metrics == old.metrics and new.params == old.params
        assert new.provenance["imported"]["format"] == "run-folder"
        assert new.provenance["imported"]["previous"] == old.provenance["imported"]
        assert new.provenance["figures"] == old.provenance["figures"]
    assert (again.root / "summary.txt").read_text() == (paths.root / "summary.txt").read_text()
    capsys.readouterr()
    assert main(["import", str(paths.root), "--results", str(copied)]) == 2
    assert "already imported into dle_cal" in capsys.readouterr().err


def test_a_run_folder_is_recognised_under_another_run_id_and_as_a_copy(logs, results,
                                                                       tmp_path, capsys):
    """Issue 24, item 3: a run folder imported again under a new --run-id, a copy of an import
    of it, or the original sweep run lying in the results: each is the same run, refused; two
    different runs of one matrix (the same plan.json) are two runs, both imported."""
    paths, _ = import_results([logs["amp"][0]], options(results))
    elsewhere = tmp_path / "elsewhere"
    assert main(["import", str(paths.root), "--results", str(elsewhere)]) == 0
    copy = elsewhere / "dle_cal" / paths.run_id
    capsys.readouterr()
    for source, target in [(paths.root, elsewhere), (copy, results), (copy, elsewhere)]:
        assert main(["import", str(source), "--results", str(target), "--run-id",
                     "another-name"]) == 2
        assert "already imported into dle_cal as run" in capsys.readouterr().err
    swept = tmp_path / "swept"
    matrix_file = tmp_path / "dle_cal.toml"
    for run_id, started in (("20260301-000000-aaaa", 1772323200.0),
                            ("20260302-000000-aaaa", 1772409600.0)):
        run = RunPaths.create(swept, "dle_cal", run_id)
        write_json(run.plan, plan_json(load_matrix(matrix_file), "process"))
        write_json(run.run_meta, {"run_id": run_id, "matrix": "dle_cal", "started_at": started,
                                  "controller": "node1:4242:123"})
        res = CellResult("v100-g1-bs32-amp-r1", "v100-g1-bs32-amp", 1, Status.OK,
                         params=load_matrix(matrix_file).cells[1].params.model_dump())
        write_json(run.cell_result(res.cell_id), res.to_json())
        assert main(["import", str(run.root), "--results", str(results)]) == 0
        assert main(["import", str(run.root), "--results", str(swept), "--run-id", "x"]) == 2
        assert "already imported into dle_cal as run " + run_id in capsys.readouterr().err


def test_two_imports_of_one_file_at_once_make_one_run(logs, results):
    """Issue 24, item 3: both imports planned (each saw no earlier import), then written one
    after the other: the second, under the import lock, finds the first's run and is refused.
    (benchmarks/fault_suite.py's concurrent-import runs four real processes at once.)"""
    raport = logs["amp"][0]
    first, second = (plan_import([raport], options(results)) for _ in range(2))
    importer.write_import(first, options(results))
    with pytest.raises(ConfigError, match="already imported into dle_cal as run"):
        importer.write_import(second, options(results))
    assert entries_of(results) == sorted([EARLIER, first.run_id])


def test_a_results_folder_that_cannot_take_the_run_is_one_error_line(logs, results, tmp_path,
                                                                     capsys):
    """As `matrix` does for a read-only or full results folder (root here: a file stands where
    the matrix's folder would be): exit 2 naming --results, nothing written."""
    paths, _ = import_results([logs["amp"][0]], options(results))
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "dle_cal").write_text("")
    capsys.readouterr()
    assert main(["import", str(paths.root), "--results", str(blocked)]) == 2
    err = capsys.readouterr().err
    assert f"--results: {blocked}: cannot create the run folder {blocked / 'dle_cal'}" in err
    assert sorted(p.name for p in blocked.iterdir()) == ["dle_cal"]


def test_own_run_folder_reindexed_to_another_matrix(logs, results, tmp_path):
    paths, _ = import_results([logs["amp"][0]], options(results))
    other = tmp_path / "other.toml"
    other.write_text(MATRIX.replace('name = "dle_cal"', 'name = "wide"')
                     .replace('precision = ["fp32", "amp"]',
                              'precision = ["fp32", "amp"]\narch = ["resnet50", "resnet18"]'))
    new, plan = import_results([paths.root], options(tmp_path / "r2", matrix=str(other)))
    assert [c.new_id for c in plan.run_folder.cells] == ["v100-resnet50-g1-bs32-amp-r1"]
    (res,) = new.results()
    assert res.cell_id == "v100-resnet50-g1-bs32-amp-r1"
    assert res.provenance["imported"]["original_cell_id"] == "v100-g1-bs32-amp-r1"


def test_broken_run_folder_names_file_and_line(logs, results, tmp_path):
    paths, _ = import_results([logs["amp"][0]], options(results))
    broken = tmp_path / "broken"
    shutil.copytree(paths.root, broken)
    result = broken / "cells" / "v100-g1-bs32-amp-r1" / "result.json"
    result.write_text(result.read_text()[:200])
    with pytest.raises(ConfigError) as info:
        plan_import([broken], options(tmp_path / "r3", matrix=None))
    (p,) = info.value.problems
    assert p.file == str(result) and p.field.startswith("line ")
    assert "malformed JSON" in p.message


# --- bad and partial logs: a clear error, nothing written -------------------------------------


def test_truncated_raport_error_names_line_and_writes_nothing(logs, results, tmp_path, capsys):
    raport, _ = logs["amp"]
    lines = raport.read_text().splitlines()
    cut = tmp_path / "cut.json"
    cut.write_text("\n".join(lines[:30]) + "\n" + lines[30][:40])
    before = entries_of(results)
    assert main(["import", str(cut), "--matrix", "dle_cal", "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert f"error: {cut}: line 31: malformed DLLogger record" in err
    assert "Traceback" not in err
    assert entries_of(results) == before


def test_partial_log_needs_allow_partial(logs, results):
    raport, _ = logs["partial"]
    with pytest.raises(ConfigError) as info:
        plan_import([raport], options(results))
    (p,) = info.value.problems
    assert p.file == str(raport)
    assert p.field == f"line {len(raport.read_text().splitlines())}"
    assert "without DLLogger's run summary" in p.message and "--allow-partial" in p.message
    paths, _ = import_results([raport], options(results, allow_partial=True))
    assert paths.results()[0].metrics["iterations"] == 7


def test_failure_while_writing_leaves_nothing(logs, results, monkeypatch):
    before = entries_of(results)

    def boom(*args, **kw):
        raise OSError("disk full")

    monkeypatch.setattr("orchestrator.results.reports.summary.write_summary", boom)
    with pytest.raises(ConfigError, match="cannot write the run folder .*: disk full; nothing "
                       "was imported"):
        import_results([logs["amp"][0]], options(results))
    assert entries_of(results) == before  # no run, no hidden temporary folder


def test_every_problem_at_once(logs, results, tmp_path):
    junk = tmp_path / "junk.log"
    junk.write_text("nothing to see\n")
    binary = tmp_path / "bin.log"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError) as info:
        plan_import([junk, binary, tmp_path / "missing.json", logs["amp"][0]],
                    options(results, params=["hardware=v100", "gpus=0", "colour=red",
                                             "noequals"]))
    found = {(p.file, p.field): p.message for p in info.value.problems}
    assert len(found) == 6
    assert "greater than 0" in found["--param", "gpus=0"]
    assert "unknown parameter" in found["--param", "colour"]
    assert "expected KEY=VALUE" in found["--param", "noequals"]
    assert "not a log this importer reads" in found[str(junk), ""]
    assert "not UTF-8" in found[str(binary), ""]
    assert "no such file" in found[str(tmp_path / "missing.json"), ""]


def test_no_matching_configuration(logs, results):
    raport, _ = logs["amp"]
    with pytest.raises(ConfigError) as info:
        plan_import([raport], options(results, params=["batch_size=64"]))
    message = info.value.problems[0].message
    assert "matches no configuration of matrix 'dle_cal'" in message
    assert "nearest: v100-g1-bs32-amp (has batch_size=32)" in message


def test_ambiguous_configuration_asks_for_the_parameter(results, tmp_path):
    log = tmp_path / "bench.log"
    log.write_text("throughput 1234.5 img/s\n")
    figures = FiguresConfig(parser="regex", regex=[{
        "name": "train.total_ips", "pattern": r"throughput ([0-9.]+)"}])
    with pytest.raises(ConfigError) as info:
        plan_import([log], options(results, figures=figures))
    assert "matches 2 configurations" in str(info.value) and "--param for precision" in \
        str(info.value)
    paths, _ = import_results([log], options(results, figures=figures,
                                             params=["precision=fp32"]))
    assert paths.results()[0].metrics["train.total_ips"] == 1234.5


def test_figures_outside_bounds_import_as_failed(logs, results, capsys):
    figures = FiguresConfig(parser="dllogger", bounds={"train.total_ips": {"lower": 1e12}})
    paths, plan = import_results([logs["amp"][0]], options(results, figures=figures))
    (res,) = paths.results()
    assert res.status is Status.FAILED and "below its declared lower bound" in res.reason
    assert read_json(paths.run_meta)["counts"] == {"failed": 1}


def test_workload_log_params_come_from_its_meta_line(results, tmp_path):
    from workload.output import Reporter

    log = tmp_path / "log.txt"
    with log.open("w") as fh:
        rep = Reporter(fh)
        rep.emit({"type": "meta", "env": {"arch": "resnet50", "mode": "train",
                                          "batch_size": 32, "precision": "amp",
                                          "world_size": 1, "image_size": 224}})
        rep.emit({"type": "summary", "status": "ok", "env": {"device": "cuda"},
                  "data": {"train.total_ips": 777.0}})
    paths, plan = import_results([log], options(results))
    assert plan.cell_ids == ["v100-g1-bs32-amp-r1"]
    (res,) = paths.results()
    assert res.metrics == {"train.total_ips": 777.0} and res.env == {"device": "cuda"}
    assert json.loads((paths.cell_metrics(res.cell_id)).read_text().splitlines()[0])["type"] \
        == "meta"


def test_dry_run_writes_nothing(logs, results, capsys):
    before = entries_of(results)
    assert main(["import", str(logs["amp"][0]), "--matrix", "dle_cal", "--results",
                 str(results), "--dry-run"]) == 0
    assert "dry run: would write" in capsys.readouterr().out
    assert entries_of(results) == before


@pytest.mark.parametrize("source", ["amp", "fp32"])
def test_the_dry_run_names_the_run_the_import_then_writes(logs, results, capsys, source):
    """Issue 23: the dry run printed a run id with a random suffix, and the import wrote
    another."""
    args = ["import", str(logs[source][0]), "--matrix", "dle_cal", "--results", str(results)]
    assert main([*args, "--dry-run"]) == 0
    said = capsys.readouterr().out.splitlines()[-1]
    assert said.startswith("dry run: would write ")
    assert main([*args, "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == said  # the same each time
    assert main(args) == 0
    folder = said.removeprefix("dry run: would write ").rstrip("/")
    assert folder in capsys.readouterr().out.splitlines()  # the folder the import wrote
    assert Path(folder, "run.json").is_file()


def test_import_help(capsys):
    with pytest.raises(SystemExit) as info:
        main(["import", "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0 and "usage: orchestrate import" in out and "--allow-partial" in out


def test_run_folder_values_are_checked(logs, results, tmp_path):
    paths, _ = import_results([logs["amp"][0]], options(results))
    broken = tmp_path / "broken"
    shutil.copytree(paths.root, broken)
    result = broken / "cells" / "v100-g1-bs32-amp-r1" / "result.json"
    data = json.loads(result.read_text())
    result.write_text(json.dumps({**data, "metrics": [1, 2]}))
    with pytest.raises(ConfigError) as info:
        plan_import([broken], options(tmp_path / "r4", matrix=None))
    assert (info.value.problems[0].file, info.value.problems[0].field) == (str(result),
                                                                            "metrics")
    result.write_text(json.dumps(data))
    plan = json.loads((broken / "plan.json").read_text())
    (broken / "plan.json").write_text(json.dumps({**plan, "matrix": "../../etc"}))
    with pytest.raises(ConfigError, match="is no matrix name"):
        plan_import([broken], options(tmp_path / "r4", matrix=None))
    assert not (tmp_path / "r4").exists() and not (tmp_path / "etc").exists()


def test_a_dllogger_raport_is_streamed_and_read_once_with_the_same_figures(logs, results):
    """Issue 24, item 14: a large raport was held whole as text, split into lines three times
    and parsed twice (200 MB: 74 s and 1.5 GB here; benchmarks/import_speed.py). Now it is
    read line by line and parsed once; the figures are those of the text parser."""
    from orchestrator.results.figures.figure_parsers import CellOutput, parse_figures

    raport = logs["amp"][0]
    plan = plan_import([raport], options(results))
    (entry,) = plan.entries
    assert entry.text == "" and entry.dll is not None  # no copy of the file's text is kept
    whole = parse_figures(CellOutput(raport.read_text(), params=entry.params),
                          FiguresConfig(parser="dllogger"))
    assert entry.evaluation is not None
    assert entry.evaluation.figures.metrics == whole.metrics
    assert entry.evaluation.figures.started_at == whole.started_at


def test_stack_declares_what_the_log_does_not_state(logs, results, capsys):
    """Issue 23: an imported DLLogger raport had ``stack: null``, so history could not compare
    it with the sweeps; ``--stack`` declares it, recorded as declared."""
    from orchestrator.results.folders.store import open_store

    args = ["import", str(logs["amp"][0]), "--matrix", "dle_cal", "--results", str(results)]
    assert main([*args, "--stack", "torhc=2.4.0", "--dry-run"]) == 2
    assert "--stack: torhc: unknown field; did you mean torch?" in capsys.readouterr().err
    assert main([*args, "--stack", "torch", "--dry-run"]) == 2
    assert "expected FIELD=VALUE" in capsys.readouterr().err
    assert main([*args, "--stack", "torch=2.4.0", "--stack", "gpu=Tesla V100-SXM2-32GB",
                 "--stack", "image=nvcr.io/nvidia/pytorch:24.05-py3"]) == 0
    capsys.readouterr()
    with open_store(results) as store:
        run = store.runs(matrix="dle_cal")[-1]
        (cell,) = store.cells([run.pk])
    assert cell.stack is not None
    assert (cell.stack.torch, cell.stack.gpu, cell.stack.image, cell.stack.cuda) == (
        "2.4.0", "Tesla V100-SXM2-32GB", "nvcr.io/nvidia/pytorch:24.05-py3", None)
    (res,) = RunPaths(Path(run.path)).results()
    assert res.provenance["declared_stack"]["torch"] == "2.4.0"


def test_an_import_records_only_what_the_log_and_param_state(logs, tmp_path):
    """Issue 23: an imported raport got workload defaults it never stated (data=synthetic,
    channels_last=true, iterations=100) in its result's params, as if measured."""
    root = tmp_path / "r"
    raport, _ = logs["fp32"]
    paths, _ = import_results([raport], options(root, matrix="fresh",
                                                params=["hardware=h100"]))
    (res,) = paths.results()
    assert {"data", "channels_last", "iterations", "compile"}.isdisjoint(res.params)
    assert res.params["hardware"] == "h100" and res.params["precision"] == "fp32"
    assert set(res.params) <= set(res.provenance["matched_on"])  # each says where it came from
    configuration = res.provenance["configuration"]  # the matrix's, kept apart
    assert configuration["iterations"] == 100 and configuration["batch_size"] == 32
    planned = read_json(paths.plan)["cells"][0]["params"]
    assert planned == configuration  # the configuration it joins is unchanged


# --- issue 34, item 6: a plan.json that does not describe its run -----------------------------


def _copied_run(tmp_path: Path, change: Callable[[dict[str, Any]], Any]) -> Path:
    """A run folder of two cells (tests/results_support.py), its plan.json changed."""
    from results_support import Config, params, run_id, write_run

    paths = write_run(tmp_path / "made", "m", run_id(1),
                      [Config(params(batch_size=b), [100.0]) for b in (32, 64)])
    plan = json.loads(paths.plan.read_text())
    change(plan)
    paths.plan.write_text(json.dumps(plan))
    return paths.root


@pytest.mark.parametrize(("change", "field", "says"), [
    (lambda p: p["cells"][0].pop("group"), "cells[0]", "needs id, group (text) and params"),
    (lambda p: p.update(cells={"0": p["cells"][0]}), "cells", "no 'cells' list"),
    (lambda p: p["cells"][0]["params"].update(gpus=3, nodes=2), "cells[0].params",
     "give a multiple of nodes"),
    (lambda p: p["cells"][0].update(group="another"), "group", "the plan says 'another'"),
    (lambda p: p["cells"][1].update(repeat=2), "repeat", "the plan says 2"),
    (lambda p: p["cells"][0]["params"].update(batch_size=7), "params.batch_size",
     "32, the plan says 7"),
])
def test_a_run_folder_whose_plan_does_not_describe_it_is_refused(tmp_path, capsys, change,
                                                                  field, says):
    """A copied run folder whose plan.json is damaged, or says other groups, repeats or
    parameters than its cells' results, is refused naming the file and field (``gpus = 3,
    nodes = 2`` crashed with an IndexError: its error has no field of its own)."""
    source = _copied_run(tmp_path, change)
    results = tmp_path / "results"
    assert main(["import", str(source), "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert f": {field}: " in err and says in err and "Traceback" not in err, err
    assert not results.exists() or not any((results / "m").glob("*/plan.json"))


@pytest.mark.parametrize("damage", [lambda p: p["cells"][0].pop("group"),
                                    lambda p: p.update(cells="x")])
def test_an_import_into_a_matrix_with_a_damaged_run_is_refused(tmp_path, capsys, damage):
    """The matrix an import joins is the groups of its runs: a run whose plan cannot be read
    was skipped (the cells then matched the others only), and with no other run the import
    crashed (IndexError). Now refused, naming that plan."""
    from results_support import Config, params, run_id, write_run

    results = tmp_path / "results"
    kept = write_run(results, "m", run_id(2), [Config(params(), [1.0])])
    plan = json.loads(kept.plan.read_text())
    damage(plan)
    kept.plan.write_text(json.dumps(plan))
    source = _copied_run(tmp_path, lambda p: None)
    assert main(["import", str(source), "--matrix", "m", "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert str(kept.plan) in err and "repair this run's plan" in err and "Traceback" not in err


def test_an_import_whose_reader_is_gone_is_written_whole(logs, results):
    """``orchestrate import ... | head -1``: the reader goes away while the import has more to
    say. It printed before it wrote and stopped at the first line it could not write, so
    nothing was imported. Now the import is written whole and the command ends as every command
    whose reader left: quietly, status 141. (The read end is closed before the CLI has even
    started, so no line can be written.)"""
    raport, _ = logs["amp"]
    before = set(entries_of(results))
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "import", str(raport), "--matrix", "dle_cal",
         "--results", str(results)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(120) == EXIT_BROKEN_PIPE, err
    assert err == "", err
    (new,) = set(entries_of(results)) - before
    (res,) = RunPaths(results / "dle_cal" / new).result_files()
    assert json.loads(res.read_text())["status"] == "ok"


def test_a_copied_run_folder_keeps_its_plan_order_and_selection(tmp_path, capsys):
    """The shipped copy of a `fake_bench --only repeat=1` run (examples/copied): imported, its
    plan.json keeps the source's cell order (batch 8 before 16, not the ids' text order) and
    the --only that made it, so report shows the rows and the line as the sweep's own report
    did, and history knows a configuration left out by --only."""
    source = Path(__file__).parent.parent / "examples/copied/fake_bench/20261127-183836-f024"
    before = json.loads((source / "plan.json").read_text())
    assert main(["import", str(source), "--results", str(tmp_path)]) == 0
    after = json.loads((tmp_path / "fake_bench" / source.name / "plan.json").read_text())
    assert [c["id"] for c in after["cells"]] == [c["id"] for c in before["cells"]]
    assert after["only"] == before["only"] == ["repeat=1"]
    capsys.readouterr()
    assert main(["report", "fake_bench", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "run with --only repeat=1" in out
    assert out.index("| 8 ") < out.index("| 16 ")
