"""The JAX differences in ``jax_compat``, against the installed JAX (the suite runs on the
oldest and the newest supported JAX) and against the shape of the other end of the range."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import jax

from eray_provider.jax.compat import distributed_initialized, enable_cpu_collectives, initialize_options


def test_not_initialized_in_a_fresh_process_on_this_jax() -> None:
    assert distributed_initialized(jax) is False


def test_a_jax_without_is_initialized_is_read_from_its_global_state() -> None:
    old = SimpleNamespace(distributed=SimpleNamespace(initialize=jax.distributed.initialize))
    assert distributed_initialized(old) is False


def test_the_global_state_fallback_sees_a_client(monkeypatch) -> None:
    from jax._src import distributed

    monkeypatch.setattr(distributed.global_state, "client", object())
    old = SimpleNamespace(distributed=SimpleNamespace(initialize=jax.distributed.initialize))
    assert distributed_initialized(old) is True


def test_options_are_the_ones_this_jax_takes() -> None:
    params = inspect.signature(jax.distributed.initialize).parameters
    options = initialize_options(jax, "10.0.0.1:6000")
    assert set(options) <= set(params)
    assert options.get("coordinator_bind_address", "10.0.0.1:6000") == "10.0.0.1:6000"
    assert options.get("cluster_detection_method", "deactivate") == "deactivate"
    assert ("cluster_detection_method" in options) == ("cluster_detection_method" in params)


def test_an_older_initialize_gets_no_option_it_lacks() -> None:
    def initialize(coordinator_address=None, num_processes=None, process_id=None, local_device_ids=None):
        raise AssertionError("not called")

    old = SimpleNamespace(distributed=SimpleNamespace(initialize=initialize))
    assert initialize_options(old, "h:1") == {}


def test_cpu_collectives_are_on_after_the_call() -> None:
    """Whatever this JAX's default, cross-process collectives on CPU are not "none" after."""
    before = jax.config.values.get("jax_cpu_collectives_implementation")
    try:
        enable_cpu_collectives(jax)
        after = jax.config.values.get("jax_cpu_collectives_implementation")
        assert after in ("gloo", "mpi") and (before == "none" or after == before)
    finally:
        jax.config.update("jax_cpu_collectives_implementation", before)
