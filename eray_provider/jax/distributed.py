"""``DistributedConfig``: ``jax.distributed`` for ``srun python train.py`` jobs, from SLURM.

The seed module's API, kept for its users, on this package's machinery: node lists are
read with the exact hostlist grammar, devices are split among the tasks of a node from the
task layout (or taken whole where SLURM binds each task to its own GPUs), and JAX's own
SLURM detection is switched off so that nothing overrides what is computed here. Outside
an srun step (the batch script and an salloc shell included: one task, though they set
``SLURM_PROCID=0`` and the whole job's node list), with nothing given, ``initialize`` does
nothing.

Every value is computed by every rank from the step's environment alone, which srun gives
all tasks alike: no rank reads ``/proc`` or asks ``scontrol``, so ranks on nodes with
different port ranges, or whose controller is slow, still agree, and a step of 10,000
tasks sends the controller nothing. The coordinator port is ``ports.job_coordinator_port``
of the job id.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..plan.ports import job_coordinator_port
from ..slurm.allocation import AllocationError
from ..slurm.env import cpus_on_node, in_step_task
from ..slurm.step import StepLayout, step_layout, task_bound

logger = logging.getLogger(__name__)


def logical_cpu_core_count() -> int:
    """The CPUs SLURM gave the job on this node (``SLURM_CPUS_ON_NODE``, for all its tasks
    there together), else every CPU of the machine (``os.cpu_count()``, the affinity mask
    not counted): eFormer's helper of that name, with its answers."""
    return cpus_on_node(os.environ) or os.cpu_count() or 1


def local_device_ids(
    layout: StepLayout, visible: str | None, env: Mapping[str, str] | None = None
) -> list[int] | None:
    """This task's GPUs, as JAX numbers them (0..n-1): all it sees where SLURM bound the
    task to its own (``task_bound``), else its share of the node's.

    ``visible`` is ``CUDA_VISIBLE_DEVICES``; None or empty means no GPUs (JAX on CPU).
    """
    if not visible:
        return None
    count = len([d for d in visible.split(",") if d.strip()])
    if task_bound(layout, count, env or {}):
        return list(range(count))
    if count % layout.local_count:
        raise AllocationError(
            f"CUDA_VISIBLE_DEVICES={visible!r}: {count} GPUs cannot be split evenly among the "
            f"{layout.local_count} tasks on {layout.nodes[layout.node_index]} (with --gpus-per-task or "
            "--gpu-bind each task sees only its own: SLURM_GPUS_PER_TASK and SLURM_GPU_BIND are not set)"
        )
    per_task = count // layout.local_count
    return list(range(layout.local_id * per_task, (layout.local_id + 1) * per_task))


@dataclass(frozen=True)
class Resolved:
    """What ``jax.distributed.initialize`` gets, as one rank computed it."""

    coordinator: str
    num_processes: int
    process_id: int
    local_device_ids: list[int] | None


@dataclass(frozen=True)
class DistributedConfig:
    """Settings for ``jax.distributed``; unset fields are taken from SLURM."""

    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    local_device_ids: int | list[int] | None = None
    initialization_timeout: float = 300.0

    def _given(self) -> bool:
        return any(
            v is not None
            for v in (self.coordinator_address, self.num_processes, self.process_id, self.local_device_ids)
        )

    def resolve(self, env: Mapping[str, str]) -> Resolved | None:
        """The settings this rank uses, from ``env`` alone (no ``scontrol``, no ``/proc``);
        None outside an srun step with nothing given.

        The coordinator is the step's first node at ``job_coordinator_port(job id)``: the
        same for every rank whatever its node's port ranges, and never a port of any
        cluster's port plan (an ``auto_ray_cluster`` started next in the step does not
        collide with it). Two JAX steps of one job running at once need
        ``coordinator_address`` given to one of them."""
        in_step = in_step_task(env)
        if not in_step and not self._given():
            return None
        layout = step_layout(env) if in_step else None
        coordinator = self.coordinator_address
        if coordinator is None:
            if layout is None:
                raise AllocationError("coordinator_address is needed outside an srun step")
            coordinator = f"{layout.nodes[0]}:{job_coordinator_port(layout.job_id)}"
        num, pid = self.num_processes, self.process_id
        if layout is not None:
            num = layout.num_processes if num is None else num
            pid = layout.process_id if pid is None else pid
        if num is None or pid is None:
            raise AllocationError("num_processes and process_id are needed outside an srun step")
        devices = self.local_device_ids
        if isinstance(devices, int):
            devices = [devices]
        if devices is None and layout is not None:
            devices = local_device_ids(layout, env.get("CUDA_VISIBLE_DEVICES"), env)
        return Resolved(coordinator, int(num), int(pid), devices)

    def initialize(self, env: Mapping[str, str] | None = None) -> bool:
        """Initialize ``jax.distributed``; False (and nothing done) outside a cluster."""
        env = os.environ if env is None else env
        resolved = self.resolve(env)
        if resolved is None:
            logger.info("not in an srun step and nothing configured: jax.distributed not initialized")
            return False
        from . import initialize

        initialize(
            resolved.process_id,
            resolved.num_processes,
            resolved.coordinator,
            resolved.local_device_ids,
            timeout=self.initialization_timeout,
        )
        logger.info(
            "jax.distributed: process %s of %s, coordinator %s, devices %s",
            resolved.process_id,
            resolved.num_processes,
            resolved.coordinator,
            resolved.local_device_ids,
        )
        return True
