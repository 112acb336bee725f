"""A co-tenant who takes ports a cluster may want: listen on 127.0.0.1 on each given port
(those it can get), print ``holding N``, and keep them until stdin closes.

``python port_squatter.py PORT...``; run by the security test as another Unix user.
"""

from __future__ import annotations

import socket
import sys

held = []
for port in map(int, sys.argv[1:]):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        s.listen()
        held.append(s)
    except OSError:
        s.close()
print(f"holding {len(held)}", flush=True)
sys.stdin.read()
