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
  (``plan.drain``): time to checkpoint.
- ``actor_options(rank, world_size)``: options for your own actors; the runtime hook the
  provider installs on every node (``eray_provider.jax.hook``) initializes
  ``jax.distributed`` in such an actor before its ``__init__`` runs.

Node facts reach workers through variables set by the provider at ``ray start``:
``ERAY_HEAD_IP``, ``ERAY_JAX_PORTS`` (``first:count``) and ``ERAY_JOB_ID``.

The code: ``init`` (one process's ``jax.distributed``), ``coordinator`` (ports and the
coordinator's address), ``group`` (the launcher), ``errors``; this module names the API.
"""

from .coordinator import group_port, head_ip, jax_ports, rendezvous, reserve_group_port
from .errors import GroupError, JaxInitError
from .group import DrainNotice, ProcessGroup, actor_options, drain_notice, run
from .init import (
    DEFAULT_TIMEOUT,
    default_coordinator,
    initialize,
    initialize_from_env,
    is_initialized,
    ray_gpu_ids,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "DrainNotice",
    "GroupError",
    "JaxInitError",
    "ProcessGroup",
    "actor_options",
    "default_coordinator",
    "drain_notice",
    "group_port",
    "head_ip",
    "initialize",
    "initialize_from_env",
    "is_initialized",
    "jax_ports",
    "ray_gpu_ids",
    "rendezvous",
    "reserve_group_port",
    "run",
]
