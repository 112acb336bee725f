"""Where a node of a cluster is in its life, from its record, its markers and SLURM's word
about its step or job: one pure function, ``node_phase``, for every reader.

The providers ask whether a node is alive (``LIVE``), the elastic provider whether its job
may be replaced, ``ray up`` what a node it waits for is doing, ``eray-provider status``
what to show. Each asks ``node_phase`` and reads the answer its own way; none derives a
node's phase from the files again. ``TRANSITIONS`` says which phase may follow which (a
node never comes back from ``EXITED``, ``TERMINATED`` or ``GONE``: a node started again
is a new record), as Ray's autoscaler v2 does for its instances.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from enum import Enum

from .markers import Marker
from .node_record import NodeRecord


class NodePhase(str, Enum):
    #: recorded, its step not launched yet (a fixed cluster's node before ``ray up`` starts it)
    RECORDED = "recorded"
    #: its step or job was started; its process has not said anything yet
    LAUNCHED = "launched"
    #: its own job waits in SLURM's queue (an elastic worker)
    PENDING = "pending"
    #: SLURM requeued its job (a preemption): it comes back when the job runs again
    REQUEUED = "requeued"
    #: its process runs: setup commands, the wait for the head
    SETTING_UP = "setting up"
    #: a replacement whose Ray waits to take its old node's place, or a requeued job's
    #: node that runs again and waits for the head to show it
    STANDING_BY = "standing by"
    #: its Ray is being started, or runs (its address is known)
    RUNNING = "running"
    #: its job's end is near: Ray drains it
    DRAINING = "draining"
    #: its process ended (its exit status is recorded)
    EXITED = "exited"
    #: the autoscaler terminated it
    TERMINATED = "terminated"
    #: SLURM no longer runs its step or job
    GONE = "gone"


#: The phases of a node the autoscaler counts.
LIVE = frozenset(
    {
        NodePhase.RECORDED,
        NodePhase.LAUNCHED,
        NodePhase.PENDING,
        NodePhase.SETTING_UP,
        NodePhase.STANDING_BY,
        NodePhase.RUNNING,
        NodePhase.DRAINING,
    }
)
_ENDS = frozenset({NodePhase.EXITED, NodePhase.TERMINATED, NodePhase.GONE})
#: Which phase may follow which.
TRANSITIONS: dict[NodePhase, frozenset[NodePhase]] = {
    NodePhase.RECORDED: frozenset({NodePhase.LAUNCHED, NodePhase.PENDING}) | _ENDS,
    NodePhase.LAUNCHED: frozenset(LIVE - {NodePhase.RECORDED, NodePhase.LAUNCHED}) | _ENDS,
    NodePhase.PENDING: frozenset(LIVE - {NodePhase.RECORDED, NodePhase.PENDING}) | _ENDS,
    NodePhase.REQUEUED: frozenset(
        {NodePhase.PENDING, NodePhase.SETTING_UP, NodePhase.STANDING_BY, NodePhase.RUNNING}
    )
    | _ENDS,
    NodePhase.SETTING_UP: frozenset({NodePhase.STANDING_BY, NodePhase.RUNNING, NodePhase.REQUEUED}) | _ENDS,
    NodePhase.STANDING_BY: frozenset({NodePhase.RUNNING, NodePhase.REQUEUED}) | _ENDS,
    NodePhase.RUNNING: frozenset({NodePhase.DRAINING, NodePhase.REQUEUED}) | _ENDS,
    NodePhase.DRAINING: frozenset({NodePhase.REQUEUED}) | _ENDS,
    NodePhase.EXITED: frozenset({NodePhase.TERMINATED}),
    NodePhase.TERMINATED: frozenset(),
    NodePhase.GONE: frozenset({NodePhase.EXITED, NodePhase.TERMINATED}),
}


class Slurm(str, Enum):
    """What SLURM said of a node's step (a fixed cluster's node) or job (an elastic
    worker) in the last listing."""

    #: no answer yet, or the listing failed: no verdict
    UNKNOWN = "unknown"
    #: listed, running
    RUNS = "runs"
    #: its job is listed, pending
    QUEUED = "queued"
    #: listed, but not this node: SLURM runs fewer nodes of the job than the node's index
    NOT_THERE = "not there"
    #: not listed (a step or job started just now may not be yet: ``within_grace``)
    UNLISTED = "unlisted"
    #: SLURM says the job has ended
    ENDED = "ended"


def end_of(
    rec: NodeRecord | None, has: Callable[[Marker], bool], slurm: Slurm, within_grace: bool = False
) -> NodePhase | None:
    """The phase of a node that is not live (``TERMINATED``, ``REQUEUED``, ``EXITED``,
    ``GONE``, in that order: a requeued job's node comes back although its last run
    ended), or None for a live one: all the autoscaler needs, at a marker lookup or two a
    node. ``has(kind)``: whether the node has written that marker; ``within_grace``: its
    step or job was started so recently that SLURM may not list it yet (``UNLISTED`` is then
    no verdict). A node without a record (an elastic worker whose record was lost, adopted
    from squeue) has SLURM's word alone."""
    if rec is not None and rec.terminated:
        return NodePhase.TERMINATED
    if rec is not None and rec.requeued and not has(Marker.RERUN) and slurm is not Slurm.ENDED:
        # the exit marker of the run SLURM preempted stays until the job runs again
        return NodePhase.REQUEUED
    if has(Marker.EXIT):
        return NodePhase.EXITED
    if rec is not None and not rec.launched and not rec.elastic:
        return None  # recorded, not launched yet: nothing of SLURM's concerns it
    if slurm in (Slurm.ENDED, Slurm.NOT_THERE) or (slurm is Slurm.UNLISTED and not within_grace):
        return NodePhase.GONE
    return None


def node_phase(
    rec: NodeRecord | None, has: Callable[[Marker], bool], slurm: Slurm, within_grace: bool = False
) -> NodePhase:
    """The phase of one node (``end_of``'s arguments)."""
    ended = end_of(rec, has, slurm, within_grace)
    if ended is not None:
        return ended
    if rec is not None and not rec.launched and not rec.elastic:
        return NodePhase.RECORDED
    if slurm is Slurm.QUEUED:
        return NodePhase.PENDING
    if has(Marker.DRAIN):
        return NodePhase.DRAINING
    if has(Marker.STANDBY) and not has(Marker.HANDOVER):
        return NodePhase.STANDING_BY
    if has(Marker.IP):
        return NodePhase.RUNNING
    if has(Marker.TMPDIR) or has(Marker.PID):
        return NodePhase.SETTING_UP
    return NodePhase.LAUNCHED


def marker_test(node_id: str, names: Collection[str]) -> Callable[[Marker], bool]:
    """``has`` for ``node_id``, from the state's marker file names (``ClusterState.markers``)."""
    return lambda kind: kind.file(node_id) in names
