"""``eray-provider status`` and ``logs`` without a cluster: what the facts mean
(``cluster_status``), which dirs are clusters, what ``--prune`` removes, and what is kept
of a node's Ray logs (``node_logs``). The live test (``test_status_live``) runs them
against the test bed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from eray_provider.cli import main
from eray_provider.plan.cluster_status import down_status, summarize
from eray_provider.plan.markers import Marker
from eray_provider.plan.ports import choose_plan
from eray_provider.plan.provider_config import (
    DEFAULT_CAP_MB,
    ClusterConfigError,
    Filled,
    ProviderConfig,
    put_filled,
)
from eray_provider.runtime.cluster_logs import find_cluster, node_logs, pick
from eray_provider.runtime.cluster_state import ClusterState
from eray_provider.runtime.node_logs import (
    KEEP_SESSIONS,
    MIN_TAIL_BYTES,
    collect,
    collected,
    plan_collection,
    select,
)
from eray_provider.runtime.status import PruneError, format_table, gather, prune, state_dirs, to_json
from eray_provider.slurm.squeue import JobInfo

PLAN = choose_plan("77", [])


def _job(job_id: str, state: str = "RUNNING", reason: str = "None", nodes: str = "n[1-2]") -> JobInfo:
    return JobInfo(job_id, state, "x", nodes, reason, 2, time_left="1:00:00", end_time="2026-12-04T05:00:00")


def _doc(*nodes: tuple[str, str, dict]) -> dict:
    return {
        "cluster_name": "c",
        "job_id": "77",
        "slurm_cluster": "testcl",
        "nodes": {node_id: {"role": role, **rec} for node_id, role, rec in nodes},
    }


FIXED = _doc(("n1.1", "head", {"slurm_node": "n1"}), ("n2.2", "worker", {"slurm_node": "n2"}))
IPS = {"n1.1": "10.0.0.1", "n2.2": "10.0.0.2"}


ELASTIC: dict = {}
put_filled(ELASTIC, Filled(elastic=True))


def _summarize(doc=FIXED, ips=IPS, exits=None, jobs=None, alive=None, provider=None, **kw):
    kw.setdefault("slurm_cluster", "testcl")
    return summarize(
        doc,
        ips,
        exits or {},
        provider or {},
        PLAN,
        {"77": _job("77")} if jobs is None else jobs,
        alive,
        state_dir="/s/c-77",
        token_file="/s/c-77/auth_token",
        **kw,
    )


def test_every_node_alive_is_running() -> None:
    st = _summarize(alive={"n1.1": "10.0.0.1", "n2.2": "10.0.0.2"})
    assert st.state == "running" and (st.alive, st.expected) == (2, 2) and not st.problems
    assert st.head_address == f"10.0.0.1:{PLAN.gcs}" and st.dashboard == f"10.0.0.1:{PLAN.dashboard}"
    assert st.time_left == "1:00:00" and st.kind == "fixed" and not st.prunable


def test_a_node_missing_from_ray_is_degraded_and_named() -> None:
    st = _summarize(alive={"n1.1": "10.0.0.1"})
    assert st.state == "degraded" and st.alive == 1
    assert st.problems == ["node n2.2 (n2): not-in-ray"]
    st = _summarize(alive={"n1.1": "10.0.0.1"}, exits={"n2.2": "137"})
    assert st.state == "degraded" and st.problems == ["node n2.2 (n2): exited (exit 137)"]


def test_a_job_slurm_no_longer_lists_has_ended_and_may_be_pruned() -> None:
    for jobs in ({}, {"77": _job("77", "CANCELLED")}):
        st = _summarize(jobs=jobs)
        assert st.state == "ended" and st.prunable and st.alive is None
        assert all(n.state == "unknown" for n in st.nodes)
        assert "job 77" in st.problems[0]


def test_a_failed_squeue_says_nothing_of_the_job() -> None:
    st = summarize(
        FIXED,
        IPS,
        {},
        {},
        PLAN,
        None,
        None,
        state_dir="/s",
        token_file="/t",
        squeue_error="timed out",
        slurm_cluster="testcl",
    )
    assert st.state == "unknown" and not st.prunable and "timed out" in st.problems[0]


def test_head_gone_unreachable_stopping() -> None:
    st = _summarize(exits={"n1.1": "1"})
    assert st.state == "head-gone" and "n1.1 exited (exit 1)" in st.problems[0]
    st = _summarize(gcs_error="no answer within 20 s")
    assert st.state == "unreachable" and "no answer within 20 s" in st.problems[0]
    assert PLAN.gcs and str(PLAN.gcs) in st.problems[0]
    stopping = dict(FIXED, stopping=1.0)
    assert _summarize(doc=stopping).state == "stopping"


def test_an_elastic_cluster_shows_its_worker_jobs() -> None:
    doc = _doc(
        ("n1.1", "head", {"slurm_node": "n1"}),
        ("j80-0", "worker", {"slurm_job": "80"}),
        ("j81-0", "worker", {"slurm_job": "81"}),
        ("j82-0", "worker", {"slurm_job": "82"}),
        ("j83-0", "worker", {"slurm_job": "83", "requeued": True}),
    )
    jobs = {
        "77": _job("77"),
        "80": _job("80", nodes="n2"),
        "81": _job("81", "PENDING", "Resources", nodes=""),
        "82": _job("82", "TIMEOUT", nodes="n3"),
        "83": _job("83", "PENDING", "BeginTime", nodes=""),
    }
    st = _summarize(doc=doc, jobs=jobs, alive={"n1.1": "a", "j80-0": "b"}, provider=ELASTIC)
    states = {n.node_id: (n.state, n.slurm_job, n.slurm_node) for n in st.nodes}
    assert states == {
        "n1.1": ("alive", "77", "n1"),
        "j80-0": ("alive", "80", "n2"),
        "j81-0": ("pending", "81", ""),
        "j82-0": ("job-ended", "82", "n3"),
        "j83-0": ("pending", "83", ""),
    }
    assert st.kind == "elastic" and st.state == "degraded" and (st.alive, st.expected) == (2, 5)
    assert "node j81-0 (81): pending (Resources)" in st.problems
    assert "node j83-0 (83): pending (requeued, BeginTime)" in st.problems  # preempted, back later


def test_a_preempted_worker_pends_again_and_an_ended_one_says_why() -> None:
    """A node's state is its phase (``node_phase``): a requeued job's node whose preempted
    run left its exit marker is pending, not exited (it comes back); a worker whose process
    exited and whose job SLURM ended says both; one that writes its rerun marker is back."""
    doc = _doc(
        ("n1.1", "head", {"slurm_node": "n1"}),
        ("j83-0", "worker", {"slurm_job": "83", "requeued": True}),
        ("j84-0", "worker", {"slurm_job": "84"}),
        ("j85-0", "worker", {"slurm_job": "85", "requeued": True}),
    )
    jobs = {
        "77": _job("77"),
        "83": _job("83", "PENDING", "BeginTime", nodes=""),
        "84": _job("84", "TIMEOUT", nodes="n3"),
        "85": _job("85", nodes="n4"),
    }
    exits = {"j83-0": "143", "j84-0": "0"}
    st = _summarize(
        doc=doc,
        jobs=jobs,
        exits=exits,
        alive={"n1.1": "a"},
        provider=ELASTIC,
        markers=frozenset({"j85-0.rerun"}),
    )
    states = {n.node_id: (n.state, n.detail) for n in st.nodes}
    assert states["j83-0"] == ("pending", "(requeued, BeginTime)")
    assert states["j84-0"] == ("exited", "(exit 0; job 84 TIMEOUT)")
    assert states["j85-0"] == ("not-in-ray", "")


def test_replacements_and_drains_are_shown_and_a_pair_counts_once() -> None:
    """j80 is being replaced by j90 (pending); j81 was replaced by j91 (joined), drained,
    and has exited: neither pair degrades the cluster, and the drains are shown."""
    drain = json.dumps({"deadline": 1.7e9, "message": "replaced by j91-0", "at": 1.7e9 - 60})
    doc = _doc(
        ("n1.1", "head", {"slurm_node": "n1"}),
        ("j80-0", "worker", {"slurm_job": "80", "successor": "j90-0"}),
        ("j90-0", "worker", {"slurm_job": "90", "replaces": "j80-0"}),
        ("j81-0", "worker", {"slurm_job": "81", "successor": "j91-0"}),
        ("j91-0", "worker", {"slurm_job": "91", "replaces": "j81-0"}),
    )
    jobs = {
        "77": _job("77"),
        "80": _job("80", nodes="n2"),
        "90": _job("90", "PENDING", "Resources", nodes=""),
        "91": _job("91", nodes="n3"),
    }
    alive = {"n1.1": "a", "j80-0": "b", "j91-0": "c"}
    st = _summarize(
        doc=doc,
        jobs=jobs,
        alive=alive,
        provider=ELASTIC,
        drains={"j80-0": drain},
        markers=frozenset({Marker.HANDOVER.file("j91-0")}),
        exits={"j81-0": "0"},
    )
    states = {n.node_id: n.state for n in st.nodes}
    assert states == {
        "n1.1": "alive",
        "j80-0": "alive",
        "j90-0": "replacing",
        "j81-0": "replaced",
        "j91-0": "alive",
    }
    assert st.state == "running" and (st.alive, st.expected) == (3, 3), st.problems
    table = format_table([st])
    assert "draining j80-0 (n2) until " in table and ": replaced by j91-0" in table, table
    assert "j90-0 replacing (for j80-0: pending (Resources))" in table, table
    # the replacement's job ended before it joined: the pair is the old node alone again
    jobs["90"] = _job("90", "FAILED", nodes="")
    st = _summarize(
        doc=doc, jobs=jobs, alive=alive, provider=ELASTIC, markers=frozenset({Marker.HANDOVER.file("j91-0")})
    )
    assert {n.node_id: n.state for n in st.nodes}["j90-0"] == "replacing"


def test_down_clusters_are_prunable_once_their_job_ended() -> None:
    assert down_status("c", "77", "/s", ["n1.1"], {}, True).prunable
    assert down_status("c", "77", "/s", ["n1.1"], {"77": _job("77", "TIMEOUT")}, True).prunable
    assert not down_status("c", "77", "/s", ["n1.1"], {"77": _job("77")}, True).prunable
    assert not down_status("c", "77", "/s", ["n1.1"], {"77": _job("77", "COMPLETING")}, True).prunable
    assert not down_status("c", "77", "/s", ["n1.1"], None, True).prunable
    assert not down_status("c", "77", "/s", ["n1.1"], {}, False).prunable  # another SLURM cluster's


def test_a_job_not_over_yet_is_never_pruned() -> None:
    for state in ("COMPLETING", "STOPPED", "REQUEUE_HOLD", "SPECIAL_EXIT"):
        st = _summarize(jobs={"77": _job("77", state)})
        assert st.state == "ending" and not st.prunable and state in st.problems[0], state


def test_an_ended_head_with_worker_jobs_still_running_is_kept() -> None:
    doc = _doc(("n1.1", "head", {"slurm_node": "n1"}), ("j80-0", "worker", {"slurm_job": "80"}))
    unrecorded = JobInfo("81", "PENDING", "eray.c.77.cpu", "", "Priority", 1)
    st = _summarize(doc=doc, jobs={"80": _job("80"), "81": unrecorded}, provider=ELASTIC)
    assert st.state == "ended" and not st.prunable
    assert "worker job(s) 80, 81 still run" in st.problems[0]
    ended = _summarize(doc=doc, jobs={"80": _job("80", "CANCELLED")}, provider=ELASTIC)
    assert ended.state == "ended" and ended.prunable


def test_a_cluster_of_another_slurm_cluster_is_left_alone() -> None:
    doc = dict(FIXED, slurm_cluster="other")
    st = _summarize(doc=doc, jobs={}, slurm_cluster="here")
    assert st.state == "elsewhere" and not st.prunable and "'other'" in st.problems[0]
    assert all(n.state == "unknown" for n in st.nodes)
    assert _summarize(doc=dict(FIXED, slurm_cluster="here"), jobs={}, slurm_cluster="here").prunable


#: The SLURM cluster the states of these tests are of, and the one `status` runs on.
SLURM_CLUSTER = "testcl"


@pytest.fixture(autouse=True)
def _this_slurm_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CLUSTER_NAME", SLURM_CLUSTER)


def _cluster(base: Path, name: str, job: str) -> ClusterState:
    state = ClusterState(name, job, base)
    state.create(slurm_cluster=SLURM_CLUSTER)
    state.add_nodes([("n1", "head", {})])
    return state


def test_state_dirs_are_cluster_dirs_of_ours_only(tmp_path: Path) -> None:
    base = tmp_path / "state"
    _cluster(base, "a", "5")
    _cluster(base, "a-b", "6")  # a name with a dash: the job is what follows the last one
    (base / "notes").mkdir()
    (base / "x-7").mkdir()  # neither state nor logs
    (base / "y-8").symlink_to(base / "a-5")
    (base / "bad name-9").mkdir()
    assert [(n, j) for n, j, _ in state_dirs(base)] == [("a", "5"), ("a-b", "6")]
    assert state_dirs(tmp_path / "none") == []


def _fake_squeue(bindir: Path, lines: str, rc: int = 0) -> None:
    script = bindir / "squeue"
    script.write_text(f"#!/bin/sh\nprintf '%s' '{lines}'\nexit {rc}\n")
    script.chmod(0o755)


def test_gather_and_prune_remove_only_what_ended(tmp_path: Path, bindir: Path) -> None:
    base = tmp_path / "state"
    for name, job in (("live", "5"), ("gone", "6")):
        state = _cluster(base, name, job)
        state.save_ports(choose_plan(job, []))
    _fake_squeue(bindir, "5|RUNNING|1|n1|None|10:00|2026-12-04T05:00:00|1:00:00|eray.live\n")
    statuses = gather(base)
    by_name = {s.name: s for s in statuses}
    assert by_name["gone"].state == "ended" and by_name["live"].state in ("head-gone", "unreachable")
    assert by_name["live"].time_left == "10:00"
    assert json.loads(to_json(statuses))[0]["name"] == "gone"
    table = format_table(statuses)
    assert "gone" in table and "ended" in table and "10:00" in table
    assert prune(statuses) == ([str(base / "gone-6")], [])
    assert not (base / "gone-6").exists() and (base / "live-5" / "state.json").exists()


def test_prune_refuses_when_squeue_failed(tmp_path: Path, bindir: Path, capsys) -> None:
    base = tmp_path / "state"
    _cluster(base, "c", "5")
    _fake_squeue(bindir, "", rc=1)
    statuses = gather(base)
    assert [s.state for s in statuses] == ["unknown"]
    with pytest.raises(PruneError):
        prune(statuses)
    assert (base / "c-5" / "state.json").exists()
    assert main(["status", "--prune", "--state-dir", str(base)]) == 1
    assert "nothing was pruned" in capsys.readouterr().err


def _ray_temp(tmp_path: Path, files: dict[str, bytes]) -> Path:
    """A Ray temp dir as Ray leaves it: a session with logs, and session_latest."""
    temp = tmp_path / "private" / "ray"
    logs = temp / "session_2026-12-04_01-00-00_000000_1" / "logs"
    for i, (rel, data) in enumerate(files.items()):
        (logs / rel).parent.mkdir(parents=True, exist_ok=True)
        (logs / rel).write_bytes(data)
        os.utime(logs / rel, (1000 + i, 1000 + i))
    (temp / "session_latest").symlink_to(temp / "session_2026-12-04_01-00-00_000000_1")
    return temp


def test_the_plan_keeps_what_explains_a_nodes_end_first() -> None:
    files = [
        ("worker-a.out", 100, 2.0),
        ("worker-b.out", 100, 3.0),
        ("raylet.out", 100, 1.0),
        ("misc.txt", 100, 9.0),
        ("gcs_server.err", 100, 1.0),
    ]
    assert [rel for rel, _ in plan_collection(files, 10**6)] == [
        "raylet.out",
        "gcs_server.err",
        "worker-b.out",
        "worker-a.out",
        "misc.txt",
    ]
    big = [("raylet.out", 10**6, 1.0), ("monitor.log", 10**6, 1.0), ("worker-a.out", 10, 1.0)]
    cap = 100_000
    kept = plan_collection(big, cap)
    assert kept[0] == ("raylet.out", cap // 4) and sum(t for _, t in kept) <= cap
    tight = plan_collection([("raylet.out", 10**6, 1.0), ("worker-a.out", 10**6, 1.0)], MIN_TAIL_BYTES * 5)
    assert [r for r, _ in tight] == ["raylet.out", "worker-a.out"]
    assert plan_collection([("raylet.out", 10**6, 1.0)], MIN_TAIL_BYTES - 1) == []


def test_collect_copies_tails_under_the_cap_and_says_what_it_left_out(tmp_path: Path) -> None:
    big = b"".join(b"line %06d\n" % i for i in range(20_000))  # 220 kB
    temp = _ray_temp(
        tmp_path,
        {
            "raylet.out": big,
            "gcs_server.out": b"gcs ok\n",
            "events/event_RAYLET.log": b"{}\n",
            "old/x.log": big,
        },
    )
    state = _cluster(tmp_path / "state", "c", "5")
    cap = 100_000
    dest = collect(temp, state.dir, "n2.2", cap, {"slurm_node": "n2", "exit_code": -15})
    assert dest is not None and dest.parent.name == "n2.2"
    raylet = (dest / "raylet.out").read_bytes()
    header, _, rest = raylet.partition(b"\n")
    assert (
        header.startswith(b"[eray-provider: the first ") and big.endswith(rest) and rest.startswith(b"line ")
    )
    assert len(rest) <= cap // 4
    assert (dest / "gcs_server.out").read_bytes() == b"gcs ok\n"
    assert (dest / "events" / "event_RAYLET.log").exists()
    meta = json.loads((dest / "node.json").read_text())
    assert meta["slurm_node"] == "n2" and meta["exit_code"] == -15 and meta["session"].startswith("session_")
    assert "raylet.out" in meta["cut"]
    total = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file() and p.name != "node.json")
    assert total <= cap + 200 * len(meta["files"])  # the cut headers only
    assert [c.node_id for c in collected(state.dir)] == ["n2.2"] and meta["complete"]
    # the teardown keeps them, and only them
    state.remove()
    assert sorted(os.listdir(state.dir)) == ["ray-logs"] and collected(state.dir)[0].node_id == "n2.2"


def test_collect_never_recreates_a_removed_state_dir(tmp_path: Path) -> None:
    temp = _ray_temp(tmp_path, {"raylet.out": b"x\n"})
    gone = tmp_path / "state" / "c-5"
    with pytest.raises(FileNotFoundError):
        collect(temp, gone, "n1.1", 10**6, {})
    assert not gone.exists()
    state = _cluster(tmp_path / "state", "c", "5")
    assert collect(temp, state.dir, "n1.1", 0, {}) is None  # collect_logs_mb: 0
    state.remove()
    assert not state.dir.exists()  # nothing collected: nothing kept


def test_logs_cli_shows_collected_logs_and_names_bad_input(tmp_path: Path, capsys) -> None:
    temp = _ray_temp(tmp_path, {"raylet.out": b"raylet was here\n", "worker-1.err": b"boom\n"})
    base = tmp_path / "state"
    state = _cluster(base, "c", "5")
    collect(temp, state.dir, "n2.2", 10**6, {"slurm_node": "n2"})
    state.remove()
    assert main(["logs", "c", "--state-dir", str(base)]) == 0
    out = capsys.readouterr().out
    assert "==> n2.2 on n2 (collected, session_" in out and "raylet was here" in out and "boom" not in out
    assert main(["logs", "c", "--state-dir", str(base), "--component", "worker", "--node", "n2"]) == 0
    assert "boom" in capsys.readouterr().out
    assert main(["logs", "c", "--state-dir", str(base), "--component", "rayletz"]) == 2
    assert "--component 'rayletz'" in capsys.readouterr().err
    assert main(["logs", "c", "--state-dir", str(base), "--node", "n9"]) == 2
    assert "--node 'n9'" in capsys.readouterr().err
    assert main(["logs", "nope", "--state-dir", str(base)]) == 2
    assert "no cluster 'nope'" in capsys.readouterr().err
    assert main(["logs", "c", "--job", "6", "--state-dir", str(base)]) == 2
    assert "--job '6'" in capsys.readouterr().err
    assert main(["logs", "c", "--follow", "--state-dir", str(base)]) == 2
    assert "--follow follows one live node" in capsys.readouterr().err


def test_live_nodes_are_read_on_the_node_ended_ones_from_the_state_dir(tmp_path: Path) -> None:
    base = tmp_path / "state"
    state = _cluster(base, "c", "5")
    state.add_nodes([("n2", "worker", {})])
    state.write_temp_dirs("n1.1", "n1", ["/tmp/eray-5-a"])
    state.write_temp_dirs("n2.2", "n2", ["/tmp/eray-5-b"])
    state.write_marker("n2.2", "exit", "-15")
    collect(_ray_temp(tmp_path, {"raylet.out": b"x\n"}), state.dir, "n2.2", 10**6, {"slurm_node": "n2"})
    found = {n.node_id: (n.live, n.slurm_node, n.slurm_job) for n in node_logs(state)}
    assert found == {"n1.1": (True, "n1", "5"), "n2.2": (False, "n2", "")}
    assert [n.node_id for n in pick(node_logs(state), "n1")] == ["n1.1"]
    # the running one (state.json) wins over a higher job id of which only logs are left
    (base / "c-12" / "ray-logs").mkdir(parents=True)
    dirs = [("c", "5", base / "c-5"), ("c", "12", base / "c-12"), ("d", "3", base / "d-3")]
    assert find_cluster(base, "c", None, dirs) == "5" and find_cluster(base, "c", "12", dirs) == "12"
    (base / "c-5" / "state.json").unlink()
    os.utime(base / "c-12", (1, 1))
    assert find_cluster(base, "c", None, dirs) == "5"  # then the one torn down last


def test_select_picks_components_by_file_name() -> None:
    files = ["raylet.out", "gcs_server.err", "worker-x-1.out", "monitor.log", "events/e.log", "dashboard.log"]
    assert select(files, ["raylet", "monitor"]) == ["raylet.out", "monitor.log"]
    assert select(files, ["worker", "dashboard"]) == ["dashboard.log", "worker-x-1.out"]


@pytest.mark.parametrize("bad", [-1, "50", True, 10**6])
def test_collect_logs_mb_is_checked(bad) -> None:
    with pytest.raises(ClusterConfigError, match=rf"provider.collect_logs_mb .* got {bad!r}"):
        ProviderConfig.from_dict({"collect_logs_mb": bad})
    assert ProviderConfig.from_dict({}).collect_logs_mb == DEFAULT_CAP_MB
    assert ProviderConfig.from_dict({"collect_logs_mb": 0}).collect_logs_mb == 0


def test_an_unreadable_state_dir_is_shown_and_kept(tmp_path: Path, bindir: Path, capsys) -> None:
    base = tmp_path / "state"
    _cluster(base, "ok", "5")
    bad = _cluster(base, "bad", "6")
    bad.state_path.write_text("{not json")
    _fake_squeue(bindir, "")
    by_name = {s.name: s for s in gather(base)}
    assert by_name["bad"].state == "unreadable" and "could not be read" in by_name["bad"].problems[0]
    assert by_name["ok"].state == "ended" and not by_name["bad"].prunable
    assert main(["status", "--prune", "--state-dir", str(base)]) == 1  # the unreadable one
    assert (base / "bad-6" / "state.json").exists() and not (base / "ok-5").exists()
    assert "removed" in capsys.readouterr().err


def test_collection_refuses_what_is_not_a_regular_file_or_session(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("not a log")
    temp = _ray_temp(tmp_path, {"raylet.out": b"ok\n"})
    logs = temp / "session_latest" / "logs"
    (logs / "gcs_server.out").symlink_to(secret)  # a link in Ray's dir is never followed
    os.mkfifo(logs / "monitor.log")  # nor is a FIFO opened (it would block)
    state = _cluster(tmp_path / "state", "c", "5")
    dest = collect(temp, state.dir, "n1.1", 10**6, {})
    assert dest is not None and sorted(p.name for p in dest.iterdir()) == ["node.json", "raylet.out"]
    assert oct(dest.stat().st_mode & 0o777) == "0o700"
    assert oct((dest / "raylet.out").stat().st_mode & 0o777) == "0o600"
    bad = tmp_path / "bad" / "ray"
    bad.mkdir(parents=True)
    (bad / "session_latest").symlink_to("..")  # a session name that is no session
    assert collect(bad, state.dir, "n1.1", 10**6, {}) is None


def test_collection_keeps_the_newest_sessions_of_a_node(tmp_path: Path) -> None:
    state = _cluster(tmp_path / "state", "c", "5")
    for i in range(KEEP_SESSIONS + 2):
        temp = tmp_path / f"t{i}" / "ray"
        (temp / f"session_2026-12-04_0{i}-00-00_000000_1" / "logs").mkdir(parents=True)
        (temp / f"session_2026-12-04_0{i}-00-00_000000_1" / "logs" / "raylet.out").write_text(f"{i}\n")
        (temp / "session_latest").symlink_to(temp / f"session_2026-12-04_0{i}-00-00_000000_1")
        collect(temp, state.dir, "n1.1", 10**6, {})
    sessions = [c.session for c in collected(state.dir)]
    assert len(sessions) == KEEP_SESSIONS and sessions[-1].startswith(
        f"session_2026-12-04_0{KEEP_SESSIONS + 1}"
    )


def test_the_cluster_wide_cap_bounds_what_all_nodes_collect(tmp_path: Path) -> None:
    from eray_provider.runtime.node_logs import CapReached

    big = b"".join(b"line %06d\n" % i for i in range(20_000))  # 220 kB a file
    files = {name: big for name in ("raylet.out", "gcs_server.out", "monitor.log", "dashboard.log")}
    state = _cluster(tmp_path / "state", "c", "5")
    cap, total_cap = 100_000, 150_000

    def node(name: str, where: str = "") -> Path | None:
        return collect(_ray_temp(tmp_path / (where or name), files), state.dir, name, cap, {}, total_cap)

    def kept() -> int:
        return sum(
            p.stat().st_size for p in (state.dir / "ray-logs").rglob("*") if p.suffix in (".out", ".log")
        )

    assert node("n1.1") is not None and node("n2.1") is not None
    assert total_cap - 10_000 < kept() <= total_cap + 2_000  # the second got what was left
    with pytest.raises(CapReached, match=r"collect_logs_total_mb .*n3.1's were not collected"):
        node("n3.1")
    assert [c.node_id for c in collected(state.dir)] == ["n1.1", "n2.1"]
    # a session collected again replaces its own share: the total does not grow
    assert node("n1.1", "again") is not None and kept() <= total_cap + 2_000


def test_a_state_that_does_not_name_its_slurm_cluster_is_never_pruned(tmp_path: Path, bindir: Path) -> None:
    """Job ids are per SLURM cluster: a job this controller no longer lists may run on
    another SLURM cluster sharing HOME, when the state did not record which one it is of."""
    base = tmp_path / "state"
    state = ClusterState("anon", "5", base)
    state.create()  # `scontrol show config` timed out and SLURM_CLUSTER_NAME was unset
    state.add_nodes([("n1", "head", {})])
    _fake_squeue(bindir, "")
    (st,) = gather(base)
    assert st.state == "ended" and not st.prunable
    assert "does not say which SLURM cluster" in st.problems[0] and str(state.dir) in st.problems[0]
    assert main(["status", "--prune", "--state-dir", str(base)]) in (0, 1)
    assert state.state_path.exists()
