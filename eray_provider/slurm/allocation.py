"""The allocation model: which nodes a SLURM job holds and what each node holds.

One immutable ``Allocation`` is the single description every other part reads: the
provider turns it into Ray nodes, the port plan is keyed by its job id, the JAX helper
finds its coordinator on its head. Built from the environment (``slurm.env``) or from
``scontrol show job -d`` (``scontrol``); ``load_allocation`` chooses between them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any

from ..errors import ClusterError, ConfigError


class AllocationError(ConfigError):
    """SLURM facts that are missing, malformed or contradict each other."""


class JobGoneError(ClusterError):
    """The job has ended (or never existed): it holds no nodes any more. A fact about the
    job, not bad input: the command line exits 1 for it, not 2."""


@dataclass(frozen=True)
class NodeShare:
    """What one node of the allocation gives this job."""

    name: str
    cpus: int
    gpus: int = 0
    gpu_type: str | None = None
    memory_mb: int | None = None
    #: GPU indices on the node (``IDX`` from scontrol), when known.
    gpu_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.cpus < 1:
            raise AllocationError(f"node {self.name!r}: cpus must be >= 1, got {self.cpus}")
        if self.gpus < 0:
            raise AllocationError(f"node {self.name!r}: gpus must be >= 0, got {self.gpus}")
        if self.memory_mb is not None and self.memory_mb < 1:
            raise AllocationError(
                f"node {self.name!r}: memory_mb must be >= 1 or unknown, got {self.memory_mb}"
            )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gpu_ids"] = list(self.gpu_ids) if self.gpu_ids is not None else None
        return d


@dataclass(frozen=True)
class Allocation:
    """A job's nodes in node-list order; the head is the first node."""

    job_id: str
    nodes: tuple[NodeShare, ...]
    cluster: str | None = None
    partition: str | None = None
    #: Where the facts came from: ``"environment"`` or ``"scontrol"``.
    source: str = "environment"
    #: SLURM's job state when it was read through scontrol (``RUNNING``, ...).
    state: str | None = None
    #: When the job ends (epoch seconds) as SLURM said when it was read, None when
    #: unknown or unlimited; a preemption or ``scontrol update`` may move it since
    #: (``end_watch`` follows it live).
    end_time: float | None = None
    #: The job's time limit in seconds; None when unknown or unlimited.
    time_limit_s: float | None = None

    def __post_init__(self) -> None:
        if not self.job_id or not self.job_id.isdigit():
            raise AllocationError(f"job id must be a decimal number, got {self.job_id!r}")
        if not self.nodes:
            raise AllocationError(f"job {self.job_id} has no nodes")
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise AllocationError(f"job {self.job_id}: node list repeats a node: {names}")

    @property
    def head(self) -> NodeShare:
        return self.nodes[0]

    @property
    def workers(self) -> tuple[NodeShare, ...]:
        return self.nodes[1:]

    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self.nodes]

    @cached_property
    def _by_name(self) -> dict[str, NodeShare]:
        return {n.name: n for n in self.nodes}

    def node(self, name: str) -> NodeShare:
        found = self._by_name.get(name)
        if found is not None:
            return found
        raise AllocationError(
            f"node {name!r} is not part of job {self.job_id} (nodes: {', '.join(self.node_names)})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "cluster": self.cluster,
            "partition": self.partition,
            "state": self.state,
            "source": self.source,
            "end_time": self.end_time,
            "time_limit_s": self.time_limit_s,
            "head": self.head.name,
            "nodes": [n.to_dict() for n in self.nodes],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Allocation:
        nodes = tuple(
            NodeShare(
                name=n["name"],
                cpus=int(n["cpus"]),
                gpus=int(n.get("gpus", 0)),
                gpu_type=n.get("gpu_type"),
                memory_mb=n.get("memory_mb"),
                gpu_ids=tuple(n["gpu_ids"]) if n.get("gpu_ids") is not None else None,
            )
            for n in d["nodes"]
        )
        return cls(
            job_id=str(d["job_id"]),
            nodes=nodes,
            cluster=d.get("cluster"),
            partition=d.get("partition"),
            source=d.get("source", "environment"),
            state=d.get("state"),
            end_time=d.get("end_time"),
            time_limit_s=d.get("time_limit_s"),
        )


_MEMORY = re.compile(r"(\d+)(\.\d+)?([KMGT]?)B?", re.IGNORECASE)
_MIB_PER = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024**2}


def memory_mib(text: str, decimals: bool = False) -> float | None:
    """An amount of memory as SLURM writes it (``--mem``, ``scontrol``, the ``SLURM_MEM_*``
    variables): a number of MiB with an optional unit, K, M, G or T in either case and an
    optional B after it (``3000``, ``3000M``, ``4G``, ``512k``, ``4GB``); ``decimals`` also
    takes what ``scontrol`` prints (``1.50G``), which sbatch itself refuses. Returns MiB,
    None for anything else: what 0 means and how to round is the caller's (a request of 0
    is an error, a job's 0 is "not tracked")."""
    m = _MEMORY.fullmatch(text.strip())
    if m is None or (m.group(2) and not decimals):
        return None
    return float(m.group(1) + (m.group(2) or "")) * _MIB_PER[m.group(3).upper()]


def one_gpu_type(types: Iterable[str | None]) -> str | None:
    """The GPU type of a node whose GPUs were counted in several entries (a GRES list, two
    components of a heterogeneous job), one type (None: untyped) per entry that counted
    GPUs: the type when all agree, else None (``ray start`` gets one ``gpu_type`` label,
    and a wrong one would place work badly)."""
    distinct = set(types)
    return distinct.pop() if len(distinct) == 1 else None


def add_shares(a: NodeShare, b: NodeShare) -> NodeShare:
    """One node's two shares (two components of a heterogeneous job on it) as one Ray node:
    CPUs, GPUs and memory summed (memory unknown if either is), the GPU type by
    ``one_gpu_type``, the GPU indices unknown."""
    memory = None if a.memory_mb is None or b.memory_mb is None else a.memory_mb + b.memory_mb
    gpu_type = one_gpu_type(s.gpu_type for s in (a, b) if s.gpus)
    return NodeShare(a.name, a.cpus + b.cpus, a.gpus + b.gpus, gpu_type, memory)


def parse_gpu_spec(value: str, variable: str) -> tuple[str | None, int]:
    """``4``, ``a100:4``, ``gpu:4``, ``gpu:a100:4`` -> (type or None, count).

    Used for ``SLURM_GPUS_PER_NODE`` and the GRES strings of scontrol, which share
    this shape. A list of several types (``a100:2,v100:1``) sums the counts and keeps
    the type only when all entries agree.
    """
    types: set[str | None] = set()
    total = 0
    for item in value.split(","):
        parts = item.strip().split(":")
        if parts and parts[0] in ("gpu", "gres/gpu"):
            parts = parts[1:]
        if not parts or not parts[-1].isdigit() or len(parts) > 2:
            raise AllocationError(f"{variable}={value!r}: expected COUNT, TYPE:COUNT or gpu:TYPE:COUNT")
        total += int(parts[-1])
        types.add(parts[0] if len(parts) == 2 and parts[0] else None)
    gpu_type = one_gpu_type(types)
    return gpu_type, total
