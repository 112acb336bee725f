"""The record of one Ray node in a cluster's state file, typed.

``state.json`` (``runtime.cluster_state``) keeps one record per node id. Two kinds share
the type:

* a node of the cluster's own allocation (the head, a fixed worker): ``slurm_node`` and
  ``gen`` are set; its id is ``<slurm node>.<gen>``, so a node started again gets a new id;
* an elastic worker, a node of a SLURM job of its own: ``slurm_job`` is set; its id is
  ``j<job>-<index>`` (``plan.sbatch.elastic_node_id``).

Records are frozen: ``ClusterState``'s named transitions make changed copies
(``dataclasses.replace``) under the state's lock, and readers may share one object
between calls (the autoscaler's per-round views compare records by identity). ``tags``
is a plain dict for speed; nobody mutates it in place.

On disk a record is the JSON object ``to_dict`` writes: fields left at their defaults
are omitted, which keeps the file small for 10,000 nodes and readable by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ..errors import ClusterError

#: A node's roles: the one head, and every other node.
ROLES = ("head", "worker")


@dataclass(frozen=True, slots=True)
class Requested:
    """A racing ``ray up`` asked for this node again, with these tags, at ``at``: for a
    while the node also answers to them (Ray looks a new head up by exact tags)."""

    tags: Mapping[str, str]
    at: float


@dataclass(frozen=True, slots=True)
class NodeRecord:
    role: str
    #: Ray's tags of the node (node kind, type, status, launch config hash...)
    tags: Mapping[str, str] = field(default_factory=dict)
    #: when the record was made (an elastic worker: when its job was submitted)
    created: float = 0.0
    #: the allocation's node it runs on ("" for an elastic worker)
    slurm_node: str = ""
    #: its generation within the allocation, the tail of its id (0 for an elastic worker)
    gen: int = 0
    #: the SLURM job of an elastic worker ("" for a node of the allocation)
    slurm_job: str = ""
    #: the srun step that runs it, and when that step was started (0: not yet)
    step_name: str = ""
    launched: float = 0.0
    requested: Requested | None = None
    #: Ray's autoscaler let it go (its step or job is cancelled)
    terminated: bool = False
    #: SLURM requeued its job: hidden until the job runs again
    requeued: bool = False
    #: replacement pairs of elastic workers near their time limit: the node this one
    #: replaces, and the one that replaces this one
    replaces: str = ""
    successor: str = ""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ClusterError(f"a node record's role is one of {ROLES}, not {self.role!r}")

    @property
    def elastic(self) -> bool:
        """A worker of a SLURM job of its own, not of the cluster's allocation."""
        return bool(self.slurm_job)

    @property
    def fixed_worker(self) -> bool:
        """A live worker of the allocation (elastic workers are jobs)."""
        return self.role == "worker" and not self.terminated and not self.elastic

    @property
    def live_head(self) -> bool:
        return self.role == "head" and not self.terminated

    def answers_to(self, tag_filters: Mapping[str, str], now: float, requested_for: float) -> bool:
        """Its tags match ``tag_filters``; so do, for ``requested_for`` seconds, the tags
        it was last requested with."""
        if tags_match(self.tags, tag_filters):
            return True
        asked = self.requested
        return asked is not None and now - asked.at < requested_for and tags_match(asked.tags, tag_filters)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "tags": dict(self.tags), "created": self.created}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in out or value == f.default:
                continue
            out[f.name] = {"tags": dict(value.tags), "at": value.at} if f.name == "requested" else value
        return out

    @classmethod
    def from_dict(cls, node_id: str, raw: Mapping[str, Any]) -> NodeRecord:
        """The record ``to_dict`` wrote. Keys it does not know (a state file of another
        version) are left out rather than refused: one odd record must not stop every
        autoscaler round of the cluster. A record without a role is a ``ClusterError``
        naming the node."""
        if "role" not in raw:
            raise ClusterError(f"the state's record of node {node_id!r} has no 'role': {dict(raw)!r}")
        if not raw.keys() <= _KNOWN:
            raw = {k: v for k, v in raw.items() if k in _KNOWN}
        requested = raw.get("requested")
        if requested is None:
            return cls(**raw)
        return cls(**{**raw, "requested": Requested(dict(requested["tags"]), float(requested["at"]))})


_KNOWN = frozenset(f.name for f in fields(NodeRecord))


def tags_match(tags: Mapping[str, str], tag_filters: Mapping[str, str]) -> bool:
    """Every filter's tag has its value in ``tags``."""
    return all(tags.get(k) == v for k, v in tag_filters.items())


def parse_records(raw: Mapping[str, Mapping[str, Any]]) -> dict[str, NodeRecord]:
    """The ``nodes`` object of a state document, as records by node id."""
    return {node_id: NodeRecord.from_dict(node_id, rec) for node_id, rec in raw.items()}
