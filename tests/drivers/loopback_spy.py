"""A co-tenant's spy: listen on loopback wherever it can among a cluster's ports, and keep
what arrives.

``python loopback_spy.py LO HI SECONDS`` binds and listens on 127.0.0.1 and [::1] on every
port LO..HI (any socket option that might let it in: plain, SO_REUSEADDR, SO_REUSEPORT),
prints ``bound N`` at once, then accepts until its stdin closes (the test's clients have
run) or SECONDS have passed, and prints one JSON object:
``{"bound": [...], "received": {port: first bytes}}``. Run by the security
test as another Unix user on every node of a running cluster.
"""

from __future__ import annotations

import json
import select
import socket
import sys
import time


def try_listen(family: int, address: str, port: int) -> socket.socket | None:
    for opts in ((), (socket.SO_REUSEADDR,), (socket.SO_REUSEPORT,)):
        s = socket.socket(family)
        for o in opts:
            s.setsockopt(socket.SOL_SOCKET, o, 1)
        try:
            s.bind((address, port))
            s.listen()
            return s
        except OSError:
            s.close()
    return None


def main(lo: int, hi: int, seconds: float) -> None:
    held = []
    for port in range(lo, hi + 1):
        for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            s = try_listen(family, address, port)
            if s is not None:
                held.append(s)
    print(f"bound {len(held)}", flush=True)
    received: dict[str, str] = {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ready, _, _ = select.select([sys.stdin, *held], [], [], 0.5)
        if sys.stdin in ready and not sys.stdin.readline():
            break
        for s in ready:
            if s is sys.stdin:
                continue
            conn, _ = s.accept()
            conn.settimeout(2)
            try:
                data = conn.recv(4096)
            except OSError:
                data = b""
            received[str(s.getsockname()[1])] = data[:200].decode("latin-1")
            conn.close()
    print(json.dumps({"bound": sorted({s.getsockname()[1] for s in held}), "received": received}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
