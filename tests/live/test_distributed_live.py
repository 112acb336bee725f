"""DistributedConfig on the test bed: jax.distributed over a real srun of three tasks."""

from __future__ import annotations

import sys

import pytest
from testbed_support import Testbed


@pytest.mark.slurm
def test_srun_three_tasks_get_one_jax_world(testbed: Testbed, allocation: str) -> None:
    code = (
        "from eray_provider import DistributedConfig; DistributedConfig(initialization_timeout=60)"
        ".initialize(); import jax, socket; print('WORLD', jax.process_index(), jax.process_count(), "
        "socket.gethostname(), flush=True)"
    )
    env = dict(testbed.env, JAX_PLATFORMS="cpu")
    out = testbed.run(
        ["srun", f"--jobid={allocation}", "--overlap", "-N3", "-n3", sys.executable, "-c", code],
        env=env,
        timeout=180,
    ).stdout
    rows = sorted(line.split()[1:] for line in out.splitlines() if line.startswith("WORLD "))
    assert rows == [["0", "3", "node1"], ["1", "3", "node2"], ["2", "3", "node3"]]
