"""Start-to-ready time of a 3-process JAX group, side by side (run as a driver on a cluster):

(a) ``eray_provider.jax.ProcessGroup``: placement group, actors, rank order by node,
    a reserved coordinator port, ``jax.distributed.initialize`` in every rank;
(b) the same 3 processes started by hand: 3 plain actors in the same placement group,
    each calling ``jax.distributed.initialize`` directly (coordinator at rank 0's node,
    cluster detection off, a port picked by the driver).

    ray submit cluster_yamls/slurm-cluster.yaml bench/jax_group_bench.py [--rounds 3]

Both alternate in the same run; medians are printed with their ratio (a)/(b).
"""

from __future__ import annotations

import argparse
import statistics
import time

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from eray_provider.jax import ProcessGroup, jax_ports


@ray.remote(num_cpus=1)
class Bare:
    def ip(self) -> str:
        return ray.util.get_node_ip_address()

    def init(self, rank: int, world: int, coordinator: str) -> int:
        import jax

        jax.distributed.initialize(
            coordinator, world, rank, cluster_detection_method="deactivate", initialization_timeout=60
        )
        return jax.process_index()

    def stop(self) -> None:
        import jax

        jax.distributed.shutdown()


def with_group(n: int) -> float:
    t = time.perf_counter()
    group = ProcessGroup(num_processes=n)
    group.start()
    elapsed = time.perf_counter() - t
    group.shutdown()
    return elapsed


def bare(n: int, port: int) -> float:
    t = time.perf_counter()
    pg = placement_group([{"CPU": 1}] * n, strategy="STRICT_SPREAD")
    ray.get(pg.ready(), timeout=60)
    actors = [
        Bare.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i)).remote() for i in range(n)
    ]
    coordinator = f"{ray.get(actors[0].ip.remote())}:{port}"
    ray.get([a.init.remote(r, n, coordinator) for r, a in enumerate(actors)], timeout=120)
    elapsed = time.perf_counter() - t
    ray.get([a.stop.remote() for a in actors], timeout=30)
    for a in actors:
        ray.kill(a)
    remove_placement_group(pg)
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--processes", type=int, default=3)
    args = ap.parse_args()
    ray.init()
    port = jax_ports()[-1]  # the last port of the job's range, away from the groups' first ones
    a_times, b_times = [], []
    for _ in range(args.rounds):
        a_times.append(with_group(args.processes))
        b_times.append(bare(args.processes, port))
    a, b = statistics.median(a_times), statistics.median(b_times)
    print(f"(a) ProcessGroup start to ready:        {a:6.2f} s (median of {args.rounds})")
    print(f"(b) bare jax.distributed.initialize:    {b:6.2f} s (median of {args.rounds})")
    print(f"ratio (a)/(b): {a / b:.2f}")


if __name__ == "__main__":
    main()
