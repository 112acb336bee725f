"""JAX on a provider-built cluster (CPU, gloo): psum example, groups, failures, runtime hook."""

from __future__ import annotations

import json
import re

import pytest
from ray_cluster_support import Cluster
from testbed_support import REPO, Testbed

pytestmark = [pytest.mark.slurm, pytest.mark.ray]


@pytest.fixture(scope="module")
def jax_cluster(testbed: Testbed, tmp_path_factory):
    job = testbed.salloc("-N3", "-c2", "--gpus-per-node=2", "--mem=3000", "-J", "eray-jax")
    cluster = Cluster(
        testbed,
        job,
        tmp_path_factory.mktemp("jax"),
        "jaxtest",
        provider={"jax_env": {"JAX_PLATFORMS": "cpu"}},
    )
    try:
        cluster.up()
        cluster.wait_nodes(3)
        yield cluster
    finally:
        cluster.down(check=False)
        testbed.cancel(job)


def markers(out: str, name: str) -> list[str]:
    """What follows ``name`` on each line that has it: anywhere in the line, as Ray's log
    forwarding thread writes to the driver's stdout beside its prints (``print`` writes a
    line and its newline apart), so a marker may follow another's text on one line."""
    tag = re.compile(rf"(?<![A-Z_]){re.escape(name)} ")  # not the end of a longer name
    found = (tag.search(line) for line in out.splitlines())
    return [m.string[m.end() :] for m in found if m]


def test_psum_example_one_rank_per_node(jax_cluster: Cluster) -> None:
    proc = jax_cluster.ray("submit", str(jax_cluster.config), "examples/jax_psum.py")
    out = proc.stdout
    ranks = markers(out, "RANK")
    assert len(ranks) == 3, out[-4000:]
    assert [r.split()[2].rstrip(":") for r in ranks] == ["node1", "node2", "node3"]  # node order
    assert all("psum=6.0 allgather=[0, 1, 2]" in r for r in ranks)
    # the group ends without JAX aborting a rank on the way out
    assert "Terminating process because" not in out + proc.stderr


def test_two_groups_one_after_the_other_and_at_once(jax_cluster: Cluster) -> None:
    proc = jax_cluster.ray("submit", str(jax_cluster.config), "tests/drivers/jax_groups.py", "sequential")
    out = proc.stdout
    # each healthy group closes its JAX clients before its processes go: no rank aborts
    assert "Terminating process because" not in out + proc.stderr
    seq = markers(out, "SEQ")
    assert len(seq) == 2
    for line in seq:
        assert [r["sum"] for r in json.loads(line.split(" ", 1)[1])] == [6, 6, 6]
    out = jax_cluster.ray(
        "submit", str(jax_cluster.config), "tests/drivers/jax_groups.py", "concurrent"
    ).stdout
    (ports,) = markers(out, "PORTS")
    a, b = (int(p) for p in ports.split())
    assert a != b
    (conc,) = markers(out, "CONC")
    assert conc.count('"sum": 6') == 6


def test_plain_actors_initialize_with_rank_0_anywhere_and_one_group_after_another(
    jax_cluster: Cluster,
) -> None:
    """``initialize(rank, world)`` with no coordinator: rank 0 serves on its own node
    (here not the head), the others find it through the GCS; ten groups of the same
    default name, each started right after ``ray.kill`` of the one before, all right."""
    proc = jax_cluster.ray(
        "submit", str(jax_cluster.config), "tests/drivers/jax_groups.py", "plain", "10", timeout=900
    )
    out = proc.stdout
    assert markers(out, "PLAINFAIL") == [], out[-3000:]
    assert "Failed to add port" not in out + proc.stderr
    # no rank joined another group's coordinator (the killed groups' ranks that outlive their
    # rank 0 do abort with JAX's own "Terminating process because ...": see docs/jax.md)
    assert "incarnation" not in out + proc.stderr
    rounds = [json.loads(line.split(" ", 1)[1]) for line in markers(out, "PLAIN")]
    assert len(rounds) == 10, out[-3000:]
    for r in rounds:
        assert [x["sum"] for x in r["out"]] == [6, 6, 6] and [x["world"] for x in r["out"]] == [3, 3, 3]
        assert [x["rank"] for x in r["out"]] == [0, 1, 2]
    head_ip = rounds[0]["ips"][1]  # the first group's rank 1 ran on node1, the head
    assert rounds[0]["ips"][0] != head_ip and rounds[1]["ips"][0] != head_ip


def test_killed_rank_raises_in_bounded_time_and_leaves_nothing(jax_cluster: Cluster) -> None:
    out = jax_cluster.ray("submit", str(jax_cluster.config), "tests/drivers/jax_groups.py", "kill").stdout
    assert not markers(out, "NOERROR")
    (err,) = markers(out, "GROUPERROR")
    info = json.loads(err)
    assert info["rank"] == 1 and info["node"] == "node2" and "rank 1 on node node2" in info["msg"]
    assert info["seconds"] < 60
    assert markers(out, "ALIVE_AFTER") == ["0"]


def test_job_submit_without_runtime_env_gets_the_hook(jax_cluster: Cluster) -> None:
    dashboard = json.loads((jax_cluster.state_dir / "ports.json").read_text())["dashboard"]
    script = REPO / "tests" / "drivers" / "jax_hook_job.py"
    out = jax_cluster.exec(
        f"ray job submit --address http://$ERAY_HEAD_IP:{dashboard} -- python {script}", timeout=300
    ).stdout
    (env,) = markers(out, "ENV")
    env = json.loads(env)
    assert env["SLURM_JOB_ID"] is None and env["ERAY_SLURM_JOB_ID"] == jax_cluster.job_id
    assert env["JAX_PLATFORMS"] == "cpu"
    (hooked,) = markers(out, "HOOKED")
    ranks = json.loads(hooked)
    assert [(r["rank"], r["world"], r["gathered"]) for r in ranks] == [(i, 3, [0, 1, 2]) for i in range(3)]
    assert [r["host"] for r in ranks] == ["node1", "node2", "node3"]
