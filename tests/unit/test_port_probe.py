"""The port probe's report and how the launcher merges every node's ranges (#13 item 4)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from eray_provider.plan.modules import PORT_PROBE
from eray_provider.plan.ports import Excluded, PortPlanError, candidates
from eray_provider.runtime import launch
from eray_provider.runtime.port_probe import (
    NodeReport,
    ProbeError,
    check_answered,
    exclusions_from_reports,
    format_report,
    parse_reports,
)
from eray_provider.slurm.allocation import Allocation, NodeShare


def test_report_round_trip_and_merge_of_every_nodes_ranges() -> None:
    a = NodeReport("n1", (20224, 20230), (1024, 65535), ((30000, 30010),))
    b = NodeReport("n2", (), (32768, 60999))
    c = NodeReport("n3", (), (32768, 60999))
    text = "\n".join([*format_report(b), *format_report(a), *format_report(c)])
    reports = parse_reports(text)
    assert reports == {"n1": a, "n2": b, "n3": c}
    merged = exclusions_from_reports(reports.values())
    # one entry per distinct range, the wide one soft, reserved ports hard
    assert sorted((e.lo, e.hi, e.soft) for e in merged) == [
        (1024, 65535, True),
        (30000, 30010, False),
        (32768, 60999, True),
    ]
    assert any(e.source == "ip_local_reserved_ports on n1" for e in merged)


def test_old_style_busy_lines_still_parse() -> None:
    assert parse_reports("n1 busy 1 2\nn2 busy\n") == {"n1": NodeReport("n1", (1, 2)), "n2": NodeReport("n2")}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("n1 busy 12 x", "'n1 busy 12 x'"),
        ("n1 ephemeral 60999 32768", "ip_local_port_range on n1='60999 32768'"),
        ("n1 reserved 80,a-b", "ip_local_reserved_ports on n1='80,a-b'"),
        ("n1 weird 1", "unknown kind 'weird'"),
        ("n1", "'n1'"),
    ],
)
def test_unreadable_probe_output_is_an_error_quoting_it(text: str, fragment: str) -> None:
    with pytest.raises(ProbeError) as info:
        parse_reports(text)
    assert fragment in str(info.value)


def test_a_node_that_did_not_answer_is_named() -> None:
    reports = parse_reports("n1 busy\n")
    with pytest.raises(ProbeError, match=r"no answer from 1 of 2 nodes.*n2"):
        check_answered(reports, ["n1", "n2"])
    check_answered(reports, ["n1"])


def test_the_probe_runs_and_reports_this_node(tmp_path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", PORT_PROBE, "1", "2"],
        capture_output=True,
        text=True,
        env={"SLURMD_NODENAME": "nodeX", "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    report = parse_reports(out.stdout)["nodeX"]
    assert report.ephemeral is None or report.ephemeral[0] <= report.ephemeral[1]
    bad = subprocess.run(
        [sys.executable, "-m", PORT_PROBE, "80x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "'80x'" in bad.stderr


class _State:
    cluster_name = "c1"

    def __init__(self) -> None:
        self.saved = None
        self.claimed: str | None = None

    def ports(self):
        return self.saved

    def save_ports(self, plan) -> None:
        self.saved = plan

    def save_claimed_temp_dir(self, path: str) -> None:
        self.claimed = path

    def container(self) -> None:  # no provider.container
        return None


def _fake_srun(
    monkeypatch, ranges: dict[str, tuple[int, int]], busy: dict[str, set[int]], holder="", plant=None
):
    """srun of the probe over fake nodes; ``plant(node, path)`` names who made a claimed path
    first there ("" for nobody). Every call's probed ports go to the list returned, its
    claimed path (from the step's environment) and ``--drop`` arguments to the list's ``dirs``."""
    calls = _Calls()

    def run(argv, **kwargs):
        args = argv[argv.index(PORT_PROBE) + 1 :]
        claim = kwargs["env"].get("ERAY_CLAIM_DIR", "")
        assert not claim or claim not in " ".join(argv)  # every user can read an argv
        calls.dirs.append((claim, [a.split("=", 1)[1] for a in args if a.startswith("--drop=")]))
        ports = [int(p) for p in args if not p.startswith("--")]
        calls.append(ports)
        lines = []
        for node, (lo, hi) in ranges.items():
            seen = tuple(p for p in ports if p in busy.get(node, ()))
            held = ((holder, seen),) if holder and seen else ()
            planted = plant(node, claim) if plant and claim else ""
            lines += format_report(NodeReport(node, seen, (lo, hi), holders=held, planted=planted))
        return subprocess.CompletedProcess(argv, 0, "\n".join(lines) + "\n", "")

    monkeypatch.setattr(launch.subprocess, "run", run)
    return calls


class _Calls(list):
    dirs: list[tuple[str, list[str]]]

    def __init__(self) -> None:
        super().__init__()
        self.dirs = []


LAUNCHER = [Excluded(32768, 60999, "ip_local_port_range", soft=True), Excluded(60001, 63000, "SrunPortRange")]
ALLOC = Allocation("5123", (NodeShare("n1", 2), NodeShare("n2", 2)))


def test_nodes_like_the_launcher_take_one_probe(monkeypatch) -> None:
    monkeypatch.setattr(launch, "host_exclusions", lambda: LAUNCHER)
    first = candidates("5123", LAUNCHER)[0]
    calls = _fake_srun(monkeypatch, {"n1": (32768, 60999), "n2": (32768, 60999)}, {"n2": {first.gcs}})
    state = _State()
    plan = launch.ensure_port_plan(state, ALLOC, "python")
    assert len(calls) == 1 and state.saved == plan == candidates("5123", LAUNCHER)[1]


def test_a_node_with_a_wide_range_moves_the_plan_and_a_second_probe_checks_it(monkeypatch) -> None:
    monkeypatch.setattr(launch, "host_exclusions", lambda: LAUNCHER)
    calls = _fake_srun(monkeypatch, {"n1": (32768, 60999), "n2": (9000, 65499)}, {})
    plan = launch.ensure_port_plan(_State(), ALLOC, "python")
    # n2's own range (not the launcher's) decides: the plan lies in it, was probed, and
    # avoids SrunPortRange; the launcher's first guess (below 32768) was inside n2's range
    node_view = [LAUNCHER[1], Excluded(32768, 60999, soft=True), Excluded(9000, 65499, soft=True)]
    assert plan == candidates("5123", node_view)[0]
    assert len(calls) == 2 and set(plan.all_ports()) <= set(calls[0]) | set(calls[1])
    assert all(not 60001 <= p <= 63000 for p in plan.all_ports())


def test_busy_ports_are_printed_as_short_lines_of_ranges() -> None:
    """srun interleaves its tasks' output and may cut a long line with another node's: a
    node whose whole block is busy (held on loopback) prints a few short lines of ranges."""
    busy = (*range(20480, 20736), *range(30000, 30200, 2))
    lines = format_report(NodeReport("node3", busy, (32768, 60999)))
    assert all(len(line) < 400 for line in lines), max(map(len, lines))
    assert lines[0].startswith("node3 busy 20480-20735 30000 30002")
    assert sorted(parse_reports("\n".join(reversed(lines)))["node3"].busy) == sorted(busy)
    assert format_report(NodeReport("n1"))[0] == "n1 busy"


def test_a_cotenant_on_the_first_blocks_delays_the_plan_never_to_an_unchecked_block(
    monkeypatch,
) -> None:
    """A co-tenant holding one port of each of the first 30 blocks: the probe goes on (more
    blocks each round) until a block it checked is free, and the plan is that block."""
    monkeypatch.setattr(launch, "host_exclusions", lambda: LAUNCHER)
    cands = candidates("5123", LAUNCHER)
    squat = {c.gcs + 3 for c in cands[:30]}
    calls = _fake_srun(monkeypatch, {"n1": (32768, 60999), "n2": (32768, 60999)}, {"n2": squat})
    plan = launch.ensure_port_plan(_State(), ALLOC, "python")
    assert plan == cands[30]
    assert set(plan.all_ports()) <= {p for c in calls for p in c}
    assert len(calls) == 3  # 4, then 16, then 64 blocks


def test_a_cotenant_on_every_block_fails_naming_ports_and_holder(monkeypatch) -> None:
    monkeypatch.setattr(launch, "host_exclusions", lambda: LAUNCHER)
    squat = {c.gcs + 3 for c in candidates("5123", LAUNCHER)}  # about 160 sockets
    _fake_srun(monkeypatch, {"n1": (32768, 60999), "n2": (32768, 60999)}, {"n1": squat}, holder="mallory")
    with pytest.raises(PortPlanError, match=r"every port block is in use") as err:
        launch.ensure_port_plan(_State(), ALLOC, "python")
    assert "n1: busy" in str(err.value) and "mallory listens on" in str(err.value), str(err.value)


def test_the_heads_temp_dir_is_claimed_on_every_node_in_the_first_probe(monkeypatch) -> None:
    """Rays before 2.55: the head's temp dir is made on every node in the probe's step, so
    no worker host can have it made by another user first; no extra srun when nobody did."""
    monkeypatch.setattr(launch, "host_exclusions", lambda: LAUNCHER)
    calls = _fake_srun(monkeypatch, {"n1": (32768, 60999), "n2": (32768, 60999)}, {})
    state = _State()
    launch.ensure_port_plan(state, ALLOC, "python", "/scratch")
    assert len(calls) == 1 and calls.dirs[0][1] == []
    claim = calls.dirs[0][0]
    assert state.claimed == claim and claim.startswith("/scratch/eray-5123-"), calls.dirs
    assert launch.ensure_port_plan(_State(), ALLOC, "python") is not None  # Ray 2.55+: no claim
    assert calls.dirs[-1] == ("", [])


def test_a_planted_temp_dir_name_is_dropped_and_a_new_one_claimed(monkeypatch) -> None:
    """Another user who sees a claimed name on one node and makes it first on another (a
    race against one srun step) only costs a round: the name is never used, ours are removed,
    and the next name is claimed on every node."""
    monkeypatch.setattr(launch, "host_exclusions", lambda: LAUNCHER)
    seen: list[str] = []

    def plant(node: str, path: str) -> str:
        if node == "n2" and not seen:
            seen.append(path)
            return "mallory"
        return ""

    calls = _fake_srun(monkeypatch, {"n1": (32768, 60999), "n2": (32768, 60999)}, {}, plant=plant)
    state = _State()
    plan = launch.ensure_port_plan(state, ALLOC, "python", "/tmp")
    (first, _), (second, dropped) = calls.dirs
    assert seen == [first] and dropped == [first] and second != first
    assert state.claimed == second and state.saved == plan
    assert calls[1] == []  # the plan was found in the first round: the second claims only


def test_a_cotenant_who_plants_every_name_stops_the_start_naming_node_and_user(monkeypatch) -> None:
    monkeypatch.setattr(launch, "host_exclusions", lambda: LAUNCHER)
    ranges = {"n1": (32768, 60999), "n2": (32768, 60999)}
    calls = _fake_srun(monkeypatch, ranges, {}, plant=lambda node, path: "mallory" if node == "n2" else "")
    state = _State()
    with pytest.raises(launch.LaunchError, match=r"n2 \(made by mallory\).*Ray 2\.55 or later"):
        launch.ensure_port_plan(state, ALLOC, "python", "/tmp")
    assert state.claimed is None and state.saved is None
    assert calls.dirs[-1] == ("", [calls.dirs[-2][0]])  # the last claim, removed where it is ours
    assert len(calls) == launch.MAX_PROBE_ROUNDS + 1


def test_claim_makes_a_private_dir_and_names_who_made_one_first(tmp_path) -> None:
    """The node side of the claim (``port_probe.claim_dir``): a dir of another user, or one of
    ours that others can enter, is reported, never used; ``--drop`` removes only an empty
    private dir of ours."""
    import os
    import pwd
    import stat

    from eray_provider.runtime.port_probe import claim_dir, drop_dir

    mine = tmp_path / "eray-1-a"
    assert claim_dir(str(mine)) == "" and stat.S_IMODE(mine.stat().st_mode) == 0o700
    assert claim_dir(str(mine)) == ""  # ours already: a probe that runs again
    me = pwd.getpwuid(os.getuid()).pw_name
    loose = tmp_path / "eray-1-b"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    assert claim_dir(str(loose)) == me
    (tmp_path / "target").mkdir(mode=0o700)
    (tmp_path / "eray-1-c").symlink_to(tmp_path / "target")
    assert claim_dir(str(tmp_path / "eray-1-c")) == me  # a link is never taken for a dir
    if os.getuid() == 0:
        planted = tmp_path / "eray-1-d"
        planted.mkdir(mode=0o700)
        os.chown(planted, 65534, 65534)
        assert claim_dir(str(planted)) == pwd.getpwuid(65534).pw_name
        drop_dir(str(planted))
        assert planted.is_dir()
    drop_dir(str(loose))
    assert loose.is_dir()  # not private: not one of our claims
    (mine / "x").write_text("")
    drop_dir(str(mine))
    assert mine.is_dir()  # not empty: a node runs in it
    (mine / "x").unlink()
    drop_dir(str(mine))
    assert not mine.exists()


def test_planted_lines_round_trip() -> None:
    lines = format_report(NodeReport("node2", (), (32768, 60999), planted="mallory"))
    assert "node2 planted mallory" in lines
    assert parse_reports("\n".join(lines))["node2"].planted == "mallory"
