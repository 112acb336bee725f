"""Loopback held on the cluster's ports (runtime/loopback_hold.py), tried by another Unix user.

Real sockets, real processes, a real second user: no cluster is needed to show that
another user cannot listen where our clients send the token, that Ray's own loopback
listeners still can (through the bind shim), and that a port taken first is named with
its holder.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys

import pytest
from port_blocks import reserved_plan
from testbed_support import other_user, require

from eray_provider.plan.ports import held_ranges
from eray_provider.runtime.bind_shim import bind_env, shim_path
from eray_provider.runtime.loopback_hold import PortsTakenError, hold_loopback
from eray_provider.runtime.socket_table import LISTEN, parse_table, peer_uid

#: a block no side-by-side suite binds (scripts/compat runs several)
PLAN = reserved_plan("11")

#: Bind (and listen on) one loopback address and port, with the socket options a squatter
#: may try; prints what happened for each.
SQUAT = """
import socket, sys
port = int(sys.argv[1])
out = []
for family, addr in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
    A, P = socket.SO_REUSEADDR, socket.SO_REUSEPORT
    for opts in ((), (A,), (P,), (A, P)):
        s = socket.socket(family)
        for o in opts:
            s.setsockopt(socket.SOL_SOCKET, o, 1)
        try:
            s.bind((addr, port)); s.listen(); out.append("LISTENING")
        except OSError as e:
            out.append(str(e.errno))
        s.close()
print(" ".join(out))
"""


def as_user(user: str, code: str, *args: str) -> str:
    if os.geteuid() != 0:
        require("another Unix user needs root (runuser)")
    proc = subprocess.run(
        ["runuser", "-u", user, "--", "/usr/bin/python3", "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_another_user_cannot_listen_on_a_held_port_whatever_options_it_sets() -> None:
    user = other_user()
    hold = hold_loopback(held_ranges([PLAN]))
    try:
        assert len(hold.sockets) >= 16  # every named port of the block, on 127.0.0.1 at least
        for port in (PLAN.gcs, PLAN.dashboard, PLAN.dashboard_agent_grpc, PLAN.block_start + 15):
            tries = as_user(user, SQUAT, str(port)).split()
            assert "LISTENING" not in tries, (port, tries)
    finally:
        hold.release()
    # released: the same user can listen there now (the test above could fail)
    assert "LISTENING" in as_user(user, SQUAT, str(PLAN.gcs)).split()


WILDCARD = """
import socket, sys
s = socket.socket(); s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(); print("bound")
"""


def test_worker_ports_are_not_held_a_driver_without_the_shim_binds_them_on_all_interfaces() -> None:
    hold = hold_loopback(held_ranges([PLAN]))
    try:
        plain = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        out = subprocess.run(
            [sys.executable, "-c", WILDCARD, str(PLAN.min_worker)], env=plain, capture_output=True, text=True
        )
        assert out.stdout.strip() == "bound", out.stderr
    finally:
        hold.release()


LISTEN_LOOPBACK = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp does
try:
    s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
except OSError as e:
    print("refused", e.errno, flush=True); raise SystemExit(0)
print("listening", flush=True)
a, _ = s.accept(); a.sendall(b"hi"); a.close()
"""


def listen_loopback(port: int, env: dict[str, str]) -> str:
    """What a loopback listener started with ``env`` says; a client without the shim
    (this process) connects when it listens."""
    proc = subprocess.Popen(
        [sys.executable, "-c", LISTEN_LOOPBACK, str(port)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().strip()
        if first != "listening":
            return first
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            return f"served {c.recv(2).decode()}"
    finally:
        proc.wait(timeout=10)


def test_our_own_loopback_listener_joins_the_hold_through_the_shim() -> None:
    """Ray's dashboard agent also listens on 127.0.0.1: it must still start, and be reached."""
    port = PLAN.dashboard_agent_listen
    hold = hold_loopback(held_ranges([PLAN]))
    try:
        shimmed = dict(os.environ, **bind_env(shim_path(), "127.0.0.2", [PLAN], {}))
        assert listen_loopback(port, shimmed) == "served hi"
        # without the shim the same bind is refused: the shim is what lets it join
        plain = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        assert listen_loopback(port, plain).startswith("refused")
    finally:
        hold.release()


SQUAT_AND_WAIT = """
import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
print("ready", flush=True); sys.stdin.read()
"""


def test_a_port_taken_first_fails_the_hold_naming_the_port_and_its_listener() -> None:
    user = other_user()
    if os.geteuid() != 0:
        require("another Unix user needs root (runuser)")
    port = PLAN.gcs + 5
    squatter = subprocess.Popen(
        ["runuser", "-u", user, "--", "/usr/bin/python3", "-c", SQUAT_AND_WAIT, str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert squatter.stdout is not None and squatter.stdout.readline().strip() == "ready"
        with pytest.raises(PortsTakenError) as err:
            hold_loopback(held_ranges([PLAN]))
        assert f"ports {port} " in str(err.value) and user in str(err.value), str(err.value)
        # nothing is left held when the hold fails
        probe = socket.socket()
        probe.bind(("127.0.0.1", PLAN.gcs))  # a port of the block is free again
        probe.close()
    finally:
        squatter.communicate(timeout=10)


def test_socket_table_rows_and_peer_uid() -> None:
    # the kernel prints each 32-bit word of an address in host order
    lo = f"{struct.unpack('=I', socket.inet_aton('127.0.0.1'))[0]:08X}"
    zero = "00000000"
    text = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        f"   0: {lo}:B000 {zero}:0000 0A 00000000:00000000 00:00000000 00000000  1001        0 11 1\n"
        f"   1: {lo}:C350 {lo}:B000 01 00000000:00000000 00:00000000 00000000  1002        0 12 1\n"
        f"   2: {lo}:B000 {lo}:C350 01 00000000:00000000 00:00000000 00000000  1001        0 13 1\n"
    )
    rows = parse_table(text)
    assert rows[0].local == ("127.0.0.1", 0xB000) and rows[0].state == LISTEN and rows[0].uid == 1001
    assert peer_uid(("127.0.0.1", 0xC350), ("127.0.0.1", 0xB000), rows) == 1002
    assert peer_uid(("127.0.0.1", 1), ("127.0.0.1", 0xB000), rows) is None
    words = struct.unpack("=4I", socket.inet_pton(socket.AF_INET6, "::ffff:127.0.0.1"))
    mapped = "".join(f"{w:08X}" for w in words)
    six = f"   0: {mapped}:B000 {zero * 4}:0000 0A 0:0 0:0 0 7 0 9\n"
    assert parse_table(six)[0].local == ("127.0.0.1", 0xB000)  # v4-mapped, as IPv4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_closed_connection_on_a_port_is_waited_for_a_socket_someone_holds_is_not(monkeypatch) -> None:
    """A connection that closed from a held port stays in TIME_WAIT for a minute and blocks
    the hold's bind (seen once in test_node_stop: a client's ephemeral port was a held one):
    the hold waits for it to go instead of failing the node; a listener is not waited for."""
    from eray_provider.runtime import loopback_hold

    port = _free_port()
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    client.bind(("127.0.0.1", port))
    client.connect(server.getsockname())
    conn, _ = server.accept()
    client.close()  # the side that closes first keeps TIME_WAIT: this port
    conn.close()
    server.close()
    assert loopback_hold.closed_only({port})
    listener = socket.create_server(("127.0.0.1", 0))
    try:  # a port someone listens on is never taken for a closed connection
        assert not loopback_hold.closed_only({listener.getsockname()[1]})
        assert not loopback_hold.closed_only({port, listener.getsockname()[1]})
    finally:
        listener.close()
    monkeypatch.setattr(loopback_hold, "CLOSED_WAIT_SECONDS", 0.0)
    with pytest.raises(PortsTakenError):
        hold_loopback([(port, port)])  # not waited for: the wait is bounded
    # while the closed connection lingers, each try fails; once it is gone the hold begins
    tries: list[int] = []
    real = loopback_hold.bind_held

    def bind(family: int, address: str, p: int):
        tries.append(p)
        if len(tries) <= 2:
            raise OSError(98, "Address already in use")
        return real(family, address, p)

    monkeypatch.setattr(loopback_hold, "CLOSED_WAIT_SECONDS", 30.0)
    monkeypatch.setattr(loopback_hold, "bind_held", bind)
    other = _free_port()
    monkeypatch.setattr(loopback_hold, "closed_only", lambda ports: ports == {other})
    hold = hold_loopback([(other, other)])
    assert len(tries) >= 3 and hold.sockets
    hold.release()
