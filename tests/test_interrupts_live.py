"""Commands interrupted at the worst moment, on the test bed: what the next command finds
must be usable.

- ``ray down`` interrupted (Ctrl-C) as its teardown begins, 1.5 s and 4 s after it started:
  ``ray down`` again removes the state, and ``ray up`` then brings every node alive;
- ``eray-provider run`` given SIGTERM while its cluster starts: the command never runs,
  the cluster is torn down (no state, no step), the exit status says so.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from ray_cluster_support import VENV_BIN, Cluster, state_left
from testbed_support import REPO, Testbed, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.ray]


def _stopping(state_dir: Path) -> bool:
    try:
        return json.loads((state_dir / "state.json").read_text()).get("stopping") is not None
    except (OSError, ValueError):
        return False


def _cluster_steps(testbed: Testbed, job: str, name: str) -> list[str]:
    out = testbed.run(["squeue", "-h", "-s", "-j", job, "-o", "%j"], check=False).stdout.split()
    return [s for s in out if s.startswith(f"eray.{name}.")]


def test_an_interrupted_ray_down_is_finished_by_the_next(testbed: Testbed, tmp_path) -> None:
    job = testbed.salloc("-N3", "-c1", "--mem=1500", "-J", "eray-interrupt")
    cluster = Cluster(testbed, job, tmp_path, "intr")
    try:
        for when in ("stopping", 1.5, 4.0):
            cluster.up()
            cluster.wait_nodes(3)
            down = subprocess.Popen(
                ["ray", "down", "-y", str(cluster.config)],
                env=cluster.env,
                cwd=str(REPO),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            if when == "stopping":
                wait_until("the teardown begin", lambda: _stopping(cluster.state_dir), down, timeout=120)
            else:
                time.sleep(float(when))  # the user's Ctrl-C, at that moment of `ray down`
            down.send_signal(signal.SIGINT)
            out, _ = down.communicate(timeout=300)
            # whatever the interrupted command left, the next `ray down` finishes it
            again = cluster.down()
            assert state_left(cluster.state_dir) == [], (when, out[-2000:], again.stdout[-2000:])
            assert _cluster_steps(testbed, job, "intr") == [], when
        cluster.up()
        assert len(cluster.wait_nodes(3)) == 3
    finally:
        cluster.down(check=False)
        testbed.cancel(job)


def test_sigterm_during_run_start_never_runs_the_command_and_tears_down(testbed: Testbed) -> None:
    job = testbed.salloc("-N3", "-c1", "--mem=1500", "-J", "eray-run-sigterm")
    marker = REPO / ".test-output" / f"ran-{job}"
    marker.parent.mkdir(exist_ok=True)
    marker.unlink(missing_ok=True)
    state_dir = Path.home() / ".eray-provider" / f"sigterm-{job}"
    env = dict(testbed.env, PATH=f"{VENV_BIN}:{testbed.env['PATH']}")
    env.pop("SLURM_JOB_ID", None)
    pidfile = marker.with_suffix(".pid")
    pidfile.unlink(missing_ok=True)
    task = f"echo $$ > {pidfile}; exec eray-provider run --name sigterm -- touch {marker}"
    run = subprocess.Popen(
        ["srun", f"--jobid={job}", "--overlap", "-N1", "-n1", "-w", "node1", "bash", "-c", task],
        env=env,
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # the cluster's start is under way: the head's step is launched
        wait_until(
            "the head's launch", lambda: bool(_cluster_steps(testbed, job, "sigterm")), run, timeout=120
        )
        # SIGTERM to the task itself, as slurmstepd sends it at a time limit or a preemption
        testbed.on_node("node1", f"kill -TERM {pidfile.read_text().strip()}")
        out, _ = run.communicate(timeout=300)
        assert run.returncode == 128 + signal.SIGTERM, out
        assert "SIGTERM during the cluster's start: the command was not run" in out, out[-3000:]
        assert not marker.exists()
        assert state_left(state_dir) == [], out[-2000:]
        assert _cluster_steps(testbed, job, "sigterm") == []
    finally:
        if run.poll() is None:
            run.kill()
        testbed.cancel(job)
