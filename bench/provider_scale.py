"""The provider's cost at scale, on a synthetic allocation (no SLURM needed).

1. Per autoscaler round: ``non_terminated_nodes({})`` plus ``node_tags`` for every node,
   for 4,096 nodes, measured over repeated rounds (the step list comes from one ``squeue``
   at most every 5 s, shared by all nodes).
2. srun invocations to launch 1,000 workers in one autoscaler launch batch, counted with a
   fake ``srun`` on PATH, against one srun per worker (what an ssh-style per-node updater
   does), printed as a ratio.

    python bench/provider_scale.py [--nodes 4096] [--workers 1000]
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
import tempfile
import time
from pathlib import Path

from eray_provider.allocation import Allocation, NodeShare
from eray_provider.cluster_config import fill_config
from eray_provider.cluster_state import ClusterState
from eray_provider.ports import choose_plan


def fake_slurm(bindir: Path, log: Path, steps: Path) -> None:
    """``srun`` that records its call and exits; ``squeue`` that prints a step list."""
    bindir.mkdir()
    for name, body in {
        "srun": f'#!/bin/sh\necho "$*" >> {log}\n',
        "squeue": f"#!/bin/sh\ncat {steps}\n",
    }.items():
        path = bindir / name
        path.write_text(body)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)


def build(n: int, tmp: Path) -> tuple[dict, ClusterState]:
    nodes = tuple(NodeShare(f"gpu{i:05d}", 64, 8, "h100", 512_000) for i in range(n))
    alloc = Allocation("4242", nodes, partition="gpu")
    base = {
        "cluster_name": "scale",
        "max_workers": -1,
        "provider": {
            "type": "external",
            "module": "eray_provider.SlurmNodeProvider",
            "state_dir": str(tmp / "state"),
        },
    }
    config = fill_config(base, alloc, python=sys.executable)
    state = ClusterState("scale", "4242", tmp / "state")
    state.create()
    state.save_ports(choose_plan("4242", []))
    state.save_cluster_config({"provider": config["provider"]})
    return config, state


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=4096)
    ap.add_argument("--workers", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        log, steps = tmp / "srun.log", tmp / "steps"
        fake_slurm(tmp / "bin", log, steps)
        os.environ["PATH"] = f"{tmp / 'bin'}:{os.environ['PATH']}"
        from ray.autoscaler.tags import TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE

        from eray_provider.provider import SlurmNodeProvider

        # --- 1. per-round cost with N live nodes
        config, state = build(args.nodes, tmp)
        doc = state.read()
        batch = 512
        lines = []
        for i in range(args.nodes):
            step = f"eray.scale.workers.{i // batch}"
            doc["nodes"][f"gpu{i:05d}.{i + 1}"] = {
                "slurm_node": f"gpu{i:05d}",
                "role": "head" if i == 0 else "worker",
                "gen": i + 1,
                "tags": {TAG_RAY_NODE_KIND: "head" if i == 0 else "worker"},
                "launched": time.time(),
                "step_name": step,
            }
        lines = [f"4242.{k} eray.scale.workers.{k}" for k in range(args.nodes // batch + 1)]
        steps.write_text("\n".join(lines) + "\n")
        state.write(doc)
        provider = SlurmNodeProvider(config["provider"], "scale")
        t = time.perf_counter()
        ids = provider.non_terminated_nodes({})
        first = time.perf_counter() - t
        assert len(ids) == args.nodes, len(ids)
        t = time.perf_counter()
        for _ in range(args.rounds):
            for node_id in provider.non_terminated_nodes({}):
                provider.node_tags(node_id)
        per_round = (time.perf_counter() - t) / args.rounds
        print(
            f"per autoscaler round, {args.nodes} nodes: {per_round * 1e3:.2f} ms "
            f"(non_terminated_nodes + node_tags for every node; first call with squeue "
            f"{first * 1e3:.1f} ms)"
        )

        # --- 2. srun calls to launch W workers in one batch
        tmp2 = tmp / "launch"
        tmp2.mkdir()
        config, state = build(args.workers + 1, tmp2)
        provider = SlurmNodeProvider(config["provider"], "scale")
        steps.write_text("")
        log.write_text("")
        worker_type = next(k for k in config["available_node_types"] if k.startswith("ray.worker"))
        node_config = config["available_node_types"][worker_type]["node_config"]
        t = time.perf_counter()
        provider.create_node(
            node_config, {TAG_RAY_NODE_KIND: "worker", TAG_RAY_USER_NODE_TYPE: worker_type}, args.workers
        )
        launch_s = time.perf_counter() - t
        deadline = time.monotonic() + 30
        while not log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        calls = len(log.read_text().splitlines())
        print(
            f"launching {args.workers} workers: {calls} srun call(s) in {launch_s * 1e3:.0f} ms; "
            f"one srun per worker would be {args.workers}: ratio {calls / args.workers:.4f}"
        )
        assert len(provider.non_terminated_nodes({TAG_RAY_NODE_KIND: "worker"})) == args.workers


if __name__ == "__main__":
    main()
