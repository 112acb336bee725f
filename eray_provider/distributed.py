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
import re
from collections.abc import Mapping
from dataclasses import dataclass

from .allocation import AllocationError, parse_gpu_spec
from .hostlist import HostlistError, expand, expand_counts
from .ports import job_coordinator_port
from .slurm_env import STEP_VARIABLES, in_srun_step

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


def _count(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name)
    if value is None:
        return None
    if not value.isdigit():
        raise AllocationError(f"{name}={value!r} is not a number")
    return int(value)


def step_layout(env: Mapping[str, str]) -> StepLayout:
    """The task layout of the srun step this process belongs to (pure: reads ``env`` only).

    Outside an srun step (``slurm_env.in_srun_step``) it raises: the batch script's
    ``SLURM_TASKS_PER_NODE`` describes the job's tasks, not processes that exist, and a
    world built from it would wait forever for ranks nobody started."""
    if not in_srun_step(env):
        raise AllocationError(
            f"none of {', '.join(STEP_VARIABLES)} is set: not inside an srun step (the batch "
            "script and an salloc shell are one task; run the program under srun)"
        )
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
    num_nodes = _count(env, "SLURM_STEP_NUM_NODES")
    if num_nodes is not None and num_nodes != len(nodes):
        raise AllocationError(
            f"SLURM_STEP_NUM_NODES={env['SLURM_STEP_NUM_NODES']!r} disagrees with {var}={nodelist!r} "
            f"({len(nodes)} nodes)"
        )
    num_tasks = _count(env, "SLURM_STEP_NUM_TASKS")
    if num_tasks is not None and num_tasks != sum(per_node):
        raise AllocationError(
            f"SLURM_STEP_NUM_TASKS={env['SLURM_STEP_NUM_TASKS']!r} disagrees with {tvar}={tasks!r} "
            f"({sum(per_node)} tasks)"
        )
    values = {}
    for name in ("SLURM_PROCID", "SLURM_LOCALID"):
        _, value = _need(env, name)
        if not value.isdigit():
            raise AllocationError(f"{name}={value!r} is not a number")
        values[name] = int(value)
    _, here = _need(env, "SLURMD_NODENAME")
    if here not in nodes:
        raise AllocationError(f"SLURMD_NODENAME={here!r} is not in {var}={nodelist!r}")
    layout = StepLayout(
        job, nodes, per_node, values["SLURM_PROCID"], values["SLURM_LOCALID"], nodes.index(here)
    )
    if layout.process_id >= layout.num_processes:
        raise AllocationError(
            f"SLURM_PROCID={env['SLURM_PROCID']!r} is not below the step's {layout.num_processes} "
            f"tasks ({tvar}={tasks!r})"
        )
    if layout.local_id >= layout.local_count:
        raise AllocationError(
            f"SLURM_LOCALID={env['SLURM_LOCALID']!r} is not below the {layout.local_count} tasks of "
            f"{here} ({tvar}={tasks!r})"
        )
    return layout


_BIND = re.compile(r"(?:^|,)(none|closest|single|per_task|map_gpu|mask_gpu)(?::(\d+))?")


def _id_count(value: str) -> int | None:
    """``0,1,4-5`` -> 4; None when it is not such a list (UUIDs count by their commas)."""
    total = 0
    for part in value.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return None
        total += int(hi or lo) - int(lo) + 1
    return total


def task_bound(layout: StepLayout, visible: int, env: Mapping[str, str]) -> bool:
    """Whether SLURM gave this task only its own GPUs (then it uses all it sees).

    With ``--gpus-per-task`` (which implies ``--gpu-bind=per_task:N``) or ``--gpu-bind``
    each task's ``CUDA_VISIBLE_DEVICES`` holds its own GPUs; without them every task of a
    node sees the node's GPUs of the step, which are split among the tasks. In order:
    ``--gpu-bind=none`` (``SLURM_GPU_BIND``) means not bound; fewer GPUs visible than the
    step has on the node (``SLURM_STEP_GPUS``, ``SLURM_GPUS_ON_NODE``) means bound; a
    per-task count (``SLURM_GPUS_PER_TASK``, ``per_task:N``) means bound unless the task
    sees exactly the GPUs of all the node's tasks together (an unbound view); ``single``,
    ``map_gpu`` and ``mask_gpu`` mean bound; ``closest`` means bound only where the GPUs
    cannot be split evenly (a single-socket node shows every task all of them).
    """
    bind = env.get("SLURM_GPU_BIND", "")
    kinds = {m.group(1): m.group(2) for m in _BIND.finditer(bind)}
    if "none" in kinds:
        return False
    for name in ("SLURM_STEP_GPUS", "SLURM_GPUS_ON_NODE"):
        value = env.get(name, "")
        on_node = _id_count(value) if name == "SLURM_STEP_GPUS" else (int(value) if value.isdigit() else None)
        if on_node is not None and visible < on_node:
            return True
    per_task: int | None = None
    if "SLURM_GPUS_PER_TASK" in env:
        per_task = parse_gpu_spec(env["SLURM_GPUS_PER_TASK"], "SLURM_GPUS_PER_TASK")[1]
    elif (count := kinds.get("per_task")) is not None:
        per_task = int(count)
    if per_task is not None:
        return not (layout.local_count > 1 and visible == per_task * layout.local_count)
    if kinds.keys() & {"single", "map_gpu", "mask_gpu"}:
        return True
    return "closest" in kinds and visible % layout.local_count != 0


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
        in_step = in_srun_step(env) and "SLURM_PROCID" in env
        if not in_step and not self._given():
            return None
        layout = step_layout(env) if in_step else None
        coordinator = self.coordinator_address
        if coordinator is None:
            if layout is None:
                raise AllocationError("coordinator_address is needed outside an srun step")
            coordinator = f"{layout.nodes[0]}:{job_coordinator_port(layout.job_id)}"
        num = self.num_processes if self.num_processes is not None else (layout and layout.num_processes)
        pid = self.process_id if self.process_id is not None else (layout and layout.process_id)
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
        from .jax import initialize

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
