"""Run by ``ray submit`` on the walltime test's cluster: a JAX group over every node whose
ranks wait (bounded) for ``drain_notice()``, while the driver's ``on_drain`` records each
drained node. Prints READY once the group runs, then DRAINING / ONDRAIN / RANK lines."""

from __future__ import annotations

import json
import sys
import time

import ray

from eray_provider.jax import DrainNotice, ProcessGroup, drain_notice
from eray_provider.runtime.ray_compat import draining_nodes

WAIT = float(sys.argv[1]) if len(sys.argv) > 1 else 150.0


def wait_for_drain(wait: float) -> dict:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        notice = drain_notice()
        if notice is not None:
            return {"deadline": notice.deadline, "ranks": list(notice.ranks), "node_id": notice.node_id}
        time.sleep(1)
    return {}


def main() -> None:
    ray.init()
    told: list[DrainNotice] = []
    with ProcessGroup(3, timeout=120, env_vars={"JAX_PLATFORMS": "cpu"}, on_drain=told.append) as group:
        print("READY", flush=True)
        ranks = group.run(wait_for_drain, WAIT, timeout=WAIT + 30)
        # the last drained node may be told one poll after the ranks saw the first drain
        end = time.monotonic() + 15
        while len(told) < 2 and time.monotonic() < end:
            group.check_drains()
            time.sleep(0.5)
        # while the ranks still hold their nodes: a drained node stops once idle
        print("DRAINING " + json.dumps(draining_nodes()), flush=True)
    for notice in told:
        seen = {"node": notice.node, "ranks": notice.ranks, "deadline": notice.deadline}
        print("ONDRAIN " + json.dumps(seen))
    for rank, seen in enumerate(ranks):
        print(f"RANK {rank} " + json.dumps(seen))


if __name__ == "__main__":
    main()
