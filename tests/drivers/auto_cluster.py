"""Driver for the seed-API test: run in every task of ``srun -N3``.

JAX first (``DistributedConfig``), then ``auto_ray_cluster`` (the other way round with
``ERAY_TEST_ORDER=ray-first``); every process prints its
view, the first also runs one task pinned to each SLURM node and a JAX allgather.
"""

import os
import socket
import sys
import time

from eray_provider import DistributedConfig, auto_ray_cluster

if os.environ.get("ERAY_TEST_ORDER") == "ray-first":  # the seed API's calls, the other way round
    auto_ray_cluster(timeout=240)
    DistributedConfig(initialization_timeout=120).initialize()
else:
    DistributedConfig(initialization_timeout=120).initialize()
    auto_ray_cluster(timeout=240)
GATE = os.environ.get("ERAY_TEST_GATE")
if GATE:  # the security test's spies start once the cluster is up, then open the gate
    print("READY", flush=True)
    deadline = time.monotonic() + 300
    while not os.path.exists(GATE) and time.monotonic() < deadline:
        time.sleep(0.2)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import ray  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

alive = [n for n in ray.nodes() if n["Alive"]]
names = sorted(n["Labels"]["slurm-node"] for n in alive)
print("PROC", jax.process_index(), jax.process_count(), socket.gethostname(), *names, flush=True)
gathered = multihost_utils.process_allgather(np.array([jax.process_index() + 1]))
print("GATHER", jax.process_index(), int(gathered.sum()), flush=True)
if jax.process_index() == 0:

    @ray.remote(num_cpus=0)
    def host() -> str:
        return socket.gethostname()

    hosts = ray.get([host.options(resources={f"slurm_node:{n}": 0.01}).remote() for n in names], timeout=120)
    print("TASKS", *hosts, flush=True)
if GATE:
    time.sleep(12)  # long enough for every driver's metrics export
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
