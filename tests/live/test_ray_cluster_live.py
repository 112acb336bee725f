"""``auto_ray_cluster`` (the seed's API) in every task of ``srun -N3``, on the test bed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from ray_cluster_support import node_tmp_entries, state_left, wait_gone
from testbed_support import REPO, Testbed

pytestmark = [pytest.mark.slurm, pytest.mark.ray]


def test_srun_three_tasks_get_jax_and_a_three_node_ray_cluster(testbed: Testbed, allocation: str) -> None:
    env = dict(testbed.env, JAX_PLATFORMS="cpu")
    # what a killed first task of an ended job left behind is removed by the next one
    leftover = Path.home() / ".eray-provider" / f"step7-40001@{testbed.cluster_name}-999999"
    (leftover / "nodes").mkdir(parents=True, exist_ok=True)
    # ...but not what another SLURM cluster sharing this HOME keeps (its job ids are its own)
    foreign = Path.home() / ".eray-provider" / "step7-40001@othercluster-999999"
    foreign.mkdir(parents=True, exist_ok=True)
    proc = testbed.run(
        ["srun", f"--jobid={allocation}", "--overlap", "-N3", "-n3", "--ntasks-per-node=1",
         sys.executable, "tests/drivers/auto_cluster.py"],
        env=env,
        timeout=420,
        check=False,
        cwd=str(REPO),
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 0, (out + proc.stderr)[-4000:]
    procs = sorted(line.split()[1:] for line in out.splitlines() if line.startswith("PROC "))
    nodes = ["node1", "node2", "node3"]
    assert procs == [[str(i), "3", f"node{i + 1}", *nodes] for i in range(3)], out[-3000:]
    gathers = sorted(line.split()[1:] for line in out.splitlines() if line.startswith("GATHER "))
    assert gathers == [["0", "6"], ["1", "6"], ["2", "6"]]
    tasks = [line.split()[1:] for line in out.splitlines() if line.startswith("TASKS ")]
    assert tasks == [nodes]
    # the cluster is gone with the step: no process, temp dir or state of it is left
    clusters = [p.name for p in (Path.home() / ".eray-provider").glob(f"step*-{allocation}") if state_left(p)]
    assert clusters == []
    assert not leftover.exists()
    assert foreign.exists()
    foreign.rmdir()
    for node in nodes:
        assert node_tmp_entries(testbed, node, allocation) == []
    assert wait_gone(allocation, "step*", timeout=60) == []


@pytest.mark.parametrize("order", ["jax-first", "ray-first"])
def test_the_seed_api_in_either_order_without_gpus_starts_no_private_ray(
    testbed: Testbed, order: str
) -> None:
    """Without GPUs (no ``CUDA_VISIBLE_DEVICES``) the JAX helper must not ask Ray, which would
    start a private one-node Ray in every task (ports outside the plan, ``~/.ray/auth_token``,
    ``/tmp/ray``) and leave the job's cluster idle: either order gives the one cluster."""
    job = testbed.salloc("-N3", "-c2", "--mem=1500", "-J", "eray-seed-nogpu")
    token = Path.home() / ".ray" / "auth_token"
    before = token.stat().st_mtime if token.exists() else None
    try:
        env = dict(testbed.env, JAX_PLATFORMS="cpu", ERAY_TEST_ORDER=order)
        env.pop("CUDA_VISIBLE_DEVICES", None)
        proc = testbed.run(
            ["srun", f"--jobid={job}", "--overlap", "-N3", "-n3", "--ntasks-per-node=1",
             sys.executable, "tests/drivers/auto_cluster.py"],
            env=env, timeout=420, check=False, cwd=str(REPO),
        )  # fmt: skip
        out = proc.stdout
        assert proc.returncode == 0, (out + proc.stderr)[-4000:]
        nodes = ["node1", "node2", "node3"]
        procs = sorted(line.split()[1:] for line in out.splitlines() if line.startswith("PROC "))
        assert procs == [[str(i), "3", f"node{i + 1}", *nodes] for i in range(3)], out[-3000:]
        assert [line.split()[1:] for line in out.splitlines() if line.startswith("TASKS ")] == [nodes]
        after = token.stat().st_mtime if token.exists() else None
        assert after == before, "a private Ray wrote ~/.ray/auth_token"
        for node in nodes:
            assert testbed.on_node(node, "test -e /tmp/ray && echo yes || echo no").stdout.strip() == "no"
    finally:
        testbed.cancel(job)
