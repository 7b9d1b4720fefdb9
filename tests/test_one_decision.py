"""One decision, three commands: what the sweep refuses before a cell starts, ``validate`` and
``matrix --dry-run`` (and ``plan``) refuse too, from the same code.

The list of refusals is built from the code, not by hand (tests/refusal_graph.py): every
``raise`` of a ConfigError or BackendUnavailable on the sweep's path from
:func:`orchestrator.sweep.run_sweep` to the point where cells start (``run_all``), is either
reached from the one decision (:func:`orchestrator.backends.checks.preflight`, which
``validate``, ``plan``, ``--dry-run`` and the sweep call; and, for the run's own options
``--results`` / ``--resume``, :func:`orchestrator.sweep.check_run`, which ``--dry-run`` and the
sweep call), or is listed in :data:`FOUND_BY_DOING` with the reason no command can say it
before. A new refusal on the sweep's path that is neither fails here.

The scenarios then run the issue's cases (and more) through all three commands for real (in
process, the real CLI) and compare what each refuses: a problem of the file is refused by all
three (exit 2); what the machine lacks (issue 31) is refused by validate and the sweep (exit 3)
and named by the dry run after the plan, among the requirements it lists as not met.
``docs/refusals.md`` is generated from this module (``UPDATE_GOLDEN=1`` rewrites it; ``python
tests/test_one_decision.py`` prints it).
"""

from __future__ import annotations

import ast
import functools
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from refusal_graph import Graph, Site

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "refusals.md"

SWEEP = "orchestrator.sweep:run_sweep"
#: Where cells start: what is raised from here on is a cell's result, not a refusal.
CELLS_START = ("orchestrator.sweep:run_all", "orchestrator.sweep:finish_run")
DECISION = "orchestrator.backends.checks:preflight"
RUN_OPTIONS = "orchestrator.sweep:check_run"

#: Refusals the sweep can raise that no command can make before it: key -> why.
FOUND_BY_DOING: dict[str, str] = {
    "orchestrator.config.inventory:Inventory.get: no host named {name} (hosts: "
    "{', '.join(self.names)})":
        "cannot happen on the sweep's path: it asks only for names taken from the inventory",
    "orchestrator.images.sif:ensure_sif: {path} does not exist on {machine.name}":
        "a ready .sif missing on a lab host (ssh): found on the host when the sweep reaches it "
        "(validate and a dry run contact no host); on this machine the decision refuses it "
        "first (runtimes/apptainer.host_problems)",
    "orchestrator.runtimes.apptainer:prepare: ConfigError(problems)":
        "the runtime or a bind source missing on a lab host (ssh): found on the host when the "
        "sweep reaches it; on this machine (process, slurm) the decision refuses it first "
        "(the same host_problems)",
    "orchestrator.runtimes.apptainer:prepare: ConfigError([Problem(str(matrix.path), "
    "f'hardware.{key.hardware}.apptainer.sif', p.message) for p in exc.problems])":
        "the same, for the .sif of a lab host",
    "orchestrator.results.folders.run_folder:RunPaths.create: run {run_id} already exists under "
    "{root.parent}":
        "writing the run folder: a run id taken between the check and the write",
    "orchestrator.results.folders.run_folder:RunPaths.create: cannot create the run folder {root}: "
    "{exc.strerror}":
        "writing the run folder fails (permissions, a full disk): found by writing it",
    "orchestrator.sweep:open_run: cannot write the run folder under {root}: "
    "{_os_error(exc)}; ...":
        "writing the run folder's files fails (a full disk): found by writing them",
    "orchestrator.sweep:_reopen_run: cannot resume run {paths.run_id} in {paths.root}: ...":
        "writing into the resumed run (its lock, its run.json) fails: found by writing",
    "orchestrator.sweep:lock_run: _in_use(paths)":
        "another sweep took the run's lock after the check (a race): the check, made first, "
        "refuses the usual case",
}


@functools.cache
def graph() -> Graph:
    """The package's call graph, built once, when a test first asks (it parses every module:
    seconds, which collecting the suite should not pay)."""
    return Graph()


def sweep_sites() -> list[Site]:
    """Every refusal on the sweep's path before cells start."""
    reached = graph().reachable([SWEEP], stop=CELLS_START, raising=True)
    return sorted({s for f in reached for s in graph().refusals(f)},
                  key=lambda s: (s.function, s.line))


def decided_by(root: str) -> set[str]:
    return graph().reachable([root])


# --- the list, from the code -----------------------------------------------------------------


def test_every_refusal_before_a_cell_is_the_one_decisions_or_says_why_not() -> None:
    decision, options = decided_by(DECISION), decided_by(RUN_OPTIONS)
    sites = sweep_sites()
    assert len(sites) > 40  # the graph sees the sweep's path (a broken resolver sees little)
    undecided = [s.key for s in sites
                 if s.function not in decision | options and s.key not in FOUND_BY_DOING]
    assert not undecided, (
        "refusals the sweep makes that validate and --dry-run do not: make them part of "
        "backends/checks.preflight (or sweep.check_run), or say in FOUND_BY_DOING why no "
        "command can make them first:\n  " + "\n  ".join(undecided))
    keys = {s.key for s in sites}
    stale = sorted(set(FOUND_BY_DOING) - keys)
    assert not stale, f"FOUND_BY_DOING lists refusals the sweep no longer makes: {stale}"
    shared = sorted(k for k in FOUND_BY_DOING
                    if any(s.key == k and s.function in decision | options for s in sites))
    assert not shared, f"FOUND_BY_DOING lists refusals the decision makes: {shared}"


def test_the_three_commands_and_the_sweep_call_the_decision() -> None:
    """Statically: each command's code reaches preflight; the dry run and the sweep check_run;
    the sweep takes both before it opens a run folder (both are called from run_sweep itself,
    ahead of open_run)."""
    cli = "orchestrator.cli.sweep_commands"
    for command in ("cmd_validate", "cmd_plan", "cmd_matrix"):
        assert DECISION in graph().reachable([f"{cli}:{command}"]), command
    assert RUN_OPTIONS in graph().reachable([f"{cli}:cmd_matrix"])
    body = graph().functions[SWEEP].node

    calls = [n.func.id for n in sorted(  # in the order they are written
        (n for n in ast.walk(body) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)),
        key=lambda n: (n.lineno, n.col_offset))]
    assert calls.index("preflight") < calls.index("open_run")
    assert calls.index("check_run") < calls.index("open_run")


def test_the_commands_call_it_when_they_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """And at run time: preflight (wrapped to count) is called by validate, plan, the dry run
    and the sweep; check_run by the dry run and the sweep."""
    from orchestrator import sweep
    from orchestrator.backends import checks
    from orchestrator.cli import main

    called: list[str] = []
    real_preflight, real_check = checks.preflight, sweep.check_run

    def preflight(*args, **kwargs):  # type: ignore[no-untyped-def]
        called.append("preflight")
        return real_preflight(*args, **kwargs)

    def check_run(*args, **kwargs):  # type: ignore[no-untyped-def]
        called.append("check_run")
        return real_check(*args, **kwargs)

    monkeypatch.setattr(checks, "preflight", preflight)
    monkeypatch.setattr(sweep, "preflight", preflight)
    monkeypatch.setattr(sweep, "check_run", check_run)
    path = tmp_path / "m.toml"
    path.write_text('[workload]\nhardware = "cpu"\n[hardware.cpu]\ndevice = "cpu"\n')
    results = ["--results", str(tmp_path / "results")]
    for argv, code, expected in [
        (["validate"], 0, ["preflight"]),
        (["plan"], 0, ["preflight"]),
        (["matrix", "--dry-run", *results], 0, ["preflight", "check_run"]),
        # the sweep: the CLI's decision, handed to run_sweep (which does not decide again),
        # then the run's options (a run to resume that is not there: refused before a run
        # folder)
        (["matrix", *results, "--resume", "20200101-000000-aaaa"], 2,
         ["preflight", "check_run"]),
    ]:
        called.clear()
        assert main([*argv, str(path)]) == code, argv
        assert called == expected, argv
    assert not (tmp_path / "results").exists()
    capsys.readouterr()


# --- the scenarios: the same refusal from all three ------------------------------------------


@dataclass
class Scenario:
    """A matrix (a shipped one, or text), the backend and environment, and the fields all
    three commands must name."""

    name: str
    fields: tuple[str, ...]
    matrix: str = ""  # a shipped matrix's name
    text: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    gpu: str | None = None
    #: 3: what the machine lacks (validate and the sweep refuse it; the dry run shows the plan
    #: and names the same requirements after it); 2: a problem of the file or the options
    code: int = 3
    #: a run option (--resume): validate takes none, so only --dry-run and the sweep refuse
    run_option: bool = False


CPU = '[workload]\nhardware = "cpu"\n[hardware.cpu]\ndevice = "cpu"\n'
#: examples/fake_bench.toml's CPU cells beside cells of a V100 profile (appended to the file).
MIXED = '\n[hardware.v100]\ndevice = "cuda"\n'
SCENARIOS = [
    Scenario("cuda-cells-without-a-gpu (h100_speed)", ("hardware.h100.device",),
             matrix="h100_speed"),
    Scenario("env-reference-unset (dle_vs_workload)",
             ("hardware.h100.device", "commands.dle.workdir"), matrix="dle_vs_workload",
             unset=("DLE_CONVNETS_DIR",)),
    Scenario("env-reference-unset-on-a-gpu-machine", ("commands.dle.workdir",),
             matrix="dle_vs_workload", unset=("DLE_CONVNETS_DIR",), gpu="H100"),
    Scenario("ssh-without-an-inventory (v100_scaling)", ("matrix.hosts",), matrix="v100_scaling",
             args=("--backend", "ssh"), unset=("ORCHESTRATE_HOSTS",)),
    Scenario("apptainer-binary-missing (apptainer_slurm)",
             ("hardware.gpu-node.apptainer.binary",), matrix="apptainer_slurm"),
    Scenario("v100-under-a-cuda-13-venv (slurm)", ("hardware.v100.gpu",), matrix="v100_scaling",
             args=("--backend", "slurm")),
    Scenario("build-file-missing (bitfusion_vs_native)",
             ("hardware.v100-bitfusion.image_vars.client_deb",
              "hardware.v100-bitfusion.image_vars.ca_cert"),
             matrix="bitfusion_vs_native", gpu="V100"),
    Scenario("release-too-new-for-the-gpu",
             ("hardware.v100.image_vars.base_tag",), gpu="V100",
             text='[matrix]\nbackend = "docker"\n[workload]\nhardware = "v100"\n'
                  '[hardware.v100]\ndevice = "cuda"\nimage = "ngc-pytorch"\n'
                  'image_vars = { base_tag = "25.01-py3" }\n'),
    Scenario("unknown-backend", ("--backend",), text=CPU, args=("--backend", "kubernetes"),
             code=2),
    Scenario("profile-host-not-in-the-inventory", ("hardware.cpu.hosts",),
             text='[matrix]\nbackend = "ssh"\nhosts = "h.toml"\n[workload]\nhardware = "cpu"\n'
                  '[hardware.cpu]\ndevice = "cpu"\nimage = "ngc-pytorch"\nhosts = ["gpu9"]\n',
             code=2),
    Scenario("resume-of-no-run", ("--resume",), text=CPU, args=("--resume", "20200101-000000-"
                                                                 "aaaa"), run_option=True, code=2),
    Scenario("gpu-cells-selected-by-only-without-a-gpu", ("hardware.v100.device",),
             text=(ROOT / "examples" / "fake_bench.toml").read_text() + MIXED,
             args=("--set", 'axes.hardware=["cpu", "v100"]', "--only", "hardware=v100",
                   "--only", "batch_size=8")),
    Scenario("local-base-image-not-here (docker_smoke)", ("hardware.cpu-container.image_vars."
                                                          "base_image",),
             text=(ROOT / "matrices" / "docker_smoke.toml").read_text().replace(
                 "orchestrate-test/base:bookworm-torch2.14.1", "orchestrate-test/not-built:1")),
]

HOSTS = ('[[hosts]]\nname = "gpu1"\naddress = "127.0.0.1"\nport = 1\nuser = "lab"\n'
         'tags = ["cpu"]\n')


def _fields(text: str, file: str) -> set[str]:
    """Every ``FILE: FIELD`` an error names (``--backend: ...`` too)."""
    names = {m[1] for m in re.finditer(re.escape(file) + r": ([\w.\-\[\]]+):", text)}
    names |= {m[1] for m in re.finditer(r"(?m)(?:^|  - |error: )(--[a-z]+)\b", text)}
    return names


def _not_met(out: str) -> str:
    """The requirements a plan lists as not met (what the run refuses), without the plan and
    without what is only to check on the target."""
    kept = []
    for line in out.partition("\n  not met:\n")[2].splitlines():
        if not line.startswith("    "):  # the next group, or the verdict
            break
        kept.append(line + "\n")
    return "".join(kept)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from orchestrator.cli import main

    code = main(argv)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out, captured.err


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_validate_the_dry_run_and_the_sweep_refuse_alike(
    scenario: Scenario, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], gpu_machine: Callable[..., Path],
) -> None:
    """This machine as it is (no GPU, no apptainer) unless the scenario gives it a stand-in GPU."""
    from orchestrator.catalog import gpus

    if scenario.gpu:
        gpu_machine(scenario.gpu)
    else:
        gpus.local_facts.cache_clear()
        monkeypatch.setenv("PATH", os.environ["PATH"])  # restored afterwards
    for name in scenario.unset:
        monkeypatch.delenv(name, raising=False)
    for name, value in scenario.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # no user defaults
    path = tmp_path / "m.toml"
    source = (ROOT / "matrices" / f"{scenario.matrix}.toml").read_text() if scenario.matrix \
        else scenario.text
    path.write_text(source)
    (tmp_path / "h.toml").write_text(HOSTS)
    results = tmp_path / "results"
    commands = {
        "validate": ["validate", str(path), *scenario.args],
        "dry run": ["matrix", str(path), "--dry-run", "--results", str(results), *scenario.args],
        "sweep": ["matrix", str(path), "--results", str(results), *scenario.args],
    }
    if scenario.run_option:
        del commands["validate"]  # validate has no --resume
    seen = {}
    for what, argv in commands.items():
        code, out, err = _run(argv, capsys)
        # what the machine lacks: the dry run shows the plan (stdout), then the requirements
        said = _not_met(out) + err if what == "dry run" and code == 3 else err
        seen[what] = (code, frozenset(_fields(said, str(path))))
        assert code == scenario.code, f"{what}: exit {code}\n{err}"
        for name in scenario.fields:
            assert name in seen[what][1], f"{what} does not name {name}:\n{said}"
        if what == "dry run" and code == 3:
            assert "commands (" in out and "would not start here" in out, out[-2000:]
    assert len({fields for _, fields in seen.values()}) == 1, seen  # the very same problems
    assert not results.exists() or not any(results.rglob("run.json"))  # nothing ran


@pytest.mark.subprocess  # the sweep of the selection runs examples/fake_bench.py
def test_a_selection_is_decided_for_its_own_cells(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--only`` / ``--exclude`` leave out the cells that need a GPU: what the target lacks is
    decided for the cells the command acts on, so the CPU cells of a mixed matrix start on a
    machine without a GPU, alike for validate, plan, the dry run and the sweep (all of them
    refused the whole matrix's GPU cells before). The file itself is still checked whole."""
    from orchestrator.catalog import gpus

    gpus.local_facts.cache_clear()
    monkeypatch.setenv("PATH", os.environ["PATH"])
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(ROOT)  # the example's command runs examples/fake_bench.py
    path = tmp_path / "m.toml"
    path.write_text((ROOT / "examples" / "fake_bench.toml").read_text() + MIXED)
    mixed = ("--set", 'axes.hardware=["cpu", "v100"]', "--set", "matrix.repeats=1")
    results = tmp_path / "results"
    for selection in (("--only", "hardware=cpu"), ("--exclude", "hardware=v100")):
        for argv in (["validate", str(path)], ["plan", str(path)],
                     ["matrix", str(path), "--dry-run", "--results", str(results)]):
            code, out, err = _run([*argv, *mixed, *selection], capsys)
            assert code == 0, f"{argv[0]} {selection}: exit {code}\n{err}"
            assert "v100" not in out.partition("requirements")[2], out
        code, out, err = _run([*argv, *mixed], capsys)  # the whole matrix: the GPU cells
        assert code == 3 and "hardware.v100.device" in out + err
    code, out, err = _run(["matrix", str(path), "--results", str(results), *mixed,
                           "--only", "hardware=cpu"], capsys)
    assert code == 0, err
    assert "2 cells: 2 ok" in out, out


# --- the table in the docs --------------------------------------------------------------------


def refusal_table() -> str:
    """docs/refusals.md, from the code."""
    decision, options = decided_by(DECISION), decided_by(RUN_OPTIONS)
    rows, later = [], []
    seen: set[str] = set()
    for site in sweep_sites():
        if site.key in seen:
            continue
        seen.add(site.key)
        module, _, function = site.function.partition(":")
        where = f"`{module.removeprefix('orchestrator.')}.{function}`"
        what = site.words.replace("|", "\\|")
        if site.function in decision:
            rows.append(f"| {where} | {what} | yes | yes | yes |")
        elif site.function in options:
            rows.append(f"| {where} | {what} | no such option | yes | yes |")
        else:
            later.append(f"| {where} | {what} | {FOUND_BY_DOING[site.key]} |")
    head = [
        "# What the sweep refuses, and who says so first",
        "",
        "Generated from the code by `tests/test_one_decision.py` (`UPDATE_GOLDEN=1` rewrites "
        "it): every refusal (a ConfigError or BackendUnavailable) the sweep can raise between "
        "`orchestrate matrix` and its first cell, found by walking the call graph from "
        "`run_sweep`. `validate`, `plan`, `matrix --dry-run` and the sweep take one decision "
        "(`backends/checks.preflight`: the matrix, the machine, the backend, what preparing it "
        "would refuse), and `--dry-run` and the sweep one check of the run's own options "
        "(`sweep.check_run`: `--results`, `--resume`), so a row never differs between the "
        "commands that take the same options (`validate` takes neither `--results` nor "
        "`--resume`). A new refusal on the sweep's path that is in neither fails the test. "
        "What the machine the cells run on lacks (a GPU, the Docker engine, a local base "
        "image, Slurm, a program, a checkout, a data path: an `errors.Requirement`) is refused "
        "by `validate` and the sweep with exit 3, while `plan` and `--dry-run` print the plan "
        "and every launch first and list the same requirements after it (exit 3): the one "
        "decision's refusal below carries them.",
        "",
        f"## Decided before the run ({len(rows)} refusals)",
        "",
        "| where | what it says | validate, plan | --dry-run | sweep |",
        "| --- | --- | --- | --- | --- |",
    ]
    tail = [
        "",
        f"## Found only by running ({len(later)})",
        "",
        "What no command can know before doing it: writing the run folder, a lab host's own "
        "files (a dry run and `validate` connect to no host). Each is listed with the reason "
        "in the test.",
        "",
        "| where | what it says | why only the sweep finds it |",
        "| --- | --- | --- |",
    ]
    return "\n".join([*head, *rows, *tail, *later]) + "\n"


def test_the_docs_table_is_the_codes() -> None:
    text = refusal_table()
    if os.environ.get("UPDATE_GOLDEN"):
        DOCS.write_text(text, encoding="utf-8")
    assert DOCS.read_text(encoding="utf-8") == text, "UPDATE_GOLDEN=1 to rewrite docs/refusals.md"


if __name__ == "__main__":
    sys.stdout.write(refusal_table())
