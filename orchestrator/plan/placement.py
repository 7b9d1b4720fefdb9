"""GPU-aware placement of concurrent cells on lab hosts. Pure: no I/O, no clocks, no threads.

Model: each host has a name, hardware tags and GPU ids (and optionally a cap on concurrent
cells). A :class:`Request` asks for ``gpus`` GPUs on a host tagged ``tag``, optionally the whole
host to itself (``exclusive_host``), optionally spanning several hosts (``allow_multi_node``).

:class:`GpuPool` hands out :class:`Allocation` values (specific hosts and GPU ids) and never gives
one GPU to two live allocations. (:class:`Allocation` is also what every other backend hands
out: a cell on this machine is one :class:`Slot` whose host is None.) Rules:

* **Best fit.** A single-host request goes to the tagged host with the *fewest* free GPUs that
  still fit (ties: file order), keeping big blocks free for big cells. Within the host, the GPU ids
  come from the smallest run of consecutive free ids that fits (else the lowest free ids).
* **Exclusive host.** Only a host running nothing may take it; while it runs, that host takes
  nothing else.
* **Multi-node** is used only when allowed *and* no single tagged host could ever hold the request
  (more GPUs than the largest one has). It takes whole idle hosts exclusively, as few as possible
  with the least waste, and spreads the GPUs evenly over them when it can.
* ``max_concurrent`` caps live allocations per host (0-GPU cells count too).
* A lost host takes nothing new; :meth:`GpuPool.mark_host_lost` drops and returns the allocations
  that touched it, freeing their GPUs on other hosts.

A simulation of whole sweeps on a pool (list scheduling, makespans) lives with the benchmark that
uses it: ``benchmarks/list_scheduling.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from orchestrator.config.inventory import Inventory
    from orchestrator.config.matrix_file import HardwareProfile

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostSpec:
    """A host as placement sees it."""

    name: str
    tags: frozenset[str]
    gpu_ids: tuple[int, ...]
    max_concurrent: int | None = None

    def __post_init__(self) -> None:
        if len(set(self.gpu_ids)) != len(self.gpu_ids):
            raise ValueError(f"host {self.name}: GPU ids listed twice: {self.gpu_ids}")
        if self.max_concurrent is not None and self.max_concurrent < 1:
            raise ValueError(f"host {self.name}: max_concurrent must be >= 1")


@dataclass(frozen=True)
class Request:
    """What one cell needs."""

    cell_id: str
    tag: str
    gpus: int
    exclusive_host: bool = False
    allow_multi_node: bool = False


class Slot(NamedTuple):
    """One host's share of an allocation: the host (None: this machine) and its GPU ids."""

    host: str | None
    gpu_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Allocation:
    """Where a cell runs, as placement decided it: one :class:`Slot` per host, first host first.

    The one value a backend hands out in ``allocate``, turns into a launch spec in ``spec`` and
    takes back in ``release``; nothing about a placement is kept beside it. A cell on this machine
    has one slot whose host is None (:meth:`local`); a multi-node cell has one slot per host, the
    first being the rendezvous host. ``exclusive``: the cell holds its hosts to itself.
    """

    cell_id: str
    slots: tuple[Slot, ...] = (Slot(None),)
    exclusive: bool = False

    def __post_init__(self) -> None:
        if not self.slots:
            raise ValueError(f"{self.cell_id}: an allocation needs at least one slot")
        object.__setattr__(self, "slots", tuple(Slot(*slot) for slot in self.slots))

    @classmethod
    def local(cls, cell_id: str, gpu_ids: Iterable[int] = ()) -> Allocation:
        """A cell on this machine with ``gpu_ids`` (none: CPU, or GPUs that come otherwise)."""
        return cls(cell_id, (Slot(None, tuple(gpu_ids)),))

    @property
    def host(self) -> str | None:
        """The (first) host, None for this machine; for multi-node cells the rendezvous host."""
        return self.slots[0].host

    @property
    def gpu_ids(self) -> tuple[int, ...]:
        """GPU ids on the first host."""
        return self.slots[0].gpu_ids

    @property
    def hosts(self) -> tuple[str, ...]:
        """Every named host of the allocation (empty for this machine)."""
        return tuple(s.host for s in self.slots if s.host is not None)

    @property
    def gpu_count(self) -> int:
        """GPUs over all hosts."""
        return sum(len(s.gpu_ids) for s in self.slots)

    @property
    def multi_node(self) -> bool:
        """Whether the allocation spans hosts."""
        return len(self.slots) > 1


def holds_local_gpus(profile: HardwareProfile) -> bool:
    """Whether a cell of ``profile`` computes on GPUs of the machine it is placed on: CUDA and
    Gaudi cells do. A CPU cell computes on the CPU, and a Bitfusion cell (``wrapper =
    "bitfusion"``) on the Bitfusion servers' GPUs, which ``bitfusion run`` attaches over the
    network: neither is given GPUs of its machine (no ``CUDA_VISIBLE_DEVICES``, no device
    request, no Slurm ``--gres``), placed by its GPU count, or checked against a GPU there.
    The one rule the backends, the runtimes and the GPU checks ask."""
    return profile.device != "cpu" and profile.wrapper != "bitfusion"


def hosts_from_inventory(
    inventory: Inventory, discovered: Mapping[str, Sequence[int]] | None = None
) -> list[HostSpec]:
    """HostSpecs from an inventory: GPU ids listed there, else ``discovered[name]``, else none."""
    discovered = discovered or {}
    return [
        HostSpec(
            name=h.name,
            tags=frozenset(h.tags),
            gpu_ids=tuple(h.gpus if h.gpus is not None else discovered.get(h.name, ())),
            max_concurrent=h.max_concurrent,
        )
        for h in inventory.hosts
    ]


def _pick_ids(free: set[int], n: int) -> tuple[int, ...]:
    """``n`` ids from ``free``: from the smallest consecutive run that fits, else the lowest."""
    if n == 0:
        return ()
    ordered = sorted(free)
    runs: list[list[int]] = []
    for gpu in ordered:
        if runs and gpu == runs[-1][-1] + 1:
            runs[-1].append(gpu)
        else:
            runs.append([gpu])
    fitting = [r for r in runs if len(r) >= n]
    if fitting:
        best = min(fitting, key=lambda r: (len(r), r[0]))
        return tuple(best[:n])
    return tuple(ordered[:n])


def _named_slots(alloc: Allocation) -> list[tuple[str, tuple[int, ...]]]:
    """The slots of a pool's allocation (every one names its host)."""
    named = [(s.host, s.gpu_ids) for s in alloc.slots if s.host is not None]
    if len(named) != len(alloc.slots):
        raise ValueError(f"{alloc.cell_id}: a local allocation does not belong to a host pool")
    return named


def _split(hosts: list[HostSpec], n: int) -> tuple[Slot, ...]:
    """Spread ``n`` GPUs over whole ``hosts``: evenly when possible (torchrun wants the same
    number of processes per node), else filling hosts in order."""
    k = len(hosts)
    if n % k == 0 and all(len(h.gpu_ids) >= n // k for h in hosts):
        counts = [n // k] * k
    else:
        counts, left = [], n
        for h in hosts:
            counts.append(min(left, len(h.gpu_ids)))
            left -= counts[-1]
    return tuple(
        Slot(h.name, tuple(sorted(h.gpu_ids))[:c]) for h, c in zip(hosts, counts, strict=True)
    )


class GpuPool:
    """Free/used GPUs of a set of hosts; hands out and takes back allocations."""

    def __init__(self, hosts: Iterable[HostSpec]):
        self._hosts: dict[str, HostSpec] = {}
        for spec in hosts:
            if spec.name in self._hosts:
                raise ValueError(f"host {spec.name!r} given twice")
            self._hosts[spec.name] = spec
        self._order = {name: i for i, name in enumerate(self._hosts)}
        self._free: dict[str, set[int]] = {n: set(s.gpu_ids) for n, s in self._hosts.items()}
        self._running: dict[str, int] = dict.fromkeys(self._hosts, 0)
        self._exclusive: dict[str, str] = {}  # host -> cell id holding it exclusively
        self._live: dict[str, Allocation] = {}
        self._lost: set[str] = set()

    # -- views -------------------------------------------------------------------------------
    @property
    def hosts(self) -> list[HostSpec]:
        """Every host, lost or not, in the order given."""
        return list(self._hosts.values())

    @property
    def live(self) -> list[Allocation]:
        """Allocations handed out and not yet released or lost."""
        return list(self._live.values())

    @property
    def lost(self) -> frozenset[str]:
        """Hosts marked lost."""
        return frozenset(self._lost)

    def free_gpus(self, host: str) -> tuple[int, ...]:
        """Free GPU ids of ``host`` (ascending)."""
        return tuple(sorted(self._free[host]))

    def total_gpus(self) -> int:
        """GPUs of every host not lost."""
        return sum(len(s.gpu_ids) for n, s in self._hosts.items() if n not in self._lost)

    def _tagged(self, tag: str) -> list[HostSpec]:
        return [s for n, s in self._hosts.items() if tag in s.tags and n not in self._lost]

    def _idle(self, name: str) -> bool:
        return self._running[name] == 0

    def _can_host(self, spec: HostSpec, req: Request) -> bool:
        name = spec.name
        if name in self._exclusive:
            return False
        if spec.max_concurrent is not None and self._running[name] >= spec.max_concurrent:
            return False
        if req.exclusive_host and not self._idle(name):
            return False
        return len(self._free[name]) >= req.gpus

    # -- acquire / release -------------------------------------------------------------------
    def try_acquire(self, request: Request) -> Allocation | None:
        """An allocation for ``request`` if it can start now, else None (it may fit later)."""
        if request.gpus < 0:
            raise ValueError(f"{request.cell_id}: gpu count must be >= 0")
        if request.cell_id in self._live:
            raise ValueError(f"{request.cell_id} already holds an allocation")
        tagged = self._tagged(request.tag)
        if not tagged:
            return None
        largest = max(len(s.gpu_ids) for s in tagged)
        if request.gpus <= largest:
            fits = [s for s in tagged if self._can_host(s, request)]
            if not fits:
                return None
            best = min(fits, key=lambda s: (len(self._free[s.name]), self._order[s.name]))
            ids = _pick_ids(self._free[best.name], request.gpus)
            alloc = Allocation(request.cell_id, (Slot(best.name, ids),), request.exclusive_host)
        elif request.allow_multi_node:
            chosen = self._whole_hosts(tagged, request.gpus)
            if chosen is None:
                return None
            alloc = Allocation(request.cell_id, _split(chosen, request.gpus), exclusive=True)
        else:
            return None
        self._take(alloc)
        return alloc

    def _whole_hosts(self, tagged: list[HostSpec], n: int) -> list[HostSpec] | None:
        idle = [
            s for s in tagged if self._idle(s.name) and s.name not in self._exclusive and s.gpu_ids
        ]
        idle.sort(key=lambda s: (-len(s.gpu_ids), self._order[s.name]))
        chosen: list[HostSpec] = []
        total = 0
        for spec in idle:
            if total >= n:
                break
            chosen.append(spec)
            total += len(spec.gpu_ids)
        if total < n:
            return None
        # Least waste: swap the last host for the smallest unused one that still covers n.
        rest = [s for s in idle if s not in chosen]
        need = n - (total - len(chosen[-1].gpu_ids))
        smaller = [s for s in rest if need <= len(s.gpu_ids) < len(chosen[-1].gpu_ids)]
        if smaller:
            chosen[-1] = min(smaller, key=lambda s: (len(s.gpu_ids), self._order[s.name]))
        return chosen

    def _take(self, alloc: Allocation) -> None:
        for host, ids in _named_slots(alloc):
            assert set(ids) <= self._free[host], "double booking"
            self._free[host] -= set(ids)
            self._running[host] += 1
            if alloc.exclusive:
                self._exclusive[host] = alloc.cell_id
        self._live[alloc.cell_id] = alloc

    def _give_back(self, alloc: Allocation) -> None:
        del self._live[alloc.cell_id]
        for host, ids in _named_slots(alloc):
            self._running[host] -= 1
            if self._exclusive.get(host) == alloc.cell_id:
                del self._exclusive[host]
            if host not in self._lost:
                self._free[host] |= set(ids)

    def release(self, allocation: Allocation) -> bool:
        """Give ``allocation`` back. False if it is no longer live (e.g. dropped by host loss)."""
        current = self._live.get(allocation.cell_id)
        if current is None:
            return False
        if current != allocation:
            raise ValueError(f"{allocation.cell_id}: releasing an allocation it does not hold")
        self._give_back(current)
        return True

    # -- host loss -----------------------------------------------------------------------------
    def mark_host_lost(self, host: str) -> list[Allocation]:
        """Take ``host`` out of the pool; return (and drop) the live allocations that used it."""
        if host not in self._hosts:
            raise KeyError(host)
        self._lost.add(host)
        affected = [a for a in self._live.values() if host in a.hosts]
        for alloc in affected:
            self._give_back(alloc)
        self._free[host] = set()
        log.info("host %s lost; %d allocations affected", host, len(affected))
        return affected

    # -- feasibility -----------------------------------------------------------------------------
    def why_unplaceable(self, request: Request) -> str | None:
        """Why ``request`` can never be placed on this pool (as it is now), or None."""
        tag, n = request.tag, request.gpus
        if n < 0:
            return f"gpu count must be >= 0, got {n}"
        all_tagged = [s for s in self._hosts.values() if tag in s.tags]
        if not all_tagged:
            known = sorted({t for s in self._hosts.values() for t in s.tags})
            return f"no host has tag {tag!r} (tags in the inventory: {', '.join(known) or 'none'})"
        tagged = self._tagged(tag)
        if not tagged:
            names = ", ".join(s.name for s in all_tagged)
            return f"every host tagged {tag!r} is lost ({names})"
        biggest = max(tagged, key=lambda s: len(s.gpu_ids))
        largest = len(biggest.gpu_ids)
        if n <= largest:
            return None
        if not request.allow_multi_node:
            return (
                f"needs {n} GPUs but the largest host tagged {tag!r} ({biggest.name}) has "
                f"{largest}; allow multi-node to span hosts"
            )
        together = sum(len(s.gpu_ids) for s in tagged)
        if n > together:
            return (
                f"needs {n} GPUs but all {len(tagged)} hosts tagged {tag!r} together have "
                f"{together}"
            )
        return None

    def check_placeable(self, requests: Iterable[Request]) -> dict[str, str]:
        """``{cell id: reason}`` for every request that can never be placed."""
        out: dict[str, str] = {}
        for req in requests:
            reason = self.why_unplaceable(req)
            if reason is not None:
                out[req.cell_id] = reason
        return out
