"""Who owns a TCP socket on this host: the kernel's socket tables (``/proc/net/tcp``, ``tcp6``).

Two questions are asked of them: which user listens on a port that the cluster wants (to
name a co-tenant who took it), and which user opened a connection to a local listener (the
dashboard forward serves its owner only). The parsing half is pure, for unit tests.

A socket that is bound but neither listens nor is connected is in no table: its owner
cannot be named (it blocks a port; it cannot receive anything).
"""

from __future__ import annotations

import ipaddress
import pwd
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
LISTEN = 0x0A


@dataclass(frozen=True)
class SocketRow:
    """One line of a table: addresses as ``ipaddress`` objects (v4-mapped IPv6 as IPv4)."""

    local: tuple[str, int]
    remote: tuple[str, int]
    state: int
    uid: int
    #: 0 for a socket no process holds any more (closed, in FIN_WAIT2 or TIME_WAIT): its
    #: uid column reads 0, which says nothing of who opened it
    inode: int = 0


def _address(field: str) -> tuple[str, int]:
    """``0100007F:9C6B`` (the kernel prints each 32-bit word of the address in host order)."""
    hexaddr, _, hexport = field.partition(":")
    words = [int(hexaddr[i : i + 8], 16) for i in range(0, len(hexaddr), 8)]
    raw = b"".join(struct.pack("=I", w) for w in words)
    addr = ipaddress.ip_address(raw)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return str(addr), int(hexport, 16)


def parse_table(text: str) -> list[SocketRow]:
    """The rows of one table's text; malformed lines are skipped (the header among them)."""
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 8 or not parts[0].endswith(":"):
            continue
        try:
            inode = int(parts[9]) if len(parts) > 9 else 0
            rows.append(
                SocketRow(_address(parts[1]), _address(parts[2]), int(parts[3], 16), int(parts[7]), inode)
            )
        except ValueError:
            continue
    return rows


def read_rows(tables: Iterable[str] = TABLES) -> list[SocketRow]:
    rows: list[SocketRow] = []
    for path in tables:
        try:
            with open(path) as f:
                rows += parse_table(f.read())
        except OSError:
            continue
    return rows


def listeners(ports: Iterable[int], rows: Iterable[SocketRow]) -> dict[int, set[int]]:
    """Port -> the uids listening on it (any address), among ``ports``."""
    wanted = set(ports)
    out: dict[int, set[int]] = {}
    for row in rows:
        if row.state == LISTEN and row.local[1] in wanted:
            out.setdefault(row.local[1], set()).add(row.uid)
    return out


def peer_uid(peer: tuple[str, int], local: tuple[str, int], rows: Iterable[SocketRow]) -> int | None:
    """The uid of the process that connected from ``peer`` to our ``local`` listener: the
    row whose local end is the peer and whose remote end is ours, held by a process (a row
    of inode 0 is an orphan whose uid reads 0: never taken for root's). None when not found
    (the peer is gone, or not on this host)."""
    want_peer = (str(ipaddress.ip_address(peer[0])), peer[1])
    want_local = (str(ipaddress.ip_address(local[0])), local[1])
    found = [r for r in rows if r.local == want_peer and r.remote == want_local and r.inode]
    return found[0].uid if len(found) == 1 else None


def connection_uid(sock: socket.socket) -> int | None:
    """The uid on the other end of an accepted loopback TCP connection."""
    try:
        peer, local = sock.getpeername()[:2], sock.getsockname()[:2]
    except OSError:
        return None
    return peer_uid(peer, local, read_rows())


def login(uid: int) -> str:
    """The user's name, one word: ``alice``, or ``uid1234`` where the name is unknown."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid{uid}"


def user_name(uid: int) -> str:
    """For messages: ``alice (uid 1234)``."""
    return f"{login(uid)} (uid {uid})"
