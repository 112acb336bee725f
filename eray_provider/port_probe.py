"""Which of the given TCP ports are taken on this node (stdlib only, fast to start).

``python -m eray_provider.port_probe 20224 20225 ...`` prints ``<hostname> busy <port>...``.
Run once on every node of a job in a single srun step before a port plan is fixed.
"""

from __future__ import annotations

import socket
import sys


def busy_ports(ports: list[int]) -> list[int]:
    busy = []
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
            except OSError:
                busy.append(port)
    return busy


def main(argv: list[str]) -> int:
    ports = [int(p) for p in argv]
    print(socket.gethostname(), "busy", *busy_ports(ports), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
