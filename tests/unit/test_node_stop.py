"""A node process stopped before its Ray runs: ``ray down``, ``scancel`` or a preemption
reach node_run during its setup commands, its wait for the head, or an elastic
replacement's stand-by. Each phase must leave the exit marker (the provider's word that
the node is over) and remove the node's temp dir (nothing else removes an elastic node's).

The node process here is the real ``python -m eray_provider.runtime.node_run`` with the
environment a launch gives it, and the signal is a real SIGTERM, as slurmstepd sends it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from port_blocks import reserved_plan
from testbed_support import wait_until

from eray_provider.plan.environment import NodeLaunch
from eray_provider.plan.modules import NODE_RUN, RAY_GATE, python_m
from eray_provider.plan.provider_config import Filled, put_filled
from eray_provider.runtime.cluster_state import ClusterState
from eray_provider.runtime.launch import encode_node_ids
from eray_provider.slurm.allocation import Allocation, NodeShare

JOB = "93"
#: below the host's ephemeral range (a client connection's port in TIME_WAIT on a held port
#: would fail the node's hold, seen once at 46080), and bound by no side-by-side suite
PLAN = reserved_plan(JOB)


def _cluster(tmp_path: Path, setup: list[str]) -> ClusterState:
    state = ClusterState("stopper", JOB, tmp_path / "state")
    state.create()
    state.save_ports(PLAN)
    alloc = Allocation(JOB, (NodeShare("headnode", 1), NodeShare("nodeA", 1)))
    provider = {"temp_base": str(tmp_path), "object_store_fraction": 0.3}
    put_filled(provider, Filled(allocation=alloc.to_dict(), worker_setup_commands=tuple(setup)))
    state.save_cluster_config({"provider": provider})
    return state


def _start(state: ClusterState, replaces: str | None = None) -> tuple[subprocess.Popen, str]:
    (node_id,) = state.add_nodes([("nodeA", "worker", {})])
    launch = NodeLaunch(
        state_base=str(state.base),
        cluster=state.cluster_name,
        job_id=JOB,
        role="worker",
        node_ids=encode_node_ids({"nodeA": node_id}),
        replaces=replaces,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "ERAY_"))}
    env.update(launch.to_env(), SLURMD_NODENAME="nodeA")
    proc = subprocess.Popen(
        python_m(sys.executable, NODE_RUN),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, node_id


def _gates(pid: int) -> list[int]:
    """The node process's children that are its Ray CLI waiting to be told its line
    (``runtime.ray_gate``)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    found = []
    for child in children:
        try:
            if RAY_GATE in Path(f"/proc/{child}/cmdline").read_bytes().decode().replace("\0", " "):
                found.append(int(child))
        except FileNotFoundError:
            pass
    return found


def _stop_and_check(state: ClusterState, proc: subprocess.Popen, node_id: str, gate: bool = True) -> None:
    """Stops the node process and checks what it leaves: with ``gate``, its Ray CLI is
    loading meanwhile (after the setup commands, never during them) and must end with it."""
    _node, dirs = state.temp_dirs(node_id)
    assert dirs and all(Path(d).is_dir() for d in dirs), dirs
    gates = _gates(proc.pid)
    assert len(gates) == (1 if gate else 0), gates
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert not [g for g in gates if Path(f"/proc/{g}").exists()], "the gate outlived the node process"
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert state.read_marker(node_id, "exit") == str(128 + signal.SIGTERM), out
    assert "stopped by SIGTERM before its Ray ran" in out, out
    assert not [d for d in dirs if Path(d).exists()], dirs


def test_sigterm_during_the_setup_commands(tmp_path) -> None:
    state = _cluster(tmp_path, ["echo setup-running > {}; exec sleep 120".format(tmp_path / "setup")])
    proc, node_id = _start(state)
    try:
        wait_until("its setup command", (tmp_path / "setup").exists, proc, timeout=60)
        _stop_and_check(state, proc, node_id, gate=False)
    finally:
        proc.kill()


def test_sigterm_while_waiting_for_the_head(tmp_path) -> None:
    state = _cluster(tmp_path, [])
    proc, node_id = _start(state)
    try:
        wait_until("the head's wait", lambda: bool(state.temp_dirs(node_id)[1]), proc, timeout=60)
        time.sleep(0.5)  # inside wait_for_head's loop: no head is recorded
        assert proc.poll() is None
        _stop_and_check(state, proc, node_id)
    finally:
        proc.kill()


def test_sigterm_while_a_replacement_stands_by(tmp_path) -> None:
    state = _cluster(tmp_path, [])
    (head,) = state.add_nodes([("headnode", "head", {})])
    gcs = socket.socket()  # the head's GCS accepts connections: the worker goes on to stand by
    gcs.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # beside the node's loopback hold
    gcs.bind(("127.0.0.1", PLAN.gcs))
    gcs.listen()
    state.write_marker(head, "ip", "127.0.0.1")
    state.write_temp_dirs(head, "headnode", [str(tmp_path / "head-tmp")])
    proc, node_id = _start(state, replaces="4242")
    try:
        wait_until(
            "its stand-by", lambda: state.read_marker(node_id, "standby") is not None, proc, timeout=60
        )
        _stop_and_check(state, proc, node_id)
    finally:
        proc.kill()
        gcs.close()


@pytest.mark.parametrize("signum", [signal.SIGINT])
def test_sigint_is_a_stop_too(tmp_path, signum) -> None:
    state = _cluster(tmp_path, [])
    proc, node_id = _start(state)
    try:
        wait_until("the head's wait", lambda: bool(state.temp_dirs(node_id)[1]), proc, timeout=60)
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=60)
        assert state.read_marker(node_id, "exit") == str(128 + signum), out
    finally:
        proc.kill()
