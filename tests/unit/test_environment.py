"""The environment contract (plan/environment.py): what the launcher hands a node and a
cluster hands its processes is written and read back by one type each, and nothing else in
the package names an ``ERAY_*`` variable."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import eray_provider
from eray_provider.errors import ConfigError
from eray_provider.plan import environment
from eray_provider.plan.environment import ClusterEnv, NodeLaunch

PKG = Path(eray_provider.__file__).parent
#: the user's own settings, and the host relay a container's SLURM client hands its commands
#: to (set by the container plan), read where they act: in the SLURM client's floor
SETTINGS = {"ERAY_STATE_DIR", "ERAY_SLURM_TIMEOUT", "ERAY_SLURM_ATTEMPTS", "ERAY_HOST_RELAY"}


@pytest.mark.parametrize(
    "launch",
    [
        NodeLaunch("/s", "c1", "42", "head", "node[1-3]@1"),
        NodeLaunch("/s", "c1", "42", "worker", elastic=True, replaces="40"),
    ],
)
def test_a_node_launch_reads_back_what_was_written(launch: NodeLaunch) -> None:
    env = {"PATH": "/bin", **launch.to_env()}
    assert NodeLaunch.from_env(env) == launch
    assert environment.launched_head_of(env, "c1") == (launch.role == "head")
    assert not environment.launched_head_of(env, "c2")


def test_a_node_launch_names_what_is_missing_or_wrong() -> None:
    env = NodeLaunch("/s", "c1", "42", "head").to_env()
    with pytest.raises(ConfigError, match=r"ERAY_CLUSTER, ERAY_ROLE not set"):
        NodeLaunch.from_env({k: v for k, v in env.items() if k not in ("ERAY_CLUSTER", "ERAY_ROLE")})
    with pytest.raises(ConfigError, match=r"ERAY_ROLE='boss' is not one of head, worker"):
        NodeLaunch.from_env({**env, "ERAY_ROLE": "boss"})


def test_the_cluster_env_reads_back_and_keeps_the_address_to_clients() -> None:
    cluster = ClusterEnv("/t", "/h", {"XLA_FLAGS": "--x"}, "42", (20240, 16), "10.0.0.5")
    env = cluster.to_env()
    assert "RAY_ADDRESS" not in env  # a node's own Ray must not inherit one
    assert environment.read_jax_ports(env) == range(20240, 20256)
    assert environment.read_head_ip(env) == "10.0.0.5" and environment.read_job_id(env) == "42"
    assert environment.read_jax_env(env) == {"XLA_FLAGS": "--x"}
    assert env["RAY_AUTH_TOKEN_PATH"] == "/t" and env["HOME"] == "/h"
    client = ClusterEnv("/t", "/h", address="[fe80::1]:6379", head_ip=environment.host_of("[fe80::1]:6379"))
    assert (
        client.to_env()["RAY_ADDRESS"] == "[fe80::1]:6379" and client.to_env()["ERAY_HEAD_IP"] == "[fe80::1]"
    )
    assert environment.read_jax_ports({}) is None
    with pytest.raises(ConfigError, match=r"ERAY_JAX_PORTS='20240' is not FIRST:COUNT"):
        environment.read_jax_ports({"ERAY_JAX_PORTS": "20240"})
    with pytest.raises(ConfigError, match=r"ERAY_JAX_ENV='\[1\]' is not a JSON object"):
        environment.read_jax_env({"ERAY_JAX_ENV": "[1]"})


def test_slurm_variables_are_hidden_from_ray_but_the_config_path() -> None:
    hidden = environment.hide_slurm({"SLURM_JOB_ID": "7", "SLURM_CONF": "/etc/s.conf", "PATH": "/bin"})
    assert hidden == {"ERAY_SLURM_JOB_ID": "7", "SLURM_CONF": "/etc/s.conf", "PATH": "/bin"}


def test_no_module_but_the_contract_names_an_eray_variable() -> None:
    literal = re.compile(r"[\"'](ERAY_[A-Z_]+)[\"']")
    found = {
        (str(p.relative_to(PKG)), m.group(1))
        for p in PKG.rglob("*.py")
        if p.name != "environment.py"
        for m in literal.finditer(p.read_text())
    }
    assert {name for _, name in found} <= SETTINGS, sorted(found)
