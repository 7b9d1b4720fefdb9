"""``orchestrate hosts check HOSTS.toml``: is every lab host reachable, and what does it have?

Prints one row per host (reachable or why not, Docker version, GPUs, driver, CUDA, the release a
``release = "auto"`` profile would get there) and exits
non-zero if any host is unreachable or could not be checked (a missing key file, a corrupt
known_hosts line: said so, not called "unreachable"). An SSH library error is one host's reason,
never a traceback. :func:`facts_from_host` serves ``--driver-from HOST`` of
the image builder.
"""

from __future__ import annotations

import argparse
import logging
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from tabulate import tabulate

from orchestrator.catalog.gpus import HostFacts, discover
from orchestrator.cli import options
from orchestrator.errors import HostError
from orchestrator.plan.selection import HostDriver, newest_release

if TYPE_CHECKING:  # paramiko is imported only when a host is contacted (fast `--help`)
    from orchestrator.config.inventory import Inventory

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``hosts`` command group (``hosts check``)."""
    group = subparsers.add_parser("hosts", help="inspect the lab hosts of an inventory")
    sub = group.add_subparsers(dest="hosts_command", metavar="SUBCOMMAND")
    sub.required = True
    check = sub.add_parser(
        "check",
        help="connect to every host; show Docker, GPUs, driver, CUDA",
        description="Connect to each host of HOSTS.toml over SSH and report what it has. "
        "Exits 1 if any host is unreachable.",
    )
    check.add_argument("inventory", metavar="HOSTS.toml", help="the host inventory file")
    options.host(check, "check only NAME (repeat)")
    options.jobs(check, "hosts checked at once (default 8)")
    check.set_defaults(handler=cmd_check)


def gather_facts(
    inventory: Inventory, names: list[str] | None = None, jobs: int = 8
) -> list[HostFacts]:
    """Discover every host (or ``names``) in parallel; results in inventory order."""
    from orchestrator.config.inventory import resolve_hosts
    from orchestrator.remote.connection import SshHost

    selected = names or inventory.names
    for name in selected:
        inventory.get(name)  # ConfigError for an unknown name, before connecting anywhere
    targets = resolve_hosts(inventory)  # the ssh config read once

    def one(name: str) -> HostFacts:
        import paramiko

        host = SshHost.from_inventory(inventory, name, targets[name])
        try:
            return discover(host, timeout=inventory.options.command_timeout)
        except (paramiko.SSHException, OSError, EOFError, ValueError) as exc:
            # what the ssh layer does not turn into a HostError is still one host's reason
            log.debug("host %s: %r", name, exc)
            reason = f"host {name}: SSH error: {exc or type(exc).__name__}"
            return HostFacts(name=name, reachable=False, reason=reason)
        finally:
            host.close()

    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(selected)))) as pool:
        return list(pool.map(one, selected))


def _gpu_summary(facts: HostFacts) -> str:
    if not facts.gpus:
        return "none"
    counts = Counter((g.model, g.memory_mib) for g in facts.gpus)
    parts = []
    for (model, mib), n in counts.items():
        memory = f" {mib / 1024:.0f} GiB" if mib else ""
        parts.append(f"{n}x {model}{memory}")
    return ", ".join(parts)


def short_reason(reason: str) -> str:
    """A table-sized version of an unreachable host's reason (the full one is listed below)."""
    lowered = reason.lower()
    for needle, short in (
        ("unknown", "unknown host key"),
        ("changed", "host key changed"),
        ("authentication failed", "authentication failed"),
    ):
        if needle in lowered and ("key" in lowered or needle.startswith("auth")):
            return short
    if ": unreachable: " not in reason:
        for needle, short in (("key file", "key file unusable"), ("known_hosts", "bad known_hosts"),
                              ("ssh error", "SSH error")):
            if needle in lowered:
                return short
    tail = reason.split(": unreachable: ", 1)[-1]
    return tail if len(tail) <= 40 else tail[:37] + "..."


def _unreachable(facts: HostFacts) -> bool:
    """Whether the host could not be reached at all (rather than refused or misconfigured)."""
    return ": unreachable: " in facts.reason or facts.reason.endswith("connection lost")


def render_check_table(inventory: Inventory, facts: list[HostFacts]) -> str:
    """The ``hosts check`` table (pure: facts in, text out), then reasons for unreachable hosts."""
    rows = []
    for f in facts:
        entry = inventory.get(f.name)
        reach = "yes" if f.reachable else "NO: " + short_reason(f.reason)
        rows.append(
            [
                f.name,
                f"{entry.address}:{entry.port}",
                reach,
                f.docker_version or "-",
                _gpu_summary(f) if f.reachable else "-",
                f.driver or "-",
                f.cuda or "-",
                newest_release(HostDriver.from_facts(f)) if f.reachable else "-",
                ",".join(entry.tags) or "-",
            ]
        )
    headers = ["host", "address", "reachable", "docker", "GPUs", "driver", "CUDA", "auto release",
               "tags"]
    text = tabulate(rows, headers=headers, tablefmt="simple")
    down = [f"  {f.name}: {f.reason}" for f in facts if not f.reachable and _unreachable(f)]
    failed = [f"  {f.name}: {f.reason}" for f in facts if not f.reachable and not _unreachable(f)]
    notes = [f"  {f.name}: {n}" for f in facts if f.reachable for n in f.notes]
    if down:
        text += "\n\nunreachable:\n" + "\n".join(down)
    if failed:
        text += "\n\ncould not check:\n" + "\n".join(failed)
    if notes:
        text += "\n\nnotes:\n" + "\n".join(notes)
    return text


def cmd_check(args: argparse.Namespace) -> int:
    """Handler of ``hosts check``."""
    from orchestrator.config.inventory import load_hosts

    inventory = load_hosts(args.inventory)
    facts = gather_facts(inventory, args.host, args.jobs)
    print(render_check_table(inventory, facts))
    down = [f.name for f in facts if not f.reachable and _unreachable(f)]
    failed = [f.name for f in facts if not f.reachable and not _unreachable(f)]
    if down:
        print(f"\n{len(down)} of {len(facts)} hosts unreachable: {', '.join(down)}")
    if failed:
        print(f"\n{len(failed)} of {len(facts)} hosts could not be checked: {', '.join(failed)}")
    return 1 if down or failed else 0


def facts_from_host(inventory: Inventory, name: str) -> HostFacts:
    """What host ``name`` reports (for ``--driver-from HOST``): its GPUs and driver.

    Raises :class:`HostError` if the host is unreachable or reports no NVIDIA/Gaudi driver.
    """
    (facts,) = gather_facts(inventory, [name], jobs=1)
    if not facts.reachable:
        raise HostError(facts.reason)
    if not facts.driver:
        raise HostError(
            f"host {name} reports no GPU driver (neither nvidia-smi nor hl-smi answered); "
            f"pass the driver version explicitly instead of --driver-from"
        )
    return facts
