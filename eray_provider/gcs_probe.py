"""``python -m eray_provider.gcs_probe HOST:PORT``: print the addresses of alive Ray nodes.

Run as a subprocess with the cluster's token variables in its environment and a
timeout: Ray's GCS client reads the token once per process and retries a GCS that does
not answer without a deadline of its own. Exit 0 when the GCS answered.
"""

from __future__ import annotations

import sys


def main(address: str) -> int:
    from ray._raylet import GcsClient
    from ray.core.generated.gcs_pb2 import GcsNodeInfo

    client = GcsClient(address=address)
    infos = client.get_all_node_info(timeout=10, state_filter=GcsNodeInfo.GcsNodeState.ALIVE)
    for info in infos.values():
        print(info.node_manager_address)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
