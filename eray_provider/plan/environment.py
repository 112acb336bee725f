"""The environment contract: every variable eray-provider hands a process it starts, named,
written and read here alone.

- ``NodeLaunch``: what the launcher (``ray up``, ``eray-provider run``, the elastic
  provider's sbatch) hands ``node_run`` through the environment of a node's step or job.
- ``ClusterEnv``: what every process of a cluster and every client of it gets (a Ray
  worker, a driver on a node, ``ray exec``): the token, the cluster's home, the JAX port
  range and job, the head's address, the runtime hook and its JAX defaults.
- The JAX rank of an actor (``RANK`` ...), the bind shim's variables, and the SLURM
  variables Ray must not see (``hide_slurm``).

``to_env`` writes, ``from_env`` and the ``read_*`` functions read back; a missing or
malformed variable is a ``ConfigError`` that names it and quotes the value. The user's own
settings are read where they act: ``ERAY_STATE_DIR`` (``names.default_base``) and
``ERAY_SLURM_TIMEOUT``/``ERAY_SLURM_ATTEMPTS`` (``slurm.client``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import ConfigError
from .modules import RUNTIME_ENV_HOOK

PREFIX = "ERAY_"
# launcher -> node_run
STATE_BASE = "ERAY_STATE_BASE"
CLUSTER = "ERAY_CLUSTER"
JOB_ID = "ERAY_JOB_ID"
ROLE = "ERAY_ROLE"
NODE_IDS = "ERAY_NODE_IDS"
ELASTIC = "ERAY_ELASTIC"
REPLACES = "ERAY_REPLACES"
#: the temp dir path the port probe claims on every node (``launch.ensure_port_plan``): in the
#: step's environment, which other users cannot read, not in its argv, which they can
CLAIM_DIR = "ERAY_CLAIM_DIR"
#: the user's TMPDIR, kept aside by a node whose Ray gets a TMPDIR of its own
USER_TMPDIR = "ERAY_USER_TMPDIR"
# cluster -> its processes and clients
HEAD_IP = "ERAY_HEAD_IP"
JAX_PORTS = "ERAY_JAX_PORTS"
JAX_ENV = "ERAY_JAX_ENV"
# the group launcher -> each rank's actor
RANK = "ERAY_JAX_RANK"
WORLD = "ERAY_JAX_WORLD"
GROUP = "ERAY_JAX_GROUP"
TIMEOUT = "ERAY_JAX_TIMEOUT"
#: the user's own ``worker_process_setup_hook``, run after the provider's
USER_SETUP_HOOK = "ERAY_USER_SETUP_HOOK"
# node_run -> the bind shim (read by bindshim.c)
BIND_ADDRESS = "ERAY_BIND_ADDRESS"
BIND_PORTS = "ERAY_BIND_PORTS"
#: the port ranges node_run holds on loopback (``runtime.loopback_hold``)
HELD_PORTS = "ERAY_HELD_PORTS"
#: where ``hide_slurm`` moves ``SLURM_*``
HIDDEN_SLURM = "ERAY_SLURM_"
ROLES = ("head", "worker")


@dataclass(frozen=True)
class NodeLaunch:
    """What the launcher hands ``node_run``. ``node_ids``: the launch's encoded ids
    (``launch.encode_node_ids``), empty for an elastic worker, whose own job names it."""

    state_base: str
    cluster: str
    job_id: str
    role: str
    node_ids: str = ""
    elastic: bool = False
    replaces: str | None = None

    def to_env(self) -> dict[str, str]:
        env = {
            STATE_BASE: self.state_base,
            CLUSTER: self.cluster,
            JOB_ID: self.job_id,
            ROLE: self.role,
            NODE_IDS: self.node_ids,
        }
        if self.elastic:
            env[ELASTIC] = "1"
        if self.replaces:
            env[REPLACES] = self.replaces
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> NodeLaunch:
        missing = [k for k in (STATE_BASE, CLUSTER, JOB_ID, ROLE) if not env.get(k)]
        if missing:
            raise ConfigError(
                f"{', '.join(missing)} not set: node_run runs only in a step or job that "
                "eray-provider launched"
            )
        if env[ROLE] not in ROLES:
            raise ConfigError(f"{ROLE}={env[ROLE]!r} is not one of {', '.join(ROLES)}")
        return cls(
            state_base=env[STATE_BASE],
            cluster=env[CLUSTER],
            job_id=env[JOB_ID],
            role=env[ROLE],
            node_ids=env.get(NODE_IDS, ""),
            elastic=env.get(ELASTIC) == "1",
            replaces=env.get(REPLACES) or None,
        )


def launched_head_of(env: Mapping[str, str], cluster: str) -> bool:
    """Whether this process runs on the head of ``cluster`` (under its node_run)."""
    return env.get(ROLE) == "head" and env.get(CLUSTER) == cluster


@dataclass(frozen=True)
class ClusterEnv:
    """What every process of a cluster and every client of it gets. ``address`` (the GCS,
    as ``RAY_ADDRESS``) is for clients: a node's own Ray must not inherit it."""

    token_path: str
    home: str
    jax_env: Mapping[str, str] = field(default_factory=dict)
    job_id: str | None = None
    jax_ports: tuple[int, int] | None = None  # first, count
    head_ip: str | None = None
    address: str | None = None

    def to_env(self) -> dict[str, str]:
        env = {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": self.token_path,
            "HOME": self.home,
            "RAY_RUNTIME_ENV_HOOK": RUNTIME_ENV_HOOK,
            JAX_ENV: json.dumps(dict(self.jax_env)),
        }
        if self.address:
            env["RAY_ADDRESS"] = self.address
        if self.head_ip is not None:
            env[HEAD_IP] = self.head_ip
        if self.jax_ports is not None:
            env[JAX_PORTS] = f"{self.jax_ports[0]}:{self.jax_ports[1]}"
        if self.job_id:
            env[JOB_ID] = self.job_id
        return env


#: what a process that joins a cluster as a client copies into its own environment
CLIENT_VARIABLES = (
    "RAY_AUTH_MODE",
    "RAY_AUTH_TOKEN_PATH",
    "RAY_RUNTIME_ENV_HOOK",
    HEAD_IP,
    JAX_PORTS,
    JOB_ID,
    JAX_ENV,
)


def host_of(address: str) -> str:
    """``10.0.0.5:6379`` -> ``10.0.0.5`` (the last colon: an IPv6 host keeps its own)."""
    return address.rsplit(":", 1)[0]


def read_jax_ports(env: Mapping[str, str]) -> range | None:
    """The job's JAX coordinator ports (``ERAY_JAX_PORTS``, ``first:count``); None when unset."""
    value = env.get(JAX_PORTS, "")
    if not value:
        return None
    first, _, count = value.partition(":")
    if not (first.isdigit() and count.isdigit()):
        raise ConfigError(f"{JAX_PORTS}={value!r} is not FIRST:COUNT")
    return range(int(first), int(first) + int(count))


def read_head_ip(env: Mapping[str, str]) -> str | None:
    return env.get(HEAD_IP) or None


def read_job_id(env: Mapping[str, str]) -> str | None:
    return env.get(JOB_ID) or None


def read_jax_env(env: Mapping[str, str]) -> dict[str, str]:
    """The cluster's ``provider.jax_env`` defaults (``ERAY_JAX_ENV``, a JSON object)."""
    value = env.get(JAX_ENV) or "{}"
    try:
        defaults = json.loads(value)
    except ValueError:
        defaults = None
    if not isinstance(defaults, dict):
        raise ConfigError(f"{JAX_ENV}={value!r} is not a JSON object")
    return {str(k): str(v) for k, v in defaults.items()}


def hide_slurm(env: Mapping[str, str]) -> dict[str, str]:
    """``SLURM_*`` (but ``SLURM_CONF``) moved to ``ERAY_SLURM_*``: Ray's workers inherit
    the node's environment, and the SLURM variables of the node's step switch on JAX's and
    other libraries' SLURM detection, which would read the wrong job layout."""
    return {
        (HIDDEN_SLURM + key[len("SLURM_") :] if key.startswith("SLURM_") and key != "SLURM_CONF" else key): v
        for key, v in env.items()
    }
