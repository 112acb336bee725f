"""The cluster's named ports, held by us on every node from before Ray starts until it ends:
on loopback and on the node's own address.

The bind shim moves Ray's wildcard binds to the node's address, which would leave
``127.0.0.1:<port>`` free on every node: a co-tenant could listen there first, and every
Ray client that reaches a local component over loopback (a driver without the shim sends
its metrics, with the token, to ``127.0.0.1:<agent port>``) would hand it the token. The
rule: no secret goes to an address that someone else could have claimed before us. So
``node_run`` binds ``127.0.0.1`` and ``[::1]`` on the named ports of the cluster's blocks
(``plan.ports.held_ranges``: every port a Ray client reaches over loopback) before anything
of Ray runs, and keeps them until Ray has ended (``node_run.HOLD_AFTER_CRASH_SECONDS`` more
when it ended on its own: other nodes still call a node they have not yet found dead). It
holds the node's own address on them too: a worker waits for the head's GCS by connecting
to ``<head ip>:<gcs port>``, and the dashboard forward connects to ``<head ip>:<dashboard
port>``; a co-tenant who bound either before Ray did (or after a component died) would be
sent the token.

The held sockets are bound, not listening: a connection to them is refused, as it was
when nothing held them. They carry ``SO_REUSEPORT``, which the kernel extends only to
sockets of the same user: Ray's own loopback listeners (the dashboard agent's
``127.0.0.1`` site, a dashboard on ``127.0.0.1``) bind beside them through the shim, which
sets the option on such binds; another user's bind fails with ``EADDRINUSE`` whatever
options it sets. A port already taken when the hold begins fails the node at once, naming
the port and, where the kernel shows it, the user who listens there.
"""

from __future__ import annotations

import errno
import resource
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import ClusterError
from ..plan.ports import port_runs, ranges_text
from .socket_table import LISTEN, listeners, read_rows, user_name

LOOPBACKS = ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1"))


class PortsTakenError(ClusterError):
    """Ports of the cluster are bound on this node's loopback by someone else."""


def _raise_fd_limit(needed: int) -> None:
    """Two sockets a port: the soft limit of open files is raised to cover them (up to the
    hard one; a limit that cannot cover them fails the hold with ``EMFILE``, said plainly)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))


@dataclass
class LoopbackHold:
    """The held sockets; ``release`` closes them (after Ray has ended)."""

    sockets: list[socket.socket] = field(default_factory=list)

    def release(self) -> None:
        for s in self.sockets:
            s.close()
        self.sockets.clear()


def bind_held(family: int, address: str, port: int) -> socket.socket | None:
    """A held socket, or None where this host has no such loopback (no IPv6: nobody can
    bind it either). ``OSError`` when the port is taken."""
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
    except OSError as e:
        if family == socket.AF_INET6 and e.errno in (errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT):
            return None
        raise
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind((address, port))
    except OSError as e:
        s.close()
        if family == socket.AF_INET6 and e.errno == errno.EADDRNOTAVAIL:
            return None
        raise
    return s


def hold_loopback(ranges: Sequence[tuple[int, int]], node_ip: str | None = None) -> LoopbackHold:
    """Bind loopback (and ``node_ip``, an IPv4 address of this host) on every port of
    ``ranges``; ``PortsTakenError`` naming the taken ports and their listeners when any is
    taken (nothing is held then)."""
    ports = [p for lo, hi in ranges for p in range(lo, hi + 1)]
    addresses = [*LOOPBACKS, *([(socket.AF_INET, node_ip)] if node_ip else [])]
    _raise_fd_limit(len(addresses) * len(ports))
    hold = LoopbackHold()
    todo = [(family, address, port) for port in ports for family, address in addresses]
    deadline = time.monotonic() + CLOSED_WAIT_SECONDS
    try:
        while True:
            taken = []
            for family, address, port in todo:
                try:
                    s = bind_held(family, address, port)
                except OSError as e:
                    if e.errno != errno.EADDRINUSE:
                        raise PortsTakenError(f"cannot hold {address} port {port} on this node: {e}") from e
                    taken.append((family, address, port))
                    continue
                if s is not None:
                    hold.sockets.append(s)
            # a closed connection of any process (TIME_WAIT) blocks a bind for up to a minute
            # and leaves the port to nobody: wait for it, but not for a socket someone holds
            if not taken or time.monotonic() > deadline or not closed_only({p for *_, p in taken}):
                break
            todo = taken
            time.sleep(0.5)
    except BaseException:
        hold.release()
        raise
    if taken:
        hold.release()
        raise PortsTakenError(describe_taken(sorted({p for *_, p in taken})))
    return hold


#: How long a hold waits for closed connections (TIME_WAIT, 60 s on Linux) on its ports.
CLOSED_WAIT_SECONDS = 65.0


def closed_only(ports: set[int]) -> bool:
    """Whether every port of ``ports`` shows, in the kernel's tables, a closed connection
    (a row no process holds: TIME_WAIT, FIN_WAIT2) and no listener. A socket that is bound
    but neither listens nor connects shows nowhere, so this can wait for nothing: the wait
    is bounded."""
    rows = [r for r in read_rows() if r.local[1] in ports]
    closed = {r.local[1] for r in rows if r.inode == 0 and r.state != LISTEN}
    return closed == ports and not any(r.state == LISTEN for r in rows)


def describe_taken(ports: Sequence[int]) -> str:
    """The message for ports taken on loopback: which, and who listens there."""
    owners = listeners(ports, read_rows())
    uids = sorted({uid for found in owners.values() for uid in found})
    who = ", ".join(user_name(u) for u in uids) if uids else "a socket that does not listen (owner unknown)"
    return (
        f"ports {ranges_text(port_runs(ports))} of this cluster's port plan are bound on this "
        f"node by someone else ({who}): a client's token could reach them; the node will not start "
        "(`ray down`, then `ray up` plans other ports)"
    )
