"""eray-provider: Ray clusters and multi-host JAX on SLURM allocations.

Light imports only: the providers (which need Ray) are loaded on first access,
so the CLI and the hostlist functions start fast.
"""

from __future__ import annotations

from typing import Any

from .allocation import Allocation, AllocationError, NodeShare
from .distributed import DistributedConfig
from .hostlist import HostlistError, compress, expand, expand_counts
from .ports import PortPlan

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
    "expand",
    "expand_counts",
]

_LAZY = {
    "SlurmNodeProvider": "eray_provider.provider",
    "SlurmJobProvider": "eray_provider.elastic",
    "auto_ray_cluster": "eray_provider.ray_cluster",
    "RayClusterConfig": "eray_provider.ray_cluster",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'eray_provider' has no attribute {name!r}")
