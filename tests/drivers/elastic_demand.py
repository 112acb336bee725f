"""Driver for the elastic tests: work that needs two more nodes than the head.

Three bundles of 2 CPUs, strictly spread: the head holds one, so the autoscaler must
submit jobs for two workers. Prints one ``RAN <slurm node> <slurm job>`` line per task.
"""

import sys
import time

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

ray.init()
bundles = int(sys.argv[1]) if len(sys.argv) > 1 else 3
pg = placement_group([{"CPU": 2}] * bundles, strategy="STRICT_SPREAD")
start = time.monotonic()
ray.get(pg.ready(), timeout=600)
print(f"READY after {time.monotonic() - start:.1f} s", flush=True)


@ray.remote(num_cpus=2)
def where() -> str:
    labels = ray.get_runtime_context().get_node_labels()
    return f"{labels['slurm-node']} {labels['slurm-job']}"


refs = [
    where.options(
        scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)
    ).remote()
    for i in range(bundles)
]
for line in ray.get(refs, timeout=300):
    print("RAN", line, flush=True)
ray.util.remove_placement_group(pg)
