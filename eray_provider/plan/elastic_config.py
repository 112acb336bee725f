"""Fill an elastic cluster YAML (``cluster_yamls/slurm-autoscale.yaml``): pure.

Worker node types are sbatch requests (``node_config.sbatch``, over the defaults in
``provider.sbatch``); their resources come from the request, so the autoscaler plans
correctly while jobs are still pending. The head runs on the first node of a job: the
user's allocation (``provider.job_id``, or the job ``ray up`` runs in), or a job of its
own that ``ray up`` submits from the head type's request (``provider.head: job``, the
default outside an allocation).
"""

from __future__ import annotations

from typing import Any

from ..slurm.allocation import Allocation
from .cluster_config import finish_filling, select_nodes, start_filling
from .node_spec import ray_resources
from .provider_config import ClusterConfigError, Filled, ProviderConfig
from .sbatch import SbatchRequest, SbatchRequestError


def head_mode(config: ProviderConfig, in_allocation: bool) -> str:
    """``job`` (the head gets a job of its own) or ``allocation`` (the user's job)."""
    mode = config.head
    if mode == "auto":
        return "allocation" if config.job_id or in_allocation else "job"
    if mode == "allocation" and not config.job_id and not in_allocation:
        raise ClusterConfigError(
            "provider.head: allocation, but this is not inside a SLURM allocation and "
            "provider.job_id is not set"
        )
    if mode == "job" and config.job_id:
        raise ClusterConfigError(
            f"provider.head: job (the head gets a job of its own) contradicts "
            f"provider.job_id: {config.job_id!r}; remove one of them"
        )
    return mode


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ClusterConfigError(f"{where} must be an integer >= 0, got {value!r}")
    return value


def node_request(config: ProviderConfig, node_config: dict[str, Any], node_type: str) -> SbatchRequest:
    """The sbatch request of a node type (its ``node_config.sbatch`` over ``provider.sbatch``)."""
    where = f"available_node_types.{node_type}.node_config.sbatch"
    if not isinstance(node_config, dict) or "sbatch" not in node_config:
        raise ClusterConfigError(f"{where} is missing: an elastic node type is an sbatch request")
    try:
        defaults = dict(config.sbatch) if config.sbatch is not None else None
        return SbatchRequest.from_config(node_config["sbatch"], defaults, where)
    except SbatchRequestError as e:
        raise ClusterConfigError(str(e)) from e


def fill_elastic_config(
    config: dict[str, Any], head_alloc: Allocation | None, python: str | None = None
) -> dict[str, Any]:
    """The launcher config; ``head_alloc`` is the head's job when it runs (else None: ``ray
    up`` will submit the head's job and complete the provider section then)."""
    out = start_filling(config)
    if out is None:
        return config
    provider = ProviderConfig.from_dict(out["provider"], elastic=True)
    keys = provider.filled_keys(python)
    head_type = out.get("head_node_type")
    types_in = out.get("available_node_types")
    if not isinstance(types_in, dict) or not isinstance(head_type, str) or head_type not in types_in:
        raise ClusterConfigError(
            f"head_node_type {head_type!r} must name one of available_node_types "
            f"({sorted(types_in) if isinstance(types_in, dict) else types_in!r})"
        )
    fraction = provider.object_store_fraction
    types: dict[str, Any] = {}
    for name, spec in types_in.items():
        if name == head_type:
            types[name] = _head_type(provider, dict(spec or {}), name, head_alloc, fraction)
        else:
            types[name] = _worker_type(provider, dict(spec or {}), name, out.get("max_workers"), fraction)
    total_max = sum(t["max_workers"] for t in types.values())
    n_workers = _count(out.get("max_workers", total_max), "max_workers")
    facts = Filled(elastic=True)
    if head_alloc is not None:
        keys.update(job_id=head_alloc.job_id)
        facts = Filled(elastic=True, allocation=select_nodes(head_alloc, provider, 0).to_dict())
    return finish_filling(out, keys, facts, types, n_workers, head_type=head_type, elastic=True)


def _head_type(
    provider: ProviderConfig, spec: dict[str, Any], name: str, head_alloc: Allocation | None, fraction: float
) -> dict[str, Any]:
    """The head's node type: the resources of its job's first node once it runs, else
    those its sbatch request asks for; never a worker."""
    node_config = spec.get("node_config") or {}
    if head_alloc is not None:
        resources = ray_resources(head_alloc.head, head_alloc.job_id, fraction)
    else:
        resources = node_request(provider, node_config, name).resources(fraction)
    return {**spec, "resources": resources, "node_config": node_config, "min_workers": 0, "max_workers": 0}


def _worker_type(
    provider: ProviderConfig, spec: dict[str, Any], name: str, cluster_max: Any, fraction: float
) -> dict[str, Any]:
    """A worker node type: its sbatch request checked, its counts checked (``max_workers``
    defaults to the cluster's, else to ``min_workers``); the user's custom resources
    stay, CPU/GPU/memory are the request's."""
    node_config = spec.get("node_config") or {}
    request = node_request(provider, node_config, name)
    low = _count(spec.get("min_workers", 0), f"available_node_types.{name}.min_workers")
    default_high = low if cluster_max is None else cluster_max
    high = _count(spec.get("max_workers", default_high), f"available_node_types.{name}.max_workers")
    if high < low:
        raise ClusterConfigError(
            f"available_node_types.{name}: max_workers ({high}) is below min_workers ({low})"
        )
    return {
        **spec,
        "resources": {**(spec.get("resources") or {}), **request.resources(fraction)},
        "node_config": node_config,
        "min_workers": low,
        "max_workers": high,
    }
