"""The package's layers: each package imports only what its docstring says, all of it lower.

The layers are the packages of ``orchestrator/`` (and three single modules), lowest first, in
:data:`LAYERS`. Each one's docstring ends with a ``May import:`` line naming the layers below it
that it uses; the tests here check that

* every module belongs to exactly one layer, and every layer is there;
* the ``May import:`` line names only lower layers (the order is a line, not a web);
* no module imports a layer its package's line does not name, and no imports go in circles;
* the backends never import each other, and of the results only the importer sees a plan;
* inside the results layer, the same rules once more: its parts (:data:`RESULTS_PARTS`, one
  sub-package each) are in order, each part's docstring names on its ``May import:`` line the
  lower parts and the layers it uses (no layer the results layer itself does not declare), and
  no module imports a part or a layer its part does not name.

Every import counts: at the top of a module, inside a function (a lazy import is still a
dependency) and under ``TYPE_CHECKING``. The graph is read with :mod:`ast` from the source, so
nothing is imported to check it.

``workload/`` (the program inside the images) imports nothing of ``orchestrator``, and
``orchestrator`` imports nothing of ``workload`` but one stdlib-only module: JSON lines are the
contract.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: The layers, lowest first: (name, the package or modules it is).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("errors", ("orchestrator", "orchestrator.errors")),
    ("config", ("orchestrator.config",)),
    ("catalog", ("orchestrator.catalog",)),
    ("plan", ("orchestrator.plan",)),
    ("results", ("orchestrator.results",)),
    ("local", ("orchestrator.local",)),
    ("remote", ("orchestrator.remote",)),
    ("images", ("orchestrator.images",)),
    ("runtimes", ("orchestrator.runtimes",)),
    ("backends", ("orchestrator.backends",)),
    ("sweep", ("orchestrator.sweep",)),
    ("publish", ("orchestrator.publish",)),
    ("cli", ("orchestrator.cli", "orchestrator.__main__")),
]
#: The package of the backends: each module of it that defines a backend (a class based on
#: ``Backend``) is one backend, and backends never import one another (what they share lives
#: in base / containers / remote_executions).
BACKENDS_PACKAGE = ROOT / "orchestrator" / "backends"
#: The one results module that may expand a matrix (an import joins a matrix's groups).
RESULTS_SEEING_A_PLAN = {"orchestrator.results.importer.target"}
#: The parts of the results layer, lowest first: sub-packages of ``orchestrator.results``, each
#: one job a newcomer can name (statistics; run folders and the store; what a cell's output
#: says; reports; the importer). One layer with an order inside rather than five layers: the
#: other layers see ``results`` as one thing (what is on disk), and the parts' order is the
#: results' own business.
RESULTS_PARTS = ("statistics", "folders", "figures", "reports", "importer")
PACKAGES = ("orchestrator", "workload")
#: The one way across the workload boundary: the orchestrator reads figures of programs it did
#: not write (DLLogger logs) by the workload's own pure metric rules (no torch import), so one
#: definition of throughput and percentiles serves both. Nothing else crosses, and the workload
#: never imports the orchestrator.
CROSSING_ALLOWED = {"workload.metrics"}


def backend_modules() -> set[str]:
    """The modules of :data:`BACKENDS_PACKAGE` that define a backend: a class whose bases name
    ``Backend`` (read from the source, nothing imported)."""
    found = set()
    for path in sorted(BACKENDS_PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        if any(isinstance(node, ast.ClassDef) and any(
                (b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")) == "Backend"
                for b in node.bases) for node in tree.body):
            found.add(module_name(path))
    return found


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


@functools.cache
def graph() -> dict[str, frozenset[str]]:
    """Every module's project imports (parsed once per session: the tests only read it)."""
    mods = modules()
    known = set(mods)
    return {name: frozenset(imports_of(name, path, known)) for name, path in mods.items()}


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of the layer ``module`` belongs to (longest prefix)."""
    hits = [(len(member), i) for i, (_, members) in enumerate(LAYERS) for member in members
            if module == member or (member != "orchestrator" and module.startswith(member + "."))]
    return max(hits)[1] if hits else None


def declared(index: int) -> set[str]:
    """The layers named on the ``May import:`` line of a layer's (first entry's) docstring."""
    name = LAYERS[index][1][-1] if index == 0 else LAYERS[index][1][0]
    path = modules()[name]
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    lines = [line for line in doc.splitlines() if line.startswith("May import:")]
    assert len(lines) == 1, f"{path}: the docstring needs one 'May import:' line"
    text = re.sub(r"\([^)]*\)", "", lines[0].partition(":")[2])  # drop "(the importer only)"
    names = {w.strip(" .") for w in text.split(",")} - {"nothing", ""}
    known = {n for n, _ in LAYERS}
    assert names <= known, f"{path}: 'May import:' names unknown layers {sorted(names - known)}"
    return names


def test_every_module_has_a_layer() -> None:
    package = [m for m in modules() if m.split(".")[0] == "orchestrator"]
    assert [m for m in package if layer_of(m) is None] == [], "put new modules in a layer's package"
    listed = [m for _, members in LAYERS for m in members]
    assert sorted(set(listed) - set(package)) == [], "LAYERS names modules that do not exist"
    # 13: publish, a leaf under the CLI that talks to tracking servers (the MLflow client is
    # an optional extra: it must not reach the layers every command imports)
    assert len(LAYERS) <= 13, "about ten layers: a new one needs a reason"


def test_each_layer_declares_only_lower_layers() -> None:
    order = [n for n, _ in LAYERS]
    for i, (name, _) in enumerate(LAYERS):
        higher = {n for n in declared(i) if order.index(n) >= i}
        assert not higher, f"layer {name!r} declares {sorted(higher)}: not below it"


def test_no_module_imports_what_its_layer_does_not_declare() -> None:
    order = [n for n, _ in LAYERS]
    allowed = {i: declared(i) for i in range(len(LAYERS))}
    wrong = []
    for module, deps in graph().items():
        mine = layer_of(module)
        if mine is None:
            continue
        for dep in sorted(deps):
            theirs = layer_of(dep)
            if theirs is None or theirs == mine:
                continue
            if order[theirs] not in allowed[mine]:
                wrong.append(f"{module} ({order[mine]}) imports {dep} ({order[theirs]}), "
                             f"which layer {order[mine]!r} does not declare")
    assert not wrong, "\n".join(wrong)


def test_backends_do_not_import_each_other() -> None:
    edges, isolated = graph(), backend_modules()
    assert len(isolated) >= 4, isolated  # the reader sees the backends
    wrong = [f"{a} imports {b}" for a in isolated for b in sorted(edges[a]) if b in isolated]
    assert not wrong, "\n".join(wrong)


def test_reports_never_see_a_plan() -> None:
    wrong = [f"{m} imports {d}" for m, deps in graph().items()
             if m.startswith("orchestrator.results.") and m not in RESULTS_SEEING_A_PLAN
             for d in sorted(deps) if d.startswith("orchestrator.plan")]
    assert not wrong, "\n".join(wrong)


def part_of(module: str) -> str | None:
    """The part of the results layer ``module`` is in (None: not in one)."""
    parts = module.split(".")
    if parts[:2] != ["orchestrator", "results"] or len(parts) < 3:
        return None
    return parts[2]


def part_declared(part: str) -> tuple[set[str], set[str]]:
    """(lower parts, layers) named on the ``May import:`` line of a part's docstring."""
    path = modules()[f"orchestrator.results.{part}"]
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    lines = [line for line in doc.splitlines() if line.startswith("May import:")]
    assert len(lines) == 1, f"{path}: the docstring needs one 'May import:' line"
    text = re.sub(r"\([^)]*\)", "", lines[0].partition(":")[2])
    names = {w.strip(" .") for w in text.split(",")} - {"nothing", ""}
    layers = {n for n, _ in LAYERS}
    unknown = names - set(RESULTS_PARTS) - layers
    assert not unknown, f"{path}: 'May import:' names unknown parts or layers {sorted(unknown)}"
    return names & set(RESULTS_PARTS), names & layers


def test_every_results_module_is_in_a_part() -> None:
    results = [m for m in modules() if m.startswith("orchestrator.results.")]
    assert sorted({part_of(m) for m in results}) == sorted(RESULTS_PARTS), (
        "every module of results/ is in one of its parts (a sub-package), and every part exists")
    whole = modules()["orchestrator.results"]
    assert graph()["orchestrator.results"] == frozenset(), f"{whole} imports nothing"


def test_each_results_part_declares_only_lower_parts_and_the_layers_results_may_import() -> None:
    results_may = declared([n for n, _ in LAYERS].index("results"))
    wrong = []
    for i, part in enumerate(RESULTS_PARTS):
        parts, layers = part_declared(part)
        higher = sorted(p for p in parts if RESULTS_PARTS.index(p) >= i)
        if higher:
            wrong.append(f"part {part!r} declares {higher}: not below it")
        if layers - results_may:
            wrong.append(f"part {part!r} declares layers {sorted(layers - results_may)} that "
                         "the results layer does not")
    assert not wrong, "\n".join(wrong)


def test_no_results_module_imports_what_its_part_does_not_declare() -> None:
    order = [n for n, _ in LAYERS]
    allowed = {part: part_declared(part) for part in RESULTS_PARTS}
    wrong = []
    for module, deps in graph().items():
        mine = part_of(module)
        if mine is None:
            continue
        parts, layers = allowed[mine]
        for dep in sorted(deps):
            theirs = part_of(dep)
            if theirs is not None and theirs != mine and theirs not in parts:
                wrong.append(f"{module} ({mine}) imports {dep} ({theirs}), which part "
                             f"{mine!r} does not declare")
            layer = layer_of(dep)
            if theirs is None and layer is not None and order[layer] not in layers | {"results"}:
                wrong.append(f"{module} ({mine}) imports {dep} (layer {order[layer]}), which "
                             f"part {mine!r} does not declare")
    assert not wrong, "\n".join(wrong)


def test_the_results_parts_check_sees_an_upward_import(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check itself: a module of a lower part importing a higher part is caught."""
    edges = dict(graph())
    edges["orchestrator.results.folders.store"] = edges[
        "orchestrator.results.folders.store"] | {"orchestrator.results.reports.summary"}
    monkeypatch.setattr(sys.modules[__name__], "graph", lambda: edges)
    try:
        test_no_results_module_imports_what_its_part_does_not_declare()
    except AssertionError as exc:
        assert "folders.store (folders) imports orchestrator.results.reports.summary" in str(exc)
    else:
        raise AssertionError("an upward import between results parts went unnoticed")


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


def test_every_backend_module_is_registered_and_every_record_names_one() -> None:
    """A module that defines a backend has a record in the registry (else no sweep can pick
    it), and every record of the package names such a module (else it names no backend)."""
    from orchestrator.backends.registry import _REGISTRY

    registered = {r.module for r in _REGISTRY.values()
                  if r.module.startswith("orchestrator.backends.")}
    assert registered == backend_modules()


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
