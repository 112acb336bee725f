"""Every node at once: a worker launched with the head waits on its node for the head's
GCS (bounded, with the reasons to stop early), and the launcher waits through one GCS
watcher process. The live tests (``test_provider_live``, ``test_batch_live``) start
real clusters this way; here are the waits' edges."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from eray_provider.plan.markers import Marker
from eray_provider.plan.modules import GCS_PROBE, RAY_GATE, python_m
from eray_provider.plan.provider_config import ProviderConfig
from eray_provider.runtime.cluster_state import ClusterState, ClusterStoppingError
from eray_provider.runtime.launch import AliveWatch, LaunchError
from eray_provider.runtime.node_run import NodeRunError, head_node_poll, wait_for_head


def _state(tmp_path: Path) -> ClusterState:
    state = ClusterState("c", "77", tmp_path / "state")
    state.create()
    state.add_nodes([("n1", "head", {}), ("n2", "worker", {})])
    return state


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_worker_waits_for_the_heads_address_and_port(tmp_path: Path) -> None:
    state = _state(tmp_path)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def head_comes_up() -> None:
        time.sleep(0.5)
        state.write_marker("n1.1", "ip", "127.0.0.1")
        time.sleep(0.5)
        server.listen()

    threading.Thread(target=head_comes_up, daemon=True).start()
    started = time.monotonic()
    assert wait_for_head(state, port, timeout=30) == f"127.0.0.1:{port}"
    assert time.monotonic() - started >= 0.9  # it waited for both, it did not guess
    server.close()


def test_a_worker_gives_up_naming_the_head_and_port(tmp_path: Path) -> None:
    state = _state(tmp_path)
    state.write_marker("n1.1", "ip", "127.0.0.1")
    port = _free_port()  # nothing listens
    with pytest.raises(NodeRunError, match=rf"GCS \(port {port}, head n1\.1\) did not open within 1 s"):
        wait_for_head(state, port, timeout=1)


def test_a_worker_stops_waiting_when_the_head_exits(tmp_path: Path) -> None:
    state = _state(tmp_path)
    state.write_marker("n1.1", "exit", "1")
    with pytest.raises(NodeRunError, match=r"head n1\.1 exited before this node could join"):
        wait_for_head(state, _free_port(), timeout=60)


def test_a_worker_stops_waiting_when_the_cluster_is_being_stopped(tmp_path: Path) -> None:
    state = _state(tmp_path)
    with state.lock():
        state.mark_stopping()
    with pytest.raises(ClusterStoppingError):
        wait_for_head(state, _free_port(), timeout=60)


def test_the_gcs_watcher_reports_what_is_missing(tmp_path: Path) -> None:
    state = _state(tmp_path)
    address = f"127.0.0.1:{_free_port()}"
    with AliveWatch(state, address, ["n1.1", "n2.2"], timeout=1) as watch:
        assert watch.wait(["n1.1"], timeout=60) == ["n1.1"]  # the watcher ended
        assert watch.wait(["n1.1", "n2.2"], timeout=60) == ["n1.1", "n2.2"]
    proc = subprocess.run(
        [sys.executable, "-m", GCS_PROBE, address, "--wait", "--timeout=0.5"],
        input="n1.1\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and f"the GCS at {address} did not open within 0 s" in proc.stdout


def test_the_gcs_watch_ends_when_a_node_exits(tmp_path: Path) -> None:
    state = _state(tmp_path)
    address = f"127.0.0.1:{_free_port()}"
    with (
        AliveWatch(state, address, ["n2.2"], timeout=60) as watch,
        pytest.raises(LaunchError, match=r"n2\.2 exited"),
    ):
        watch.wait(["n2.2"], timeout=60, failed=lambda: "n2.2 exited")


def test_join_progress_says_who_is_missing_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from eray_provider.plan import join_progress
    from eray_provider.plan.join_progress import JoinProgress, progress_line, why_missing

    markers = {"a.tmpdir", "b.tmpdir", "b.ip", "c.tmpdir", "c.exit"}
    assert why_missing("a", markers, {}) == "setting up"
    assert why_missing("b", markers, {}) == "Ray starting"
    assert why_missing("c", markers, {"c": "1"}) == "exited, exit 1"
    assert why_missing("d", markers, {}) == "step not started"
    many = [(f"n{i}", "setting up") for i in range(8)]
    assert progress_line(1, 9, many, named=2) == (
        "1 of 9 nodes alive; waiting for n0 (setting up), n1 (setting up) and 6 more"
    )
    said: list[str] = []
    progress = JoinProgress(
        ["a", "b", "d"], {"a": "node2", "b": "node3"}, lambda: markers, lambda i: None, said.append, already=1
    )
    monkeypatch.setattr(join_progress, "MIN_GAP_SECONDS", 0.0)  # every change said: the gap is below
    progress.joined([])
    progress.joined([])  # nothing changed, too soon: not said again
    progress.joined(["b", "x"])  # an id it does not wait for is not counted
    progress.joined(["a", "d"])  # all joined: the caller says the end
    assert said == [
        "1 of 4 nodes alive; waiting for node2 (setting up), node3 (Ray starting), d (step not started)",
        "2 of 4 nodes alive; waiting for node2 (setting up), d (step not started)",
    ]
    monkeypatch.undo()
    quiet: list[str] = []
    slow = JoinProgress(["a", "b", "d"], {}, lambda: set(), lambda i: None, quiet.append, every=60.0)
    slow.joined([])
    slow.joined(["a"])  # changed, but within the gap: said at the next poll after it
    assert quiet == [
        "0 of 3 nodes alive; waiting for a (step not started), b (step not started), d (step not started)"
    ]


def test_the_node_record_transitions(tmp_path: Path) -> None:
    state = ClusterState("c1", "42", tmp_path)
    with state.lock(creating=True):
        state.create(slurm_cluster="s")
    head, worker = state.add_nodes([("n1", "head", {"k": "v"}), ("n2", "worker", {})])
    state.mark_launched([head, worker], "eray.c1.head.1")
    state.set_tags(worker, {"k": "w"})
    state.set_tags("gone.9", {"k": "x"})  # a node no longer recorded is left alone
    state.mark_requested(head, {"k": "again"})
    state.mark_terminated([worker])
    nodes = state.records()
    assert nodes[head].step_name == nodes[worker].step_name == "eray.c1.head.1"
    assert nodes[head].requested is not None and nodes[head].requested.tags == {"k": "again"}
    assert not nodes[head].terminated and nodes[head].live_head
    assert nodes[worker].tags == {"k": "w"} and nodes[worker].terminated and not nodes[worker].fixed_worker
    # elastic: two jobs of two nodes replacing job 40, then one pair forgotten, then ended
    state.add_job_nodes("cpu", {"sbatch": {}}, [("50", 1.0), ("51", 2.0)], 2, {"t": "1"}, replaces="40")
    state.add_job_nodes("cpu", {"sbatch": {}}, [("40", 0.5)], 2, {})
    state.add_job_nodes("cpu", {"sbatch": {}}, [("52", 3.0)], 2, {}, replaces="40")
    nodes = state.records()
    assert nodes["j50-1"].replaces == "j40-1" and nodes["j40-1"].successor == "j52-1"
    assert nodes["j50-1"].elastic and nodes["j50-1"].created == 1.0 and nodes["j50-1"].tags == {"t": "1"}
    state.forget_replacements({"j52-1": "j40-1"})
    nodes = state.records()
    assert nodes["j52-1"].replaces == "" and nodes["j40-1"].successor == ""
    state.end_jobs({"50": ["j50-0"], "51": ["j51-0"], "77": ["j77-0"]}, requeued=["51"])
    nodes = state.records()
    assert nodes["j50-0"].terminated and nodes["j51-0"].requeued and not nodes["j51-0"].terminated
    # a record lost is recorded as ended; on disk, fields at their defaults are left out
    assert state.read()["nodes"]["j77-0"] == {
        "slurm_job": "77",
        "role": "worker",
        "tags": {},
        "created": nodes["j77-0"].created,
        "terminated": True,
    }
    # records left alone by a transition are written back as they were read
    before = state.read()["nodes"]["j50-1"]
    state.mark_terminated(["j51-1"])
    assert state.read()["nodes"]["j50-1"] == before and state.records()["j51-1"].terminated
    state.note_refused({"gpu": ("60", "PartitionConfig")})
    assert state.read()["refused"]["gpu"]["reason"] == "PartitionConfig"


def test_a_node_knows_who_it_is_and_what_its_ray_gets() -> None:
    from eray_provider.errors import ConfigError
    from eray_provider.plan.environment import ClusterEnv, NodeLaunch
    from eray_provider.runtime.node_run import head_environment, identify, ray_environment

    launch = NodeLaunch("/s", "c1", "42", "worker", "node[1-3]@4").to_env()
    ident = identify({**launch, "SLURMD_NODENAME": "node2"})
    assert (ident.node_id, ident.own_job, ident.node_name) == ("node2.5", None, "node2")
    with pytest.raises(ConfigError, match=r"node node9 is not in ERAY_NODE_IDS='node\[1-3\]@4'"):
        identify({**launch, "SLURMD_NODENAME": "node9"})
    elastic = NodeLaunch("/s", "c1", "42", "worker", elastic=True).to_env()
    assert (
        identify({**elastic, "SLURM_JOB_ID": "77", "SLURM_NODEID": "1", "SLURMD_NODENAME": "n"}).node_id
        == "j77-1"
    )
    with pytest.raises(ConfigError, match="SLURM_JOB_ID is not set"):
        identify(elastic)

    step = {"PATH": "/bin", "TMPDIR": "/home/u/tmp", "RAY_ADDRESS": "10.0.0.9:1", "SLURM_JOB_ID": "42"}
    env = ray_environment(
        step, ClusterEnv("/t", "/h", job_id="42", jax_ports=(20240, 16)), "/tmp/x", "node2.5", 12
    )
    assert "RAY_ADDRESS" not in env and env["TMPDIR"] == "/tmp/x" and env["ERAY_USER_TMPDIR"] == "/home/u/tmp"
    assert env["RAY_CLOUD_INSTANCE_ID"] == "node2.5" and env["AUTOSCALER_MAX_LAUNCH_BATCH"] == "12"
    assert (
        env["RAY_AUTH_TOKEN_PATH"] == "/t" and env["ERAY_JAX_PORTS"] == "20240:16" and env["PATH"] == "/bin"
    )
    nested = ray_environment({**step, "ERAY_USER_TMPDIR": ""}, ClusterEnv("/t", "/h"), "/tmp/y", "n.1", 10)
    assert nested["ERAY_USER_TMPDIR"] == ""  # launched from inside a node: the user had none
    assert head_environment(ProviderConfig()) == {
        "RAY_AUTOSCALER_RECONCILE_ALLOCATE_STATUS_TIMEOUT_S": "3600"
    }
    elastic = ProviderConfig.from_dict({"autoscaler_interval_s": 2, "pending_timeout_s": 60}, elastic=True)
    assert head_environment(elastic) == {
        "RAY_AUTOSCALER_RECONCILE_ALLOCATE_STATUS_TIMEOUT_S": "60",
        "AUTOSCALER_UPDATE_INTERVAL_S": "2",
    }


def test_a_node_record_round_trips_and_refuses_what_it_does_not_know() -> None:
    from eray_provider.errors import ClusterError
    from eray_provider.plan.node_record import NodeRecord, Requested, parse_records

    rec = NodeRecord(
        "head",
        {"k": "v"},
        5.0,
        slurm_node="n1",
        gen=3,
        step_name="s",
        launched=6.0,
        requested=Requested({"k": "w"}, 7.0),
    )
    raw = rec.to_dict()
    assert (
        "terminated" not in raw
        and "slurm_job" not in raw
        and raw["requested"] == {"tags": {"k": "w"}, "at": 7.0}
    )
    assert parse_records({"n1.3": raw}) == {"n1.3": rec}
    # the tags asked for last are answered to for a while only
    assert rec.answers_to({"k": "w"}, now=8.0, requested_for=5.0)
    assert not rec.answers_to({"k": "w"}, now=13.0, requested_for=5.0)
    assert rec.answers_to({"k": "v"}, now=13.0, requested_for=5.0)
    # a key of another version is left out, not a failure of every round
    assert NodeRecord.from_dict("n1.3", {**raw, "colour": "red"}) == rec
    with pytest.raises(ClusterError, match="no 'role'"):
        NodeRecord.from_dict("n1.3", {"tags": {}})
    with pytest.raises(ClusterError, match="not 'boss'"):
        NodeRecord("boss")


def test_the_ray_gate_runs_nothing_until_told_and_then_becomes_ray(tmp_path: Path) -> None:
    """A worker's Ray CLI loads while the node waits for the head (``runtime.ray_gate``):
    ended without its line it runs nothing; told one, it is ``ray`` with those arguments
    in the same process (the variables and the head wait: the live tests)."""
    import json

    import ray

    gate = subprocess.Popen(python_m(sys.executable, RAY_GATE), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    out, _ = gate.communicate(b"", timeout=120)
    assert gate.returncode == 0 and out == b""
    # `ray --version` shows that the line became Ray's argv
    gate = subprocess.Popen(python_m(sys.executable, RAY_GATE), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    go = {"argv": ["--version"], "env": {"ERAY_TEST_GATE": "1"}, "head_wait": None}
    out, _ = gate.communicate(json.dumps(go).encode() + b"\n", timeout=120)
    assert gate.returncode == 0, out
    assert ray.__version__ in out.decode()


def test_workers_ask_for_the_head_node_at_a_bounded_rate() -> None:
    assert head_node_poll(3) == 0.2
    for nodes in (3, 200, 201, 2000, 10000):
        assert nodes / head_node_poll(nodes) <= 1000.0 + 1e-9
    assert head_node_poll(2000) == 2.0  # Ray's own rate there


#: In a process of its own (the patch is process-wide, as in the gate): a stand-in for
#: Ray's ``Node`` whose ``__init__`` starts the monitor before its raylet registers, as
#: Ray 2.52-2.60 do, and a second monitor started after ``__init__``, as a newer Ray might.
_MONITOR_ORDER = """
import ray._private.node as node_module
from eray_provider.runtime.ray_compat import monitor_after_registration

events = []
node_module.Node.__init__ = lambda self: (self.start_monitor(), events.append("registered"))[0]
node_module.Node.start_monitor = lambda self: events.append("monitor")
monitor_after_registration()
n = node_module.Node()
n.start_monitor()
print(",".join(events))
"""


def test_a_heads_monitor_starts_after_registration_and_is_never_lost() -> None:
    """``ray_compat.monitor_after_registration``: a monitor Ray starts inside ``Node.__init__``
    starts once ``__init__`` (its wait for the raylet) is over; one started from anywhere
    else starts at once, so a Ray that moves the call does not lose its autoscaler."""
    out = subprocess.run([sys.executable, "-c", _MONITOR_ORDER], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "registered,monitor,monitor"


def test_a_requeued_worker_running_again_stands_by_until_the_head_shows_it(tmp_path: Path) -> None:
    """Its last run's end, drain and hand-over go; a ``rerun`` marker tells the provider to
    show it again, and its Ray waits for a fresh hand-over (the first run's would let it
    join before the autoscaler knows it). A first run keeps what the head wrote."""
    from eray_provider.runtime.node_run import _start_again, stand_by

    state = _state(tmp_path)
    node = "j9-0"
    for kind in (Marker.EXIT, Marker.DRAIN, Marker.HANDOVER, Marker.STANDBY):
        state.write_marker(node, kind, "old")
    assert _start_again(state, node, {}) == 0  # a first run: nothing of the head's goes
    assert state.read_marker(node, Marker.HANDOVER) == "old" and state.read_marker(node, Marker.RERUN) is None
    assert _start_again(state, node, {"SLURM_RESTART_COUNT": "2"}) == 2
    for kind in (Marker.EXIT, Marker.DRAIN, Marker.HANDOVER, Marker.STANDBY):
        assert state.read_marker(node, kind) is None, kind
    assert state.read_marker(node, Marker.RERUN) == "2"
    waiting = threading.Thread(target=stand_by, args=(state, node, "runs again"))
    waiting.start()
    deadline = time.monotonic() + 30
    while state.read_marker(node, Marker.STANDBY) is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert waiting.is_alive()  # no hand-over yet: its Ray does not start
    state.write_marker(node, Marker.HANDOVER, "now")  # the head's provider showed it
    waiting.join(timeout=30)
    assert not waiting.is_alive()
