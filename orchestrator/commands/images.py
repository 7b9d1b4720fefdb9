"""``orchestrate images``: list, render and build the image templates."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from orchestrator import build, images
from orchestrator.errors import BackendUnavailable, ConfigError
from orchestrator.releases import Release, resolve_release

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``images list|render|build`` to the CLI."""
    parser = subparsers.add_parser("images", help="list, render and build image templates")
    sub = parser.add_subparsers(dest="images_command", metavar="ACTION")
    sub.required = True

    p_list = sub.add_parser("list", help="templates, their variables and local image tags")
    p_list.set_defaults(handler=cmd_list)

    p_render = sub.add_parser("render", help="write a template's build context to a directory")
    p_render.add_argument("name", help="template name (see `orchestrate images list`)")
    _add_set(p_render)
    p_render.add_argument("--out", required=True, type=Path, help="directory to write into")
    p_render.set_defaults(handler=cmd_render)

    p_build = sub.add_parser("build", help="build a template's image unless its tag exists")
    p_build.add_argument("name", help="template name (see `orchestrate images list`)")
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
    p_build.add_argument("--hosts", type=Path, metavar="HOSTS.toml",
                         help="hosts inventory for --driver-from")
    p_build.add_argument(
        "--datacenter",
        action="store_true",
        help="with --driver: also allow releases reachable through CUDA forward compatibility",
    )
    p_build.add_argument(
        "--dry-run", action="store_true", help="print base image, release and tag; build nothing"
    )
    p_build.set_defaults(handler=cmd_build)


def _add_set(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        dest="assignments",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a template variable (repeatable; lists are comma-separated)",
    )


def _values(args: argparse.Namespace) -> tuple[dict[str, Any], Release | None]:
    values = images.coerce_set(args.name, args.assignments)
    release = None
    driver = getattr(args, "driver", None)
    host = getattr(args, "driver_from", None)
    if host:
        if driver:
            raise ConfigError("give either --driver or --driver-from, not both", file="--driver")
        if not args.hosts:
            raise ConfigError("--driver-from needs --hosts HOSTS.toml", file="--driver-from")
        from orchestrator.commands.hosts import driver_from_host
        from orchestrator.hosts import load_hosts

        driver = driver_from_host(load_hosts(args.hosts), host)
    if driver:
        template = images.load_template(args.name)
        if "base_tag" not in template.variables:
            raise ConfigError(
                f"template {args.name} has no base_tag; --driver does not apply", file="--driver"
            )
        if "base_tag" in values:
            raise ConfigError("give either --driver or --set base_tag, not both", file="--driver")
        release = resolve_release(driver, datacenter=getattr(args, "datacenter", False))
        values["base_tag"] = release.base_tag
    return values, release


def cmd_list(args: argparse.Namespace) -> int:
    """Print every template with its variables, and local content-hash tags if an engine answers."""
    console = Console()
    try:
        tags = build.local_tags()
    except BackendUnavailable as exc:
        tags = None
        log.debug("no engine for `images list`: %s", exc)
    for name in images.template_names():
        template = images.load_template(name)
        table = Table(
            title=f"{name} ({template.kind}): {template.description}", title_justify="left"
        )
        for column in ("variable", "type", "default", "description"):
            table.add_column(column)
        for vname, var in template.variables.items():
            default = ",".join(var.default) if var.type == "list" else str(var.default)
            suffix = " (file)" if var.file else (f" ({var.kind})" if var.kind else "")
            table.add_row(vname, var.type + suffix, default or repr(default), var.description)
        console.print(table)
        if tags is None:
            console.print("  local images: (no Docker engine reachable)")
        else:
            found = tags.get(name, [])
            console.print(f"  local images: {', '.join(found) if found else '(none)'}")
        console.print()
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    """Write the build context (Dockerfile or .def, workload/, extra files) to ``--out``."""
    values, _ = _values(args)
    plan = build.plan_image(args.name, values)
    for node in build.plan_chain(plan)[:-1]:
        Console(stderr=True).print(f"[dim]parent image: {node.tag} ({node.template})[/dim]")
    images.write_context(plan.files, args.out)
    rendered = args.out / images.KINDS[plan.kind]
    Console().print(f"wrote {rendered} (tag would be {plan.tag})")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    """Build the image (and its parents) unless its content-hash tag already exists."""
    values, release = _values(args)
    plan = build.plan_image(args.name, values)
    console = Console()
    if release is not None:
        console.print(
            f"release:    {release.name} (CUDA {release.cuda}, driver >= {release.min_driver})"
        )
    for node in build.plan_chain(plan):
        console.print(f"{node.template}:")
        console.print(f"  base image: {node.base_image}")
        console.print(f"  tag:        {node.tag}")
    if args.dry_run:
        return 0
    with console.status(f"building {plan.tag}") as status:

        def on_log(line: str) -> None:
            console.print(line, style="dim", markup=False, highlight=False, soft_wrap=True)
            status.update(f"building {plan.tag}: {line[:80]}")

        outcome = build.ensure_image(plan, on_log=on_log)
    step: build.BuildOutcome | None = outcome
    while step is not None:
        console.print(f"{step.tag}: {step.summary}")
        step = step.parent
    return 0
