"""The per-job port plan (pure)."""

from __future__ import annotations

import random

import pytest

from eray_provider.ports import (
    BLOCK,
    FIXED_EXCLUSIONS,
    PortPlan,
    PortPlanError,
    block_starts,
    candidates,
    choose_plan,
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
