"""GPU placement: rules on small made-up inventories, then seeded random sequences.

hypothesis is not installed here, so the property tests drive the pool with ``random.Random``
and fixed seeds (reproducible; a failing seed is printed in the assertion message).
"""

from __future__ import annotations

import itertools
import random
from collections import defaultdict

import pytest

from benchmarks.list_scheduling import lower_bound, schedule
from orchestrator.config.inventory import parse_hosts
from orchestrator.plan.placement import (
    Allocation,
    GpuPool,
    HostSpec,
    Request,
    Slot,
    hosts_from_inventory,
)


def host(name: str, gpus: int, *tags: str, max_concurrent: int | None = None) -> HostSpec:
    return HostSpec(name, frozenset(tags or ("a100",)), tuple(range(gpus)), max_concurrent)


def req(cell: str, gpus: int, tag: str = "a100", **kw: bool) -> Request:
    return Request(cell, tag, gpus, **kw)


def acquire(pool: GpuPool, cell: str, gpus: int, tag: str = "a100", **kw: bool) -> Allocation:
    alloc = pool.try_acquire(req(cell, gpus, tag, **kw))
    assert alloc is not None, f"{cell} should fit"
    return alloc


# -- the allocation value ---------------------------------------------------------------------


def test_allocation_of_this_machine_and_of_hosts() -> None:
    local = Allocation.local("c1", [2, 5])
    assert (local.host, local.gpu_ids, local.hosts, local.multi_node) == (None, (2, 5), (), False)
    assert local.slots == (Slot(None, (2, 5)),) and local.gpu_count == 2
    spread = Allocation("c2", (("a", (0, 1)), ("b", (3,))), exclusive=True)  # tuples accepted
    assert spread.slots == (Slot("a", (0, 1)), Slot("b", (3,)))
    assert (spread.host, spread.gpu_ids, spread.hosts) == ("a", (0, 1), ("a", "b"))
    assert spread.multi_node and spread.gpu_count == 3
    with pytest.raises(ValueError, match="at least one slot"):
        Allocation("c3", ())
    pool = GpuPool([host("a", 2)])
    assert pool.release(Allocation.local("c4")) is False  # never handed out by this pool
    held = acquire(pool, "c4", 1)
    with pytest.raises(ValueError, match="does not hold"):
        pool.release(Allocation.local("c4", held.gpu_ids))


# -- single-host rules ------------------------------------------------------------------------


def test_best_fit_packs_the_fullest_host_that_fits() -> None:
    pool = GpuPool([host("a", 8), host("b", 8)])
    assert acquire(pool, "c1", 4).host == "a"  # tie: inventory order
    assert acquire(pool, "c2", 2).host == "a"  # a has 4 free, b 8: a is the tighter fit
    assert acquire(pool, "c3", 4).host == "b"  # a has only 2 left
    assert acquire(pool, "c4", 2).host == "a"  # exactly fills a
    assert pool.free_gpus("a") == () and pool.free_gpus("b") == (4, 5, 6, 7)
    assert pool.try_acquire(req("c5", 8)) is None  # fits later, not now


def test_best_fit_keeps_a_big_host_free_for_a_big_cell() -> None:
    pool = GpuPool([host("big", 8), host("small", 2)])
    assert acquire(pool, "one", 1).host == "small"
    assert acquire(pool, "eight", 8).host == "big"


def test_gpu_ids_come_from_the_smallest_consecutive_run() -> None:
    pool = GpuPool([host("a", 8)])
    first = acquire(pool, "c1", 2)
    assert first.gpu_ids == (0, 1)
    assert acquire(pool, "c2", 4).gpu_ids == (2, 3, 4, 5)
    pool.release(first)
    assert acquire(pool, "c3", 1).gpu_ids == (0,)  # runs [0,1] and [6,7]: lowest of the smallest
    assert acquire(pool, "c4", 2).gpu_ids == (6, 7)  # [1] is too small
    assert acquire(pool, "c5", 1).gpu_ids == (1,)


def test_non_contiguous_free_ids_still_used() -> None:
    pool = GpuPool([HostSpec("a", frozenset({"x"}), (0, 2, 5, 7))])
    assert acquire(pool, "c", 3, "x").gpu_ids == (0, 2, 5)


def test_tags_select_hosts() -> None:
    pool = GpuPool([host("v", 8, "v100"), host("a", 4, "a100", "a100-40g")])
    assert acquire(pool, "c1", 2, "a100-40g").host == "a"
    assert acquire(pool, "c2", 4, "v100").host == "v"
    assert pool.try_acquire(req("c3", 4, "a100")) is None  # a100 host has only 2 left
    assert pool.try_acquire(req("c4", 1, "h100")) is None


def test_zero_gpu_cells_take_a_slot_but_no_gpu() -> None:
    pool = GpuPool([host("cpu", 0, "cpu", max_concurrent=2)])
    a = acquire(pool, "c1", 0, "cpu")
    assert a.gpu_ids == () and a.gpu_count == 0
    acquire(pool, "c2", 0, "cpu")
    assert pool.try_acquire(req("c3", 0, "cpu")) is None  # max_concurrent
    pool.release(a)
    assert acquire(pool, "c3", 0, "cpu").host == "cpu"


def test_max_concurrent_caps_cells_per_host() -> None:
    pool = GpuPool([host("a", 8, max_concurrent=2), host("b", 8)])
    assert acquire(pool, "c1", 1).host == "a"
    assert acquire(pool, "c2", 1).host == "a"
    assert acquire(pool, "c3", 1).host == "b"  # a is at its cap despite 6 free GPUs


def test_exclusive_host() -> None:
    pool = GpuPool([host("a", 8), host("b", 8)])
    acquire(pool, "small", 1)  # on a
    excl = acquire(pool, "alone", 2, exclusive_host=True)
    assert excl.host == "b" and excl.exclusive and excl.gpu_ids == (0, 1)
    assert acquire(pool, "more", 4).host == "a"  # b is held exclusively despite 6 free GPUs
    assert pool.try_acquire(req("x", 4)) is None
    assert pool.try_acquire(req("y", 1, exclusive_host=True)) is None  # a is busy, b held
    pool.release(excl)
    assert acquire(pool, "x", 4).host == "b"  # a has 3 free; b is free again


def test_exclusive_host_placement_exact() -> None:
    pool = GpuPool([host("a", 8), host("b", 4)])
    assert acquire(pool, "e1", 2, exclusive_host=True).host == "b"  # best fit: smaller host
    assert acquire(pool, "e2", 2, exclusive_host=True).host == "a"
    assert pool.try_acquire(req("e3", 1)) is None
    assert pool.try_acquire(req("e4", 1, exclusive_host=True)) is None


def test_duplicate_cell_and_foreign_release_are_errors() -> None:
    pool = GpuPool([host("a", 8)])
    a = acquire(pool, "c1", 1)
    with pytest.raises(ValueError, match="already holds"):
        pool.try_acquire(req("c1", 1))
    with pytest.raises(ValueError, match="does not hold"):
        pool.release(Allocation("c1", (("a", (5,)),)))
    assert pool.release(a) is True
    assert pool.release(a) is False  # already released: no-op
    with pytest.raises(ValueError):
        GpuPool([host("a", 1), host("a", 2)])
    with pytest.raises(ValueError):
        HostSpec("h", frozenset(), (0, 0))


# -- multi-node ---------------------------------------------------------------------------------


def test_multi_node_only_when_allowed_and_no_single_host_fits() -> None:
    pool = GpuPool([host("a", 8), host("b", 8)])
    assert pool.try_acquire(req("big", 16)) is None
    big = acquire(pool, "big", 16, allow_multi_node=True)
    assert big.hosts == ("a", "b") and big.gpu_count == 16 and big.multi_node
    assert big.gpu_ids == tuple(range(8))
    assert pool.try_acquire(req("one", 1)) is None
    pool.release(big)
    # 8 fits one host: never split, even if allowed and the hosts are partly busy.
    acquire(pool, "one", 1)
    eight = acquire(pool, "eight", 8, allow_multi_node=True)
    assert eight.hosts == ("b",)
    pool.release(eight)
    acquire(pool, "six", 6)  # a has 7 free: best fit
    acquire(pool, "three", 3)  # b (a has 1 left)
    # 1 + 5 GPUs free in total, and 8 of them would fit on one host: wait, don't split.
    assert pool.try_acquire(req("eight", 8, allow_multi_node=True)) is None


def test_multi_node_splits_evenly_and_wastes_least() -> None:
    pool = GpuPool([host("a", 8), host("b", 8), host("c", 4)])
    twelve = acquire(pool, "twelve", 12, allow_multi_node=True)
    assert [(h, len(ids)) for h, ids in twelve.slots] == [("a", 8), ("c", 4)]  # not a+b
    pool.release(twelve)
    pool2 = GpuPool([host("a", 8), host("b", 8)])
    even = acquire(pool2, "twelve", 12, allow_multi_node=True)
    assert [(h, len(ids)) for h, ids in even.slots] == [("a", 6), ("b", 6)]
    assert pool2.try_acquire(req("x", 1)) is None  # both hosts held whole


def test_multi_node_waits_for_whole_idle_hosts() -> None:
    pool = GpuPool([host("a", 8), host("b", 8)])
    small = acquire(pool, "small", 1)
    assert pool.try_acquire(req("big", 16, allow_multi_node=True)) is None
    pool.release(small)
    assert acquire(pool, "big", 16, allow_multi_node=True).gpu_count == 16


# -- feasibility ----------------------------------------------------------------------------------


def test_check_placeable_reasons() -> None:
    pool = GpuPool([host("a", 8, "a100"), host("b", 4, "a100"), host("v", 2, "v100")])
    requests = [
        req("ok", 8),
        req("ok-multi", 12, allow_multi_node=True),
        req("no-tag", 1, "h100"),
        req("too-big", 9),
        req("too-big-multi", 13, allow_multi_node=True),
        req("v-too-big", 4, "v100", exclusive_host=True),
        req("negative", -1),
    ]
    reasons = pool.check_placeable(requests)
    assert set(reasons) == {"no-tag", "too-big", "too-big-multi", "v-too-big", "negative"}
    assert "no host has tag 'h100' (tags in the inventory: a100, v100)" in reasons["no-tag"]
    assert "largest host tagged 'a100' (a) has 8; allow multi-node" in reasons["too-big"]
    assert "all 2 hosts tagged 'a100' together have 12" in reasons["too-big-multi"]
    assert "(v) has 2" in reasons["v-too-big"]
    pool.mark_host_lost("v")
    assert (
        "every host tagged 'v100' is lost (v)" in pool.check_placeable([req("v", 1, "v100")])["v"]
    )


# -- host loss ----------------------------------------------------------------------------------


def test_mark_host_lost() -> None:
    pool = GpuPool([host("a", 8), host("b", 8), host("c", 8)])
    on_a = acquire(pool, "on-a", 4)
    multi = acquire(pool, "multi", 16, allow_multi_node=True)  # b and c (a is busy)
    assert multi.hosts == ("b", "c")
    acquire(pool, "on-a2", 2)
    affected = pool.mark_host_lost("c")
    assert affected == [multi]
    assert pool.free_gpus("b") == tuple(range(8))  # freed with the dropped allocation
    assert pool.free_gpus("c") == ()
    assert pool.release(multi) is False  # the runner may still report it ended
    assert {a.cell_id for a in pool.live} == {"on-a", "on-a2"}
    assert acquire(pool, "x", 8).host == "b"  # never c
    assert pool.try_acquire(req("y", 16, allow_multi_node=True)) is None  # c is gone
    assert pool.total_gpus() == 16
    assert sorted(a.cell_id for a in pool.mark_host_lost("a")) == ["on-a", "on-a2"]
    with pytest.raises(KeyError):
        pool.mark_host_lost("nope")
    assert on_a not in pool.live


# -- random sequences: invariants -------------------------------------------------------------


def random_hosts(rng: random.Random) -> list[HostSpec]:
    specs = []
    for i in range(rng.randint(1, 5)):
        n = rng.choice([0, 1, 2, 4, 8, 8, 8])
        ids = tuple(sorted(rng.sample(range(16), n)))
        tags = frozenset(["a100", *rng.sample(["v100", "h100"], rng.randint(0, 1))])
        cap = rng.choice([None, None, None, 1, 2, 3])
        specs.append(HostSpec(f"h{i}", tags, ids, cap))
    return specs


def random_request(rng: random.Random, cell: str) -> Request:
    return Request(
        cell,
        rng.choices(["a100", "v100", "h100", "tpu"], weights=[14, 3, 2, 1])[0],
        rng.choice([0, 1, 1, 1, 2, 2, 3, 4, 8, 12, 16]),
        exclusive_host=rng.random() < 0.1,
        allow_multi_node=rng.random() < 0.5,
    )


def check_invariants(pool: GpuPool, specs: dict[str, HostSpec], reqs: dict[str, Request]) -> None:
    used: dict[str, set[int]] = defaultdict(set)
    per_host: dict[str, list[Allocation]] = defaultdict(list)
    for alloc in pool.live:
        r = reqs[alloc.cell_id]
        assert alloc.gpu_count == r.gpus
        for h, ids in alloc.slots:
            assert h not in pool.lost
            assert r.tag in specs[h].tags
            assert set(ids) <= set(specs[h].gpu_ids)
            assert not used[h] & set(ids), f"GPU double-booked on {h}"
            used[h] |= set(ids)
            per_host[h].append(alloc)
    for name, spec in specs.items():
        live_here = per_host[name]
        if name in pool.lost:
            assert not live_here and pool.free_gpus(name) == ()
            continue
        assert set(pool.free_gpus(name)) == set(spec.gpu_ids) - used[name]
        if spec.max_concurrent is not None:
            assert len(live_here) <= spec.max_concurrent
        if any(a.exclusive for a in live_here):
            assert len(live_here) == 1, f"exclusive host {name} shared"


def feasible_hosts(pool: GpuPool, r: Request) -> list[str]:
    """Brute force: single hosts that could take ``r`` right now under the documented rules."""
    live = pool.live
    out = []
    for spec in pool.hosts:
        if spec.name in pool.lost or r.tag not in spec.tags:
            continue
        here = [a for a in live if spec.name in a.hosts]
        if any(a.exclusive for a in here):
            continue
        if spec.max_concurrent is not None and len(here) >= spec.max_concurrent:
            continue
        if r.exclusive_host and here:
            continue
        if len(pool.free_gpus(spec.name)) >= r.gpus:
            out.append(spec.name)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_random_sequences_never_double_book(seed: int) -> None:
    rng = random.Random(seed)
    specs = random_hosts(rng)
    by_name = {s.name: s for s in specs}
    pool = GpuPool(specs)
    reqs: dict[str, Request] = {}
    counter = itertools.count()
    for _step in range(300):
        roll = rng.random()
        if roll < 0.45:
            r = random_request(rng, f"c{next(counter)}")
            reqs[r.cell_id] = r
            tagged = [s for s in specs if r.tag in s.tags and s.name not in pool.lost]
            largest = max((len(s.gpu_ids) for s in tagged), default=-1)
            feasible = feasible_hosts(pool, r)
            alloc = pool.try_acquire(r)
            if r.gpus <= largest:
                # Single host: placed iff some host can take it now, and on the best fit.
                assert (alloc is not None) == bool(feasible), (seed, r, feasible)
                if alloc is not None:
                    assert not alloc.multi_node
                    fewest = min(
                        len(pool.free_gpus(h)) + (r.gpus if h == alloc.host else 0)
                        for h in feasible
                    )
                    assert len(pool.free_gpus(alloc.host)) + r.gpus == fewest, seed
            else:
                # Too big for any one host: only whole idle hosts, only if allowed.
                idle = [
                    h
                    for h in tagged
                    if not any(h.name in a.hosts for a in pool.live if a.cell_id != r.cell_id)
                ]
                enough = sum(len(h.gpu_ids) for h in idle if h.gpu_ids) >= r.gpus
                expected = bool(tagged) and r.allow_multi_node and enough
                assert (alloc is not None) == expected, (seed, r)
                if alloc is not None:
                    assert alloc.exclusive and set(alloc.hosts) <= {h.name for h in idle}
        elif roll < 0.985:
            if pool.live:
                assert pool.release(rng.choice(pool.live))
        else:  # a lost host stays lost for the rest of the sweep
            victim = rng.choice(specs).name
            before = {a.cell_id for a in pool.live}
            affected = pool.mark_host_lost(victim)
            assert all(victim in a.hosts for a in affected)
            assert {a.cell_id for a in pool.live} == before - {a.cell_id for a in affected}
        check_invariants(pool, by_name, reqs)
    for alloc in pool.live:
        pool.release(alloc)
    for spec in specs:
        if spec.name not in pool.lost:
            assert pool.free_gpus(spec.name) == tuple(sorted(spec.gpu_ids))


# -- whole sweeps simulated on the pool (benchmarks/list_scheduling.py) ------------------------


def check_schedule_sound(sched, requests: list[Request], pool: GpuPool) -> None:
    placed = {c.cell_id for c in sched.cells}
    assert placed | set(sched.unplaceable) == {r.cell_id for r in requests}
    assert not placed & set(sched.unplaceable)
    uses: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for c in sched.cells:
        for h, ids in c.allocation.slots:
            for g in ids:
                uses[(h, g)].append((c.start, c.end))
    for intervals in uses.values():
        intervals.sort()
        for (_, end), (start, _) in itertools.pairwise(intervals):
            assert start >= end, "a GPU ran two cells at once"
    assert pool.live == []  # everything given back


def test_schedule_lpt_small_instance() -> None:
    pool = GpuPool([host("a", 2)])
    requests = [req("s1", 1), req("s2", 1), req("s3", 1), req("long", 1), req("wide", 2)]
    durations = {"s1": 1, "s2": 1, "s3": 1, "long": 3, "wide": 1}
    sched = schedule(requests, durations, pool)
    check_schedule_sound(sched, requests, pool)
    assert sched.makespan == lower_bound(requests, durations, 2) == 4.0
    fifo = schedule(requests, durations, pool, order="fifo")
    check_schedule_sound(fifo, requests, pool)
    assert fifo.makespan == 5.0  # s1,s2 | s3,long | wide waits for long


def test_schedule_reports_unplaceable_with_reasons() -> None:
    pool = GpuPool([host("a", 8), host("b", 8)])
    requests = [req("ok", 8), req("huge", 32, allow_multi_node=True), req("gaudi", 1, "gaudi2")]
    sched = schedule(requests, {"ok": 5, "huge": 1, "gaudi": 1}, pool)
    check_schedule_sound(sched, requests, pool)
    assert set(sched.unplaceable) == {"huge", "gaudi"}
    assert "together have 16" in sched.unplaceable["huge"]


@pytest.mark.parametrize("seed", range(15))
@pytest.mark.parametrize("order", ["lpt", "area", "fifo"])
def test_random_schedules_are_sound(seed: int, order: str) -> None:
    rng = random.Random(1000 + seed)
    pool = GpuPool(random_hosts(rng))
    requests = [random_request(rng, f"c{i}") for i in range(rng.randint(1, 40))]
    durations = {r.cell_id: rng.uniform(1, 100) for r in requests}
    sched = schedule(requests, durations, pool, order=order)  # type: ignore[arg-type]
    check_schedule_sound(sched, requests, pool)
    assert set(sched.unplaceable) == set(pool.check_placeable(requests))
    ran = [r for r in requests if r.cell_id not in sched.unplaceable]
    gpus_of_tags = pool.total_gpus()
    if ran:
        assert sched.makespan >= max(durations[r.cell_id] for r in ran) - 1e-9
        assert sched.makespan >= lower_bound(ran, durations, gpus_of_tags) - 1e-9


def test_hosts_from_inventory() -> None:
    inv = parse_hosts(
        '[[hosts]]\nname = "a"\naddress = "x"\ntags = ["a100"]\ngpus = [0, 2]\nmax_concurrent = 1\n'
        '[[hosts]]\nname = "b"\naddress = "y"\ntags = ["v100"]\n'
        '[[hosts]]\nname = "c"\naddress = "z"\n'
    )
    specs = hosts_from_inventory(inv, {"b": [0, 1, 2, 3], "a": [0, 1, 2, 3]})
    assert specs[0] == HostSpec("a", frozenset({"a100"}), (0, 2), 1)  # listed ids win
    assert specs[1].gpu_ids == (0, 1, 2, 3) and specs[2].gpu_ids == ()
