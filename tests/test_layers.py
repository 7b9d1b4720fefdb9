"""The package's layers: no module imports one of a higher layer, and no imports go in circles.

Every import counts: at the top of a module, inside a function (a lazy import is still a
dependency) and under ``TYPE_CHECKING``. The graph is read with :mod:`ast` from the source, so
nothing is imported to check it. A new module must be placed in :data:`LAYERS` deliberately.

The layers, lowest first (a module may import its own layer and the ones below):

1. the package root (``__version__``) and ``errors``: everything may raise them;
2. ``config``: the matrix file's models, with what they stand on alone: how a user file is
   read and validated (``userfiles``), the ``[figures]`` table's models (``fom_config``) and
   the argv template mechanics (``argv_template``);
3. files and facts, each standing on config and errors only: run folders and results, host
   inventories, GPU discovery parsers, image templates, the NGC release table, the profilers'
   command lines and CSV figures, the throttle re-run rule, which values are secret, the
   user's defaults;
4. reports built from what is on disk (tables, trends, plots, the ETA): they never see a matrix
   or a backend, so a report can be rebuilt from any old run;
5. ``matrix``: expansion into cells;
6. ``placement`` and ``launch``: where a cell runs and the command that runs it (pure);
7. the outside world: the Docker engine, SSH, Docker over SSH, image builds, a cell's local
   processes, locks on this machine's GPUs;
7b. the semantic checks ("can this run"): a matrix against the stacks its cells run on;
8. the backend base and the registry of backends;
9. what several backends share: containers, remote executions;
10. the backends themselves; **isolated**: no backend imports another;
11. ``sweep``: the pipeline;
12. the CLI's command groups; 13. the CLI.

``workload/`` (the program inside the images) imports nothing of ``orchestrator``, and
``orchestrator`` imports nothing of ``workload``: JSON lines are the only contract.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: (layer name, modules, isolated: whether modules of the layer may import each other).
LAYERS: list[tuple[str, tuple[str, ...], bool]] = [
    ("foundation", ("orchestrator", "orchestrator.errors"), False),
    ("statistics", ("orchestrator.stats",), False),
    ("run-folder values", ("orchestrator.results",), False),
    ("config", ("orchestrator.userfiles", "orchestrator.argv_template", "orchestrator.fom_config",
                "orchestrator.config"), False),
    ("files and facts", (
        "orchestrator.hosts", "orchestrator.gpus",
        "orchestrator.images", "orchestrator.releases", "orchestrator.stacks",
        "orchestrator.dllog", "orchestrator.fom", "orchestrator.store", "orchestrator.references",
        "orchestrator.profilers", "orchestrator.profile_figures", "orchestrator.rerun",
        "orchestrator.redact", "orchestrator.userconfig", "orchestrator.imagestate",
    ), False),
    ("reports", (
        "orchestrator.summary", "orchestrator.history", "orchestrator.compare",
        "orchestrator.export", "orchestrator.plots", "orchestrator.report_html",
    ), False),
    ("matrix", ("orchestrator.matrix",), False),
    ("import of results made elsewhere", ("orchestrator.importer",), False),
    ("placement and launch", (
        "orchestrator.placement", "orchestrator.launch", "orchestrator.ordering",
        "orchestrator.eta", "orchestrator.selection", "orchestrator.apptainer",
    ), False),
    ("outside world", (
        "orchestrator.engine", "orchestrator.ssh", "orchestrator.ssh_docker",
        "orchestrator.build", "orchestrator.cellprocs", "orchestrator.locks",
        "orchestrator.refresh", "orchestrator.sif", "orchestrator.remote_locks",
    ), False),
    ("semantic checks", ("orchestrator.checks",), False),
    ("backend base", ("orchestrator.backends", "orchestrator.backends.base"), False),
    ("shared by backends", (
        "orchestrator.backends.containers", "orchestrator.backends.remote",
    ), False),
    ("backends", (
        "orchestrator.backends.process", "orchestrator.backends.docker",
        "orchestrator.backends.ssh", "orchestrator.backends.slurm",
    ), True),
    ("sweep", ("orchestrator.sweep",), False),
    ("commands", (
        "orchestrator.commands", "orchestrator.commands.sweep", "orchestrator.commands.images",
        "orchestrator.commands.hosts", "orchestrator.commands.maintenance",
        "orchestrator.commands.importing", "orchestrator.commands.results",
    ), False),
    ("cli", ("orchestrator.cli", "orchestrator.__main__"), False),
]
PACKAGES = ("orchestrator", "workload")
#: The one way across the workload boundary: the orchestrator reads figures of programs it did
#: not write (DLLogger logs) by the workload's own pure metric rules (no torch import), so one
#: definition of throughput and percentiles serves both. Nothing else crosses, and the workload
#: never imports the orchestrator.
CROSSING_ALLOWED = {"workload.metrics"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module of the two packages, by dotted name."""
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports, anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the importing package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import sub`` imports the submodule; ``from mod import name`` the module
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # ``import a.b.c``: the deepest known module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def layer_of() -> dict[str, int]:
    return {m: i for i, (_, members, _) in enumerate(LAYERS) for m in members}


def test_every_module_has_a_layer() -> None:
    placed = layer_of()
    listed = [m for _, members, _ in LAYERS for m in members]
    assert len(listed) == len(set(listed)), "a module is listed in two layers"
    package = {m for m in modules() if m.split(".")[0] == "orchestrator"}
    assert sorted(package - set(placed)) == [], "place new modules in LAYERS (tests/test_layers.py)"
    assert sorted(set(placed) - package) == [], "LAYERS names modules that do not exist"


def test_no_module_imports_a_higher_layer() -> None:
    placed = layer_of()
    isolated = {m for _, members, alone in LAYERS if alone for m in members}
    upward = []
    for name, deps in graph().items():
        if name not in placed:
            continue
        for dep in sorted(deps):
            if dep not in placed:
                continue
            if placed[dep] > placed[name]:
                upward.append(f"{name} ({LAYERS[placed[name]][0]}) imports {dep} "
                              f"({LAYERS[placed[dep]][0]})")
            elif placed[dep] == placed[name] and name in isolated:
                upward.append(f"{name} imports {dep}: modules of layer "
                              f"{LAYERS[placed[name]][0]!r} must not import each other")
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_workload_and_orchestrator_never_import_each_other() -> None:
    crossing = [
        f"{name} imports {dep}"
        for name, deps in graph().items()
        for dep in sorted(deps)
        if name.split(".")[0] != dep.split(".")[0]
        and not (name.startswith("orchestrator") and dep in CROSSING_ALLOWED)
    ]
    assert not crossing, "\n".join(crossing)


def test_no_import_cycles() -> None:
    edges = graph()
    cycles: list[str] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for dep in sorted(edges[node]):
            if state.get(dep) == 1:
                cycles.append(" -> ".join([*path[path.index(dep):], dep]))
            elif dep not in state:
                visit(dep)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_every_registered_backend_is_in_the_backends_layer() -> None:
    from orchestrator.backends import _REGISTRY

    backends = next(members for name, members, _ in LAYERS if name == "backends")
    assert sorted(t.partition(":")[0] for t in _REGISTRY.values()) == sorted(backends)


def test_the_checker_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    """The checker itself: imports inside functions and under TYPE_CHECKING count."""
    source = tmp_path / "mod.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from orchestrator.sweep import run_sweep\n"
        "def f():\n    from orchestrator import cli\n    import orchestrator.backends.ssh\n"
    )
    known = {"orchestrator", "orchestrator.sweep", "orchestrator.cli", "orchestrator.backends",
             "orchestrator.backends.ssh"}
    assert imports_of("orchestrator.mod", source, known) == {
        "orchestrator.sweep", "orchestrator.cli", "orchestrator.backends.ssh"}


def test_what_the_orchestrator_takes_from_the_workload_needs_no_torch() -> None:
    """The allowed crossing imports only the standard library (the controller has no torch)."""
    import sys

    for name in CROSSING_ALLOWED:
        path = modules()[name]
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        roots = {alias.name.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.Import) for alias in node.names}
        roots |= {node.module.split(".")[0] for node in ast.walk(tree)
                  if isinstance(node, ast.ImportFrom) and node.module and not node.level}
        assert roots <= set(sys.stdlib_module_names), f"{name} imports {roots}"
