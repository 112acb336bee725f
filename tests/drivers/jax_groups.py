"""Driver for the JAX group tests (run on the cluster with `ray submit`): prints markers."""

from __future__ import annotations

import json
import sys
import time

import ray
from ray.util.state import list_actors

from eray_provider.jax import GroupError, ProcessGroup, run


def total() -> dict:
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    got = multihost_utils.process_allgather(np.array([jax.process_index() + 1])).ravel()
    return {"rank": jax.process_index(), "sum": int(got.sum()), "world": jax.process_count()}


def alive_rank_actors() -> int:
    return len(list_actors(filters=[("class_name", "=", "JaxRank"), ("state", "=", "ALIVE")]))


def main(part: str) -> None:
    ray.init()
    if part == "sequential":
        for i in range(2):
            out = run(total)
            print("SEQ", i, json.dumps(out), flush=True)
    elif part == "concurrent":
        with ProcessGroup() as a, ProcessGroup() as b:
            print("PORTS", a.port, b.port, flush=True)
            ra, rb = a.run(total), b.run(total)
            print("CONC", json.dumps(ra), json.dumps(rb), flush=True)
    elif part == "plain":
        plain(ray, int(sys.argv[2]))
    elif part == "kill":
        group = ProcessGroup(timeout=60)
        group.start()
        victim = group.actors[1]
        t0 = time.monotonic()
        ray.kill(victim, no_restart=True)
        try:
            group.run(total)
            print("NOERROR", flush=True)
        except GroupError as e:
            print(
                "GROUPERROR",
                json.dumps({"rank": e.rank, "node": e.node, "msg": str(e), "seconds": time.monotonic() - t0}),
                flush=True,
            )
        deadline = time.monotonic() + 30
        while alive_rank_actors() and time.monotonic() < deadline:
            time.sleep(0.5)
        print("ALIVE_AFTER", alive_rank_actors(), flush=True)


def plain(ray, rounds: int) -> None:
    """Plain actors calling ``initialize(rank, world)``, rank 0 on a worker node (not the
    head); ``rounds`` groups of the same (default) name, each started right after
    ``ray.kill`` of the one before."""
    from eray_provider import jax as ejax

    @ray.remote(num_cpus=0)
    class Plain:
        def init(self, rank: int, world: int) -> str:
            ejax.initialize(rank, world, timeout=60)
            return ray.util.get_node_ip_address()

        def total(self) -> dict:
            return total()

    orders = (["node3", "node1", "node2"], ["node2", "node3", "node1"])
    for i in range(rounds):
        actors = [Plain.options(resources={f"slurm_node:{n}": 0.01}).remote() for n in orders[i % 2]]
        try:
            ips = ray.get([a.init.remote(rank, 3) for rank, a in enumerate(actors)], timeout=120)
            out = ray.get([a.total.remote() for a in actors], timeout=120)
            print("PLAIN", i, json.dumps({"ips": ips, "out": out}), flush=True)
        except Exception as e:  # the round failed: say so, go on with the next
            print("PLAINFAIL", i, type(e).__name__, str(e)[:300].replace("\n", " "), flush=True)
        for a in actors:
            ray.kill(a, no_restart=True)


if __name__ == "__main__":
    main(sys.argv[1])
