"""JAX helper and runtime hook logic that needs no cluster."""

from __future__ import annotations

import pytest

from eray_provider import jax as ejax
from eray_provider.jax_hook import ENV_USER_HOOK, SETUP_HOOK, runtime_env_hook


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((-1, 2), "process_id must be in"),
        ((2, 2), "process_id must be in"),
        ((0, 0), "num_processes must be >= 1"),
        ((0.5, 2), "process_id must be an int"),
        ((True, 2), "process_id must be an int"),
    ],
)
def test_bad_arguments_raise_value_error(args, message) -> None:
    with pytest.raises(ValueError, match=message):
        ejax.initialize(*args, coordinator_address="127.0.0.1:1")


def test_bad_coordinator_and_devices(monkeypatch) -> None:
    for bad in ("nohost", "host:", ":123", "127.0.0.1:70000"):
        with pytest.raises(ValueError, match="coordinator_address"):
            ejax.initialize(0, 1, coordinator_address=bad)
    with pytest.raises(ValueError, match="cannot resolve"):
        ejax.initialize(0, 1, coordinator_address="no-such-host.invalid:1234")
    with pytest.raises(ValueError, match="local_device_ids"):
        ejax.initialize(0, 1, coordinator_address="127.0.0.1:1", local_device_ids=[-1])
    with pytest.raises(ValueError, match="timeout"):
        ejax.initialize(0, 1, coordinator_address="127.0.0.1:1", timeout=0)


def test_defaults_need_the_cluster_variables(monkeypatch) -> None:
    monkeypatch.delenv("ERAY_JAX_PORTS", raising=False)
    monkeypatch.delenv("ERAY_HEAD_IP", raising=False)
    with pytest.raises(ejax.JaxInitError, match="ERAY_HEAD_IP"):
        ejax.initialize(0, 1)
    monkeypatch.setenv("ERAY_HEAD_IP", "10.1.2.3")
    with pytest.raises(ejax.JaxInitError, match="ERAY_JAX_PORTS"):
        ejax.initialize(0, 1)
    monkeypatch.setenv("ERAY_JAX_PORTS", "20240:16")
    monkeypatch.setenv("ERAY_HEAD_IP", "10.1.2.3")
    assert ejax.default_coordinator() == "10.1.2.3:20240"
    assert ejax.group_port("a") in range(20240, 20256)
    assert ejax.group_port("a") == ejax.group_port("a")


def test_second_initialize_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setattr(ejax, "_state", {"rank": 0, "world": 2, "coordinator": "h:1"})
    with pytest.raises(ejax.JaxInitError, match=r"already initialized in this process \(rank 0 of 2"):
        ejax.initialize(1, 2, coordinator_address="127.0.0.1:1")


def test_actor_options_validate_rank() -> None:
    opts = ejax.actor_options(1, 3, group="g")
    assert opts["runtime_env"]["env_vars"][ejax.ENV_RANK] == "1"
    with pytest.raises(ValueError, match="rank must be in"):
        ejax.actor_options(3, 3, group="g")


def test_hook_merges_and_never_drops_user_settings(monkeypatch) -> None:
    monkeypatch.setenv("ERAY_JAX_ENV", '{"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--x"}')
    out = runtime_env_hook(
        {"env_vars": {"XLA_FLAGS": "--mine"}, "pip": ["requests"], "worker_process_setup_hook": "mypkg.setup"}
    )
    assert out["pip"] == ["requests"]
    assert out["env_vars"]["JAX_PLATFORMS"] == "cpu" and out["env_vars"]["XLA_FLAGS"] == "--mine"
    assert out["worker_process_setup_hook"] == SETUP_HOOK
    assert out["env_vars"][ENV_USER_HOOK] == "mypkg.setup"
    assert runtime_env_hook(None)["worker_process_setup_hook"] == SETUP_HOOK
    monkeypatch.setenv("ERAY_JAX_ENV", "not json")
    assert runtime_env_hook({})["env_vars"] == {}
