"""Where the sweep can say no: a static call graph of the package, and the refusals on it.

Tests only (tests/test_one_decision.py). The graph is built from the source with :mod:`ast`, no
import of the package: a function's calls are resolved by name (a function or class of its
module, an imported name, a module alias's attribute, ``self.x`` / ``cls.x`` / ``super().x``
within the class hierarchy, and ``v.x`` where ``v`` is annotated, or assigned from a class or a
``type[...]`` parameter). It over-approximates on purpose (a method reached through ``self`` is
every override of it, a nested function counts as its parent), so a refusal is never missed
because a call was hard to see; calls it cannot resolve (a method of an unannotated value) are
skipped, which is why the sweep's hooks are reached through annotated parameters
(``cls: type[Backend]``, ``backend: Backend``).

A **refusal** is a ``raise`` of :class:`~orchestrator.errors.ConfigError` or
:class:`~orchestrator.errors.BackendUnavailable` (or a subclass), directly or through a helper
whose return annotation is one of them (``raise _unwritable(...)``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "orchestrator"
#: The error classes a refusal raises (their subclasses count too).
REFUSAL_ROOTS = ("ConfigError", "BackendUnavailable")


@dataclass
class Function:
    """A function or method: ``module:Qual.name``."""

    id: str
    module: str
    cls: str | None
    node: ast.FunctionDef | ast.AsyncFunctionDef


@dataclass
class Klass:
    id: str  # module:Name
    module: str
    bases: list[str] = field(default_factory=list)  # resolved class ids
    methods: dict[str, str] = field(default_factory=dict)  # name -> function id


@dataclass(frozen=True)
class Site:
    """One refusal: the function it is in, and the first words of its message."""

    function: str
    words: str
    line: int

    @property
    def key(self) -> str:
        return f"{self.function}: {self.words}"


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


class Graph:
    """Every module of the package, its functions, classes, imports and calls."""

    def __init__(self) -> None:
        self.trees: dict[str, ast.Module] = {}
        self.functions: dict[str, Function] = {}
        self.classes: dict[str, Klass] = {}
        self.imports: dict[str, dict[str, str]] = {}  # module -> alias -> "mod" or "mod:name"
        self._class_nodes: dict[str, ast.ClassDef] = {}
        for path in sorted(PACKAGE.rglob("*.py")):
            name = _module_name(path)
            self.trees[name] = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for name, tree in self.trees.items():
            self._index(name, tree)
        for klass in self.classes.values():
            node = self._class_nodes[klass.id]
            klass.bases = [b for b in (self._resolve_expr(klass.module, base)
                                       for base in node.bases) if b in self.classes]
        self.refusal_classes = self._refusal_classes()
        self._calls: dict[str, set[str]] = {}

    # --- indexing -------------------------------------------------------------------------

    def _index(self, module: str, tree: ast.Module) -> None:
        imports: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    imports[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0])
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    target = f"{node.module}.{alias.name}"
                    imports[alias.asname or alias.name] = (
                        target if target in self.trees else f"{node.module}:{alias.name}")
        self.imports[module] = imports
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                fid = f"{module}:{node.name}"
                self.functions[fid] = Function(fid, module, None, node)
            elif isinstance(node, ast.ClassDef):
                cid = f"{module}:{node.name}"
                klass = Klass(cid, module)
                self.classes[cid] = klass
                self._class_nodes[cid] = node
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        fid = f"{cid}.{item.name}"
                        self.functions[fid] = Function(fid, module, cid, item)
                        klass.methods[item.name] = fid

    def _refusal_classes(self) -> set[str]:
        return set().union(*(self.subclasses(f"orchestrator.errors:{name}")
                              for name in REFUSAL_ROOTS))

    # --- names ----------------------------------------------------------------------------

    def _resolve_name(self, module: str, name: str) -> str | None:
        """A name of ``module`` as a function/class id, a module name, or None."""
        if f"{module}:{name}" in self.functions or f"{module}:{name}" in self.classes:
            return f"{module}:{name}"
        target = self.imports[module].get(name)
        if target is None:
            return None
        if ":" in target:
            mod, _, attr = target.partition(":")
            if mod in self.trees:
                return self._resolve_name(mod, attr) or target
            return target
        return target

    def _resolve_expr(self, module: str, expr: ast.expr) -> str | None:
        if isinstance(expr, ast.Name):
            return self._resolve_name(module, expr.id)
        if isinstance(expr, ast.Attribute):
            base = self._resolve_expr(module, expr.value)
            if base is not None and base in self.trees:
                return self._resolve_name(base, expr.attr)
        return None

    def subclasses(self, cid: str) -> set[str]:
        """``cid`` and every class that derives from it."""
        found = {cid}
        changed = True
        while changed:
            changed = False
            for klass in self.classes.values():
                if klass.id not in found and any(b in found for b in klass.bases):
                    found.add(klass.id)
                    changed = True
        return found

    def ancestors(self, cid: str) -> list[str]:
        out, todo = [], [cid]
        while todo:
            current = todo.pop(0)
            if current in out or current not in self.classes:
                continue
            out.append(current)
            todo += self.classes[current].bases
        return out

    def method(self, cid: str, name: str, *, overrides: bool = True) -> set[str]:
        """``name`` on class ``cid``: the one it inherits, and (``overrides``) every override of
        it in a subclass."""
        found: set[str] = set()
        for ancestor in self.ancestors(cid):
            if name in self.classes[ancestor].methods:
                found.add(self.classes[ancestor].methods[name])
                break
        if overrides:
            for sub in self.subclasses(cid):
                if name in self.classes[sub].methods:
                    found.add(self.classes[sub].methods[name])
        return found

    def _class_of_annotation(self, module: str, annotation: ast.expr | None) -> str | None:
        """The class an annotation names: ``X``, ``type[X]``, ``X | None``, ``"X"``."""
        if annotation is None:
            return None
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            try:
                annotation = ast.parse(annotation.value, mode="eval").body
            except SyntaxError:
                return None
        if isinstance(annotation, ast.BinOp):  # X | None
            return (self._class_of_annotation(module, annotation.left)
                    or self._class_of_annotation(module, annotation.right))
        if isinstance(annotation, ast.Subscript):  # type[X]
            return self._class_of_annotation(module, annotation.slice)
        target = self._resolve_expr(module, annotation)
        return target if target in self.classes else None

    # --- calls ----------------------------------------------------------------------------

    def calls(self, fid: str, *, raising: bool = False) -> set[str]:
        """What ``fid`` calls; ``raising``: only the calls whose refusals reach its caller (not
        those inside a ``try`` whose handler catches a refusal and raises nothing)."""
        key = f"{fid}|{raising}"
        if key not in self._calls:
            self._calls[key] = self._find_calls(self.functions[fid], raising)
        return self._calls[key]

    def _swallows(self, module: str, handler: ast.ExceptHandler) -> bool:
        """Whether ``handler`` catches a refusal and raises nothing (the error ends there)."""
        if any(isinstance(n, ast.Raise) for n in ast.walk(handler)):
            return False
        if handler.type is None:
            return True
        kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        for kind in kinds:
            if isinstance(kind, ast.Name) and kind.id in ("Exception", "BaseException"):
                return True
            target = self._resolve_expr(module, kind)
            if target in self.refusal_classes or target == "orchestrator.errors:OrchestratorError":
                return True
        return False

    def _call_nodes(self, fn: Function, raising: bool) -> Iterator[ast.Call]:
        def walk(node: ast.AST) -> Iterator[ast.Call]:
            if isinstance(node, ast.Try) and raising and any(
                    self._swallows(fn.module, h) for h in node.handlers):
                for part in [*node.handlers, *node.orelse, *node.finalbody]:
                    yield from walk(part)
                return
            if isinstance(node, ast.Call):
                yield node
            for child in ast.iter_child_nodes(node):
                yield from walk(child)
        yield from walk(fn.node)

    def _types(self, fn: Function) -> dict[str, str]:
        """Local names whose class is known: annotated parameters, ``x = Cls(...)``,
        ``x = t(...)`` with ``t: type[Cls]``, ``x: Cls = ...``."""
        known: dict[str, str] = {}
        args = fn.node.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            cid = self._class_of_annotation(fn.module, arg.annotation)
            if cid:
                known[arg.arg] = cid
        if fn.cls is not None and args.args:
            known.setdefault(args.args[0].arg, fn.cls)  # self / cls
        for node in ast.walk(fn.node):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                cid = self._class_of_annotation(fn.module, node.annotation)
                if cid:
                    known[node.target.id] = cid
            elif (isinstance(node, ast.Assign) and len(node.targets) == 1
                  and isinstance(node.targets[0], ast.Name)):
                cid = self._class_of_value(fn.module, node.value, known)
                if cid:
                    known.setdefault(node.targets[0].id, cid)
        return known

    def _class_of_value(self, module: str, value: ast.expr, known: dict[str, str]) -> str | None:
        """The class of ``X(...)``, ``t(...)`` (``t: type[X]``), ``f(...)`` (``f`` annotated to
        return ``X`` or ``type[X]``), either branch of ``a if c else b``."""
        if isinstance(value, ast.IfExp):
            return (self._class_of_value(module, value.body, known)
                    or self._class_of_value(module, value.orelse, known))
        if not isinstance(value, ast.Call):
            return None
        func = value.func
        if isinstance(func, ast.Name) and func.id in known:
            return known[func.id]
        target = self._resolve_expr(module, func)
        if target in self.classes:
            return target
        if target in self.functions:
            callee = self.functions[target]
            return self._class_of_annotation(callee.module, callee.node.returns)
        return None

    def _find_calls(self, fn: Function, raising: bool) -> set[str]:
        found: set[str] = set()
        known = self._types(fn)
        for node in self._call_nodes(fn, raising):
            found |= self._callee(fn, node.func, known)
        return {f for f in found if f in self.functions}

    def _callee(self, fn: Function, func: ast.expr, known: dict[str, str]) -> set[str]:
        if isinstance(func, ast.Name):
            if func.id in known:  # cls(...) with cls: type[X]
                return self.method(known[func.id], "__init__")
            target = self._resolve_name(fn.module, func.id)
            if target in self.classes:
                return self.method(target, "__init__", overrides=False)
            return {target} if target else set()
        if not isinstance(func, ast.Attribute):
            return set()
        value = func.value
        if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                and value.func.id == "super" and fn.cls):
            return set().union(*(self.method(b, func.attr, overrides=False)
                                 for b in self.classes[fn.cls].bases)) \
                if self.classes[fn.cls].bases else set()
        if isinstance(value, ast.Name) and value.id in known:
            return self.method(known[value.id], func.attr)
        target = self._resolve_expr(fn.module, value)
        if target is not None and target in self.trees:
            callee = self._resolve_name(target, func.attr)
            if callee in self.classes:
                return self.method(callee, "__init__", overrides=False)
            return {callee} if callee else set()
        if target in self.classes:  # Cls.method(...)
            return self.method(target, func.attr, overrides=False)
        return set()

    def reachable(self, roots: Iterable[str], stop: Iterable[str] = (), *,
                  raising: bool = False) -> set[str]:
        """Every function reached from ``roots``, not going into ``stop``; ``raising``: only
        through calls whose refusals reach the caller (:meth:`calls`)."""
        stop = set(stop)
        seen: set[str] = set()
        todo = [r for r in roots if r in self.functions]
        while todo:
            current = todo.pop()
            if current in seen or current in stop:
                continue
            seen.add(current)
            todo += sorted(self.calls(current, raising=raising) - seen)
        return seen

    # --- refusals -------------------------------------------------------------------------

    def refusals(self, fid: str) -> Iterator[Site]:
        """The refusals raised in function ``fid`` (its nested functions included)."""
        fn = self.functions[fid]
        for node in ast.walk(fn.node):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            exc = node.exc
            func = exc.func if isinstance(exc, ast.Call) else exc
            target = self._resolve_expr(fn.module, func)
            if target in self.refusal_classes or self._returns_refusal(target):
                yield Site(fid, _words(exc), node.lineno)

    def _returns_refusal(self, target: str | None) -> bool:
        if target is None or target not in self.functions:
            return False
        fn = self.functions[target]
        cid = self._class_of_annotation(fn.module, fn.node.returns)
        return cid in self.refusal_classes


def _words(exc: ast.expr, limit: int = 60) -> str:
    """What a reader recognises a refusal by: its message's text as written (``{...}`` where a
    value goes in), else the expression it raises (``ConfigError(problems)``)."""
    if not isinstance(exc, ast.Call):
        return ast.unparse(exc)
    for arg in [*exc.args, *(k.value for k in exc.keywords)]:
        if arg is (exc.args or [None])[0] and isinstance(arg, ast.Call):
            break  # a message made by a function (no_runs(root, name)), not field="run"
        text = _text(arg)
        if text:
            text = " ".join(text.split())
            return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " ..."
    first = exc.args[0] if exc.args else None
    return f"{ast.unparse(exc.func)}({ast.unparse(first) if first is not None else ''})"


def _text(node: ast.expr) -> str | None:
    """The message a node spells out: a string, an f-string (``{value}`` for its holes), a sum
    of them, or the message of the first ``Problem(file, field, message)`` of a list."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.strip():
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            elif isinstance(value, ast.FormattedValue):
                parts.append("{" + ast.unparse(value.value) + "}")
        return "".join(parts)
    if isinstance(node, ast.BinOp):
        left, right = _text(node.left), _text(node.right)
        return (left or "") + (right or "") if left or right else None
    if isinstance(node, ast.List | ast.ListComp):
        elt = node.elts[0] if isinstance(node, ast.List) and node.elts else getattr(node, "elt",
                                                                                    None)
        if isinstance(elt, ast.Call) and len(elt.args) >= 3:
            return _text(elt.args[2])
    return None
