"""Driver for the elastic replacement test: holds three strictly spread bundles.

Prints ``READY <worker jobs>`` once the placement group is placed, then waits until it
is placed again on a set of SLURM jobs that differs (a worker's job was cancelled and
the autoscaler replaced it) and prints ``REPLACED <worker jobs>``; exits 1 on timeout.
"""

import sys
import time

import ray
from ray.util.placement_group import placement_group, placement_group_table

ray.init()
pg = placement_group([{"CPU": 2}] * 3, strategy="STRICT_SPREAD")
ray.get(pg.ready(), timeout=600)
head_job = ray.get_runtime_context().get_node_labels()["slurm-job"]


def jobs_of(pg) -> list[str] | None:
    table = placement_group_table(pg)
    if table["state"] != "CREATED":
        return None
    labels = {n["NodeID"]: n.get("Labels", {}) for n in ray.nodes() if n["Alive"]}
    nodes = table["bundles_to_node_id"].values()
    if any(n not in labels for n in nodes):
        return None
    return sorted(labels[n]["slurm-job"] for n in nodes if labels[n]["slurm-job"] != head_job)


# placed, but the GCS's node list may not show every bundle's node alive yet: poll it
settle = time.monotonic() + 60
while (first := jobs_of(pg)) is None and time.monotonic() < settle:
    time.sleep(0.5)
if first is None:
    print("NOT PLACED", placement_group_table(pg), flush=True)
    sys.exit(1)
print("READY", *first, flush=True)
deadline = time.monotonic() + float(sys.argv[1] if len(sys.argv) > 1 else 400)
while time.monotonic() < deadline:
    now = jobs_of(pg)
    if now is not None and len(now) == len(first) and now != first:
        print("REPLACED", *now, flush=True)
        sys.exit(0)
    time.sleep(1)
print("NOT REPLACED", jobs_of(pg), flush=True)
sys.exit(1)
