"""Fill a user's small cluster YAML with everything Ray's launcher needs, from the allocation.

Pure: ``fill_config(config, allocation)`` returns a new dict. Node types and their
resources come from SLURM, so nobody writes resources by hand; min and max workers are
the allocation's other nodes (or the first ``max_workers`` of them). A config that asks
for more than the allocation holds fails here, before anything starts.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..slurm.allocation import Allocation
from ..slurm.hostlist import HostlistError, expand
from ..slurm.walltime import DEFAULT_DRAIN_LEAD_SECONDS
from .names import check_cluster_name, default_base
from .node_spec import (
    DEFAULT_OBJECT_STORE_FRACTION,
    HEAD_TYPE,
    node_resource,
    node_type_config,
    ray_resources,
    worker_types,
)

#: The head's start command: the command runner recognises it and launches the head's
#: long-lived step from the launcher host instead of running it inside a short step.
LAUNCH_HEAD = "eray-provider-launch-head: ray start --head --autoscaling-config=~/ray_bootstrap_config.yaml"
FILLED = "_eray_filled"
#: The default and the most of ``provider.collect_logs_mb``: what is kept of a node's Ray
#: logs when it ends (``runtime.node_logs``).
DEFAULT_CAP_MB = 20
MAX_CAP_MB = 10240
#: The default of ``provider.collect_logs_total_mb``: what all nodes of a cluster keep together
#: (a 10,000-node cluster would otherwise leave 20 MiB x 3 sessions a node in HOME).
DEFAULT_TOTAL_CAP_MB = 2048


class ClusterConfigError(ConfigError):
    """The cluster YAML asks for something the allocation cannot give."""


def select_nodes(alloc: Allocation, provider: dict[str, Any], max_workers: int) -> Allocation:
    """The allocation restricted to ``provider.nodes`` (head first) and ``max_workers``."""
    names = alloc.node_names
    if provider.get("nodes"):
        spec = provider["nodes"]
        try:
            wanted = expand(spec) if isinstance(spec, str) else [str(n) for n in spec]
        except HostlistError as e:
            raise ClusterConfigError(f"provider.nodes: {e}") from e
        outside = [n for n in wanted if n not in names]
        if outside:
            raise ClusterConfigError(
                f"provider.nodes names {outside} outside job {alloc.job_id}, whose nodes are "
                f"{', '.join(names)}"
            )
        names = wanted
    workers = len(names) - 1
    if max_workers > workers:
        raise ClusterConfigError(
            f"max_workers: {max_workers} but job {alloc.job_id} has only {workers} node(s) "
            f"besides the head ({', '.join(names)}); use -1 for all of them"
        )
    if max_workers >= 0:
        names = names[: max_workers + 1]
    return replace(alloc, nodes=tuple(alloc.node(n) for n in names))


def gone_config(config: dict[str, Any], job_id: str, reason: str) -> dict[str, Any]:
    """A valid config for a job that has ended: lets ``ray down`` and friends report the
    cluster as gone instead of failing on a missing allocation."""
    out = copy.deepcopy(config)
    provider = out["provider"]
    provider.update(job_id=str(job_id), job_gone=reason, state_dir=state_base(provider), **{FILLED: True})
    types = {HEAD_TYPE: {"resources": {}, "node_config": {}, "min_workers": 0, "max_workers": 0}}
    set_launcher_keys(out, types, 0)
    return out


def set_launcher_keys(
    out: dict[str, Any],
    types: dict[str, Any],
    n_workers: int,
    head_type: str = HEAD_TYPE,
    elastic: bool = False,
) -> None:
    """Every key Ray's launcher reads, with the values a SLURM cluster needs. A fixed
    allocation's nodes are all wanted at once and never idle out; an elastic cluster
    keeps the user's (or Ray's) pace and idle timeout."""
    if not elastic:
        out["upscaling_speed"] = max(float(out.get("upscaling_speed", 0) or 0), 1000.0)
        out["idle_timeout_minutes"] = out.get("idle_timeout_minutes", 60 * 24 * 365)
    out.update(
        {
            "max_workers": n_workers,
            "available_node_types": types,
            "head_node_type": head_type,
            "auth": out.get("auth") or {},
            "file_mounts": out.get("file_mounts") or {},
            "cluster_synced_files": out.get("cluster_synced_files") or [],
            "file_mounts_sync_continuously": False,
            "rsync_exclude": out.get("rsync_exclude") or [],
            "rsync_filter": out.get("rsync_filter") or [],
            "initialization_commands": out.get("initialization_commands") or [],
            "head_start_ray_commands": [LAUNCH_HEAD],
            # never run: workers start through the provider (node_run), which runs
            # setup_commands + worker_setup_commands itself
            "worker_start_ray_commands": [],
        }
    )
    for key in ("setup_commands", "head_setup_commands", "worker_setup_commands"):
        out[key] = list(out.get(key) or [])


#: The longest lead accepted (``drain_before_end_s``, ``replace_before_end_s``...): a week.
MAX_LEAD_S = 7 * 86400


def state_base(provider: dict[str, Any]) -> str:
    """``provider.state_dir`` (default ``~/.eray-provider``), absolute: the head, whose
    HOME is the cluster's, must find the same state."""
    return str(Path(provider.get("state_dir") or default_base()).expanduser().resolve())


def common_provider_keys(provider: dict[str, Any], python: str | None) -> dict[str, Any]:
    """The provider keys of both kinds of cluster (fixed and elastic), checked; ``python``
    overrides ``provider.python`` (default: this interpreter)."""
    value = provider.get("object_store_fraction", DEFAULT_OBJECT_STORE_FRACTION)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ClusterConfigError(f"provider.object_store_fraction must be a number in (0, 1), got {value!r}")
    mb = provider.get("collect_logs_mb", DEFAULT_CAP_MB)
    if isinstance(mb, bool) or not isinstance(mb, (int, float)) or not 0 <= mb <= MAX_CAP_MB:
        raise ClusterConfigError(
            f"provider.collect_logs_mb must be a number of MiB from 0 (collect nothing) to {MAX_CAP_MB}, "
            f"got {mb!r}"
        )
    total = provider.get("collect_logs_total_mb", DEFAULT_TOTAL_CAP_MB)
    if isinstance(total, bool) or not isinstance(total, (int, float)) or total < 0:
        raise ClusterConfigError(
            f"provider.collect_logs_total_mb must be a number of MiB, 0 or more (0: collect nothing), "
            f"got {total!r}"
        )
    lead = lead_seconds(provider, "drain_before_end_s", DEFAULT_DRAIN_LEAD_SECONDS, "never drain")
    return {
        "state_dir": state_base(provider),
        "python": python or provider.get("python") or sys.executable,
        "object_store_fraction": float(value),
        "collect_logs_mb": mb,
        "collect_logs_total_mb": total,
        "drain_before_end_s": lead,
        # workers are started by the provider itself (node_run), never by Ray's updaters
        "disable_node_updaters": True,
        "use_internal_ips": True,
    }


def start_filling(config: dict[str, Any]) -> dict[str, Any] | None:
    """A copy of ``config`` to fill, its cluster name checked; None when it is filled
    already (filling is idempotent: Ray calls the provider's fillout more than once)."""
    if config.get("provider", {}).get(FILLED):
        return None
    check_cluster_name(config.get("cluster_name"))
    return copy.deepcopy(config)


def finish_filling(
    out: dict[str, Any], provider_keys: dict[str, Any], types: dict[str, Any], n_workers: int, **launcher: Any
) -> dict[str, Any]:
    """Mark ``out`` filled with ``provider_keys`` and set the launcher's keys
    (``set_launcher_keys``); returns it."""
    provider = out["provider"]
    provider.update({**provider_keys, FILLED: True})
    set_launcher_keys(out, types, n_workers, **launcher)
    # Ray has already merged setup_commands into worker_setup_commands; node_run runs them
    provider["worker_setup_commands"] = out["worker_setup_commands"]
    return out


def lead_seconds(provider: dict[str, Any], key: str, default: float, zero: str) -> float:
    """``provider.<key>``: seconds from 0 (``zero`` says what 0 means) to a week."""
    value = provider.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_LEAD_S:
        raise ClusterConfigError(
            f"provider.{key} must be a number of seconds from 0 ({zero}) to {MAX_LEAD_S}, got {value!r}"
        )
    return float(value)


def fill_config(config: dict[str, Any], alloc: Allocation, python: str | None = None) -> dict[str, Any]:
    """The launcher config for ``alloc``; idempotent on an already filled config."""
    out = start_filling(config)
    if out is None:
        return config
    provider = out["provider"]
    try:
        max_workers = int(out.get("max_workers", -1))
    except (TypeError, ValueError) as e:
        raise ClusterConfigError(f"max_workers must be an integer, got {out.get('max_workers')!r}") from e
    common = common_provider_keys(provider, python)
    fraction = common["object_store_fraction"]
    wait = provider.get("wait_for_workers", True)
    if not isinstance(wait, bool):
        raise ClusterConfigError(f"provider.wait_for_workers must be true or false, got {wait!r}")
    alloc = select_nodes(alloc, provider, max_workers)

    head_res = ray_resources(alloc.head, alloc.job_id, fraction)
    types: dict[str, Any] = {
        HEAD_TYPE: {
            "resources": head_res,
            "labels": {"slurm-job": alloc.job_id},
            "node_config": {"slurm_nodes": [alloc.head.name]},
            "min_workers": 0,
            "max_workers": 0,
        }
    }
    for name, shares in worker_types(alloc).items():
        types[name] = node_type_config(shares, alloc.job_id, fraction)
    # the head keeps its pinning resource even though RAY_OVERRIDE_RESOURCES replaces its own
    assert node_resource(alloc.head.name) in head_res

    keys = {
        **common,
        "job_id": alloc.job_id,
        "allocation": alloc.to_dict(),
        # a node's config is its SLURM node, which never changes: the v1 autoscaler's
        # check would take the workers started with the head (launched before any
        # launch hash exists) for outdated and replace them (v2's default is the same)
        "disable_launch_config_check": True,
    }
    return finish_filling(out, keys, types, len(alloc.workers))
