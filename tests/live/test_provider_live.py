"""SlurmNodeProvider on the real test bed: ray up/exec/submit/attach/down, v1 and v2, failures."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest
from ray_cluster_support import (
    Cluster,
    collected_logs,
    monitor_log,
    node_tmp_entries,
    run_attach,
    state_left,
    wait_gone,
)
from testbed_support import Testbed, binds_as, other_user, wait_until

from eray_provider.plan.ports import PortPlan, held_ranges

pytestmark = [pytest.mark.slurm, pytest.mark.ray]

SHARE = {"CPU": 2.0, "GPU": 2.0, "memory": 3000 * 2**20 - int(0.3 * 3000 * 2**20)}


@pytest.fixture
def ray_job(testbed: Testbed):
    job = testbed.salloc("-N3", "-c2", "--gpus-per-node=2", "--mem=3000", "-J", "eray-ray-test")
    yield job
    testbed.cancel(job)


def test_config_asking_for_more_than_the_allocation_fails_first(testbed, ray_job, tmp_path) -> None:
    too_many = Cluster(testbed, ray_job, tmp_path, "toomany", max_workers=5)
    proc = too_many.up(env=None) if False else too_many.ray("up", "-y", str(too_many.config), check=False)
    assert proc.returncode != 0
    assert (
        "max_workers: 5" in proc.stdout + proc.stderr and "node1, node2, node3" in proc.stdout + proc.stderr
    )
    outside = Cluster(testbed, ray_job, tmp_path, "outside", provider={"nodes": "node[1-2],node9"})
    proc = outside.ray("up", "-y", str(outside.config), check=False)
    assert proc.returncode != 0 and "['node9']" in proc.stdout + proc.stderr
    steps = testbed.run(["squeue", "-h", "-s", "-j", ray_job, "-o", "%j"]).stdout
    assert "eray." not in steps
    assert not too_many.state_dir.exists() and not outside.state_dir.exists()


@pytest.mark.smoke
def test_cluster_lifecycle_autoscaler_v2(testbed, ray_job, tmp_path) -> None:
    cluster = Cluster(testbed, ray_job, tmp_path, "life")
    # a token left in the user's ~/.ray must never decide anything
    stray = Path.home() / ".ray" / "auth_token"
    had_stray = stray.exists()
    if not had_stray:
        stray.parent.mkdir(exist_ok=True)
        stray.write_text("a-stale-token-of-another-cluster")
    try:
        up = cluster.up()
        # every node starts with the head, and `ray up` returns once all have joined
        assert "eray-provider: 3 of 3 nodes alive" in up.stdout + up.stderr, up.stdout[-3000:]
        # and says nothing false on the way (Ray's start-command checks see what they look for)
        for false_warning in ("will not be started because", "will not launch any workers"):
            assert false_warning not in up.stdout + up.stderr, up.stdout[-3000:]
        nodes = cluster.wait_nodes(3, timeout=60)
        by_node = {n["labels"]["slurm-node"]: n for n in nodes}
        assert sorted(by_node) == ["node1", "node2", "node3"]
        head_ip = cluster.exec("echo $RAY_ADDRESS").stdout.strip().splitlines()[-1].split(":")[0]
        assert by_node["node1"]["ip"] == head_ip
        for name, node in by_node.items():
            res = node["resources"]
            assert {k: res[k] for k in SHARE} == SHARE, (name, res)
            assert res[f"slurm_node:{name}"] == 1.0 and res["accelerator_type:TESTGPU"] == 1.0
            assert node["labels"]["slurm-job"] == ray_job
            assert not node["ip"].startswith("127.")

        # the head's autoscaler adopted the workers started with it, and asked for no others
        # (adopted from the provider's list or from the Ray node that joined first, as the
        # round's timing has it; either way the instance runs with the node's id)
        running = r"ALLOCATED->RAY_RUNNING \(id=[^,]+, type=ray\.worker[^,]*, cloud_instance_id=(node\d)\.\d+"
        monitor = monitor_log(testbed, ray_job, lambda text: len(re.findall(running, text)) >= 2)
        assert sorted(re.findall(running, monitor)) == ["node2", "node3"], monitor[-3000:]
        assert "allocated unmanaged" in monitor and "REQUESTED" not in monitor, monitor[-3000:]
        assert "SLURM nodes are free" not in monitor, monitor[-3000:]
        # which the head's Ray started once the head had registered, after its raylet (Ray
        # itself starts it among the head's first processes, before the raylet)
        started = {
            kind: _started_at(testbed, f"{kind}.*--{flag}={re.escape(head_ip)}( |$)")
            for kind, flag in (("monitor\\.py", "monitor-ip"), ("raylet", "node_ip_address"))
        }
        assert started["monitor\\.py"] > started["raylet"], started

        status = cluster.exec("ray status").stdout
        assert "6.0 CPU" in status or "0.0/6.0 CPU" in status

        out = cluster.ray("submit", str(cluster.config), "examples/per_node.py").stdout
        assert sorted(line.split()[1] for line in out.splitlines() if line.startswith("NODE ")) == [
            "node1",
            "node2",
            "node3",
        ]

        psum = cluster.ray("submit", str(cluster.config), "examples/jax_psum.py", timeout=300).stdout
        assert "psum and process_allgather correct across 3 processes on 3 nodes" in psum, psum[-3000:]

        refused = cluster.ray("dashboard", str(cluster.config), check=False, timeout=120)
        assert refused.returncode != 0 and "Port forwarding is not available over srun" in (
            refused.stdout + refused.stderr
        )

        attached = run_attach(cluster, ["echo ATTACHED-$(hostname)-$RAY_AUTH_MODE"])
        assert "ATTACHED-node1-token" in attached

        # the same cluster driven from the login side with provider.job_id
        login = Cluster(testbed, ray_job, tmp_path, "life", login_side=True)
        assert "SLURM_JOB_ID" not in login.env
        assert login.exec("hostname").stdout.strip().splitlines()[-1] == "node1"

        # a worker's raylet dies: the autoscaler replaces the node
        dead = by_node["node3"]["id"]
        tmp3 = node_tmp_entries(testbed, "node3", ray_job)
        assert tmp3, "node3 has no temp dir of the job"
        # by its address too: the test bed's nodes share one PID namespace, and before Ray
        # 2.55 every node's Ray runs in a temp dir of the head's name
        ip3 = by_node["node3"]["ip"]
        # (node3 has its own dir and, before Ray 2.55, one of the head's name that Ray runs in)
        dirs = "|".join(re.escape(d) for d in tmp3)
        pattern = f"raylet.*({dirs}).*--node_ip_address={re.escape(ip3)}( |$)"
        (raylet,) = testbed.run(["pgrep", "-f", pattern]).stdout.split()
        records = json.loads((cluster.state_dir / "state.json").read_text())["nodes"]
        (node3,) = [i for i, r in records.items() if r["slurm_node"] == "node3" and not r.get("terminated")]
        os.kill(int(raylet), signal.SIGKILL)
        # its address stays ours after its Ray died (the rest of the cluster goes on calling
        # it, with the token, until it learns the node is gone): once the node has recorded
        # its end and collected its logs, another user can bind none of its named ports, on
        # its address or on loopback, and its node process still holds them
        wait_until("the killed node's logs collected", lambda: node3 in collected_logs(cluster.state_dir))
        plan = PortPlan.from_dict(json.loads((cluster.state_dir / "ports.json").read_text()))
        named = [p for lo, hi in held_ranges([plan]) for p in range(lo, hi + 1)]
        targets = [(addr, p) for addr in (ip3, "127.0.0.1", "::1") for p in named]
        assert binds_as(testbed, "node3", other_user(), targets) == []
        node_pid = (cluster.state_dir / "nodes" / f"{node3}.pid").read_text().split()[0]
        assert Path(f"/proc/{node_pid}").exists(), "the killed node's process let go of its holds"
        replaced = cluster.wait_nodes(3, timeout=120, exclude={dead})
        assert "node3" in {n["labels"]["slurm-node"] for n in replaced}

        cluster.down()
        assert wait_gone(ray_job, "life") == []
        left = {n: node_tmp_entries(testbed, n, ray_job) for n in ("node1", "node2", "node3")}
        what = {
            n: testbed.on_node(n, f"ls -laR {' '.join(d)} | head -40").stdout for n, d in left.items() if d
        }
        assert not what, what  # each node's private temp dirs, whatever was in them
        # the state is gone but for every node's Ray logs, the killed one's and its successor's too
        assert state_left(cluster.state_dir) == []
        logs = collected_logs(cluster.state_dir)
        assert sorted(m["slurm_node"] for m in logs.values()) == ["node1", "node2", "node3", "node3"], logs
        assert cluster.down().returncode == 0  # twice is harmless
    finally:
        cluster.down(check=False)
        if not had_stray:
            stray.unlink(missing_ok=True)


def _started_at(testbed: Testbed, pattern: str) -> int:
    """When the one process matching ``pattern`` started (clock ticks since boot; the test
    bed's nodes share this machine's process table)."""
    (pid,) = testbed.run(["pgrep", "-f", pattern]).stdout.split()
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def test_cluster_under_autoscaler_v1(testbed, ray_job, tmp_path) -> None:
    cluster = Cluster(testbed, ray_job, tmp_path, "vone")
    cluster.env["RAY_UP_enable_autoscaler_v2"] = "0"
    try:
        up = cluster.up()
        assert "eray-provider: 3 of 3 nodes alive" in up.stdout + up.stderr, up.stdout[-3000:]
        nodes = cluster.wait_nodes(3)
        assert sorted(n["labels"]["slurm-node"] for n in nodes) == ["node1", "node2", "node3"]
        # v1 keeps the workers started with the head: it does not take them for outdated
        monitor = monitor_log(testbed, ray_job, lambda text: "StandardAutoscaler" in text)
        assert "StandardAutoscaler" in monitor and "(outdated)" not in monitor, monitor[-3000:]
        # this cluster's monitor (its logs are in the head's temp dir, named for the job): the
        # nodes share the machine's process table with other clusters, and other beds'
        monitor = cluster.exec(
            f"pid=$(pgrep -f '[a]utoscaler/_private/monitor.py.*/tmp/eray-{ray_job}-' | head -1) && "
            'test -n "$pid" && echo "monitor $pid" && '
            "(tr '\\0' '\\n' < /proc/$pid/environ | grep -c '^RAY_enable_autoscaler_v2=1' || true)"
        ).stdout
        assert "monitor " in monitor and monitor.strip().splitlines()[-1] == "0", monitor
    finally:
        cluster.down(check=False)
    assert wait_gone(ray_job, "vone") == []


def test_scancel_of_job_with_live_cluster_leaves_no_process(testbed, ray_job, tmp_path) -> None:
    cluster = Cluster(testbed, ray_job, tmp_path, "cancelled")
    cluster.up()
    cluster.wait_nodes(3)
    testbed.cancel(ray_job)
    assert wait_gone(ray_job, "cancelled", timeout=60) == []
    # the cluster whose job has ended is reported as gone, not as an error
    assert cluster.down(check=False).returncode == 0
