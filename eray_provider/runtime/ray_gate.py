"""``ray``'s CLI, loaded before it is told what to run: a node's ``ray start``, started
while the node still waits for the head.

Loading Ray's CLI takes a node about 2 s at a third of a CPU (``bench/time_to_cluster.py``
shows it), and a worker can only be told its ``ray start`` line once the head's address is
known (the head's ``ip`` marker, written once its ports are held). Loaded here meanwhile,
the worker's Ray connects to the GCS as soon as ``node_run`` has seen its port open.

From Ray 2.55 a worker's ``ray start`` also waits for the head's raylet to register,
asking the GCS every 2 s (``ray_compat.WORKER_WAITS_FOR_HEAD_NODE``): on average a second
lost on every start. Told ``head_wait``, this process asks every ``interval`` seconds
itself (for at most ``timeout``; then Ray's own wait goes on), so that Ray's first ask
finds the head.

Protocol: ``node_run`` starts this module with the node's whole environment except what
depends on the head, then writes one line to its stdin, a JSON object: ``argv``, the
arguments after ``ray``; ``env``, the variables to add; ``head_wait``, null or
``{"address", "interval", "timeout"}``. This process then becomes that ``ray`` command
(same pid: signals and the exit code are Ray's). End of input before the line
(``node_run`` ended first) ends it with code 0, having run nothing.

A head's ``ray start`` run here starts the autoscaler's monitor once the head node has
registered, not among its first processes (``ray_compat.monitor_after_registration``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def wait_for_head_node(address: str, interval: float, timeout: float) -> bool:
    """Whether the GCS at ``address`` listed its head node alive within ``timeout``."""
    from ray._raylet import GcsClient  # type: ignore[attr-defined]
    from ray.core.generated.gcs_pb2 import GcsNodeInfo
    from ray.core.generated.gcs_service_pb2 import GetAllNodeInfoRequest

    head = GetAllNodeInfoRequest.NodeSelector()
    head.is_head_node = True
    alive = GcsNodeInfo.GcsNodeState.ALIVE
    deadline = time.monotonic() + timeout
    client = GcsClient(address=address)
    while True:
        try:
            if client.get_all_node_info(timeout=5, node_selectors=[head], state_filter=alive):
                return True
        except Exception:
            pass  # not up yet: Ray's own wait tells what is wrong, if anything
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def main() -> int:
    from ray.scripts.scripts import main as ray_main  # the slow part, before the line

    from .ray_compat import monitor_after_registration

    monitor_after_registration()  # a head's: once its node has registered

    line = sys.stdin.readline()
    if not line:
        return 0
    go: dict[str, Any] = json.loads(line)
    os.environ.update(go["env"])
    # Ray's processes inherit no pipe of ours
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    wait = go.get("head_wait")
    if wait and not wait_for_head_node(**wait):
        print(
            f"eray-provider: the head node did not register at {wait['address']} within "
            f"{wait['timeout']:.0f} s; Ray's own wait goes on",
            file=sys.stderr,
            flush=True,
        )
    sys.argv = ["ray", *go["argv"]]
    result = ray_main()
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
