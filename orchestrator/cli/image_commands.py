"""``orchestrate images``: list, render, build the image templates; refresh a lab's templates.

``images refresh --hosts HOSTS.toml [MATRIX ...]`` is the nightly rebuild step
(:mod:`orchestrator.images.refresh`): it prints, per host, its driver (and how it changed since the
last
build recorded), then each image: rebuilt and why (driver old -> new, release old -> new, base),
up to date, or not built there and why; and a last line with the counts ("nothing changed: ..."
on a run that built nothing). Exit 0 when every host was reached and every image is up to date
or built, 1 otherwise."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from orchestrator.catalog import templates
from orchestrator.catalog.releases import Release, resolve_habana, resolve_release
from orchestrator.cli import options
from orchestrator.cli.pull_bars import PullBars
from orchestrator.config.syntax import plural
from orchestrator.errors import BackendUnavailable, ConfigError, cannot_write
from orchestrator.images import build
from orchestrator.plan.selection import family

if TYPE_CHECKING:
    from orchestrator.images.refresh import ImageRefresh, PlannedHost, RefreshReport

log = logging.getLogger(__name__)


def _template_name(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="template name (see `orchestrate images list`)")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``images list|render|build|refresh`` to the CLI."""
    parser = subparsers.add_parser("images", help="list, render and build image templates")
    sub = parser.add_subparsers(dest="images_command", metavar="ACTION")
    sub.required = True

    p_list = sub.add_parser("list", help="templates, their variables and local image tags")
    p_list.set_defaults(handler=cmd_list)

    p_render = sub.add_parser("render", help="write a template's build context to a directory")
    _template_name(p_render)
    _add_set(p_render)
    p_render.add_argument("--out", required=True, type=Path, metavar="DIR",
                          help="directory to write into (created if missing)")
    p_render.set_defaults(handler=cmd_render)

    p_build = sub.add_parser(
        "build", help="build a template's image unless its tag exists",
        description="Build a template's image, tagged orchestrate/NAME:<content hash> (the hash "
        "of the exact build context, base pinned to its digest or image ID): an unchanged "
        "template is never rebuilt. --driver / --driver-from pick the newest NGC release a "
        "driver runs; --sif makes an Apptainer image (.sif) of it; --dry-run shows the plan.")
    _template_name(p_build)
    _add_set(p_build)
    p_build.add_argument(
        "--driver",
        metavar="VERSION",
        help="NVIDIA driver of the target hosts: pick the newest NGC release it supports",
    )
    p_build.add_argument(
        "--driver-from",
        metavar="HOST",
        help="read the driver from this inventory host over SSH (needs --hosts)",
    )
    options.hosts(p_build, "hosts inventory for --driver-from")
    p_build.add_argument(
        "--datacenter",
        action="store_true",
        help="with --driver: also allow releases reachable through CUDA forward compatibility",
    )
    p_build.add_argument(
        "--gpu", metavar="MODEL",
        help="with --driver: the target GPU (e.g. V100), so no release that dropped its "
        "architecture is picked (--driver-from reads it from the host)",
    )
    options.dry_run(p_build, "print base image, release and tag; build nothing")
    p_build.add_argument(
        "--sif", action="store_true",
        help="make an Apptainer/Singularity .sif (implied for the singularity template; a "
        "Dockerfile template's image is built, then converted from docker-daemon://)",
    )
    p_build.add_argument(
        "--apptainer", metavar="BINARY",
        help="the runtime's program for --sif (default: apptainer, else singularity, on PATH)",
    )
    p_build.add_argument(
        "--sif-dir", metavar="DIR",
        help="folder of the .sif files (default: $ORCHESTRATE_SIF_DIR, else "
        "~/.cache/orchestrate/sif)",
    )
    p_build.set_defaults(handler=cmd_build)

    p_refresh = sub.add_parser(
        "refresh",
        help="nightly: rebuild, on every host, the images whose base changed (drivers, releases)",
        description="Probe every host of the inventory over SSH, choose each image's release "
        "from the host's driver as it is now, and build exactly the images whose tag changed "
        "since the last build recorded in <results>/.orchestrate-images.json (which sweeps "
        "write too); print what changed and why. A second run with nothing changed builds "
        "nothing. Without MATRIX files: the images the state records for these hosts.",
    )
    p_refresh.add_argument("matrices", nargs="*", type=Path, metavar="MATRIX",
                           help="matrix files whose images to keep fresh (default: recorded, "
                           "each with the --set its build had)")
    options.set_fields(p_refresh, "set a field of each MATRIX file, as `matrix --set` does "
                       "(repeatable)")
    options.hosts(p_refresh, "the inventory (default: $ORCHESTRATE_HOSTS or the user config)")
    options.host(p_refresh, "only this host (repeat)")
    options.results(p_refresh, "results folder holding the image state (default as `matrix`)")
    options.jobs(p_refresh, "hosts at once (default 8)")
    options.dry_run(p_refresh, "list the hosts it would probe and the images it would check "
                    "there (last builds and drivers from the state); connects to nothing")
    p_refresh.add_argument("--check", action="store_true",
                           help="probe the hosts and compare: say what would be rebuilt and "
                           "why; build nothing, write nothing")
    p_refresh.set_defaults(handler=cmd_refresh)


def _add_set(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        dest="assignments",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a template variable (repeatable; lists are comma-separated)",
    )


def _values(args: argparse.Namespace) -> tuple[dict[str, Any], str | None]:
    """The template variables of ``--set``, with the release ``--driver`` / ``--driver-from``
    picks; and a line saying which release that is (None without a driver)."""
    values = templates.coerce_set(args.name, args.assignments)
    driver = getattr(args, "driver", None)
    host = getattr(args, "driver_from", None)
    gpu = getattr(args, "gpu", None)
    capability = compute_capability(gpu) if gpu else None
    if host:
        if driver:
            raise ConfigError("give either --driver or --driver-from, not both", file="--driver")
        if not args.hosts:
            raise ConfigError("--driver-from needs --hosts HOSTS.toml", file="--driver-from")
        from orchestrator.cli.host_commands import facts_from_host
        from orchestrator.config.inventory import load_hosts
        from orchestrator.plan.selection import HostDriver

        found = HostDriver.from_facts(facts_from_host(load_hosts(args.hosts), host))
        driver, capability = found.driver, capability or found.compute_capability
    if not driver:
        return values, None
    template = templates.load_template(args.name)
    kind = family(template)
    if kind == "habana":
        if {"synapse_version", "torch_version"} & set(values):
            raise ConfigError("give either --driver or --set synapse_version/torch_version, "
                              "not both", file="--driver")
        version, series = resolve_habana(driver)
        values.update(synapse_version=version, torch_version=series.torch)
        return values, f"Intel Gaudi {version} (PyTorch {series.torch}; driver {driver})"
    if kind != "ngc":
        raise ConfigError(
            f"template {args.name} has no base_tag; --driver does not apply", file="--driver"
        )
    if "base_tag" in values:
        raise ConfigError("give either --driver or --set base_tag, not both", file="--driver")
    release = resolve_release(driver, datacenter=getattr(args, "datacenter", False),
                              compute_capability=capability)
    values["base_tag"] = release.base_tag
    return values, _release_line(release)


def _release_line(release: Release) -> str:
    return f"{release.name} (CUDA {release.cuda}, driver >= {release.min_driver})"


def compute_capability(gpu: str) -> str:
    """The compute capability of ``--gpu MODEL``; a ConfigError naming the flag if unknown."""
    from orchestrator.catalog.gpus import compute_capability as lookup
    from orchestrator.catalog.gpus import known_accelerators

    found = lookup(gpu)
    if found is None:
        raise ConfigError(f"unknown GPU {gpu!r} (known: {', '.join(known_accelerators())})",
                          file="--gpu")
    return found


class _Console(Console):
    """rich's Console, but a closed pipe is the CLI's to answer (exit 141, as every command):
    rich's own answer is exit 1 without a word."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError


#: The width of ``images list`` piped (a terminal gets rich tables of its own width).
PIPED_WIDTH = 100


def piped_lines(title: str, rows: list[tuple[str, str, str, str]], local: str,
                width: int = PIPED_WIDTH) -> list[str]:
    """One template as ``images list`` prints it into a pipe, no line wider than ``width``: its
    title, then per variable a line that starts with its name (name, type, default in
    columns: ``grep`` finds it) and its description wrapped under it, then the local tags."""
    import textwrap

    def wrap(text: str, indent: str, first: str | None = None) -> list[str]:
        first = indent if first is None else first
        return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=indent,
                             break_on_hyphens=False) or [first.rstrip()]

    name_w = max((len(r[0]) for r in rows), default=0)
    type_w = max((len(r[1]) for r in rows), default=0)
    out = wrap(title, "    ", "")
    for name, kind, default, description in rows:
        head = f"  {name:<{name_w}}  {kind:<{type_w}}  "
        out += wrap(default, " " * min(len(head), width // 2), head)
        out += wrap(description, "      ")
    return [*out, *wrap(local.strip(), "      ", "  "), ""]


def cmd_list(args: argparse.Namespace) -> int:
    """Print every template with its variables, and local content-hash tags if an engine answers.
    On a terminal: rich tables; piped: :func:`piped_lines` (at most 100 columns, a line per
    variable that starts with its name, its description under it)."""
    console = _Console()
    try:
        tags = build.local_tags()
    except BackendUnavailable as exc:
        tags = None
        log.debug("no engine for `images list`: %s", exc)
    columns = ("variable", "type", "default", "description")
    for name in templates.template_names():
        template = templates.load_template(name)
        title = f"{name} ({template.kind}): {template.description}"
        rows = []
        for vname, var in template.variables.items():
            default = ",".join(var.default) if var.type == "list" else str(var.default)
            suffix = " (file)" if var.file else (f" ({var.kind})" if var.kind else "")
            rows.append((vname, var.type + suffix, default or repr(default), var.description))
        if tags is None:
            local = "  local images: (no Docker engine reachable)"
        else:
            found = tags.get(name, [])
            local = f"  local images: {', '.join(found) if found else '(none)'}"
        if console.is_terminal:
            table = Table(title=title, title_justify="left")
            for column in columns:
                table.add_column(column)
            for row in rows:
                table.add_row(*row)
            console.print(table)
            console.print(local)
            console.print()
        else:
            print("\n".join(piped_lines(title, rows, local)))
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    """Write the build context (Dockerfile or .def, workload/, extra files) to ``--out``."""
    values, _ = _values(args)
    plan = build.plan_image(args.name, values)
    for node in build.plan_chain(plan)[:-1]:
        Console(stderr=True).print(f"[dim]parent image: {node.tag} ({node.template})[/dim]")
    try:
        templates.write_context(plan.files, args.out)
    except OSError as exc:
        raise cannot_write("--out", args.out, exc, "folder") from None
    rendered = args.out / templates.KINDS[plan.kind]
    _Console().print(f"wrote {rendered} (tag would be {plan.tag})", markup=False,
                    highlight=False, soft_wrap=True)
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    """Build the image (and its parents) unless its content-hash tag already exists; the tag
    covers the base's bits on this engine (resolved before the build: the dry run's tag is the
    context's alone)."""
    values, release = _values(args)
    plan = build.plan_image(args.name, values)
    console = _Console()
    if release is not None:
        console.print(f"release:    {release}", markup=False, highlight=False)
    if args.sif or plan.kind == "singularity":
        return _build_sif(args, plan, console)
    for node in build.plan_chain(plan):
        console.print(f"{node.template}:")
        console.print(f"  base image: {node.base_image}", soft_wrap=True)
        if args.dry_run:
            console.print(f"  tag:        {node.tag} (before the base is pinned: the build's tag "
                          "also covers the base image's digest or ID)", soft_wrap=True)
    if args.dry_run:
        return 0
    with console.status(f"building {plan.tag}") as status:
        outcome = build.ensure_image(plan, on_log=_BuildLog(console, status, plan.template))
    step: build.BuildOutcome | None = outcome
    while step is not None:
        pinned = step.plan.base_pin if step.plan is not None else None
        base = f" (base {pinned.ref} = {pinned.identity})" if pinned else ""
        console.print(f"{step.tag}: {step.summary}{base}", markup=False, highlight=False,
                      soft_wrap=True)
        step = step.parent
    return 0


class _BuildLog(PullBars):
    """What ``images build`` shows of a build: each line of its log, the last one in the
    spinner's text; a base image's pull as a bar on a terminal, else a line every few seconds
    (:class:`~orchestrator.cli.pull_bars.PullBars`)."""

    def __init__(self, console: Console, status: Any, template: str) -> None:
        super().__init__(console, pause=status)
        self.status, self.template = status, template

    def __call__(self, line: str) -> None:
        self.console.print(line, style="dim", markup=False, highlight=False, soft_wrap=True)
        self.status.update(f"building {self.template}: {line[:80]}")


def _build_sif(args: argparse.Namespace, plan: build.ImagePlan, console: Console) -> int:
    """``images build --sif``: the .sif of ``plan`` in the image dir, built unless its
    content-hash name is there (:func:`orchestrator.images.sif.ensure_sif`)."""
    from orchestrator.images import sif

    machine = sif.LocalMachine()
    binary = args.apptainer or next(
        (b for b in ("apptainer", "singularity") if machine.which(b)), "apptainer")
    target = sif.plan_sif(plan, binary=binary, directory=args.sif_dir)
    console.print(f"{plan.template}: {target.source} -> {machine.expand(target.path)}",
                  markup=False, highlight=False, soft_wrap=True)
    if args.dry_run:
        console.print(f"  base image: {plan.base_image}; build: "
                      f"{' '.join(target.build_argv('OUT.sif'))}", markup=False,
                      highlight=False, soft_wrap=True)
        return 0
    if machine.which(binary) is None:
        raise ConfigError(f"{binary!r} is not on PATH: install Apptainer (or SingularityCE), "
                          "or name its program", field="--apptainer")

    def on_log(line: str) -> None:
        console.print(line, style="dim", markup=False, highlight=False, soft_wrap=True)

    outcome = sif.ensure_sif(target, machine, on_log)
    console.print(f"{outcome.path}: {outcome.summary}", markup=False, highlight=False,
                  soft_wrap=True)
    return 0


def cmd_refresh(args: argparse.Namespace) -> int:
    """Rebuild, host by host, the images whose base changed; print what changed and why."""
    from orchestrator.config.defaults import hosts_file, results_root
    from orchestrator.config.inventory import load_hosts
    from orchestrator.images.refresh import refresh
    from orchestrator.plan.matrix import load_matrix

    inventory_file = hosts_file(args.hosts)
    if inventory_file is None:
        raise ConfigError("give the inventory: --hosts HOSTS.toml (or $ORCHESTRATE_HOSTS, or "
                          "hosts in the user config)", file="--hosts")
    inventory = load_hosts(inventory_file)
    if args.overrides and not args.matrices:
        raise ConfigError("--set sets a field of the MATRIX files named; without them the "
                          "recorded builds' own --set are used", field="--set")
    matrices = [load_matrix(path, overrides=args.overrides) for path in args.matrices]
    if args.jobs < 1:
        raise ConfigError("must be at least 1", field="--jobs")
    if args.dry_run:
        from orchestrator.images.refresh import plan_refresh

        planned, notes = plan_refresh(inventory, matrices, results_root(args.results),
                                      hosts=args.host)
        print("\n".join(planned_lines(planned, notes)))
        return 0
    report = refresh(inventory, matrices, results_root(args.results), hosts=args.host,
                     dry_run=args.check, jobs=args.jobs,
                     on_log=lambda line: log.info("%s", line))
    print("\n".join(refresh_lines(report, dry_run=args.check)))
    return 0 if report.ok else 1


def planned_lines(planned: list[PlannedHost], notes: list[str]) -> list[str]:
    """``images refresh --dry-run`` as the CLI prints it (pure)."""
    lines = []
    for host in planned:
        seen = f"driver {host.last_driver} when last probed" if host.last_driver else (
            "never probed")
        lines.append(f"{host.host} ({host.address}, {seen}): would probe its driver and check "
                     f"{plural(len(host.images), 'image')}")
        for name, old in host.images:
            last = (f"last built {old.tag} (release {old.ngc_release or old.release or '-'}, "
                    f"driver {old.driver or '-'})" if old else "no build recorded")
            lines.append(f"  {name}: {last}")
    lines += [f"note: {n}" for n in notes]
    images = sum(len(h.images) for h in planned)
    lines.append(f"dry run: {plural(images, 'image')} to check on {plural(len(planned), 'host')}"
                 "; nothing connected, built or written (--check probes the hosts and says what "
                 "would be rebuilt)")
    return lines


def refresh_lines(report: RefreshReport, *, dry_run: bool = False) -> list[str]:
    """The refresh report as the CLI prints it (pure)."""
    lines = []
    for host in report.hosts:
        if not host.reachable:
            lines.append(f"{host.host}: not reached: {host.reason}")
            continue
        new = host.driver.driver if host.driver else None
        if host.driver_changed:
            lines.append(f"{host.host}: driver {host.old_driver} -> {new or '(none)'}")
        else:
            lines.append(f"{host.host}: driver {new or '(none)'}"
                         + (" (unchanged)" if host.old_driver else ""))
        if not host.images:
            lines.append("  no image of the given matrices runs here")
        for image in host.images:
            lines.append(f"  {image.name}: {_image_line(image)}")
    lines += [f"note: {n}" for n in report.notes]
    if report.problem:
        lines.append(f"error: {report.problem}")
    lines.append(_summary(report, dry_run))
    return lines


def _image_line(image: ImageRefresh) -> str:
    label = image.new.release if image.new else None
    old = image.old.release if image.old else None
    release = (f"{old} -> {label}" if old and label and old != label else label or old or "")
    prefix = f"{release}: " if release else ""
    if image.action == "built":
        assert image.new is not None
        return (f"{prefix}rebuilt {image.new.tag} in {image.seconds or 0:.1f} s "
                f"({image.why})")
    if image.action == "would build":
        tag = f" {image.new.tag}" if image.new else ""
        return f"{prefix}would rebuild{tag} ({image.why})"
    if image.action == "up to date":
        tag = image.new.tag if image.new else ""
        return f"{prefix}up to date ({tag}{'; ' + image.why if image.why else ''})"
    if image.action == "skipped":
        return f"not built here: {image.why}"
    return f"failed: {image.why}"


def _summary(report: RefreshReport, dry_run: bool) -> str:
    images_ = [i for h in report.hosts for i in h.images]
    hosts = len(report.hosts)
    changed = len(report.changed)
    current = sum(i.action == "up to date" for i in images_)
    failed = sum(i.action == "failed" for i in images_)
    lost = sum(not h.reachable for h in report.hosts)
    tail = "".join([f", {failed} failed" if failed else "",
                    f", {lost} host(s) not reached" if lost else ""])
    if changed == 0 and not images_ and not lost:
        return (f"nothing to refresh on {hosts} host(s): no image recorded for them (give the "
                "MATRIX files whose images to keep fresh)")
    if changed == 0:  # "nothing changed" only where every host answered and built
        head = "nothing changed" if not (failed or lost) else "nothing rebuilt"
        return (f"{head}: {current} image(s) up to date on {hosts} host(s), nothing "
                f"built{tail}")
    verb = "would be rebuilt" if dry_run else "rebuilt"
    return f"{changed} image(s) {verb}, {current} up to date on {hosts} host(s){tail}"
