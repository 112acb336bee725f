"""A driver written for eFormer's ``cluster_util`` runs on the test bed with its import
switched to eray-provider (the unit side: ``tests/unit/test_eformer_names.py``)."""

from __future__ import annotations

import sys

import pytest
from testbed_support import REPO


@pytest.mark.slurm
@pytest.mark.ray
def test_a_driver_written_for_eformer_runs_with_the_import_changed(testbed, allocation) -> None:
    env = dict(testbed.env, JAX_PLATFORMS="cpu")
    proc = testbed.run(
        ["srun", f"--jobid={allocation}", "--overlap", "-N3", "-n3", "--ntasks-per-node=1",
         sys.executable, "tests/drivers/eformer_style.py"],
        env=env, timeout=420, check=False, cwd=str(REPO),
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    lines = sorted(line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("EFORMER "))
    port = 20000 + int(allocation) % 224
    # one coordinator for all (the step's first node, DistributedConfig's port), each task's
    # two GPUs as JAX numbers them, SLURM's CPU count, the one Ray cluster of 3 nodes
    assert lines == [[str(i), f"node{i + 1}", f"node1:{port}", "[0,", "1]", "True", "3"] for i in range(3)]
