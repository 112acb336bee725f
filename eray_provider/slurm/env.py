"""Read an ``Allocation`` from the SLURM variables of an allocation, batch script or step.

Pure: takes a mapping, never touches ``os.environ`` itself, so every form listed in
SLURM's documentation can be tested from a dictionary. Every missing or malformed
value raises ``AllocationError`` naming the variable and quoting its value; nothing is
guessed (a run-length list that disagrees with the node list is an error).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping

from .allocation import Allocation, AllocationError, NodeShare, add_shares, memory_mib, parse_gpu_spec
from .hostlist import HostlistError, expand, expand_counts

#: Set by SLURM in allocations, batch scripts and steps.
JOB_ID_VARIABLES = ("SLURM_JOB_ID", "SLURM_JOBID")
#: ``SLURM_NODELIST`` first: a step started from outside with ``-w`` sees only its own
#: nodes in ``SLURM_JOB_NODELIST`` but the job's in ``SLURM_NODELIST``.
NODELIST_VARIABLES = ("SLURM_NODELIST", "SLURM_JOB_NODELIST")
#: Set by srun for the tasks of a step and never in the batch script or an salloc shell
#: (both of which also have ``SLURM_PROCID=0`` and the job's node list).
STEP_VARIABLES = ("SLURM_STEP_NODELIST", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE")
#: Node counts of the job, checked against its node list outside srun steps.
NODE_COUNT_VARIABLES = ("SLURM_JOB_NUM_NODES", "SLURM_NNODES")


def in_srun_step(env: Mapping[str, str]) -> bool:
    """True in a task of an srun step; False in the batch step and in an salloc shell.

    Decided by the variables only srun sets (``STEP_VARIABLES``), not by ``SLURM_PROCID``
    (0 in the batch script too) nor by ``SLURM_STEP_ID``, whose presence in batch steps
    varies with the Slurm version. In a step some job-level names (``SLURM_NNODES``,
    ``SLURM_TASKS_PER_NODE``, ``SLURM_JOB_NODELIST`` for steps started from outside)
    describe the step instead of the job."""
    return any(var in env for var in STEP_VARIABLES)


def in_step_task(env: Mapping[str, str]) -> bool:
    """True in a task of an srun step that knows its rank (``SLURM_PROCID``)."""
    return in_srun_step(env) and "SLURM_PROCID" in env


def node_name(env: Mapping[str, str]) -> str:
    """This node's name as SLURM knows it: ``SLURMD_NODENAME`` in a job's steps, else the
    host name up to its first dot (as slurmd names a node by default)."""
    return env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _count_of(env: Mapping[str, str], var: str) -> int:
    value = env.get(var, "0")
    if not value.isdigit():
        raise AllocationError(f"{var}={value!r} is not a non-negative integer")
    return int(value)


def cpus_on_node(env: Mapping[str, str]) -> int | None:
    """The CPUs SLURM gave the job on this node, for all its tasks there together
    (``SLURM_CPUS_ON_NODE``); None outside SLURM."""
    value = env.get("SLURM_CPUS_ON_NODE")
    return None if value is None else _int("SLURM_CPUS_ON_NODE", value)


def node_index(env: Mapping[str, str]) -> int:
    """This node's index in its job (``SLURM_NODEID``; 0 when unset)."""
    return _count_of(env, "SLURM_NODEID")


def task_index(env: Mapping[str, str]) -> int:
    """This task's rank in its step (``SLURM_PROCID``; 0 when unset, as in a batch script)."""
    return _count_of(env, "SLURM_PROCID")


def restart_count(env: Mapping[str, str]) -> int:
    """How often SLURM requeued this job (``SLURM_RESTART_COUNT``; 0 when unset)."""
    return _count_of(env, "SLURM_RESTART_COUNT")


def step_instance(env: Mapping[str, str]) -> str:
    """One srun invocation, unique within its job: ``<step id>-<srun's port>`` (step ids
    start again after a controller's cold start; the client's port tells two apart)."""
    if "SLURM_STEP_ID" not in env:
        raise AllocationError("SLURM_STEP_ID is not set: not inside an srun step (run under srun)")
    return f"{env['SLURM_STEP_ID']}-{env.get('SLURM_SRUN_COMM_PORT', '0')}"


def job_id_from_env(env: Mapping[str, str]) -> str | None:
    for var in JOB_ID_VARIABLES:
        value = env.get(var)
        if value is not None:
            if not value.strip().isdigit():
                raise AllocationError(f"{var}={value!r} is not a job id")
            return value.strip()
    return None


def _get(env: Mapping[str, str], names: tuple[str, ...], suffix: str) -> tuple[str, str] | None:
    for name in names:
        var = name + suffix
        if var in env:
            return var, env[var]
    return None


def _int(var: str, value: str) -> int:
    text = value.strip()
    if not text.isdigit():
        raise AllocationError(f"{var}={value!r} is not a non-negative integer")
    return int(text)


def _memory_mb(var: str, value: str) -> int:
    """MiB of a ``SLURM_MEM_*`` variable (``500``, ``500M``, ``4G``: ``memory_mib``)."""
    mib = memory_mib(value)
    if mib is None:
        raise AllocationError(f"{var}={value!r} is not an amount of memory in MiB")
    return int(mib)


def _component(env: Mapping[str, str], suffix: str, label: str) -> list[NodeShare]:
    found = _get(env, NODELIST_VARIABLES, suffix)
    if found is None:
        raise AllocationError(f"SLURM_JOB_NODELIST{suffix} is not set{label}: cannot tell the job's nodes")
    var, value = found
    try:
        names = expand(value)
    except HostlistError as e:
        raise AllocationError(f"{var}={value!r}: {e.reason} (position {e.position})") from e
    if not names:
        raise AllocationError(f"{var}={value!r} names no node")
    if not in_srun_step(env):
        # in a step these may count the step's nodes, not the job's: checked only where
        # Slurm sets them all for the job (batch script, salloc shell)
        for count_name in NODE_COUNT_VARIABLES:
            count_var = count_name + suffix
            if count_var in env and _int(count_var, env[count_var]) != len(names):
                raise AllocationError(
                    f"{count_var}={env[count_var]!r} disagrees with {var}={value!r}, "
                    f"which names {len(names)} nodes"
                )

    cpus_var = "SLURM_JOB_CPUS_PER_NODE" + suffix
    if cpus_var not in env:
        raise AllocationError(f"{cpus_var} is not set{label}: cannot tell CPUs per node")
    try:
        cpus = expand_counts(env[cpus_var])
    except HostlistError as e:
        raise AllocationError(f"{cpus_var}={env[cpus_var]!r}: {e.reason}") from e
    if len(cpus) != len(names):
        raise AllocationError(
            f"{cpus_var}={env[cpus_var]!r} gives {len(cpus)} counts but {var}={value!r} "
            f"has {len(names)} nodes"
        )

    gpu_type, gpus = _gpus(env, suffix, var, value, len(names))
    mem = _memory(env, suffix)
    nodes = []
    for name, ncpu, ngpu in zip(names, cpus, gpus):
        memory_mb = None
        if mem is not None:
            kind, amount = mem
            memory_mb = {"node": amount, "cpu": amount * ncpu, "gpu": amount * ngpu}[kind] or None
        nodes.append(NodeShare(name, ncpu, ngpu, gpu_type if ngpu else None, memory_mb))
    return nodes


_ASK_SCONTROL = "read the job with scontrol (run where scontrol reaches the controller)"


def _gpus(
    env: Mapping[str, str], suffix: str, list_var: str, list_value: str, count: int
) -> tuple[str | None, list[int]]:
    """GPU type and count of every node, in node-list order.

    ``SLURM_GPUS_ON_NODE`` describes only the node (and step) where it is read. It stands
    for every node only when nothing else was requested than a per-node count
    (``--gres=gpu:N``), or when the job has one node: a job asked for ``--gpus=N``, per task
    or per socket gets counts that differ between nodes, which are computed here when the
    variables say them (per task, outside a step) and refused otherwise, never guessed.
    """
    per_node = "SLURM_GPUS_PER_NODE" + suffix
    if per_node in env:
        gpu_type, n = parse_gpu_spec(env[per_node], per_node)
        return gpu_type, [n] * count
    on_node = "SLURM_GPUS_ON_NODE" + suffix
    here = _int(on_node, env[on_node]) if on_node in env else None
    per_task = "SLURM_GPUS_PER_TASK" + suffix
    if per_task in env:
        gpu_type, n = parse_gpu_spec(env[per_task], per_task)
        tasks_var = "SLURM_TASKS_PER_NODE" + suffix
        if tasks_var in env and not in_srun_step(env):
            try:
                tasks = expand_counts(env[tasks_var])
            except HostlistError as e:
                raise AllocationError(f"{tasks_var}={env[tasks_var]!r}: {e.reason}") from e
            if len(tasks) != count:
                raise AllocationError(
                    f"{tasks_var}={env[tasks_var]!r} gives {len(tasks)} counts but {list_var}={list_value!r} "
                    f"has {count} nodes"
                )
            return gpu_type, [n * t for t in tasks]
        if count == 1 and here is not None:
            return gpu_type, [here]
        why = "in an srun step" if tasks_var in env else f"{tasks_var} is not set"
        raise AllocationError(
            f"{per_task}={env[per_task]!r}: GPUs per node follow the tasks per node, which this "
            f"environment does not give for the job ({why}); {_ASK_SCONTROL}"
        )
    total = "SLURM_GPUS" + suffix
    if total in env:
        gpu_type, n = parse_gpu_spec(env[total], total)
        if count == 1:
            return gpu_type, [n]
        raise AllocationError(
            f"{total}={env[total]!r} does not say how the GPUs are spread over the {count} nodes "
            f"of {list_var}={list_value!r}; {_ASK_SCONTROL}"
        )
    per_socket = "SLURM_GPUS_PER_SOCKET" + suffix
    if per_socket in env and count > 1:
        raise AllocationError(
            f"{per_socket}={env[per_socket]!r}: GPUs per node follow the sockets each node gives "
            f"the job, which the environment does not say; {_ASK_SCONTROL}"
        )
    if here is not None:
        # --gres=gpu:N gives every node the same N; this is the only per-node count then.
        return None, [here] * count
    if per_socket in env:
        raise AllocationError(f"{per_socket}={env[per_socket]!r} without {on_node}; {_ASK_SCONTROL}")
    return None, [0] * count


def _memory(env: Mapping[str, str], suffix: str) -> tuple[str, int] | None:
    for kind in ("node", "cpu", "gpu"):
        var = f"SLURM_MEM_PER_{kind.upper()}{suffix}"
        if var in env:
            return kind, _memory_mb(var, env[var])
    return None


def allocation_from_env(env: Mapping[str, str]) -> Allocation:
    """The allocation described by SLURM variables; heterogeneous components concatenated."""
    job_id = job_id_from_env(env)
    if job_id is None:
        raise AllocationError(
            "SLURM_JOB_ID is not set: not inside a SLURM allocation (give a job id instead)"
        )
    nodes: list[NodeShare] = []
    if "SLURM_HET_SIZE" in env:
        size = _int("SLURM_HET_SIZE", env["SLURM_HET_SIZE"])
        if size < 1:
            raise AllocationError(f"SLURM_HET_SIZE={env['SLURM_HET_SIZE']!r} must be >= 1")
        for i in range(size):
            nodes.extend(_component(env, f"_HET_GROUP_{i}", f" (component {i} of {size})"))
    else:
        nodes = _component(env, "", "")
    return Allocation(
        job_id=job_id,
        nodes=_merge_repeated(nodes, job_id),
        cluster=env.get("SLURM_CLUSTER_NAME"),
        partition=env.get("SLURM_JOB_PARTITION") or env.get("SLURM_JOB_PARTITION_HET_GROUP_0"),
        source="environment",
        end_time=_end_time(env),
    )


def _end_time(env: Mapping[str, str]) -> float | None:
    """``SLURM_JOB_END_TIME`` (epoch seconds; set by Slurm 23.02 and later), else None."""
    value = env.get("SLURM_JOB_END_TIME", "")
    if not value:
        return None
    if not value.isdigit():
        raise AllocationError(f"SLURM_JOB_END_TIME={value!r}: expected seconds since the epoch")
    return float(value) or None


def _merge_repeated(nodes: list[NodeShare], job_id: str) -> tuple[NodeShare, ...]:
    """Components of a heterogeneous job may share a node: one Ray node gets the sum."""
    merged: dict[str, NodeShare] = {}
    for n in nodes:
        if n.name not in merged:
            merged[n.name] = n
            continue
        merged[n.name] = add_shares(merged[n.name], n)
    return tuple(merged.values())
