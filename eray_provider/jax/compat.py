"""The JAX releases eray-provider supports, and what differs between them, in one place.

Supported: JAX 0.4.30 to 0.12 (what pip resolves for Python 3.10 to 3.13: up to 0.6 on
3.10, 0.10 on 3.11, 0.12 on 3.12 and 3.13). Decided by feature, from the installed JAX's
own API, not from its version:

- ``jax.distributed.is_initialized`` is missing before 0.4.34; before, the module's global
  state has a client once ``initialize`` ran.
- ``initialize(cluster_detection_method=...)`` is missing in older releases, which detect
  SLURM, Open MPI and the like only for the parameters left unset: eray-provider sets all
  of them but, on machines without GPUs, ``local_device_ids``, which JAX then takes from
  ``SLURM_LOCALID`` in an srun task (``DistributedConfig``; Ray's workers see no
  ``SLURM_*``), harmless as it names no GPU on a CPU-only process.
- ``initialize(coordinator_bind_address=...)``: where present, the coordination service
  (which has no authentication) binds the coordinator's own address instead of ``[::]``.
- Cross-process collectives on CPU: older releases (0.4.30 here) default
  ``jax_cpu_collectives_implementation`` to ``"none"``, and a psum across processes fails
  with "Multiprocess computations aren't implemented on the CPU backend"; newer ones default
  to gloo. Where it is ``"none"``, gloo is asked for before the backend starts.
"""

from __future__ import annotations

import inspect
from typing import Any


def distributed_initialized(jax: Any) -> bool:
    """Whether ``jax.distributed`` was initialized in this process, by anyone."""
    check = getattr(jax.distributed, "is_initialized", None)
    if check is not None:
        return bool(check())
    from jax._src import distributed

    return distributed.global_state.client is not None


def close_client(jax: Any) -> None:
    """Close this process's end of ``jax.distributed`` (preemption manager, then client:
    its heartbeats and error polling stop) and leave the coordination service, which rank
    0 hosts, running. Collective: every rank's client takes part in the shutdown barrier.
    ``jax.distributed.shutdown`` would also stop the service on rank 0, and a rank whose
    error poller sees it close before its own shutdown ends aborts with a fatal log (JAX
    0.10): closing the clients first and the service with the process avoids that race.
    JAX has no public call for it; its ``global_state`` has held these since 0.4."""
    from jax._src import distributed

    state = distributed.global_state
    manager = getattr(state, "preemption_sync_manager", None)
    if manager is not None:
        if hasattr(manager, "shutdown"):  # 0.4.30's has none: it is only dropped
            manager.shutdown()
        state.preemption_sync_manager = None
    if state.client is not None:
        state.client.shutdown()
        state.client = None


def initialize_options(jax: Any, coordinator: str) -> dict[str, Any]:
    """The keyword arguments of ``jax.distributed.initialize`` that this JAX has and that
    eray-provider always sets: no cluster auto-detection, and the coordinator bound to its
    own address."""
    params = inspect.signature(jax.distributed.initialize).parameters
    options = {}
    if "cluster_detection_method" in params:
        options["cluster_detection_method"] = "deactivate"
    if "coordinator_bind_address" in params:
        options["coordinator_bind_address"] = coordinator
    return options


def enable_cpu_collectives(jax: Any) -> None:
    """Gloo for cross-process collectives on CPU where this JAX's setting says ``"none"``
    (the old default; a user's explicit choice of gloo or mpi is kept). Must run before
    JAX's backends start, as ``initialize`` does."""
    if jax.config.values.get("jax_cpu_collectives_implementation") == "none":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
