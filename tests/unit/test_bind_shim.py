"""The preloaded bind shim (eray_provider/bindshim.c), in real processes, without Ray."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from port_blocks import reserved_plan

from eray_provider.plan.ports import plan_for_block
from eray_provider.runtime.bind_shim import BindShimError, bind_env, check_preloaded, port_ranges, shim_path

#: the processes below bind real ports: a block no side-by-side suite binds
PLAN = reserved_plan("7")
# 127.0.0.2 stands for the node's address: a local address that is not 127.0.0.1
PROBE = """
import socket, sys
base = int(sys.argv[1])
out = []
s = socket.socket(); s.bind(("", base)); s.listen(); out.append(s.getsockname()[0])
s6 = socket.socket(socket.AF_INET6); s6.bind(("::", base + 1)); s6.listen(); out.append(s6.getsockname()[0])
far = socket.socket(); far.bind(("", base + 300)); far.listen(); out.append(far.getsockname()[0])
only6 = socket.socket(socket.AF_INET6); only6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
only6.bind(("::", base + 2)); only6.listen(); out.append(only6.getsockname()[0])
c = socket.socket(); c.settimeout(5)
out.append("connected" if c.connect_ex(("127.0.0.1", base)) == 0 else "refused")
print(" ".join(out))
"""


def run_probe(env: dict[str, str]) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(PLAN.block_start + 200)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_shim_is_built_by_the_install() -> None:
    path = shim_path()
    assert path and os.path.exists(path), "pip install did not build eray_provider._bindshim"


def test_wildcard_binds_of_the_clusters_ports_go_to_the_node_and_loopback_follows() -> None:
    env = dict(os.environ, **bind_env(shim_path(), "127.0.0.2", [PLAN], {}))
    v4, v6, far, only6, connect = run_probe(env)
    assert v4 == "127.0.0.2"
    assert v6 == "::ffff:127.0.0.2"  # dual-stack wildcard -> the node's IPv4, v4-mapped
    assert far == "0.0.0.0"  # outside the cluster's block: untouched
    assert only6 == "::"  # an IPv6-only socket cannot take the v4-mapped address: untouched
    assert connect == "connected"  # 127.0.0.1:port reaches the listener on the node address
    # without the shim the same program listens on all interfaces
    plain = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    assert run_probe(plain)[:4] == ["0.0.0.0", "::", "0.0.0.0", "::"]


def test_env_and_ranges() -> None:
    first, other = plan_for_block("7", 40960), plan_for_block("8", 43008)
    # whole blocks but the dashboard's port (it binds the address it is given)
    assert port_ranges([first, other, first]) == "40960,40962-41215,43008,43010-43263"
    assert first.dashboard == 40961 and other.dashboard == 43009
    env = bind_env("/x/shim.so", "10.0.0.5", [first], {"LD_PRELOAD": "/usr/lib/libfoo.so"})
    assert env["LD_PRELOAD"] == "/x/shim.so /usr/lib/libfoo.so"
    assert env["ERAY_BIND_ADDRESS"] == "10.0.0.5" and env["ERAY_BIND_PORTS"] == "40960,40962-41215"
    assert env["ERAY_HELD_PORTS"] == "40960-40975"  # the named ports, held on loopback


def test_the_shim_reads_its_environment_once_at_load() -> None:
    """A program that changes ERAY_BIND_* after start changes nothing (read at load)."""
    env = dict(os.environ, **bind_env(shim_path(), "127.0.0.2", [PLAN], {}))
    code = (
        "import os, socket, sys\n"
        "os.environ['ERAY_BIND_PORTS'] = ''; os.environ['ERAY_BIND_ADDRESS'] = '127.0.0.3'\n"
        "s = socket.socket(); s.bind(('', int(sys.argv[1]))); print(s.getsockname()[0])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(PLAN.block_start + 210)], env=env, capture_output=True, text=True
    )
    assert proc.stdout.split() == ["127.0.0.2"], proc.stderr


def test_a_path_ld_preload_cannot_carry_is_an_error_not_a_silent_fallback(tmp_path) -> None:
    spaced = tmp_path / "a b" / "_bindshim.so"
    spaced.parent.mkdir()
    shutil.copy(shim_path(), spaced)
    with pytest.raises(BindShimError, match="LD_PRELOAD"):
        bind_env(str(spaced), "127.0.0.2", [PLAN], {})
    with pytest.raises(BindShimError, match="LD_PRELOAD"):
        bind_env("/x:y/_bindshim.so", "127.0.0.2", [PLAN], {})


def test_a_preload_the_loader_drops_is_detected(tmp_path) -> None:
    good = dict(os.environ, **bind_env(shim_path(), "127.0.0.2", [PLAN], {}))
    check_preloaded(shim_path(), good)
    broken = tmp_path / "_bindshim.so"
    broken.write_text("not an ELF file")
    env = dict(os.environ, **bind_env(str(broken), "127.0.0.2", [PLAN], {}))
    with pytest.raises(BindShimError, match="not loaded"):
        check_preloaded(str(broken), env)


def test_batch_script_quotes_the_python_path() -> None:
    import shlex

    from eray_provider.runtime.slurm_jobs import batch_script

    line = batch_script("/home/a b/venv/bin/python").splitlines()[1]
    words = shlex.split(line)
    assert words[words.index("--quiet") + 1] == "/home/a b/venv/bin/python"
