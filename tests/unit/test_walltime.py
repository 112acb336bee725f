"""The walltime planner: SLURM times, leads, and which nodes to drain when (pure)."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest
import yaml
from testbed_support import REPO

from eray_provider.plan.drain import (
    EndingJob,
    RayNode,
    check_replace_lead,
    due_drains,
    due_replacements,
    effective_lead,
    failed_replacements,
    paired_visibility,
    replaced_drains,
    replacement_leads,
    worker_lead,
)
from eray_provider.plan.elastic_config import fill_elastic_config
from eray_provider.plan.node_spec import ray_labels
from eray_provider.plan.provider_config import ClusterConfigError, ProviderConfig
from eray_provider.plan.sbatch import SbatchRequest
from eray_provider.runtime.cluster_state import ClusterState
from eray_provider.runtime.end_watch import Pairs, gcs_needed
from eray_provider.runtime.slurm_jobs import sbatch_argv
from eray_provider.slurm.allocation import NodeShare
from eray_provider.slurm.scontrol import ENDS, PREEMPTED_REQUEUE, REQUEUED, parse_job, requeue_verdict
from eray_provider.slurm.squeue import JobInfo
from eray_provider.slurm.walltime import (
    WalltimeError,
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
    assert ProviderConfig.from_dict({}).drain_before_end_s == 300
    assert ProviderConfig.from_dict({"drain_before_end_s": 0}).drain_before_end_s == 0
    for bad in (-1, "60", True, 10**7):
        with pytest.raises(ClusterConfigError, match=f"provider.drain_before_end_s .* got {bad!r}"):
            ProviderConfig.from_dict({"drain_before_end_s": bad})


def test_replacements_are_staggered_within_a_type() -> None:
    end = 10_000.0
    jobs = [
        EndingJob("11", "cpu", end, 180),
        EndingJob("10", "cpu", end, 180),  # same end: the lower id first
        EndingJob("12", "cpu", end + 10, 180),  # within the stagger of the one before
        EndingJob("13", "cpu", end + 200, 180),  # far enough: a new run
        EndingJob("20", "gpu", end, 180),  # another type: its own run
    ]
    leads = replacement_leads(jobs, lead=60, stagger=20)
    assert leads == {"10": 90, "11": 70, "12": 60, "13": 60, "20": 60}
    # their replacements (started as submitted) end 20 s apart, 13's and 20's far off
    ends = sorted(j.end - leads[j.job_id] + j.time_limit_s for j in jobs if j.node_type == "cpu")
    assert [b - a for a, b in itertools.pairwise(ends)] == [20, 20, 190]
    # the lead is at most half the limit, the stagger at most up to 3/4 of it
    assert replacement_leads([EndingJob("1", "cpu", end, 100)], 600, 0) == {"1": 50}
    capped = replacement_leads([EndingJob(str(i), "cpu", end, 100) for i in range(4)], 40, 20)
    assert capped == {"0": 75, "1": 75, "2": 60, "3": 40}
    # due: the ones whose end is within their own lead
    due = due_replacements(jobs, end - 85, lead=60, stagger=20)
    assert sorted(j.job_id for j in due) == ["10"]
    assert sorted(j.job_id for j in due_replacements(jobs, end - 70, 60, 20)) == ["10", "11"]
    assert due_replacements(jobs, end, lead=0, stagger=20) == []


def test_staggered_replacements_end_apart() -> None:
    """Two jobs that end together: their replacements, started when submitted, end a
    stagger apart, and the next generation is not staggered any more."""
    limit, lead, stagger = 180.0, 60.0, 30.0
    gen = [EndingJob("1", "cpu", 1000.0, limit), EndingJob("2", "cpu", 1000.0, limit)]
    leads = replacement_leads(gen, lead, stagger)
    nxt = [EndingJob(f"n{j.job_id}", "cpu", j.end - leads[j.job_id] + limit, limit) for j in gen]
    assert abs(nxt[0].end - nxt[1].end) == stagger
    assert set(replacement_leads(nxt, lead, stagger).values()) == {lead}
    # where the cap cuts the spread (3-minute jobs, default leads), later generations
    # spread further until the ends are a stagger apart
    limit, lead, stagger = 180.0, 600.0, 60.0
    gen = [EndingJob("1", "cpu", 1000.0, limit), EndingJob("2", "cpu", 1000.0, limit)]
    gaps = []
    for _ in range(4):
        leads = replacement_leads(gen, lead, stagger)
        gen = [EndingJob(j.job_id, "cpu", j.end - leads[j.job_id] + limit, limit) for j in gen]
        gaps.append(abs(gen[0].end - gen[1].end))
    assert gaps[0] == 45 and gaps[-1] == stagger, gaps


def test_the_autoscaler_sees_one_node_of_each_pair() -> None:
    successors = {"j20-0": "j10-0", "j21-0": "j11-0", "j22-0": "j12-0", "j23-0": "j13-0"}
    alive = {"j10-0", "j11-0", "j20-0", "j21-0", "j22-0", "j13-0"}
    hidden = paired_visibility(successors, alive, ready={"j21-0"}, handed_over=(), drained=())
    # j20 is not ready (old shown); j21 stands by to start Ray (old hidden); j12 is gone (j22 shown);
    # j23 is not alive (its job ended before it started): the old one stays
    assert hidden == {"j20-0", "j11-0", "j12-0"}
    # a chain: j30 replaces j20, which replaced j10
    chain = {"j20-0": "j10-0", "j30-0": "j20-0"}
    assert paired_visibility(chain, {"j20-0", "j30-0"}, {"j20-0", "j30-0"}, (), ()) == {"j10-0", "j20-0"}


def test_a_drained_node_gives_way_to_its_pending_replacement() -> None:
    # j10 drained (SIGURG, or its lead) while j20 still waits in the queue: j20 is shown in
    # its place, or the autoscaler would replace the draining node too (two jobs for one)
    pair = {"j20-0": "j10-0"}
    alive = {"j10-0", "j20-0"}
    assert paired_visibility(pair, alive, ready=(), handed_over=(), drained={"j10-0"}) == {"j10-0"}
    assert paired_visibility(pair, alive, ready=(), handed_over=(), drained=()) == {"j20-0"}


def test_a_node_handed_over_stays_hidden_when_its_replacement_dies() -> None:
    pair = {"j20-0": "j10-0"}
    # j20 took over and then ended (idle-terminated, crashed): j10, still running, is not
    # shown again (the autoscaler took it for ended, and it would be a node never launched)
    assert paired_visibility(pair, {"j10-0"}, ready={"j20-0"}, handed_over={"j20-0"}, drained=()) == {"j10-0"}
    # j20 ended before it took over: j10 is shown, as it was, and the pair is forgotten
    assert paired_visibility(pair, {"j10-0"}, ready=(), handed_over=(), drained=()) == set()
    assert failed_replacements(pair, {"j10-0"}, handed_over=()) == {"j20-0": "j10-0"}
    assert failed_replacements(pair, {"j10-0"}, handed_over={"j20-0"}) == {}
    assert failed_replacements(pair, {"j10-0", "j20-0"}, handed_over=()) == {}


def test_a_replaced_node_is_drained_once_its_replacement_joined() -> None:
    old, new = RayNode("aa", "j10-0", "10"), RayNode("bb", "j20-0", "20")
    successors = {"j20-0": "j10-0", "j21-0": "j11-0"}
    drains = replaced_drains([old, new], successors, {"10": 1060.0}, 1000.0)
    assert [(d.node, d.deadline) for d in drains] == [(old, 1060.0)]  # j21 has not joined
    assert drains[0].message.startswith("replaced by j20-0 (its SLURM job 20 has joined); SLURM job 10 ends")
    # the old node gone already: nothing to drain; no end known: no deadline
    assert replaced_drains([new], successors, {}, 1000.0) == []
    [drain] = replaced_drains([old, new], successors, {}, 1000.0)
    assert drain.deadline == 0.0 and "ends" not in drain.message


def test_replace_keys_are_checked() -> None:
    assert ProviderConfig.from_dict({}, elastic=True).replace_before_end_s == 600
    for bad in (-1, "60", True, 8 * 86400):
        with pytest.raises(
            ClusterConfigError, match=rf"provider.end_stagger_s .*\(no stagger\).* got {bad!r}"
        ):
            ProviderConfig.from_dict({"end_stagger_s": bad}, elastic=True)


def test_a_node_being_replaced_drains_later_and_is_signalled_later() -> None:
    from eray_provider.runtime.end_watch import job_ends
    from eray_provider.slurm.squeue import JobInfo

    # a 3-minute job: drained 90 s before its end (half the limit), 45 s while replaced
    assert worker_lead(300, 180, replaced=False) == 90
    assert worker_lead(300, 180, replaced=True) == 45
    assert worker_lead(300, None, replaced=True) == 150
    jobs = {
        j: JobInfo(j, "RUNNING", "x", "", "", 1, end_time="2026-12-04T13:00:00", time_limit="3:00")
        for j in ("10", "11")
    }
    ends, leads = job_ends(jobs, {"10", "11", "12"}, 300, replaced={"10"})
    assert leads == {"10": 45, "11": 90} and set(ends) == {"10", "11"}


def test_the_replacement_comes_before_the_drain_for_every_time_limit() -> None:
    assert check_replace_lead(600, 300) is None and check_replace_lead(0, 300) is None
    assert check_replace_lead(60, 0) is None
    for replace, drain in ((150, 300), (100, 300)):
        why = check_replace_lead(replace, drain)
        assert why and f"replace_before_end_s ({replace})" in why and f"drain_before_end_s ({drain})" in why
    # a lead over half the drain's is longer than the drain's for every time limit
    for limit in (60, 100, 180, 300, 600, 1200, 3600):
        for replace, drain in ((151, 300), (600, 300), (60, 100), (11, 20)):
            assert effective_lead(replace, limit) > worker_lead(drain, limit, replaced=True), (limit, replace)
    config = yaml.safe_load(REPO.joinpath("cluster_yamls/slurm-autoscale.yaml").read_text())
    config["provider"].update(replace_before_end_s=100, drain_before_end_s=300)
    with pytest.raises(ClusterConfigError, match=r"replace_before_end_s \(100\) must be more than half"):
        fill_elastic_config(config, None)


# ---------------------------------------------------------------------- requeue
RUNNING_JOB = {"JobState": "RUNNING", "Requeue": "1", "Restarts": "0", "PreemptTime": "None"}


@pytest.mark.parametrize(
    ("fields", "mode", "expected"),
    [
        ({}, "REQUEUE", ENDS),  # running, not preempted: it ends at its end
        ({"PreemptTime": "2026-12-05T12:23:16"}, "REQUEUE", PREEMPTED_REQUEUE),  # preempted, runs its grace
        ({"PreemptTime": "2026-12-05T12:23:16"}, "GANG,REQUEUE", PREEMPTED_REQUEUE),
        ({"PreemptTime": "2026-12-05T12:23:16"}, "CANCEL", ENDS),  # preemption cancels
        ({"PreemptTime": "2026-12-05T12:23:16", "Requeue": "0"}, "REQUEUE", ENDS),  # --no-requeue
        ({"JobState": "COMPLETING", "PreemptTime": "2026-12-05T12:23:16"}, "REQUEUE", ENDS),
        ({"JobState": "REQUEUED"}, "", REQUEUED),  # being requeued now
        ({"JobState": "PENDING", "Restarts": "1"}, "", REQUEUED),  # requeued, waits to run again
        ({"JobState": "PENDING"}, "", ENDS),  # never ran
        ({"JobState": "CANCELLED", "Restarts": "1"}, "", ENDS),
    ],
)
def test_requeue_verdict(fields, mode, expected) -> None:
    assert requeue_verdict({**RUNNING_JOB, **fields}, mode) == expected


# ---------------------------------------------------------------------- the watcher's GCS
def test_the_head_watcher_needs_the_gcs_only_near_a_drain(tmp_path) -> None:
    """``end_watch`` connects to the GCS (and imports Ray) only when a job of the cluster
    nears its drain or a replacement pair exists: while the cluster starts, a round is one
    squeue. Another user's job (not the cluster's) near its end does not count."""
    now = time.time()

    def job(job_id: str, ends_in: float, limit: str = "1:00:00") -> JobInfo:
        end = format_timestamp(now + ends_in)
        return JobInfo(job_id, "RUNNING", "x", "n1", "None", 1, end_time=end, time_limit=limit)

    state = ClusterState("c", "7", tmp_path)
    quiet = Pairs({}, set(), {"8"})
    far = {"7": job("7", 3600), "8": job("8", 3600), "99": job("99", 5)}
    assert not gcs_needed(far, state, quiet, 300, set(), 10)
    assert gcs_needed({**far, "7": job("7", 300 + 15)}, state, quiet, 300, set(), 10)  # the head's job
    assert gcs_needed({**far, "8": job("8", 300 + 15)}, state, quiet, 300, set(), 10)  # a worker's job
    # a replaced worker drains at half the lead: not yet
    assert not gcs_needed({**far, "8": job("8", 300 + 15)}, state, quiet, 300, {"8"}, 10)
    assert gcs_needed(far, state, Pairs({"j9-0": "j8-0"}, set(), {"8", "9"}), 300, set(), 10)  # a handover
    assert not gcs_needed(None, state, quiet, 300, set(), 10)  # squeue failed: no verdict
    assert not gcs_needed({**far, "7": job("7", 15)}, state, quiet, 0, set(), 10)  # lead 0: never drains
    assert gcs_needed(far, None, None, 300, set(), 10)  # no state: cannot tell the cluster's jobs


def test_a_job_whose_end_moved_earlier_was_cut_short() -> None:
    """Preemption moves a job's end to now plus GraceTime: the provider then leaves its
    replacement to Ray's autoscaler (the node drains at SLURM's signal)."""
    from eray_provider.slurm.walltime import CUT_SHORT_SECONDS, cut_short

    first = 10_000.0
    assert not cut_short(None, first)  # first seen
    assert not cut_short(first, first)  # running to its end as planned
    assert not cut_short(first, first - CUT_SHORT_SECONDS + 1)  # a clock's jitter
    assert cut_short(first, first - 1800 + 30)  # 30 min early: preempted
