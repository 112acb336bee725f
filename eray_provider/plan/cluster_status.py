"""What ``eray-provider status`` says of one cluster, from what was read about it: pure.

The facts come from three places, read elsewhere (``status``): the cluster's state dir
(node records, markers, port plan, config), one ``squeue`` of the user's jobs, and the
head's GCS (which node ids are alive in Ray). Each may be missing: a ``squeue`` that
failed is not an answer about the job (the cluster's state is then ``unknown``, never
``ended``), and a GCS that did not answer leaves every node's Ray state ``unknown``.

Cluster states, in the order they are decided:

- ``down``: torn down; only the node logs collected at its end are left (removed by
  ``--prune`` once its job has ended)
- ``elsewhere``: the cluster is of another SLURM cluster (a HOME shared by two): only
  its own controller can say anything of its job
- ``unknown``: squeue did not answer
- ``ended``: SLURM says the head's job is over (a final state, or no longer listed)
- ``ending``: the job is over but not final yet (COMPLETING, held, requeued, stopped)
- ``stopping``: ``ray down`` began and has not finished
- ``pending``: the head's job waits in the queue (an elastic cluster from a login node)
- ``head-gone``: the job runs, the head's Ray does not (exited, or no head recorded)
- ``unreachable``: the head's GCS did not answer from here
- ``degraded``: some expected node is not alive in Ray
- ``running``: every expected node is alive
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from ..slurm.forms import TERMINAL_STATES
from ..slurm.squeue import JobInfo
from ..slurm.walltime import format_timestamp
from .markers import Marker
from .names import parse_worker_job_name
from .node_phase import NodePhase, Slurm, node_phase
from .node_record import NodeRecord, parse_records
from .ports import PortPlan
from .provider_config import is_elastic

#: What ``status`` says of a node: its phase (``node_phase``) as a user reads it, with
#: Ray's word on it. ``alive``: listed alive by the head's GCS; ``not-in-ray``: live in
#: SLURM, not (or not yet) in Ray; ``exited``: its process ended; ``pending``: its job
#: waits in the queue (again, after a preemption: ``requeued``); ``job-ended``: SLURM
#: says its job is over; ``unknown``: neither squeue nor the GCS could tell; an elastic
#: worker's replacement not joined yet is ``replacing``, and the worker it replaced,
#: once gone, ``replaced``.
NodeState = Literal[
    "alive", "not-in-ray", "exited", "pending", "job-ended", "unknown", "replacing", "replaced"
]


@dataclass(frozen=True)
class NodeStatus:
    node_id: str
    role: str
    #: the SLURM node it runs on ("" while its elastic job is pending)
    slurm_node: str
    #: the SLURM job it runs in
    slurm_job: str
    state: NodeState
    detail: str = ""
    #: the reason and deadline of its drain (``end_watch``), "" when not drained
    draining: str = ""


@dataclass
class ClusterStatus:
    name: str
    job_id: str
    #: fixed (the nodes of one allocation) or elastic (worker jobs of their own)
    kind: str
    state: str
    state_dir: str
    slurm_state: str = ""
    time_left: str = ""
    end_time: str = ""
    token_file: str = ""
    head_address: str = ""
    dashboard: str = ""
    ports: dict[str, Any] = field(default_factory=dict)
    nodes: list[NodeStatus] = field(default_factory=list)
    expected: int = 0
    #: nodes alive in Ray; None when the GCS was not asked or did not answer
    alive: int | None = None
    problems: list[str] = field(default_factory=list)
    #: node logs collected into the state dir (node ids)
    logs: list[str] = field(default_factory=list)
    #: SLURM says the job ended: ``status --prune`` removes what is left of it
    prunable: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def job_over(job_id: str, jobs: Mapping[str, JobInfo]) -> bool:
    """SLURM says the job will not run again: listed in a final state, or no longer listed
    (squeue lists every pending and running job of the user)."""
    job = jobs.get(job_id)
    return job is None or job.state in TERMINAL_STATES


def down_status(
    name: str,
    job_id: str,
    state_dir: str,
    logs: list[str],
    jobs: Mapping[str, JobInfo] | None,
    same_cluster: bool,
) -> ClusterStatus:
    """A cluster torn down, whose collected node logs are all that is left of it;
    ``same_cluster``: its logs say it ran on this SLURM cluster (or say nothing)."""
    job = jobs.get(job_id) if jobs is not None else None
    st = ClusterStatus(name=name, job_id=job_id, kind="-", state="down", state_dir=state_dir, logs=logs)
    st.slurm_state = job.state if job else ""
    st.prunable = jobs is not None and same_cluster and job_over(job_id, jobs)
    return st


def unreadable_status(name: str, job_id: str, state_dir: str, error: str) -> ClusterStatus:
    """A state dir that could not be read: shown, never pruned."""
    st = ClusterStatus(name=name, job_id=job_id, kind="-", state="unreadable", state_dir=state_dir)
    st.problems.append(f"{state_dir} could not be read: {error}")
    return st


def summarize(
    doc: Mapping[str, Any],
    ips: Mapping[str, str],
    exits: Mapping[str, str],
    provider: Mapping[str, Any],
    plan: PortPlan | None,
    jobs: Mapping[str, JobInfo] | None,
    alive: Mapping[str, str] | None,
    *,
    drains: Mapping[str, str] | None = None,
    markers: frozenset[str] = frozenset(),
    state_dir: str,
    token_file: str,
    logs: list[str] | None = None,
    squeue_error: str = "",
    gcs_error: str = "",
    slurm_cluster: str | None = None,
) -> ClusterStatus:
    """One cluster's status.

    ``doc`` is its ``state.json``; ``ips`` and ``exits`` map node ids to what their
    ``.ip`` and ``.exit`` markers hold (an address; the exit code of a node whose Ray
    ended), ``drains`` what their ``.drain`` markers hold (JSON), ``markers`` the names of all marker
    files (``ClusterState.markers``; the kinds above are read from their own arguments, the
    others, such as the ``handover`` of an elastic replacement whose Ray joined, from here);
    ``provider`` the provider section of
    its ``cluster.json`` ({} when there is none), ``jobs`` the user's jobs by id as squeue
    listed them (None: squeue failed, ``squeue_error`` says how), ``alive`` node id ->
    address of the nodes the head's GCS lists alive (None: not asked, or no answer, as
    ``gcs_error`` says); ``slurm_cluster`` the SLURM cluster squeue answered for."""
    job_id = str(doc["job_id"])
    st = ClusterStatus(
        name=str(doc["cluster_name"]),
        job_id=job_id,
        kind="elastic" if is_elastic(provider) else "fixed",
        state="",
        state_dir=state_dir,
        token_file=token_file,
        ports=plan.to_dict() if plan else {},
        logs=list(logs or []),
    )
    head_job = jobs.get(job_id) if jobs is not None else None
    if head_job is not None:
        st.slurm_state = head_job.state
        if head_job.live:
            st.time_left, st.end_time = head_job.time_left, head_job.end_time

    records = {i: r for i, r in parse_records(doc.get("nodes", {})).items() if not r.terminated}
    heads = [i for i, r in records.items() if r.role == "head"]
    head = heads[-1] if heads else None
    if head is not None and head in ips and plan is not None:
        st.head_address = f"{ips[head]}:{plan.gcs}"
        st.dashboard = f"{ips[head]}:{plan.dashboard}"

    recorded = doc.get("slurm_cluster")
    elsewhere = bool(recorded) and recorded != slurm_cluster
    if elsewhere:
        jobs = None  # another controller's job ids (or none known here): squeue says nothing of them
    job_ended = jobs is not None and (head_job is None or not head_job.live)
    handed = Marker.HANDOVER.node_ids(markers)
    known = {Marker.IP: ips, Marker.EXIT: exits, Marker.DRAIN: drains or {}}
    for node_id, rec in records.items():
        has = _marker_test(node_id, known, markers)
        st.nodes.append(_node(node_id, rec, job_id, has, exits, jobs, alive, job_ended, drains or {}))
    st.nodes = _pairs(st.nodes, records, handed)
    counted = [n for n in st.nodes if n.state not in ("replacing", "replaced")]
    st.expected = len(counted)
    if alive is not None:
        st.alive = sum(1 for n in counted if n.state == "alive")

    if elsewhere:
        st.state = "elsewhere"
        here = f"this one is {slurm_cluster!r}" if slurm_cluster else "this one's name is not known"
        st.problems.append(
            f"a cluster of SLURM cluster {recorded!r} ({here}): run `eray-provider status` there"
        )
    elif jobs is None:
        st.state = "unknown"
        st.problems.append(f"squeue did not answer, so nothing is known of job {job_id}: {squeue_error}")
    elif job_ended and not job_over(job_id, jobs):
        st.state = "ending"
        assert head_job is not None
        st.problems.append(f"job {job_id} is {head_job.state}: not over yet")
    elif job_ended:
        st.state = "ended"
        how = f"is {head_job.state}" if head_job is not None else "is no longer listed by squeue"
        workers = _live_worker_jobs(st.name, job_id, records, jobs)
        if workers:
            st.problems.append(
                f"job {job_id} {how}, but its worker job(s) {', '.join(workers)} still run: "
                f"`ray down` of the cluster's YAML (or scancel) ends them"
            )
        elif not recorded:
            # job ids are per SLURM cluster: one sharing HOME may run this job now
            st.problems.append(
                f"job {job_id} {how} here, but the state does not say which SLURM cluster it is "
                f"of, so `--prune` leaves it: remove {state_dir} once you know the job ended"
            )
        else:
            st.prunable = True
            st.problems.append(
                f"job {job_id} {how}: the cluster is gone (`eray-provider status --prune` removes it)"
            )
    elif doc.get("stopping"):
        st.state = "stopping"
        st.problems.append("`ray down` began and did not finish: run it again")
    elif head_job is not None and head_job.state == "PENDING":
        st.state = "pending"
        st.problems.append(f"job {job_id} is pending ({head_job.reason})")
    elif head is None or head in exits:
        st.state = "head-gone"
        if head is None:
            st.problems.append("no head is recorded")
        else:
            st.problems.append(f"the head {head} exited (exit {exits[head]}): see {state_dir}/logs")
    elif alive is None:
        st.state = "unreachable"
        st.problems.append(
            f"the head's GCS at {st.head_address or '?'} did not answer from here: {gcs_error}"
        )
    else:
        missing = [n for n in counted if n.state != "alive"]
        st.state = "degraded" if missing else "running"
        for n in missing:
            where = n.slurm_node or n.slurm_job
            st.problems.append(f"node {n.node_id} ({where}): {n.state} {n.detail}".rstrip())
    return st


def _node(
    node_id: str,
    rec: NodeRecord,
    cluster_job: str,
    has: Callable[[Marker], bool],
    exits: Mapping[str, str],
    jobs: Mapping[str, JobInfo] | None,
    alive: Mapping[str, str] | None,
    job_ended: bool,
    drains: Mapping[str, str],
) -> NodeStatus:
    """One node: its phase (``node_phase``) in the words of ``NodeState``, with the GCS's
    word for a node that is live."""
    own_job = rec.slurm_job  # an elastic worker's job of its own
    job = jobs.get(own_job) if (jobs is not None and own_job) else None
    slurm_node = rec.slurm_node or (job.nodelist if job else "")
    draining = _drain_text(drains.get(node_id))
    slurm = _slurm_word(own_job, job, jobs)
    phase = node_phase(rec, has, slurm)
    ended = f"job {own_job} {job.state if job else 'is no longer listed'}"

    def node(state: NodeState, detail: str = "") -> NodeStatus:
        return NodeStatus(node_id, rec.role, slurm_node, own_job or cluster_job, state, detail, draining)

    if phase is NodePhase.GONE:
        return node("job-ended", f"({ended})")
    if phase in (NodePhase.PENDING, NodePhase.REQUEUED) and job is not None and job.state == "PENDING":
        # a job SLURM requeued (preempted) pends again: its node comes back when it runs
        return node("pending", f"({'requeued, ' if rec.requeued else ''}{job.reason})")
    if phase is NodePhase.EXITED:
        why = f"; {ended}" if slurm is Slurm.ENDED else ""
        return node("exited", f"(exit {exits.get(node_id, '?')}{why})")
    if alive is None or job_ended:
        return node("unknown")
    return node("alive" if node_id in alive else "not-in-ray")


def _marker_test(
    node_id: str, known: Mapping[Marker, Collection[str]], markers: frozenset[str]
) -> Callable[[Marker], bool]:
    """``has`` for ``node_phase``: the kinds read with their values (``known``: node ids by
    kind) and the names of the other marker files."""
    return lambda kind: node_id in known.get(kind, ()) or kind.file(node_id) in markers


def _slurm_word(own_job: str, job: JobInfo | None, jobs: Mapping[str, JobInfo] | None) -> Slurm:
    """SLURM's word on an elastic worker's own job from the user's listing. A fixed node
    runs in a step, which status does not list: no verdict (the allocation's end is the
    cluster's state)."""
    if jobs is None or not own_job:
        return Slurm.UNKNOWN
    if job is None or not job.live:
        return Slurm.ENDED
    return Slurm.QUEUED if job.state == "PENDING" else Slurm.RUNS


def _drain_text(marker: str | None) -> str:
    """``until 2026-12-04T13:20:06: <reason>`` from a ``.drain`` marker."""
    if not marker:
        return ""
    try:
        record = json.loads(marker)
        deadline = float(record.get("deadline") or 0)
        message = str(record.get("message", ""))
    except (ValueError, TypeError, AttributeError):
        return "drained"
    return f"until {format_timestamp(deadline)}: {message}" if deadline else message or "drained"


def _pairs(
    nodes: list[NodeStatus], records: Mapping[str, NodeRecord], handovers: set[str]
) -> list[NodeStatus]:
    """An elastic worker and its replacement count as one node: a replacement not joined
    yet is ``replacing`` (the old node still counts), an old node gone after its
    replacement joined is ``replaced`` (the replacement counts)."""
    by_id = {n.node_id: n for n in nodes}
    out = []
    for n in nodes:
        rec = records.get(n.node_id)
        old = rec.replaces if rec else ""
        if old and n.node_id not in handovers and n.state != "alive" and old in by_id:
            n = replace(n, state="replacing", detail=f"(for {old}: {n.state} {n.detail})".replace(" )", ")"))
        successor = rec.successor if rec else ""
        if successor and successor in handovers and n.state != "alive":
            n = replace(n, state="replaced", detail=f"(by {successor})")
        out.append(n)
    return out


def _live_worker_jobs(
    cluster: str, head_job: str, records: Mapping[str, NodeRecord], jobs: Mapping[str, JobInfo]
) -> list[str]:
    """An elastic cluster's worker jobs that squeue lists in a state that is not final
    (running, pending, completing, held...): those recorded, and any named as this head's
    (submitted, not yet recorded)."""
    recorded = {r.slurm_job for r in records.values() if r.elastic}
    live = {
        j.job_id
        for j in jobs.values()
        if j.state not in TERMINAL_STATES
        and (j.job_id in recorded or (parse_worker_job_name(j.name, cluster) or ("",))[0] == head_job)
    }
    return sorted(live, key=int)
