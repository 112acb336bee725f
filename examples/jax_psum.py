"""A psum and a process_allgather across every node of the cluster, checked and printed.

``ray submit cluster_yamls/slurm-cluster.yaml examples/jax_psum.py``: one JAX process per
node (eray_provider.jax.run), ranks in node order, each contributing rank + 1.
"""

from __future__ import annotations

import ray

from eray_provider.jax import run


def collectives() -> dict:
    import socket

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    rank, world = jax.process_index(), jax.process_count()
    mesh = Mesh(np.array(jax.devices()), ("p",))
    local = np.full((jax.local_device_count(),), rank + 1.0, dtype=np.float32)
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec("p")), local)
    total = float(jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, PartitionSpec()))(x))
    gathered = multihost_utils.process_allgather(np.array([rank], dtype=np.int32)).ravel().tolist()
    return {
        "rank": rank,
        "world": world,
        "host": socket.gethostname(),
        "psum": total,
        "allgather": gathered,
        "devices": jax.device_count(),
    }


def main() -> None:
    ray.init()
    results = run(collectives)
    world = len(results)
    want_sum = sum(r + 1.0 for r in range(world)) * (results[0]["devices"] // world)
    for r in results:
        print(f"RANK {r['rank']}/{r['world']} on {r['host']}: psum={r['psum']} allgather={r['allgather']}")
        assert r["psum"] == want_sum, (r, want_sum)
        assert r["allgather"] == list(range(world)), r
    assert len({r["host"] for r in results}) == world, "expected one rank per node"
    print(f"psum and process_allgather correct across {world} processes on {world} nodes")


if __name__ == "__main__":
    main()
