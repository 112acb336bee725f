"""Driver written as eFormer's users write it (``eformer.executor.cluster_util``), with only
the import changed: run in every task of ``srun -N3``. Prints what each call answered."""

import os
import socket

from eray_provider import (
    DistributedConfig,
    RayClusterConfig,
    eSlurmCluster,
    logical_cpu_core_count,
)

DistributedConfig().initialize()
RayClusterConfig().initialize()

import jax  # noqa: E402
import ray  # noqa: E402
from jax._src import distributed  # noqa: E402

coordinator = eSlurmCluster.get_coordinator_address()
assert coordinator == distributed.global_state.coordinator_address, coordinator
alive = sum(1 for n in ray.nodes() if n["Alive"])
print(
    "EFORMER",
    jax.process_index(),
    socket.gethostname(),
    coordinator,
    eSlurmCluster.get_local_device_ids_for_process(),
    logical_cpu_core_count() == int(os.environ["SLURM_CPUS_ON_NODE"]),
    alive,
    flush=True,
)
