"""``jax.distributed`` in one process, one rank of one group: ``initialize``.

Inside Ray the coordinator is found through the GCS (``rendezvous``); outside Ray it is the
head at the job's first JAX port. Devices are the GPUs Ray gave the process, JAX's own
cluster auto-detection is off, and a second call in one process is an error
(``JaxInitError``). ``initialize_from_env`` is what the runtime hook calls in every worker.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError
from ..plan import environment
from .compat import distributed_initialized, enable_cpu_collectives, initialize_options
from .coordinator import _in_ray, default_group, head_ip, jax_ports, rendezvous
from .errors import JaxInitError

logger = logging.getLogger(__name__)
DEFAULT_TIMEOUT = 60.0
_state: dict[str, Any] | None = None


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


def initialize_from_env() -> bool:
    """Called by the runtime hook in every worker: initialize when the actor asked for it."""
    if environment.RANK not in os.environ or is_initialized():
        return False
    rank, world = int(os.environ[environment.RANK]), int(os.environ[environment.WORLD])
    group = os.environ.get(environment.GROUP, "default")
    timeout = float(os.environ.get(environment.TIMEOUT, DEFAULT_TIMEOUT))
    initialize(rank, world, coordinator_address=rendezvous(rank, group, timeout), timeout=timeout)
    return True
