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
from testbed_support import wait_until

from eray_provider.plan.environment import NodeLaunch
from eray_provider.plan.modules import NODE_RUN, RAY_GATE, python_m
from eray_provider.plan.ports import plan_for_block
from eray_provider.plan.provider_config import Filled, put_filled
from eray_provider.runtime.cluster_state import ClusterState
from eray_provider.runtime.launch import encode_node_ids
from eray_provider.runtime.node_run import NodeRunError, await_release
from eray_provider.slurm.allocation import Allocation, NodeShare

JOB = "93"
#: below the host's ephemeral range (32768-60999 here): a client connection's port in
#: TIME_WAIT on a held port would fail the node's hold (seen once: 46080)
PLAN = plan_for_block(JOB, 12800)


def _cluster(tmp_path: Path, setup: list[str], head_setup: bool = False) -> ClusterState:
    state = ClusterState("stopper", JOB, tmp_path / "state")
    state.create()
    state.save_ports(PLAN)
    alloc = Allocation(JOB, (NodeShare("headnode", 1), NodeShare("nodeA", 1)))
    provider = {"temp_base": str(tmp_path), "object_store_fraction": 0.3}
    facts = Filled(allocation=alloc.to_dict(), worker_setup_commands=tuple(setup), head_setup=head_setup)
    put_filled(provider, facts)
    state.save_cluster_config({"provider": provider})
    return state


def _start(
    state: ClusterState, replaces: str | None = None, role: str = "worker"
) -> tuple[subprocess.Popen, str]:
    """The node process of a new node (``role`` on ``headnode``, else on ``nodeA``), launched
    as the launcher does: a head waits for its release on its stdin, a pipe from here."""
    slurm_node = "headnode" if role == "head" else "nodeA"
    (node_id,) = state.add_nodes([(slurm_node, role, {})])
    launch = NodeLaunch(
        state_base=str(state.base),
        cluster=state.cluster_name,
        job_id=JOB,
        role=role,
        node_ids=encode_node_ids({slurm_node: node_id}),
        replaces=replaces,
        await_release=role == "head",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "ERAY_"))}
    env.update(launch.to_env(), SLURMD_NODENAME=slurm_node)
    proc = subprocess.Popen(
        python_m(sys.executable, NODE_RUN),
        env=env,
        stdin=subprocess.PIPE,
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
    _check_ended(
        state, proc, node_id, dirs, gates, 128 + signal.SIGTERM, "stopped by SIGTERM before its Ray ran"
    )


def _check_ended(
    state: ClusterState,
    proc: subprocess.Popen,
    node_id: str,
    dirs: list[str],
    gates: list[int],
    code: int,
    says: str,
) -> None:
    out, _ = proc.communicate(timeout=60)
    assert not [g for g in gates if Path(f"/proc/{g}").exists()], "the gate outlived the node process"
    assert proc.returncode == code, out
    assert state.read_marker(node_id, "exit") == str(code), out
    assert says in out, out
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


def _prepared(state: ClusterState, proc: subprocess.Popen, node_id: str) -> None:
    """Until the head's node process has prepared and waits for its release."""
    wait_until("the head's preparation", lambda: bool(state.temp_dirs(node_id)[1]), proc, timeout=60)
    time.sleep(0.5)  # inside the release wait
    assert proc.poll() is None


def test_a_head_waits_for_its_release_and_ends_when_its_launcher_does(tmp_path) -> None:
    """`ray up` launches the head's step before Ray's updater copies the file mounts and
    runs the setup commands; the node prepares and loads Ray's CLI meanwhile, and starts
    nothing of Ray until released. A launcher that ends first (Ctrl-C, a failed setup
    command) closes the pipe: the head ends with nothing of Ray run and nothing left."""
    state = _cluster(tmp_path, [])
    proc, node_id = _start(state, role="head")
    try:
        _prepared(state, proc, node_id)
        assert state.read_marker(node_id, "ip") is None
        dirs = state.temp_dirs(node_id)[1]
        gates = _gates(proc.pid)
        assert len(gates) == 1, gates
        assert proc.stdin is not None
        proc.stdin.close()  # the launcher ended
        proc.stdin = None  # closed: communicate() must not flush it
        _check_ended(state, proc, node_id, dirs, gates, 1, "the launcher ended before it released the head")
        assert state.read_marker(node_id, "ip") is None  # nobody was told to join it
    finally:
        proc.kill()


def test_a_head_with_setup_commands_loads_ray_only_once_released(tmp_path) -> None:
    """The head's setup commands (run by Ray's updater before it releases the head) may
    install Ray: its CLI must not be loaded before them."""
    state = _cluster(tmp_path, [], head_setup=True)
    proc, node_id = _start(state, role="head")
    try:
        _prepared(state, proc, node_id)
        _stop_and_check(state, proc, node_id, gate=False)
    finally:
        proc.kill()


def test_the_release_line_is_read_whole_and_checked() -> None:
    read, write = os.pipe()
    try:
        os.write(write, b'{"env": {"RAY_OVERRIDE_RESOURCES": ')  # a line in two writes
        os.write(write, b'"{}"}}\n')
        assert await_release(read, 5) == {"RAY_OVERRIDE_RESOURCES": "{}"}
        os.write(write, b'{"env": {"A": 1}}\n')
        with pytest.raises(NodeRunError, match="names to strings"):
            await_release(read, 5)
        os.write(write, b"go\n")
        with pytest.raises(NodeRunError, match="not"):
            await_release(read, 5)
        with pytest.raises(NodeRunError, match="within 0 s"):
            await_release(read, 0.2)
        os.close(write)
        write = -1
        with pytest.raises(NodeRunError, match="ended before it released"):
            await_release(read, 5)
    finally:
        os.close(read)
        if write >= 0:
            os.close(write)
