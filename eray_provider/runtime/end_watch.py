"""Drain Ray nodes before their SLURM jobs end: the head's watcher, and a node's own drain.

``python -m eray_provider.runtime.end_watch GCS --lead S`` runs beside the head's Ray for the
cluster's life (``node_run`` starts it and stops it by PID). Every ``WATCH_SECONDS`` it
lists the alive Ray nodes with their ``slurm-job`` labels (one GCS call) and the user's
jobs (one ``squeue``), and drains through Ray's drain API every node whose job ends
within the lead, the job's end as the deadline (``drain.due_drains``): a fixed
allocation's nodes together, each elastic worker by its own job. The lead of a job is at
most half its time limit. A failed squeue leaves every node as it is (it is no verdict),
and the watcher tries again next round.

Each round it also drains each elastic worker whose replacement
(``replace_before_end_s``) has joined Ray. With ``--replaced`` (the cluster replaces its
workers ahead of their end) a worker's lead is half the lead (``drain.worker_lead``):
its replacement comes first, and the handover drains it as soon as the replacement has
joined.

``--node INSTANCE_ID --job J`` drains that one node now, whatever the lead: what a node
does when SLURM sends it ``walltime.END_SIGNAL`` (``--signal=URG@N``, or a preemption under
``preempt_send_user_signal``). The deadline is the job's ``EndTime`` (which a preemption
moves to now plus its grace time), or none when squeue cannot tell.

Each drain is printed (into the node's log) and recorded as the node's ``drain`` marker in
the cluster's state dir, which ``eray-provider status`` shows. Run with the cluster's
token variables in the environment, like ``gcs_probe``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Collection
from typing import NamedTuple

from ..errors import ConfigError
from ..plan.drain import Drain, RayNode, drain_message, due_drains, replaced_drains, worker_lead
from ..plan.environment import NodeLaunch
from ..plan.markers import Marker
from ..plan.modules import END_WATCH
from ..slurm.client import SlurmCommandError
from ..slurm.squeue import JobInfo
from ..slurm.walltime import WalltimeError, parse_duration, parse_timestamp
from .cluster_state import ClusterState
from .port_probe import port_open
from .slurm_jobs import user_jobs

WATCH_SECONDS = 10.0
#: How long the watcher waits for the GCS to open before it gives up.
GCS_WAIT_SECONDS = 600.0


def say(text: str) -> None:
    print(f"eray-provider: {text}", flush=True)


def alive_nodes(client) -> list[RayNode]:
    """The alive Ray nodes but the head, and the SLURM job each belongs to (its
    ``slurm-job`` label). The head is never drained: a drained node's raylet stops once it
    is idle, and the head's holds the drivers and the autoscaler until the job's end (Ray's
    own autoscaler never drains it either)."""
    from ray.core.generated.gcs_pb2 import GcsNodeInfo

    infos = client.get_all_node_info(timeout=10, state_filter=GcsNodeInfo.GcsNodeState.ALIVE)
    return [
        RayNode(info.node_id.hex(), info.instance_id, info.labels.get("slurm-job", ""))
        for info in infos.values()
        if info.labels.get("slurm-job") and not info.is_head_node
    ]


def job_ends(
    jobs: dict[str, JobInfo], wanted: set[str], lead: float, replaced: Collection[str] = ()
) -> tuple[dict, dict]:
    """(job -> end, job -> lead) for the ``wanted`` jobs squeue listed; a time that cannot
    be read is said and left unknown. ``replaced``: the jobs that are replaced ahead of
    their end (``drain.worker_lead``)."""
    ends: dict[str, float | None] = {}
    leads: dict[str, float] = {}
    for job in wanted & set(jobs):
        info = jobs[job]
        try:
            ends[job] = parse_timestamp(info.end_time)
            leads[job] = worker_lead(lead, parse_duration(info.time_limit), job in replaced)
        except WalltimeError as e:
            say(f"job {job}: {e}")
    return ends, leads


def request(client, drain: Drain, state: ClusterState | None) -> bool:
    """Ask the GCS to drain one node (reason: preemption, the SLURM job's end); record it."""
    from ray.core.generated import autoscaler_pb2

    node = drain.node
    try:
        accepted, why = client.drain_node(
            node.node_id,
            autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
            drain.message,
            int(drain.deadline * 1000),
        )
    except Exception as e:  # the GCS going away with the cluster: said, tried again next round
        say(f"draining {node.instance_id} failed: {e}")
        return False
    if not accepted:
        say(f"draining {node.instance_id} was refused: {why}")
        return False
    say(f"draining {node.instance_id or node.node_id} (Ray node {node.node_id[:12]}): {drain.message}")
    if state is not None and node.instance_id:
        record = {"deadline": drain.deadline, "job": node.job_id, "message": drain.message, "at": time.time()}
        try:
            state.write_marker(node.instance_id, Marker.DRAIN, json.dumps(record))
        except OSError as e:
            say(f"the drain of {node.instance_id} was not recorded: {e}")
    return True


def _client(address: str):
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + GCS_WAIT_SECONDS
    while not port_open(host, int(port), timeout=1):
        if time.monotonic() > deadline:
            raise SystemExit(f"eray-provider: the GCS at {address} did not open in {GCS_WAIT_SECONDS:.0f} s")
        time.sleep(0.5)
    from ray._raylet import GcsClient  # type: ignore[attr-defined]

    return GcsClient(address=address)


def _state() -> ClusterState | None:
    """The cluster of the node_run that started this watcher, None outside one."""
    try:
        launch = NodeLaunch.from_env(os.environ)
    except ConfigError:
        return None
    return ClusterState(launch.cluster, launch.job_id, launch.state_base)


def watch(address: str, lead: float, interval: float, replaced: bool = False) -> int:
    """The head's loop; ends when its parent (the head's ``node_run``) is gone.
    ``replaced``: the cluster's elastic workers are replaced ahead of their end.

    It connects to the GCS (and imports Ray's client) only once there is something to do
    (``gcs_needed``): until then a round is one ``squeue``, so that the watcher costs the
    head next to nothing while the cluster starts."""
    parent = os.getppid()
    client = None
    state = _state()
    drained: dict[str, float] = {}
    squeue_failed = False
    while os.getppid() == parent:
        pairs = _pairs(state)
        jobs: dict[str, JobInfo] | None = None
        try:
            jobs = user_jobs()
        except SlurmCommandError as e:
            if not squeue_failed:
                say(f"cannot tell when the cluster's jobs end this round: {e}")
            squeue_failed = True
        else:
            squeue_failed = False
        workers = pairs.workers if replaced and pairs is not None else set()
        if client is None and not gcs_needed(jobs, state, pairs, lead, workers, interval):
            time.sleep(interval)
            continue
        client = client or _client(address)
        try:
            nodes = alive_nodes(client)
        except Exception:  # the GCS restarting or going away: next round
            nodes = []
        if nodes:
            ends: dict[str, float | None] = {}
            leads: dict[str, float] = {}
            if jobs is not None:
                ends, leads = job_ends(jobs, {n.job_id for n in nodes}, lead, workers)
            if lead > 0 and ends:
                for drain in due_drains(nodes, ends, time.time(), leads, drained):
                    if request(client, drain, state):
                        drained[drain.node.node_id] = drain.deadline
                        if pairs is not None:
                            pairs.drained.add(drain.node.instance_id)
            if pairs is not None and state is not None:
                hand_over(client, state, nodes, ends, pairs.successors, pairs.drained)
        time.sleep(interval)
    return 0


def gcs_needed(
    jobs: dict[str, JobInfo] | None,
    state: ClusterState | None,
    pairs: Pairs | None,
    lead: float,
    workers: Collection[str],
    interval: float,
) -> bool:
    """Whether a round needs the GCS: without a state dir (no way to tell the cluster's
    jobs), while a replacement pair exists (its handover), or once a job of the cluster
    (its own, or an elastic worker's) is within two rounds of its drain. A squeue that
    failed (``jobs`` None) tells nothing: wait for the next one."""
    if state is None or (pairs is not None and pairs.successors):
        return True
    if jobs is None or lead <= 0:
        return False
    ours = {state.job_id, *(pairs.workers if pairs is not None else ())}
    ends, leads = job_ends(jobs, ours, lead, workers)
    now = time.time()
    return any(end is not None and end - leads[job] - now <= 2 * interval for job, end in ends.items())


class Pairs(NamedTuple):
    """What the watcher reads of an elastic cluster's state each round."""

    #: replacement node id -> the node it replaces
    successors: dict[str, str]
    #: the nodes drained already (their ``drain`` markers)
    drained: set[str]
    #: the SLURM jobs of the cluster's elastic workers
    workers: set[str]


def _pairs(state: ClusterState | None) -> Pairs | None:
    """The cluster's ``Pairs``; None without a state (or while it is removed)."""
    if state is None:
        return None
    try:
        records = state.records()
        markers = state.markers()
    except (OSError, ValueError, RuntimeError):
        return None  # the cluster being torn down
    successors = {i: r.replaces for i, r in records.items() if r.replaces}
    drained = Marker.DRAIN.node_ids(markers)
    workers = {r.slurm_job for r in records.values() if r.elastic}
    return Pairs(successors, drained, workers)


def hand_over(
    client,
    state: ClusterState,
    nodes: list[RayNode],
    ends: dict[str, float | None],
    successors: dict[str, str],
    drained: set[str],
) -> None:
    """Drain each node whose replacement (elastic ``replace_before_end_s``) has joined Ray
    (``drain.replaced_drains``), unless it was drained already (for its job's end, or
    at SLURM's signal). The provider showed the replacement to the autoscaler in its
    place before the replacement started Ray."""
    for drain in replaced_drains(nodes, successors, ends, time.time()):
        if drain.node.instance_id not in drained:
            say(f"{drain.node.instance_id} is replaced: {drain.message}")
            if request(client, drain, state):
                drained.add(drain.node.instance_id)


def drain_self(address: str, instance_id: str, job: str) -> int:
    """Drain one node now (SLURM signalled its job's end): deadline = the job's end."""
    client = _client(address)
    node = next((n for n in alive_nodes(client) if n.instance_id == instance_id), None)
    if node is None:
        say(f"{instance_id} is not an alive worker node (the head is not drained): nothing to drain")
        return 1
    end = None
    try:
        ends, _ = job_ends(user_jobs(), {job}, 0)
        end = ends.get(job)
    except SlurmCommandError as e:
        say(f"cannot tell when job {job} ends ({e}): draining without a deadline")
    message = f"SLURM signalled the end of job {job}" + (
        f": {drain_message(job, end, time.time())}" if end else ""
    )
    return 0 if request(client, Drain(node, end or 0.0, message), _state()) else 1


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {END_WATCH}")
    ap.add_argument("address", help="the GCS, HOST:PORT")
    ap.add_argument("--lead", type=float, default=0.0, help="drain this many seconds before a job's end")
    ap.add_argument("--interval", type=float, default=WATCH_SECONDS)
    ap.add_argument(
        "--replaced", action="store_true", help="elastic workers are replaced ahead of time: half the lead"
    )
    ap.add_argument("--node", help="drain this node (its instance id) now")
    ap.add_argument("--job", help="with --node: the node's SLURM job")
    args = ap.parse_args(argv)
    if args.node:
        if not args.job:
            ap.error("--node needs --job")
        return drain_self(args.address, args.node, args.job)
    return watch(args.address, args.lead, args.interval, args.replaced)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
