"""The marker files a cluster's node processes leave in its state dir, one kind each.

A node process says what it has reached by writing ``nodes/<node id>.<kind>`` (its address,
its temp dirs, its exit status...); the providers, ``status`` and ``ray up``'s progress
read them. ``Marker`` names every kind; ``runtime.cluster_state.ClusterState`` reads and
writes them (``read_marker``, ``write_marker``, ``markers``). Pure: names only.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum


class Marker(str, Enum):
    #: the node's address, once its Ray may be reached there (the head's: where workers join)
    IP = "ip"
    #: the SLURM node and the temp dirs the node process made there (the teardown removes them)
    TMPDIR = "tmpdir"
    #: the node process's exit status: the provider's word that the node is over
    EXIT = "exit"
    #: the node process's identity (pid and start time), to signal it
    PID = "pid"
    #: a drain ``end_watch`` asked for (JSON: deadline and reason)
    DRAIN = "drain"
    #: an elastic replacement may run Ray: the autoscaler shows it in its old node's place
    HANDOVER = "handover"
    #: an elastic replacement waits for its handover
    STANDBY = "standby"
    #: a requeued worker job runs again (its restart count)
    RERUN = "rerun"

    def file(self, node_id: str) -> str:
        """The marker's file name for ``node_id``."""
        return f"{node_id}.{self.value}"

    def node_ids(self, names: Iterable[str]) -> set[str]:
        """The node ids that have this marker, among marker file names."""
        tail = f".{self.value}"
        return {name[: -len(tail)] for name in names if name.endswith(tail)}
