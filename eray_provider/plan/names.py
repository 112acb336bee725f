"""Names of the cluster's SLURM steps and jobs, and the one grammar they are matched by: pure.

Teardown finds what to cancel by name (``squeue`` lists names, nothing else ties a step
or a job to a cluster), so a name must say exactly which cluster it belongs to. Names
are ``eray.<cluster>.<rest>``; a cluster name is letters, digits, ``_``, ``-`` and
``@`` (``[A-Za-z0-9][A-Za-z0-9_@-]*``, at most ``MAX_CLUSTER_NAME`` characters) and
never holds the ``.`` that ends it, so ``eray.foo.head.1`` belongs to ``foo`` and to no
other cluster (not ``fo``, not ``foo.bar``). Every match parses the name and compares
the cluster exactly; nothing here or elsewhere matches by prefix.

Forms:

- steps of a cluster in a job: ``eray.<cluster>.head.<gen>``, ``.workers.<batch>``,
  ``.probe``, ``.cleanup``;
- the elastic head's own job: ``eray.<cluster>.head``;
- elastic worker jobs: ``eray.<cluster>.<head job>.<node type>``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from ..errors import ConfigError

PREFIX = "eray"
#: Where every cluster's state dir lives unless a config's ``provider.state_dir`` says.
STATE_DIR_ENV = "ERAY_STATE_DIR"
MAX_CLUSTER_NAME = 64
_CLUSTER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_@-]*")
_UNSAFE = re.compile(r"[^A-Za-z0-9_@-]")


class ClusterNameError(ConfigError):
    """A cluster name that would make step or job names ambiguous."""


def check_cluster_name(name: object, where: str = "cluster_name") -> str:
    """``name`` if it is a valid cluster name, else ``ClusterNameError`` naming ``where``."""
    if not isinstance(name, str) or not _CLUSTER.fullmatch(name) or len(name) > MAX_CLUSTER_NAME:
        raise ClusterNameError(
            f"{where}: {name!r} is not a valid cluster name: use letters, digits, '_', '-' and '@' "
            f"(starting with a letter or digit, at most {MAX_CLUSTER_NAME} characters); '.' is "
            "refused because it separates the parts of the SLURM step and job names that "
            "teardown matches"
        )
    return name


def safe_part(text: str) -> str:
    """``text`` with every character a cluster name may not hold replaced by ``_``."""
    return _UNSAFE.sub("_", text) or "_"


def _split(name: str) -> tuple[str, str] | None:
    """``eray.<cluster>.<rest>`` -> (cluster, rest); None for any other name."""
    head, sep, tail = name.partition(".")
    if head != PREFIX or not sep:
        return None
    cluster, sep, rest = tail.partition(".")
    if not sep or not rest or not _CLUSTER.fullmatch(cluster):
        return None
    return cluster, rest


def step_name(cluster: str, what: str) -> str:
    """The name of one of ``cluster``'s steps (``head.3``, ``workers.2``, ``probe``...)."""
    return f"{PREFIX}.{check_cluster_name(cluster)}.{what}"


def container_name(cluster: str, job_id: str) -> str:
    """The name of a cluster's container on each node of a job (``provider.container``):
    pyxis keeps it (under enroot's data path, as ``pyxis_<name>``) until ``enroot remove``
    takes it."""
    return f"{PREFIX}.{check_cluster_name(cluster)}.{job_id}"


def is_cluster_step(name: str, cluster: str) -> bool:
    """Whether ``name`` is a step of exactly ``cluster``."""
    parsed = _split(name)
    return parsed is not None and parsed[0] == cluster


def head_job_name(cluster: str) -> str:
    """The elastic head's own job."""
    return f"{PREFIX}.{check_cluster_name(cluster)}.head"


def is_head_job(name: str, cluster: str) -> bool:
    return name == head_job_name(cluster)


def worker_job_name(cluster: str, head_job: str, node_type: str) -> str:
    """An elastic worker job of the cluster whose head runs in job ``head_job``."""
    return f"{PREFIX}.{check_cluster_name(cluster)}.{head_job}.{node_type}"


def parse_worker_job_name(name: str, cluster: str) -> tuple[str, str] | None:
    """(head job, node type) of one of exactly ``cluster``'s worker jobs, else None."""
    parsed = _split(name)
    if parsed is None or parsed[0] != cluster:
        return None
    head_job, _, node_type = parsed[1].partition(".")
    if not head_job.isdigit() or not node_type:
        return None
    return head_job, node_type


def is_cluster_job(name: str, cluster: str) -> bool:
    """A job of exactly ``cluster``: its head's own job or one of its worker jobs."""
    return is_head_job(name, cluster) or parse_worker_job_name(name, cluster) is not None


def default_base(env: Mapping[str, str] = os.environ) -> Path:
    """The dir of every cluster's state dir: ``$ERAY_STATE_DIR``, else ``~/.eray-provider``."""
    return Path(env.get(STATE_DIR_ENV) or Path.home() / ".eray-provider")


#: The dir of a cluster's state dir that keeps its nodes' Ray logs after they end
#: (``runtime.node_logs``); it outlives the cluster until ``eray-provider status --prune``.
LOGS_DIR = "ray-logs"


def ray_temp_dir(private: str) -> str:
    """Ray's ``--temp-dir`` inside a node's private (0700) dir. Ray makes the temp dir it is
    given, and every dir it creates in it, world-writable (``chmod 0777``, in every release):
    one level down, the private parent keeps other users of the host out of them all."""
    return os.path.join(private, "ray")
