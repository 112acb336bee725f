"""The per-job port plan (pure)."""

from __future__ import annotations

import random

import pytest

from eray_provider.plan.ports import (
    BLOCK,
    COORDINATOR_COUNT,
    COORDINATOR_FIRST,
    FIXED_EXCLUSIONS,
    Excluded,
    PortPlan,
    PortPlanError,
    block_starts,
    candidates,
    choose_plan,
    choose_probed,
    fallback_starts,
    job_coordinator_port,
    next_to_probe,
)

LINUX = [(32768, 60999), (60001, 63000)]


def overlaps(port: int, ranges) -> bool:
    return any(lo <= port <= hi for lo, hi in ranges)


def test_plan_avoids_every_excluded_range_and_is_deterministic() -> None:
    for job in ("1", "17", "123456", "99999999"):
        plan = choose_plan(job, LINUX)
        assert plan == choose_plan(job, LINUX)
        ports = plan.all_ports()
        assert len(ports) == len(set(ports)) == BLOCK - 5  # 11 named + 16 jax + 224 workers
        for p in ports:
            assert not overlaps(p, LINUX) and not overlaps(p, FIXED_EXCLUSIONS)
        for default in (6379, 8265, 10001, 52365, 44217, 44227, 8000, 9000):
            assert default not in ports


def test_nearby_job_ids_never_share_a_port() -> None:
    n = len(block_starts(LINUX))
    assert n == 44
    plans = [choose_plan(str(1000 + i), LINUX) for i in range(n)]
    seen: dict[int, str] = {}
    for plan in plans:
        for p in plan.all_ports():
            assert p not in seen, f"port {p} in jobs {seen[p]} and {plan.job_id}"
            seen[p] = plan.job_id
    # congruent ids get the same first candidate: the documented collision bound
    assert choose_plan("1000", LINUX).block_start == choose_plan(str(1000 + n), LINUX).block_start


def test_busy_ports_move_to_another_candidate() -> None:
    first = choose_plan("42", LINUX)
    moved = choose_plan("42", LINUX, busy=[first.gcs])
    assert moved.block_start != first.block_start
    assert moved == candidates("42", LINUX)[1]
    worker_busy = choose_plan("42", LINUX, busy=[first.max_worker])
    assert worker_busy.block_start == moved.block_start
    # every block is a candidate exactly once, and neighbouring jobs fall back differently
    starts = [c.block_start for c in candidates("42", LINUX)]
    assert sorted(starts) == sorted(set(starts)) and len(starts) == 44
    onto_neighbour = [
        j
        for j in range(100, 144)
        if candidates(str(j), LINUX)[1].block_start == candidates(str(j + 1), LINUX)[0].block_start
    ]
    assert len(onto_neighbour) <= 4, onto_neighbour


def test_everything_busy_or_excluded() -> None:
    everything = [p for plan in candidates("5", LINUX) for p in plan.all_ports()]
    with pytest.raises(PortPlanError, match="every port block"):
        choose_plan("5", LINUX, busy=everything)
    with pytest.raises(PortPlanError, match="no port block"):
        choose_plan("5", [(1, 65535)])
    with pytest.raises(ValueError, match="job_id"):
        choose_plan("12a", LINUX)


def test_ray_flags_and_round_trip() -> None:
    plan = choose_plan(str(random.Random(3).randint(1, 10**6)), LINUX)
    flags = dict(f.lstrip("-").split("=") for f in plan.ray_start_args())
    assert int(flags["dashboard-port"]) == plan.dashboard
    assert int(flags["min-worker-port"]) == plan.min_worker
    assert int(flags["max-worker-port"]) == plan.max_worker
    assert plan.ray_env() == {
        "AUTOSCALER_METRIC_PORT": str(plan.autoscaler_metrics),
        "DASHBOARD_METRIC_PORT": str(plan.dashboard_metrics),
    }
    assert PortPlan.from_dict(plan.to_dict()) == plan
    assert list(plan.jax_ports) == list(range(plan.jax_first, plan.jax_first + 16))


# ---------------------------------------------------------------- wide ephemeral ranges (#13 item 4)

SRUN = Excluded(60001, 63000, "SrunPortRange")


@pytest.mark.parametrize("ephemeral", [(1024, 65535), (9000, 65499)])
def test_a_wide_ephemeral_range_still_gets_a_plan_inside_it(ephemeral) -> None:
    exclusions = [Excluded(*ephemeral, "ip_local_port_range", soft=True), SRUN]
    assert block_starts(exclusions) == []  # nothing outside the range
    cands = candidates("4242", exclusions)
    assert len(cands) == len(fallback_starts(exclusions)) > 100
    for plan in cands:
        for p in plan.all_ports():
            assert not overlaps(p, FIXED_EXCLUSIONS) and not overlaps(p, [(60001, 63000)])
    assert choose_plan("4242", exclusions) == cands[0]
    # still deterministic per job, and neighbouring jobs start on different blocks
    assert candidates("4242", exclusions) == cands
    assert cands[0].block_start != candidates("4243", exclusions)[0].block_start


def test_blocks_outside_a_soft_range_come_before_those_inside() -> None:
    soft = Excluded(40000, 65535, "ip_local_port_range", soft=True)
    starts = [c.block_start for c in candidates("7", [soft])]
    outside = [s for s in starts if s + BLOCK - 1 < 40000]
    inside = [s for s in starts if s + BLOCK - 1 >= 40000]  # overlapping the range counts as inside
    assert outside and inside and starts == outside + inside
    assert 39936 in inside
    # a soft range that leaves blocks outside behaves as the old hard one for the first choices
    linux_soft = [Excluded(32768, 60999, soft=True), SRUN]
    assert [c.block_start for c in candidates("42", linux_soft)][:44] == [
        c.block_start for c in candidates("42", LINUX)
    ]


def test_hard_exclusions_are_never_used_and_the_error_names_their_source() -> None:
    with pytest.raises(PortPlanError, match=r"1-65535 \(ip_local_reserved_ports on n1\)"):
        candidates("5", [Excluded(1, 65535, "ip_local_reserved_ports on n1")])
    with pytest.raises(ValueError, match=r"70000-80000 \(ip_local_port_range on n2\)"):
        candidates("5", [Excluded(70000, 80000, "ip_local_port_range on n2", soft=True)])


def test_choose_probed_asks_for_a_probe_before_an_unchecked_block() -> None:
    exclusions = [Excluded(1024, 65535, soft=True), SRUN]
    first, second = candidates("9", exclusions)[:2]
    probed = first.all_ports() + second.all_ports()
    assert choose_probed("9", exclusions, busy=[], probed=probed) == first
    assert choose_probed("9", exclusions, busy=[first.gcs], probed=probed) == second
    # both probed ones busy: the next free candidate was never checked, so no answer yet
    assert choose_probed("9", exclusions, busy=[first.gcs, second.gcs], probed=probed) is None
    nxt = next_to_probe("9", exclusions, busy=[first.gcs, second.gcs], count=3)
    assert nxt == candidates("9", exclusions)[2:5]


def test_the_coordinator_port_is_a_function_of_the_job_id_outside_every_block() -> None:
    rng = random.Random(13)
    for _ in range(200):
        job = str(rng.randint(1, 10**8))
        lo = rng.randint(1024, 40000)
        ranges = [Excluded(lo, rng.randint(lo, 65535), soft=True), SRUN]
        port = job_coordinator_port(job)
        assert COORDINATOR_FIRST <= port < COORDINATOR_FIRST + COORDINATOR_COUNT
        for plan in candidates(job, ranges)[:5]:
            assert port not in plan.all_ports()
    assert COORDINATOR_COUNT == 224 and min(block_starts([])) == COORDINATOR_FIRST + COORDINATOR_COUNT
    ports = {job_coordinator_port(str(1000 + i)) for i in range(COORDINATOR_COUNT)}
    assert len(ports) == COORDINATOR_COUNT
    with pytest.raises(ValueError, match="job_id"):
        job_coordinator_port("12_3")
