"""JAX helper and runtime hook logic that needs no cluster."""

from __future__ import annotations

import pytest

from eray_provider import jax as ejax
from eray_provider.jax import coordinator as meet
from eray_provider.jax import init as jax_init
from eray_provider.jax.hook import ENV_USER_HOOK, SETUP_HOOK, runtime_env_hook
from eray_provider.plan import environment


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
    monkeypatch.setattr(jax_init, "_state", {"rank": 0, "world": 2, "coordinator": "h:1"})
    with pytest.raises(ejax.JaxInitError, match=r"already initialized in this process \(rank 0 of 2"):
        ejax.initialize(1, 2, coordinator_address="127.0.0.1:1")


def test_actor_options_validate_rank() -> None:
    opts = ejax.actor_options(1, 3, group="g")
    assert opts["runtime_env"]["env_vars"][environment.RANK] == "1"
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


# ---------------------------------------------------------------- hook groups reserve their port (#13 item 7)


class FakeKV:
    """The GCS internal KV as Ray's ``_internal_kv_put`` sees it: put returns whether the key existed."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def put(self, key, value, overwrite=True):
        existed = key in self.data
        if overwrite or not existed:
            self.data[key] = value.encode() if isinstance(value, str) else value
        return existed

    def get(self, key):
        return self.data.get(key)

    def delete(self, key):
        self.data.pop(key, None)


def _alike_names() -> tuple[str, str]:
    import zlib

    seen: dict[int, str] = {}
    for i in range(1000):
        name = f"group-{i}"
        slot = zlib.crc32(name.encode()) % 16
        if slot in seen:
            return seen[slot], name
        seen[slot] = name
    raise AssertionError("unreachable")


def test_two_hook_groups_whose_names_hash_alike_get_different_ports(monkeypatch) -> None:
    import atexit

    from ray.experimental import internal_kv

    kv = FakeKV()
    monkeypatch.setattr(internal_kv, "_internal_kv_put", kv.put)
    monkeypatch.setattr(internal_kv, "_internal_kv_get", kv.get)
    monkeypatch.setattr(internal_kv, "_internal_kv_del", kv.delete)
    exits: list = []
    monkeypatch.setattr(atexit, "register", exits.append)
    monkeypatch.setenv("ERAY_JAX_PORTS", "20240:16")
    monkeypatch.setenv("ERAY_JOB_ID", "77")
    a, b = _alike_names()
    assert ejax.group_port(a) == ejax.group_port(b)  # what both used before
    port_a = ejax.reserve_group_port(a, "10.0.0.1")
    port_b = ejax.reserve_group_port(b, "10.0.0.2")
    assert port_a == ejax.group_port(a) and port_b != port_a and port_b in range(20240, 20256)
    assert kv.get(f"eray-jax-port/77/{port_a}").decode().startswith("hook 10.0.0.1 ")
    # rank 0's exit releases its own reservation only
    exits[0]()
    assert kv.get(f"eray-jax-port/77/{port_a}") is None and kv.get(f"eray-jax-port/77/{port_b}") is not None


def test_hook_groups_and_process_groups_share_one_reservation_space() -> None:
    kv = FakeKV()
    held_by_process_group = meet._port_key(20240)
    kv.put(held_by_process_group, "abc123 pgid", overwrite=False)
    port = meet._reserve(
        range(20240, 20256), 0, "hook 10.0.0.1 0 g", kv.put, kv.get, lambda held, port: False
    )
    assert port == 20241
    # a stale holder (its group gone) is reclaimed
    port = meet._reserve(range(20240, 20242), 0, "hook 10.0.0.3 0 h", kv.put, kv.get, lambda held, port: True)
    assert port == 20240 and kv.get(held_by_process_group) == b"hook 10.0.0.3 0 h"
    assert meet._reserve(range(20240, 20242), 0, "x y", kv.put, kv.get, lambda h, p: False) is None


def test_a_hook_reservation_is_stale_only_when_old_and_its_coordinator_is_gone() -> None:
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        live = server.getsockname()[1]
        now = 10_000.0
        old = f"hook 127.0.0.1 {now - meet.HOOK_GRACE - 1:.0f} my group"
        assert not meet._holder_stale(old, live, now=now)  # its coordinator answers
        young = f"hook 127.0.0.1 {now - 5:.0f} my group"
    assert not meet._holder_stale(young, live, now=now)  # reserved, not listening yet
    assert meet._holder_stale(old, live, now=now)  # closed now
    assert not meet._holder_stale("something else entirely here", live, now=now)


def test_a_publication_of_a_killed_rank_0_is_known_by_node_pid_and_time() -> None:
    published = meet.Publication("10.0.0.3:21008", "n3", 4242, "05000000", 1_000_000)
    assert meet.Publication.parse(published.text()) == published
    # an address alone (nothing says who published it): only its answer decides
    assert meet.Publication.parse("10.0.0.3:21008\n") == meet.Publication("10.0.0.3:21008")

    def dead(node: str, pid: int, end: int) -> dict:
        return {"Address": {"NodeID": node}, "Pid": pid, "EndTime": end}

    assert published.killed([dead("n1", 7, 2_000_000), dead("n3", 4242, 1_000_500)])
    assert published.killed([dead("n3", 4242, 999_500)])  # a node clock 0.5 s ahead of the GCS
    assert not published.killed([dead("n2", 4242, 2_000_000)])  # the same pid on another node
    assert not published.killed([dead("n3", 4243, 2_000_000)])
    # the pid given again: the actor that had it ended long before this one published
    assert not published.killed([dead("n3", 4242, 900_000)])
    assert not meet.Publication("10.0.0.3:21008").killed([dead("", 0, 2_000_000)])


def test_the_hook_under_its_old_path_is_never_chained_to_itself(monkeypatch) -> None:
    """A runtime env of a cluster started before the package had floors names the hook as
    eray_provider.jax_hook.setup_worker: it is the provider's own, not a user's hook (chained,
    it would call itself until RecursionError)."""
    from eray_provider.jax import hook
    from eray_provider.plan.modules import OLD_WORKER_SETUP_HOOK

    out = runtime_env_hook({"worker_process_setup_hook": OLD_WORKER_SETUP_HOOK})
    assert out["worker_process_setup_hook"] == SETUP_HOOK and ENV_USER_HOOK not in out["env_vars"]
    monkeypatch.setenv(ENV_USER_HOOK, OLD_WORKER_SETUP_HOOK)
    monkeypatch.delenv("ERAY_JAX_RANK", raising=False)
    hook.setup_worker()  # returns: no recursion, no JAX group to join


def test_the_jax_helper_never_starts_ray(tmp_path) -> None:
    """Asked for GPU ids where no Ray runs in the process (an srun step, before
    ``auto_ray_cluster``), the helper answers None and starts nothing: ``ray.get_gpu_ids()``
    there would start a private one-node Ray and write ``~/.ray`` and ``/tmp/ray``."""
    import os
    import subprocess
    import sys

    code = (
        "import ray, sys\n"
        "from eray_provider.jax import ray_gpu_ids\n"
        "print(ray_gpu_ids(), ray.is_initialized())\n"
    )
    env = {**os.environ, "HOME": str(tmp_path), "RAY_TMPDIR": str(tmp_path / "raytmp")}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["None", "False"], proc.stdout + proc.stderr[-2000:]
    assert not (tmp_path / ".ray").exists() and not (tmp_path / "raytmp").exists()
