"""``eSlurmCluster``: the name eFormer's ``cluster_util`` exports, for code that switches its
imports to eray-provider.

It is JAX's own ``SlurmCluster`` (so ``isinstance`` checks, ``is_env_present`` and the
process counts JAX reads from ``SLURM_NTASKS``/``SLURM_PROCID``/``SLURM_LOCALID`` hold),
whose answers come from this package's step layout (``slurm/step.py``), so that they agree
with ``DistributedConfig``: the coordinator at the step's first node and
``job_coordinator_port`` (eFormer: port 61440 + job id mod 4096), GPU positions 0..n-1 as JAX
numbers them (eFormer: the values of ``CUDA_VISIBLE_DEVICES``), and comma node lists and
tasks bound to their own GPUs read right (eFormer raises on both). The table in
docs/eformer.md lists every difference.
"""

from __future__ import annotations

import os

from jax._src.clusters import SlurmCluster

from ..slurm.step import node_list_text, step_layout
from .distributed import DistributedConfig, local_device_ids


class eSlurmCluster(SlurmCluster):
    """JAX's SLURM cluster, answering with eray-provider's reading of the step."""

    @classmethod
    def get_coordinator_address(
        cls, timeout_secs: int | None = None, override_coordinator_port: str | None = None
    ) -> str:
        """``HOST:PORT`` of the step's coordinator (``DistributedConfig``'s); JAX's
        ``override_coordinator_port`` replaces the port."""
        resolved = DistributedConfig().resolve(os.environ)
        assert resolved is not None  # resolve raises outside a step when nothing is given
        if override_coordinator_port:
            return f"{resolved.coordinator.rpartition(':')[0]}:{override_coordinator_port}"
        return resolved.coordinator

    @classmethod
    def _node_list(cls) -> str | None:
        return node_list_text(os.environ)

    @classmethod
    def get_local_device_ids_for_process(cls) -> list[int] | None:
        """This task's GPUs as JAX numbers them; None without ``CUDA_VISIBLE_DEVICES``."""
        return local_device_ids(step_layout(os.environ), os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ)

    @classmethod
    def _infer_local_process_count(cls) -> int:
        return step_layout(os.environ).local_count
