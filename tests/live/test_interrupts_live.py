"""Commands interrupted at the worst moment, on the test bed: what the next command finds
must be usable.

- ``ray down`` interrupted (Ctrl-C) as its teardown begins, 1.5 s and 4 s after it started:
  ``ray down`` again removes the state, and ``ray up`` then brings every node alive;
- ``ray up`` stopped by SIGINT, SIGTERM or SIGHUP during the port probe, the head's start
  and the workers' join: it stops the cluster it began (no state, no step), ends by that
  signal, and the next ``ray up`` brings every node alive;
- two ``ray up`` of one cluster at once, the second interrupted: the first reaches its
  head, one head runs; two ``ray down`` at once: both succeed, nothing is left;
- an elastic ``ray up`` stopped while its head's job is pending cancels the job it
  submitted; a second ``ray up`` that found that job and is interrupted leaves it, and the
  first reaches its head (one head job);
- ``eray-provider run`` given SIGTERM while its cluster starts: the command never runs,
  the cluster is torn down (no state, no step), the exit status says so; two runs of one
  name at once: one cluster, one command, the other refused;
- ``auto_ray_cluster`` given SIGTERM during its start: nothing is left, and the step ends
  at once (not after its join timeout).

(``dashboard`` ended by SIGTERM and ``logs --follow`` by SIGHUP are in their own tests.)
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from fault_injection import FaultyCommands
from ray_cluster_support import VENV_BIN, Cluster, state_left
from test_elastic_live import ElasticCluster
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


def _start(cmd: list[str], env, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        cmd, env=env, cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw
    )


def _read_until(proc: subprocess.Popen, text: str, timeout: float = 120) -> list[str]:
    """The lines ``proc`` prints up to the first holding ``text`` (an event of its flow);
    fails when it ends first or ``timeout`` passes."""
    seen: list[str] = []
    assert proc.stdout is not None
    watchdog = threading.Timer(timeout, proc.kill)  # the read below must not wait for ever
    watchdog.start()
    try:
        for line in proc.stdout:
            seen.append(line)
            if text in line:
                return seen
    finally:
        watchdog.cancel()
    raise AssertionError(f"never saw {text!r}: {''.join(seen[-20:])}")


def _ray_up(cluster: Cluster) -> subprocess.Popen:
    return _start(["ray", "up", "-y", str(cluster.config)], cluster.env)


def _any_ip_marker(state_dir: Path) -> bool:
    return any((state_dir / "nodes").glob("*.ip"))


def test_an_interrupted_ray_up_stops_what_it_began_and_doubled_commands_leave_one_cluster(
    testbed: Testbed, tmp_path
) -> None:
    job = testbed.salloc("-N3", "-c1", "--mem=1500", "-J", "eray-up-interrupt")
    cluster = Cluster(testbed, job, tmp_path, "upint")
    # the first port probe's srun (run by `ray up` on this host) answers 60 s late: the signal
    # meets `ray up` in the probe however fast or loaded the machine is (the probe's own step
    # lives about a second, too short to be seen reliably in squeue beside other clusters)
    faults = FaultyCommands(tmp_path / "faults")
    faults.install()
    cluster.env = faults.env(cluster.env)
    faults.hang("srun", times=1, seconds=60, then="real", match="eray.upint.probe")

    def steps(kind: str = "") -> list[str]:
        return [s for s in _cluster_steps(testbed, job, "upint") if f".{kind}" in s]

    points = [
        ("the port probe", signal.SIGINT, lambda: bool(faults.faulted("srun"))),
        ("the head's start", signal.SIGTERM, lambda: bool(steps("head"))),
        ("the workers' join", signal.SIGHUP, lambda: _any_ip_marker(cluster.state_dir)),
    ]
    try:
        for point, sig, reached in points:
            up = _ray_up(cluster)
            wait_until(point, reached, up, timeout=120)
            up.send_signal(sig)
            out, _ = up.communicate(timeout=300)
            name = signal.Signals(sig).name
            assert up.returncode == -sig, (point, out[-3000:])  # ended by that signal
            assert f"{name} during `ray up`: stopping the cluster it began" in out, (point, out[-3000:])
            assert state_left(cluster.state_dir) == [], (point, out[-3000:])
            assert steps() == [], point

        # two `ray up` at once: the second finds the first's head; interrupted, it leaves it
        first = _ray_up(cluster)
        wait_until("the first's head", lambda: bool(steps("head")), first, timeout=120)
        second = _ray_up(cluster)
        _read_until(second, "eray-provider: ")  # the second waits on the first's head
        second.send_signal(signal.SIGINT)
        out2, _ = second.communicate(timeout=300)
        assert "stopping the cluster it began" not in out2, out2[-3000:]
        out1, _ = first.communicate(timeout=600)
        assert first.returncode == 0, out1[-3000:]
        assert len(cluster.wait_nodes(3)) == 3
        assert len(steps("head")) == 1, steps()

        # two `ray down` at once: both end well, nothing is left
        downs = [_start(["ray", "down", "-y", str(cluster.config)], cluster.env) for _ in range(2)]
        outs = [d.communicate(timeout=300)[0] for d in downs]
        assert [d.returncode for d in downs] == [0, 0], [o[-2000:] for o in outs]
        assert state_left(cluster.state_dir) == [] and steps() == []
    finally:
        cluster.down(check=False)
        testbed.cancel(job)


def test_elastic_ray_up_interrupted_while_its_head_job_waits(testbed: Testbed, tmp_path) -> None:
    # every CPU of the bed is taken: the head's job waits (PENDING) as long as this runs
    blocker = testbed.salloc("-N3", "--exclusive", "-J", "eray-blocker")
    cluster = ElasticCluster(testbed, tmp_path, "elint")
    started: list[subprocess.Popen] = []
    try:
        # the `ray up` that submitted the head's job, stopped: the job is cancelled
        up = _ray_up(cluster)
        started.append(up)
        wait_until("the head's job", lambda: bool(cluster.jobs()), up, timeout=120)
        up.send_signal(signal.SIGTERM)
        out, _ = up.communicate(timeout=120)
        assert up.returncode != 0, out[-3000:]
        cluster.wait_jobs(lambda j: not j, timeout=60, what="the head's job cancelled")
        assert not list((Path.home() / ".eray-provider").glob("elint-head-*.log"))  # nor its log

        # two `ray up`: the second finds the first's job, is interrupted, and leaves it
        first = _ray_up(cluster)
        started.append(first)
        wait_until("the head's job", lambda: bool(cluster.jobs()), first, timeout=120)
        second = _ray_up(cluster)
        started.append(second)
        seen = _read_until(second, "Using the head's SLURM job")
        assert any("PENDING" in line for line in seen[-1:]), seen[-20:]
        second.send_signal(signal.SIGINT)
        out2, _ = second.communicate(timeout=120)
        assert "was submitted by another `ray up`: left to it" in out2, out2[-3000:]
        jobs = cluster.jobs()
        assert list(jobs.values()) == ["eray.elint.head"], jobs
        testbed.cancel(blocker)
        out1, _ = first.communicate(timeout=600)
        assert first.returncode == 0, out1[-3000:]
        assert list(cluster.jobs().values()) == ["eray.elint.head"]
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()  # its head's job, if any, is ended by name below
        testbed.cancel(blocker)
        cluster.down(check=False)
    cluster.wait_jobs(lambda j: not j, timeout=120, what="no job of the cluster")


def test_two_runs_of_one_name_at_once_make_one_cluster(testbed: Testbed) -> None:
    job = testbed.salloc("-N3", "-c1", "--mem=1500", "-J", "eray-run-twice")
    marker = REPO / ".test-output" / f"twice-{job}"
    marker.parent.mkdir(exist_ok=True)
    marker.unlink(missing_ok=True)
    env = dict(testbed.env, PATH=f"{VENV_BIN}:{testbed.env['PATH']}")
    env.pop("SLURM_JOB_ID", None)
    task = f"exec eray-provider run --name twice -- bash -c 'echo ran >> {marker}; sleep 5'"
    runs = [
        _start(["srun", f"--jobid={job}", "--overlap", "-N1", "-n1", "-w", "node1", "bash", "-c", task], env)
        for _ in range(2)
    ]
    try:
        outs = [r.communicate(timeout=400)[0] for r in runs]
        codes = sorted(r.returncode for r in runs)
        assert codes == [0, 2], outs  # 2: the name is taken (bad input), nothing started
        refused = outs[[r.returncode for r in runs].index(2)]
        assert "a cluster 'twice' of job" in refused and "already runs" in refused, refused[-2000:]
        assert marker.read_text() == "ran\n"  # the command ran once, in the one cluster
        assert state_left(Path.home() / ".eray-provider" / f"twice-{job}") == []
        assert _cluster_steps(testbed, job, "twice") == []
    finally:
        for r in runs:
            if r.poll() is None:
                r.kill()
        testbed.cancel(job)


def test_sigterm_during_auto_ray_cluster_start_leaves_nothing(testbed: Testbed) -> None:
    job = testbed.salloc("-N3", "-c1", "--mem=1500", "-J", "eray-auto-sigterm")
    pids = REPO / ".test-output" / f"auto-{job}"
    pids.mkdir(parents=True, exist_ok=True)
    code = "from eray_provider import auto_ray_cluster; auto_ray_cluster(timeout=240); print('CONNECTED')"
    task = f'echo $$ > {pids}/$SLURM_PROCID; exec {VENV_BIN}/python -c "{code}"'
    env = dict(testbed.env, JAX_PLATFORMS="cpu")
    step = _start(
        ["srun", f"--jobid={job}", "--overlap", "-N3", "-n3", "--ntasks-per-node=1", "bash", "-c", task], env
    )

    def head_step() -> bool:
        out = testbed.run(["squeue", "-h", "-s", "-j", job, "-o", "%j"], check=False).stdout.split()
        return any(s.startswith("eray.step") and ".head." in s for s in out)

    try:
        wait_until("the step cluster's head", head_step, step, timeout=120)
        # SLURM's SIGTERM reaches the first task (the one that builds the cluster) first
        testbed.on_node("node1", f"kill -TERM {(pids / '0').read_text().strip()}")
        out, _ = step.communicate(timeout=120)  # not the join timeout: everyone ends now
        assert "SIGTERM during the step's Ray cluster start: it was stopped" in out, out[-3000:]
        assert "CONNECTED" not in out
        assert step.returncode != 0  # the first task ended by SIGTERM, and srun ended the step
        left = [p for p in (Path.home() / ".eray-provider").glob(f"step*-{job}") if state_left(p)]
        assert left == []
        out_steps = testbed.run(["squeue", "-h", "-s", "-j", job, "-o", "%j"], check=False).stdout.split()
        assert [s for s in out_steps if s.startswith("eray.")] == []
    finally:
        if step.poll() is None:
            step.kill()
        testbed.cancel(job)
