"""Which Ray nodes to drain, and which elastic workers to replace, as their SLURM jobs'
ends near: pure policy over the ends ``slurm.walltime`` reads.

A Ray worker node whose job ends within the drain lead is drained through Ray's drain API
with the job's end as the deadline (``end_watch`` does the I/O): Ray places no new tasks
or actors there, its raylet stops once nothing runs there any more, and drivers see the
drain (``ray._private.state.state.get_draining_nodes``, Ray Train's preemption handling,
``eray_provider.jax.drain_notice``). An elastic worker is replaced before its end
(``replacement_leads``, ``due_replacements``) and its replacement takes its place in the
autoscaler's view once it joined (``paired_visibility``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..slurm.walltime import format_timestamp

#: How long before its job's end a node is drained (``provider.drain_before_end_s``).
DEFAULT_DRAIN_LEAD_SECONDS = 300

#: A node drained for an end is drained again when its job's end moves this much earlier.
EARLIER_BY_SECONDS = 5.0


def effective_lead(lead: float, time_limit_s: float | None) -> float:
    """The drain lead used for a job: at most half its time limit, so that a short job is
    not drained from its start by a lead meant for long ones."""
    if time_limit_s is None or time_limit_s <= 0:
        return lead
    return min(lead, time_limit_s / 2)


def worker_lead(lead: float, time_limit_s: float | None, replaced: bool) -> float:
    """The drain lead of an elastic worker's job, which is also its ``--signal=URG@`` lead
    (the signal drains the node at once): its ``effective_lead``, and half that when the
    cluster replaces workers ahead of their end (``replaced``). Then the replacement
    comes first (``check_replace_lead`` keeps its lead longer) and the handover drains the
    old node as soon as the replacement has joined; until then the old node keeps taking
    work for as long as it safely can. ``time_limit_s``: the job's time limit (None:
    unknown)."""
    own = effective_lead(lead, time_limit_s)
    return own / 2 if replaced else own


def check_replace_lead(replace_lead: float, drain_lead: float) -> str | None:
    """Why ``replace_before_end_s`` cannot go with ``drain_before_end_s``, or None.

    A worker of a replacing cluster drains at half its drain lead (``worker_lead``), and
    both leads are capped at half the job's time limit; a replacement lead over half the
    drain lead is longer than the drain's for every time limit, so the replacement is
    submitted before the node drains (a node drained first is replaced by Ray's own
    autoscaler instead, at once and unstaggered)."""
    if replace_lead <= 0 or drain_lead <= 0 or replace_lead > drain_lead / 2:
        return None
    return (
        f"provider.replace_before_end_s ({replace_lead:g}) must be more than half of "
        f"provider.drain_before_end_s ({drain_lead:g}): a replaced worker drains at half its "
        "drain lead, and its replacement must be submitted before that"
    )


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


#: How long before a worker job's end its replacement job is submitted
#: (``provider.replace_before_end_s``): the queue wait one expects, at most half the job's
#: time limit.
DEFAULT_REPLACE_LEAD_SECONDS = 600

#: Jobs of one type whose ends lie closer than this are replaced this much apart
#: (``provider.end_stagger_s``), so that their replacements, and so their ends, spread.
DEFAULT_STAGGER_SECONDS = 60

#: The most of a job's time limit that its replacement lead, stagger included, may take.
MAX_REPLACE_SHARE = 0.75


@dataclass(frozen=True)
class EndingJob:
    """A running worker job of an elastic cluster that has no replacement yet."""

    job_id: str
    node_type: str
    end: float  # epoch seconds (squeue's %e)
    time_limit_s: float


def replacement_leads(jobs: Iterable[EndingJob], lead: float, stagger: float) -> dict[str, float]:
    """Job id -> how long before its end its replacement is submitted.

    Each job's lead is at least its ``effective_lead`` (at most half its time limit).
    Jobs of one node type are taken by end (then id), from the last: a job whose
    replacement would end less than ``stagger`` before the next one's (replacements
    started as submitted, for the same time limit) gets just the lead more that keeps
    them ``stagger`` apart. So jobs that would end together are replaced ``stagger``
    apart, their replacements end that far apart, and the ends stay spread over the
    generations; no lead grows past the least that does it. A lead never exceeds
    ``MAX_REPLACE_SHARE`` of the time limit (where it would, the spread is less, and
    the next generation spreads further)."""
    by_type: dict[str, list[EndingJob]] = {}
    for job in jobs:
        by_type.setdefault(job.node_type, []).append(job)
    out: dict[str, float] = {}
    for same in by_type.values():
        same.sort(key=lambda j: (j.end, int(j.job_id) if j.job_id.isdigit() else 0, j.job_id))
        after: tuple[float, float] | None = None  # (end, lead) of the next job by end
        for job in reversed(same):
            own = effective_lead(lead, job.time_limit_s)
            if after is not None:
                # replacements end at end - lead + limit: keep this one `stagger` earlier
                own = max(own, after[1] + stagger - (after[0] - job.end))
            own = min(own, MAX_REPLACE_SHARE * job.time_limit_s)
            out[job.job_id] = own
            after = (job.end, own)
    return out


def due_replacements(jobs: Iterable[EndingJob], now: float, lead: float, stagger: float) -> list[EndingJob]:
    """The jobs whose replacement is due now (``replacement_leads``); none when ``lead`` is 0."""
    if lead <= 0:
        return []
    jobs = list(jobs)
    leads = replacement_leads(jobs, lead, stagger)
    return [j for j in jobs if j.end - now <= leads[j.job_id]]


def paired_visibility(
    successors: Mapping[str, str],
    alive: Iterable[str],
    ready: Iterable[str],
    handed_over: Iterable[str],
    drained: Iterable[str],
) -> set[str]:
    """The node ids to hide from the autoscaler, of a replacement and the node it replaces.

    ``successors``: replacement node id -> the node it replaces. ``alive``: the node ids
    that live (pending or running). ``ready``: replacements whose job runs and whose
    ``node_run`` stands by to start Ray (or has started it). ``handed_over``: the
    replacements shown to the autoscaler once already (their ``handover`` marker).
    ``drained``: the nodes drained already.

    The autoscaler sees one node of each pair, so that neither its counts
    (``min_workers``, ``max_workers``) nor its idle and pending timeouts see a node
    more: the old one until the replacement is ready, then the replacement. The old one
    gives way earlier when it is gone or drained (a drained node that the autoscaler
    saw would be replaced by the autoscaler too: two jobs for one node), and for good
    once the replacement was handed over: the autoscaler took the old node for ended
    then, and showing it again, after its replacement died, would be a node that it
    never launched. A replacement that died before it was handed over leaves the old
    node shown, as it was all along (the provider forgets the pair, to replace it
    again). Ray's autoscaler (v2) stops a Ray node of a type already at its count, so a
    replacement starts Ray only once it is shown (``node_run``); an old node hidden while
    its Ray runs is left alone (its instance ended), drained once the replacement has
    joined, and ends once idle or at its job's end."""
    alive, ready, handed, drained = set(alive), set(ready), set(handed_over), set(drained)
    hidden = set()
    for new, old in successors.items():
        if new in handed:
            hidden.add(old)
        elif new in alive:
            hidden.add(old if new in ready or old not in alive or old in drained else new)
    return hidden


def failed_replacements(
    successors: Mapping[str, str], alive: Iterable[str], handed_over: Iterable[str]
) -> dict[str, str]:
    """The pairs whose replacement ended before it was handed over (its job failed or was
    cancelled, its ``node_run`` gave up standing by): replacement -> the node it was to
    replace, which the provider replaces again (after ``REPLACE_RETRY_SECONDS``)."""
    alive, handed = set(alive), set(handed_over)
    return {new: old for new, old in successors.items() if new not in alive and new not in handed}


def replaced_drains(
    nodes: Iterable[RayNode], successors: Mapping[str, str], ends: Mapping[str, float | None], now: float
) -> list[Drain]:
    """The drains of the nodes whose replacement's Ray node has joined. ``nodes``: the
    alive Ray nodes; ``successors``: replacement node id -> the node it replaces
    (provider node ids); ``ends``: job -> end. The old node's deadline is its job's end
    (none when unknown)."""
    alive = {n.instance_id: n for n in nodes}
    drains = []
    for new, old_id in successors.items():
        old = alive.get(old_id)
        if new not in alive or old is None:
            continue
        end = ends.get(old.job_id)
        message = f"replaced by {new} (its SLURM job {alive[new].job_id} has joined)"
        if end is not None:
            message += f"; {drain_message(old.job_id, end, now)}"
        drains.append(Drain(old, end or 0.0, message))
    return drains
