"""``eray-provider status`` and ``eray-provider logs`` on the test bed: three clusters on
three jobs, one of whose jobs is cancelled; a worker's raylet killed in two of them, its
log read after ``ray down`` and after ``scancel``; ``--prune`` removing only the ended."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest
from ray_cluster_support import Cluster, collected_logs
from testbed_support import Testbed

pytestmark = [pytest.mark.slurm, pytest.mark.ray]


def _worker(cluster: Cluster) -> tuple[str, str, str]:
    """(node id, SLURM node, address) of the cluster's one live worker."""
    doc = json.loads((cluster.state_dir / "state.json").read_text())
    (node_id,) = [i for i, r in doc["nodes"].items() if r["role"] == "worker" and not r.get("terminated")]
    ip = (cluster.state_dir / "nodes" / f"{node_id}.ip").read_text().strip()
    return node_id, doc["nodes"][node_id]["slurm_node"], ip


def _kill_raylet(testbed: Testbed, cluster: Cluster) -> tuple[str, int]:
    """SIGKILL the worker's raylet, wait until its node recorded the end and collected its
    logs (this end's: a state dir of an earlier test bed's job of the same id may hold
    older ones); returns (node id, the raylet's pid)."""
    node_id, _, ip = _worker(cluster)
    tmp = (cluster.state_dir / "nodes" / f"{node_id}.tmpdir").read_text().split()[-1]  # where Ray runs
    # by temp dir and address: the test bed's nodes share one PID namespace
    (pid,) = testbed.run(
        ["pgrep", "-f", f"raylet.*{tmp}.*--node_ip_address={re.escape(ip)}( |$)"]
    ).stdout.split()
    killed = time.time()
    os.kill(int(pid), signal.SIGKILL)

    def collected_now() -> bool:
        meta = collected_logs(cluster.state_dir).get(node_id)
        at = meta and time.mktime(time.strptime(meta["collected_at"][:19], "%Y-%m-%dT%H:%M:%S"))
        return bool(meta and meta.get("complete") and at >= int(killed) - 1)

    deadline = time.monotonic() + 90
    while not collected_now() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert collected_now(), (
        f"{node_id}'s logs were not collected within 90 s: {collected_logs(cluster.state_dir)}"
    )
    assert (cluster.state_dir / "nodes" / f"{node_id}.exit").exists()
    return node_id, int(pid)


def _eray(testbed: Testbed, cluster: Cluster, *args: str, check: bool = True):
    return testbed.run(["eray-provider", *args], env=cluster.env, timeout=180, check=check)


def _steps(testbed: Testbed, job: str) -> list[str]:
    return testbed.run(["squeue", "-h", "-s", "-j", job, "-o", "%j"]).stdout.split()


def _raylet_lines(out: str, pid: int) -> list[str]:
    """Lines of the raylet whose pid is ``pid`` (glog: ``[time I pid tid] (raylet) ...``)."""
    return [line for line in out.splitlines() if re.search(rf"\[[^]]* {pid} \d+\] \(raylet\)", line)]


def test_status_and_logs_of_live_ended_and_torn_down_clusters(testbed: Testbed, tmp_path) -> None:
    granted = time.monotonic()
    jobs = [
        testbed.salloc("-N2", "-c1", "--mem=1500", "-t", "30", "-J", "eray-status-a"),
        testbed.salloc("-N1", "-c1", "--mem=1500", "-J", "eray-status-b"),
        testbed.salloc("-N2", "-c1", "--mem=1500", "-J", "eray-status-c"),
    ]
    sa, sb, sc = (Cluster(testbed, j, tmp_path, n) for j, n in zip(jobs, ("sa", "sb", "sc")))
    try:
        for cluster in (sa, sb, sc):
            cluster.up()

        # a live node's raylet log is read on its node
        live = _eray(
            testbed, sa, "logs", "sa", "--job", sa.job_id, "--node", _worker(sa)[1], "--component", "raylet"
        ).stdout
        assert re.search(r"==> \S+ on node\d \(live\): raylet\.out <==", live), live[-2000:]
        assert "(raylet)" in live

        # following a live node's log: its lines come, and Ctrl-C leaves no step behind
        follow = subprocess.Popen(
            ["eray-provider", "logs", "sb", "--job", sb.job_id, "--follow", "--component", "raylet"],
            env=sb.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        watchdog = threading.Timer(60, follow.kill)  # readline must not wait for ever
        watchdog.start()
        first: list[str] = []
        try:
            assert follow.stdout is not None
            while not any("(raylet)" in line for line in first) and len(first) < 200:
                first.append(follow.stdout.readline())
            assert any("(raylet)" in line for line in first), first
            logs_steps = [s for s in _steps(testbed, sb.job_id) if s.startswith("eray.sb.logs.")]
            assert len(logs_steps) == 1, _steps(testbed, sb.job_id)
        finally:
            watchdog.cancel()
            # the rest is read too: a full pipe would stop its writer before it can end
            rest = threading.Thread(target=lambda: first.extend(follow.stdout or ()), daemon=True)
            rest.start()
            follow.send_signal(signal.SIGHUP)  # a closed terminal: as Ctrl-C, exit 128 + 1
            # bounded by stop_foreground_step: SIGTERM and SIGKILL of the srun client (10 s
            # each), then a scancel of its step waited for up to 30 s
            follow.wait(timeout=150)
            rest.join(timeout=10)
        assert follow.returncode == 128 + signal.SIGHUP, first[-20:]
        assert not [s for s in _steps(testbed, sb.job_id) if s.startswith("eray.sb.logs.")]

        # sc: a worker's raylet dies, then the job is cancelled
        dead_c, pid_c = _kill_raylet(testbed, sc)
        testbed.cancel(sc.job_id)
        deadline = time.monotonic() + 120  # KillWait (30 s) and the nodes' teardown, on a loaded bed
        while (
            time.monotonic() < deadline and testbed.run(["squeue", "-h", "-j", sc.job_id], check=False).stdout
        ):
            time.sleep(1)
        assert not testbed.run(["squeue", "-h", "-j", sc.job_id], check=False).stdout, (
            "sc's job is still listed"
        )

        table = _eray(testbed, sa, "status").stdout
        rows = {
            tuple(line.split()[:2]): line.split()
            for line in table.splitlines()
            if line and not line[0].isspace()
        }
        assert rows["sa", sa.job_id][2:5] == ["fixed", "running", "2/2"], table
        assert rows["sb", sb.job_id][2:5] == ["fixed", "running", "1/1"], table
        assert rows["sc", sc.job_id][2:4] == ["fixed", "ended"], table
        listed = json.loads(_eray(testbed, sa, "status", "--json").stdout)
        doc = {
            s["name"]: s
            for s in listed
            if (s["name"], s["job_id"]) in {(c.name, c.job_id) for c in (sa, sb, sc)}
        }
        for name, cluster in (("sa", sa), ("sb", sb), ("sc", sc)):
            st = doc[name]
            assert st["state"] == rows[name, cluster.job_id][3]
            assert st["state_dir"] == str(cluster.state_dir)
        assert doc["sa"]["alive"] == doc["sa"]["expected"] == 2 and doc["sb"]["alive"] == 1
        plan = json.loads((sa.state_dir / "ports.json").read_text())
        assert (
            doc["sa"]["head_address"].endswith(f":{plan['gcs']}") and doc["sa"]["ports"]["gcs"] == plan["gcs"]
        )
        assert doc["sa"]["token_file"] == str(sa.state_dir / "auth_token")
        # salloc -t 30: what is left is 30 min less the time since (and a minute of rounding)
        minutes, seconds = (int(x) for x in doc["sa"]["time_left"].split(":"))
        left = 60 * minutes + seconds
        assert 30 * 60 - (time.monotonic() - granted) - 60 <= left <= 30 * 60, doc["sa"]
        assert doc["sb"]["time_left"] == "UNLIMITED"
        assert doc["sc"]["prunable"] and dead_c in doc["sc"]["logs"]
        assert any(f"job {sc.job_id}" in p for p in doc["sc"]["problems"])

        # after scancel: the killed worker's raylet log, from the state dir
        out = _eray(
            testbed, sc, "logs", "sc", "--job", sc.job_id, "--node", dead_c, "--component", "raylet"
        ).stdout
        assert f"==> {dead_c} on node" in out and "(collected, session_" in out
        assert _raylet_lines(out, pid_c), out[-2000:]

        # sa: a worker's raylet dies, then `ray down`: its log is still there
        dead_a, pid_a = _kill_raylet(testbed, sa)
        sa.down()
        assert sorted(os.listdir(sa.state_dir)) == ["ray-logs"]
        out = _eray(
            testbed, sa, "logs", "sa", "--job", sa.job_id, "--node", dead_a, "--component", "raylet"
        ).stdout
        assert _raylet_lines(out, pid_a), out[-2000:]
        head_logs = _eray(
            testbed, sa, "logs", "sa", "--job", sa.job_id, "--node", "node1", "--component", "gcs"
        ).stdout
        assert "gcs_server.out <==" in head_logs

        # --prune removes the ended job's cluster only (sa's job still runs: its logs stay)
        pruned = _eray(testbed, sa, "status", "--prune")
        assert f"removed {sc.state_dir}" in pruned.stderr
        assert not sc.state_dir.exists() and (sb.state_dir / "state.json").exists()
        assert sorted(os.listdir(sa.state_dir)) == ["ray-logs"]
        after = {
            (s["name"], s["job_id"]): s["state"]
            for s in json.loads(_eray(testbed, sa, "status", "--json").stdout)
        }
        assert after.get(("sa", sa.job_id)) == "down" and after.get(("sb", sb.job_id)) == "running"
        assert ("sc", sc.job_id) not in after
    finally:
        for cluster in (sa, sb, sc):
            cluster.down(check=False)
        for job in jobs:
            testbed.cancel(job)
