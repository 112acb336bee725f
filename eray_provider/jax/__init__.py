"""``jax.distributed`` inside Ray actors on an eray-provider cluster, and a group launcher.

- ``initialize(process_id, num_processes, ...)``: one call inside an actor. The coordinator
  defaults to the cluster head at the job's first JAX port, devices to the GPUs Ray gave
  the actor, and JAX's own cluster auto-detection is off (inside Ray the raylet's
  ``SLURM_*`` variables would otherwise override what you asked for). Bad arguments raise
  ``ValueError``; a second call in one process raises ``JaxInitError``.
- ``ProcessGroup`` / ``run(fn, ...)``: N actors in a placement group (one per node by
  default), ranks in node order, a coordinator port of the group's own from the job's
  range, ``jax.distributed`` initialized in all of them, ``fn`` run on every rank, results
  returned per rank, everything shut down. A rank that dies or never arrives raises
  ``GroupError`` naming the rank and node within ``timeout`` seconds, and no actor of the
  group is left running.
- ``drain_notice()`` in a rank, ``ProcessGroup(on_drain=...)`` in the driver: a node of
  the group is being drained because its SLURM job nears its end or is preempted
  (``walltime``): time to checkpoint.
- ``actor_options(rank, world_size)``: options for your own actors; the runtime hook the
  provider installs on every node (``eray_provider.jax.hook``) initializes
  ``jax.distributed`` in such an actor before its ``__init__`` runs.

Node facts reach workers through variables set by the provider at ``ray start``:
``ERAY_HEAD_IP``, ``ERAY_JAX_PORTS`` (``first:count``) and ``ERAY_JOB_ID``.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
import uuid
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ClusterError, ConfigError
from ..plan import environment
from .compat import close_client, distributed_initialized, enable_cpu_collectives, initialize_options

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 60.0
#: How often a group's ``run`` asks the GCS for drained nodes (``on_drain``).
DRAIN_POLL_SECONDS = 2.0
#: How long shutdown waits for killed ranks to be gone before ending rank 0, and for the
#: ranks of a healthy group to close their JAX clients together before that.
KILL_WAIT = 10.0
_KV_PORT = "eray-jax-port/{job}/{port}"
_KV_RENDEZVOUS = "eray-jax-coordinator/{group}"

_state: dict[str, Any] | None = None


class JaxInitError(ClusterError):
    """``jax.distributed`` cannot be (or already was) initialized in this process."""


@dataclass(frozen=True)
class DrainNotice:
    """A node of the group (or this process's node) is being drained: its SLURM job ends at
    ``deadline`` (epoch seconds; None when SLURM could not tell). Time to checkpoint."""

    node_id: str  # Ray's node id
    node: str  # the SLURM node's host name, "?" when not known here
    ranks: tuple[int, ...]  # the group's ranks on it (empty outside a group)
    deadline: float | None

    def seconds_left(self, now: float | None = None) -> float | None:
        return None if self.deadline is None else self.deadline - (time.time() if now is None else now)


#: The nodes of this process's group (rank order, Ray node ids), set when it joins one.
_group_nodes: list[str] = []


def drain_notice() -> DrainNotice | None:
    """In a rank of a ``ProcessGroup``: the earliest drain among the group's nodes (one
    rank's node ending ends the group's collectives); elsewhere in a Ray worker: this
    node's drain. None when nothing is being drained. One GCS call: poll it every few
    steps, not every step. eray-provider drains a node ``provider.drain_before_end_s``
    before its SLURM job's end, or when SLURM signals a preemption."""
    import ray

    from ..runtime.ray_compat import draining_nodes

    nodes = _group_nodes or [ray.get_runtime_context().get_node_id()]
    drains = draining_nodes()
    found = [
        DrainNotice(node, "?", tuple(r for r, n in enumerate(_group_nodes) if n == node), drains[node])
        for node in dict.fromkeys(nodes)
        if node in drains
    ]
    if not found:
        return None
    return min(found, key=lambda d: float("inf") if d.deadline is None else d.deadline)


class GroupError(ClusterError):
    """A rank of a process group died, was never placed, or never arrived."""

    def __init__(self, message: str, rank: int | None = None, node: str | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.node = node


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


def default_coordinator() -> str:
    return f"{head_ip()}:{jax_ports()[0]}"


def _check_address(address: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"coordinator_address must be HOST:PORT, got {address!r}")
    try:
        socket.getaddrinfo(host, int(port))
    except OSError as e:
        raise ConfigError(f"coordinator_address {address!r}: cannot resolve {host!r}: {e}") from e


def ray_gpu_ids() -> list[int] | None:
    """Device ids for JAX from the GPUs Ray assigned to this worker (None: no GPUs, or no
    Ray runs in this process). Ray is asked only when it runs here: ``ray.get_gpu_ids()``
    elsewhere starts a private one-node Ray (random ports, a token in ``~/.ray``, files in
    ``/tmp/ray``), which a later ``auto_ray_cluster()`` would then take for the job's."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    try:
        ids = ray.get_gpu_ids()
    except Exception:
        return None
    if not ids:
        return None
    # Ray narrows CUDA_VISIBLE_DEVICES to the assigned GPUs: JAX then numbers them 0..n-1
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        return list(range(len(ids)))
    return [int(i) for i in ids]


def initialize(
    process_id: int,
    num_processes: int,
    coordinator_address: str | None = None,
    local_device_ids: Sequence[int] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    group: str | None = None,
) -> None:
    """Initialize ``jax.distributed`` in this process (one rank of one group).

    Without ``coordinator_address``, in a Ray worker (an actor or a task), rank 0 serves
    as the coordinator on its own node, wherever Ray placed it, at a JAX port of the job
    reserved for the group, and publishes that address in the GCS; the other ranks wait
    for it (``rendezvous``). ``group`` names the group (default: the placement group the
    rank runs in, else the driver's job): two groups alive at once outside placement
    groups need names of their own. Outside Ray the coordinator is the head at the job's
    first JAX port."""
    global _state
    for name, value in (("process_id", process_id), ("num_processes", num_processes)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} must be an int, got {value!r}")
    if num_processes < 1:
        raise ConfigError(f"num_processes must be >= 1, got {num_processes}")
    if not 0 <= process_id < num_processes:
        raise ConfigError(f"process_id must be in [0, {num_processes}), got {process_id}")
    if not timeout or timeout <= 0:
        raise ConfigError(f"timeout must be > 0 seconds, got {timeout!r}")
    if local_device_ids is not None:
        local_device_ids = list(local_device_ids)
        if not all(isinstance(i, int) and i >= 0 for i in local_device_ids):
            raise ConfigError(f"local_device_ids must be non-negative ints, got {local_device_ids!r}")
    if _state is not None:
        raise JaxInitError(
            f"jax.distributed is already initialized in this process (rank {_state['rank']} of "
            f"{_state['world']}, coordinator {_state['coordinator']}): use one process per rank"
        )
    if coordinator_address is None and _in_ray():
        coordinator_address = rendezvous(process_id, group or default_group(), timeout)
    coordinator = coordinator_address or default_coordinator()
    _check_address(coordinator)
    devices = local_device_ids if local_device_ids is not None else ray_gpu_ids()

    import jax

    if distributed_initialized(jax):
        raise JaxInitError("jax.distributed was already initialized in this process by other code")
    enable_cpu_collectives(jax)
    jax.distributed.initialize(
        coordinator_address=coordinator,
        num_processes=num_processes,
        process_id=process_id,
        local_device_ids=devices,
        initialization_timeout=max(int(timeout), 1),
        **initialize_options(jax, coordinator),
    )
    _state = {"rank": process_id, "world": num_processes, "coordinator": coordinator}


def is_initialized() -> bool:
    return _state is not None


# ---------------------------------------------------------------------- own actors + hook


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


def actor_options(
    rank: int, world_size: int, group: str | None = None, timeout: float = DEFAULT_TIMEOUT
) -> dict[str, Any]:
    """``.options(**actor_options(rank, world))`` makes the runtime hook initialize JAX.

    Rank 0 publishes its node address in the GCS under the group's name (default: this
    driver's job id), the other ranks wait for it, all initialize before ``__init__``.
    Two groups alive at the same time in one driver need different ``group`` names.
    """
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank must be in [0, {world_size}), got {rank}")
    if group is None:
        import ray

        group = f"job-{ray.get_runtime_context().get_job_id()}"
    env = {
        environment.RANK: str(rank),
        environment.WORLD: str(world_size),
        environment.GROUP: group,
        environment.TIMEOUT: str(timeout),
    }
    return {"runtime_env": {"env_vars": env}}


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


def initialize_from_env() -> bool:
    """Called by the runtime hook in every worker: initialize when the actor asked for it."""
    if environment.RANK not in os.environ or is_initialized():
        return False
    rank, world = int(os.environ[environment.RANK]), int(os.environ[environment.WORLD])
    group = os.environ.get(environment.GROUP, "default")
    timeout = float(os.environ.get(environment.TIMEOUT, DEFAULT_TIMEOUT))
    initialize(rank, world, coordinator_address=rendezvous(rank, group, timeout), timeout=timeout)
    return True


# ---------------------------------------------------------------------- group launcher


def _rank_actor_class():
    import ray

    @ray.remote(max_restarts=0, max_task_retries=0)
    class JaxRank:
        def where(self) -> dict[str, Any]:
            ctx = ray.get_runtime_context()
            return {
                "node_id": ctx.get_node_id(),
                "ip": ray.util.get_node_ip_address(),
                "host": socket.gethostname(),
            }

        def init(self, rank: int, world: int, coordinator: str, timeout: float, nodes: list[str]) -> int:
            # the module itself: this class travels by value, with copies of its globals
            from eray_provider import jax as this_module

            this_module._group_nodes[:] = nodes
            initialize(rank, world, coordinator_address=coordinator, timeout=timeout)
            import jax

            return jax.process_index()

        def run(self, fn: Callable, args: tuple, kwargs: dict) -> Any:
            return fn(*args, **kwargs)

        def close_client(self) -> None:
            import jax

            close_client(jax)

    return JaxRank


def _kill_and_wait(actors: list, timeout: float) -> None:
    """Kill the actors and wait (bounded) until Ray knows each one is dead: a call on it
    fails with ``RayActorError``; one that still answers is not gone yet."""
    import ray
    from ray.exceptions import RayActorError

    for actor in actors:
        ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + timeout
    alive = list(actors)
    while alive and time.monotonic() < deadline:
        refs = [a.__ray_ready__.remote() for a in alive]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=max(0.1, deadline - time.monotonic()))
        still = []
        for actor, ref in zip(alive, refs):
            try:
                if ref in done:
                    ray.get(ref)
                still.append(actor)
            except RayActorError:
                pass
        alive = still
        if alive:
            time.sleep(0.2)


class ProcessGroup:
    """N JAX processes as Ray actors; use as a context manager or call ``shutdown``."""

    def __init__(
        self,
        num_processes: int | None = None,
        gpus_per_process: float = 0,
        cpus_per_process: float = 1,
        timeout: float = DEFAULT_TIMEOUT,
        env_vars: dict[str, str] | None = None,
        on_drain: Callable[[DrainNotice], None] | None = None,
    ) -> None:
        """``on_drain``: called in the driver, once per node, when a node of the group
        starts draining (its SLURM job nears its end or is preempted) while ``run`` waits;
        the ranks themselves can poll ``drain_notice()``."""
        import ray

        if not ray.is_initialized():
            ray.init()
        nodes = [n for n in ray.nodes() if n["Alive"]]
        if num_processes is None:
            num_processes = len(nodes)
        if num_processes < 1:
            raise ConfigError(f"num_processes must be >= 1, got {num_processes}")
        if timeout <= 0:
            raise ConfigError(f"timeout must be > 0 seconds, got {timeout}")
        self.num_processes = num_processes
        self.gpus = gpus_per_process
        self.cpus = cpus_per_process
        self.timeout = timeout
        self.env_vars = dict(env_vars or {})
        self.id = uuid.uuid4().hex[:12]
        self.port: int | None = None
        self.pg: Any = None  # Ray's PlacementGroup once started
        self.actors: list = []  # in rank order once started
        self.nodes: list[str] = []  # SLURM node (host name) of each rank
        self.node_ids: list[str] = []  # Ray node id of each rank
        self.on_drain = on_drain
        self._drains_told: set[str] = set()
        self._drain_polled = 0.0
        self._healthy = False  # every call on every rank so far succeeded
        self._node_order = {
            n["NodeID"]: (int(n.get("Labels", {}).get("slurm-node-index", 10**6)), n["NodeManagerAddress"])
            for n in nodes
        }
        self.strategy = "STRICT_SPREAD" if num_processes <= len(nodes) else "SPREAD"

    # -------------------------------------------------------------- lifecycle
    def __enter__(self) -> ProcessGroup:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def start(self) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        deadline = time.monotonic() + self.timeout
        try:
            bundle = {"CPU": self.cpus, **({"GPU": self.gpus} if self.gpus else {})}
            self.pg = placement_group([bundle] * self.num_processes, strategy=self.strategy)
            ready, _ = ray.wait([self.pg.ready()], timeout=self.timeout)
            if not ready:
                raise GroupError(
                    f"{self.num_processes} bundles of {bundle} ({self.strategy}) could not be placed "
                    f"within {self.timeout:.0f} s"
                )
            self.port = self._reserve_port()
            cls = _rank_actor_class()
            actors = [
                cls.options(
                    num_cpus=self.cpus,
                    num_gpus=self.gpus,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, i),
                    runtime_env={"env_vars": self.env_vars} if self.env_vars else None,
                ).remote()
                for i in range(self.num_processes)
            ]
            self.actors = actors
            self.nodes = ["?"] * len(actors)
            where = self._gather([a.where.remote() for a in actors], deadline, "start")
            order = sorted(range(len(actors)), key=lambda i: (self._node_order.get(where[i]["node_id"]), i))
            self.actors = [actors[i] for i in order]
            self.nodes = [where[i]["host"] for i in order]
            coordinator = f"{where[order[0]]['ip']}:{self.port}"
            self.node_ids = [where[i]["node_id"] for i in order]
            refs = [
                a.init.remote(r, len(actors), coordinator, self.timeout, self.node_ids)
                for r, a in enumerate(self.actors)
            ]
            self._gather(refs, deadline, "initialize jax.distributed")
            self._healthy = True
        except BaseException:
            self._healthy = False
            self.shutdown()
            raise

    def run(self, fn: Callable, *args: Any, timeout: float | None = None, **kwargs: Any) -> list[Any]:
        """``fn(*args, **kwargs)`` on every rank; results in rank order."""
        if not self.actors:
            raise GroupError("the group is not started (or was shut down)")
        deadline = time.monotonic() + timeout if timeout else None
        try:
            return self._gather([a.run.remote(fn, args, kwargs) for a in self.actors], deadline, "run")
        except BaseException:
            self._healthy = False
            self.shutdown()
            raise

    def shutdown(self) -> None:
        """End every rank. A healthy group's ranks first close their JAX clients together
        (``jax.compat.close_client``, bounded), so that no rank is still polling JAX's
        coordination service when it goes; then the others are killed, and waited for until
        gone (bounded), then rank 0, which hosts the service. After a failure the ranks are
        killed at once: one is dead or stuck, and the clients' shutdown barrier would wait
        for it. (A collective ``jax.distributed.shutdown`` races in JAX 0.10: a rank whose
        error poller sees the service close before its own shutdown ends aborts with a
        fatal log, and ``ray.kill`` reports an actor dead before its process has ended.)"""
        from ray.util.placement_group import remove_placement_group

        if self._healthy and self.actors:
            self._close_clients()
        self._healthy = False
        for group in (self.actors[1:], self.actors[:1]):
            try:
                _kill_and_wait(group, KILL_WAIT)
            except Exception as e:  # Ray disconnected: its actors are going anyway
                logger.debug("shutdown: %s", e)
        self.actors = []
        if self.pg is not None:
            try:
                remove_placement_group(self.pg)
            except Exception:
                pass
            self.pg = None
        if self.port is not None:
            from ray.experimental.internal_kv import _internal_kv_del

            _internal_kv_del(self._port_key(self.port))
            self.port = None

    # -------------------------------------------------------------- helpers
    def _close_clients(self) -> None:
        import ray

        refs = [a.close_client.remote() for a in self.actors]
        done, pending = ray.wait(refs, num_returns=len(refs), timeout=KILL_WAIT)
        try:
            ray.get(done)
        except Exception as e:  # the ranks are killed next either way
            logger.debug("closing the JAX clients: %s", e)
        if pending:
            logger.debug(
                "%d of %d ranks did not close their JAX client in %.0f s", len(pending), len(refs), KILL_WAIT
            )

    def _gather(self, refs: list, deadline: float | None, what: str) -> list[Any]:
        """Results of one call per rank; the first failure or the deadline raises GroupError."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        index = {ref: rank for rank, ref in enumerate(refs)}
        results: dict[int, Any] = {}
        pending = list(refs)
        while pending:
            self.check_drains()
            wait = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=wait)
            for ref in done:
                rank = index[ref]
                try:
                    results[rank] = ray.get(ref)
                except (RayActorError, RayTaskError, GetTimeoutError) as e:
                    first_line = str(e).splitlines()[0] if str(e) else ""
                    raise self._rank_error(
                        rank, f"failed during {what}: {type(e).__name__}: {first_line}"
                    ) from e
            if pending and deadline is not None and time.monotonic() >= deadline:
                raise self._rank_error(
                    index[pending[0]],
                    f"did not {what} within {self.timeout:.0f} s "
                    f"({len(pending)} of {len(refs)} ranks missing)",
                )
        return [results[r] for r in range(len(refs))]

    def check_drains(self) -> None:
        """``on_drain`` for each node of the group newly drained (a GCS call each
        ``DRAIN_POLL_SECONDS`` at most). ``run`` calls it while it waits; a driver that does
        other work between runs may call it itself. An exception of the callback is logged,
        not raised: the group's work goes on."""
        if self.on_drain is None or not self.node_ids:
            return
        if time.monotonic() - self._drain_polled < DRAIN_POLL_SECONDS:
            return
        self._drain_polled = time.monotonic()
        from ..runtime.ray_compat import draining_nodes

        try:
            drains = draining_nodes()
        except Exception as e:  # the GCS unreachable for a moment: the next poll
            logger.debug("draining nodes: %s", e)
            return
        for node_id, deadline in drains.items():
            if node_id in self._drains_told or node_id not in self.node_ids:
                continue
            self._drains_told.add(node_id)
            ranks = tuple(r for r, n in enumerate(self.node_ids) if n == node_id)
            notice = DrainNotice(node_id, self.nodes[ranks[0]], ranks, deadline)
            try:
                self.on_drain(notice)
            except Exception:
                logger.exception("on_drain(%s) raised", notice)

    def _rank_error(self, rank: int, what: str) -> GroupError:
        node = self.nodes[rank] if rank < len(self.nodes) else "?"
        return GroupError(f"rank {rank} on node {node} {what}", rank, node)

    def _port_key(self, port: int) -> str:
        return _port_key(port)

    def _reserve_port(self) -> int:
        """A JAX port of the job's range no other live group holds (atomic GCS put)."""
        from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_put

        owner = f"{self.id} {self.pg.id.hex()}"
        port = _reserve(jax_ports(), 0, owner, _internal_kv_put, _internal_kv_get, _holder_stale)
        if port is None:
            raise GroupError(f"all {len(jax_ports())} JAX ports of the job are held by live groups")
        return port


def run(
    fn: Callable,
    *args: Any,
    num_processes: int | None = None,
    gpus_per_process: float = 0,
    cpus_per_process: float = 1,
    timeout: float = DEFAULT_TIMEOUT,
    env_vars: dict[str, str] | None = None,
    on_drain: Callable[[DrainNotice], None] | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Start a group, run ``fn`` on every rank, shut the group down; results per rank."""
    group = ProcessGroup(num_processes, gpus_per_process, cpus_per_process, timeout, env_vars, on_drain)
    with group:
        return group.run(fn, *args, **kwargs)
