"""The names eFormer's ``cluster_util`` exports that eray-provider provides for code that
switches its imports (``eSlurmCluster``, ``logical_cpu_core_count``): their answers agree
with ``DistributedConfig`` on the same step, where eFormer's would not (the table in docs/eformer.md)."""

from __future__ import annotations

import os

import pytest

from eray_provider import DistributedConfig, logical_cpu_core_count

STEP = {
    "SLURM_JOB_ID": "12345",
    "SLURM_STEP_NODELIST": "n1,gpu[07-08]",  # a comma list: eFormer's expander reads it wrong
    "SLURM_STEP_TASKS_PER_NODE": "2(x3)",
    "SLURM_STEP_NUM_TASKS": "6",
    "SLURM_STEP_NUM_NODES": "3",
    "SLURM_NTASKS": "6",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURMD_NODENAME": "gpu07",
    "CUDA_VISIBLE_DEVICES": "2,3",
}


@pytest.fixture
def step(monkeypatch):
    for name in list(os.environ):
        if name.startswith("SLURM") or name == "CUDA_VISIBLE_DEVICES":
            monkeypatch.delenv(name)
    for name, value in STEP.items():
        monkeypatch.setenv(name, value)


def test_eslurmcluster_answers_as_distributed_config_does(step) -> None:
    from jax._src.clusters import SlurmCluster

    from eray_provider import eSlurmCluster

    resolved = DistributedConfig().resolve(os.environ)
    assert resolved is not None
    assert issubclass(eSlurmCluster, SlurmCluster) and eSlurmCluster.is_env_present()
    assert eSlurmCluster.get_coordinator_address() == resolved.coordinator == "n1:20025"
    assert eSlurmCluster.get_coordinator_address(None, "7777") == "n1:7777"
    # positions as JAX numbers them, not the values of CUDA_VISIBLE_DEVICES ([3] in eFormer)
    assert eSlurmCluster.get_local_device_ids_for_process() == resolved.local_device_ids == [1]
    assert eSlurmCluster._infer_local_process_count() == 2
    assert eSlurmCluster._node_list() == "n1,gpu[07-08]"
    assert (eSlurmCluster.get_process_count(), eSlurmCluster.get_process_id()) == (6, 3)


def test_eslurmcluster_with_tasks_bound_to_their_own_gpu(step, monkeypatch) -> None:
    from eray_provider import eSlurmCluster

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # --gpus-per-task=1: eFormer raises here
    monkeypatch.setenv("SLURM_GPUS_PER_TASK", "1")
    assert eSlurmCluster.get_local_device_ids_for_process() == [0]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert eSlurmCluster.get_local_device_ids_for_process() is None


def test_logical_cpu_core_count_is_slurms_count_on_this_node(monkeypatch) -> None:
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "12")
    assert logical_cpu_core_count() == 12
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "twelve")
    with pytest.raises(ValueError, match="SLURM_CPUS_ON_NODE='twelve'"):
        logical_cpu_core_count()
    monkeypatch.delenv("SLURM_CPUS_ON_NODE")
    assert logical_cpu_core_count() == os.cpu_count()
