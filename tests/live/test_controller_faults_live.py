"""A flaky controller on the real test bed: SLURM commands that fail or answer late
(``fault_injection``, first on PATH of ``ray up``/``ray down``, the head's autoscaler and
the srun clients). Nothing may be orphaned, no state deleted while steps run, no second
head started, and a controller that stays down is a clear error.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from fault_injection import FaultyCommands
from ray_cluster_support import Cluster, cluster_pids, state_left, wait_gone
from test_batch_live import sbatch, wait_done
from test_elastic_live import ElasticCluster
from testbed_support import REPO, Testbed

pytestmark = [pytest.mark.slurm, pytest.mark.ray]

SOCKET_TIMEOUT = "slurm_load_jobs error: Socket timed out on send/recv operation"


@pytest.fixture
def faults():
    # under the checkout, which the test bed's nodes share (their /tmp is private), so the
    # head's autoscaler and the srun clients on the nodes see the same wrappers and rules
    root = REPO / ".test-output" / f"faults-{uuid.uuid4().hex[:8]}"
    fc = FaultyCommands(root)
    fc.install()
    yield fc
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def job(testbed: Testbed):
    job = testbed.salloc("-N3", "-c2", "--mem=3000", "-J", "eray-faults")
    yield job
    testbed.cancel(job)


def our_steps(testbed: Testbed, job: str, cluster: str) -> list[str]:
    out = testbed.run(["squeue", "-h", "-s", "-j", job, "-o", "%j"]).stdout.split()
    return [name for name in out if name.startswith(f"eray.{cluster}.")]


def faulty_cluster(testbed: Testbed, job: str, tmp_path, name: str, faults: FaultyCommands) -> Cluster:
    cluster = Cluster(testbed, job, tmp_path, name)
    cluster.env = faults.env(cluster.env)
    # short tries so a controller that stays down is reported in seconds, not minutes
    cluster.env.update(ERAY_SLURM_TIMEOUT="5", ERAY_SLURM_ATTEMPTS="3")
    return cluster


def test_a_flaky_controller_loses_no_state_and_starts_no_second_head(testbed, job, tmp_path, faults) -> None:
    cluster = faulty_cluster(testbed, job, tmp_path, "flaky", faults)
    try:
        # every SLURM read of `ray up` fails twice before it answers: retried, not a verdict
        faults.fail("squeue", times=2)
        faults.fail("scontrol", times=2)
        cluster.up()
        assert len(faults.faulted("squeue")) == 2 and len(faults.faulted("scontrol")) == 2
        cluster.wait_nodes(3)
        steps = our_steps(testbed, job, "flaky")
        assert sorted(s.split(".")[2] for s in steps) == ["head", "workers"], steps

        # the head's autoscaler rounds while squeue fails: no node is taken for dead
        mark = faults.mark()
        faults.always_fail("squeue", match=" -s")
        # three of the head's step listings (3 tries each) fail: several autoscaler rounds
        faults.wait_calls("squeue", 9, timeout=120, faulted=True, since=mark)
        launches = [c for c in faults.calls("srun", since=mark) if "workers" in " ".join(c.argv)]
        assert launches == [], "a worker was relaunched while squeue gave no answer"

        # a second `ray up` whose first (and every) step listing fails: the launched head is
        # not taken for dead, so no second head starts
        cluster.up()
        assert our_steps(testbed, job, "flaky") == steps
        heads = [r for r in cluster_records(cluster) if r["role"] == "head"]
        assert len(heads) == 1, heads

        # `ray down` while squeue stays down: an error, the state and the steps are kept
        down = cluster.down(check=False)
        assert down.returncode != 0
        assert "squeue" in down.stdout + down.stderr and SOCKET_TIMEOUT in down.stdout + down.stderr
        assert cluster.state_dir.exists()
        assert our_steps(testbed, job, "flaky") == steps
        # and the cluster, being stopped, launches nothing new
        refused = cluster.ray("up", "-y", str(cluster.config), check=False)
        assert refused.returncode != 0 and "being stopped" in refused.stdout + refused.stderr

        # the controller answers again: the next `ray down` finishes the job
        faults.clear()
        faults.fail("scancel", times=2)  # and a flaky scancel is retried
        cluster.down()
        assert len(faults.faulted("scancel")) == 2
        assert our_steps(testbed, job, "flaky") == []
        assert wait_gone(job, "flaky") == []
        assert state_left(cluster.state_dir) == []
    finally:
        faults.clear()
        cluster.down(check=False)


def cluster_records(cluster: Cluster) -> list[dict]:
    return list(json.loads((cluster.state_dir / "state.json").read_text())["nodes"].values())


def test_ray_down_while_workers_launch_leaves_no_step(testbed, job, tmp_path, faults) -> None:
    cluster = faulty_cluster(testbed, job, tmp_path, "racing", faults)
    # the workers' srun (started with the head) reaches the controller 10 s late: `ray
    # down` runs while it is in flight, before squeue can list its step
    faults.hang("srun", times=1, seconds=10, then="real", match="workers")
    # and `ray up`'s copy of its config to the head (after the workers' launch) is held
    # until `ray down` has ended: the copy must not bring back the state dir it removed
    down_ended = tmp_path / "down-ended"
    faults.hang("srun", times=1, seconds=300, then="real", match="ray_bootstrap_config", until=down_ended)
    up_out = tmp_path / "up.out"
    with up_out.open("wb") as out:
        up = subprocess.Popen(
            ["ray", "up", "-y", str(cluster.config)],
            env=cluster.env,
            cwd=str(REPO),
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def launched() -> list:
        return [c for c in faults.faulted("srun") if "workers" in " ".join(c.argv)]

    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not launched():
            assert up.poll() in (None, 0), "ray up failed: " + up_out.read_text()[-3000:]
            time.sleep(0.2)
        assert launched(), "the workers were never launched"
        down = cluster.down(check=False)
        assert down.returncode == 0, down.stdout + down.stderr
        down_ended.touch()
        # until the late srun has ended (killed with the head's step, or run and cancelled):
        # its step, if it ever ran, is listed by then
        (late,) = launched()
        deadline = time.monotonic() + 60
        while Path(f"/proc/{late.pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not Path(f"/proc/{late.pid}").exists(), "the late srun is still running"
        # `ray up` fails, and says why: its cluster was torn down under it
        assert up.wait(timeout=300) != 0, up_out.read_text()[-3000:]
        said = up_out.read_text()
        assert "has been torn down" in said or "is being stopped" in said, said[-3000:]
        assert our_steps(testbed, job, "racing") == []
        assert wait_gone(job, "racing") == []
        assert state_left(cluster.state_dir) == [], up_out.read_text()[-3000:]
    finally:
        down_ended.touch()
        if up.poll() is None:
            up.kill()
        up.wait(timeout=60)
        faults.clear()
        cluster.down(check=False)


def test_eray_provider_run_rides_out_a_flaky_controller(testbed, faults) -> None:
    out = faults.root / "run.out"
    env = faults.env(testbed.env)
    env.update(ERAY_SLURM_TIMEOUT="5", ERAY_SLURM_ATTEMPTS="3")
    # SLURM's reads fail now and then while the batch job builds and tears down its cluster
    faults.fail("squeue", times=2)  # one call of the teardown, retried within it
    faults.fail("scontrol", times=1, match="show job")
    faults.fail("scancel", times=2)
    job = sbatch(testbed, out, env=env)
    code = wait_done(testbed, job)
    text = out.read_text()
    assert code == "0", text[-3000:]
    assert "PSUM 6.0 6.0 6.0" in text and "cluster stopped" in text, text[-3000:]
    assert len(faults.faulted("squeue")) == 2 and len(faults.faulted("scancel")) == 2, text[-3000:]
    assert len(faults.faulted("scontrol")) == 1
    assert cluster_pids(job, "run") == []
    assert state_left(Path.home() / ".eray-provider" / f"run-{job}") == []


def test_two_elastic_ray_ups_submit_one_head_job(testbed, tmp_path, faults) -> None:
    cluster = ElasticCluster(testbed, tmp_path, "twoup")
    cluster.env = faults.env(cluster.env)
    cluster.env.update(ERAY_SLURM_TIMEOUT="5", ERAY_SLURM_ATTEMPTS="3")
    # job listings fail now and then (never more than one call's tries can take): retried,
    # and no head job is cancelled or submitted twice for it
    faults.fail("squeue", times=2, match="-u ")
    ups = [
        subprocess.Popen(
            ["ray", "up", "-y", str(cluster.config)],
            env=cluster.env,
            cwd=str(REPO),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        outputs = [up.communicate(timeout=400)[0] for up in ups]
        assert [up.returncode for up in ups] == [0, 0], "\n\n".join(o[-3000:] for o in outputs)
        assert len(faults.faulted("squeue")) == 2
        jobs = cluster.jobs()
        assert list(jobs.values()) == ["eray.twoup.head"], jobs  # one head job, not two
        submitted = [c for c in faults.calls("sbatch") if "eray.twoup.head" in " ".join(c.argv)]
        assert len(submitted) == 1, submitted
        assert len(cluster.alive_nodes()) == 1
    finally:
        for up in ups:
            if up.poll() is None:
                up.kill()
        faults.clear()
        cluster.down(check=False)
    assert cluster.wait_jobs(lambda j: not j, timeout=120, what="no job of the cluster") == {}
