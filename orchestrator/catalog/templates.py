"""Image templates: Jinja2 Dockerfiles and Singularity definitions under ``images/<name>/``.

Each template directory holds a ``template.toml`` manifest and the template file::

    description = "..."
    kind = "dockerfile"            # or "singularity"
    template = "Dockerfile.j2"
    base = "{{ base_image or 'nvcr.io/nvidia/pytorch:' ~ base_tag }}"   # the FROM image

    [parent]                       # optional: built on another template's image
    template = "ngc-pytorch"
    variable = "parent_image"      # empty value = use the parent's content-hash tag
    forward = ["base_tag"]         # variables handed to the parent; declared by the parent
                                   # (inherited here, same type and default) unless redeclared

    [variables.base_tag]
    type = "str"                   # str | int | bool | list (of strings)
    kind = "image_tag"             # what the string (each item of a list) is: see KINDS below
    pattern = "[0-9]{2}\\.[0-9]{2}-py3"   # optional: a regex the whole value must match too
    default = "24.05-py3"
    description = "..."
    file = false                   # true: the value is a host path copied into the build context
                                   # (a file, or a folder with everything under it; "" where
                                   # the default is "": optional, nothing copied)

    [variables.threads]
    type = "int"
    minimum = 0                    # optional bounds of an int
    maximum = 1024

No value reaches a rendered file unvalidated (a newline in a value would add a Dockerfile line;
``;`` or ``$(...)`` in a package name would run in a ``RUN`` line):

* Every ``str`` and ``list`` variable declares a ``kind``; every value (the default too, every
  ``--set``, every ``image_vars`` entry of a matrix) must match the kind's pattern
  (:data:`KIND_PATTERNS`: ``name``, ``image_tag``, ``image_ref``, ``path`` (absolute, in the
  image), ``host_path`` (file variables), ``apt_package``, ``pip_requirement``, ``text``) and the
  variable's own ``pattern``. No kind admits a line break; only ``host_path`` and ``text`` admit
  spaces or quotes. An empty string is accepted only where the default is empty ("not set").
* Templates pass every value that lands in a shell line (``RUN``, ``%environment``,
  ``%runscript``) through the ``shquote`` filter (:func:`shlex.quote`), lists item by item:
  ``{{ apt_packages | map("shquote") | join(" ") }}``. A package pattern also refuses a
  leading ``-``, so no value becomes an option of apt-get or pip.
* The rendered base image must be a valid image reference; a file variable enters the context
  under a sanitized name (letters, digits, ``. _ + -``) that cannot replace the context's own files.

A loaded :class:`Template` resolves values, renders and lists its build context (the rendered
file, the repository's ``workload/`` and any file variables); the module functions taking a
template name do the same for one call. :func:`write_context` writes a context to disk.
"""

from __future__ import annotations

import difflib
import errno
import functools
import logging
import os
import re
import secrets
import shlex
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from orchestrator import REPO_ROOT
from orchestrator.config.files import (
    StrictModel,
    problems_from_validation,
    read_config_text,
    read_toml,
)
from orchestrator.errors import BuildError, ConfigError, Problem, Requirement

if TYPE_CHECKING:
    import jinja2

log = logging.getLogger(__name__)

#: Where the template directories live; tests may point this elsewhere.
IMAGES_DIR = REPO_ROOT / "images"
#: The workload package copied into every image.
WORKLOAD_DIR = REPO_ROOT / "workload"
#: Requirement lines that can no longer resolve and their working equivalent (see the file).
REWRITES_FILE = Path(__file__).resolve().parents[1] / "data" / "requirement_rewrites.toml"
#: The rewritten copy of a program's requirements file, in the build context.
REWRITTEN_REQUIREMENTS = "orchestrate-requirements.txt"

KINDS = {"dockerfile": "Dockerfile", "singularity": "Singularity.def"}
_IGNORED_PARTS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".git"}
_IGNORED_SUFFIXES = {".pyc", ".pyo"}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST_PART = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
# a registry has a dot or a port, or is localhost (else Docker reads it as a path component)
_DOMAIN = (rf"(?:{_HOST_PART}(?:\.{_HOST_PART})+(?::[0-9]{{1,5}})?|{_HOST_PART}:[0-9]{{1,5}}"
           r"|localhost)")
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
#: An image reference as Docker's grammar has it: [registry[:port]/]path[:tag][@sha256:digest].
IMAGE_REF = (rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::{_TAG})?"
             r"(?:@sha256:[a-f0-9]{64})?")
_PIP_SPEC = r"(?:===|==|!=|~=|<=|>=|<|>)[A-Za-z0-9.*+!_-]+"

#: What a value of each kind may look like (the whole value must match; none admits a line break).
KIND_PATTERNS: dict[str, str] = {
    "name": r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}",
    "image_tag": _TAG,
    "image_ref": IMAGE_REF,
    "path": r"/[A-Za-z0-9._+@%,:/-]{0,4095}",
    "host_path": r"[^\x00-\x1f\x7f]{1,4096}",
    "apt_package": r"[a-z0-9][a-z0-9+.-]+(?::[a-z0-9-]+)?(?:=[A-Za-z0-9.+~:-]+)?",
    "pip_requirement": (r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
                        r"(?:\[[A-Za-z0-9._-]+(?:,[A-Za-z0-9._-]+)*\])?"
                        rf"(?:{_PIP_SPEC}(?:,{_PIP_SPEC})*)?"),
    "text": r"[^\x00-\x1f\x7f]{0,1024}",
}
#: What each kind means, for messages.
KIND_HELP: dict[str, str] = {
    "name": "letters, digits and . _ + -, starting with a letter or digit",
    "image_tag": "an image tag: letters, digits and _ . -, at most 128 characters",
    "image_ref": "an image reference such as registry.lab:5000/nvidia/pytorch:24.05-py3",
    "path": "an absolute path of letters, digits and . _ + @ % , : / - (no spaces or quotes)",
    "host_path": "a path on this machine, one line",
    "apt_package": "a Debian package name, optionally :arch and =version",
    "pip_requirement": "a package name with optional [extras] and version specifiers, "
    "e.g. numpy<2 (no URLs, no options)",
    "text": "one line of printable text",
}
Kind = Literal[
    "name", "image_tag", "image_ref", "path", "host_path", "apt_package", "pip_requirement", "text"
]
#: Most items of a list variable.
MAX_LIST_ITEMS = 256
#: Names a file variable's file may not take in the build context (they are the context's own).
_RESERVED_CONTEXT_NAMES = {*KINDS.values(), "workload", ".dockerignore"}


class Variable(StrictModel):
    """One declared template variable (a ``[variables.NAME]`` table)."""

    #: Not strict, unlike the other user-file models: a manifest's numbers and flags have always
    #: been coerced (``minimum = "4"``, ``file = 1``, ``forward`` as a TOML array into a tuple);
    #: strictness would refuse manifests accepted today.
    model_config = ConfigDict(strict=False)

    type: Literal["str", "int", "bool", "list"]
    default: Any = Field(description="value used when a profile or --set gives none")
    description: str = ""
    file: bool = Field(False, description="the value is a host path copied into the context")
    kind: Kind | None = Field(
        None, description="what a str value / each list item is (required for str and list)"
    )
    pattern: str | None = Field(None, description="a regex the whole value must also match")
    minimum: int | None = Field(None, description="smallest value of an int")
    maximum: int | None = Field(None, description="largest value of an int")

    @field_validator("default")
    @classmethod
    def _default_has_the_type(cls, value: Any, info: ValidationInfo) -> Any:
        vtype = info.data.get("type")  # absent when the type itself was invalid
        problem = _type_problem(value, vtype) if vtype else ""
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("pattern")
    @classmethod
    def _pattern_compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return value

    @model_validator(mode="after")
    def _kind_fits_the_type(self) -> Variable:
        if self.type in ("str", "list") and self.kind is None:
            kinds = ", ".join(KIND_PATTERNS)
            raise ValueError(f"a {self.type} variable needs a kind: one of {kinds}")
        if self.type in ("int", "bool") and (self.kind or self.pattern):
            raise ValueError(f"kind and pattern apply to str and list variables, not {self.type}")
        if self.type != "int" and (self.minimum is not None or self.maximum is not None):
            raise ValueError("minimum and maximum apply to int variables")
        if self.file and (self.type != "str" or self.kind != "host_path"):
            raise ValueError('a file variable has type = "str" and kind = "host_path"')
        problem = self.value_problem(self.default)
        if problem:
            raise ValueError(f"default: {problem}")
        return self

    def value_problem(self, value: Any) -> str:
        """Why ``value`` is not a valid value of this variable ('' if it is)."""
        problem = _type_problem(value, self.type)
        if problem:
            return problem
        if self.type == "int":
            if self.minimum is not None and value < self.minimum:
                return f"{value} is less than the minimum {self.minimum}"
            if self.maximum is not None and value > self.maximum:
                return f"{value} is more than the maximum {self.maximum}"
            return ""
        if self.type == "str":
            if value == "" and self.default == "":
                return ""  # not set
            return self._item_problem(value)
        if self.type == "list":
            if len(value) > MAX_LIST_ITEMS:
                return f"at most {MAX_LIST_ITEMS} items, got {len(value)}"
            for item in value:
                problem = self._item_problem(item)
                if problem:
                    return f"item {problem}"
        return ""

    def _item_problem(self, value: str) -> str:
        assert self.kind is not None
        if len(value) > 4096 or not re.fullmatch(KIND_PATTERNS[self.kind], value):
            return f"{value!r} is not a valid {self.kind} ({KIND_HELP[self.kind]})"
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            return f"{value!r} does not match the pattern {self.pattern!r}"
        if self.file and _file_context_name(value) in _RESERVED_CONTEXT_NAMES:
            return (f"{value!r}: a file called {_file_context_name(value)!r} would replace the "
                    "build context's own; rename it")
        return ""


class Parent(StrictModel):
    """The template whose image another template is built on (the ``[parent]`` table)."""

    #: Not strict, unlike the other user-file models: a manifest's numbers and flags have always
    #: been coerced (``minimum = "4"``, ``file = 1``, ``forward`` as a TOML array into a tuple);
    #: strictness would refuse manifests accepted today.
    model_config = ConfigDict(strict=False)

    template: str = Field(min_length=1)
    variable: str = Field(min_length=1, description="variable that receives the parent's image")
    forward: tuple[str, ...] = Field((), description="variables handed on to the parent")


class Manifest(StrictModel):
    """A ``template.toml``; validated with the template's directory as context."""

    #: Not strict, unlike the other user-file models: a manifest's numbers and flags have always
    #: been coerced (``minimum = "4"``, ``file = 1``, ``forward`` as a TOML array into a tuple);
    #: strictness would refuse manifests accepted today.
    model_config = ConfigDict(strict=False)

    description: str = ""
    kind: Literal["dockerfile", "singularity"]
    template: str = Field(description="the template file, next to the manifest")
    base: str = Field("", description="Jinja expression of the image built FROM")
    parent: Parent | None = None
    variables: dict[str, Variable] = Field(default_factory=dict)

    @field_validator("template")
    @classmethod
    def _template_file_exists(cls, value: str, info: ValidationInfo) -> str:
        directory = (info.context or {}).get("directory")
        if directory is not None and not (Path(directory) / value).is_file():
            raise ValueError(f"no template file {value!r} in {directory}")
        return value

    @model_validator(mode="after")
    def _parent_variable_declared(self) -> Manifest:
        if self.parent and self.parent.variable not in self.variables:
            raise ValueError(f"[parent] variable {self.parent.variable!r} is not declared")
        return self


@dataclass(frozen=True)
class Template:
    """A loaded template: its name, directory, manifest and template text."""

    name: str
    directory: Path
    manifest: Manifest
    text: str

    @property
    def description(self) -> str:
        return self.manifest.description

    @property
    def kind(self) -> str:
        return self.manifest.kind

    @property
    def template_file(self) -> str:
        return self.manifest.template

    @property
    def base(self) -> str:
        return self.manifest.base

    @property
    def variables(self) -> dict[str, Variable]:
        return self.manifest.variables

    @property
    def parent(self) -> Parent | None:
        return self.manifest.parent

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

    def check(self, values: dict[str, Any]) -> list[str]:
        """One message per unknown variable or invalid value (type, kind, pattern, range)."""
        known = ", ".join(sorted(self.variables))
        messages: list[str] = []
        for key, value in values.items():
            var = self.variables.get(key)
            if var is None:
                messages.append(f"unknown template variable {key!r} for {self.name}"
                                f"{self._guess(key)}; known: {known}")
                continue
            problem = var.value_problem(list(value) if isinstance(value, tuple) else value)
            if problem:
                messages.append(f"template variable {key!r} for {self.name}: {problem}")
        return messages

    def _guess(self, key: str) -> str:
        """`` (did you mean 'base_tag'?)`` for a misspelt variable name, else nothing."""
        close = difflib.get_close_matches(key, list(self.variables), n=1, cutoff=0.6)
        return f" (did you mean {close[0]!r}?)" if close else ""

    def coerce(self, assignments: list[str]) -> dict[str, Any]:
        """Parse ``--set KEY=VALUE`` strings by each variable's declared type.

        ``bool`` takes true/false/yes/no/1/0/on/off; ``list`` takes comma-separated items (an
        empty value is an empty list). Every problem is reported at once as a ConfigError.
        """
        known = ", ".join(sorted(self.variables))
        values: dict[str, Any] = {}
        problems: list[Problem] = []
        for item in assignments:
            key, sep, text = item.partition("=")
            key = key.strip()
            if not sep or not key:
                problems.append(Problem("--set", item, "expected KEY=VALUE"))
                continue
            var = self.variables.get(key)
            if var is None:
                message = (f"unknown template variable for {self.name}{self._guess(key)}; "
                           f"known: {known}")
                problems.append(Problem("--set", key, message))
                continue
            try:
                value = _coerce(text, var.type)
            except ValueError as exc:
                problems.append(Problem("--set", key, str(exc)))
                continue
            problem = var.value_problem(value)
            if problem:
                problems.append(Problem("--set", key, problem))
            else:
                values[key] = value
        if problems:
            raise ConfigError(problems)
        return values

    def resolve(self, values: dict[str, Any] | None = None) -> dict[str, Any]:
        """The defaults overlaid with ``values``; ConfigError on unknown or mistyped values."""
        values = dict(values or {})
        messages = self.check(values)
        if messages:
            raise ConfigError([Problem(f"images/{self.name}", "variables", m) for m in messages])
        resolved = self.defaults()
        resolved.update({k: list(v) if isinstance(v, tuple) else v for k, v in values.items()})
        return resolved

    def base_ref(self, resolved: dict[str, Any]) -> str:
        """The image this template builds FROM, for resolved values."""
        ref = _render_string(self, self.base, resolved, "'base'").strip()
        if not ref:
            hint = ""
            if self.parent:
                hint = f" (set {self.parent.variable}, or let the build resolve the parent image)"
            raise BuildError(f"template {self.name}: empty base image reference{hint}")
        if len(ref) > 512 or not re.fullmatch(IMAGE_REF, ref):
            raise ConfigError([Problem(
                f"images/{self.name}", "base",
                f"the base image {ref!r} is not a valid image reference; check the variables",
            )])
        return ref

    def context(self, resolved: dict[str, Any]) -> dict[str, Any]:
        """Everything the template sees: resolved variables, ``base`` and ``template_name``.

        File variables are replaced by the file's name inside the build context.
        """
        context = dict(resolved)
        for vname, var in self.variables.items():
            if var.file:  # "" stays "": an optional file or folder that is not set
                context[vname] = _file_context_name(resolved[vname]) if resolved[vname] else ""
        context["template_name"] = self.name
        context["base"] = self.base_ref(resolved)
        rewritten = self.rewritten_requirements(resolved)
        context["requirements_rewritten"] = [f"{old} -> {new}" for old, new in
                                             (rewritten[1] if rewritten else [])]
        context["requirements_copy"] = REWRITTEN_REQUIREMENTS
        return context

    def rewritten_requirements(self, resolved: dict[str, Any]
                               ) -> tuple[bytes, list[tuple[str, str]]] | None:
        """A template that installs a program's requirements file (``program_dir`` and
        ``requirements``): the file with every line that can no longer resolve rewritten
        (:data:`REWRITES_FILE`) and the (old, new) lines; None when no line is rewritten or
        there is no such file."""
        if not {"program_dir", "requirements"} <= set(self.variables):
            return None
        if not resolved.get("requirements") or not resolved.get("program_dir"):
            return None
        path = Path(resolved["program_dir"]).expanduser() / resolved["requirements"]
        if not path.is_file():
            return None
        text = path.read_text(encoding="utf-8", errors="replace")
        out, changed = [], []
        for line in text.splitlines():
            new = rewrite_requirement(line)
            if new != line:
                changed.append((line.strip(), new.strip()))
            out.append(new)
        if not changed:
            return None
        return ("\n".join(out) + "\n").encode(), changed

    def render(self, resolved: dict[str, Any]) -> str:
        """The rendered Dockerfile / definition for resolved values."""
        return _render_string(self, self.text, self.context(resolved), self.template_file)

    def files(
        self, resolved: dict[str, Any], *, workload_dir: Path | None = None
    ) -> dict[str, bytes]:
        """Every file of the build context, relative path -> bytes, sorted by path.

        The rendered Dockerfile/definition, ``workload/**`` (without caches) and file
        variables. A missing workload directory or file variable is a ConfigError.
        """
        workload = Path(workload_dir) if workload_dir is not None else WORKLOAD_DIR
        if not workload.is_dir():
            raise ConfigError("workload directory does not exist", file=str(workload))
        files: dict[str, bytes] = {self.output_name: self.render(resolved).encode()}
        for path in _iter_tree(workload):
            files[f"workload/{path.relative_to(workload).as_posix()}"] = _read_file(path)
        problems = []
        for vname, var in self.variables.items():
            if not var.file or (resolved[vname] == "" and var.default == ""):
                continue  # not a file variable, or an optional one that is not set
            source = Path(resolved[vname]).expanduser()
            name = _file_context_name(resolved[vname])
            if source.is_dir():  # a folder (a lab's checkout): every file under it
                for path in _iter_tree(source):
                    files[f"{name}/{path.relative_to(source).as_posix()}"] = _read_file(path)
                continue
            if not source.is_file():  # a fact of this machine (the build's), not of the file
                kind = "checkout" if "checkout" in var.description else "build file"
                problems.append(Requirement("--set", vname, f"file or folder {str(source)!r} not "
                                                            f"found ({var.description})",
                                            kind=kind))
                continue
            files[name] = _read_file(source)
        if problems:
            raise ConfigError(problems)
        rewritten = self.rewritten_requirements(resolved)
        if rewritten is not None:
            files[REWRITTEN_REQUIREMENTS] = rewritten[0]
        return dict(sorted(files.items()))


@functools.cache
def requirement_rewrites() -> tuple[tuple[str, str, str], ...]:
    """(prefix, replacement, reason) of every rule in :data:`REWRITES_FILE`."""
    import tomllib

    data = tomllib.loads(REWRITES_FILE.read_text(encoding="utf-8"))
    return tuple((r["prefix"], r["replacement"], r["reason"]) for r in data.get("rule", []))


def rewrite_requirement(line: str) -> str:
    """A requirements-file line with the first matching rule applied (leading blanks kept)."""
    stripped = line.lstrip()
    for prefix, replacement, _ in requirement_rewrites():
        if stripped.startswith(prefix):
            return line[:len(line) - len(stripped)] + replacement + stripped[len(prefix):]
    return line


def template_names() -> list[str]:
    """Names of the templates available under :data:`IMAGES_DIR`, sorted."""
    if not IMAGES_DIR.is_dir():
        return []
    return sorted(p.name for p in IMAGES_DIR.iterdir() if (p / "template.toml").is_file())


def load_template(name: str) -> Template:
    """Load and validate template ``name``; an unknown name lists the known ones.

    Loaded once per process and file version (the helpers below each ask for it).
    """
    names = template_names()
    if name not in names:
        raise ConfigError(
            f"unknown image template {name!r}; known: {', '.join(names) or '(none)'}",
            file=str(IMAGES_DIR),
        )
    loading: list[str] = _loading.__dict__.setdefault("names", [])
    if name in loading:
        chain = " -> ".join([*loading, name])
        where = str(IMAGES_DIR / name / "template.toml")
        raise ConfigError([Problem(where, "parent.template", f"cycle: {chain}")])
    loading.append(name)
    try:
        return _load_template(name, IMAGES_DIR / name, _stamps(IMAGES_DIR))
    finally:
        loading.pop()


#: Templates being loaded on each thread's call stack (a parent cycle would never end).
_loading = threading.local()


def _stamps(root: Path) -> tuple[tuple[str, int, int], ...]:
    """(path, mtime, size) of every file under ``root``: a change anywhere (a child inherits
    from its parent's manifest) loads the templates again."""
    out = []
    for path in sorted(root.rglob("*")):
        try:
            st = path.stat()
        except OSError:  # gone since the listing (an editor's temporary file)
            continue
        if stat.S_ISREG(st.st_mode):
            out.append((str(path), st.st_mtime_ns, st.st_size))
    return tuple(out)


@functools.lru_cache(maxsize=64)
def _load_template(name: str, directory: Path, stamps: tuple[Any, ...]) -> Template:
    manifest_path = directory / "template.toml"
    raw = read_toml(manifest_path)
    try:
        manifest = Manifest.model_validate(raw, context={"directory": directory})
    except ValidationError as exc:
        hint = "the keys are described at the top of orchestrator/catalog/templates.py"
        raise ConfigError(
            problems_from_validation(str(manifest_path), exc, hint, model=Manifest)
        ) from None
    if manifest.parent:
        manifest = _inherit(manifest, manifest.parent, str(manifest_path))
    text = read_config_text(directory / manifest.template)
    return Template(name=name, directory=directory, manifest=manifest, text=text)


def _inherit(manifest: Manifest, parent: Parent, where: str) -> Manifest:
    """The manifest with the forwarded variables it does not declare taken from the parent."""
    if parent.template not in template_names():
        raise ConfigError([Problem(where, "parent.template", f"no template {parent.template!r}")])
    declared = load_template(parent.template).variables
    inherited: dict[str, Variable] = {}
    problems = []
    for vname in parent.forward:
        if vname in manifest.variables:
            continue
        if vname not in declared:
            problems.append(
                Problem(where, "parent.forward", f"{parent.template} declares no {vname!r}")
            )
            continue
        var = declared[vname]
        inherited[vname] = var.model_copy(
            update={"description": f"forwarded to {parent.template}: {var.description}"}
        )
    if problems:
        raise ConfigError(problems)
    return manifest.model_copy(update={"variables": {**manifest.variables, **inherited}})


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
    return load_template(name).check(values)


def coerce_set(name: str, assignments: list[str]) -> dict[str, Any]:
    """Parse ``--set KEY=VALUE`` strings by template ``name``'s declared types."""
    return load_template(name).coerce(assignments)


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


@functools.cache
def _jinja_env() -> jinja2.Environment:
    import jinja2  # only when rendering: planning a matrix never needs it

    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["shquote"] = shquote
    env.filters["labelquote"] = labelquote
    return env


def labelquote(value: Any) -> str:
    """A Dockerfile ``LABEL`` value: double-quoted, with ``\\``, ``"`` and ``$`` escaped (the
    builder expands variables in LABEL)."""
    text = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'"{text}"'


def shquote(value: Any) -> str:
    """The ``shquote`` template filter: ``value`` as one shell word (:func:`shlex.quote`)."""
    return shlex.quote(str(value))


@functools.lru_cache(maxsize=256)
def _compiled(source: str) -> jinja2.Template:
    """``source`` compiled once per process (compiling costs ~50 times a render)."""
    return _jinja_env().from_string(source)


def _render_string(template: Template, source: str, context: dict[str, Any], what: str) -> str:
    import jinja2

    try:
        return _compiled(source).render(context)
    except jinja2.UndefinedError as exc:
        raise BuildError(
            f"template {template.name}: {what} uses an undefined variable ({exc.message}); "
            f"declare it in {template.directory / 'template.toml'}"
        ) from exc
    except jinja2.TemplateError as exc:
        raise BuildError(f"template {template.name}: cannot render {what}: {exc}") from exc


def _file_context_name(path_value: str) -> str:
    """The name a file variable's file gets in the build context: its file name with anything
    but letters, digits and ``. _ + -`` replaced by ``_`` (it lands in a COPY line)."""
    name = re.sub(r"[^A-Za-z0-9._+-]", "_", Path(path_value).name)
    return name if name.strip(".") else f"_{name}"


def _iter_tree(root: Path) -> list[Path]:
    files = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part in _IGNORED_PARTS for part in rel.parts) or path.suffix in _IGNORED_SUFFIXES:
            continue
        if path.is_file():
            files.append(path)
    return files


class FileData(bytes):
    """A context file's bytes and the permission bits of the file it was read from (a file
    variable's, a workload script's), which :func:`write_context` gives the written file."""

    mode: int

    def __new__(cls, data: bytes, mode: int) -> FileData:
        obj = super().__new__(cls, data)
        obj.mode = mode & 0o777
        return obj


def _read_file(path: Path) -> FileData:
    return FileData(path.read_bytes(), path.stat().st_mode)


def write_context(files: dict[str, bytes], out_dir: Path | str) -> None:
    """Write a build context (relative path -> bytes) into ``out_dir``.

    Never through a symbolic link: a folder on the way that is one is an OSError (ELOOP), and
    each file is written to a temporary name beside it and renamed over the old one (a link
    named ``Dockerfile`` is replaced, its target untouched). A file read from disk keeps its
    permission bits (:class:`FileData`); the others follow the umask."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        target = out / rel
        _make_folders(out, target.parent)
        tmp = target.parent / f".{target.name}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                if isinstance(data, FileData):
                    os.fchmod(fh.fileno(), data.mode)
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def _make_folders(out: Path, folder: Path) -> None:
    """``folder`` and the folders between ``out`` and it, made where missing; an OSError when
    one of them is a symbolic link (it may lead anywhere)."""
    path = out
    for part in folder.relative_to(out).parts:
        path = path / part
        if path.is_symlink():
            raise OSError(errno.ELOOP, "a symbolic link on the way; not followed", str(path))
        path.mkdir(exist_ok=True)
