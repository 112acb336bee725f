"""A job with no runtime_env (submitted with `ray job submit`): the provider's hook must
have prepared its workers, and actors built with actor_options are JAX-initialized."""

from __future__ import annotations

import json
import os

import ray

from eray_provider.jax import actor_options


@ray.remote(num_cpus=0)
def worker_env() -> dict:
    return {k: os.environ.get(k) for k in ("SLURM_JOB_ID", "ERAY_SLURM_JOB_ID", "JAX_PLATFORMS")}


@ray.remote(num_cpus=1)
class Trainer:
    def __init__(self) -> None:
        import jax  # no initialize call here: the hook did it before __init__

        self.rank, self.world = jax.process_index(), jax.process_count()

    def allgather(self) -> dict:
        import numpy as np
        from jax.experimental import multihost_utils

        got = multihost_utils.process_allgather(np.array([self.rank])).ravel().tolist()
        return {"rank": self.rank, "world": self.world, "gathered": got, "host": os.uname().nodename}


def main() -> None:
    ray.init()
    print("ENV", json.dumps(ray.get(worker_env.remote())), flush=True)
    nodes = sorted(
        (int(n["Labels"]["slurm-node-index"]), n["Labels"]["slurm-node"]) for n in ray.nodes() if n["Alive"]
    )
    world = len(nodes)
    actors = [
        Trainer.options(resources={f"slurm_node:{name}": 0.01}, **actor_options(rank, world)).remote()
        for rank, (_, name) in enumerate(nodes)
    ]
    print("HOOKED", json.dumps(ray.get([a.allgather.remote() for a in actors], timeout=120)), flush=True)


if __name__ == "__main__":
    main()
