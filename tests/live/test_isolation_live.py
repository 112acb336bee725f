"""Two clusters of two jobs on the same nodes, token authentication, socket binding, racing ray up."""

from __future__ import annotations

import json
import shlex
import stat
import subprocess
import threading
from pathlib import Path

import pytest
from ray_cluster_support import Cluster, cluster_pids, state_left, wait_gone
from testbed_support import Testbed, listeners

pytestmark = [pytest.mark.slurm, pytest.mark.ray]

WORK = (
    "import ray; ray.init(); "
    "print('SUM', sum(ray.get([ray.remote(lambda x: x * x).remote(i) for i in range(20)])))"
)


def ray_daemons(job_id: str, cluster: str) -> set[int]:
    """The cluster's raylets and GCS: processes that live as long as it does (its other
    processes come and go: Ray's workers, the autoscaler's squeue calls)."""
    daemons = set()
    for pid in cluster_pids(job_id, cluster):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm in ("raylet", "gcs_server"):
            daemons.add(pid)
    return daemons


def job(testbed: Testbed) -> str:
    return testbed.salloc("-N3", "-c2", "--mem=3000", "-J", "eray-iso")


def test_two_clusters_share_nodes_and_stop_independently(testbed: Testbed, tmp_path) -> None:
    job_a, job_b = job(testbed), job(testbed)
    a = Cluster(testbed, job_a, tmp_path, "shared")
    b = Cluster(testbed, job_b, tmp_path / "b", "shared") if (tmp_path / "b").mkdir() is None else None
    try:
        a.up()
        b.up()
        a.wait_nodes(3)
        b.wait_nodes(3)
        plan_a = json.loads((a.state_dir / "ports.json").read_text())
        plan_b = json.loads((b.state_dir / "ports.json").read_text())
        ports_a = {v for k, v in plan_a.items() if k not in ("job_id", "jax_count")}
        ports_b = {v for k, v in plan_b.items() if k not in ("job_id", "jax_count")}
        assert not ports_a & ports_b
        for cluster in (a, b):
            assert "SUM 2470" in cluster.exec(f"python -c {shlex.quote(WORK)}").stdout

        # security: token file and dir modes, a client without the token is refused
        token = a.state_dir / "auth_token"
        assert stat.S_IMODE(token.stat().st_mode) == 0o600
        assert stat.S_IMODE(a.state_dir.stat().st_mode) == 0o700
        address = a.exec("echo $RAY_ADDRESS").stdout.strip().splitlines()[-1]
        head_ip = address.split(":")[0]
        intruder = subprocess.run(
            [
                a.env["PATH"].split(":")[0] + "/python",
                "-c",
                f"import ray; ray.init(address={address!r}); print('CONNECTED')",
            ],
            env={k: v for k, v in a.env.items() if not k.startswith("RAY_")} | {"HOME": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert "CONNECTED" not in intruder.stdout
        assert "auth" in (intruder.stdout + intruder.stderr).lower()

        # sockets: the dashboard on the head's address; no socket of the cluster (any port of
        # its block, on any node) on all interfaces, and Ray's components still reach their
        # metrics agent (their loopback connects follow the shim's rewritten binds)
        rows = listeners(testbed, "node1")
        dashboard = [r for r in rows if r[1] == plan_a["dashboard"]]
        assert dashboard and all(r[0] in (head_ip, "127.0.0.1") for r in dashboard)
        block = range(plan_a["block_start"], plan_a["block_start"] + 256)
        for node in ("node1", "node2", "node3"):
            ours = [r for r in listeners(testbed, node) if r[1] in block]
            assert len(ours) >= 4, (node, ours)  # raylet, object manager, agent, runtime env agent
            wildcard = [r for r in ours if r[0] in ("*", "0.0.0.0", "::")]
            assert wildcard == [], (node, wildcard)
        head_tmp = next((a.state_dir / "nodes").glob("node1.*.tmpdir")).read_text().split()[1]
        logs = f"{head_tmp}/ray/session_latest/logs"
        assert "gcs_server.out" in testbed.on_node("node1", f"ls {logs}").stdout
        complaints = testbed.on_node(
            "node1", f"grep -l 'exporter agent\\|to the metrics agent' {logs}/* || true"
        ).stdout
        assert complaints.strip() == "", complaints

        # ray down of A leaves B's processes untouched, and the reverse
        pids_b = ray_daemons(job_b, "shared")
        assert len(pids_b) == 4, pids_b  # a raylet on each of the 3 nodes, one GCS
        a.down()
        assert wait_gone(job_a, "shared") == []
        assert pids_b <= set(cluster_pids(job_b, "shared"))
        assert len(b.wait_nodes(3, timeout=30)) == 3
        assert "SUM 2470" in b.exec(f"python -c {shlex.quote(WORK)}").stdout

        a.up()
        a.wait_nodes(3)
        pids_a = ray_daemons(job_a, "shared")
        assert len(pids_a) == 4, pids_a
        b.down()
        assert wait_gone(job_b, "shared") == []
        assert pids_a <= set(cluster_pids(job_a, "shared"))
        assert "SUM 2470" in a.exec(f"python -c {shlex.quote(WORK)}").stdout
    finally:
        for cluster in (a, b):
            cluster.down(check=False)
        testbed.cancel(job_a)
        testbed.cancel(job_b)


def test_racing_ray_up_builds_one_cluster(testbed: Testbed, tmp_path) -> None:
    j = job(testbed)
    cluster = Cluster(testbed, j, tmp_path, "race")
    results: list[int] = []
    outputs: list[str] = []

    def up() -> None:
        proc = cluster.ray("up", "-y", str(cluster.config), check=False)
        results.append(proc.returncode)
        outputs.append((proc.stdout + proc.stderr)[-3000:])

    try:
        threads = [threading.Thread(target=up) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=400)
        assert results == [0, 0], "\n---\n".join(outputs)
        nodes = cluster.wait_nodes(3)
        assert len(nodes) == 3
        state = json.loads((cluster.state_dir / "state.json").read_text())
        heads = [r for r in state["nodes"].values() if r["role"] == "head" and not r.get("terminated")]
        assert len(heads) == 1
        steps = testbed.run(["squeue", "-h", "-s", "-j", j, "-o", "%j"]).stdout.split()
        assert sum(1 for s in steps if s.startswith("eray.race.head")) == 1
    finally:
        cluster.down(check=False)
        testbed.cancel(j)
    assert state_left(cluster.state_dir) == []
