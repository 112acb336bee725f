"""The Ray releases eray-provider supports, and every difference between them, in one place.

Supported: Ray 2.52 to 2.60. The floor is 2.52 because it is the first release with token
authentication (``RAY_AUTH_MODE=token``), on which the security of a cluster on shared nodes
rests; 2.60 is the newest release tested. A newer 2.x gets a warning at the first ``ray``
command and is used; an older release, or another major version, is refused there with both
versions named.

Each difference is a named feature decided here from the installed version, so the rest of
the package asks "which digest names the config cache?", never "which Ray is this?". Found
by reading the releases' own code, 2.52.0 to 2.60.0:

- ``CONFIG_CACHE_DIGEST``: ``ray up`` caches its resolved config in
  ``$TMPDIR/ray-config-<digest>``; the digest is SHA-1 before 2.54 and SHA-256 from 2.54
  (``ray/autoscaler/_private/commands.py``, ``_bootstrap_config``). ``config_cache`` must
  compute the same name, or it cannot create that file private before Ray writes it.
- ``WORKER_TEMP_DIR_FROM_HEAD``: before 2.55 ``ray start --temp-dir`` is ignored on a
  worker, which takes the head's temp dir path (read from the GCS) and creates it on its
  own host (``ray/scripts/scripts.py``, ``start``). ``node_run`` then makes that path
  itself, private (``shared_dir``: other nodes of the cluster on the host may share it,
  and the last to end removes it).
- ``WORKER_WAITS_FOR_HEAD_NODE``: from 2.55 a worker's ``ray start`` asks the GCS for the
  head *node* (its temp dir) before it starts its raylet, every 2 s until the head's raylet
  has registered (``ray/_private/node.py``, ``get_all_node_info_until_retrieved``); before,
  it needs only the GCS. ``runtime.ray_gate`` then waits for the head node itself, asking
  more often, so that Ray's first ask finds it.
- ``AGENT_HTTP_TOKEN_CHECK``: from 2.54 the dashboard agent's HTTP server checks the token
  (``ray/dashboard/http_server_agent.py``). Before, it takes jobs from anyone who can reach
  it (``POST /api/job_agent/jobs/``, the head node's agent), which ``require_supported_ray``
  says at every ``ray`` command and docs/security.md states.

- ``monitor_after_registration``: ``ray start --head`` starts the autoscaler's monitor
  among the head's first processes, before its raylet (``Node.__init__`` calls
  ``start_head_processes``, which calls ``start_monitor``, then starts the raylet and waits
  until the GCS lists it: ``ray/_private/node.py``, the same in every supported release).
  The gate moves that one call after the wait.

Also read, and the same from 2.52 to 2.60 for what eray-provider uses: the provider and
command runner interfaces, the autoscaler v2 adapter and its adoption of nodes by
``RAY_CLOUD_INSTANCE_ID``, the token variables and the dashboard's token check, every
``ray start`` flag passed, labels, ``GcsClient.get_all_node_info`` and ``GcsNodeInfo``.
Not a version test but set on every head (``node_run``):
``RAY_AUTOSCALER_RECONCILE_ALLOCATE_STATUS_TIMEOUT_S``, whose default went from 300 s to an
hour in 2.54.

The private Ray names the package uses (``cli_logger``, ``ProcessRunnerError``) are imported
here and nowhere else, so a release that moves one breaks one import. They are imported on
first use, so that code on the nodes (``node_run``) can read the features without importing
Ray.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from ..errors import ClusterError

#: The oldest Ray supported: the first with token authentication.
OLDEST = (2, 52)
#: The newest Ray tested; a newer 2.x is used with a warning.
NEWEST_TESTED = (2, 60)
SUPPORTED = f"{OLDEST[0]}.{OLDEST[1]} to {NEWEST_TESTED[0]}.{NEWEST_TESTED[1]}"
#: The first release whose dashboard agent's HTTP server checks the token.
AGENT_HTTP_TOKEN_SINCE = (2, 54)


class UnsupportedRayError(ClusterError):
    """The installed Ray is outside the supported range."""


def parse_version(text: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a Ray version string such as ``2.53.0`` or ``2.61.0rc1``."""
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if m is None:
        raise UnsupportedRayError(f"cannot read the Ray version {text!r} (expected MAJOR.MINOR[.PATCH])")
    return int(m[1]), int(m[2]), int(m[3] or 0)


def installed_version() -> str:
    """The installed Ray's version, from its package metadata (no ``import ray``)."""
    try:
        return version("ray")
    except PackageNotFoundError as e:
        raise UnsupportedRayError(f"Ray is not installed; eray-provider needs Ray {SUPPORTED}") from e


RAY_VERSION_TEXT = installed_version()
#: This Python's ``major.minor``, which a container image's must be (``plan.container``).
PYTHON_VERSION_TEXT = f"{sys.version_info[0]}.{sys.version_info[1]}"
RAY_VERSION = parse_version(RAY_VERSION_TEXT)


def check_version(text: str) -> str | None:
    """Refuse Ray ``text`` when outside the supported range; return what a user of it must
    be warned of (a newer 2.x than tested, an agent without the token check), or None."""
    major, minor, _ = parse_version(text)
    if major != OLDEST[0] or (major, minor) < OLDEST:
        why = " (token authentication, which it relies on, came in 2.52)" if major == 2 else ""
        raise UnsupportedRayError(
            f"Ray {text} is installed; eray-provider supports Ray {SUPPORTED}{why}. "
            f"Install a supported one, for example: pip install 'ray[default]>={OLDEST[0]}.{OLDEST[1]},<3'"
        )
    if (major, minor) > NEWEST_TESTED:
        return (
            f"Ray {text} is newer than the newest release eray-provider was tested with "
            f"({NEWEST_TESTED[0]}.{NEWEST_TESTED[1]}); supported: Ray {SUPPORTED}"
        )
    if (major, minor) < AGENT_HTTP_TOKEN_SINCE:
        since = "{}.{}".format(*AGENT_HTTP_TOKEN_SINCE)
        return (
            f"Ray {text}'s dashboard agent does not check the token (Ray {since} and later do): "
            "anyone who can reach the head node's dashboard agent port can submit a job "
            f"that runs as you. Use Ray {since} or later on nodes shared with other users"
        )
    return None


_warned: set[str] = set()


def require_supported_ray() -> None:
    """The first act of every ``ray`` command on our providers: one clear message and exit
    status 1 on an unsupported Ray, ``check_version``'s warning (once per process).

    It exits rather than raising because Ray's CLI turns any exception from the provider's
    config hooks into a warning and goes on to fail later, somewhere confusing."""
    from ray.autoscaler._private.cli_logger import cli_logger

    try:
        warning = check_version(RAY_VERSION_TEXT)
    except UnsupportedRayError as e:
        cli_logger.error(str(e))
        raise SystemExit(1) from e
    if warning and warning not in _warned:
        _warned.add(warning)
        cli_logger.warning(warning)


#: The hash whose hex digest names Ray's config cache file.
CONFIG_CACHE_DIGEST = "sha256" if RAY_VERSION[:2] >= (2, 54) else "sha1"
#: A worker's Ray runs in the head's temp dir path, whatever ``--temp-dir`` says.
WORKER_TEMP_DIR_FROM_HEAD = RAY_VERSION[:2] < (2, 55)
#: the same release's other side (see the module's docstring)
WORKER_WAITS_FOR_HEAD_NODE = not WORKER_TEMP_DIR_FROM_HEAD
#: The dashboard agent's HTTP server refuses requests without the token.
AGENT_HTTP_TOKEN_CHECK = RAY_VERSION[:2] >= AGENT_HTTP_TOKEN_SINCE


def __getattr__(name: str) -> Any:
    """``cli_logger``, imported from Ray's private module on first use."""
    if name == "cli_logger":
        from ray.autoscaler._private.cli_logger import cli_logger

        return cli_logger
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def monitor_after_registration() -> None:
    """In this process (a head's ``ray start``, ``runtime.ray_gate``): start the autoscaler's
    monitor once the head node has registered with the GCS, not beside the head's first
    processes. The monitor loads Ray's autoscaler and the cluster's node provider (about 0.4
    CPU-seconds): on a head node bound by CPU, started beside the others it delays the head's
    registration, and the whole cluster's start with it, by as much
    (``bench/time_to_cluster.py``). Nothing needs it earlier: the autoscaler acts on nodes the
    GCS lists. Ray's own ``Node.start_monitor`` still starts it
    (the same command, log files and autoscaler version), so ``ray start --block`` watches it
    as before: a monitor that dies ends the head. A node that fails to start never starts it."""
    from ray._private.node import Node

    start, init = getattr(Node, "start_monitor", None), Node.__init__
    if start is None:  # a newer Ray that starts it otherwise: left as it is
        return
    waiting: list[Any] = []
    starting: list[Any] = []

    def deferred(self: Any) -> None:
        if starting:  # inside Node.__init__: after its wait for the raylet
            waiting.append(self)
        else:  # called from anywhere else (a newer Ray): at once, never lost
            start(self)

    def init_then_monitor(self: Any, *args: Any, **kwargs: Any) -> None:
        starting.append(self)
        try:
            init(self, *args, **kwargs)
        finally:
            starting.pop()
        while waiting:
            start(waiting.pop())

    Node.start_monitor = deferred
    Node.__init__ = init_then_monitor


def draining_nodes() -> dict[str, float | None]:
    """Ray node id (hex) -> drain deadline (epoch seconds; None: no deadline) of every node
    being drained, from the GCS through Ray's private state API (the one Ray Train's and
    Ray Data's own preemption handling read, 2.52 to 2.60). Needs a connected driver or
    worker."""
    import ray._private.state

    raw = ray._private.state.state.get_draining_nodes()
    return {node: (deadline / 1000 if deadline else None) for node, deadline in raw.items()}


def runner_error(msg: str, code: int | None = None, command: Any = None) -> Exception:
    """The error Ray's updater expects from a failed command runner call
    (``ProcessRunnerError`` with ``msg_type="ssh_command_failed"``); imported when needed, as
    Ray's command runner module pulls in its ssh and docker runners."""
    from ray.autoscaler._private.command_runner import ProcessRunnerError

    return ProcessRunnerError(msg, "ssh_command_failed", code=code, command=command)
