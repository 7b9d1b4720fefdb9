"""The CLI: help, version, plan, validate, schema, dry run, and clear errors without tracebacks."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator import __version__
from orchestrator.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"orchestrate {__version__}"


def _modules_loaded(orchestrate_cli: Callable[..., Any], argv: list[str]) -> set[str]:
    """The orchestrator modules a fresh interpreter has imported after ``main(argv)``, which
    must succeed (no user config file: ORCHESTRATE_CONFIG names none)."""
    code = ("import contextlib, io, json, sys\nfrom orchestrator.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n"
            f"        code = main({argv!r})\n"
            "    except SystemExit as exc:\n"
            "        code = exc.code\n"
            "print(json.dumps([code, sorted(m for m in sys.modules if 'orchestrator' in m)]))")
    done = orchestrate_cli("-c", code, module=None,
                           env={"ORCHESTRATE_CONFIG": str(ROOT / "no-such-config.toml")})
    assert done.returncode == 0, done.stderr
    code, loaded = json.loads(done.stdout.splitlines()[-1])
    assert code == 0, done.stderr
    return set(loaded)


def test_version_imports_no_command_module(orchestrate_cli):
    """``--version`` answers before any command group is imported (orchestrator.cli's
    ``<name>_commands`` modules), while a command imports its own group only."""
    from orchestrator.cli.app import COMMAND_MODULES

    groups = {f"orchestrator.cli.{name}_commands" for name in COMMAND_MODULES}
    loaded = _modules_loaded(orchestrate_cli, ["--version"])
    assert "orchestrator.cli" in loaded
    assert not loaded & groups
    assert _modules_loaded(orchestrate_cli, ["schema"]) & groups == {
        "orchestrator.cli.sweep_commands"}


#: Flags that two commands use for options of different meaning (a default, a choice list or
#: a kind of file of their own): each is declared where it means what it means. ``--set``: a
#: template variable of ``images render|build``, a field of the matrix file elsewhere.
FLAGS_OF_TWO_MEANINGS = {"--threshold", "--status", "--out", "--last", "-q", "-v", "--set"}


def test_each_option_is_declared_once() -> None:
    """Every other option that several commands take is declared once, in
    orchestrator/cli/options.py, and added from there: no ``add_argument("--results", ...)``
    written again in a command module."""
    import ast

    seen: dict[str, list[str]] = {}
    for path in sorted((ROOT / "orchestrator" / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument" and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and str(node.args[0].value).startswith("-")):
                seen.setdefault(str(node.args[0].value), []).append(
                    f"{path.name}:{node.lineno}")
    again = {flag: where for flag, where in seen.items()
             if len(where) > 1 and flag not in FLAGS_OF_TWO_MEANINGS}
    assert not again, f"declared more than once (share it through cli/options.py): {again}"
    assert {"--results", "--hosts", "--backend", "--only", "--dry-run"} <= {
        flag for flag, where in seen.items() if where[0].startswith("options.py")}


@pytest.mark.parametrize("command", [
    ["runs"], ["compare", "m:20261101-000000-aaaa", "m:20261102-000000-aaaa"], ["export", "m"],
])
def test_results_commands_start_without_the_matrix_models(orchestrate_cli, command, tmp_path):
    """runs/compare/export read the results index only: the matrix models
    (orchestrator.config.matrix_file, the slowest import) stay unloaded."""
    from results_support import Config, params, run_id, write_run

    for n in (1, 2):
        write_run(tmp_path, "m", run_id(n), [Config(params(), [100.0, 101.0])])
    loaded = _modules_loaded(orchestrate_cli, [*command, "--results", str(tmp_path)])
    assert "orchestrator.cli.result_commands" in loaded
    assert "orchestrator.config.matrix_file" not in loaded


@pytest.mark.parametrize("command", [
    [], ["matrix"], ["plan"], ["validate"], ["schema"], ["report"], ["images"],
    ["images", "render"], ["images", "build"], ["images", "list"], ["hosts", "check"],
    ["clean"], ["backends"], ["history"], ["runs"], ["compare"], ["export"],
    ["images", "refresh"], ["hosts"], ["import"], ["publish"],
])
def test_help_for_every_command(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([*command, "--help"])
    assert info.value.code == 0
    assert "usage: orchestrate" in capsys.readouterr().out


def test_plan_json_lists_every_cell(orchestrate_cli, gpu_machine):
    """Every cell with its launch, whatever this machine lacks: the matrix mounts the lab's
    /data/imagenet and /data/torch-hub, which this machine has not (if it had them, the plan
    would say the sweep starts: exit 0), so the plan is printed and then those requirements
    (stderr), exit 3."""
    gpu_machine("V100")  # the docker backend's cells run on this machine's GPUs
    proc = orchestrate_cli("plan", "matrices/v100_scaling.toml", "--json")
    lacking = [p for p in ("/data/imagenet", "/data/torch-hub") if not Path(p).exists()]
    assert proc.returncode == (3 if lacking else 0), proc.stderr
    cells = json.loads(proc.stdout)
    assert len(cells) == 40
    assert {"id", "params", "hash", "repeat", "group", "launch"} <= set(cells[0])
    assert cells[0]["params"]["batch_size"] == 128
    assert sorted({c["params"]["gpus"] for c in cells}) == [1, 2, 4, 8]
    for path in lacking:
        assert f"{path} does not exist on this machine" in proc.stderr
    assert ("would not start here" if lacking else "would start here") in proc.stderr


def test_plan_table_and_only(capsys, gpu_machine):
    gpu_machine("V100")
    lacking = not Path("/data/imagenet").exists()
    assert main(["plan", "matrices/v100_scaling.toml", "--only", "gpus=8", "--only",
                 "precision=amp"]) == (3 if lacking else 0)
    out = capsys.readouterr().out
    assert "v100_scaling: 5 cells" in out
    plan = out.partition("requirements of the target")[0]
    assert "v100-g8-bs128-amp-r5" in plan and "fp32" not in plan.split("\n", 2)[2]
    if lacking:
        assert "hardware.v100.container.mounts[0].source: /data/imagenet" in out


def test_validate_ok(capsys, gpu_machine):
    gpu_machine("Gaudi2")
    assert main(["validate", "matrices/gaudi.toml"]) == 0
    assert "ok (24 cells)" in capsys.readouterr().out


def test_validate_reports_every_problem_exit_2_no_traceback(orchestrate_cli, write_matrix):
    path = write_matrix("""
        [matrix]
        repeats = 0
        [axes]
        hardware = ["cpu", "h100"]
        gpus = [0]
        batch_size = [-8]
    """)
    proc = orchestrate_cli("validate", str(path))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert f"{path}: matrix.repeats" in proc.stderr
    assert f"{path}: axes.gpus[0]" in proc.stderr
    assert f"{path}: axes.batch_size[0]" in proc.stderr
    assert "4 problems" in proc.stderr


def test_validate_and_plan_report_an_unknown_backend(write_matrix, capsys):
    path = write_matrix("""
        [matrix]
        backend = "kubernetes"
        [axes]
        hardware = ["cpu"]
    """)
    for command in ("validate", "plan"):
        assert main([command, str(path)]) == 2
        err = capsys.readouterr().err
        assert f"{path}: matrix.backend: unknown backend 'kubernetes'; known: process" in err


def test_missing_file_and_bad_backend_are_clean_errors(orchestrate_cli, tmp_path):
    proc = orchestrate_cli("plan", str(tmp_path / "nope.toml"))
    assert proc.returncode == 2 and "no such file" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = orchestrate_cli("matrix", "matrices/cpu_smoke.toml", "--backend", "k8s",
                           "--results", str(tmp_path))
    assert proc.returncode == 2 and "unknown backend 'k8s'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_schema_is_json_schema(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] == "orchestrate matrix file"
    assert {"matrix", "workload", "axes", "zip", "include", "exclude", "hardware"} <= set(
        schema["properties"])


def test_dry_run_runs_nothing(tmp_path, capsys):
    assert main(["matrix", "matrices/cpu_smoke.toml", "--results", str(tmp_path),
                 "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "cpu_smoke: 8 cells" in out and "dry run: would run 8 cells" in out
    assert list(tmp_path.iterdir()) == []


def test_help_names_every_backend(capsys):
    """`matrix --help` and `validate --help` list the backends the registry has; the
    top-level description names the four of docs/backends.md's table."""
    from orchestrator.backends import backend_names

    for command in ("matrix", "validate"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = " ".join(capsys.readouterr().out.split())
        assert all(name in out for name in backend_names()), out
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split()).lower()
    assert all(word in out for word in ("locally", "docker", "ssh", "slurm")), out


def test_a_missing_build_file_is_refused_and_the_dry_run_still_shows_the_plan(
        tmp_path, capsys, gpu_machine):
    """The Bitfusion client .deb is the lab's own: the sweep refuses a build that would miss it,
    and so does validate (exit 3: a requirement of this machine, the file is right); a dry run
    shows every cell's launch, then that requirement (the Bitfusion image is not planned here,
    the native one is), exit 3."""
    gpu_machine("V100")  # the native profile's cells run on this machine's V100
    path = tmp_path / "bitfusion_vs_native.toml"
    path.write_text((ROOT / "matrices" / "bitfusion_vs_native.toml").read_text())
    assert main(["validate", str(path)]) == 3
    captured = capsys.readouterr()
    assert captured.out == "" and "image_vars.client_deb: file or folder" in captured.err
    assert main(["matrix", str(path), "--dry-run", "--results", str(tmp_path / "r")]) == 3
    out = capsys.readouterr().out
    plan, _, lacks = out.partition("requirements of the target (this machine):")
    assert "image for v100-bitfusion: not planned here" in plan
    assert "image for v100: orchestrate/ngc-pytorch:" in plan
    assert plan.count("    command: ") == 36  # every cell's launch
    assert "hardware.v100-bitfusion.image_vars.client_deb: file or folder" in lacks
    assert "the sweep would not start here" in lacks
    (tmp_path / "bitfusion").mkdir()
    (tmp_path / "bitfusion" / "bitfusion-client-ubuntu2204_amd64.deb").write_bytes(b"x")
    for name in ("client.yaml", "servers.conf"):
        (tmp_path / "bitfusion" / name).write_text("stand-in\n")
    (tmp_path / "bitfusion" / "bitfusion-ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    assert main(["validate", str(path), "--strict"]) == 0
    assert "warning" not in capsys.readouterr().out


def test_export_status_choices_are_the_cell_statuses():
    from orchestrator.cli.result_commands import CELL_STATUSES
    from orchestrator.results.folders.run_folder import Status

    assert tuple(s.value for s in Status) == CELL_STATUSES


def test_images_refresh_summary_says_nothing_changed_only_when_every_host_answered(tmp_path):
    from orchestrator.cli.image_commands import _summary
    from orchestrator.images.refresh import HostRefresh, ImageRefresh, RefreshReport

    state = tmp_path / ".orchestrate-images.json"
    fresh = ImageRefresh(matrix="m", hardware="h100", ngc_release=None, action="up to date")
    ok = RefreshReport(hosts=[HostRefresh("a", images=[fresh])], notes=[], state_file=state)
    assert _summary(ok, dry_run=True).startswith("nothing changed: 1 image(s) up to date")
    lost = RefreshReport(hosts=[HostRefresh("a", images=[fresh]), HostRefresh("b", False)],
                         notes=[], state_file=state)
    assert _summary(lost, dry_run=True).startswith("nothing rebuilt: 1 image(s) up to date")
    assert _summary(lost, dry_run=True).endswith("1 host(s) not reached")
    empty = RefreshReport(hosts=[HostRefresh("a")], notes=[], state_file=state)
    assert "no image recorded for them (give the MATRIX files" in _summary(empty, dry_run=True)
