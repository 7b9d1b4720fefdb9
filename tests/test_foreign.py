"""Foreign programs: cells that run a ``[commands.NAME]`` template instead of our workload.

Unit tests: a template's words and their rendering (a hostile value stays one argv item and
never becomes an option), placeholder mappings (lists expand, an unmapped value is refused by
field), launchers (torchrun for several GPUs, one torchrun per node, programs that spawn their
own ranks), wrappers, environment and working directory, ids and hashes, the checks, and the
shipped side-by-side matrices.

Integration tests run a real program through every backend, with our workload beside it in one
sweep, and check that its figures reach the summary like the workload's: the local process
backend (workload tier), a real container (``docker``), a container on a real sshd host
(``docker``, ``ssh``) and a real Slurm job (``slurm``). NVIDIA's ConvNets ``main.py`` needs CUDA,
which these machines lack, so ``tests/lab_bench.py`` stands in for it: a real program with DLE's
arguments that reads torchrun's environment (or spawns its own ranks), forms a real gloo process
group, does real work and logs through the real NVIDIA DLLogger (installed from the peers
folder; ``.ci/run`` installs it).
"""

from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from dllogger_support import dllogger_available
from gpu_support import facts
from slurm_support import SlurmCluster, slurm_cluster  # noqa: F401 - slurm_cluster: a fixture
from standin_support import Standin, container_mount
from workload_support import TINY_WORKLOAD

from orchestrator.backends.checks import check_matrix, machine_problems
from orchestrator.config.matrix_file import (
    CellParams,
    CommandRenderError,
    CommandTemplate,
    command_values,
)
from orchestrator.errors import ConfigError, LaunchError
from orchestrator.plan.launch import NodeRole, cell_command
from orchestrator.plan.matrix import load_matrix
from orchestrator.results.folders.run_folder import CellResult, RunPaths, Status
from orchestrator.sweep import run_sweep
from workload import metrics as wm

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent

#: Our cells (tiny workload) beside the lab's program, one configuration each; ``{launcher}``,
#: ``{extra}``: more of the file.
MATRIX = """
[matrix]
name = "foreign"
backend = "{backend}"
timeout_s = 240
baseline = "program=lab"

[workload]
hardware = "cpu"
{tiny}
telemetry_interval = 0

[axes]
program = ["{ours}", "lab"]

[hardware.cpu]
device = "cpu"
env = {{ OMP_NUM_THREADS = "1" }}
{profile}

[commands.lab]
command = '''
    {python} ./{script} --arch {{arch}} -b {{batch_size}} {{precision}}
    --prof {{total_iterations}} --print-freq 1 --training-only
    --workspace {{output_dir}} --raport-file raport.json {{data}}
'''
workdir = "{workdir}"
env = {{ LAB_BENCH_MARK = "from the command" }}
figures = {{ parser = "dllogger", raport = "raport.json" }}

[commands.lab.placeholders.precision]
values = {{ fp32 = [], amp = ["--amp", "--static-loss-scale", "256"] }}

[commands.lab-self]
command = '''
    {python} ./{script} -b {{batch_size}} --spawn {{gpus}} --prof {{total_iterations}}
    --workspace {{output_dir}} --raport-file raport.json ./
'''
launcher = "self"
workdir = "{workdir}"
figures = {{ parser = "dllogger", raport = "raport.json" }}
{extra}
"""


def matrix_text(*, backend: str = "process", extra: str = "", profile: str = "",
                python: str = "{python}", script: str = "lab_bench.py",
                workdir: str = str(TESTS), standin: Standin | None = None,
                container: bool = False) -> str:
    """The side-by-side matrix; with ``standin``, "ours" is the STAND-IN workload (in a
    container when ``container``: the profile must mount it) instead of the real one."""
    ours = "workload" if standin is None else "standin"
    text = MATRIX.format(backend=backend, tiny=TINY_WORKLOAD, profile=profile, python=python,
                         script=script, workdir=workdir, extra=extra, ours=ours)
    return text if standin is None else text + standin.command(container=container)


def values(unchecked: dict[str, Any] | None = None, **params: Any) -> dict[str, Any]:
    """A cell's template values; ``unchecked``: parameters set past CellParams' own validation
    (to test the renderer's checks behind it)."""
    cell_params = CellParams(hardware="cpu", **params).model_copy(update=unchecked or {})
    return command_values(cell_params, "lab", python="py", output_dir="/out", cell_id="c-r1")


# --- templates: words and items ----------------------------------------------------------------

HOSTILE = [
    "/data/a b",                   # a space
    "/data/it's \"quoted\"",        # quotes
    "/data/x; rm -rf ~",           # a command separator
    "/data/$(touch /tmp/pwned)",   # command substitution
    "/data/`id`",                  # backticks
    "/data/$HOME/*",               # expansion and a glob
    "/data/{arch}",                # a placeholder in a value is not expanded again
]


@pytest.mark.parametrize("value", HOSTILE)
def test_a_value_is_one_argv_item_as_it_is(value: str) -> None:
    """Values reach the program as the characters they are: a shell never sees them."""
    template = CommandTemplate(command="prog {data} --data={data} 'x {data} y' -- {arch}")
    items = template.render(values(data=value))
    assert items == ["prog", value, f"--data={value}", f"x {value} y", "--", "resnet50"]


def test_a_template_is_split_once_by_shell_rules() -> None:
    template = CommandTemplate(command="""
        {python} "./my prog.py" --name='a b' \\
            --literal={{braces}} -b {batch_size}
    """)
    assert template.render(values(batch_size=8)) == [
        "py", "./my prog.py", "--name=a b", "--literal={braces}", "-b", "8"]
    assert template.uses() == ["python", "batch_size"]


def test_lists_expand_into_items_and_an_empty_list_into_none() -> None:
    template = CommandTemplate(
        command="prog {flags} -b {batch_size} {data}",
        placeholders={
            "flags": {"param": "precision", "values": {
                "fp32": [], "amp": ["--amp", "--static-loss-scale", "256"], "bf16": "--bf16"}},
            "data": {"values": {"synthetic": ["--data-backend", "synthetic", "./"]}},
        })
    assert template.problems() == []
    assert template.render(values(precision="amp")) == [
        "prog", "--amp", "--static-loss-scale", "256", "-b", "64",
        "--data-backend", "synthetic", "./"]
    assert template.render(values(precision="fp32")) == [
        "prog", "-b", "64", "--data-backend", "synthetic", "./"]
    assert template.render(values(precision="bf16"))[1] == "--bf16"


def test_booleans_and_numbers_are_written_as_toml_writes_them() -> None:
    template = CommandTemplate(command="p {channels_last} {memory} {telemetry_interval}",
                               placeholders={"memory": {"param": "channels_last", "values": {
                                   "true": "nhwc", "false": "nchw"}}})
    assert template.render(values(channels_last=False)) == ["p", "false", "nchw", "0.5"]


def test_an_unmapped_value_and_an_option_like_value_are_every_problem_of_a_cell() -> None:
    template = CommandTemplate(command="prog {data} {flags}", placeholders={
        "flags": {"param": "precision", "values": {"fp32": []}}})
    # CellParams refuses a data value starting with '-' (issue 24); the renderer's own check
    # stands behind it for every value a template places as a word of its own
    with pytest.raises(CommandRenderError) as err:
        template.render(values({"data": "--help"}, precision="amp"))
    fields = [f for f, _ in err.value.problems]
    assert fields == ["placeholders.flags.values", "command"]
    assert "no entry for precision = 'amp'" in str(err.value)
    assert "'--help' starts with '-'" in str(err.value)
    # inside a word it cannot be an option: accepted
    assert CommandTemplate(command="prog --data={data}").render(values({"data": "--help"})) == [
        "prog", "--data=--help"]


@pytest.mark.parametrize(("command", "placeholders", "needle"), [
    ("prog {batch_sise}", {}, "did you mean {batch_size}"),
    ("prog {flags}", {"flag": {"param": "precision", "values": {"fp32": []}}},
     "did you mean {flag}"),
    ("prog {x}", {"x": {"param": "precison", "values": {"fp32": []}}},
     "'precison' is not a cell parameter (did you mean {precision}?)"),
    ("prog --p={x}", {"x": {"param": "precision", "values": {"fp32": ["a", "b"]}}},
     "sits inside a word with other text"),
    ("prog {x}", {"x": {"param": "precision", "values": {"ampp": []}}},
     "'ampp' is not a value of precision"),
    ("prog {python}", {"python": {"param": "precision", "values": {"fp32": "x"}}},
     "is given by orchestrate"),
    ("prog", {"x": {"param": "precision", "values": {"fp32": "x"}}}, "not used"),
])
def test_template_names_are_checked(command: str, placeholders: dict[str, Any],
                                    needle: str) -> None:
    problems = CommandTemplate(command=command, placeholders=placeholders).problems()
    assert any(needle in message for _, message in problems), problems


@pytest.mark.parametrize(("command", "needle"), [
    ("prog 'unclosed", "cannot be split into words"),
    ("prog {a", "literal braces"),
    ("prog {arch!r}", "has a format"),
    ("prog {arch.x}", "is no placeholder name"),
    ("prog {}", "is no placeholder name"),
    ("   ", "is empty"),
    ("prog 'two\nlines'", "control character"),
])
def test_templates_that_cannot_be_words_are_refused(command: str, needle: str) -> None:
    with pytest.raises(Exception) as err:  # pydantic's ValidationError
        CommandTemplate(command=command)
    assert needle in str(err.value)


# --- the matrix: loading, ids, hashes ---------------------------------------------------------


def test_programs_are_an_axis_with_readable_ids(write_matrix) -> None:
    matrix = load_matrix(write_matrix(matrix_text(), cpu_profile=False))
    assert [c.id for c in matrix.cells] == ["cpu-workload-g1-bs2-fp32-r1", "cpu-lab-g1-bs2-fp32-r1"]
    workload, lab = matrix.cells
    assert matrix.program(workload).command is None
    assert matrix.program(workload).parser == "workload"
    assert matrix.program(lab).name == "lab" and matrix.program(lab).parser == "dllogger"


def test_hashes_cover_the_command_and_keep_our_cells_as_before(write_matrix) -> None:
    both = load_matrix(write_matrix(matrix_text(), cpu_profile=False))
    plain = load_matrix(write_matrix(matrix_text().replace(
        'program = ["workload", "lab"]', ""), name="plain.toml", cpu_profile=False))
    assert both.cells[0].hash == plain.cells[0].hash  # naming our workload changes nothing
    changed = load_matrix(write_matrix(matrix_text().replace("--print-freq 1", "--print-freq 2"),
                                       name="changed.toml", cpu_profile=False))
    assert changed.cells[0].hash == both.cells[0].hash
    assert changed.cells[1].hash != both.cells[1].hash  # the command is part of what ran
    parser = load_matrix(write_matrix(matrix_text().replace(
        'figures = { parser = "dllogger", raport = "raport.json" }\n\n[commands.lab.placeholders',
        'figures = { parser = "dllogger", raport = "raport.json", warmup = 0 }\n\n'
        '[commands.lab.placeholders'), name="parser.toml", cpu_profile=False))
    assert parser.cells[1].hash != both.cells[1].hash  # so is how its figures are read


def test_a_profile_names_the_program_of_its_cells(write_matrix) -> None:
    text = matrix_text().replace('program = ["workload", "lab"]', 'hardware = ["cpu", "cpu-lab"]')
    text += '[hardware.cpu-lab]\ndevice = "cpu"\nprogram = "lab"\n'
    matrix = load_matrix(write_matrix(text, cpu_profile=False))
    assert [matrix.program(c).name for c in matrix.cells] == ["workload", "lab"]
    assert [c.id for c in matrix.cells] == ["cpu-g1-bs2-fp32-r1", "cpu_lab-g1-bs2-fp32-r1"]
    # a cell's own program comes first
    text += '[[include]]\nhardware = "cpu-lab"\nprogram = "workload"\nseed = 3\n'
    again = load_matrix(write_matrix(text, name="again.toml", cpu_profile=False))
    assert again.program(again.cells[-1]).name == "workload"


def test_every_problem_of_a_foreign_matrix_at_once(write_matrix) -> None:
    text = matrix_text(extra="""
[commands.workload]
command = "prog"
[commands.typo]
command = "prog {batch_sise}"
""").replace('program = ["workload", "lab"]', 'program = ["workload", "lba"]')
    with pytest.raises(ConfigError) as err:
        load_matrix(write_matrix(text, cpu_profile=False))
    got = {p.field: p.message for p in err.value.problems}
    assert set(got) == {"commands.workload", "commands.typo.command", "axes.program[1]"}
    assert "did you mean 'lab'?" in got["axes.program[1]"]
    assert "did you mean {batch_size}" in got["commands.typo.command"]


def test_unmapped_values_are_refused_naming_the_mapping_and_a_cell(write_matrix) -> None:
    text = matrix_text().replace("[axes]", '[axes]\nprecision = ["fp32", "bf16"]')
    with pytest.raises(ConfigError) as err:
        load_matrix(write_matrix(text, cpu_profile=False))
    (problem,) = err.value.problems
    assert problem.field == "commands.lab.placeholders.precision.values"
    assert "no entry for precision = 'bf16'" in problem.message
    assert "cpu-lab-g1-bs2-bf16" in problem.message


def test_self_launching_programs_do_not_span_nodes(write_matrix) -> None:
    text = matrix_text().replace('program = ["workload", "lab"]', 'program = ["lab-self"]')
    text = text.replace('device = "cpu"\n', 'device = "cpu"\nmulti_node = true\n', 1)
    with pytest.raises(ConfigError) as err:
        load_matrix(write_matrix(text, cpu_profile=False))
    assert err.value.problems[0].field == "commands.lab-self.launcher"


# --- the command a backend starts ---------------------------------------------------------------


def test_launchers_for_several_gpus(write_matrix) -> None:
    text = matrix_text().replace('program = ["workload", "lab"]',
                                 'program = ["lab", "lab-self"]\ngpus = [1, 2]')
    matrix = load_matrix(write_matrix(text, cpu_profile=False))
    profile = matrix.profiles["cpu"]
    by = {(matrix.program(c).name, c.params.gpus): c for c in matrix.cells}
    one = cell_command(by["lab", 1], profile, matrix.program(by["lab", 1]), python="py",
                       output_dir="/out")
    assert one.argv[:2] == ["py", "./lab_bench.py"]  # one process: the program itself
    two = cell_command(by["lab", 2], profile, matrix.program(by["lab", 2]), python="py",
                       output_dir="/out")
    assert two.argv[:6] == ["py", "-m", "torch.distributed.run", "--standalone",
                            "--nproc_per_node=2", "--no_python"]
    assert two.argv[6:] == one.argv
    spawn = cell_command(by["lab-self", 2], profile, matrix.program(by["lab-self", 2]),
                         python="py", output_dir="/out")
    assert spawn.argv[:2] == ["py", "./lab_bench.py"]  # once: it starts its own ranks
    assert spawn.argv[spawn.argv.index("--spawn") + 1] == "2"
    role = NodeRole(nnodes=2, rank=1, nproc=2, endpoint="10.0.0.1:29401", rdzv_id="c-r1")
    node = cell_command(by["lab", 2], profile, matrix.program(by["lab", 2]), python="py",
                        output_dir="/out", node=role)
    assert node.argv[:3] == ["py", "-m", "torch.distributed.run"]
    assert node.argv[3:10] == [*role.torchrun_flags(), "--no_python"]
    with pytest.raises(LaunchError):
        cell_command(by["lab-self", 2], profile, matrix.program(by["lab-self", 2]),
                     python="py", output_dir="/out", node=role)


def test_profiler_and_bitfusion_wrap_a_command_as_they_wrap_the_workload(write_matrix) -> None:
    text = matrix_text().replace('program = ["workload", "lab"]', 'program = ["lab"]')
    text = text.replace('hardware = "cpu"', 'hardware = "gpu"').replace(
        "telemetry_interval = 0", 'telemetry_interval = 0\nprofiler = "nsys"\ngpus = 2')
    text += ('[hardware.gpu]\ndevice = "cuda"\nwrapper = "bitfusion"\n'
             'nsys = { capture = "whole" }\n')
    matrix = load_matrix(write_matrix(text, cpu_profile=False))
    (cell,) = matrix.cells
    argv = cell_command(cell, matrix.profile(cell), matrix.program(cell), python="python3",
                        output_dir="/out").argv
    assert argv[:7] == ["bitfusion", "run", "-n", "2", "-p", "1", "--"]
    assert argv[7:12] == ["python3", "-m", "workload.profile_run", "--tool", "nsys"]
    assert "nsys" in argv and "--capture-range=cudaProfilerApi" not in argv
    start = argv.index("torch.distributed.run") - 2
    assert argv[start:start + 6] == ["python3", "-m", "torch.distributed.run", "--standalone",
                                     "--nproc_per_node=2", "--no_python"]
    assert argv[-1] == "synthetic" and "./lab_bench.py" in argv


def test_the_process_backend_pins_gpus_and_runs_in_the_workdir(write_matrix, tmp_path,
                                                                monkeypatch) -> None:
    from orchestrator.backends.base import RunOptions
    from orchestrator.backends.process import ProcessBackend
    from orchestrator.plan.placement import Allocation

    text = matrix_text(workdir="$env:LAB_DIR").replace(
        'program = ["workload", "lab"]', 'program = ["lab"]').replace(
        'hardware = "cpu"', 'hardware = "gpu"') + '[hardware.gpu]\ndevice = "cuda"\n'
    matrix = load_matrix(write_matrix(text, cpu_profile=False))
    monkeypatch.delenv("LAB_DIR", raising=False)
    problems = machine_problems(matrix, ProcessBackend)
    assert [p.field for p in problems] == ["commands.lab.workdir"]
    monkeypatch.setenv("LAB_DIR", str(TESTS))
    assert machine_problems(matrix, ProcessBackend) == []
    backend = ProcessBackend(matrix, RunPaths.create(tmp_path / "r", "foreign"),
                             RunOptions(timeout_s=60))
    (cell,) = matrix.cells
    spec = backend.spec(cell, Allocation.local(cell.id, (2, 5)))
    assert spec.env["CUDA_VISIBLE_DEVICES"] == "2,5"
    assert spec.env["LAB_BENCH_MARK"] == "from the command"
    assert spec.workdir == str(TESTS)
    record = spec.to_json()["program"]
    assert record["name"] == "lab" and record["parser"] == "dllogger"
    assert record["launcher"] == "torchrun" and record["workdir"] == str(TESTS)
    assert record["argv"][:2] == [sys.executable, "./lab_bench.py"]
    assert record["argv"][record["argv"].index("--workspace") + 1] == spec.output_dir
    assert Path(spec.output_dir or "").is_absolute()


def test_a_commands_secrets_are_passed_never_written(write_matrix, tmp_path,
                                                     monkeypatch) -> None:
    from orchestrator.backends.base import RunOptions
    from orchestrator.backends.slurm import SlurmBackend
    from orchestrator.config.redact import secret_env
    from orchestrator.plan.placement import Allocation

    text = matrix_text().replace(
        'env = { LAB_BENCH_MARK = "from the command" }',
        'env = { LAB_API_TOKEN = "tok-literal-0123456789", LAB_DATA_KEY = "$env:LAB_SECRET" }')
    matrix = load_matrix(write_matrix(text, cpu_profile=False))
    monkeypatch.setenv("LAB_SECRET", "from-the-environment-42")
    lab = matrix.cells[1]
    backend = SlurmBackend(matrix, RunPaths.create(tmp_path / "r", "foreign"),
                           RunOptions(timeout_s=60))
    spec = backend.spec(lab, Allocation.local(lab.id))
    shown = spec.to_json()["env"]
    assert shown["LAB_API_TOKEN"] == "***" and shown["LAB_DATA_KEY"] == "$env:LAB_SECRET"
    assert secret_env(spec.env) == {"LAB_API_TOKEN": "tok-literal-0123456789",
                                    "LAB_DATA_KEY": "from-the-environment-42"}
    assert spec.script is not None and "0123456789" not in spec.script
    assert "from-the-environment" not in spec.script
    assert "LAB_API_TOKEN LAB_DATA_KEY" in spec.script  # named, passed by sbatch


# --- checks ------------------------------------------------------------------------------------


def test_foreign_cells_skip_the_workloads_rules_and_keep_the_others(write_matrix) -> None:
    text = matrix_text().replace("[axes]", '[axes]\narch = ["resnet18", "my_lab_net"]')
    text = text.replace('program = ["workload", "lab"]', 'program = ["lab"]').replace(
        'baseline = "program=lab"', "")
    found = check_matrix(load_matrix(write_matrix(text, cpu_profile=False)))
    assert found.errors == []  # the lab's own model: the template's business
    text_ours = text.replace('program = ["lab"]', 'program = ["workload"]')
    found = check_matrix(load_matrix(write_matrix(text_ours, name="ours.toml",
                                                  cpu_profile=False)))
    assert [p.field for p in found.errors] == ["axes.arch[1]"]
    torch_prof = text.replace("telemetry_interval = 0", 'telemetry_interval = 0\n'
                              'profiler = "torch"')
    found = check_matrix(load_matrix(write_matrix(torch_prof, name="tp.toml", cpu_profile=False)))
    assert [p.field for p in found.errors] == ["workload.profiler"]
    assert "inside our workload" in found.errors[0].message


def test_a_parser_for_another_program_is_refused_for_our_cells(write_matrix) -> None:
    text = matrix_text().replace('baseline = "program=lab"',
                                 'baseline = "program=lab"\n[figures]\nparser = "dllogger"')
    found = check_matrix(load_matrix(write_matrix(text, cpu_profile=False)))
    assert [p.field for p in found.errors] == ["figures.parser"]


def test_a_parameter_the_command_never_uses_is_a_warning(write_matrix) -> None:
    text = matrix_text().replace("[axes]", "[axes]\nseed = [1, 2]")
    found = check_matrix(load_matrix(write_matrix(text, cpu_profile=False)))
    assert [p.field for p in found.warnings] == ["commands.lab.command"]
    assert "seed varies" in found.warnings[0].message
    assert found.errors == []


# --- the shipped side-by-side matrices ------------------------------------------------------------


def test_the_shipped_h100_matrix_runs_dle_as_seed_003_did(monkeypatch) -> None:
    matrix = load_matrix(ROOT / "matrices" / "dle_vs_workload.toml")
    found = check_matrix(matrix, machine=facts("H100"))
    assert found.errors == [] and found.warnings == []
    assert matrix.settings.baseline == "program=dle"
    cell = next(c for c in matrix.cells if c.id == "h100-dle-g1-bs256-amp-r1")
    monkeypatch.setenv("DLE_CONVNETS_DIR", "/lab/ConvNets")
    command = cell_command(cell, matrix.profile(cell), matrix.program(cell), python="python",
                           output_dir="/res/cell", gpu_ids=(0,))
    assert command.workdir == "/lab/ConvNets"
    assert command.argv == [
        "python", "./main.py", "--arch", "resnet50", "-b", "256", "--amp",
        "--static-loss-scale", "256", "--image-size", "224", "--memory-format", "nhwc",
        "--data-backend", "synthetic", "--epochs", "1", "--prof", "250", "--print-freq", "1",
        "--training-only", "--no-checkpoints", "--workspace", "/res/cell", "--raport-file",
        "raport.json", "--seed", "0", "./"]
    assert command.env["CUDA_VISIBLE_DEVICES"] == "0"
    # every DLE cell has its ours/theirs partner
    ids = {c.id for c in matrix.cells}
    for c in matrix.cells:
        if matrix.program(c).name == "dle":
            assert c.id.replace("-dle-", "-workload-") in ids


def test_the_shipped_v100_matrix_builds_dle_into_its_image() -> None:
    from orchestrator.runtimes.docker import container_spec

    matrix = load_matrix(ROOT / "matrices" / "dle_vs_workload_v100.toml")
    assert check_matrix(matrix, machine=facts("V100")).errors == []
    cell = next(c for c in matrix.cells if c.id == "v100-dle-g8-bs256-fp32-r1")
    spec = container_spec(cell, matrix.profile(cell), matrix.program(cell), image="img",
                          output_dir="/host/cell", labels={}, gpu_ids=tuple(range(8)))
    assert spec.workdir == "/workspace/dle-convnets"
    assert list(spec.argv[:6]) == ["python3", "-m", "torch.distributed.run", "--standalone",
                                   "--nproc_per_node=8", "--no_python"]
    assert spec.argv[6:8] == ("python3", "./main.py")
    assert "--amp" not in spec.argv and spec.argv[spec.argv.index("--workspace") + 1] == (
        "/orchestrate/out")


# --- real sweeps: the lab's program and our workload, side by side ------------------------------


def recomputed_ips(cell_dir: Path, warmup: int) -> float:
    """The throughput the program really achieved after the warmup, by workload/metrics.py."""
    truth = json.loads((cell_dir / "truth.json").read_text())
    data, compute = truth["data"][warmup:], truth["compute"][warmup:]
    return wm.summarize("train", data, compute, truth["global_batch"])["train.total_ips"]


def ranks(cell_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(cell_dir.glob("rank*.json"))]


def find(outcome: Any, program: str, gpus: int = 1, data: str = "synthetic") -> CellResult:
    """The result of the one cell of ``program`` on hardware cpu with ``gpus`` and ``data``."""
    (found,) = [r for r in outcome.results
                if (r.params["hardware"], r.params["program"], r.params["gpus"],
                    r.params["data"]) == ("cpu", program, gpus, data)]
    return found


def check_side_by_side(outcome: Any, program_dir: str, ours_program: str = "workload") -> None:
    """Both programs ok, the lab's figures recomputed from its raport, the ratio ours/theirs in
    the table and summary.csv (``ours_program``: ``standin`` where the STAND-IN workload runs
    as ours)."""
    ours, theirs = find(outcome, ours_program), find(outcome, "lab")
    assert ours.status is Status.OK and theirs.status is Status.OK, [
        (r.cell_id, r.reason, r.log_tail[-5:]) for r in outcome.results]
    cell_dir = outcome.paths.cell_dir(theirs.cell_id)
    assert (cell_dir / "raport.json").is_file()
    ips = theirs.metrics["train.total_ips"]
    assert ips == pytest.approx(recomputed_ips(cell_dir, theirs.params["warmup"]), rel=1e-6)
    assert theirs.metrics["iterations"] == theirs.params["iterations"]
    assert theirs.metrics["global_batch_size"] == 2
    assert "dle.train.total_ips" in theirs.metrics  # the program's own figure, labelled
    program = theirs.provenance["program"]
    assert program["name"] == "lab" and program["parser"] == "dllogger"
    assert program["workdir"] == program_dir
    assert theirs.provenance["figures"]["parser"] == "dllogger"
    if ours_program == "workload":
        assert ours.provenance["program"] == {"name": "workload", "parser": "workload"}
    else:  # a command template whose lines the workload's parser reads
        assert {k: ours.provenance["program"][k] for k in ("name", "parser")} == {
            "name": ours_program, "parser": "workload"}
        assert ours.env["standin"], "the stand-in says what it is in every result"
    assert (outcome.paths.cell_dir(ours.cell_id) / "metrics.jsonl").is_file()
    (rank0,) = [r for r in ranks(cell_dir) if r["rank"] == 0]
    assert rank0["cwd"] == program_dir and rank0["world_size"] == 1
    assert rank0["env"] == {"LAB_BENCH_MARK": "from the command"}
    with (outcome.paths.root / "summary.csv").open() as fh:
        rows = {r["group"]: r for r in csv.DictReader(fh)}
    ours_row, theirs_row = rows[ours.group], rows[theirs.group]
    assert float(theirs_row["images_per_s"]) == pytest.approx(ips)
    assert float(ours_row["ratio_vs_baseline"]) == pytest.approx(
        ours.metrics["train.total_ips"] / ips)
    table = (outcome.paths.root / "summary.txt").read_text()
    assert "vs program=lab" in table and "lab" in table


@pytest.mark.timeout(600)
def test_process_backend_runs_the_labs_program_beside_ours(write_matrix, tmp_path,
                                                           workload_python) -> None:
    dllogger_available()
    hostile = "/data/it's \"q\"; $(touch PWNED) `id` a b"
    text = matrix_text(extra=f"""
[commands.lab-broken]
command = '''{{python}} ./lab_bench.py --prof {{total_iterations}} --fail-after 2
    --workspace {{output_dir}} --raport-file raport.json ./'''
workdir = "{TESTS}"
figures = {{ parser = "dllogger", raport = "raport.json" }}

[commands.lab-silent]
command = '''{{python}} ./lab_bench.py --prof {{total_iterations}}
    --workspace {{output_dir}} --raport-file elsewhere.json ./'''
workdir = "{TESTS}"
figures = {{ parser = "dllogger", raport = "raport.json" }}

[[include]]
program = "lab"
gpus = 2

[[include]]
program = "lab-self"
gpus = 2

[[include]]
program = "lab"
data = {json.dumps(hostile)}

[[include]]
program = "lab-broken"

[[include]]
program = "lab-silent"

[[include]]
hardware = "cpu-strict"
program = "workload"

[hardware.cpu-strict]
device = "cpu"
figures = {{ bounds = {{ "train.total_ips" = {{ lower = 1e12 }} }} }}
""")
    matrix = load_matrix(write_matrix(text, cpu_profile=False))
    assert check_matrix(matrix).errors == []
    outcome = run_sweep(matrix, results_root=tmp_path / "results")
    check_side_by_side(outcome, str(TESTS))
    paths = outcome.paths

    torchrun = find(outcome, "lab", gpus=2)
    assert torchrun.status is Status.OK, torchrun.reason
    assert torchrun.metrics["global_batch_size"] == 4  # 2 ranks x batch 2
    got = ranks(paths.cell_dir(torchrun.cell_id))
    assert [(r["rank"], r["world_size"], r["local_rank"]) for r in got] == [
        (0, 2, "0"), (1, 2, "1")]
    assert all(r["master_addr"] for r in got)  # torchrun's rendezvous environment

    spawned = find(outcome, "lab-self", gpus=2)
    assert spawned.status is Status.OK, spawned.reason
    assert spawned.provenance["program"]["launcher"] == "self"
    assert "torch.distributed.run" not in json.loads(
        paths.cell_command(spawned.cell_id).read_text())["argv"]
    assert [(r["rank"], r["world_size"]) for r in ranks(paths.cell_dir(spawned.cell_id))] == [
        (0, 2), (1, 2)]
    assert spawned.metrics["global_batch_size"] == 4

    odd = find(outcome, "lab", data=hostile)
    assert odd.status is Status.OK, odd.reason
    (rank0,) = ranks(paths.cell_dir(odd.cell_id))
    assert rank0["argv"][-1] == hostile  # one argv item, as it was written
    assert not (TESTS / "PWNED").exists() and not Path("PWNED").exists()

    broken = find(outcome, "lab-broken")
    assert broken.status is Status.FAILED and broken.reason.startswith("exit code 3")
    silent = find(outcome, "lab-silent")
    assert silent.status is Status.FAILED
    assert "raport.json" in silent.reason and "not found in the cell folder" in silent.reason
    # our workload is read by the same run loop: its profile's figures judge it too
    (strict,) = [r for r in outcome.results if r.params["hardware"] == "cpu-strict"]
    assert strict.status is Status.FAILED and strict.metrics["train.total_ips"] > 0
    assert "train.total_ips" in strict.reason and "below its declared lower bound" in strict.reason


# --- containers: the lab's checkout copied into the image ----------------------------------------


def lab_checkouts(tmp_path: Path) -> tuple[Path, Path]:
    """Stand-ins for a lab's checkouts: a "ConvNets" folder whose main.py is the lab program,
    and a DLLogger checkout (the installed package's files; ``.ci/run`` installs it from the
    peers folder)."""
    import importlib.util

    dllogger_available()
    convnets = tmp_path / "ConvNets"
    convnets.mkdir()
    shutil.copy(TESTS / "lab_bench.py", convnets / "main.py")
    spec = importlib.util.find_spec("dllogger")
    assert spec is not None and spec.submodule_search_locations
    checkout = tmp_path / "dllogger-checkout"
    shutil.copytree(spec.submodule_search_locations[0], checkout / "dllogger",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return convnets, checkout


def container_matrix(tmp_path: Path, base: str, backend: str, standin: Standin) -> str:
    """The lab's program in its image, the STAND-IN workload (mounted) as ours: the real
    workload in a container is tests/test_backend_docker.py's end-to-end test."""
    convnets, dllogger = lab_checkouts(tmp_path)
    profile = f"""image = "dle-convnets"
[hardware.cpu.image_vars]
base_image = "{base}"
install_nvml = false
dle_dir = "{convnets}"
dllogger_dir = "{dllogger}"
[hardware.cpu.container]
shm_size = "256m"
ulimits = {{ stack = 67108864 }}
mounts = [{container_mount()}]
"""
    return matrix_text(backend=backend, profile=profile, python="python3", script="main.py",
                       workdir="/workspace/dle-convnets", standin=standin, container=True)


@pytest.mark.docker
@pytest.mark.timeout(900)
def test_docker_backend_runs_the_labs_program_beside_ours(tmp_path, docker_client,
                                                          base_image, standin) -> None:
    from docker_support import run_containers

    text = container_matrix(tmp_path, base_image, "docker", standin)
    text += '\n[[include]]\nprogram = "lab"\ngpus = 2\n'
    path = tmp_path / "m.toml"
    path.write_text(text)
    matrix = load_matrix(path)
    assert check_matrix(matrix, "docker").errors == []
    outcome = run_sweep(matrix, results_root=tmp_path / "results")
    check_side_by_side(outcome, "/workspace/dle-convnets", "standin")
    torchrun = find(outcome, "lab", gpus=2)
    assert torchrun.status is Status.OK, (torchrun.reason, torchrun.log_tail)
    assert [r["world_size"] for r in ranks(outcome.paths.cell_dir(torchrun.cell_id))] == [2, 2]
    assert torchrun.provenance["backend"] == "docker"
    assert run_containers(docker_client, outcome.paths.run_id) == []


@pytest.mark.docker
@pytest.mark.ssh
@pytest.mark.timeout(900)
def test_ssh_backend_runs_the_labs_program_beside_ours(tmp_path, sshd_server, docker_client,
                                                       base_image, standin) -> None:
    from docker_support import run_containers
    from ssh_support import write_inventory

    from orchestrator.backends.remote_executions import REMOTE_ROOT

    hosts = write_inventory(tmp_path, [sshd_server])
    path = tmp_path / "m.toml"
    path.write_text(container_matrix(tmp_path, base_image, "ssh", standin))
    matrix = load_matrix(path)
    outcome = run_sweep(matrix, results_root=tmp_path / "results", hosts_file=hosts)
    check_side_by_side(outcome, "/workspace/dle-convnets", "standin")
    assert {r.provenance["host"] for r in outcome.results} == {sshd_server.name}
    assert run_containers(docker_client, outcome.paths.run_id) == []
    assert not Path(REMOTE_ROOT, outcome.paths.run_id).exists()


@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_slurm_backend_runs_the_labs_program_beside_ours(
        write_matrix, tmp_path, slurm_cluster: SlurmCluster,  # noqa: F811 - fixture
        standin: Standin) -> None:
    """The lab's program as real jobs, the STAND-IN workload as ours."""
    from slurm_support import squeue_ids, wait_until_gone

    dllogger_available()
    text = (matrix_text(backend="slurm", standin=standin)
            + '\n[[include]]\nprogram = "lab-self"\ngpus = 2\n')
    matrix = load_matrix(write_matrix(text, cpu_profile=False))
    before = set(squeue_ids())
    outcome = run_sweep(matrix, results_root=tmp_path / "results")
    check_side_by_side(outcome, str(TESTS), "standin")
    for result in outcome.results:
        assert result.status is Status.OK, (result.cell_id, result.reason, result.log_tail)
        assert result.provenance["slurm_state"] == "COMPLETED"
        assert result.provenance["host"] == slurm_cluster.node
    spawned = find(outcome, "lab-self", gpus=2)
    assert [(r["rank"], r["world_size"]) for r in ranks(outcome.paths.cell_dir(
        spawned.cell_id))] == [(0, 2), (1, 2)]
    lab = find(outcome, "lab")
    script = (outcome.paths.cell_dir(lab.cell_id) / "job.sbatch").read_text()
    assert f"#SBATCH --chdir={TESTS}" in script
    assert wait_until_gone([j for j in squeue_ids() if j not in before], timeout=30) == []
