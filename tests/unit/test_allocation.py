"""The allocation model from SLURM variables and from scontrol output (no cluster needed)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from testbed_support import DATA

from eray_provider.slurm.allocation import Allocation, AllocationError, NodeShare, parse_gpu_spec
from eray_provider.slurm.env import allocation_from_env
from eray_provider.slurm.scontrol import parse_config, parse_job, parse_port_range


def read_env(name: str) -> dict[str, str]:
    lines = (DATA / name).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def env(**kw: str) -> dict[str, str]:
    base = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_CPUS_PER_NODE": "4"}
    base.update(kw)
    return {k: v for k, v in base.items() if v is not None}


def shares(alloc: Allocation) -> list[tuple]:
    return [(n.name, n.cpus, n.gpus, n.gpu_type, n.memory_mb) for n in alloc.nodes]


def test_single_node() -> None:
    a = allocation_from_env(env(SLURM_MEM_PER_NODE="2000", SLURM_JOB_PARTITION="gpu"))
    assert shares(a) == [("n1", 4, 0, None, 2000)]
    assert a.head.name == "n1" and a.workers == () and a.partition == "gpu"


def test_run_length_cpus_and_mem_per_cpu() -> None:
    a = allocation_from_env(
        env(
            SLURM_JOB_NODELIST="gpu[01-02],cpu7", SLURM_JOB_CPUS_PER_NODE="72(x2),36", SLURM_MEM_PER_CPU="100"
        )
    )
    assert shares(a) == [
        ("gpu01", 72, 0, None, 7200),
        ("gpu02", 72, 0, None, 7200),
        ("cpu7", 36, 0, None, 3600),
    ]
    assert [w.name for w in a.workers] == ["gpu02", "cpu7"]


def test_one_cpu_times_three() -> None:
    a = allocation_from_env(env(SLURM_JOB_NODELIST="node[1-3]", SLURM_JOB_CPUS_PER_NODE="1(x3)"))
    assert [(n.name, n.cpus, n.memory_mb) for n in a.nodes] == [
        ("node1", 1, None),
        ("node2", 1, None),
        ("node3", 1, None),
    ]


@pytest.mark.parametrize(
    ("value", "gpus", "gpu_type"),
    [("4", 4, None), ("a100:4", 4, "a100"), ("gpu:a100:4", 4, "a100"), ("gpu:2", 2, None)],
)
def test_gpus_per_node_forms(value: str, gpus: int, gpu_type: str | None) -> None:
    a = allocation_from_env(
        env(SLURM_JOB_NODELIST="n[1-2]", SLURM_JOB_CPUS_PER_NODE="8(x2)", SLURM_GPUS_PER_NODE=value)
    )
    assert {(n.gpus, n.gpu_type) for n in a.nodes} == {(gpus, gpu_type)}


def test_gpus_on_node_and_mem_per_gpu() -> None:
    a = allocation_from_env(env(SLURM_GPUS_ON_NODE="2", SLURM_MEM_PER_GPU="1024"))
    assert shares(a) == [("n1", 4, 2, None, 2048)]


def test_total_gpus_without_layout_is_an_error() -> None:
    with pytest.raises(AllocationError, match=r"SLURM_GPUS='8' does not say .* over the 2 nodes"):
        allocation_from_env(env(SLURM_GPUS="8", SLURM_JOB_NODELIST="n[1-2]", SLURM_JOB_CPUS_PER_NODE="4(x2)"))
    # one node holds them all
    assert shares(allocation_from_env(env(SLURM_GPUS="a100:8"))) == [("n1", 4, 8, "a100", None)]


def test_heterogeneous_job_from_real_salloc() -> None:
    a = allocation_from_env(read_env("het_salloc.env"))
    assert a.job_id == "4" and a.partition == "debug" and a.cluster == "eraytest"
    assert shares(a) == [("node1", 2, 0, None, 1000), ("node2", 2, 0, None, 1000), ("node3", 1, 2, None, 700)]


def test_typed_gpus_from_real_salloc() -> None:
    a = allocation_from_env(read_env("typed_salloc.env"))
    assert shares(a) == [(f"node{k}", 3, 1, "testgpu", 1500) for k in (1, 2, 3)]


@pytest.mark.parametrize(
    ("overrides", "variable", "value"),
    [
        (
            {"SLURM_JOB_CPUS_PER_NODE": "72(x2)", "SLURM_JOB_NODELIST": "n[1-3]"},
            "SLURM_JOB_CPUS_PER_NODE",
            "72(x2)",
        ),
        ({"SLURM_JOB_CPUS_PER_NODE": "lots"}, "SLURM_JOB_CPUS_PER_NODE", "lots"),
        ({"SLURM_JOB_NODELIST": "n[3-1]"}, "SLURM_JOB_NODELIST", "n[3-1]"),
        ({"SLURM_JOB_ID": "abc"}, "SLURM_JOB_ID", "abc"),
        ({"SLURM_GPUS_PER_NODE": "a100:many"}, "SLURM_GPUS_PER_NODE", "a100:many"),
        ({"SLURM_MEM_PER_NODE": "12X"}, "SLURM_MEM_PER_NODE", "12X"),
        ({"SLURM_MEM_PER_CPU": "-5"}, "SLURM_MEM_PER_CPU", "-5"),
        ({"SLURM_GPUS_ON_NODE": "two"}, "SLURM_GPUS_ON_NODE", "two"),
        ({"SLURM_HET_SIZE": "x"}, "SLURM_HET_SIZE", "x"),
    ],
)
def test_malformed_values_name_variable_and_value(overrides, variable, value) -> None:
    with pytest.raises(AllocationError) as info:
        allocation_from_env(env(**overrides))
    assert variable in str(info.value) and repr(value) in str(info.value)


@pytest.mark.parametrize("missing", ["SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_JOB_CPUS_PER_NODE"])
def test_missing_variables_are_named(missing: str) -> None:
    e = env()
    del e[missing]
    with pytest.raises(AllocationError, match=missing):
        allocation_from_env(e)


def test_step_nodelist_prefers_job_wide_variable() -> None:
    a = allocation_from_env(
        env(SLURM_JOB_NODELIST="node2", SLURM_NODELIST="node[1-3]", SLURM_JOB_CPUS_PER_NODE="2(x3)")
    )
    assert a.node_names == ["node1", "node2", "node3"]


def test_scontrol_heterogeneous_record() -> None:
    a = parse_job((DATA / "het_job.scontrol").read_text())
    assert a.job_id == "4" and a.state == "RUNNING" and a.source == "scontrol"
    assert shares(a) == [
        ("node1", 2, 0, None, 1000),
        ("node2", 2, 0, None, 1000),
        ("node3", 1, 2, "testgpu", 700),
    ]
    assert a.nodes[2].gpu_ids == (0, 1)


def test_scontrol_typed_job() -> None:
    a = parse_job((DATA / "typed_job.scontrol").read_text())
    assert shares(a) == [(f"node{k}", 3, 1, "testgpu", 1500) for k in (1, 2, 3)]


def test_scontrol_groups_with_different_shares() -> None:
    text = """JobId=9 JobName=x
   JobState=RUNNING Reason=None
   Partition=p
   NodeList=g[1-2],c1
   JOB_GRES=gpu:8
     Nodes=g[1-2] CPU_IDs=0-3,8-11 Mem=4G GRES=gpu:4(IDX:0-3)
     Nodes=c1 CPU_IDs=0 Mem=0 GRES=
"""
    a = parse_job(text)
    assert shares(a) == [("g1", 8, 4, None, 4096), ("g2", 8, 4, None, 4096), ("c1", 1, 0, None, None)]


def test_scontrol_pending_job_is_a_clear_error() -> None:
    with pytest.raises(AllocationError, match="PENDING"):
        parse_job("JobId=12 JobName=x\n   JobState=PENDING Reason=Resources\n   NodeList=(null)\n")


def test_config_and_port_range() -> None:
    cfg = parse_config("Configuration data as of now\nSrunPortRange           = 60001-63000\nX = 1\n")
    assert parse_port_range(cfg["SrunPortRange"]) == (60001, 63000)
    assert parse_port_range("0-0") == (0, 0)
    assert parse_port_range("(null)") is None


def test_gpu_spec_errors_and_node_validation() -> None:
    assert parse_gpu_spec("a100:2,a100:1", "V") == ("a100", 3)
    assert parse_gpu_spec("a100:2,v100:1", "V") == (None, 3)
    with pytest.raises(AllocationError, match="V='x:y:z:1'"):
        parse_gpu_spec("x:y:z:1", "V")
    with pytest.raises(AllocationError, match="cpus"):
        NodeShare("n", 0)
    with pytest.raises(AllocationError, match="repeats"):
        Allocation("1", (NodeShare("n", 1), NodeShare("n", 1)))


def test_json_round_trip() -> None:
    a = parse_job((DATA / "het_job.scontrol").read_text())
    assert Allocation.from_dict(json.loads(a.to_json())) == a


def run_cli(*args: str, env_vars: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "eray_provider.cli", *args],
        capture_output=True,
        text=True,
        env={"PATH": "/nonexistent", **env_vars},
        timeout=60,
    )


def test_cli_inspect_json_from_environment() -> None:
    e = env(
        SLURM_JOB_NODELIST="n[1-2],m1",
        SLURM_JOB_CPUS_PER_NODE="72(x2),36",
        SLURM_GPUS_PER_NODE="gpu:a100:4",
        SLURM_MEM_PER_CPU="10",
    )
    proc = run_cli("inspect", "--json", env_vars=e)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["job_id"] == "77" and doc["head"] == "n1"
    assert doc["nodes"][2] == {
        "name": "m1",
        "cpus": 36,
        "gpus": 4,
        "gpu_type": "a100",
        "memory_mb": 360,
        "gpu_ids": None,
    }
    assert doc["ports"]["gcs"] == doc["ports"]["block_start"]
    table = run_cli("inspect", env_vars=e)
    assert "m1" in table.stdout and "worker" in table.stdout and "a100" in table.stdout


def test_cli_inspect_outside_allocation_and_malformed() -> None:
    proc = run_cli("inspect", env_vars={})
    assert proc.returncode == 2 and "not inside a SLURM allocation" in proc.stderr
    proc = run_cli("inspect", env_vars=env(SLURM_JOB_CPUS_PER_NODE="72(x2)"))
    assert proc.returncode == 2 and "SLURM_JOB_CPUS_PER_NODE" in proc.stderr


def test_cli_hostlist_commands() -> None:
    proc = run_cli("hostnames", "a[1-2],b3", env_vars={})
    assert proc.stdout.split() == ["a1", "a2", "b3"]
    proc = run_cli("hostlist", "n3,n1", "n2", env_vars={})
    assert proc.stdout.strip() == "n[3,1-2]"
    proc = run_cli("hostlist", "--sorted", "n3,n1,n2", env_vars={})
    assert proc.stdout.strip() == "n[1-3]"
    proc = run_cli("hostnames", "n[2-1]", env_vars={})
    assert proc.returncode == 2 and "n[2-1]" in proc.stderr


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("3000", 3000),
        ("3000M", 3000),
        ("4G", 4096),
        ("4g", 4096),
        ("4GB", 4096),
        ("512K", 0.5),
        ("1T", 1024**2),
    ],
)
def test_one_memory_grammar_for_the_environment_scontrol_and_sbatch(text: str, mib: float) -> None:
    from eray_provider.plan.sbatch import parse_mem
    from eray_provider.slurm.allocation import memory_mib
    from eray_provider.slurm.env import allocation_from_env
    from eray_provider.slurm.scontrol import _memory_mb

    assert memory_mib(text) == mib
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_CPUS_PER_NODE": "2"}
    assert allocation_from_env({**env, "SLURM_MEM_PER_NODE": text}).nodes[0].memory_mb == (int(mib) or None)
    assert _memory_mb(text) == (int(mib) or None)
    assert parse_mem(text, "t") == max(1, int(mib))


def test_memory_decimals_only_where_slurm_prints_them() -> None:
    from eray_provider.plan.sbatch import SbatchRequestError, parse_mem
    from eray_provider.slurm.allocation import memory_mib

    assert memory_mib("1.50G", decimals=True) == 1536
    assert memory_mib("1.50G") is None
    for bad in ("", "G", "4 G", "4X", "-4G", "4GiB", "0x10"):
        assert memory_mib(bad, decimals=True) is None, bad
    with pytest.raises(SbatchRequestError, match=r"t\.mem: .*'1\.5G'"):
        parse_mem("1.5G", "t")
    with pytest.raises(SbatchRequestError, match=r"got 0"):
        parse_mem(0, "t")


def test_one_rule_for_a_node_shared_by_two_components() -> None:
    from eray_provider.slurm.allocation import add_shares, one_gpu_type
    from eray_provider.slurm.scontrol import _gres_gpus

    a100, v100 = NodeShare("n1", 2, 1, "a100", 1000), NodeShare("n1", 1, 2, "v100", 500)
    assert add_shares(a100, v100) == NodeShare("n1", 3, 3, None, 1500)
    assert add_shares(a100, NodeShare("n1", 1, 0, None, None)) == NodeShare("n1", 3, 1, "a100", None)
    assert one_gpu_type(["a100", "a100"]) == "a100" and one_gpu_type(["a100", None]) is None
    # the environment and scontrol read mixed types alike
    assert _gres_gpus("gpu:a100:1(IDX:0),gpu:v100:2(IDX:1-2)") == (None, 3, (0, 1, 2))
    assert parse_gpu_spec("a100:1,v100:2", "SLURM_GPUS_PER_NODE") == (None, 3)
    env = {
        "SLURM_JOB_ID": "4",
        "SLURM_HET_SIZE": "2",
        "SLURM_JOB_NODELIST_HET_GROUP_0": "n1",
        "SLURM_JOB_CPUS_PER_NODE_HET_GROUP_0": "2",
        "SLURM_GPUS_PER_NODE_HET_GROUP_0": "a100:1",
        "SLURM_JOB_NODELIST_HET_GROUP_1": "n1",
        "SLURM_JOB_CPUS_PER_NODE_HET_GROUP_1": "1",
        "SLURM_GPUS_PER_NODE_HET_GROUP_1": "v100:2",
    }
    assert shares(allocation_from_env(env)) == [("n1", 3, 3, None, None)]


@pytest.mark.parametrize(
    ("good", "bad", "said"),
    [
        ("NodeList=node[1-3]", "NodeList=node[3-", "NodeList='node[3-'"),
        ("Nodes=node[1-3] ", "Nodes=node[1- ", "Nodes='node[1-'"),
    ],
)
def test_scontrol_hostlist_that_does_not_parse_names_its_key(good: str, bad: str, said: str) -> None:
    text = (DATA / "typed_job.scontrol").read_text()
    assert good in text
    with pytest.raises(AllocationError, match=re.escape(f"scontrol {said}: ")):
        parse_job(text.replace(good, bad))
