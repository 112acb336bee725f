"""Pure parts of the provider: config filling, ray start lines, srun lines (no cluster)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path

import pytest
from ray.autoscaler._private.util import prepare_config, validate_config

from eray_provider.autoscaler.command_runner import _exports, _remote_path, split_ray_stop, unpack_command
from eray_provider.plan.cluster_config import LAUNCH_HEAD, fill_config, gone_config
from eray_provider.plan.node_spec import HEAD_TYPE, StartSpec, memory_split, start_env, worker_types
from eray_provider.plan.ports import choose_plan
from eray_provider.plan.provider_config import ClusterConfigError, Filled
from eray_provider.slurm.allocation import Allocation, NodeShare
from eray_provider.slurm.srun import bash_command, clean_env, srun_argv

ALLOC = Allocation(
    "77",
    (
        NodeShare("g1", 16, 4, "a100", 64000),
        NodeShare("g2", 16, 4, "a100", 64000),
        NodeShare("c1", 8, 0, None, 16000),
        NodeShare("g3", 16, 4, "a100", 64000),
    ),
)
USER = {
    "cluster_name": "t",
    "max_workers": -1,
    "provider": {"type": "external", "module": "eray_provider.SlurmNodeProvider", "state_dir": "/x"},
    "setup_commands": ["echo all"],
    "head_setup_commands": [],
    "worker_setup_commands": ["echo w"],
}


def filled(**over) -> dict:
    user = copy.deepcopy(USER)
    user.update(over)
    return fill_config(prepare_config(user), ALLOC, python="/venv/bin/python")


def test_node_types_come_from_the_allocation_and_pass_rays_validation() -> None:
    cfg = filled()
    validate_config(cfg)  # Ray's own schema and checks
    types = cfg["available_node_types"]
    assert cfg["head_node_type"] == HEAD_TYPE and cfg["max_workers"] == 3
    head = types[HEAD_TYPE]["resources"]
    assert head["CPU"] == 16 and head["GPU"] == 4 and head["accelerator_type:A100"] == 1
    assert head["slurm_node:g1"] == 1 and head["slurm_job:77"] == 1
    workers = {k: v for k, v in types.items() if k != HEAD_TYPE}
    assert sorted(v["node_config"]["slurm_nodes"] for v in workers.values()) == [["c1"], ["g2", "g3"]]
    for v in workers.values():
        assert v["min_workers"] == v["max_workers"] == len(v["node_config"]["slurm_nodes"])
    assert cfg["head_start_ray_commands"] == [LAUNCH_HEAD]
    assert Filled.of(cfg["provider"]).worker_setup_commands == ("echo all", "echo w")
    assert cfg["provider"]["disable_node_updaters"] is True
    assert cfg["provider"]["disable_launch_config_check"] is True  # v1 keeps the workers
    assert fill_config(cfg, ALLOC) is cfg  # idempotent on a filled config


def test_max_workers_subset_and_errors() -> None:
    assert filled(max_workers=1)["max_workers"] == 1
    with pytest.raises(ClusterConfigError, match=r"max_workers: 4 .* only 3 node\(s\)"):
        filled(max_workers=4)
    with pytest.raises(ClusterConfigError, match="max_workers must be an integer"):
        filled(max_workers="lots")
    user = copy.deepcopy(USER)
    user["provider"]["wait_for_workers"] = "no"
    with pytest.raises(ClusterConfigError, match=r"wait_for_workers must be true or false, got 'no'"):
        fill_config(prepare_config(user), ALLOC)
    user["provider"]["wait_for_workers"] = False
    assert fill_config(prepare_config(user), ALLOC)["provider"]["wait_for_workers"] is False
    user["provider"]["nodes"] = "g[2-3],zz9"
    with pytest.raises(ClusterConfigError, match=r"\['zz9'\] outside job 77"):
        fill_config(prepare_config(user), ALLOC)
    user["provider"]["nodes"] = "c1,g1"
    cfg = fill_config(prepare_config(user), ALLOC)
    assert cfg["available_node_types"][HEAD_TYPE]["node_config"]["slurm_nodes"] == ["c1"]


def test_gone_config_is_valid_for_ray() -> None:
    cfg = gone_config(prepare_config(copy.deepcopy(USER)), "77", "job 77 has ended")
    validate_config(cfg)
    assert Filled.of(cfg["provider"]).job_gone == "job 77 has ended"


def test_start_line_pins_every_port_and_never_binds_all_interfaces() -> None:
    plan = choose_plan("77", [(32768, 60999)])
    spec = StartSpec(
        ALLOC.head,
        "77",
        "head",
        "10.0.0.5",
        plan,
        "/tmp/eray-77-x",
        autoscaling_config="/h/ray_bootstrap_config.yaml",
    )
    argv = spec.argv()
    flags = dict(a.lstrip("-").split("=", 1) for a in argv if a.startswith("--") and "=" in a)
    assert argv[:3] == ["ray", "start", "--block"] and "--head" in argv
    assert int(flags["port"]) == plan.gcs and flags["dashboard-host"] == "10.0.0.5"
    assert flags["node-ip-address"] == "10.0.0.5" and flags["temp-dir"] == "/tmp/eray-77-x"
    for key in (
        "dashboard-port",
        "ray-client-server-port",
        "node-manager-port",
        "object-manager-port",
        "dashboard-agent-listen-port",
        "dashboard-agent-grpc-port",
        "runtime-env-agent-port",
        "metrics-export-port",
        "min-worker-port",
        "max-worker-port",
    ):
        assert key in flags
    assert "0.0.0.0" not in " ".join(argv)
    heap, store = memory_split(ALLOC.head, 0.3)
    assert int(flags["memory"]) == heap and int(flags["object-store-memory"]) == store
    assert heap + store == 64000 * 2**20
    assert json.loads(flags["resources"]) == {
        "accelerator_type:A100": 1.0,
        "slurm_job:77": 1.0,
        "slurm_node:g1": 1.0,
    }
    # metrics export off by default: its endpoint answers without the token
    assert start_env(plan, False) == {**plan.ray_env(), "RAY_enable_metrics_collection": "0"}
    assert start_env(plan, True) == plan.ray_env()
    worker = StartSpec(ALLOC.nodes[2], "77", "worker", "10.0.0.6", plan, "/t", head_address="10.0.0.5:1")
    assert "--address=10.0.0.5:1" in worker.argv() and "--head" not in worker.argv()
    with pytest.raises(ValueError, match="head's address"):
        StartSpec(ALLOC.nodes[2], "77", "worker", "10.0.0.6", plan, "/t").argv()


def test_small_memory_is_an_error() -> None:
    with pytest.raises(ValueError, match="too little"):
        memory_split(NodeShare("n", 1, memory_mb=50), 0.3)


def test_worker_types_group_alike_shares() -> None:
    types = worker_types(ALLOC)
    assert {k: [s.name for s in v] for k, v in types.items()} == {
        "ray.worker.c16.g4.a100.m64000": ["g2", "g3"],
        "ray.worker.c8.m16000": ["c1"],
    }


def test_srun_lines_and_environment() -> None:
    argv = srun_argv("77", ["g1", "g2"], ["python", "-m", "x"], name="eray.t.workers.3")
    assert argv[0] == "srun" and "--jobid=77" in argv and "--overlap" in argv
    assert "--nodes=2" in argv and "--ntasks=2" in argv and "--nodelist=g[1-2]" in argv
    assert "--job-name=eray.t.workers.3" in argv and argv[-3:] == ["python", "-m", "x"]
    env = clean_env({"SLURM_CONF": "/c", "SLURM_NNODES": "1", "SLURM_STEP_ID": "3", "PATH": "/b"}, {"A": "1"})
    assert env == {"SLURM_CONF": "/c", "PATH": "/b", "A": "1"}


def test_runner_helpers() -> None:
    cmd = "export RAY_HEAD_IP=10.0.0.5; export RAY_CLOUD_INSTANCE_ID='g1.1'; eray-provider-launch-head"
    assert dict(_exports(cmd)) == {"RAY_HEAD_IP": "10.0.0.5", "RAY_CLOUD_INSTANCE_ID": "g1.1"}
    assert _remote_path("~/ray_bootstrap_config.yaml") == "./ray_bootstrap_config.yaml"
    assert _remote_path("~/a b") == ".'/a b'"
    assert _remote_path("~") == "."
    assert _remote_path("/a b") == "'/a b'"


@pytest.mark.parametrize(
    ("target", "is_dir"),
    [("~/ray_bootstrap_config.yaml", False), ("~/sub/f", False), ("~/d", True), ("~", True)],
)
def test_a_copy_to_a_cluster_whose_home_is_gone_fails_and_makes_nothing(tmp_path, target, is_dir) -> None:
    """A `ray up` that copies after a racing `ray down` removed the cluster's state: the
    copy's node side (run here by bash, as srun runs it) fails and makes no HOME again;
    into a HOME that is there it writes the file or tree."""
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "x").write_text("tree")
    data = subprocess.run(
        ["tar", "-C", str(payload), "-cf", "-", "."], capture_output=True, check=True
    ).stdout
    stdin = data if is_dir else b"config"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    gone = tmp_path / "state" / "home"

    def unpack(home: Path) -> subprocess.CompletedProcess[bytes]:
        argv = bash_command(unpack_command(target, is_dir))
        env = {"HOME": str(home), "PATH": os.environ["PATH"]}
        return subprocess.run(argv, input=stdin, env=env, cwd=cwd, capture_output=True)

    assert unpack(gone).returncode != 0
    assert not (tmp_path / "state").exists() and list(cwd.iterdir()) == []
    home = tmp_path / "home"
    home.mkdir()
    assert unpack(home).returncode == 0
    written = home / target[2:] if target != "~" else home
    if is_dir:
        assert (written / "x").read_text() == "tree"
    else:
        assert written.read_bytes() == b"config"
    assert list(cwd.iterdir()) == []


@pytest.mark.parametrize(
    ("cmd", "expected"),
    [
        ("ray stop", ("", True)),
        ("ray stop --force -v", ("", True)),
        ("ray stop --grace-period 10", ("", True)),
        ("export RAY_enable_autoscaler_v2=1; export RAY_CLOUD_INSTANCE_ID=x; ray stop", ("", True)),
        # ray exec --stop: the command runs, then the cluster stops; teardown/shutdown dropped
        ("python t.py; ray stop; ray teardown ~/ray_bootstrap_config.yaml --yes --workers-only; "
         "sudo shutdown -h now", ("python t.py", True)),
        ("echo ray stop", ("echo ray stop", False)),
        ('grep -c "ray stop" log', ('grep -c "ray stop" log', False)),
        ("echo 'a; ray stop'", ("echo 'a; ray stop'", False)),
        ("ray stopped", ("ray stopped", False)),
        ("ray status", ("ray status", False)),
    ],
)  # fmt: skip
def test_only_an_exact_ray_stop_statement_stops_the_cluster(cmd: str, expected) -> None:
    assert split_ray_stop(cmd) == expected


@pytest.mark.parametrize("cmd", ["true && ray stop", "ray stop | tee log", "(ray stop)", "x || ray stop -f"])
def test_a_ray_stop_inside_a_compound_command_is_refused_not_run_bare(cmd: str) -> None:
    with pytest.raises(ValueError, match="ray stop"):
        split_ray_stop(cmd)
