"""The typed provider section: one table of keys, defaults and checks (``plan.provider_config``)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml
from testbed_support import REPO

from eray_provider.plan.cluster_config import fill_config
from eray_provider.plan.elastic_config import fill_elastic_config
from eray_provider.plan.provider_config import (
    CHECKS,
    ELASTIC_KEYS,
    OWN,
    RAY_SET_KEYS,
    ClusterConfigError,
    Filled,
    ProviderConfig,
    put_filled,
)
from eray_provider.slurm.allocation import Allocation, NodeShare

ALLOC = Allocation("7", (NodeShare("n1", 2, memory_mb=2000), NodeShare("n2", 2, memory_mb=2000)))


def _yaml(name: str) -> dict:
    return yaml.safe_load((REPO / "cluster_yamls" / name).read_text())


def test_every_key_has_a_check_and_a_typed_field_and_nothing_else_is_a_key() -> None:
    names = {f.name for f in dataclasses.fields(ProviderConfig)}
    assert set(CHECKS) == names - {"elastic"}
    assert not set(RAY_SET_KEYS) & set(CHECKS) and set(ELASTIC_KEYS) <= set(CHECKS) and OWN not in CHECKS


def test_an_unknown_key_is_refused_naming_it_and_listing_the_valid_ones_with_defaults() -> None:
    with pytest.raises(ClusterConfigError) as e:
        ProviderConfig.from_dict({"type": "external", "drain_before_end_secs": 60})
    text = str(e.value)
    assert text.startswith("provider.drain_before_end_secs is not a setting of eray-provider; valid keys: ")
    assert "drain_before_end_s (default 300)" in text and "wait_for_workers (default True)" in text
    assert "end_stagger_s" not in text  # a fixed cluster's list has no elastic keys
    with pytest.raises(ClusterConfigError, match=r"end_stagger_s \(default 60\)"):
        ProviderConfig.from_dict({"drain_before_end_secs": 60}, elastic=True)


def test_keys_the_provider_writes_and_elastic_keys_in_a_fixed_yaml_are_refused() -> None:
    with pytest.raises(ClusterConfigError, match=r"provider.use_internal_ips is set by eray-provider itself"):
        ProviderConfig.from_dict({"use_internal_ips": True})
    with pytest.raises(ClusterConfigError, match=r"provider.job_gone is not a setting"):
        ProviderConfig.from_dict({"job_gone": "x"})
    with pytest.raises(ClusterConfigError, match=r"provider.sbatch is a setting of elastic clusters"):
        ProviderConfig.from_dict({"sbatch": {"partition": "gpu"}})
    assert ProviderConfig.from_dict({"sbatch": {"partition": "gpu"}}, elastic=True).sbatch == {
        "partition": "gpu"
    }
    # a filled section holds the provider's own keys (and whatever Ray's launcher adds)
    section = {"ray_added": 1, "use_internal_ips": True}
    put_filled(section, Filled(elastic=True, job_gone="x"))
    assert ProviderConfig.from_dict(section).elastic and Filled.of(section).job_gone == "x"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("object_store_fraction", 1, "a number in (0, 1), got 1"),
        ("collect_logs_total_mb", -1, "a number of MiB, 0 or more (0: collect nothing), got -1"),
        ("wait_for_workers", "yes", "true or false, got 'yes'"),
        ("bind_all_interfaces", 1, "true or false, got 1"),
        ("job_id", "12a", "a SLURM job id (digits), got '12a'"),
        ("nodes", 3, "a hostlist string or a list of node names, got 3"),
        ("network", "", "a non-empty string, got ''"),
        ("jax_env", ["A=1"], "a mapping of names to values, got ['A=1']"),
        ("head", "login", "one of ['auto', 'job', 'allocation'], got 'login'"),
        ("pending_timeout_s", 1.5, "an integer >= 0, got 1.5"),
        ("autoscaler_interval_s", 0, "an integer >= 1, got 0"),
        ("head_start_timeout_s", 0, "a number of seconds, 1 or more, got 0"),
    ],
)
def test_a_bad_value_names_the_field_and_quotes_the_value(key: str, value: object, message: str) -> None:
    with pytest.raises(ClusterConfigError, match=re.escape(f"provider.{key} must be {message}")):
        ProviderConfig.from_dict({key: value}, elastic=True)


def test_the_defaults_live_in_one_place_and_values_come_typed() -> None:
    config = ProviderConfig.from_dict(
        {"job_id": 42, "nodes": ["n1", "n2"], "jax_env": {"X": 1}, "network": None}
    )
    assert config.job_id == "42" and config.nodes == ("n1", "n2") and config.jax_env == {"X": "1"}
    assert config.network is None and config.temp_base == "/tmp" and config.collect_logs_mb == 20
    assert config.drain_before_end_s == 300 and not config.elastic
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.temp_base = "/x"  # type: ignore[misc]


def test_elastic_leads_are_checked_together() -> None:
    with pytest.raises(ClusterConfigError, match=r"replace_before_end_s \(100\) must be more than half"):
        ProviderConfig.from_dict({"replace_before_end_s": 100, "drain_before_end_s": 300}, elastic=True)


def test_filling_refuses_an_unknown_key_and_keeps_checked_values(tmp_path: Path) -> None:
    fixed = _yaml("slurm-cluster.yaml")
    fixed["provider"]["colect_logs_mb"] = 5
    with pytest.raises(ClusterConfigError, match=r"provider\.colect_logs_mb is not a setting"):
        fill_config(fixed, ALLOC)
    fixed = _yaml("slurm-cluster.yaml")
    fixed["provider"].update(state_dir=str(tmp_path), collect_logs_mb=5)
    provider = fill_config(fixed, ALLOC)["provider"]
    settings = ProviderConfig.from_dict(provider)
    assert settings.collect_logs_mb == 5 and settings.state_dir == str(tmp_path) and not settings.elastic
    elastic = _yaml("slurm-autoscale.yaml")
    elastic["provider"]["pending_timeout"] = 60
    with pytest.raises(
        ClusterConfigError, match=r"provider.pending_timeout is not .*pending_timeout_s \(default"
    ):
        fill_elastic_config(elastic, None)
    elastic["provider"] = {**elastic["provider"], "pending_timeout_s": 60}
    del elastic["provider"]["pending_timeout"]
    settings = ProviderConfig.from_dict(fill_elastic_config(elastic, None)["provider"])
    assert settings.elastic and settings.pending_timeout_s == 60
