"""pyxis and enroot on the test bed (``slurm-testbed up --containers``), as a site runs them,
and eray-provider's clusters in a container (``provider.container``, ``run --container-image``).

The bed's slurmd loads pyxis 0.24.0 (``plugstack.conf``), enroot 4.1.2 keeps its data under
each node's private /tmp, and ``scripts/test-image`` makes the test image: Debian 12, its
Python, and the Ray and JAX of this suite. On real steps: a step runs in the image as root
and as another user; a named container is entered by the job's next steps and outlives its
job (pyxis' default ``container_scope=global``) until ``enroot remove`` takes it. On real
clusters: every node's Ray in the image, ``ray exec``/``submit`` there, the co-tenant checks,
a leftover container replaced, ``ray down`` leaving nothing; an image of another Ray refused;
a container path another user made first refused before anything runs in it; ``eray-provider
run`` in an sbatch script with COMMAND in the image and a signal passed to it; an elastic
cluster whose worker jobs run in the image and whose head submits them through the host."""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import pytest
import ray
from ray_cluster_support import (
    VENV_BIN,
    Cluster,
    cluster_pids,
    collected_logs,
    node_tmp_entries,
    state_left,
    wait_gone,
)
from testbed_support import REPO, Testbed, binds_as, listeners, other_user, require, wait_until

from eray_provider.runtime.launch import HEAD_READY_TIMEOUT
from eray_provider.slurm.walltime import END_SIGNAL

pytestmark = [pytest.mark.slurm, pytest.mark.ray]

NODES = ("node1", "node2", "node3")

#: What a step prints of the world it runs in.
PROBE = (
    "import json, os, sys, ray, jax; print('PROBE ' + json.dumps({'ray': ray.__version__, "
    "'jax': jax.__version__, 'python': '%d.%d' % sys.version_info[:2], 'uid': os.getuid(), "
    "'os': open('/etc/os-release').read().split('VERSION_CODENAME=')[1].split()[0], "
    f"'host_python': os.path.exists({sys.executable!r})}}))"
)


def image_of(testbed: Testbed, *versions: str) -> str:
    """A test image (built once per machine and recipe) of this suite's Ray and JAX, or of
    ``--ray X --jax Y``, on a bed that has pyxis."""
    if "--container-image" not in testbed.run(["srun", "--help"]).stdout or not testbed.enroot:
        require("the test bed has no pyxis/enroot: bring it up with `slurm-testbed up --containers`")
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "test-image"), *versions],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode != 0:
        require(f"scripts/test-image failed: {proc.stderr.strip()[-3000:]}")
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def image(testbed: Testbed) -> str:
    return image_of(testbed)


def probe(testbed: Testbed, argv: list[str], user: str | None = None) -> dict:
    env_argv = ["env", f"PATH={testbed.env['PATH']}", f"SLURM_CONF={testbed.env['SLURM_CONF']}"]
    prefix = ["runuser", "-u", user, "--", *env_argv] if user else []
    out = testbed.run([*prefix, *argv, "python3", "-c", PROBE], timeout=300, cwd="/").stdout
    (line,) = [line for line in out.splitlines() if line.startswith("PROBE ")]
    return json.loads(line[len("PROBE ") :])


def raylets_in_the_image(job: str, cluster: str, count: int) -> list[int]:
    """The cluster's ``count`` raylets, each shown to run in a container of the image: its
    root is another file system than the node's (the container's, unpacked by enroot), with
    the image's Ray where the host has none."""
    raylets = [
        pid for pid in cluster_pids(job, cluster) if Path(f"/proc/{pid}/comm").read_text().strip() == "raylet"
    ]
    assert len(raylets) == count, raylets
    for pid in raylets:
        assert os.stat(f"/proc/{pid}/root").st_dev != os.stat("/").st_dev, pid
        assert list(Path(f"/proc/{pid}/root/usr/local/lib").glob("python3*/dist-packages/ray")), pid
    return raylets


def test_a_step_runs_in_the_test_image_as_root_and_as_another_user(testbed: Testbed, image: str) -> None:
    for user in (None, other_user()):
        seen = probe(testbed, ["srun", "-N1", "-w", "node2", f"--container-image={image}"], user)
        # the image's Debian, Python and Ray; not the host's Python
        assert seen["os"] == "bookworm" and not seen["host_python"], seen
        assert (seen["ray"], seen["jax"]) == (ray.__version__, jax.__version__), seen
        assert seen["python"] == f"{sys.version_info[0]}.{sys.version_info[1]}", seen
        # the caller's own uid inside, not root (pyxis' default: no --container-remap-root)
        assert seen["uid"] == (pwd.getpwnam(user).pw_uid if user else 0), seen


def test_a_named_container_is_entered_by_the_jobs_next_steps_and_removed_by_enroot(
    testbed: Testbed, image: str
) -> None:
    job = testbed.salloc("-N1", "-w", "node3", "-c1", "--mem=500", "-J", "eray-test-container")
    name = f"eray-test-{job}"
    step = ["srun", f"--jobid={job}", "--overlap", "--quiet"]
    holder = None
    try:
        holder = subprocess.Popen(
            [*step, f"--container-image={image}", f"--container-name={name}", "bash", "-c",
             "echo mine > /tmp/marker && echo HELD && exec sleep 600"],
            env=testbed.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        assert holder.stdout is not None
        lines = []
        bound = threading.Timer(300, holder.kill)  # a step that never starts ends the wait
        bound.start()
        for line in holder.stdout:
            lines.append(line)
            if line.startswith("HELD"):
                break
        bound.cancel()
        assert lines and lines[-1].startswith("HELD"), "".join(lines)
        # a step that enters the running container sees its /tmp (a tmpfs of that container)
        inside = testbed.run([*step, f"--container-name={name}:exec", "cat", "/tmp/marker"], timeout=120)
        assert inside.stdout.strip() == "mine", inside
        # a step outside it does not: the node's /tmp is another file system
        outside = testbed.run([*step, "cat", "/tmp/marker"], check=False)
        assert outside.returncode != 0 and "mine" not in outside.stdout, outside
    finally:
        if holder is not None:
            holder.kill()
            holder.wait(timeout=60)
        testbed.cancel(job)
    # the named container outlives the job (pyxis' global scope) until enroot removes it
    data = "/tmp/enroot-0/data"
    deadline = time.monotonic() + 120
    while testbed.run(["squeue", "-h", "-j", job, "-o", "%T"], check=False).stdout.strip():
        assert time.monotonic() < deadline, f"job {job} did not end"
        time.sleep(1)
    listed = testbed.on_node("node3", f"ls {data}").stdout.split()
    assert f"pyxis_{name}" in listed, listed
    enroot = f"{testbed.enroot}/bin/enroot"
    testbed.on_node("node3", f"{enroot} remove -f pyxis_{name}")
    assert f"pyxis_{name}" not in testbed.on_node("node3", f"ls {data}").stdout.split()


def test_a_cluster_in_the_image_runs_jax_and_ray_down_leaves_no_container(
    testbed: Testbed, image: str, tmp_path
) -> None:
    """``provider.container.image``: every node's Ray runs in the image (the raylet's root is
    the container's), ``ray exec`` and ``ray submit`` of the JAX example run there too, and
    ``ray down`` leaves no step, no container and no temp dir on any node.

    A leftover container of the cluster's name and job (an earlier cluster's, of another
    image) is replaced by the image's, and the co-tenant checks hold in the container: no
    listener of the cluster on all interfaces, no loopback port of its block free to another
    user, the token and the containers' processes closed to that user."""
    old = image_of(testbed, "--ray", "2.52.0", "--jax", "0.4.30")
    job = testbed.salloc("-N3", "-c2", "--mem=3000", "-J", "eray-test-incontainer")
    cluster = Cluster(
        testbed,
        job,
        tmp_path,
        "incont",
        provider={"container": {"image": image}, "jax_env": {"JAX_PLATFORMS": "cpu"}},
    )
    try:
        # node3 keeps a container of the cluster's name made from the older image
        testbed.run(
            ["srun", f"--jobid={job}", "--overlap", "-N1", "-w", "node3", f"--container-image={old}",
             f"--container-name=eray.incont.{job}:no_exec", "true"],
            timeout=300,
        )  # fmt: skip
        assert f"pyxis_eray.incont.{job}" in testbed.on_node("node3", "ls /tmp/enroot-0/data").stdout.split()
        cluster.up()
        nodes = cluster.wait_nodes(3)
        assert len(nodes) == 3  # node3's Ray is the image's: the older one would refuse to start
        user = other_user()
        plan = json.loads((cluster.state_dir / "ports.json").read_text())
        block = range(plan["block_start"], plan["max_worker"] + 1)
        named = range(plan["block_start"], plan["jax_first"])
        token = cluster.state_dir / "auth_token"
        for node in NODES:
            ours = [r for r in listeners(testbed, node) if r[1] in block]
            assert len(ours) >= 4, (node, ours)  # raylet, object manager, agent, runtime env agent
            assert [r for r in ours if r[0] in ("*", "0.0.0.0", "::")] == [], (node, ours)
            loopback = [(address, port) for port in named for address in ("127.0.0.1", "::1")]
            assert binds_as(testbed, node, user, loopback) == [], node
            read = testbed.on_node(node, f"runuser -u {user} -- cat {token}", check=False)
            assert read.returncode != 0 and "Permission denied" in read.stderr, (node, read)
        # each node's raylet runs in the container
        raylets = raylets_in_the_image(job, "incont", 3)
        for pid in raylets:
            # the container's files, through its process, are closed to the other user
            look = testbed.run(["runuser", "-u", user, "--", "ls", f"/proc/{pid}/root/"], check=False)
            assert look.returncode != 0 and "Permission denied" in look.stderr, (pid, look)
        assert not list(Path("/usr/local/lib").glob("python3*/dist-packages/ray"))
        seen = cluster.exec(
            "python3 -c 'import sys, ray; print(\"INSIDE\", sys.executable, ray.__version__)'"
        ).stdout
        assert f"INSIDE /usr/bin/python3 {ray.__version__}" in seen, seen
        psum = cluster.ray("submit", str(cluster.config), "examples/jax_psum.py", timeout=300).stdout
        assert "psum and process_allgather correct across 3 processes on 3 nodes" in psum, psum[-3000:]
        cluster.down()
        # each node's process, in its container, got the teardown's SIGTERM through srun,
        # pyxis and enroot, and stopped its Ray in order: it collected its node's logs
        logs = collected_logs(cluster.state_dir)
        assert len(logs) == 3 and all(meta.get("complete") for meta in logs.values()), logs
        steps = testbed.run(["squeue", "-h", "-s", "-j", job, "-o", "%j"]).stdout
        assert "eray." not in steps, steps
        for node in NODES:
            assert node_tmp_entries(testbed, node, job) == []
            left = testbed.on_node(node, "ls /tmp/enroot-0/data 2>/dev/null || true").stdout.split()
            assert f"pyxis_eray.incont.{job}" not in left, (node, left)
    finally:
        cluster.down(check=False)
        testbed.cancel(job)


def test_an_image_of_another_ray_fails_ray_up_naming_both_versions(testbed: Testbed, tmp_path) -> None:
    """The image's Ray is the oldest supported (2.52), the login side's this suite's: the
    head's node_run, the first process of the cluster in the image, refuses to start Ray, and
    ``ray up`` fails at once naming both (not after the head's start timeout, 300 s: the
    bound is half of it, for a loaded machine whose two nodes unpack the image meanwhile);
    nothing of the cluster is left."""
    other = image_of(testbed, "--ray", "2.52.0", "--jax", "0.4.30")
    job = testbed.salloc("-N2", "-w", "node[1-2]", "-c2", "--mem=2000", "-J", "eray-test-mismatch")
    cluster = Cluster(testbed, job, tmp_path, "mismatch", provider={"container": {"image": other}})
    try:
        start = time.monotonic()
        proc = cluster.ray("up", "-y", str(cluster.config), check=False, timeout=300)
        took = time.monotonic() - start
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, out[-3000:]
        assert (
            f"the container image has Ray 2.52.0 and Python 3.11, the login side Ray {ray.__version__}" in out
        ), out[-3000:]
        assert took < HEAD_READY_TIMEOUT / 2, took
    finally:
        cluster.down(check=False)
        testbed.cancel(job)
    assert "eray." not in testbed.run(["squeue", "-h", "-s", "-j", job, "-o", "%j"], check=False).stdout
    # the port probe made the container on both nodes: ray down removed it from both
    for node in ("node1", "node2"):
        left = testbed.on_node(node, "ls /tmp/enroot-0/data 2>/dev/null || true").stdout.split()
        assert f"pyxis_eray.mismatch.{job}" not in left, (node, left)


def test_a_container_path_another_user_made_first_refuses_the_cluster(
    testbed: Testbed, image: str, tmp_path
) -> None:
    """On node2 the other user has made enroot's dir for root (``/tmp/enroot-0``, as
    ``ENROOT_DATA_PATH`` is on the bed and at many sites) before root ever kept a container
    there, with a root file system of theirs under the cluster's container name, whose
    ``/etc/rc`` would mark that it ran. ``ray up`` is refused before any step of the cluster
    enters a container, naming the node, the dir and its owner; nothing planted ran, and the
    planted dir is left as it was."""
    user = other_user()
    uid = pwd.getpwnam(user).pw_uid
    job = testbed.salloc("-N2", "-w", "node[1-2]", "-c1", "--mem=1000", "-J", "eray-test-planted")
    name = f"pyxis_eray.planted.{job}"
    marker = REPO / ".test-output" / f"planted-ran-{job}"
    marker.parent.mkdir(exist_ok=True)
    testbed.on_node("node2", "rm -rf /tmp/enroot-0")  # a node root never kept a container on
    plant = (
        f"mkdir -p /tmp/enroot-0/data/{name}/etc /tmp/enroot-0/runtime && "
        f"printf '#!/bin/sh\\ntouch {marker}\\n' > /tmp/enroot-0/data/{name}/etc/rc && "
        f"chmod 755 /tmp/enroot-0 /tmp/enroot-0/data/{name}/etc/rc"
    )
    testbed.on_node("node2", f"runuser -u {user} -- sh -c {shlex.quote(plant)}")
    cluster = Cluster(testbed, job, tmp_path, "planted", provider={"container": {"image": image}})
    try:
        proc = cluster.ray("up", "-y", str(cluster.config), check=False, timeout=300)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, out[-3000:]
        assert (
            f"on node2, /tmp/enroot-0 (on the way to /tmp/enroot-0/data) belongs to {user} (uid {uid})" in out
        ), out[-3000:]
        assert "node1" not in out.split("will not start:")[1].split("(the site")[0], out[-3000:]
        assert not marker.exists(), "the planted container ran"
        owner = testbed.on_node("node2", f"stat -c %u /tmp/enroot-0/data/{name}/etc/rc").stdout
        assert owner.strip() == str(uid)
        steps = testbed.run(["squeue", "-h", "-s", "-j", job, "-o", "%j"]).stdout
        assert "eray." not in steps, steps
    finally:
        cluster.down(check=False)
        testbed.cancel(job)
        testbed.on_node("node2", "rm -rf /tmp/enroot-0")
        marker.unlink(missing_ok=True)


def test_eray_provider_run_in_an_sbatch_script_runs_nodes_and_command_in_the_image(
    testbed: Testbed, image: str
) -> None:
    """``eray-provider run --container-image``: every node's Ray and COMMAND run in the
    image (COMMAND is the image's ``/usr/bin/python3``, which has Ray and JAX where the
    host's has neither), its tasks reach every node and its JAX psum is right; a SIGTERM to
    the batch step reaches COMMAND in its container step, whose exit status the job takes;
    and nothing is left: no step, no container, no temp dir, no state."""
    out = REPO / ".test-output" / f"container-run-{os.getpid()}.out"
    out.parent.mkdir(exist_ok=True)
    out.unlink(missing_ok=True)
    script = out.with_suffix(".sh")
    script.write_text(
        "#!/bin/bash\n"
        f"exec eray-provider run --timeout 300 --container-image {image} --jax-env JAX_PLATFORMS=cpu "
        f"--container-mounts {REPO}/tests:{REPO}/tests:ro --container-workdir {REPO} "
        "-- /usr/bin/python3 tests/drivers/batch_wait_driver.py\n"
    )
    env = dict(testbed.env, PATH=f"{VENV_BIN}:{testbed.env['PATH']}")
    env.pop("SLURM_JOB_ID", None)
    proc = testbed.run(
        ["sbatch", "-N3", "-c2", "--mem=3000", f"--output={out}", "--chdir", str(REPO), str(script)], env=env
    )
    job = re.search(r"Submitted batch job (\d+)", proc.stdout).group(1)
    try:
        wait_until("the command waiting", lambda: "WAITING" in (out.read_text() if out.exists() else ""))
        testbed.run(["scancel", "--batch", "--signal=TERM", job])
        wait_until("the job's end", lambda: not testbed.run(["squeue", "-h", "-j", job], check=False).stdout)
    finally:
        testbed.cancel(job)
    text = out.read_text()
    assert "DRIVER /usr/bin/python3" in text, text[-3000:]
    assert "TASKS node1 node2 node3" in text and "PSUM 6.0 6.0 6.0" in text, text[-3000:]
    assert "GOT TERM" in text and "command exited 7" in text and "cluster stopped" in text, text[-3000:]
    exit_code = re.search(r"ExitCode=(\d+):", testbed.run(["scontrol", "show", "job", job]).stdout)
    assert exit_code and exit_code.group(1) == "7", text[-3000:]
    assert wait_gone(job, "run") == []
    for node in NODES:
        assert node_tmp_entries(testbed, node, job) == []
        left = testbed.on_node(node, "ls /tmp/enroot-0/data 2>/dev/null || true").stdout.split()
        assert f"pyxis_eray.run.{job}" not in left, (node, left)
    assert state_left(Path.home() / ".eray-provider" / f"run-{job}") == [], text[-2000:]


def test_an_elastic_cluster_in_the_image_runs_its_worker_jobs_there_and_leaves_nothing(
    testbed: Testbed, image: str, tmp_path
) -> None:
    """``SlurmJobProvider`` with ``provider.container``: the head's job and a worker job the
    autoscaler submits both run their Ray in the image, which has no SLURM commands: the
    head's autoscaler submits and cancels the worker's job through the host's relay
    (``slurm.host_commands``). The worker's job gates its node, then runs in a container of
    its step's own, which pyxis removes when the job is cancelled; ``ray down`` leaves no
    job, no container and no state."""
    from test_elastic_live import ElasticCluster

    cluster = ElasticCluster(
        testbed,
        tmp_path,
        "elcont",
        # the worker is idle from its work's end: its job must outlast the checks and the
        # drain below on a loaded bed before the autoscaler cancels it
        idle_timeout_minutes=1.0,
        provider={"container": {"image": image}},
    )
    data = "ls /tmp/enroot-0/data 2>/dev/null || true"
    try:
        cluster.up()
        jobs = cluster.jobs()
        assert list(jobs.values()) == ["eray.elcont.head"], jobs
        (head_job,) = jobs
        # the image has none of SLURM's commands: what the autoscaler runs, the host runs
        seen = cluster.exec("command -v sbatch squeue scancel srun || echo NONE").stdout
        assert "NONE" in seen and "/sbatch" not in seen, seen
        out = cluster.ray(
            "submit", str(cluster.config), "tests/drivers/elastic_demand.py", "--", "2", timeout=600
        ).stdout
        ran = [line.split()[1:] for line in out.splitlines() if line.startswith("RAN ")]
        assert len(ran) == 2, out[-3000:]
        (worker_node, worker_job), *_ = [r for r in ran if r[1] != head_job]
        assert cluster.jobs().get(worker_job) == f"eray.elcont.{head_job}.cpu", (ran, cluster.jobs())
        raylets_in_the_image(head_job, "elcont", 2)  # the head's and the worker's
        # SLURM's warning of the worker job's end (its --signal lead, or a preemption)
        # reaches node_run in its container, which drains its node now: that asks squeue
        # for the job's end from the container, through the relay
        state = Path.home() / ".eray-provider" / f"elcont-{head_job}"
        testbed.run(["scancel", f"--signal={END_SIGNAL}", worker_job])
        wait_until("the worker drained", lambda: (state / "nodes" / f"j{worker_job}-0.drain").exists())
        drained = json.loads((state / "nodes" / f"j{worker_job}-0.drain").read_text())
        assert f"SLURM job {worker_job} ends at" in drained["message"], drained
        # the worker's job is idle: the head cancels it (through the relay), and pyxis
        # removes its step's container on its node
        cluster.wait_jobs(lambda j: worker_job not in j, timeout=240, what="the idle worker's job cancelled")
        wait_until(
            "the worker's container removed",
            lambda: not [e for e in testbed.on_node(worker_node, data).stdout.split() if worker_job in e],
        )
        cluster.down()
        assert cluster.wait_jobs(lambda j: not j, timeout=120, what="no job of the cluster") == {}
        for node in NODES:
            left = testbed.on_node(node, data).stdout.split()
            assert not [e for e in left if "elcont" in e or worker_job in e], (node, left)
        assert state_left(state) == []
    finally:
        cluster.down(check=False)
