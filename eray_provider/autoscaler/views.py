"""Cached views that make the autoscaler's per-node calls cost a dict lookup each.

Ray 2.60's autoscaler (v2's ``NodeProviderAdapter.get_non_terminated``) asks, every
round, ``non_terminated_nodes({})`` and then ``node_tags`` and ``is_running`` of every
node it returned: 20,000 calls a round at 10,000 nodes. The providers therefore compute
their answers once per change of what they are computed from (the state file's
records, the marker listing, squeue's listings) and serve the calls from that.

Change is told by identity, never by comparing contents (comparing 10,000 records costs
what recomputing does): the state file, the marker listing and the squeue listings hand
out the same object for as long as nothing changed (``ClusterState.read``,
``ClusterState.markers``, the providers' listing caches).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from time import monotonic
from typing import Any, Generic, NoReturn, TypeVar

from ray.autoscaler.tags import (
    NODE_KIND_WORKER,
    STATUS_UP_TO_DATE,
    TAG_RAY_NODE_KIND,
    TAG_RAY_NODE_STATUS,
    TAG_RAY_USER_NODE_TYPE,
)

from ..plan.node_record import NodeRecord
from ..plan.sbatch import parse_elastic_node_id
from ..runtime.cluster_state import READ_FRESH_SECONDS
from ..slurm.squeue import JobInfo

T = TypeVar("T")


class ReadOnlyTags(dict[str, str]):
    """A node's tags as ``node_tags`` hands them out from a round's answers: a real dict
    (reads, ``json.dumps``, ``dict(...)`` and ``.copy()`` as usual) that refuses to be
    changed, because it is shared by every call until the answers change. Handing out a
    fresh copy per call doubled the cost of a round at 10,000 nodes; a caller that
    changes what it got fails loudly instead of corrupting the next caller's answer."""

    __slots__ = ()

    def _refuse(self, *_args: Any, **_kwargs: Any) -> NoReturn:
        raise TypeError("node_tags() returns read-only tags: copy them, or change them with set_node_tags()")

    __setitem__ = __delitem__ = __ior__ = _refuse
    update = pop = popitem = clear = setdefault = _refuse

    def copy(self) -> dict[str, str]:
        return dict(self)


class Memo(Generic[T]):
    """A value computed from some inputs, reused while the inputs are the very same
    objects. The inputs are held, so that a new object can never take an input's id
    (and pass for it) while the memo compares against it."""

    __slots__ = ("_inputs", "_value")

    def __init__(self) -> None:
        self._inputs: tuple[Any, ...] | None = None
        self._value: T | None = None

    def get(self, inputs: tuple[Any, ...], compute: Callable[..., T]) -> T:
        held, value = self._inputs, self._value
        if held is None or len(held) != len(inputs) or any(a is not b for a, b in zip(held, inputs)):
            value = compute(*inputs)
            self._value, self._inputs = value, inputs
        # the local, not the field: a drop() from another thread (Ray's v2 adapter launches
        # and terminates on executor threads) must not turn this answer into None
        return value  # type: ignore[return-value]

    def drop(self) -> None:
        self._inputs = self._value = None


class FreshView(Generic[T]):
    """A value computed from some inputs (``Memo``), whose inputs are not even asked for
    during ``READ_FRESH_SECONDS`` (the state's own freshness). ``drop`` after the
    provider's own writes and under the lock, where other processes' writes must count."""

    def __init__(self) -> None:
        self._memo: Memo[T] = Memo()
        self._value: T | None = None
        self._stamp = 0.0

    def get(self, inputs: Callable[[], tuple[Any, ...]], compute: Callable[..., T]) -> T:
        now, value = monotonic(), self._value
        if value is None or now - self._stamp >= READ_FRESH_SECONDS:
            value = self._memo.get(inputs(), compute)
            self._value, self._stamp = value, now
        return value  # a local, as in Memo.get

    def drop(self) -> None:
        self._value = None
        self._memo.drop()

    def expire(self) -> None:
        """Ask for the inputs at the next call (they may still be the same objects)."""
        self._stamp = float("-inf")


#: A node's answers to ``node_tags`` and ``is_running``.
Answer = tuple[ReadOnlyTags, bool]
#: live worker jobs of the head: job id -> (SLURM's listing of it, node type)
WorkerJobs = Mapping[str, tuple[JobInfo, str]]


def adopted_tags(found: tuple[JobInfo, str] | None) -> dict[str, str]:
    """The tags of a worker node whose record was lost, adopted from squeue: what its job
    name says; none for a node that squeue does not list either."""
    if found is None:
        return {}
    return {
        TAG_RAY_NODE_KIND: NODE_KIND_WORKER,
        TAG_RAY_USER_NODE_TYPE: found[1],
        TAG_RAY_NODE_STATUS: STATUS_UP_TO_DATE,
    }


@dataclass(frozen=True)
class PoolView:
    """The elastic worker nodes as one round sees them (``worker_pool``)."""

    workers: WorkerJobs
    #: the worker nodes shown to the autoscaler, with their answers, in order
    answers: Mapping[str, Answer]
    #: replacement node id -> the node it replaces, of the pairs the records hold
    successors: Mapping[str, str]
    #: worker nodes alive, shown or hidden
    alive: frozenset[str]
    #: alive nodes whose node_run stands by for its handover
    standing_by: frozenset[str]


NO_POOL = PoolView({}, {}, {}, frozenset(), frozenset())


@dataclass(frozen=True)
class Round:
    """What one read of the records, the markers and SLURM's listings says of every node:
    the nodes shown to the autoscaler (``answers``, in order: the allocation's, then the
    worker jobs'), and what a node not shown is answered (``tags_of``)."""

    records: Mapping[str, NodeRecord]
    answers: Mapping[str, Answer]
    #: the ids in ``answers``, for O(1) ``is_terminated``
    shown: frozenset[str]
    pool: PoolView = NO_POOL

    def tags_of(self, node_id: str) -> dict[str, str]:
        """A node's tags: the shared read-only answer when shown, else a copy (a worker
        without a record: what its job's name says)."""
        answer = self.answers.get(node_id)
        if answer is not None:
            return answer[0]
        rec = self.records.get(node_id)
        if rec is not None:
            return dict(rec.tags)
        parsed = parse_elastic_node_id(node_id)
        return adopted_tags(self.pool.workers.get(parsed[0])) if parsed else {}

    def running(self, node_id: str) -> bool:
        answer = self.answers.get(node_id)
        return answer is not None and answer[1]
