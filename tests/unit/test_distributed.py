"""DistributedConfig: the task layout from SLURM variables, and jax.distributed over srun."""

from __future__ import annotations

import pytest

from eray_provider import DistributedConfig
from eray_provider.jax.distributed import local_device_ids
from eray_provider.slurm.allocation import AllocationError
from eray_provider.slurm.step import step_layout

STEP = {
    "SLURM_JOB_ID": "42",
    "SLURM_STEP_NODELIST": "gpu[01-02],cpu7",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2),1",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURMD_NODENAME": "gpu02",
}


def test_layout_and_device_split() -> None:
    layout = step_layout(STEP)
    assert layout.nodes == ("gpu01", "gpu02", "cpu7") and layout.num_processes == 5
    assert (layout.process_id, layout.local_id, layout.node_index, layout.local_count) == (3, 1, 1, 2)
    assert local_device_ids(layout, "4,5,6,7") == [2, 3]
    assert local_device_ids(layout, "") is None
    with pytest.raises(AllocationError, match="cannot be split evenly"):
        local_device_ids(layout, "0,1,2")


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x2)"}, "SLURM_STEP_TASKS_PER_NODE='2(x2)' has 2 entries"),
        ({"SLURM_STEP_NODELIST": "gpu[2-1]"}, "SLURM_STEP_NODELIST='gpu[2-1]'"),
        ({"SLURMD_NODENAME": "elsewhere"}, "SLURMD_NODENAME='elsewhere'"),
        ({"SLURM_PROCID": "x"}, "SLURM_PROCID='x'"),
    ],
)
def test_malformed_layout_names_the_variable(change, fragment) -> None:
    with pytest.raises(AllocationError) as info:
        step_layout({**STEP, **change})
    assert fragment in str(info.value)


def test_outside_a_cluster_does_nothing() -> None:
    assert DistributedConfig().initialize(env={}) is False
    with pytest.raises(AllocationError, match="coordinator_address is needed"):
        DistributedConfig(num_processes=2, process_id=0).initialize(env={})


def test_step_cluster_names_are_unique_per_srun_and_batch_steps_are_not_steps() -> None:
    from eray_provider.runtime.ray_cluster import step_cluster_name
    from eray_provider.slurm.client import cluster_name
    from eray_provider.slurm.env import in_srun_step

    a = {
        "SLURM_PROCID": "0",
        "SLURM_STEP_ID": "3",
        "SLURM_SRUN_COMM_PORT": "40001",
        "SLURM_STEP_NODELIST": "node1",
        "SLURM_STEP_NUM_TASKS": "1",
    }
    assert in_srun_step(a) and step_cluster_name(a, "c1") == "step3-40001@c1"
    assert step_cluster_name(dict(a, SLURM_SRUN_COMM_PORT="40002"), "c1") != step_cluster_name(a, "c1")
    assert cluster_name({"SLURM_CLUSTER_NAME": "c2"}) == "c2"
    # the batch step: SLURM_PROCID and SLURM_STEP_ID (in some versions) but no step variables
    assert not in_srun_step({"SLURM_PROCID": "0", "SLURM_STEP_ID": "batch"})
    assert not in_srun_step({"SLURM_STEP_ID": "3"})
