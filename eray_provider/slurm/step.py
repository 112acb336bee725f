"""Where a task sits in its SLURM step, and whether SLURM binds it to its own GPUs: pure.

Read from the step's environment alone (a ``Mapping``), which srun gives all tasks alike,
so every rank computes the same answer without ``/proc`` or ``scontrol``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from .allocation import AllocationError, parse_gpu_spec
from .env import STEP_VARIABLES, in_srun_step
from .hostlist import HostlistError, expand, expand_counts


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


#: Where a step's node list is read from, first found first.
NODE_LIST_VARIABLES = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")


def node_list_text(env: Mapping[str, str]) -> str | None:
    """The step's node list as SLURM wrote it (a hostlist expression); None outside SLURM."""
    return next((env[v] for v in NODE_LIST_VARIABLES if v in env), None)


def step_layout(env: Mapping[str, str]) -> StepLayout:
    """The task layout of the srun step this process belongs to (pure: reads ``env`` only).

    Outside an srun step (``slurm.env.in_srun_step``) it raises: the batch script's
    ``SLURM_TASKS_PER_NODE`` describes the job's tasks, not processes that exist, and a
    world built from it would wait forever for ranks nobody started."""
    if not in_srun_step(env):
        raise AllocationError(
            f"none of {', '.join(STEP_VARIABLES)} is set: not inside an srun step (the batch "
            "script and an salloc shell are one task; run the program under srun)"
        )
    _, job = _need(env, "SLURM_JOB_ID", "SLURM_JOBID")
    var, nodelist = _need(env, *NODE_LIST_VARIABLES)
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
