"""eray-provider: Ray clusters and multi-host JAX on SLURM allocations.

Light imports only: the providers (which need Ray) are loaded on first access,
so the CLI and the hostlist functions start fast.
"""

from __future__ import annotations

from typing import Any

from .jax.distributed import DistributedConfig, logical_cpu_core_count
from .plan.modules import LAZY
from .plan.ports import PortPlan
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
