"""The round's answers: ``node_tags`` and ``is_running`` served from what the last
``non_terminated_nodes`` computed (a dict lookup each at 10,000 nodes), never stale
after this provider's own writes, and recomputed when another process wrote."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from ray.autoscaler.tags import TAG_RAY_NODE_KIND, TAG_RAY_NODE_STATUS
from test_slurm_failures import _provider, fake

from eray_provider.autoscaler.views import FreshView, Memo
from eray_provider.runtime.cluster_state import READ_FRESH_SECONDS, ClusterState

LISTING = "echo '77.0 eray.c.head.1'; echo '77.1 eray.c.worker.2'\n"


def test_a_memo_is_reused_only_for_the_very_same_inputs() -> None:
    calls: list[tuple] = []
    memo: Memo[int] = Memo()
    a, b = {"x": 1}, {"x": 1}  # equal, not the same object

    def compute(*inputs: dict) -> int:
        calls.append(inputs)
        return len(calls)

    assert memo.get((a,), compute) == 1
    assert memo.get((a,), compute) == 1
    assert memo.get((b,), compute) == 2  # equal contents do not pass for the same input
    assert memo.get((b, a), compute) == 3
    memo.drop()
    assert memo.get((b, a), compute) == 4


def test_a_fresh_view_asks_for_its_inputs_again_only_after_the_freshness_window() -> None:
    view: FreshView[list] = FreshView()
    records = [{"n1": 1}]
    asked = []

    def inputs() -> tuple:
        asked.append(1)
        return (records[0],)

    assert view.get(inputs, lambda r: list(r)) == ["n1"]
    records[0] = {"n1": 1, "n2": 2}
    assert view.get(inputs, lambda r: list(r)) == ["n1"]  # inside the window
    assert len(asked) == 1
    time.sleep(READ_FRESH_SECONDS + 0.05)
    assert view.get(inputs, lambda r: list(r)) == ["n1", "n2"]
    view.drop()
    assert view.get(inputs, lambda r: list(r)) == ["n1", "n2"] and len(asked) == 3


def test_node_tags_and_is_running_answer_from_the_round(bindir: Path, tmp_path: Path) -> None:
    fake(bindir, "squeue", LISTING)
    provider, _ = _provider(tmp_path)
    assert provider.non_terminated_nodes({}) == ["n1.1", "n2.2"]
    tags = provider.node_tags("n2.2")
    assert tags == {TAG_RAY_NODE_KIND: "worker"} and provider.is_running("n2.2")
    with pytest.raises(TypeError, match="read-only tags"):
        tags["mutated"] = "by the caller"  # shared by every call: refused, not corrupted
    with pytest.raises(TypeError, match="read-only tags"):
        tags.update(more="tags")
    mine = tags.copy()
    mine["mutated"] = "in a copy"
    assert provider.node_tags("n2.2") == {TAG_RAY_NODE_KIND: "worker"}
    assert json.loads(json.dumps(tags)) == {TAG_RAY_NODE_KIND: "worker"}
    # a node outside the round is read from the state, not assumed
    assert provider.node_tags("n9.9") == {} and not provider.is_running("n9.9")


def test_the_providers_own_tag_write_is_answered_at_once(bindir: Path, tmp_path: Path) -> None:
    fake(bindir, "squeue", LISTING)
    provider, _ = _provider(tmp_path)
    provider.non_terminated_nodes({})
    provider.set_node_tags("n2.2", {TAG_RAY_NODE_STATUS: "setting-up"})
    assert provider.node_tags("n2.2")[TAG_RAY_NODE_STATUS] == "setting-up"
    provider.non_terminated_nodes({})
    assert provider.node_tags("n2.2")[TAG_RAY_NODE_STATUS] == "setting-up"


def test_another_process_write_is_answered_from_the_next_round(bindir: Path, tmp_path: Path) -> None:
    fake(bindir, "squeue", LISTING)
    provider, _ = _provider(tmp_path)
    provider.non_terminated_nodes({})
    other = ClusterState("c", "77", tmp_path / "state")  # the head's monitor, say

    other.set_tags("n2.2", {TAG_RAY_NODE_STATUS: "update-failed"})
    other.mark_terminated(["n2.2"])
    time.sleep(READ_FRESH_SECONDS + 0.05)
    assert provider.non_terminated_nodes({}) == ["n1.1"]
    assert not provider.is_running("n2.2") and provider.is_terminated("n2.2")
    assert provider.node_tags("n2.2")[TAG_RAY_NODE_STATUS] == "update-failed"


def test_is_terminated_does_not_wait_for_a_round(bindir: Path, tmp_path: Path) -> None:
    """Ray's updater polls ``is_terminated`` alone in its wait loops."""
    fake(bindir, "squeue", LISTING)
    provider, _ = _provider(tmp_path)
    provider.non_terminated_nodes({})
    other = ClusterState("c", "77", tmp_path / "state")
    other.mark_terminated(["n2.2"])
    time.sleep(READ_FRESH_SECONDS + 0.05)
    assert provider.is_terminated("n2.2")


def elastic_cluster(bindir: Path, tmp_path: Path, rows: list[str], workers: dict[str, dict]):
    """Cluster ``c`` of head job 77 (its head a step on n1), squeue listing ``rows`` (the
    jobs) and the head's step, and the records ``workers``: its provider and its state."""
    from eray_provider.autoscaler.elastic import SlurmJobProvider
    from eray_provider.plan.elastic_config import fill_elastic_config
    from eray_provider.plan.ports import choose_plan
    from eray_provider.slurm.allocation import Allocation, NodeShare

    listing = "\n".join(rows)
    steps = 'echo "77.0 eray.c.head.1"'
    fake(bindir, "squeue", f'case "$*" in *" -s "*) {steps};; *) printf "%s\\n" "{listing}";; esac\n')
    yaml = {
        "cluster_name": "c",
        "max_workers": 4,
        "provider": {"type": "external", "module": "x", "state_dir": str(tmp_path / "state")},
        "head_node_type": "head",
        "available_node_types": {
            "head": {"node_config": {"sbatch": {"cpus_per_node": 2}}},
            "cpu": {"min_workers": 0, "max_workers": 4, "node_config": {"sbatch": {"cpus_per_node": 2}}},
        },
    }
    head_alloc = Allocation("77", (NodeShare("n1", 2, 0, None, 4000),))
    config = fill_elastic_config(yaml, head_alloc, python="python3")
    state = ClusterState("c", "77", tmp_path / "state")
    state.create()
    state.save_ports(choose_plan("77", []))
    state.save_cluster_config({"provider": config["provider"]})
    doc = state.read()
    head = {"slurm_node": "n1", "role": "head", "gen": 1, "tags": {TAG_RAY_NODE_KIND: "head"}}
    doc["nodes"]["n1.1"] = {**head, "launched": time.time() - 600, "step_name": "eray.c.head.1"}
    doc["nodes"].update(workers)
    state.write(doc)
    return SlurmJobProvider(config["provider"], "c"), state


def test_the_elastic_providers_worker_nodes_are_answered_by_its_worker_pool(
    bindir: Path, tmp_path: Path
) -> None:
    """One round answers both parts: the head (a step of the head's job, from its record)
    and the worker jobs (from squeue's job listing), a worker without a record adopted by
    its job's name; each per-node call goes to the part that owns the node."""
    from ray.autoscaler.tags import TAG_RAY_USER_NODE_TYPE

    rows = [
        "501|RUNNING|2|w[1-2]|None|1:00:00|Unknown|2:00:00|eray.c.77.cpu",
        "502|PENDING|1||Priority|1:00:00|Unknown|2:00:00|eray.c.77.cpu",
        "503|RUNNING|1|w9|None|1:00:00|Unknown|2:00:00|eray.other.77.cpu",  # another cluster's
    ]
    worker_tags = {TAG_RAY_NODE_KIND: "worker", TAG_RAY_USER_NODE_TYPE: "cpu", TAG_RAY_NODE_STATUS: "mine"}
    worker = {"slurm_job": "501", "role": "worker", "tags": worker_tags, "created": time.time()}
    provider, _state = elastic_cluster(bindir, tmp_path, rows, {"j501-0": worker})
    assert provider.non_terminated_nodes({}) == ["n1.1", "j501-0", "j501-1", "j502-0"]
    assert provider.non_terminated_nodes({TAG_RAY_NODE_KIND: "worker"}) == ["j501-0", "j501-1", "j502-0"]
    assert provider.node_tags("j501-0")[TAG_RAY_NODE_STATUS] == "mine"  # its record's
    assert provider.node_tags("j501-1") == {  # adopted: what its job's name says
        TAG_RAY_NODE_KIND: "worker",
        TAG_RAY_USER_NODE_TYPE: "cpu",
        TAG_RAY_NODE_STATUS: "up-to-date",
    }
    assert [provider.is_running(i) for i in ("n1.1", "j501-1", "j502-0")] == [True, True, False]
    assert provider.internal_ip("j501-1") == "w2" and provider.internal_ip("n1.1") == "n1"
    assert provider.is_terminated("j503-0") and not provider.is_terminated("j502-0")
    assert provider.node_tags("j503-0") == {}  # another cluster's job is not adopted


def test_a_worker_job_whose_ray_ended_unseen_is_requeued_by_the_head_not_lost(
    bindir: Path, tmp_path: Path
) -> None:
    """A preempted worker's Ray ends (its exit marker) before Ray's autoscaler let it go: no
    longer listed, it would never be. The head's next round asks SLURM once whether the job
    runs again, requeues it at once (``scontrol requeue``, in its grace time) and hides its
    node until it runs again; a job that ends is asked about once and left to end."""
    from ray.autoscaler.tags import TAG_RAY_USER_NODE_TYPE

    from eray_provider.plan.markers import Marker

    rows = [
        "501|RUNNING|1|w1|None|1:00:00|Unknown|2:00:00|eray.c.77.cpu",  # preempted, requeues
        "502|RUNNING|1|w2|None|1:00:00|Unknown|2:00:00|eray.c.77.cpu",  # ends
    ]
    preempted = "JobId=501 JobState=RUNNING Requeue=1 Restarts=0 PreemptTime=2026-12-05T12:23:16 Partition=rq"
    ending = "JobId=502 JobState=RUNNING Requeue=1 Restarts=0 PreemptTime=None Partition=rq"
    calls = bindir / "scontrol.calls"
    fake(
        bindir,
        "scontrol",
        f'echo "$*" >> {calls}\n'
        f'case "$*" in *"show job 501"*) echo "{preempted}";; *"show job 502"*) echo "{ending}";;\n'
        '*"show partition"*) echo "PartitionName=rq PreemptMode=REQUEUE";; esac\n',
    )
    tags = {TAG_RAY_NODE_KIND: "worker", TAG_RAY_USER_NODE_TYPE: "cpu"}
    workers = {
        f"j{job}-0": {"slurm_job": job, "role": "worker", "tags": tags, "created": time.time() - 60}
        for job in ("501", "502")
    }
    provider, state = elastic_cluster(bindir, tmp_path, rows, workers)
    assert provider.pool is not None
    provider.pool.on_head = True
    assert provider.non_terminated_nodes({}) == ["n1.1", "j501-0", "j502-0"]
    for job in ("501", "502"):
        state.write_marker(f"j{job}-0", Marker.EXIT, "0")
    time.sleep(READ_FRESH_SECONDS + 0.05)
    provider.pool.listing.expire()
    assert provider.non_terminated_nodes({}) == ["n1.1"]
    asked = calls.read_text().splitlines()
    assert "requeue 501" in asked and "requeue 502" not in asked, asked
    records = state.records()
    assert records["j501-0"].requeued and not records["j502-0"].requeued and not records["j502-0"].terminated
    # asked once: the next rounds ask SLURM nothing more about either
    provider.pool.listing.expire()
    provider.non_terminated_nodes({})
    assert calls.read_text().splitlines() == asked
