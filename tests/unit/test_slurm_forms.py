"""Issue #13 items 5, 6 and 8: every rank agrees, GPUs as SLURM binds them, SLURM's forms.

Each test builds the exact environment (or scontrol text) SLURM gives the case."""

from __future__ import annotations

import pytest

from eray_provider.jax.distributed import DistributedConfig, local_device_ids
from eray_provider.plan.ports import job_coordinator_port
from eray_provider.runtime import port_probe
from eray_provider.slurm import client as slurm_cli
from eray_provider.slurm.allocation import AllocationError
from eray_provider.slurm.env import allocation_from_env, in_srun_step
from eray_provider.slurm.scontrol import parse_job
from eray_provider.slurm.step import step_layout


def rank_env(procid: int, node: str, localid: int, **extra: str) -> dict[str, str]:
    """A task of ``srun -N2 -n4`` (2 tasks per node) of job 31337."""
    env = {
        "SLURM_JOB_ID": "31337",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NODELIST": "gpu[07-08]",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(localid),
        "SLURMD_NODENAME": node,
    }
    env.update(extra)
    return env


RANKS = [(0, "gpu07", 0), (1, "gpu07", 1), (2, "gpu08", 0), (3, "gpu08", 1)]


# ---------------------------------------------------------------- item 5: every rank agrees


def test_ranks_on_nodes_with_different_port_ranges_and_a_dead_scontrol_agree(monkeypatch) -> None:
    calls: list[list[str]] = []

    def no_controller(args, timeout=0.0, **kwargs):
        calls.append(list(args))
        raise slurm_cli.SlurmCommandError(f"{' '.join(args)} did not answer within 15 s")

    monkeypatch.setattr(slurm_cli, "run_slurm", no_controller)
    node_ranges = {"gpu07": (1024, 65535), "gpu08": (32768, 60999)}
    coordinators = set()
    for procid, node, localid in RANKS:
        # each rank's node has its own ephemeral range; none of it may matter
        monkeypatch.setattr(port_probe, "ephemeral_range", lambda node=node: node_ranges[node])
        resolved = DistributedConfig().resolve(rank_env(procid, node, localid))
        assert resolved is not None and resolved.process_id == procid and resolved.num_processes == 4
        coordinators.add(resolved.coordinator)
    assert coordinators == {f"gpu07:{job_coordinator_port('31337')}"}
    assert calls == []  # no scontrol show config per rank


def test_every_rank_names_the_step_cluster_alike_without_scontrol(monkeypatch) -> None:
    from eray_provider.runtime.ray_cluster import step_cluster_name

    monkeypatch.setattr(slurm_cli, "run_slurm", lambda *a, **k: pytest.fail("scontrol called by a rank"))
    names = {
        step_cluster_name(env, slurm_cli.cluster_name(env, use_scontrol=False))
        for env in (rank_env(p, n, loc, SLURM_SRUN_COMM_PORT="40123") for p, n, loc in RANKS)
    }
    assert names == {"step0-40123@slurm"}
    env = rank_env(0, "gpu07", 0, SLURM_CLUSTER_NAME="big.one", SLURM_SRUN_COMM_PORT="1")
    assert step_cluster_name(env, slurm_cli.cluster_name(env, use_scontrol=False)) == "step0-1@big_one"


def test_the_batch_step_is_one_task_not_an_n_rank_step() -> None:
    # what an sbatch -N2 --ntasks-per-node=2 script sees: PROCID 0 and the whole job's layout
    batch = {
        "SLURM_JOB_ID": "31337",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_NODELIST": "gpu[07-08]",
        "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURM_NTASKS": "4",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURMD_NODENAME": "gpu07",
        "SLURM_JOB_CPUS_PER_NODE": "8(x2)",
    }
    assert not in_srun_step(batch) and in_srun_step(rank_env(0, "gpu07", 0))
    assert DistributedConfig().resolve(batch) is None
    assert DistributedConfig().initialize(env=batch) is False
    with pytest.raises(AllocationError, match=r"SLURM_STEP_NODELIST.*not inside an srun step"):
        step_layout(batch)
    # a batch step whose Slurm also sets SLURM_STEP_ID is still one task
    assert DistributedConfig().resolve(dict(batch, SLURM_STEP_ID="4294967291")) is None


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"SLURM_STEP_NUM_TASKS": "8"}, "SLURM_STEP_NUM_TASKS='8' disagrees with SLURM_STEP_TASKS_PER_NODE"),
        ({"SLURM_STEP_NUM_NODES": "3"}, "SLURM_STEP_NUM_NODES='3' disagrees with SLURM_STEP_NODELIST"),
        ({"SLURM_PROCID": "4"}, "SLURM_PROCID='4' is not below the step's 4 tasks"),
        ({"SLURM_LOCALID": "2"}, "SLURM_LOCALID='2' is not below the 2 tasks of gpu07"),
    ],
)
def test_a_step_layout_that_contradicts_itself_is_an_error(change, fragment) -> None:
    with pytest.raises(AllocationError) as info:
        step_layout({**rank_env(0, "gpu07", 0), **change})
    assert fragment in str(info.value)


# ---------------------------------------------------------------- item 6: GPUs as SLURM binds them


@pytest.mark.parametrize("gpus_on_node", ["4", "1", None])
def test_gpus_per_task_one_with_four_tasks_each_uses_its_own_gpu(gpus_on_node) -> None:
    # srun -N1 -n4 --gpus-per-task=1: every task sees one GPU (its own index)
    for localid in range(4):
        extra = {"SLURM_GPUS_PER_TASK": "1", "CUDA_VISIBLE_DEVICES": str(localid)}
        if gpus_on_node is not None:
            extra["SLURM_GPUS_ON_NODE"] = gpus_on_node
        env = rank_env(localid, "gpu07", localid, **extra)
        env.update(SLURM_STEP_NODELIST="gpu07", SLURM_STEP_NUM_NODES="1", SLURM_STEP_TASKS_PER_NODE="4")
        resolved = DistributedConfig().resolve(env)
        assert resolved is not None and resolved.local_device_ids == [0]


def test_two_tasks_bound_to_two_gpus_each_use_both() -> None:
    for procid, node, localid in RANKS:
        visible = "0,1" if localid == 0 else "2,3"
        env = rank_env(procid, node, localid, SLURM_GPUS_PER_TASK="a100:2", CUDA_VISIBLE_DEVICES=visible)
        assert local_device_ids(step_layout(env), visible, env) == [0, 1]


@pytest.mark.parametrize(
    ("extra", "visible", "want"),
    [
        # unbound view: every task sees the node's GPUs and takes its share
        ({}, "0,1,2,3", [[0, 1], [2, 3]]),
        ({"SLURM_GPUS_PER_TASK": "2"}, "0,1,2,3", [[0, 1], [2, 3]]),
        ({"SLURM_GPUS_PER_TASK": "2", "SLURM_GPU_BIND": "none"}, "0,1,2,3", [[0, 1], [2, 3]]),
        ({"SLURM_GPU_BIND": "verbose,closest"}, "0,1,2,3", [[0, 1], [2, 3]]),
        # bound: each task sees its own and uses all of them
        ({"SLURM_GPU_BIND": "single:1"}, "3", [[0], [0]]),
        ({"SLURM_GPU_BIND": "map_gpu:0,1"}, "5", [[0], [0]]),
        ({"SLURM_GPU_BIND": "per_task:2"}, "4,5", [[0, 1], [0, 1]]),
        ({"SLURM_STEP_GPUS": "0-3"}, "2,3", [[0, 1], [0, 1]]),
        ({"SLURM_GPUS_ON_NODE": "4"}, "2,3", [[0, 1], [0, 1]]),
        ({"SLURM_GPU_BIND": "closest"}, "1", [[0], [0]]),
    ],
)
def test_gpu_binding_forms(extra, visible, want) -> None:
    got = []
    for procid, localid in ((0, 0), (1, 1)):
        env = rank_env(procid, "gpu07", localid, **extra)
        got.append(local_device_ids(step_layout(env), visible, env))
    assert got == want


def test_gpus_that_cannot_be_split_without_binding_say_what_to_set() -> None:
    env = rank_env(1, "gpu07", 1)
    with pytest.raises(AllocationError, match=r"CUDA_VISIBLE_DEVICES='1'.*SLURM_GPUS_PER_TASK"):
        local_device_ids(step_layout(env), "1", env)


def alloc_env(**kw: str | None) -> dict[str, str]:
    """An sbatch -N2 script's variables (not a step)."""
    base = {
        "SLURM_JOB_ID": "900",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_NODELIST": "n[1-2]",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NNODES": "2",
        "SLURM_JOB_CPUS_PER_NODE": "8(x2)",
        "SLURM_TASKS_PER_NODE": "3,1",
        "SLURM_GPUS_ON_NODE": "3",
    }
    base.update(kw)
    return {k: v for k, v in base.items() if v is not None}


def test_gpus_per_task_in_the_environment_follow_each_nodes_tasks() -> None:
    a = allocation_from_env(alloc_env(SLURM_GPUS_PER_TASK="a100:1", SLURM_MEM_PER_GPU="1000"))
    # SLURM_GPUS_ON_NODE=3 is this (first) node's count: the second node has one task, one GPU
    assert [(n.name, n.gpus, n.gpu_type, n.memory_mb) for n in a.nodes] == [
        ("n1", 3, "a100", 3000),
        ("n2", 1, "a100", 1000),
    ]


@pytest.mark.parametrize(
    ("kw", "fragment"),
    [
        ({"SLURM_GPUS": "4"}, "SLURM_GPUS='4' does not say how the GPUs are spread over the 2 nodes"),
        ({"SLURM_GPUS_PER_TASK": "1", "SLURM_TASKS_PER_NODE": None}, "SLURM_GPUS_PER_TASK='1'"),
        (
            {"SLURM_GPUS_PER_TASK": "1", "SLURM_STEP_NODELIST": "n1", "SLURM_STEP_NUM_TASKS": "1"},
            "in an srun step",
        ),
        ({"SLURM_GPUS_PER_TASK": "1", "SLURM_TASKS_PER_NODE": "2(x3)"}, "SLURM_TASKS_PER_NODE='2(x3)'"),
        ({"SLURM_GPUS_PER_SOCKET": "2"}, "SLURM_GPUS_PER_SOCKET='2'"),
    ],
)
def test_gpu_requests_the_environment_cannot_spread_are_refused(kw, fragment) -> None:
    with pytest.raises(AllocationError) as info:
        allocation_from_env(alloc_env(**kw))
    assert fragment in str(info.value)


def test_gres_per_node_still_gives_every_node_the_count() -> None:
    a = allocation_from_env(alloc_env())
    assert [n.gpus for n in a.nodes] == [3, 3]


# ---------------------------------------------------------------- item 8: SLURM's forms

ARRAY = """JobId=101 ArrayJobId=100 ArrayTaskId=2 JobName=arr
   JobState=RUNNING Reason=None Dependency=(null)
   Partition=debug AllocNode:Sid=login:1
   NodeList=node2
   NumNodes=1 NumCPUs=2 NumTasks=1 CPUs/Task=2 ReqB:S:C:T=0:0:*:*
     Nodes=node2 CPU_IDs=0-1 Mem=500 GRES=gpu:1(IDX:1)

JobId=100 ArrayJobId=100 ArrayTaskId=1 JobName=arr
   JobState=RUNNING Reason=None Dependency=(null)
   Partition=debug AllocNode:Sid=login:1
   NodeList=node1
   NumNodes=1 NumCPUs=2 NumTasks=1 CPUs/Task=2 ReqB:S:C:T=0:0:*:*
     Nodes=node1 CPU_IDs=2-3 Mem=500 GRES=gpu:1(IDX:0)
"""


def test_an_array_jobs_records_give_only_this_jobs_nodes() -> None:
    # scontrol show job -d 100 lists both tasks; job 100 is the task with JobId=100
    a = parse_job(ARRAY)
    assert a.job_id == "100" and [(n.name, n.cpus, n.gpu_ids) for n in a.nodes] == [("node1", 2, (0,))]
    b = parse_job(ARRAY, "101")
    assert b.job_id == "101" and b.node_names == ["node2"]
    assert parse_job(ARRAY, "100_2").node_names == ["node2"]
    with pytest.raises(AllocationError, match=r"no record of job 102 \(JobId=101, 100\)"):
        parse_job(ARRAY, "102")


def test_cpus_follow_slurms_count_where_cpu_ids_count_threads() -> None:
    record = """JobId=55 JobName=ht
   JobState=RUNNING Reason=None
   NodeList=n[1-2]
   NumNodes=2 NumCPUs=8 NumTasks=2 CPUs/Task=4
     Nodes=n1 CPU_IDs=0-7 Mem=1000 GRES=
     Nodes=n2 CPU_IDs=0-3,8-11 Mem=1000 GRES=
"""
    assert [n.cpus for n in parse_job(record).nodes] == [4, 4]
    uneven = record.replace("CPU_IDs=0-3,8-11", "CPU_IDs=0-2")
    with pytest.raises(AllocationError, match=r"NumCPUs='8' disagrees with the CPU_IDs .*n1: 8, n2: 3"):
        parse_job(uneven)
    one = (
        "JobId=56\n   JobState=RUNNING\n   NodeList=n1\n   NumCPUs=6\n     Nodes=n1 CPU_IDs=0-3 Mem=0 GRES=\n"
    )
    assert parse_job(one).head.cpus == 6


@pytest.mark.parametrize("var", ["SLURM_JOB_NUM_NODES", "SLURM_NNODES"])
def test_a_node_count_that_disagrees_with_the_node_list_is_named(var) -> None:
    with pytest.raises(AllocationError) as info:
        allocation_from_env(alloc_env(**{var: "3"}))
    assert f"{var}='3' disagrees with SLURM_NODELIST='n[1-2]'" in str(info.value)
    # inside a step such counts may be the step's: not an error there
    step = alloc_env(**{var: "1"}, SLURM_STEP_NODELIST="n1", SLURM_STEP_NUM_TASKS="1")
    assert allocation_from_env(step).node_names == ["n1", "n2"]


def test_srun_of_eray_provider_run_starts_one_cluster_from_the_first_task(monkeypatch) -> None:
    from eray_provider.runtime import batch

    started: list[str] = []

    def running_allocation(*a, **k):
        started.append("load")
        raise AllocationError("stop here")

    monkeypatch.setattr(batch, "running_allocation", running_allocation)
    # srun --ntasks-per-node=2 eray-provider run: tasks 0 and 1 both on the first node
    for procid in ("1", "0"):
        for key, value in rank_env(int(procid), "gpu07", int(procid)).items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("SLURM_NODEID", "0")
        if procid == "1":
            assert batch.run(["true"]) == 0 and started == []
        else:
            with pytest.raises(AllocationError, match="stop here"):
                batch.run(["true"])
            assert started == ["load"]


def test_what_a_node_and_a_task_read_of_themselves(monkeypatch) -> None:
    from eray_provider.slurm import env as slurm_env

    step = rank_env(3, "gpu07", 1, SLURM_STEP_ID="5", SLURM_SRUN_COMM_PORT="40123", SLURM_NODEID="2")
    assert slurm_env.in_step_task(step) and not slurm_env.in_step_task({"SLURM_PROCID": "0"})
    assert slurm_env.node_name(step) == "gpu07" and slurm_env.task_index(step) == 3
    assert slurm_env.node_index(step) == 2 and slurm_env.step_instance(step) == "5-40123"
    assert slurm_env.restart_count({}) == 0 and slurm_env.restart_count({"SLURM_RESTART_COUNT": "2"}) == 2
    monkeypatch.setattr(slurm_env.socket, "gethostname", lambda: "node9.cluster.example")
    assert slurm_env.node_name({}) == "node9"
    with pytest.raises(AllocationError, match=r"SLURM_NODEID='x' is not a non-negative integer"):
        slurm_env.node_index({"SLURM_NODEID": "x"})
    with pytest.raises(AllocationError, match=r"SLURM_STEP_ID is not set"):
        slurm_env.step_instance({})


def test_eray_provider_run_of_a_command_not_found_starts_nothing(monkeypatch) -> None:
    from eray_provider.errors import ConfigError
    from eray_provider.runtime import batch

    def running_allocation(*a, **k):
        raise AssertionError("a cluster was started for a command that cannot run")

    monkeypatch.setattr(batch, "running_allocation", running_allocation)
    with pytest.raises(ConfigError, match="the command 'no-such-command-eray' is not found"):
        batch.run(["no-such-command-eray", "--flag"])
    with pytest.raises(ConfigError, match="needs a command"):
        batch.run([])
    # under srun, a task other than the first returns at once: the command (a path that
    # may exist on the first node only) is the first task's to check
    for key, value in rank_env(1, "gpu07", 1).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SLURM_NODEID", "0")
    assert batch.run(["no-such-command-eray"]) == 0
