"""Elastic node types as sbatch requests, and what ``squeue`` says about the jobs: pure.

A node type of ``cluster_yamls/slurm-autoscale.yaml`` holds ``node_config.sbatch``: what
one SLURM job asks for (``nodes`` Ray nodes, each with ``cpus_per_node`` CPUs,
``gpus_per_node`` GPUs and ``mem``). The same request gives the ``sbatch`` command line
and the resources the autoscaler plans with while the job is still pending, so both
always agree. Jobs are named by ``names`` (``eray.<cluster>.<head job>.<node type>``, the
head's own job ``eray.<cluster>.head``): the cluster's jobs can be found again with
``squeue`` when the state file is lost, and nothing else is ever touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..slurm.allocation import NodeShare, memory_mib, parse_gpu_spec
from .node_spec import DEFAULT_OBJECT_STORE_FRACTION, share_resources

_KEYS = {
    "partition",
    "account",
    "qos",
    "time",
    "nodes",
    "cpus_per_node",
    "gpus_per_node",
    "mem",
    "constraint",
    "reservation",
    "extra",
}


#: sbatch options the provider sets itself or that would hide the job from it.
_RESERVED_LONG = (
    "--job-name", "--output", "--error", "--array", "--export", "--parsable", "--wrap",
    "--test-only", "--nodes", "--ntasks", "--ntasks-per-node", "--cpus-per-task", "--mem",
    "--mem-per-cpu", "--mem-per-gpu", "--gpus", "--gpus-per-node", "--gres", "--chdir",
)  # fmt: skip
_RESERVED_SHORT = ("-J", "-o", "-e", "-a", "-N", "-n", "-c", "-G", "-D")


def _reserved(option: str) -> bool:
    if option.startswith("--"):
        return option.split("=", 1)[0] in _RESERVED_LONG
    return option[:2] in _RESERVED_SHORT


class SbatchRequestError(ConfigError):
    """A node type's sbatch request is malformed."""


def parse_mem(value: Any, where: str) -> int:
    """``1500``, ``"1500M"``, ``"4G"`` -> MiB (SLURM's units: a bare number is MiB)."""
    mib = None if isinstance(value, bool) else memory_mib(str(value))
    if not mib:
        raise SbatchRequestError(f"{where}.mem: expected MiB or a size like 4G, got {value!r}")
    return max(1, int(mib))


def _positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).isdigit():
        raise SbatchRequestError(f"{where}: expected a positive integer, got {value!r}")
    if int(value) < 1:
        raise SbatchRequestError(f"{where}: expected a positive integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class SbatchRequest:
    """One SLURM job of a node type: ``nodes`` Ray nodes of equal shares."""

    cpus_per_node: int
    nodes: int = 1
    gpus_per_node: int = 0
    gpu_type: str | None = None
    mem_mb: int | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None
    constraint: str | None = None
    reservation: str | None = None
    extra: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def from_config(cls, request: Any, defaults: dict[str, Any] | None, where: str) -> SbatchRequest:
        """``defaults`` (``provider.sbatch``) overlaid by the node type's own request."""
        if not isinstance(request, dict):
            raise SbatchRequestError(f"{where}: expected a mapping of sbatch options, got {request!r}")
        merged = {**(defaults or {}), **request}
        unknown = sorted(set(merged) - _KEYS)
        if unknown:
            raise SbatchRequestError(f"{where}: unknown option(s) {unknown}; known: {sorted(_KEYS)}")
        if "cpus_per_node" not in merged:
            raise SbatchRequestError(f"{where}.cpus_per_node is required (CPUs of each node of the job)")
        gpu_type, gpus = None, 0
        if merged.get("gpus_per_node") not in (None, 0, "0"):
            try:
                gpu_type, gpus = parse_gpu_spec(str(merged["gpus_per_node"]), f"{where}.gpus_per_node")
            except ValueError as e:
                raise SbatchRequestError(str(e)) from e
        extra = merged.get("extra") or []
        if isinstance(extra, str) or not all(isinstance(e, str) and e.startswith("-") for e in extra):
            raise SbatchRequestError(f"{where}.extra: expected a list of sbatch options, got {extra!r}")
        for option in extra:
            if _reserved(option):
                raise SbatchRequestError(
                    f"{where}.extra: {option!r} is set by eray-provider (job name, output, node "
                    "and task layout, environment) or breaks tracking the job; use the request's "
                    "own fields"
                )
        text = {}
        for key in ("partition", "account", "qos", "time", "constraint", "reservation"):
            value = merged.get(key)
            if value is not None and (not str(value).strip() or any(c.isspace() for c in str(value))):
                raise SbatchRequestError(f"{where}.{key}: expected one word, got {value!r}")
            text[key] = None if value is None else str(value)
        return cls(
            cpus_per_node=_positive_int(merged["cpus_per_node"], f"{where}.cpus_per_node"),
            nodes=_positive_int(merged.get("nodes", 1), f"{where}.nodes"),
            gpus_per_node=gpus,
            gpu_type=gpu_type,
            mem_mb=None if merged.get("mem") is None else parse_mem(merged["mem"], where),
            extra=tuple(extra),
            **text,
        )

    def argv(self) -> list[str]:
        """sbatch options for this request (one task per node, all its CPUs to that task)."""
        args = [
            f"--nodes={self.nodes}",
            "--ntasks-per-node=1",
            f"--cpus-per-task={self.cpus_per_node}",
        ]
        if self.gpus_per_node:
            spec = f"{self.gpu_type}:{self.gpus_per_node}" if self.gpu_type else str(self.gpus_per_node)
            args.append(f"--gpus-per-node={spec}")
        if self.mem_mb is not None:
            args.append(f"--mem={self.mem_mb}M")
        for key in ("partition", "account", "qos", "time", "constraint", "reservation"):
            value = getattr(self, key)
            if value is not None:
                args.append(f"--{key}={value}")
        return [*args, *self.extra]

    def share(self) -> NodeShare:
        """What each node of the job will hold, as far as the request says."""
        return NodeShare(
            name="(pending)",
            cpus=self.cpus_per_node,
            gpus=self.gpus_per_node,
            gpu_type=self.gpu_type,
            memory_mb=self.mem_mb,
        )

    def resources(self, object_store_fraction: float = DEFAULT_OBJECT_STORE_FRACTION) -> dict[str, float]:
        """The resources of one node of this type for the autoscaler, before the job starts."""
        return share_resources(self.share(), object_store_fraction)


# ---------------------------------------------------------------------- node ids
def elastic_node_id(job_id: str, index: int) -> str:
    """The Ray node id of the ``index``-th node of worker job ``job_id``."""
    return f"j{job_id}-{index}"


def parse_elastic_node_id(node_id: str) -> tuple[str, int] | None:
    """``j<job>-<index>`` -> (job, index); None for the ids of the allocation's nodes."""
    if not node_id.startswith("j"):
        return None
    job, _, index = node_id[1:].partition("-")
    return (job, int(index)) if job.isdigit() and index.isdigit() else None


# ---------------------------------------------------------------------- squeue
