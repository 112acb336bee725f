"""Where a JAX group's ranks meet: the job's JAX ports, each reserved in the GCS for one
live group at a time, and the coordinator address rank 0 publishes for the others.

A group's rank 0 serves JAX's coordination service on its own node at a port of the job's
range (``ERAY_JAX_PORTS``) that it reserved in the GCS, so that two live groups never share
a port; it publishes the address with who it is (``Publication``), and the other ranks take
it only from a live rank 0 (``rendezvous``). ``ProcessGroup`` (``group``) reserves its port
the same way. Needs Ray only inside the calls.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..plan import environment
from .errors import GroupError, JaxInitError

logger = logging.getLogger(__name__)
_KV_PORT = "eray-jax-port/{job}/{port}"
_KV_RENDEZVOUS = "eray-jax-coordinator/{group}"


def jax_ports() -> range:
    """The job's JAX coordinator ports (from the port plan, via ``ERAY_JAX_PORTS``)."""
    try:
        ports = environment.read_jax_ports(os.environ)
    except ConfigError as e:
        raise JaxInitError(f"{e}; pass coordinator_address explicitly") from e
    if ports is None:
        raise JaxInitError(
            f"{environment.JAX_PORTS} is not set: not on an eray-provider cluster node; "
            "pass coordinator_address explicitly"
        )
    return ports


def head_ip() -> str:
    ip = environment.read_head_ip(os.environ)
    if not ip:
        raise JaxInitError(f"{environment.HEAD_IP} is not set: pass coordinator_address explicitly")
    return ip


def group_port(group: str) -> int:
    """The preferred JAX port of a named group of hook-initialized actors (from its name);
    ``reserve_group_port`` takes the next free one when another group holds it."""
    ports = jax_ports()
    return ports[zlib.crc32(group.encode()) % len(ports)]


#: A hook group's reservation is never reclaimed younger than this (seconds): rank 0 has
#: reserved the port but JAX's coordination service may not listen on it yet.
HOOK_GRACE = 120.0


def _port_key(port: int) -> str:
    """The GCS key that holds one JAX port of the job, shared by both kinds of groups."""
    return _KV_PORT.format(job=environment.read_job_id(os.environ) or "local", port=port)


def _reserve(
    ports: Sequence[int],
    start: int,
    owner: str,
    put: Callable[..., bool],
    get: Callable[[str], bytes | None],
    stale: Callable[[str, int], bool],
) -> int | None:
    """The first port from ``ports[start]`` on (wrapping round) this ``owner`` now holds.

    ``put(key, value, overwrite=False)`` is the GCS's atomic put (True: the key existed);
    a held port is reclaimed when ``stale(holder, port)`` says its group is gone. None: every
    port is held by a live group."""
    for i in range(len(ports)):
        port = ports[(start + i) % len(ports)]
        key = _port_key(port)
        if not put(key, owner, overwrite=False):
            return port
        held = (get(key) or b"").decode()
        if held != owner and stale(held, port):
            put(key, owner, overwrite=True)
            # two reclaimers racing: the later write wins, the other moves on
            if (get(key) or b"").decode() == owner:
                return port
    return None


def _coordinator_gone(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return False
    except (OSError, ValueError):
        return True


def _holder_stale(held: str, port: int, now: float | None = None) -> bool:
    """Whether the group that holds ``port`` is gone. A ``ProcessGroup`` (``<id> <pg id>``)
    is gone with its placement group; a hook group (``hook <ip> <time> <group>``),
    which nothing shuts down, when its reservation is older than ``HOOK_GRACE`` and its
    coordination service no longer accepts connections."""
    parts = held.split(maxsplit=3)  # a group's name may hold spaces: it comes last
    if len(parts) == 2:
        from ray.util import placement_group_table

        return placement_group_table().get(parts[1], {}).get("state") in (None, "REMOVED")
    if len(parts) == 4 and parts[0] == "hook":
        try:
            since = float(parts[2])
        except ValueError:
            return False
        if (time.time() if now is None else now) - since < HOOK_GRACE:
            return False
        return _coordinator_gone(f"{parts[1]}:{port}")
    return False


def reserve_group_port(group: str, ip: str) -> int:
    """The JAX port of a hook group, reserved in the GCS as ``ProcessGroup`` reserves its
    own: two groups whose names hash alike, or a hook group and a ``ProcessGroup``, never
    share a port while both live. Starts at ``group_port(group)``; released at rank 0's
    exit where it exits normally, else reclaimed once its coordinator is gone."""
    import atexit

    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_get, _internal_kv_put

    ports = jax_ports()
    owner = f"hook {ip} {time.time():.0f} {group}"
    start = zlib.crc32(group.encode()) % len(ports)
    port = _reserve(ports, start, owner, _internal_kv_put, _internal_kv_get, _holder_stale)
    if port is not None:
        key = _port_key(port)

        def release() -> None:
            try:
                if (_internal_kv_get(key) or b"").decode() == owner:
                    _internal_kv_del(key)
            except Exception:  # Ray already disconnected
                pass

        atexit.register(release)
        return port
    raise GroupError(f"all {len(ports)} JAX ports of the job are held by live groups (group {group!r})")


def _in_ray() -> bool:
    """This process is connected to Ray (a worker, or a driver after ``ray.init``)."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def default_group() -> str:
    """The group of a rank that named none: its placement group (one per group, as
    ``ProcessGroup`` makes them), else its driver's job."""
    import ray

    context = ray.get_runtime_context()
    pg = context.get_placement_group_id()
    return f"pg-{pg}" if pg else f"job-{context.get_job_id()}"


def rendezvous(rank: int, group: str, timeout: float) -> str:
    """The coordinator address of ``group``. Rank 0: its own node's address at a JAX port
    reserved for the group (``reserve_group_port``), published in the GCS with who it is
    (``Publication``). Other ranks: the published address once its coordinator accepts
    connections and its publisher is not a killed actor, so that an address an earlier
    group of the same name left behind (its ranks killed, nothing withdrew it) is never
    taken; ``GroupError`` after ``timeout`` seconds."""
    import ray
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_put

    key = _KV_RENDEZVOUS.format(group=group)
    if rank == 0:
        ip = ray.util.get_node_ip_address()
        context = ray.get_runtime_context()
        mine = Publication(
            f"{ip}:{reserve_group_port(group, ip)}",
            context.get_node_id(),
            os.getpid(),
            context.get_job_id(),
            int(time.time() * 1000),
        )
        _internal_kv_put(key, mine.text(), overwrite=True)
        return mine.address
    deadline = time.monotonic() + timeout
    last = None
    while True:
        value = _internal_kv_get(key)
        last = Publication.parse(value.decode()) if value is not None else None
        if last is not None and last.usable():
            return last.address
        if time.monotonic() > deadline:
            said = f" (the address published, {last.address}, is not a live rank 0's)" if last else ""
            raise GroupError(f"rank 0 of group {group!r} never published its address{said}", rank)
        time.sleep(0.1)


@dataclass(frozen=True)
class Publication:
    """What rank 0 of a group publishes: its coordinator's address, and its node, pid, job
    and the time (ms) it published, by which the other ranks know a killed rank 0.

    ``ray.kill`` marks an actor DEAD in the GCS before it returns, but the process, and the
    coordination service in it, may live on for a moment; a rank that joins that service
    dies with it (JAX aborts the client). A group started right after the kill of the one
    before it, under the same name, would meet exactly that."""

    address: str
    node_id: str = ""
    pid: int = 0
    job: str = ""
    ms: int = 0

    def text(self) -> str:
        return f"{self.address} {self.node_id} {self.pid} {self.job} {self.ms}"

    @classmethod
    def parse(cls, text: str) -> Publication:
        fields = text.split()
        if len(fields) == 5 and fields[2].isdigit() and fields[4].isdigit():
            return cls(fields[0], fields[1], int(fields[2]), fields[3], int(fields[4]))
        return cls(text.strip())  # an address alone: who published it is unknown

    def usable(self) -> bool:
        """Its coordinator accepts connections and its publisher is no killed actor."""
        return not _coordinator_gone(self.address) and not self.killed(_dead_actors(self.job))

    def killed(self, dead: Sequence[Mapping[str, Any]]) -> bool:
        """Whether one of ``dead`` (the GCS's DEAD actors of the publisher's job) is the
        publisher: same node and pid, ended after it published. The time tells a pid the
        node gave again to a later process from the publisher (a second of clock skew
        between the node and the GCS allowed)."""
        return bool(self.node_id) and any(
            actor.get("Address", {}).get("NodeID") == self.node_id
            and actor.get("Pid") == self.pid
            and actor.get("EndTime", 0) >= self.ms - 1000
            for actor in dead
        )


def _dead_actors(job: str) -> list[Mapping[str, Any]]:
    """The GCS's DEAD actors of ``job`` (hex); none when it is unknown or the GCS cannot
    say (then only the coordinator's answer decides, as before Ray tells)."""
    if not job:
        return []
    try:
        import ray
        from ray._private import state

        return list(state.actors(job_id=ray.JobID.from_hex(job), actor_state_name="DEAD").values())
    except Exception as e:  # a Ray without this private table: the answer alone decides
        logger.debug("no DEAD actors from the GCS: %s", e)
        return []
