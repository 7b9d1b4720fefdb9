"""Plan anywhere (issue 31): every shipped matrix shows its plan and every cell's launch on a
machine that has nothing, and what the target lacks follows as requirements.

* the requirement model (orchestrator/backends/target.py): the ``--target`` declaration, the
  cells each requirement is for, the states (not met, falls short, to check there), the text,
  the exit status of a refusal (3 for the machine, 2 for the file);
* golden files (tests/golden/plan-anywhere-*.txt) of ``matrix --dry-run`` for a few shipped
  matrices on a bare machine, in process: no GPU (nvidia-smi's facts are a GPU-less
  machine's: the stand-in of tests/gpu_support.py), an empty PATH (no ``apptainer``, no Slurm
  client), ``DOCKER_HOST`` at a socket that does not exist; this repository's paths, the
  interpreter and the image tags (content hashes of the build context) are replaced by names;
* the same on a declared target (``--target``), and for an inventory without contacting it;
* every shipped matrix, for real, in a subprocess on a simulated bare machine
  (benchmarks/plan_anywhere.py: PATH without docker, apptainer, Slurm's clients, nvidia-smi;
  ``DOCKER_HOST`` dead): ``plan --json`` lists every cell with its launch, ``--dry-run`` prints
  every cell's command, and the exit status is 3 exactly where something is not met.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from golden_support import check_golden
from gpu_support import NO_GPU

from orchestrator.backends import backend_record
from orchestrator.backends.target import (
    HERE,
    lines,
    listed,
    parse_target,
    refusal,
    unmet,
    verdict,
    with_cells,
)
from orchestrator.catalog import gpus
from orchestrator.cli import main
from orchestrator.errors import (
    MISSING,
    SHORT,
    UNCHECKED,
    ConfigError,
    Problem,
    Requirement,
    RequirementsUnmet,
)
from orchestrator.plan.matrix import load_matrix

ROOT = Path(__file__).resolve().parents[1]

M = """
[matrix]
name = "m"
backend = "process"
[workload]
hardware = "g"
iterations = 1
[axes]
precision = ["fp32", "amp"]
[[include]]
hardware = "c"
program = "lab"
[hardware.g]
device = "cuda"
gpu = "V100"
[hardware.c]
device = "cpu"
[commands.lab]
command = "{python} ./bench.py"
"""


# --- the model ------------------------------------------------------------------------------


def test_a_declared_target_is_its_gpus_and_driver() -> None:
    target = parse_target("gpu=V100,gpus=8,driver=535.104.05")
    assert target.declared and target.facts is not None
    assert target.facts.accelerator == "nvidia" and target.facts.driver == "535.104.05"
    assert len(target.facts.gpus) == 8 and target.facts.gpus[0].model == "V100"
    assert parse_target("gpu=Gaudi2,gpus=8").facts.accelerator == "gaudi"  # type: ignore[union-attr]
    bare = parse_target("gpu=none")
    assert bare.facts is not None and bare.facts.accelerator is None and not bare.facts.gpus
    assert parse_target("gpu=H100").facts.gpu_ids == [0]  # type: ignore[union-attr]
    assert not HERE.declared and HERE.name == "this machine"


@pytest.mark.parametrize(("spec", "says"), [
    ("gpu=V1OO", "unknown GPU 'V1OO'"),
    ("gpu=V100,gpus=x", "is not a whole number"),
    ("gpu=V100,gpus=0,gpus=2", "gpus is given twice"),
    ("gpu=none,gpus=2", "give 1..256 with a gpu model"),
    ("gpu=V100,driver=latest", "is not a driver version"),
    ("model=V100", "unknown key 'model'"),
    ("V100", "is not KEY=VALUE"),
])
def test_a_bad_declaration_names_every_problem(spec: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_target(spec)
    assert "--target" in str(err.value) and says in str(err.value)


def test_each_requirement_gets_the_cells_its_field_names(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text(M)
    matrix = load_matrix(path)
    file = str(path)
    found = with_cells(matrix, [
        Requirement(file, "hardware.g.device", "gpu", kind="GPUs"),
        Requirement(file, "commands.lab.workdir", "env", kind="environment"),
        Requirement("", "", "no engine", kind="engine"),
        Requirement(file, "hardware.c.x", "given", kind="data", cells=("one",)),
    ])
    assert found[0].cells == tuple(c.id for c in matrix.cells if c.hardware == "g")
    (lab,) = [c.id for c in matrix.cells if matrix.program(c).name == "lab"]
    assert found[1].cells == (lab,) and len(found[0].cells) == 2  # the cells that run lab
    assert found[2].cells == tuple(c.id for c in matrix.cells)  # the backend's: every cell
    assert found[3].cells == ("one",)  # its own, kept


def test_the_list_is_in_the_order_of_kinds_and_a_declared_target_checks_only_its_facts(
        tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text(M)
    matrix = load_matrix(path)
    file = str(path)
    problems: list[Problem] = [
        Problem(file, "workload.arch", "a problem of the file: not listed"),
        Requirement(file, "hardware.g.container.mounts[0].source", "/data missing", kind="data"),
        Requirement(file, "hardware.g.device", "no GPU", kind="GPUs"),
    ]
    here = listed(matrix, problems, backend_record("process"), HERE)
    assert [r.kind for r in here] == ["GPUs", "data"] and all(r.state == MISSING for r in here)
    declared = listed(matrix, problems, backend_record("process"),
                      parse_target("gpu=V100,gpus=1"))
    states = {r.kind: r.state for r in declared}
    assert states == {"GPUs": MISSING, "python": UNCHECKED, "data": UNCHECKED}
    (data,) = [r for r in declared if r.kind == "data"]
    assert data.message.startswith("/data missing (whether the target has it")
    # a backend whose cells run elsewhere lists what its record says they need there
    slurm = listed(matrix, [], backend_record("slurm"), HERE)
    assert [(r.kind, r.state) for r in slurm] == [("data", UNCHECKED)]
    assert "nodes that share this machine's filesystem" in slurm[0].message


def test_the_text_groups_by_state_and_ends_with_the_verdict() -> None:
    found = [
        Requirement("m.toml", "hardware.g.device", "cell a needs an NVIDIA GPU", kind="GPUs",
                    cells=("a",)),
        Requirement("m.toml", "hardware.g.device", "8 GPUs, 1 here", kind="GPUs",
                    cells=("b", "c", "d"), state=SHORT),
        Requirement("", "slurm backend", "nodes sharing the filesystem", kind="data",
                    cells=("a", "b"), state=UNCHECKED),
    ]
    text = "\n".join(lines(found, HERE))
    assert text == (
        "requirements of the target (this machine):\n"
        "  not met:\n"
        "    - GPUs\n"
        "        m.toml: hardware.g.device: cell a needs an NVIDIA GPU\n"
        "  falls short for some cells (the sweep starts; those cells cannot run as planned):\n"
        "    - GPUs (3 cells: b, c, ...)\n"
        "        m.toml: hardware.g.device: 8 GPUs, 1 here\n"
        "  to check on the target (this machine cannot tell):\n"
        "    - data (2 cells: a, b)\n"
        "        slurm backend: nodes sharing the filesystem\n"
        "the sweep would not start here: 1 requirement not met (exit 3)")
    assert verdict(found[1:], HERE) == ("the sweep would start here (1 requirement to check "
                                        "on the target)")


def test_on_a_terminal_each_requirement_is_wrapped_with_its_field_whole() -> None:
    """A terminal gets each requirement wrapped to its width (they ran to 176-529 columns),
    the ``file: field:`` kept whole on its first line; a pipe keeps one line each (grep)."""
    message = ("40 cells (v100-g1-bs128-fp32-r1, v100-g1-bs128-amp-r1, ...) need an NVIDIA GPU "
               "(V100, compute capability 7.0; 1 to 8 per cell; device = \"cuda\"), and this "
               "machine has none, where the docker backend runs them: --backend slurm")
    found = [Requirement("matrices/v100_scaling.toml", "hardware.v100.device", message,
                         kind="GPUs", cells=("a",))]
    piped = lines(found, HERE)
    assert piped[3] == f"        matrices/v100_scaling.toml: hardware.v100.device: {message}"
    wrapped = lines(found, HERE, width=80)
    body = wrapped[3:-1]
    assert len(body) > 1 and all(len(line) <= 80 for line in body), body
    assert body[0].startswith("        matrices/v100_scaling.toml: hardware.v100.device: 40 ")
    assert all(line.startswith(" " * 10) for line in body[1:])
    assert " ".join(" ".join(line.split()) for line in body).endswith(
        " ".join(message.split()))
    assert lines([], HERE) == ["requirements of the target (this machine): all met",
                               "the sweep would start here"]
    assert unmet(found) == found[:1]


def test_a_refusal_of_requirements_only_exits_3_else_2() -> None:
    need = Requirement("m.toml", "hardware.g.device", "no GPU", kind="GPUs")
    assert isinstance(refusal([need]), RequirementsUnmet) and refusal([need]).exit_code == 3
    mixed = refusal([Problem("m.toml", "workload.arch", "unknown"), need])
    assert type(mixed) is ConfigError and mixed.exit_code == 2
    assert str(mixed).count("m.toml:") == 2  # both listed


# --- shipped matrices on a bare machine, in process ----------------------------------------------


@pytest.fixture
def bare_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process as on a machine with nothing, no process started: nvidia-smi's answer is a
    GPU-less machine's (the stand-in facts), PATH is an empty folder (no apptainer, no Slurm
    client), no Docker engine answers, no user config; the results folder is returned."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setattr(gpus, "local_facts", lambda: NO_GPU)
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("PYTHONPATH", "ORCHESTRATE_HOSTS", "ORCHESTRATE_CONFIG", "ORCHESTRATE_SIF_DIR",
                 "DLE_CONVNETS_DIR", "SLURM_CONF"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(ROOT)
    return tmp_path / "results"


def normalised(text: str, results: Path) -> str:
    """What depends on this checkout and this machine, named: the repository, the results
    folder, the interpreter, home, image tags and .sif names (content hashes of a build context
    that holds the workload's code), the Docker SDK's words for a socket that is not there."""
    text = text.replace(str(results), "<results>").replace(sys.executable, "<python>")
    text = text.replace(str(results.parent / "home"), "<home>").replace(str(ROOT), "<repo>")
    text = re.sub(r"(orchestrate/[\w.-]+):[0-9a-f]{12}\b", r"\1:<hash>", text)
    text = re.sub(r"-[0-9a-f]{12}\.sif\b", "-<hash>.sif", text)
    return re.sub(r"no Docker engine reachable \(.*?\); start", "no Docker engine reachable "
                  "(<why>); start", text)


GOLDEN_MATRICES = ["v100_scaling", "apptainer_slurm", "dle_vs_workload", "seeds/002_variability"]


@pytest.mark.parametrize("name", GOLDEN_MATRICES)
def test_a_shipped_matrix_is_planned_on_a_bare_machine(
        name: str, bare_machine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["matrix", f"matrices/{name}.toml", "--dry-run", "--results", str(bare_machine)])
    out = capsys.readouterr().out
    assert code == 3
    matrix = load_matrix(ROOT / "matrices" / f"{name}.toml")
    for cell in matrix.cells:  # every cell's launch, before the requirements
        assert f"\n  {cell.id}:\n" in out.partition("\nrequirements of the target")[0]
    check_golden(f"plan-anywhere-{name.replace('/', '-')}.txt", normalised(out, bare_machine))
    assert not bare_machine.exists()


def test_plan_json_is_the_cells_and_stderr_the_requirements(
        bare_machine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "matrices/v100_scaling.toml", "--json", "--results", str(bare_machine)])
    captured = capsys.readouterr()
    cells = json.loads(captured.out)
    assert code == 3 and len(cells) == 40 and all(c["launch"]["docker_run"] for c in cells)
    assert cells[-1]["launch"]["docker_run"]["device_requests"][0]["DeviceIDs"] == [
        "0", "1", "2", "3", "4", "5", "6", "7"]  # an idle machine's first eight
    assert "hardware.v100.device: 40 cells" in captured.err
    assert "no Docker engine reachable" in captured.err
    assert captured.err.rstrip().endswith("would not start here: 4 requirements not met (exit 3)")


def test_validate_and_the_sweep_refuse_what_plan_shows(
        bare_machine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = "matrices/seeds/002_variability.toml"
    assert main(["plan", path]) == 3
    shown = capsys.readouterr().out
    assert main(["validate", path]) == 3
    refused = capsys.readouterr().err
    assert main(["matrix", path, "--results", str(bare_machine)]) == 3
    assert capsys.readouterr().err == refused and not bare_machine.exists()
    not_met = shown.partition("  not met:\n")[2].partition("\n  to check")[0]
    fields = re.findall(r"002_variability.toml: ([\w.\-\[\]]+):", not_met)
    assert len(fields) == 4  # binary, checkout, a required file, a bind source
    assert sorted(fields) == sorted(re.findall(r"002_variability.toml: ([\w.\-\[\]]+):",
                                               refused))


def test_a_declared_target_is_checked_as_far_as_it_is_known(
        bare_machine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """v100_scaling on a declared 4-V100 machine whose driver is too old for NGC 23.10: the
    driver is not met, the 8-GPU cells fall short, the engine and data are to check there."""
    args = ["plan", "matrices/v100_scaling.toml", "--target"]
    assert main([*args, "gpu=V100,gpus=4,driver=470.57.02"]) == 3
    out = capsys.readouterr().out
    assert "requirements of the target (declared: --target gpu=V100,gpus=4" in out
    not_met = out.partition("  not met:\n")[2].partition("\n  falls short")[0]
    assert "the target's driver 470.57.02 is older than NGC PyTorch 23.10" in not_met
    assert "10 cells (v100-g8-bs128-fp32-r1, v100-g8-bs128-amp-r1, ...) need 8 GPUs each, " \
           "and the target has 4" in out
    assert "docker backend: the target needs a Docker engine" in out
    assert "/data/imagenet does not exist on this machine" in out.partition("to check")[2]
    assert main([*args, "gpu=V100,gpus=8,driver=535.104.05"]) == 0
    assert "the sweep would start on the target, as far as this machine can tell" in \
        capsys.readouterr().out
    assert main(["validate", "matrices/v100_scaling.toml", "--target", "gpu=none"]) == 3
    assert "and the target has none" in capsys.readouterr().err
    assert main(["matrix", "matrices/v100_scaling.toml", "--target", "gpu=V100"]) == 2
    assert "--target: a sweep runs on this machine" in capsys.readouterr().err


def test_an_inventory_is_planned_without_contacting_a_host(
        bare_machine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The inventory's listed GPUs say which cells no host can take; its hosts are never asked
    (their engine and driver are to check there: `orchestrate hosts check`)."""
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[[hosts]]\nname = "v1"\naddress = "192.0.2.1"\nuser = "lab"\n'
                     'tags = ["v100"]\ngpus = [0, 1, 2, 3]\n')
    code = main(["matrix", "matrices/v100_scaling.toml", "--dry-run", "--backend", "ssh",
                 "--hosts", str(hosts), "--results", str(bare_machine)])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert out.count("on host v1 (lab@192.0.2.1:22, the first host that may run it)") == 40
    assert f"requirements of the target (the hosts of {hosts}, from this machine)" in out
    assert f"10 cells (v100-g8-bs128-fp32-r1, v100-g8-bs128-amp-r1, ...) need more GPUs than " \
           f"any host of {hosts} that may run them lists (at most 4)" in out
    assert "orchestrate hosts check HOSTS.toml asks each host" in out
    assert main(["plan", "matrices/v100_scaling.toml", "--backend", "ssh"]) == 3
    assert "matrix.hosts: the ssh backend needs a hosts inventory" in capsys.readouterr().out


AUTO = """
[matrix]
name = "auto"
backend = "ssh"
[workload]
hardware = "h100"
[axes]
precision = ["amp", "bf16"]
[hardware.h100]
device = "cuda"
gpu = "H100"
image = "ngc-pytorch"
release = "auto"
"""


def test_an_inventorys_declared_drivers_pick_the_image_and_say_who_runs_none(
        bare_machine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Hosts that declare their driver: an auto release is planned on the first host whose
    driver runs one (a host whose driver runs none is passed over, as the sweep skips it); when
    none does, the cells fall short; a pinned release older hosts cannot run is said too."""
    matrix = tmp_path / "auto.toml"
    matrix.write_text(AUTO)
    hosts = tmp_path / "hosts.toml"
    entry = '[[hosts]]\nname = "{}"\naddress = "192.0.2.{}"\nuser = "lab"\ntags = ["h100"]\n' \
            'gpu = "{}"\ndriver = "{}"\n'
    hosts.write_text(entry.format("old", 1, "V100", "470.57.02")
                     + entry.format("new", 2, "H100", "550.54.15"))
    args = ["matrix", str(matrix), "--dry-run", "--hosts", str(hosts), "--results",
            str(bare_machine)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.count("on host new (lab@192.0.2.2:22") == 2 and "on host old" not in out
    assert out.count("container of image orchestrate/ngc-pytorch:") == 2  # 24.05's, planned
    hosts.write_text(entry.format("old", 1, "V100", "470.57.02"))
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "on no host: the inventory names none that may run it" in out
    assert "auto.toml: hardware.h100.release: no host of" in out
    assert "old: driver 470.57.02 runs NGC PyTorch 21.03 at the newest" in out
    assert "its 2 cells would be recorded unplaceable" in out
    pinned = AUTO.replace('release = "auto"', 'image_vars = { base_tag = "24.05-py3" }')
    matrix.write_text(pinned)
    assert main(args) == 0
    assert "host old of " in capsys.readouterr().out  # its declared driver is older


# --- every shipped matrix, for real ----------------------------------------------------------


@pytest.mark.subprocess  # a process whose PATH and environment are a bare machine's
def test_every_shipped_matrix_plans_on_a_machine_with_nothing() -> None:
    """benchmarks/plan_anywhere.py runs plan --json and --dry-run of every shipped matrix
    through the CLI's entry point in a process with no docker, apptainer, Slurm client or
    nvidia-smi on PATH and DOCKER_HOST at a dead socket (about 10 s here)."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "plan_anywhere.py"),
                           "--json"], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert not any(report["machine"][tool] for tool in ("docker", "sbatch", "apptainer",
                                                        "nvidia-smi"))
    rows = {r["matrix"]: r for r in report["rows"]}
    shipped = sorted(p.relative_to(ROOT).as_posix() for p in
                     [*ROOT.glob("matrices/*.toml"), *ROOT.glob("matrices/seeds/*.toml")])
    assert sorted(rows) == shipped
    for row in rows.values():
        every = row["cells"] + row["controls"]
        assert row["plan_listed"] == every and row["dry_run_commands"] == every, row
        assert row["plan_exit"] == row["dry_run_exit"] == (3 if row["not_met"] else 0), row
        assert not row["errors"], row
    assert rows["matrices/cpu_smoke.toml"]["plan_exit"] == 0  # the process backend on the CPU
    assert {"GPUs", "engine", "data"} <= set(rows["matrices/v100_scaling.toml"]["not_met"])
    assert {"scheduler", "binary"} <= set(rows["matrices/apptainer_slurm.toml"]["not_met"])
    assert rows["matrices/docker_smoke.toml"]["not_met"] == ["engine"]
    assert "checkout" in rows["matrices/seeds/003_dlperf.toml"]["not_met"]
