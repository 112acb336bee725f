"""When the cluster's SLURM jobs end, and which Ray nodes to drain for it: pure.

A SLURM job ends at its time limit or, when preempted, at the end of its grace time: in
both cases SLURM moves the job's ``EndTime`` to when it will end (preemption sets it to
now plus the partition's ``GraceTime``; ``scontrol update TimeLimit=`` moves it too), so
``EndTime`` is the one fact to follow. squeue's ``%L`` (time left) is not: it keeps
counting down to the old time limit after a preemption.

A Ray worker node whose job ends within the drain lead is drained through Ray's drain API
with the job's end as the deadline (``end_watch`` does the I/O): Ray places no new tasks
or actors there, its raylet stops once nothing runs there any more, and drivers see the
drain (``ray._private.state.state.get_draining_nodes``,
Ray Train's preemption handling, ``eray_provider.jax.drain_notice``).

SLURM can also warn a job's steps with a signal before it ends (``--signal=SIG@SECONDS``,
and at preemption with ``SlurmctldParameters=preempt_send_user_signal``). It signals every
process of the step, Ray's too, so the signal must be one that kills nothing:
``END_SIGNAL`` (SIGURG), which every process ignores unless it asks for it, and which
``node_run`` takes as "this job is ending: drain this node now".
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: The signal SLURM is asked to send before a job's end (``--signal=URG@<lead>``).
END_SIGNAL = "URG"
#: How long before its job's end a node is drained (``provider.drain_before_end_s``).
DEFAULT_DRAIN_LEAD_SECONDS = 300
#: A node drained for an end is drained again when its job's end moves this much earlier.
EARLIER_BY_SECONDS = 5.0
_UNKNOWN = ("", "Unknown", "NONE", "None", "N/A", "(null)", "INVALID")


class WalltimeError(ValueError):
    """A SLURM time that cannot be read."""


def parse_timestamp(text: str) -> float | None:
    """``2026-12-04T13:11:43`` (SLURM's local time, as squeue ``%e`` and scontrol
    ``EndTime=`` print it) -> seconds since the epoch; None for an unknown or unlimited end."""
    text = text.strip()
    if text in _UNKNOWN:
        return None
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError as e:
        raise WalltimeError(f"cannot read the SLURM time {text!r} (expected YYYY-MM-DDTHH:MM:SS)") from e


def parse_duration(text: str) -> float | None:
    """SLURM's durations (``%l``, ``TimeLimit=``): ``MM``, ``MM:SS``, ``HH:MM:SS``,
    ``D-HH[:MM[:SS]]`` -> seconds; None for ``UNLIMITED`` or unknown."""
    text = text.strip()
    if text in _UNKNOWN or text in ("UNLIMITED", "INFINITE", "NOT_SET"):
        return None
    days, sep, rest = text.partition("-")
    if not sep:
        days, rest = "0", text
    parts = rest.split(":")
    if not days.isdigit() or not all(p.isdigit() for p in parts) or len(parts) > 3:
        raise WalltimeError(f"cannot read the SLURM duration {text!r}")
    nums = [int(p) for p in parts]
    if sep:  # D-HH, D-HH:MM, D-HH:MM:SS
        h, m, sec = [*nums, 0, 0][:3]
    elif len(nums) == 3:
        h, m, sec = nums
    elif len(nums) == 2:
        h, m, sec = 0, nums[0], nums[1]
    else:
        h, m, sec = 0, nums[0], 0
    return float(((int(days) * 24 + h) * 60 + m) * 60 + sec)


def format_timestamp(epoch: float) -> str:
    """The inverse of ``parse_timestamp``: local time, SLURM's format."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


def format_duration(seconds: float) -> str:
    """``3725`` -> ``1:02:05``; with days ``1-00:00:00`` (SLURM's way)."""
    total = max(0, round(seconds))
    days, rest = divmod(total, 86400)
    minutes = f"{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{rest // 3600:02d}:{minutes}" if days else f"{rest // 3600}:{minutes}"


def describe_end(end: float | None, time_limit_s: float | None, now: float) -> str:
    """What ``inspect`` says of a job's end: ``2026-12-04T13:20:06 (in 0:09:52; time
    limit 0:10:00)``, or that it has none known."""
    limit = "unlimited" if time_limit_s is None else format_duration(time_limit_s)
    if end is None:
        return f"unknown (time limit {limit})"
    return f"{format_timestamp(end)} (in {format_duration(end - now)}; time limit {limit})"


def effective_lead(lead: float, time_limit_s: float | None) -> float:
    """The drain lead used for a job: at most half its time limit, so that a short job is
    not drained from its start by a lead meant for long ones."""
    if time_limit_s is None or time_limit_s <= 0:
        return lead
    return min(lead, time_limit_s / 2)


@dataclass(frozen=True)
class RayNode:
    """An alive Ray node as the drain planner needs it."""

    node_id: str  # Ray's hex node id
    instance_id: str  # the provider's node id (RAY_CLOUD_INSTANCE_ID)
    job_id: str  # its ``slurm-job`` label


@dataclass(frozen=True)
class Drain:
    """One drain request: node, deadline (epoch seconds) and the reason Ray shows."""

    node: RayNode
    deadline: float
    message: str


def drain_message(job_id: str, end: float, now: float) -> str:
    return f"SLURM job {job_id} ends at {format_timestamp(end)} (in {max(0, round(end - now))} s)"


def due_drains(
    nodes: Iterable[RayNode],
    ends: Mapping[str, float | None],
    now: float,
    leads: Mapping[str, float],
    drained: Mapping[str, float],
) -> list[Drain]:
    """The drains to request now.

    ``ends``: job id -> its end (None: unknown or unlimited; a job missing from it is
    unknown too, and a node of an unknown end is left alone: a failed squeue is no
    verdict). ``leads``: job id -> its drain lead (``effective_lead``). ``drained``: Ray
    node id -> the deadline it was drained with. A node is drained once its job ends
    within the lead, and again when that end moved more than ``EARLIER_BY_SECONDS``
    earlier (a preemption after a time-limit drain)."""
    out = []
    for node in nodes:
        end = ends.get(node.job_id)
        lead = leads.get(node.job_id)
        if end is None or lead is None or end - now > lead:
            continue
        before = drained.get(node.node_id)
        if before is not None and before - end <= EARLIER_BY_SECONDS:
            continue
        out.append(Drain(node, end, drain_message(node.job_id, end, now)))
    return out
