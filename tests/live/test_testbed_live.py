"""Live tests on the real SLURM test bed: daemons, namespaces, GPUs, cgroups, scontrol."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hostlist_cases import expression, names
from testbed_support import Testbed

from eray_provider.slurm.client import load_allocation
from eray_provider.slurm.env import allocation_from_env
from eray_provider.slurm.hostlist import HostlistError, compress, expand
from eray_provider.slurm.scontrol import parse_job

pytestmark = pytest.mark.slurm


def test_three_nodes_three_hostnames_and_addresses(testbed: Testbed) -> None:
    out = testbed.run(["srun", "-N3", "bash", "-c", "echo $(hostname) $(hostname -i)"]).stdout
    rows = sorted(line.split() for line in out.splitlines())
    assert [r[0] for r in rows] == ["node1", "node2", "node3"]
    assert len({r[1] for r in rows}) == 3
    assert not any(r[1].startswith("127.") for r in rows)


def test_nodes_have_private_tmp_and_reach_each_other(testbed: Testbed) -> None:
    marker = f"/tmp/eray-private-{random.randrange(10**9)}"
    testbed.on_node("node1", f"touch {marker}")
    try:
        assert testbed.on_node("node2", f"test -e {marker}", check=False).returncode == 1
        assert testbed.on_node("node1", f"test -e {marker}").returncode == 0
        # a TCP server on node2 answers node1
        code = (
            "import socket;s=socket.socket();s.bind(('node2',47123));s.listen();"
            "c,_=s.accept();c.sendall(b'hi-from-node2');c.close()"
        )
        listener = subprocess.Popen(
            ["scripts/slurm-testbed", "--dir", testbed.root, "exec", "node2", sys.executable, "-c", code],
            cwd=str(__import__("testbed_support").REPO),
        )
        try:
            got = testbed.on_node(
                "node1",
                f'{sys.executable} -c "import socket,time\n'
                "for i in range(100):\n"
                "  try:\n    s=socket.create_connection(('node2',47123),timeout=2);break\n"
                "  except OSError: time.sleep(0.1)\n"
                'print(s.recv(100).decode())"',
            ).stdout
            assert got.strip() == "hi-from-node2"
        finally:
            listener.wait(timeout=30)
    finally:
        testbed.on_node("node1", f"rm -f {marker}")


def test_gpu_variables(testbed: Testbed) -> None:
    out = testbed.run(
        [
            "srun",
            "-N3",
            "--gpus-per-node=2",
            "bash",
            "-c",
            "echo $(hostname) $CUDA_VISIBLE_DEVICES $SLURM_GPUS_ON_NODE",
        ]
    ).stdout
    rows = sorted(line.split() for line in out.splitlines())
    assert [r[0] for r in rows] == ["node1", "node2", "node3"]
    for _, cvd, count in rows:
        assert len(cvd.split(",")) == 2 and count == "2"


def test_allocation_from_salloc_env_agrees_with_scontrol(testbed: Testbed) -> None:
    dump = (
        f'{sys.executable} -c "import json,os,subprocess;'
        "print(json.dumps({'env': dict(os.environ), 'scontrol': subprocess.run("
        "['scontrol','show','job','-d',os.environ['SLURM_JOB_ID']],capture_output=True,"
        'text=True).stdout}))"'
    )
    proc = testbed.run(["salloc", "-N3", "-c2", "--gpus-per-node=2", "--mem-per-cpu=300", "bash", "-c", dump])
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    from_env = allocation_from_env(doc["env"])
    from_scontrol = parse_job(doc["scontrol"])
    assert from_env.node_names == from_scontrol.node_names == ["node1", "node2", "node3"]
    for a, b in zip(from_env.nodes, from_scontrol.nodes):
        assert (a.cpus, a.gpus, a.memory_mb) == (b.cpus, b.gpus, b.memory_mb) == (2, 2, 600)
    assert from_scontrol.head.gpu_type == "testgpu"


def test_login_side_reads_job_through_scontrol(testbed: Testbed, allocation: str) -> None:
    alloc = load_allocation(
        allocation,
        env={
            "SLURM_CONF": testbed.env["SLURM_CONF"],
            **{k: v for k, v in testbed.env.items() if not k.startswith("SLURM_JOB")},
        },
    )
    assert alloc.source == "scontrol" and alloc.job_id == allocation
    # the bed's job ids start where no earlier bed's on this machine did (FirstJobId)
    first = json.loads(Path(testbed.root, "state.json").read_text())["first_job_id"]
    assert first >= 1000 and first <= int(allocation) < first + 100_000
    assert [(n.name, n.cpus, n.gpus, n.memory_mb) for n in alloc.nodes] == [
        (f"node{k}", 2, 2, 1500) for k in (1, 2, 3)
    ]
    proc = testbed.run(
        [sys.executable, "-m", "eray_provider.cli", "inspect", "--job-id", allocation, "--json"]
    )
    doc = json.loads(proc.stdout)
    assert doc["head"] == "node1" and len(doc["nodes"]) == 3
    assert 20000 <= doc["ports"]["gcs"] < 32768


def test_scancel_kills_daemonized_process(testbed: Testbed, allocation: str) -> None:
    tag = f"eray-daemon-{random.randrange(10**9)}"
    step = subprocess.Popen(
        [
            "srun",
            f"--jobid={allocation}",
            "--overlap",
            "-N1",
            "-n1",
            "-w",
            "node2",
            "bash",
            "-c",
            f"setsid nohup bash -c 'exec -a {tag} sleep 600' >/dev/null 2>&1 < /dev/null & sleep 600",
        ],
        env=testbed.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 30
        while time.time() < deadline and not _pids_named(tag):
            time.sleep(0.2)
        assert _pids_named(tag), "the daemonized process never started"
        testbed.cancel(allocation)
        deadline = time.time() + 30
        while time.time() < deadline and _pids_named(tag):
            time.sleep(0.2)
        assert not _pids_named(tag), "scancel left the daemonized process running"
    finally:
        step.wait(timeout=60)


def _pids_named(tag: str) -> list[int]:
    """The processes whose argv[0] is ``tag`` (``exec -a``): not the srun client or the
    shell whose command lines hold it too (they would make the start seen before it is)."""
    out = subprocess.run(["pgrep", "-f", f"^{tag}( |$)"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_expand_equals_scontrol_on_generated_expressions(testbed: Testbed) -> None:
    rng = random.Random(20261202)
    exprs = [expression(rng) for _ in range(2200)]
    results = testbed.scontrol_batch([f"show hostnames {e}" for e in exprs])
    compared = 0
    for expr, theirs in zip(exprs, results):
        if theirs and theirs[0].startswith("Invalid hostlist"):
            continue
        assert expand(expr) == theirs, expr
        compared += 1
    assert compared >= 2000


def test_compress_equals_scontrol_on_generated_lists(testbed: Testbed) -> None:
    rng = random.Random(7)
    lists = [names(rng) for _ in range(600)]
    commands = []
    for xs in lists:
        commands += [f"show hostlist {','.join(xs)}", f"show hostlistsorted {','.join(xs)}"]
    results = testbed.scontrol_batch(commands)
    for i, xs in enumerate(lists):
        assert [compress(xs)] == results[2 * i], xs
        assert [compress(xs, sort=True)] == results[2 * i + 1], xs


def test_invalid_expression_is_rejected_by_both(testbed: Testbed) -> None:
    for bad in ("n[3-1]", "n[]", "n[a]", "n[1,,2]"):
        (theirs,) = testbed.scontrol_batch([f"show hostnames {bad}"])
        assert theirs and theirs[0].startswith("Invalid hostlist")
        with pytest.raises(HostlistError):
            expand(bad)
