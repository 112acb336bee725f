"""The walltime planner: SLURM times, leads, and which nodes to drain when (pure)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from eray_provider.allocation import NodeShare
from eray_provider.cluster_config import ClusterConfigError, common_provider_keys
from eray_provider.node_spec import ray_labels
from eray_provider.sbatch import SbatchRequest
from eray_provider.scontrol import parse_job
from eray_provider.slurm_jobs import sbatch_argv
from eray_provider.walltime import (
    RayNode,
    WalltimeError,
    due_drains,
    effective_lead,
    format_duration,
    format_timestamp,
    parse_duration,
    parse_timestamp,
)


def test_durations_in_every_slurm_form() -> None:
    assert parse_duration("5") == 300
    assert parse_duration("10:30") == 630
    assert parse_duration("1:02:03") == 3723
    assert parse_duration("2-00") == 2 * 86400
    assert parse_duration("1-02:03") == 86400 + 2 * 3600 + 180
    assert parse_duration("1-02:03:04") == 86400 + 2 * 3600 + 184
    assert parse_duration("UNLIMITED") is None and parse_duration("") is None
    with pytest.raises(WalltimeError, match="'1:x'"):
        parse_duration("1:x")
    assert format_duration(3723) == "1:02:03" and format_duration(90061) == "1-01:01:01"


def test_timestamps_round_trip_and_unknown_ends() -> None:
    now = float(int(time.time()))
    assert parse_timestamp(format_timestamp(now)) == now
    assert parse_timestamp("Unknown") is None and parse_timestamp("NONE") is None
    with pytest.raises(WalltimeError, match="'tomorrow'"):
        parse_timestamp("tomorrow")


def test_lead_is_at_most_half_the_time_limit() -> None:
    assert effective_lead(300, 3600) == 300
    assert effective_lead(300, 180) == 90
    assert effective_lead(300, None) == 300


def test_due_drains_follow_the_end_and_its_moves() -> None:
    a, b, c = RayNode("aa", "n1.1", "7"), RayNode("bb", "n2.2", "8"), RayNode("cc", "n3.3", "9")
    now = 1000.0
    ends = {"7": now + 50, "8": now + 500, "9": None}
    leads = {"7": 60.0, "8": 60.0, "9": 60.0}
    drains = due_drains([a, b, c], ends, now, leads, {})
    assert [(d.node.node_id, d.deadline) for d in drains] == [("aa", now + 50)]
    assert "SLURM job 7 ends at" in drains[0].message and "(in 50 s)" in drains[0].message
    # drained once: not again for the same end, again when it moved earlier (a preemption)
    assert due_drains([a], ends, now + 10, leads, {"aa": now + 50}) == []
    moved = due_drains([a], {"7": now + 20}, now + 10, leads, {"aa": now + 50})
    assert [d.deadline for d in moved] == [now + 20]
    # a job squeue did not list (a failed squeue, no verdict) is left alone
    assert due_drains([a], {}, now, leads, {}) == []


def test_scontrol_gives_the_end_and_the_limit() -> None:
    text = (
        "JobId=42 JobName=x\n   JobState=RUNNING Reason=None\n   TimeLimit=00:10:00\n"
        "   StartTime=2026-12-04T13:10:06 EndTime=2026-12-04T13:20:06\n"
        "   NodeList=n1 NumCPUs=2\n     Nodes=n1 CPU_IDs=0-1 Mem=100 GRES=\n"
    )
    alloc = parse_job(text, "42")
    assert alloc.time_limit_s == 600 and alloc.end_time == parse_timestamp("2026-12-04T13:20:06")
    assert type(alloc).from_dict(alloc.to_dict()) == alloc


def test_the_end_is_a_label_and_the_warning_a_signal() -> None:
    labels = ray_labels(NodeShare("n1", 2), "42", 0, 1796391258.4)
    assert labels["slurm-end-time"] == "1796391258"
    assert "slurm-end-time" not in ray_labels(NodeShare("n1", 2), "42", 0)
    request = SbatchRequest(cpus_per_node=1)
    assert "--signal=URG@300" in sbatch_argv(request, "j", Path("/dev/null"), warn_s=300)
    assert not any(a.startswith("--signal") for a in sbatch_argv(request, "j", Path("/dev/null")))
    own = SbatchRequest(cpus_per_node=1, extra=("--signal=USR2@60",))
    assert [a for a in sbatch_argv(own, "j", Path("/dev/null"), warn_s=300) if "signal" in a] == [
        "--signal=USR2@60"
    ]


def test_drain_lead_is_checked() -> None:
    assert common_provider_keys({})["drain_before_end_s"] == 300
    assert common_provider_keys({"drain_before_end_s": 0})["drain_before_end_s"] == 0
    for bad in (-1, "60", True, 10**7):
        with pytest.raises(ClusterConfigError, match=f"provider.drain_before_end_s .* got {bad!r}"):
            common_provider_keys({"drain_before_end_s": bad})
