"""``DistributedConfig``: ``jax.distributed`` for ``srun python train.py`` jobs, from SLURM.

The seed module's API, kept for its users, on this package's machinery: node lists are
read with the exact hostlist grammar, the coordinator port comes from the job's port plan
(the first JAX port, the same on every node), devices are split among the tasks of a node
from the task layout, and JAX's own SLURM detection is switched off so that nothing
overrides what is computed here. Outside a SLURM step, with nothing given, ``initialize``
does nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from .allocation import AllocationError
from .hostlist import HostlistError, expand, expand_counts
from .ports import candidates

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepLayout:
    """Where this task sits in its SLURM step."""

    job_id: str
    nodes: tuple[str, ...]
    tasks_per_node: tuple[int, ...]
    process_id: int
    local_id: int
    node_index: int

    @property
    def num_processes(self) -> int:
        return sum(self.tasks_per_node)

    @property
    def local_count(self) -> int:
        return self.tasks_per_node[self.node_index]


def _need(env: Mapping[str, str], *names: str) -> tuple[str, str]:
    for name in names:
        if name in env:
            return name, env[name]
    raise AllocationError(f"{names[0]} is not set: not inside a SLURM step (run under srun)")


def step_layout(env: Mapping[str, str]) -> StepLayout:
    """The task layout of the step this process belongs to (pure: reads ``env`` only)."""
    _, job = _need(env, "SLURM_JOB_ID", "SLURM_JOBID")
    var, nodelist = _need(env, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    try:
        nodes = tuple(expand(nodelist))
    except HostlistError as e:
        raise AllocationError(f"{var}={nodelist!r}: {e.reason}") from e
    tvar, tasks = _need(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    try:
        per_node = tuple(expand_counts(tasks))
    except HostlistError as e:
        raise AllocationError(f"{tvar}={tasks!r}: {e.reason}") from e
    if len(per_node) != len(nodes):
        raise AllocationError(f"{tvar}={tasks!r} has {len(per_node)} entries for {len(nodes)} nodes ({var})")
    values = {}
    for name in ("SLURM_PROCID", "SLURM_LOCALID"):
        _, value = _need(env, name)
        if not value.isdigit():
            raise AllocationError(f"{name}={value!r} is not a number")
        values[name] = int(value)
    _, here = _need(env, "SLURMD_NODENAME")
    if here not in nodes:
        raise AllocationError(f"SLURMD_NODENAME={here!r} is not in {var}={nodelist!r}")
    return StepLayout(
        job, nodes, per_node, values["SLURM_PROCID"], values["SLURM_LOCALID"], nodes.index(here)
    )


def local_device_ids(layout: StepLayout, visible: str | None) -> list[int] | None:
    """This task's share of the node's visible GPUs, as JAX numbers them (0..n-1).

    ``visible`` is ``CUDA_VISIBLE_DEVICES``; None or empty means no GPUs (JAX on CPU).
    """
    if not visible:
        return None
    count = len([d for d in visible.split(",") if d.strip()])
    if count % layout.local_count:
        raise AllocationError(
            f"CUDA_VISIBLE_DEVICES={visible!r}: {count} GPUs cannot be split evenly among the "
            f"{layout.local_count} tasks on {layout.nodes[layout.node_index]}"
        )
    per_task = count // layout.local_count
    return list(range(layout.local_id * per_task, (layout.local_id + 1) * per_task))


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

    def initialize(self, env: Mapping[str, str] | None = None) -> bool:
        """Initialize ``jax.distributed``; False (and nothing done) outside a cluster."""
        env = os.environ if env is None else env
        in_step = "SLURM_PROCID" in env and ("SLURM_JOB_ID" in env or "SLURM_JOBID" in env)
        if not in_step and not self._given():
            logger.info("not in a SLURM step and nothing configured: jax.distributed not initialized")
            return False
        layout = step_layout(env) if in_step else None
        coordinator = self.coordinator_address
        if coordinator is None:
            if layout is None:
                raise AllocationError("coordinator_address is needed outside a SLURM step")
            from .slurm_cli import host_exclusions

            port = candidates(layout.job_id, host_exclusions())[0].jax_first
            coordinator = f"{layout.nodes[0]}:{port}"
        num = self.num_processes if self.num_processes is not None else (layout and layout.num_processes)
        pid = self.process_id if self.process_id is not None else (layout and layout.process_id)
        if num is None or pid is None:
            raise AllocationError("num_processes and process_id are needed outside a SLURM step")
        devices = self.local_device_ids
        if isinstance(devices, int):
            devices = [devices]
        if devices is None and layout is not None:
            devices = local_device_ids(layout, env.get("CUDA_VISIBLE_DEVICES"))
        from .jax import initialize

        initialize(int(pid), int(num), coordinator, devices, timeout=self.initialization_timeout)
        logger.info(
            "jax.distributed: process %s of %s, coordinator %s, devices %s", pid, num, coordinator, devices
        )
        return True
