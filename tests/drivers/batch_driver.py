"""Driver run by `eray-provider run` in a batch job: one task per node, a JAX psum over
every node, then exit with the code given on the command line."""

from __future__ import annotations

import socket
import sys

import ray

from eray_provider.jax import run


@ray.remote(num_cpus=0)
def host() -> str:
    return socket.gethostname()


def psum() -> float:
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    return float(multihost_utils.process_allgather(np.array([jax.process_index() + 1.0])).sum())


def main(code: int) -> int:
    ray.init()
    nodes = sorted(n["Labels"]["slurm-node"] for n in ray.nodes() if n["Alive"])
    hosts = ray.get([host.options(resources={f"slurm_node:{n}": 0.01}).remote() for n in nodes])
    print("TASKS", " ".join(hosts), flush=True)
    print("PSUM", " ".join(str(v) for v in run(psum)), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
