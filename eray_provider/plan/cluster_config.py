"""Fill a user's small cluster YAML with everything Ray's launcher needs, from the allocation.

Pure: ``fill_config(config, allocation)`` returns a new dict. Node types and their
resources come from SLURM, so nobody writes resources by hand; min and max workers are
the allocation's other nodes (or the first ``max_workers`` of them). A config that asks
for more than the allocation holds fails here, before anything starts.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from ..slurm.allocation import Allocation
from ..slurm.hostlist import HostlistError, expand
from .names import check_cluster_name
from .node_spec import HEAD_TYPE, node_resource, node_type_config, ray_resources, worker_types
from .provider_config import (
    ClusterConfigError,
    Filled,
    ProviderConfig,
    elastic_module,
    is_filled,
    put_filled,
    update_filled,
)

#: The head's start command: the command runner recognises it and launches the head's
#: long-lived step from the launcher host instead of running it inside a short step.
LAUNCH_HEAD = "eray-provider-launch-head: ray start --head --autoscaling-config=~/ray_bootstrap_config.yaml"


def select_nodes(alloc: Allocation, config: ProviderConfig, max_workers: int) -> Allocation:
    """The allocation restricted to ``provider.nodes`` (head first) and ``max_workers``."""
    names = alloc.node_names
    spec = config.nodes
    if spec:
        try:
            wanted = expand(spec) if isinstance(spec, str) else list(spec)
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
    state_dir = ProviderConfig.from_dict(provider, elastic=elastic_module(provider)).state_base()
    provider.update(job_id=str(job_id), state_dir=state_dir)
    update_filled(provider, elastic=elastic_module(provider), job_gone=reason)
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


def start_filling(config: dict[str, Any]) -> dict[str, Any] | None:
    """A copy of ``config`` to fill, its cluster name checked; None when it is filled
    already (filling is idempotent: Ray calls the provider's fillout more than once)."""
    if is_filled(config.get("provider", {})):
        return None
    check_cluster_name(config.get("cluster_name"))
    return copy.deepcopy(config)


def finish_filling(
    out: dict[str, Any],
    provider_keys: dict[str, Any],
    facts: Filled,
    types: dict[str, Any],
    n_workers: int,
    **launcher: Any,
) -> dict[str, Any]:
    """Fill ``out``'s provider section with ``provider_keys`` and the provider's ``facts``,
    and set the launcher's keys (``set_launcher_keys``); returns it."""
    provider = out["provider"]
    provider.update(provider_keys)
    set_launcher_keys(out, types, n_workers, **launcher)
    # Ray has already merged setup_commands into worker_setup_commands; node_run runs them
    put_filled(provider, replace(facts, worker_setup_commands=tuple(out["worker_setup_commands"])))
    return out


def fill_config(config: dict[str, Any], alloc: Allocation, python: str | None = None) -> dict[str, Any]:
    """The launcher config for ``alloc``; idempotent on an already filled config."""
    out = start_filling(config)
    if out is None:
        return config
    try:
        max_workers = int(out.get("max_workers", -1))
    except (TypeError, ValueError) as e:
        raise ClusterConfigError(f"max_workers must be an integer, got {out.get('max_workers')!r}") from e
    settings = ProviderConfig.from_dict(out["provider"], elastic=False)
    fraction = settings.object_store_fraction
    alloc = select_nodes(alloc, settings, max_workers)

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
        **settings.filled_keys(python),
        "job_id": alloc.job_id,
        # a node's config is its SLURM node, which never changes: the v1 autoscaler's
        # check would take the workers started with the head (launched before any
        # launch hash exists) for outdated and replace them (v2's default is the same)
        "disable_launch_config_check": True,
    }
    return finish_filling(out, keys, Filled(allocation=alloc.to_dict()), types, len(alloc.workers))
