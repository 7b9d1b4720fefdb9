"""Image templates: Jinja2 Dockerfiles and Singularity definitions under ``images/<name>/``.

Each template directory holds a ``template.toml`` manifest and the template file::

    description = "..."
    kind = "dockerfile"            # or "singularity"
    template = "Dockerfile.j2"
    base = "{{ base_image or 'nvcr.io/nvidia/pytorch:' ~ base_tag }}"   # the FROM image

    [parent]                       # optional: built on another template's image
    template = "ngc-pytorch"
    variable = "parent_image"      # empty value = use the parent's content-hash tag
    forward = ["base_tag"]         # variables handed to the parent

    [variables.base_tag]
    type = "str"                   # str | int | bool | list
    default = "24.05-py3"
    description = "..."
    file = false                   # true: the value is a host path copied into the build context

Rendering is pure (:func:`render_text`); :func:`render_context` also writes the build context
(the rendered file, the repository's ``workload/`` and any file variables).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.config import read_toml
from orchestrator.errors import BuildError, ConfigError, Problem

if TYPE_CHECKING:
    import jinja2

log = logging.getLogger(__name__)

#: Repository root, found relative to the package (fine for an editable install).
REPO_ROOT = Path(__file__).resolve().parent.parent
#: Where the template directories live; tests may point this elsewhere.
IMAGES_DIR = REPO_ROOT / "images"
#: The workload package copied into every image.
WORKLOAD_DIR = REPO_ROOT / "workload"

VAR_TYPES = ("str", "int", "bool", "list")
KINDS = {"dockerfile": "Dockerfile", "singularity": "Singularity.def"}
_IGNORED_PARTS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".git"}
_IGNORED_SUFFIXES = {".pyc", ".pyo"}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class Variable:
    """One declared template variable."""

    name: str
    type: str
    default: Any
    description: str = ""
    file: bool = False


@dataclass(frozen=True)
class Parent:
    """The template whose image another template is built on."""

    template: str
    variable: str
    forward: tuple[str, ...] = ()


@dataclass(frozen=True)
class Template:
    """A loaded template: manifest plus template text."""

    name: str
    directory: Path
    description: str
    kind: str
    template_file: str
    text: str
    base: str
    variables: dict[str, Variable] = field(default_factory=dict)
    parent: Parent | None = None

    @property
    def output_name(self) -> str:
        """File name of the rendered output in a build context."""
        return KINDS[self.kind]

    def defaults(self) -> dict[str, Any]:
        """Every variable's default value (lists copied)."""
        return {
            n: list(v.default) if isinstance(v.default, list) else v.default
            for n, v in self.variables.items()
        }


def template_names() -> list[str]:
    """Names of the templates available under :data:`IMAGES_DIR`, sorted."""
    if not IMAGES_DIR.is_dir():
        return []
    return sorted(p.name for p in IMAGES_DIR.iterdir() if (p / "template.toml").is_file())


def load_template(name: str) -> Template:
    """Load and validate template ``name``; an unknown name lists the known ones."""
    names = template_names()
    if name not in names:
        raise ConfigError(
            f"unknown image template {name!r}; known: {', '.join(names) or '(none)'}",
            file=str(IMAGES_DIR),
        )
    directory = IMAGES_DIR / name
    manifest_path = directory / "template.toml"
    where = str(manifest_path)
    raw = read_toml(manifest_path)

    problems: list[Problem] = []
    allowed = {"description", "kind", "template", "base", "parent", "variables"}
    for key in sorted(set(raw) - allowed):
        problems.append(Problem(where, key, "unknown key"))
    kind = raw.get("kind", "")
    if kind not in KINDS:
        problems.append(Problem(where, "kind", f"must be one of {', '.join(KINDS)}"))
    template_file = raw.get("template", "")
    if not isinstance(template_file, str) or not (directory / template_file).is_file():
        problems.append(Problem(where, "template", f"no template file {template_file!r}"))
    variables = _parse_variables(raw.get("variables", {}), where, problems)
    parent = _parse_parent(raw.get("parent"), variables, where, problems)
    if problems:
        raise ConfigError(problems)
    return Template(
        name=name,
        directory=directory,
        description=str(raw.get("description", "")),
        kind=kind,
        template_file=template_file,
        text=(directory / template_file).read_text(encoding="utf-8"),
        base=str(raw.get("base", "")),
        variables=variables,
        parent=parent,
    )


def _parse_variables(raw: Any, where: str, problems: list[Problem]) -> dict[str, Variable]:
    variables: dict[str, Variable] = {}
    if not isinstance(raw, dict):
        problems.append(Problem(where, "variables", "must be a table"))
        return variables
    for vname, spec in raw.items():
        fld = f"variables.{vname}"
        if not isinstance(spec, dict):
            problems.append(Problem(where, fld, "must be a table"))
            continue
        extra = set(spec) - {"type", "default", "description", "file"}
        if extra:
            problems.append(Problem(where, fld, f"unknown keys: {', '.join(sorted(extra))}"))
        vtype = spec.get("type")
        if vtype not in VAR_TYPES:
            problems.append(Problem(where, f"{fld}.type", f"must be one of {', '.join(VAR_TYPES)}"))
            continue
        if "default" not in spec:
            problems.append(Problem(where, f"{fld}.default", "missing"))
            continue
        message = _type_problem(spec["default"], vtype)
        if message:
            problems.append(Problem(where, f"{fld}.default", message))
            continue
        variables[vname] = Variable(
            vname,
            vtype,
            spec["default"],
            str(spec.get("description", "")),
            bool(spec.get("file", False)),
        )
    return variables


def _parse_parent(
    raw: Any, variables: dict[str, Variable], where: str, problems: list[Problem]
) -> Parent | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw.get("template") or not raw.get("variable"):
        problems.append(Problem(where, "parent", "needs 'template' and 'variable'"))
        return None
    forward = tuple(raw.get("forward", ()))
    for vname in (raw["variable"], *forward):
        if vname not in variables:
            problems.append(Problem(where, "parent", f"names undeclared variable {vname!r}"))
    return Parent(str(raw["template"]), str(raw["variable"]), forward)


def _type_problem(value: Any, vtype: str) -> str:
    """A message if ``value`` is not of declared type ``vtype``, else ''."""
    ok = {
        "str": isinstance(value, str),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "list": isinstance(value, list | tuple) and all(isinstance(x, str) for x in value),
    }[vtype]
    if ok:
        return ""
    shown = "list of strings" if vtype == "list" else vtype
    return f"expected {shown}, got {type(value).__name__} {value!r}"


def check_vars(name: str, values: dict[str, Any]) -> list[str]:
    """Check ``values`` against template ``name``: one message per unknown variable or bad type."""
    template = load_template(name)
    known = ", ".join(sorted(template.variables))
    messages: list[str] = []
    for key, value in values.items():
        var = template.variables.get(key)
        if var is None:
            messages.append(f"unknown template variable {key!r} for {name}; known: {known}")
            continue
        problem = _type_problem(value, var.type)
        if problem:
            messages.append(f"template variable {key!r} for {name}: {problem}")
    return messages


def coerce_set(name: str, assignments: list[str]) -> dict[str, Any]:
    """Parse ``--set KEY=VALUE`` strings by each variable's declared type.

    ``bool`` takes true/false/yes/no/1/0/on/off; ``list`` takes comma-separated items (an empty
    value is an empty list). Every problem is reported at once as a :class:`ConfigError`.
    """
    template = load_template(name)
    known = ", ".join(sorted(template.variables))
    values: dict[str, Any] = {}
    problems: list[Problem] = []
    for item in assignments:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(Problem("--set", item, "expected KEY=VALUE"))
            continue
        var = template.variables.get(key)
        if var is None:
            problems.append(
                Problem("--set", key, f"unknown template variable for {name}; known: {known}")
            )
            continue
        try:
            values[key] = _coerce(text, var.type)
        except ValueError as exc:
            problems.append(Problem("--set", key, str(exc)))
    if problems:
        raise ConfigError(problems)
    return values


def _coerce(text: str, vtype: str) -> Any:
    if vtype == "int":
        try:
            return int(text.strip())
        except ValueError:
            raise ValueError(f"expected an integer, got {text!r}") from None
    if vtype == "bool":
        low = text.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(f"expected true/false, got {text!r}")
    if vtype == "list":
        return [part.strip() for part in text.split(",") if part.strip()]
    return text


def resolve_vars(name: str, values: dict[str, Any] | None = None) -> dict[str, Any]:
    """Defaults of template ``name`` overlaid with ``values``; raises ConfigError on bad values."""
    template = load_template(name)
    values = dict(values or {})
    messages = check_vars(name, values)
    if messages:
        raise ConfigError([Problem(f"images/{name}", "variables", m) for m in messages])
    resolved = template.defaults()
    resolved.update({k: list(v) if isinstance(v, tuple) else v for k, v in values.items()})
    return resolved


@functools.cache
def _jinja_env() -> jinja2.Environment:
    import jinja2  # only when rendering: planning a matrix never needs it

    return jinja2.Environment(
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def _render_string(template: Template, source: str, context: dict[str, Any], what: str) -> str:
    import jinja2

    try:
        return _jinja_env().from_string(source).render(context)
    except jinja2.UndefinedError as exc:
        raise BuildError(
            f"template {template.name}: {what} uses an undefined variable ({exc.message}); "
            f"declare it in {template.directory / 'template.toml'}"
        ) from exc
    except jinja2.TemplateError as exc:
        raise BuildError(f"template {template.name}: cannot render {what}: {exc}") from exc


def _file_context_name(path_value: str) -> str:
    """The name a file variable's file gets in the build context."""
    return Path(path_value).name


def template_context(name: str, values: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything the template sees: resolved variables, ``base`` and ``template_name``.

    File variables are replaced by the file's name inside the build context.
    """
    template = load_template(name)
    resolved = resolve_vars(name, values)
    context = dict(resolved)
    for var in template.variables.values():
        if var.file:
            context[var.name] = _file_context_name(resolved[var.name])
    context["template_name"] = name
    context["base"] = base_image_ref(name, resolved).strip()
    return context


def base_image_ref(name: str, values: dict[str, Any] | None = None) -> str:
    """The image template ``name`` builds FROM, for the given (unresolved or resolved) values."""
    template = load_template(name)
    resolved = resolve_vars(name, values)
    ref = _render_string(template, template.base, resolved, "'base'").strip()
    if not ref:
        hint = ""
        if template.parent:
            hint = f" (set {template.parent.variable}, or let the build resolve the parent image)"
        raise BuildError(f"template {name}: empty base image reference{hint}")
    return ref


def render_text(name: str, values: dict[str, Any] | None = None) -> str:
    """Render template ``name`` with ``values`` over its defaults. Pure: text in, text out."""
    template = load_template(name)
    context = template_context(name, values)
    return _render_string(template, template.text, context, template.template_file)


def _iter_tree(root: Path) -> list[Path]:
    files = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part in _IGNORED_PARTS for part in rel.parts) or path.suffix in _IGNORED_SUFFIXES:
            continue
        if path.is_file():
            files.append(path)
    return files


def context_files(
    name: str, values: dict[str, Any] | None = None, *, workload_dir: Path | None = None
) -> dict[str, bytes]:
    """Every file of the build context, relative path -> bytes, sorted by path.

    The rendered Dockerfile/definition, ``workload/**`` (without caches) and file variables.
    A missing workload directory or file variable is a :class:`ConfigError`.
    """
    template = load_template(name)
    resolved = resolve_vars(name, values)
    workload = Path(workload_dir) if workload_dir is not None else WORKLOAD_DIR
    if not workload.is_dir():
        raise ConfigError("workload directory does not exist", file=str(workload))
    files: dict[str, bytes] = {template.output_name: render_text(name, values).encode()}
    for path in _iter_tree(workload):
        rel = path.relative_to(workload).as_posix()
        files[f"workload/{rel}"] = path.read_bytes()
    problems = []
    for var in template.variables.values():
        if not var.file:
            continue
        source = Path(resolved[var.name]).expanduser()
        if not source.is_file():
            problems.append(
                Problem("--set", var.name, f"file {str(source)!r} not found ({var.description})")
            )
            continue
        files[_file_context_name(resolved[var.name])] = source.read_bytes()
    if problems:
        raise ConfigError(problems)
    return dict(sorted(files.items()))


def render_context(
    name: str,
    values: dict[str, Any] | None,
    out_dir: Path | str,
    *,
    workload_dir: Path | None = None,
) -> Path:
    """Write the build context of template ``name`` into ``out_dir``; return the rendered file."""
    files = context_files(name, values, workload_dir=workload_dir)
    write_context(files, out_dir)
    log.debug("rendered %s into %s (%d files)", name, out_dir, len(files))
    return Path(out_dir) / load_template(name).output_name


def write_context(files: dict[str, bytes], out_dir: Path | str) -> None:
    """Write a build context (relative path -> bytes) into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
