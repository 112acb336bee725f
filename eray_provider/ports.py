"""The per-job port plan: every port a job's Ray cluster and JAX groups listen on.

Ray's defaults (GCS 6379, dashboard 8265, client server 10001, agent 52365, the two
metrics ports 44217/44227 that have no flag, workers 10002-19999) are the same for every
cluster on a host, so two jobs sharing a node collide. Every node of a job must know the
ports in advance without talking to the others, so the plan is a pure function of the
job id and of the host's excluded ranges.

Layout: the allowed port space (below) is cut into blocks of ``BLOCK`` ports; a job's
first candidate block is ``job_id % number_of_blocks``. Collision bound: two jobs get the
same first candidate only when their ids are congruent modulo the number of blocks (with Linux's
default ephemeral range 32768-60999 and ``SrunPortRange=60001-63000`` there are 44 blocks,
so jobs whose ids differ by less than 44 never share a candidate). When a candidate's
ports are found taken on a node, the next candidate ``(first + k) % blocks`` is tried;
the plan finally chosen is recorded by the launcher and handed to every node, so nodes
never disagree.

Excluded from the space: ports below 20000 (well-known ports, Ray's default GCS, client
server, dashboard and worker range 10002-19999, Serve's 8000/9000), Ray client's proxier
range 23000-24000, the kernel's ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``),
Slurm's ``SrunPortRange``, and JAX's SLURM formula range 61440-65535.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

#: Ports per job block: 16 named ports, 16 JAX coordinator ports, 224 worker ports.
BLOCK = 256
NAMED = (
    "gcs",
    "dashboard",
    "dashboard_agent_listen",
    "dashboard_agent_grpc",
    "client_server",
    "runtime_env_agent",
    "metrics_export",
    "node_manager",
    "object_manager",
    "autoscaler_metrics",
    "dashboard_metrics",
)
JAX_OFFSET = 16
JAX_PORTS = 16
WORKER_OFFSET = JAX_OFFSET + JAX_PORTS
#: Never used: well-known and Ray default ranges, Ray client proxier, JAX's own SLURM ports.
FIXED_EXCLUSIONS: tuple[tuple[int, int], ...] = ((0, 19999), (23000, 24000), (61440, 65535))
PORT_MAX = 65535


class PortPlanError(RuntimeError):
    """No block of the port space is free for this job."""


@dataclass(frozen=True)
class PortPlan:
    """Every port of one job's cluster; ``jax_ports`` serve one process group each."""

    job_id: str
    block_start: int
    gcs: int
    dashboard: int
    dashboard_agent_listen: int
    dashboard_agent_grpc: int
    client_server: int
    runtime_env_agent: int
    metrics_export: int
    node_manager: int
    object_manager: int
    autoscaler_metrics: int
    dashboard_metrics: int
    jax_first: int
    jax_count: int
    min_worker: int
    max_worker: int

    @property
    def jax_ports(self) -> range:
        return range(self.jax_first, self.jax_first + self.jax_count)

    def all_ports(self) -> list[int]:
        """Every port the plan reserves, for availability probes."""
        named = [getattr(self, name) for name in NAMED]
        return [*named, *self.jax_ports, *range(self.min_worker, self.max_worker + 1)]

    def to_dict(self) -> dict[str, int | str]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> PortPlan:
        return cls(**{k: (str(v) if k == "job_id" else int(v)) for k, v in d.items()})

    def ray_start_args(self) -> list[str]:
        """Flags of ``ray start`` that pin every port (the two metrics ports go via env)."""
        return [
            f"--dashboard-port={self.dashboard}",
            f"--dashboard-agent-listen-port={self.dashboard_agent_listen}",
            f"--dashboard-agent-grpc-port={self.dashboard_agent_grpc}",
            f"--ray-client-server-port={self.client_server}",
            f"--runtime-env-agent-port={self.runtime_env_agent}",
            f"--metrics-export-port={self.metrics_export}",
            f"--node-manager-port={self.node_manager}",
            f"--object-manager-port={self.object_manager}",
            f"--min-worker-port={self.min_worker}",
            f"--max-worker-port={self.max_worker}",
        ]

    def ray_env(self) -> dict[str, str]:
        """Variables for the ports that have no flag."""
        return {
            "AUTOSCALER_METRIC_PORT": str(self.autoscaler_metrics),
            "DASHBOARD_METRIC_PORT": str(self.dashboard_metrics),
        }


def _subtract(space: list[tuple[int, int]], cut: tuple[int, int]) -> list[tuple[int, int]]:
    lo, hi = cut
    out: list[tuple[int, int]] = []
    for a, b in space:
        if hi < a or lo > b:
            out.append((a, b))
            continue
        if a < lo:
            out.append((a, lo - 1))
        if b > hi:
            out.append((hi + 1, b))
    return out


def block_starts(exclusions: Iterable[tuple[int, int]]) -> list[int]:
    """First ports of every whole block that avoids all exclusions, ascending."""
    space = [(1, PORT_MAX)]
    for cut in (*FIXED_EXCLUSIONS, *exclusions):
        space = _subtract(space, cut)
    starts: list[int] = []
    for a, b in space:
        start = -(-a // BLOCK) * BLOCK  # align so blocks are the same on every host
        while start + BLOCK - 1 <= b:
            starts.append(start)
            start += BLOCK
    return starts


def plan_for_block(job_id: str, start: int) -> PortPlan:
    named = {name: start + i for i, name in enumerate(NAMED)}
    return PortPlan(
        job_id=str(job_id),
        block_start=start,
        jax_first=start + JAX_OFFSET,
        jax_count=JAX_PORTS,
        min_worker=start + WORKER_OFFSET,
        max_worker=start + BLOCK - 1,
        **named,
    )


def candidates(job_id: str, exclusions: Sequence[tuple[int, int]]) -> list[PortPlan]:
    """Every possible plan for the job, in the deterministic order they are tried."""
    if not str(job_id).isdigit():
        raise ValueError(f"job_id must be a decimal SLURM job id, got {job_id!r}")
    starts = block_starts(exclusions)
    if not starts:
        raise PortPlanError(
            f"no port block of {BLOCK} ports is left outside the excluded ranges {list(exclusions)}"
        )
    first = int(job_id) % len(starts)
    # the fallbacks in an order of the job's own: jobs with neighbouring ids must not all
    # fall back to each other's first block (two jobs probing at once would both take it)
    rest = [i for i in range(len(starts)) if i != first]
    random.Random(int(job_id)).shuffle(rest)
    return [plan_for_block(job_id, starts[i]) for i in (first, *rest)]


def choose_plan(job_id: str, exclusions: Sequence[tuple[int, int]], busy: Iterable[int] = ()) -> PortPlan:
    """The first candidate none of whose ports is in ``busy`` (ports seen taken on a node)."""
    taken = set(busy)
    for plan in candidates(job_id, exclusions):
        if taken.isdisjoint(plan.all_ports()):
            return plan
    raise PortPlanError(f"every port block is in use on this job's nodes (job {job_id})")
