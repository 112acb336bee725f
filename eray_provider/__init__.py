"""eray-provider: Ray clusters and multi-host JAX on SLURM allocations.

Every public name is loaded on first access (``plan.modules.LAZY``): a process that runs
one of the package's modules (a node's ``node_run``, the port probe, the CLI) pays only
for what that module imports, which on a node with a third of a CPU is a tenth of a
second per start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .plan.modules import LAZY

if TYPE_CHECKING:
    from .autoscaler.elastic import SlurmJobProvider
    from .autoscaler.provider import SlurmNodeProvider
    from .jax.distributed import DistributedConfig, logical_cpu_core_count
    from .jax.slurm_cluster import eSlurmCluster
    from .plan.ports import PortPlan
    from .runtime.ray_cluster import RayClusterConfig, auto_ray_cluster
    from .slurm.allocation import Allocation, AllocationError, NodeShare
    from .slurm.hostlist import HostlistError, compress, expand, expand_counts

__all__ = [
    "Allocation",
    "AllocationError",
    "DistributedConfig",
    "HostlistError",
    "NodeShare",
    "PortPlan",
    "RayClusterConfig",
    "SlurmJobProvider",
    "SlurmNodeProvider",
    "auto_ray_cluster",
    "compress",
    "eSlurmCluster",
    "expand",
    "expand_counts",
    "logical_cpu_core_count",
]


def __getattr__(name: str) -> Any:
    if name in LAZY:
        import importlib

        return getattr(importlib.import_module(LAZY[name]), name)
    raise AttributeError(f"module 'eray_provider' has no attribute {name!r}")
