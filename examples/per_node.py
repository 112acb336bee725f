"""Run one task on every node of the cluster and print that node's SLURM name and resources.

Submit with ``ray submit cluster_yamls/slurm-cluster.yaml examples/per_node.py``. Each task
is pinned to its node with the ``slurm_node:<name>`` resource the provider gives every node.
"""

from __future__ import annotations

import json
import os
import socket

import ray


@ray.remote(num_cpus=0)
def describe() -> dict:
    ctx = ray.get_runtime_context()
    return {
        "hostname": socket.gethostname(),
        "slurm_node": os.environ.get("SLURMD_NODENAME"),
        "slurm_job": os.environ.get("SLURM_JOB_ID"),
        "node_id": ctx.get_node_id(),
    }


def main() -> None:
    ray.init()
    nodes = [n for n in ray.nodes() if n["Alive"]]
    refs = {}
    for node in nodes:
        name = next(k.split(":", 1)[1] for k in node["Resources"] if k.startswith("slurm_node:"))
        refs[name] = describe.options(resources={f"slurm_node:{name}": 0.001}).remote()
    for name, ref in sorted(refs.items()):
        got = ray.get(ref, timeout=120)
        node = next(n for n in nodes if f"slurm_node:{name}" in n["Resources"])
        res = {k: v for k, v in node["Resources"].items() if k in ("CPU", "GPU", "memory")}
        assert got["hostname"] == name, (name, got)
        print(f"NODE {name} {json.dumps(res, sort_keys=True)} labels={node.get('Labels', {})}")
    print(f"ran one task on each of {len(refs)} nodes")


if __name__ == "__main__":
    main()
