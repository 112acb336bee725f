"""Ask a cluster's GCS which Ray nodes are alive, from a process of its own.

``python -m eray_provider.runtime.gcs_probe HOST:PORT`` prints the alive nodes, one a line: their
instance id (the provider's node id) and address.

``python -m eray_provider.runtime.gcs_probe HOST:PORT --wait --timeout S`` waits until every
node id given on standard input, one a line, is alive (printing ``joined ID`` as each
one joins) (``RAY_CLOUD_INSTANCE_ID``, which
``node_run`` sets on every node; not arguments, which 10,000 ids would overflow). It
waits for the GCS port, then asks every ``POLL_SECONDS`` over one client; exit 0 when
all are alive, 1 (naming the missing ones) after ``S`` seconds or once the process
that started it has ended. A start waits through
one such process instead of starting Python and Ray's client once per poll: on a
machine busy starting Ray, each of those took it a CPU-second.

Run as a subprocess with the cluster's token variables in its environment and a
timeout: Ray's GCS client reads the token once per process and retries a GCS that does
not answer without a deadline of its own.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from ..plan.modules import GCS_PROBE
from .port_probe import port_open

POLL_SECONDS = 0.2


def _alive(client) -> dict[str, str]:
    """instance id -> address of the alive nodes."""
    from ray.core.generated.gcs_pb2 import GcsNodeInfo

    infos = client.get_all_node_info(timeout=5, state_filter=GcsNodeInfo.GcsNodeState.ALIVE)
    return {info.instance_id: info.node_manager_address for info in infos.values()}


def wait(address: str, ids: list[str], timeout: float, parent: int | None = None) -> int:
    deadline = time.monotonic() + timeout

    def orphaned() -> bool:
        """The start that waits through this process (``parent``) ended (a `ray up` killed
        by a signal has no `finally`): nobody reads the answer any more."""
        return parent is not None and os.getppid() != parent

    host, _, port = address.rpartition(":")
    while not port_open(host, int(port), timeout=1):
        if time.monotonic() > deadline or orphaned():
            print(f"the GCS at {address} did not open within {timeout:.0f} s", flush=True)
            return 1
        time.sleep(0.1)
    from ray._raylet import GcsClient  # type: ignore[attr-defined]

    client = GcsClient(address=address)
    alive: dict[str, str] = {}
    told: set[str] = set()
    while True:
        try:
            alive = _alive(client)
        except Exception:
            alive = {}
        for i in ids:
            if i in alive and i not in told:
                told.add(i)
                print(f"joined {i}", flush=True)
        missing = [i for i in ids if i not in alive]
        if not missing:
            print(" ".join(alive[i] for i in ids), flush=True)
            return 0
        if time.monotonic() > deadline or orphaned():
            print(f"not alive after {timeout:.0f} s: {' '.join(missing)}", flush=True)
            return 1
        time.sleep(POLL_SECONDS)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {GCS_PROBE}")
    ap.add_argument("address")
    ap.add_argument("--wait", action="store_true", help="wait for the node ids on stdin")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--parent", type=int, help="end when this process (the caller) has ended")
    args = ap.parse_args(argv)
    if args.wait:
        return wait(args.address, sys.stdin.read().split(), args.timeout, args.parent)
    from ray._raylet import GcsClient  # type: ignore[attr-defined]

    for instance_id, ip in _alive(GcsClient(address=args.address)).items():
        print(instance_id or "-", ip)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
