"""The group launcher: ``ProcessGroup`` and ``run`` start N JAX processes as Ray actors,
run a function on every rank and shut them all down, never hanging; ``actor_options`` for
users' own actors, and ``drain_notice`` for ranks whose node is about to end.
"""

from __future__ import annotations

import logging
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..plan import environment
from .compat import close_client
from .coordinator import _holder_stale, _port_key, _reserve, jax_ports
from .errors import GroupError
from .init import DEFAULT_TIMEOUT, initialize

logger = logging.getLogger(__name__)
#: How often a group's ``run`` asks the GCS for drained nodes (``on_drain``).
DRAIN_POLL_SECONDS = 2.0
#: How long shutdown waits for killed ranks to be gone before ending rank 0, and for the
#: ranks of a healthy group to close their JAX clients together before that.
KILL_WAIT = 10.0


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
            import eray_provider.jax.group as this_module

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
