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
range 23000-24000, Slurm's ``SrunPortRange``, the ports a node reserves
(``ip_local_reserved_ports``), and JAX's SLURM formula range 61440-65535.

The kernel's ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``) is avoided when
possible, not always: sites run nodes with 1024-65535 or 9000-65499, which leave no block
outside it. Such a range is a *soft* exclusion (``Excluded(..., soft=True)``): blocks outside
every soft range come first, blocks inside one are the fallback. A block inside the
ephemeral range is usable because the probe checks, on every node, that none of its ports
is bound before the plan is fixed; the residual risk is an outgoing connection taking one
of its ports between the probe and Ray's bind, which the kernel spreads over the whole
range (thousands of ports), so it is rare and shows as a bind error, never a silent clash.

The coordinator of ``DistributedConfig`` (``srun python train.py``, no Ray cluster) must
be known to every rank without any node's ranges: ``job_coordinator_port`` takes it from
the 224 ports 20000-20223, below the first aligned block, which no plan of any job on any
host ever holds.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

#: Ports per job block: 16 named ports, 16 JAX coordinator ports, 224 worker ports.
from ..errors import ClusterError, ConfigError

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
#: Ports below the first block (blocks are aligned to ``BLOCK``, the first at 20224): no plan
#: ever holds them, whatever a host excludes. ``job_coordinator_port`` uses them.
COORDINATOR_FIRST = 20000
COORDINATOR_COUNT = -(-COORDINATOR_FIRST // BLOCK) * BLOCK - COORDINATOR_FIRST


class Excluded(NamedTuple):
    """A port range a plan avoids; ``source`` says where it came from, for messages.

    ``soft`` ranges (the kernel's ephemeral range) are avoided when the rest of the space
    leaves a block, and used, after the probe, when it leaves none.
    """

    lo: int
    hi: int
    source: str = ""
    soft: bool = False


#: What callers pass: plain ``(lo, hi)`` pairs are hard exclusions.
Exclusion = Excluded | tuple[int, int]


class PortPlanError(ClusterError):
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
    def from_dict(cls, d: Mapping[str, Any]) -> PortPlan:
        job_id = str(d["job_id"])
        return cls(job_id, **{k: int(v) for k, v in d.items() if k != "job_id"})

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


def _split(exclusions: Iterable[Exclusion]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(hard, soft) ranges; every value is checked, since a node's file may hold anything."""
    hard: list[tuple[int, int]] = []
    soft: list[tuple[int, int]] = []
    for item in exclusions:
        ex = item if isinstance(item, Excluded) else Excluded(*item)
        if not (isinstance(ex.lo, int) and isinstance(ex.hi, int) and 0 <= ex.lo <= ex.hi <= PORT_MAX):
            where = f" ({ex.source})" if ex.source else ""
            raise ConfigError(
                f"excluded port range {ex.lo!r}-{ex.hi!r}{where} is not lo-hi within 0-{PORT_MAX}"
            )
        (soft if ex.soft else hard).append((ex.lo, ex.hi))
    return hard, soft


def _aligned_starts(space: list[tuple[int, int]]) -> list[int]:
    starts: list[int] = []
    for a, b in space:
        start = -(-a // BLOCK) * BLOCK  # align so blocks are the same on every host
        while start + BLOCK - 1 <= b:
            starts.append(start)
            start += BLOCK
    return starts


def _space(cuts: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    space = [(1, PORT_MAX)]
    for cut in (*FIXED_EXCLUSIONS, *cuts):
        space = _subtract(space, cut)
    return space


def block_starts(exclusions: Iterable[Exclusion]) -> list[int]:
    """First ports of every whole block that avoids all exclusions, soft ones included."""
    hard, soft = _split(exclusions)
    return _aligned_starts(_space([*hard, *soft]))


def fallback_starts(exclusions: Iterable[Exclusion]) -> list[int]:
    """Blocks that avoid every hard exclusion but lie in a soft one (the ephemeral range)."""
    hard, soft = _split(exclusions)
    outside = set(_aligned_starts(_space([*hard, *soft])))
    return [s for s in _aligned_starts(_space(hard)) if s not in outside]


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


def _describe(exclusions: Sequence[Exclusion]) -> str:
    parts = []
    for item in exclusions:
        ex = item if isinstance(item, Excluded) else Excluded(*item)
        parts.append(f"{ex.lo}-{ex.hi}" + (f" ({ex.source})" if ex.source else ""))
    fixed = ", ".join(f"{lo}-{hi}" for lo, hi in FIXED_EXCLUSIONS)
    return f"[{', '.join(parts)}] and the fixed ranges {fixed}"


def _job_order(job_id: str, starts: list[int], salt: int = 0) -> list[int]:
    """``starts`` with the job's first candidate ``job_id % len`` first, the rest in an order
    of the job's own: jobs with neighbouring ids must not all fall back to each other's
    first block (two jobs probing at once would both take it)."""
    if not starts:
        return []
    first = int(job_id) % len(starts)
    rest = [i for i in range(len(starts)) if i != first]
    random.Random(int(job_id) + salt).shuffle(rest)
    return [starts[i] for i in (first, *rest)]


def candidates(job_id: str, exclusions: Sequence[Exclusion]) -> list[PortPlan]:
    """Every possible plan for the job, in the deterministic order they are tried: the
    blocks outside every exclusion first, then those inside only soft ones."""
    if not str(job_id).isdigit():
        raise ConfigError(f"job_id must be a decimal SLURM job id, got {job_id!r}")
    outside = _job_order(job_id, block_starts(exclusions))
    inside = _job_order(job_id, fallback_starts(exclusions), salt=1)
    if not outside and not inside:
        raise PortPlanError(
            f"no port block of {BLOCK} ports is left outside the excluded ranges {_describe(exclusions)}"
        )
    return [plan_for_block(job_id, start) for start in (*outside, *inside)]


def choose_plan(job_id: str, exclusions: Sequence[Exclusion], busy: Iterable[int] = ()) -> PortPlan:
    """The first candidate none of whose ports is in ``busy`` (ports seen taken on a node)."""
    taken = set(busy)
    for plan in candidates(job_id, exclusions):
        if taken.isdisjoint(plan.all_ports()):
            return plan
    raise PortPlanError(f"every port block is in use on this job's nodes (job {job_id})")


def choose_probed(
    job_id: str, exclusions: Sequence[Exclusion], busy: Iterable[int], probed: Iterable[int]
) -> PortPlan | None:
    """The first candidate not seen busy, if all its ports were probed; None when that
    candidate was not probed yet (the nodes' own ranges moved the order): probe it next.

    Unlike ``choose_plan`` this never returns a block that no node has checked, as long as
    the caller probes what it asks for."""
    taken, seen = set(busy), set(probed)
    for plan in candidates(job_id, exclusions):
        ports = plan.all_ports()
        if not taken.isdisjoint(ports):
            continue
        return plan if seen.issuperset(ports) else None
    raise PortPlanError(f"every port block is in use on this job's nodes (job {job_id})")


def next_to_probe(
    job_id: str, exclusions: Sequence[Exclusion], busy: Iterable[int], count: int
) -> list[PortPlan]:
    """The first ``count`` candidates not already seen busy: what a probe checks next."""
    taken = set(busy)
    free = [c for c in candidates(job_id, exclusions) if taken.isdisjoint(c.all_ports())]
    return free[:count]


def job_coordinator_port(job_id: str) -> int:
    """The JAX coordinator port of a job's ``srun`` step, from the job id alone.

    Every rank computes it from ``SLURM_JOB_ID`` only, so ranks on nodes with different
    port ranges, or whose ``scontrol`` timed out, still agree, and no rank asks the
    controller. It lies in 20000-20223, below the first aligned block, so it never meets a
    port plan of this or any other job; jobs whose ids differ by less than
    ``COORDINATOR_COUNT`` (224) never share it. The range is below Linux's default
    ephemeral range; on a node whose ephemeral range covers it the coordinator's early bind
    makes a clash unlikely, and it is an error, not a hang, when it happens.
    """
    if not str(job_id).isdigit():
        raise ConfigError(f"job_id must be a decimal SLURM job id, got {job_id!r}")
    return COORDINATOR_FIRST + int(job_id) % COORDINATOR_COUNT


def ranges_text(ranges: Iterable[tuple[int, int]]) -> str:
    """``lo-hi,...`` (a single port as ``p``): the form the bind shim reads, and messages."""
    return ",".join(f"{lo}-{hi}" if hi != lo else str(lo) for lo, hi in ranges)


def port_runs(ports: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted ports as runs of consecutive ones: ``[1, 2, 3, 7]`` -> ``[(1, 3), (7, 7)]``."""
    runs: list[tuple[int, int]] = []
    for p in sorted(set(ports)):
        if runs and runs[-1][1] == p - 1:
            runs[-1] = (runs[-1][0], p)
        else:
            runs.append((p, p))
    return runs


def held_ranges(plans: Iterable[PortPlan]) -> list[tuple[int, int]]:
    """The named ports of the given plans (the first ``JAX_OFFSET`` of each block: Ray's
    fixed ports and spares), each range once, in order: what a node holds on loopback
    (``runtime.loopback_hold``). Not the JAX and worker ports: a Ray driver without the
    bind shim (a user's own ``ray.init()`` on a node) binds worker ports on all interfaces,
    which a loopback hold would refuse, and no client reaches them over loopback."""
    return list(dict.fromkeys((p.block_start, p.block_start + JAX_OFFSET - 1) for p in plans))
