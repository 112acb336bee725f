"""The ``provider:`` section of a cluster YAML, typed: every key a user may write, with its
default and its check, in one table; parsed once wherever a config is read.

``ProviderConfig.from_dict`` refuses a key it does not know, naming it and listing the
valid ones with their defaults (a misspelt ``drain_before_end_secs`` would otherwise
leave the default in force without a word), refuses a key of elastic clusters in a
fixed one's YAML, and names the field and quotes the value of anything out of range.

The filled config (what Ray's launcher and the nodes read back from disk) holds, besides
the user's keys with their values checked, what the provider itself writes: its own facts
under ``provider._eray`` (``Filled``), and the keys of Ray's launcher it sets
(``RAY_SET_KEYS``). A user's YAML may set neither.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..slurm.allocation import Allocation
from .container import ContainerConfig
from .drain import (
    DEFAULT_DRAIN_LEAD_SECONDS,
    DEFAULT_REPLACE_LEAD_SECONDS,
    DEFAULT_STAGGER_SECONDS,
    check_replace_lead,
)
from .names import default_base
from .node_spec import DEFAULT_OBJECT_STORE_FRACTION

#: The default and the most of ``provider.collect_logs_mb``: what is kept of a node's Ray
#: logs when it ends (``runtime.node_logs``).
DEFAULT_CAP_MB = 20
MAX_CAP_MB = 10240
#: The default of ``provider.collect_logs_total_mb``: what all nodes of a cluster keep together
#: (a 10,000-node cluster would otherwise leave 20 MiB x 3 sessions a node in HOME).
DEFAULT_TOTAL_CAP_MB = 2048
#: The longest lead accepted (``drain_before_end_s``, ``replace_before_end_s``...): a week.
MAX_LEAD_S = 7 * 86400
HEAD_MODES = ("auto", "job", "allocation")
#: How long a worker job may stay pending before the autoscaler gives up on it (longer
#: than Ray's default: queues on busy clusters often are).
DEFAULT_PENDING_TIMEOUT_S = 24 * 3600
#: Seconds between the head's autoscaler rounds (``AUTOSCALER_UPDATE_INTERVAL_S``; Ray's
#: default is 5): demand reaches sbatch sooner, and a round costs the provider a few ms
#: with one squeue per ``listings.LISTING_SECONDS`` at most.
DEFAULT_AUTOSCALER_INTERVAL_S = 1
#: How long an elastic ``ray up`` waits for the head's job to start.
DEFAULT_HEAD_START_TIMEOUT_S = 900.0
#: Where the provider keeps its own facts in a section it has filled (``Filled``).
OWN = "_eray"
#: How releases before 2026-12-06 marked a filled section (their facts among the user's keys).
LEGACY_FILLED = "_eray_filled"
#: Ray's own keys of an external provider, the user's to write.
RAY_KEYS = ("type", "module")
#: Ray's key naming its config cache of a YAML.
RAY_CACHE_KEY = "_config_cache_path"
#: Ray's launcher keys the provider sets (Ray reads them); never in a YAML.
RAY_SET_KEYS = {
    "disable_node_updaters": "workers are started by the provider",
    "use_internal_ips": "nodes are reached at their addresses",
    "disable_launch_config_check": "a node's config never changes",
    RAY_CACHE_KEY: "Ray's config cache, made private by the provider",
}
#: The keys of elastic clusters only: in a fixed cluster's YAML they would do nothing.
ELASTIC_KEYS = (
    "sbatch",
    "head",
    "head_start_timeout_s",
    "pending_timeout_s",
    "autoscaler_interval_s",
    "replace_before_end_s",
    "end_stagger_s",
)


class ClusterConfigError(ConfigError):
    """The cluster YAML asks for something the allocation cannot give, or is malformed."""


# ---------------------------------------------------------------------- checks


def _number(low: float, high: float | None, what: str) -> Callable[[Any, str], float]:
    """A number in ``[low, high]``; ``what`` says so in the error."""

    def check(value: Any, where: str) -> float:
        number = not isinstance(value, bool) and isinstance(value, (int, float))
        if not number or value < low or (high is not None and value > high):
            raise ClusterConfigError(f"{where} must be {what}, got {value!r}")
        return float(value)

    return check


def _fraction(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ClusterConfigError(f"{where} must be a number in (0, 1), got {value!r}")
    return float(value)


def _integer(low: int) -> Callable[[Any, str], int]:
    def check(value: Any, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ClusterConfigError(f"{where} must be an integer >= {low}, got {value!r}")
        return value

    return check


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ClusterConfigError(f"{where} must be true or false, got {value!r}")
    return value


def _text(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ClusterConfigError(f"{where} must be a non-empty string, got {value!r}")
    return value


def _job_id(value: Any, where: str) -> str | None:
    if value is None:
        return None
    text = str(value)
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not text.strip().isdigit():
        raise ClusterConfigError(f"{where} must be a SLURM job id (digits), got {value!r}")
    return text.strip()


def _nodes(value: Any, where: str) -> str | tuple[str, ...] | None:
    if value is None or isinstance(value, str):
        return value or None
    if isinstance(value, list) and all(isinstance(n, (str, int)) for n in value):
        return tuple(str(n) for n in value)
    raise ClusterConfigError(f"{where} must be a hostlist string or a list of node names, got {value!r}")


def _string_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ClusterConfigError(f"{where} must be a mapping of names to values, got {value!r}")
    return {str(k): str(v) for k, v in value.items()}


def _mapping(value: Any, where: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ClusterConfigError(f"{where} must be a mapping, got {value!r}")
    return dict(value)


def _head(value: Any, where: str) -> str:
    if not isinstance(value, str) or value not in HEAD_MODES:
        raise ClusterConfigError(f"{where} must be one of {list(HEAD_MODES)}, got {value!r}")
    return value


def _lead(zero: str) -> Callable[[Any, str], float]:
    return _number(0, MAX_LEAD_S, f"a number of seconds from 0 ({zero}) to {MAX_LEAD_S}")


#: Each key's check: takes the YAML's value and ``provider.<key>``, returns the value typed.
CHECKS: dict[str, Callable[[Any, str], Any]] = {
    "job_id": _job_id,
    "nodes": _nodes,
    "network": _text,
    "dashboard_host": _text,
    "object_store_fraction": _fraction,
    "state_dir": _text,
    "temp_base": _text,
    "python": _text,
    "bind_all_interfaces": _flag,
    "metrics_export": _flag,
    "jax_env": _string_map,
    "collect_logs_mb": _number(0, MAX_CAP_MB, f"a number of MiB from 0 (collect nothing) to {MAX_CAP_MB}"),
    "collect_logs_total_mb": _number(0, None, "a number of MiB, 0 or more (0: collect nothing)"),
    "drain_before_end_s": _lead("never drain"),
    "wait_for_workers": _flag,
    "sbatch": _mapping,
    "head": _head,
    "head_start_timeout_s": _number(1, None, "a number of seconds, 1 or more"),
    "pending_timeout_s": _integer(0),
    "autoscaler_interval_s": _integer(1),
    "replace_before_end_s": _lead("replace once gone"),
    "end_stagger_s": _lead("no stagger"),
    "container": ContainerConfig.from_value,
}


@dataclass(frozen=True)
class ProviderConfig:
    """A provider section, checked. The defaults here are the only ones."""

    #: attach to this running job (default: ``$SLURM_JOB_ID``)
    job_id: str | None = None
    #: a subset of the job's nodes (a hostlist, or a list), the first is the head
    nodes: str | tuple[str, ...] | None = None
    #: CIDR of the network Ray uses on nodes with several
    network: str | None = None
    #: address the dashboard binds (default: the head's address)
    dashboard_host: str | None = None
    object_store_fraction: float = DEFAULT_OBJECT_STORE_FRACTION
    #: where cluster state lives (default ``$ERAY_STATE_DIR`` or ``~/.eray-provider``)
    state_dir: str | None = None
    temp_base: str = "/tmp"
    #: the Python every node runs Ray from (default: the interpreter that filled the config)
    python: str | None = None
    bind_all_interfaces: bool = False
    metrics_export: bool = False
    jax_env: Mapping[str, str] = field(default_factory=dict)
    collect_logs_mb: float = DEFAULT_CAP_MB
    collect_logs_total_mb: float = DEFAULT_TOTAL_CAP_MB
    drain_before_end_s: float = DEFAULT_DRAIN_LEAD_SECONDS
    wait_for_workers: bool = True
    #: every node's Ray in this image (``plan.container``); None: on the nodes themselves
    container: ContainerConfig | None = None
    # elastic clusters only (ELASTIC_KEYS)
    sbatch: Mapping[str, Any] | None = None
    head: str = "auto"
    head_start_timeout_s: float = DEFAULT_HEAD_START_TIMEOUT_S
    pending_timeout_s: int = DEFAULT_PENDING_TIMEOUT_S
    autoscaler_interval_s: int = DEFAULT_AUTOSCALER_INTERVAL_S
    replace_before_end_s: float = DEFAULT_REPLACE_LEAD_SECONDS
    end_stagger_s: float = DEFAULT_STAGGER_SECONDS
    #: not a key of the YAML: which provider the section is for (``Filled.elastic``)
    elastic: bool = False

    @classmethod
    def from_dict(cls, provider: Mapping[str, Any], elastic: bool | None = None) -> ProviderConfig:
        """Parse a provider section: the user's (``elastic`` says which provider it is
        for) or a filled one (its ``elastic`` key says). Raises ``ClusterConfigError``
        naming the key and quoting the value."""
        if not isinstance(provider, Mapping):
            raise ClusterConfigError(f"provider must be a mapping, got {provider!r}")
        filled = is_filled(provider)
        elastic = is_elastic(provider) if elastic is None else elastic
        if not filled:  # the user's: checked whole once, when it is filled
            _refuse_unknown(provider, elastic)
        values = {
            key: CHECKS[key](value, f"provider.{key}") for key, value in provider.items() if key in CHECKS
        }
        config = cls(**{k: v for k, v in values.items() if v is not None or k in _OPTIONAL}, elastic=elastic)
        if elastic:
            clash = check_replace_lead(config.replace_before_end_s, config.drain_before_end_s)
            if clash:
                raise ClusterConfigError(clash)
        return config

    def state_base(self) -> str:
        """``state_dir`` (default ``~/.eray-provider``), absolute: the head, whose HOME is
        the cluster's, must find the same state."""
        return str(Path(self.state_dir or default_base()).expanduser().resolve())

    def filled_keys(self, python: str | None) -> dict[str, Any]:
        """The checked values the filled section keeps (with the state dir absolute and the
        Python chosen: ``python``, else ``provider.python``, else this interpreter)."""
        out = {
            "state_dir": self.state_base(),
            # in a container: the image's (this interpreter's path means nothing there)
            "python": python or self.python or ("python3" if self.container else sys.executable),
            "object_store_fraction": self.object_store_fraction,
            "collect_logs_mb": self.collect_logs_mb,
            "collect_logs_total_mb": self.collect_logs_total_mb,
            "drain_before_end_s": self.drain_before_end_s,
            # workers are started by the provider itself (node_run), never by Ray's updaters
            "disable_node_updaters": True,
            "use_internal_ips": True,
        }
        if self.container is not None:
            out["container"] = self.container.to_dict()
        if self.elastic:
            out.update(
                replace_before_end_s=self.replace_before_end_s,
                end_stagger_s=self.end_stagger_s,
                pending_timeout_s=self.pending_timeout_s,
                autoscaler_interval_s=self.autoscaler_interval_s,
            )
        return out


_OPTIONAL = {f.name for f in fields(ProviderConfig) if f.default is None}


def _refuse_unknown(provider: Mapping[str, Any], elastic: bool) -> None:
    """A key that is no setting, one the provider writes itself, or one of elastic
    clusters in a fixed cluster's section, is an error naming it. (A filled section may
    hold what Ray's launcher adds to it: its keys were checked when it was filled.)"""
    for key in provider:
        if key in CHECKS or key in RAY_KEYS:
            continue
        if key in RAY_SET_KEYS:
            raise ClusterConfigError(
                f"provider.{key} is set by eray-provider itself ({RAY_SET_KEYS[key]}), not in a YAML"
            )
        raise ClusterConfigError(f"provider.{key} is not a setting of eray-provider; {valid_keys(elastic)}")
    if not elastic:
        extra = [k for k in ELASTIC_KEYS if k in provider]
        if extra:
            raise ClusterConfigError(
                f"provider.{extra[0]} is a setting of elastic clusters (eray_provider.SlurmJobProvider, "
                "cluster_yamls/slurm-autoscale.yaml); this cluster's provider is the fixed one"
            )


def valid_keys(elastic: bool) -> str:
    """The keys a user may write, each with its default: for error messages."""
    defaults = {f.name: f.default for f in fields(ProviderConfig) if f.name in CHECKS}
    defaults["jax_env"] = {}
    shown = [f"{key} (default {defaults[key]!r})" for key in CHECKS if elastic or key not in ELASTIC_KEYS]
    return "valid keys: " + ", ".join(shown)


@dataclass(frozen=True)
class Filled:
    """What the provider itself writes into a provider section it fills (under ``_eray``):
    facts about the cluster, never settings. Read with ``Filled.of``, changed with
    ``update_filled``."""

    #: the section is an elastic cluster's (``SlurmJobProvider``)
    elastic: bool = False
    #: the head's job as SLURM gave it (``Allocation.to_dict``); None until it runs
    allocation: Mapping[str, Any] | None = None
    #: why the cluster's job has ended: the cluster is gone
    job_gone: str | None = None
    #: ``provider.job_id`` came from the YAML (not from ``$SLURM_JOB_ID``)
    job_id_from_config: bool = False
    #: the head runs in a job an elastic ``ray up`` submitted
    head_job_owned: bool = False
    #: Ray's config cache of this YAML, made private by the provider (``config_cache``)
    cache_path: str | None = None
    #: ``setup_commands`` + ``worker_setup_commands`` as Ray merged them (node_run runs them)
    worker_setup_commands: tuple[str, ...] = ()

    @classmethod
    def of(cls, provider: Mapping[str, Any]) -> Filled:
        """The provider's facts of a filled section (all defaults for one not filled). A
        section an earlier release filled (a Ray config cache left in /tmp, the saved
        config of a cluster started before an upgrade) kept them among the user's keys."""
        own = provider.get(OWN) or (_legacy_facts(provider) if LEGACY_FILLED in provider else {})
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in own.items() if k in known}
        if "worker_setup_commands" in values:
            values["worker_setup_commands"] = tuple(values["worker_setup_commands"])
        return cls(**values)

    def head_allocation(self) -> Allocation:
        """The head's job as SLURM gave it; ``ClusterConfigError`` when the section was
        filled before that job ran (or not by the provider)."""
        if self.allocation is None:
            raise ClusterConfigError("the provider config names no allocation (not filled for a running job)")
        return Allocation.from_dict(dict(self.allocation))

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["worker_setup_commands"] = list(self.worker_setup_commands)
        if self.allocation is not None:
            out["allocation"] = dict(self.allocation)
        return out


def is_filled(provider: Mapping[str, Any]) -> bool:
    """Whether the provider has filled this section (filling is idempotent: Ray calls the
    provider's fillout more than once), in this release or an earlier one."""
    return OWN in provider or LEGACY_FILLED in provider


def _legacy_facts(provider: Mapping[str, Any]) -> dict[str, Any]:
    """The section as an earlier release kept ``Filled``'s fields, among the user's keys
    (``Filled.of`` takes those it knows)."""
    return {"cache_path" if key == "_eray_cache_path" else key: value for key, value in provider.items()}


def put_filled(provider: dict[str, Any], facts: Filled) -> None:
    """Write the provider's facts into a section (in place): it is filled from then on."""
    provider[OWN] = facts.to_dict()


def update_filled(provider: dict[str, Any], **changes: Any) -> Filled:
    """Change the provider's facts in a section (in place); returns them."""
    facts = replace(Filled.of(provider), **changes)
    put_filled(provider, facts)
    return facts


def ray_cache_path(provider: Mapping[str, Any]) -> str | None:
    """Where Ray's launcher cached this config (its own key), if it says."""
    return provider.get(RAY_CACHE_KEY)


def set_ray_cache_path(provider: dict[str, Any], path: str | None) -> None:
    """Name Ray's config cache in a section (Ray's key, and the provider's own fact), or
    forget it (None: the head's copy, where a launcher's /tmp path means nothing)."""
    if path is None:
        provider.pop(RAY_CACHE_KEY, None)
    else:
        provider[RAY_CACHE_KEY] = path
    if is_filled(provider):
        update_filled(provider, cache_path=path)


def is_elastic(provider: Mapping[str, Any]) -> bool:
    """Whether a filled provider section is an elastic cluster's."""
    return Filled.of(provider).elastic


def put_head_job(provider: dict[str, Any], job: str, allocation: Mapping[str, Any] | None) -> None:
    """Complete a filled elastic section with the head's job, which ``ray up`` submitted
    after the section was filled."""
    provider["job_id"] = job
    update_filled(provider, allocation=allocation, head_job_owned=True, job_id_from_config=True)


def elastic_module(provider: Mapping[str, Any]) -> bool:
    """Whether a user's provider section is for the elastic provider (Ray's ``module`` key)."""
    return str(provider.get("module", "")).rsplit(".", 1)[-1] == "SlurmJobProvider"
