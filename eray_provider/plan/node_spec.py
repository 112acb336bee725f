"""From a node's SLURM share to its Ray node: resources, labels, ``ray start`` arguments.

Pure functions: the same share always gives the same Ray node, whether the launcher
builds node types for the autoscaler or a node builds its own ``ray start`` line.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..slurm.allocation import Allocation, NodeShare
from .ports import PortPlan

#: Ray refuses object stores smaller than this (bytes).
MIN_OBJECT_STORE = 80 * 1024 * 1024
DEFAULT_OBJECT_STORE_FRACTION = 0.3
HEAD_TYPE = "ray.head.slurm"


def node_resource(name: str) -> str:
    """Custom resource that pins work to a SLURM node: ``{"slurm_node:node7": 0.01}``."""
    return f"slurm_node:{name}"


def accelerator_resource(gpu_type: str) -> str:
    """Ray's accelerator resource name for a SLURM GPU type (``a100`` -> ``accelerator_type:A100``)."""
    return f"accelerator_type:{gpu_type.upper()}"


def memory_split(share: NodeShare, object_store_fraction: float) -> tuple[int | None, int | None]:
    """(heap bytes, object store bytes) within the node's SLURM memory; None when unknown."""
    if share.memory_mb is None:
        return None, None
    total = share.memory_mb * 1024 * 1024
    store = max(int(total * object_store_fraction), MIN_OBJECT_STORE)
    if store >= total:
        raise ConfigError(
            f"node {share.name}: {share.memory_mb} MiB is too little for Ray "
            f"(the object store alone needs {MIN_OBJECT_STORE // 2**20} MiB)"
        )
    return total - store, store


def share_resources(share: NodeShare, object_store_fraction: float) -> dict[str, float]:
    """CPU, GPU (with Ray's accelerator type), memory and object store of a share."""
    res: dict[str, float] = {"CPU": share.cpus}
    if share.gpus:
        res["GPU"] = share.gpus
        if share.gpu_type:
            res[accelerator_resource(share.gpu_type)] = 1.0
    heap, store = memory_split(share, object_store_fraction)
    if heap is not None and store is not None:
        res["memory"] = heap
        res["object_store_memory"] = store
    return res


def ray_resources(share: NodeShare, job_id: str, object_store_fraction: float) -> dict[str, float]:
    """The resources the autoscaler sees for this node (what ``ray start`` will report)."""
    return {
        **share_resources(share, object_store_fraction),
        node_resource(share.name): 1.0,
        f"slurm_job:{job_id}": 1.0,
    }


def ray_labels(
    share: NodeShare, job_id: str, index: int | None = None, end_time: float | None = None
) -> dict[str, str]:
    """Labels naming the node's SLURM node, job, position in the job's node list and, when
    known, when the job ends (``slurm-end-time``, epoch seconds, as SLURM said when the node
    started: a later preemption or time-limit change is not in it; the drain is)."""
    labels = {"slurm-node": share.name, "slurm-job": str(job_id)}
    if index is not None:
        labels["slurm-node-index"] = str(index)
    if end_time is not None:
        labels["slurm-end-time"] = str(int(end_time))
    return labels


def share_key(share: NodeShare) -> tuple[int, int, str | None, int | None]:
    return (share.cpus, share.gpus, share.gpu_type, share.memory_mb)


def worker_types(alloc: Allocation) -> dict[str, list[NodeShare]]:
    """Worker node types: one per distinct share, named by what it holds, in node order."""
    groups: dict[tuple[int, int, str | None, int | None], list[NodeShare]] = {}
    for share in alloc.workers:
        groups.setdefault(share_key(share), []).append(share)
    types: dict[str, list[NodeShare]] = {}
    for (cpus, gpus, gpu_type, mem), shares in groups.items():
        name = f"ray.worker.c{cpus}" + (f".g{gpus}" + (f".{gpu_type}" if gpu_type else "") if gpus else "")
        name += f".m{mem}" if mem is not None else ""
        types[name] = shares
    return types


@dataclass(frozen=True)
class StartSpec:
    """Everything one node needs to run ``ray start --block``."""

    share: NodeShare
    job_id: str
    role: str  # "head" or "worker"
    ip: str
    plan: PortPlan
    temp_dir: str
    head_address: str | None = None  # host:port of the GCS, for workers
    dashboard_host: str | None = None
    object_store_fraction: float = DEFAULT_OBJECT_STORE_FRACTION
    autoscaling_config: str | None = None
    node_index: int | None = None
    #: when the node's job ends (epoch seconds), for the ``slurm-end-time`` label
    end_time: float | None = None

    def argv(self) -> list[str]:
        heap, store = memory_split(self.share, self.object_store_fraction)
        res = {
            k: v
            for k, v in ray_resources(self.share, self.job_id, self.object_store_fraction).items()
            if k not in ("CPU", "GPU", "memory", "object_store_memory")
        }
        labels = ray_labels(self.share, self.job_id, self.node_index, self.end_time)
        args = ["ray", "start", "--block", "--disable-usage-stats"]
        if self.role == "head":
            args += ["--head", f"--port={self.plan.gcs}"]
            args.append(f"--dashboard-host={self.dashboard_host or self.ip}")
            if self.autoscaling_config:
                args.append(f"--autoscaling-config={self.autoscaling_config}")
        else:
            if not self.head_address:
                raise ValueError("a worker needs the head's address")
            args.append(f"--address={self.head_address}")
        args += [
            f"--node-ip-address={self.ip}",
            f"--temp-dir={self.temp_dir}",
            f"--num-cpus={self.share.cpus}",
            f"--num-gpus={self.share.gpus}",
            f"--resources={json.dumps(res, sort_keys=True)}",
            "--labels=" + ",".join(f"{k}={v}" for k, v in labels.items()),
        ]
        if heap is not None:
            args += [f"--memory={heap}", f"--object-store-memory={store}"]
        args += self.plan.ray_start_args()
        return args

    def shell(self) -> str:
        return " ".join(shlex.quote(a) for a in self.argv())


def start_env(plan: PortPlan, metrics_export: bool) -> dict[str, str]:
    """The variables of a node's ``ray start`` beside its arguments: the plan's ports that
    have no flag, and Prometheus metrics export (``provider.metrics_export``) off unless
    asked for, because that endpoint answers anyone who can reach the node's address,
    without the token. Nothing here depends on the head, so a worker's Ray gets them
    before the head is known (``runtime.ray_gate``)."""
    env = dict(plan.ray_env())
    if not metrics_export:
        # the dashboard agent then never opens the metrics export port
        env["RAY_enable_metrics_collection"] = "0"
    return env


def node_type_config(shares: list[NodeShare], job_id: str, fraction: float) -> dict[str, Any]:
    """An ``available_node_types`` entry for shares that are all alike."""
    res = ray_resources(shares[0], job_id, fraction)
    # the per-node pinning resource differs between nodes of one type: leave it out
    res = {k: v for k, v in res.items() if not k.startswith("slurm_node:")}
    return {
        "resources": res,
        "labels": {"slurm-job": str(job_id)},
        "node_config": {"slurm_nodes": [s.name for s in shares]},
        "min_workers": len(shares),
        "max_workers": len(shares),
    }
