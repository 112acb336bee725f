"""Pure parts of the elastic provider: sbatch requests, job names, squeue parsing, config."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from ray.autoscaler._private.util import prepare_config, validate_config
from testbed_support import REPO

from eray_provider.plan.elastic_config import fill_elastic_config, head_mode
from eray_provider.plan.node_spec import memory_split
from eray_provider.plan.provider_config import ClusterConfigError, Filled, ProviderConfig
from eray_provider.plan.sbatch import (
    SbatchRequest,
    SbatchRequestError,
    elastic_node_id,
    parse_mem,
)
from eray_provider.runtime.slurm_jobs import batch_script, sbatch_argv
from eray_provider.slurm.allocation import Allocation, NodeShare
from eray_provider.slurm.squeue import parse_squeue

YAML = yaml.safe_load((REPO / "cluster_yamls" / "slurm-autoscale.yaml").read_text())


def test_request_to_sbatch_options_and_resources() -> None:
    req = SbatchRequest.from_config(
        {
            "nodes": 2,
            "cpus_per_node": 8,
            "gpus_per_node": "a100:4",
            "mem": "64G",
            "time": "2:00:00",
            "constraint": "ib",
            "extra": ["--exclusive"],
        },
        {"partition": "gpu", "account": "proj", "qos": "normal"},
        "t",
    )
    assert req.argv() == [
        "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=8", "--gpus-per-node=a100:4", "--mem=65536M",
        "--partition=gpu", "--account=proj", "--qos=normal", "--time=2:00:00", "--constraint=ib",
        "--exclusive",
    ]  # fmt: skip
    res = req.resources(0.3)
    heap, store = memory_split(NodeShare("x", 8, 4, "a100", 65536), 0.3)
    assert res == {
        "CPU": 8,
        "GPU": 4,
        "accelerator_type:A100": 1.0,
        "memory": heap,
        "object_store_memory": store,
    }
    # a node type's own value wins over provider.sbatch
    assert (
        "--partition=debug"
        in SbatchRequest.from_config(
            {"cpus_per_node": 1, "partition": "debug"}, {"partition": "gpu"}, "t"
        ).argv()
    )
    plain = SbatchRequest.from_config({"cpus_per_node": 4}, None, "t")
    assert plain.resources() == {"CPU": 4} and "--mem" not in " ".join(plain.argv())


@pytest.mark.parametrize(
    ("request_", "needle"),
    [
        ({}, "t.cpus_per_node is required"),
        ({"cpus_per_node": 0}, "t.cpus_per_node: expected a positive integer, got 0"),
        ({"cpus_per_node": 2, "nodes": "two"}, "t.nodes: expected a positive integer, got 'two'"),
        ({"cpus_per_node": 2, "mem": "lots"}, "t.mem: expected MiB or a size like 4G, got 'lots'"),
        ({"cpus_per_node": 2, "gpus_per_node": "a100:x"}, "t.gpus_per_node='a100:x'"),
        ({"cpus_per_node": 2, "partitoin": "gpu"}, "unknown option(s) ['partitoin']"),
        ({"cpus_per_node": 2, "extra": "--exclusive"}, "t.extra: expected a list of sbatch options"),
        ({"cpus_per_node": 2, "partition": "a b"}, "t.partition: expected one word, got 'a b'"),
        ("cpus=2", "t: expected a mapping of sbatch options, got 'cpus=2'"),
        ({"cpus_per_node": 2, "extra": ["--job-name=x"]}, "t.extra: '--job-name=x' is set by eray-provider"),
        ({"cpus_per_node": 2, "extra": ["-Jx"]}, "t.extra: '-Jx' is set by eray-provider"),
        ({"cpus_per_node": 2, "extra": ["--array=1-4"]}, "t.extra: '--array=1-4' is set by eray-provider"),
        (
            {"cpus_per_node": 2, "extra": ["--export=NONE"]},
            "t.extra: '--export=NONE' is set by eray-provider",
        ),
    ],
)
def test_bad_requests_name_the_field_and_value(request_, needle) -> None:
    with pytest.raises(SbatchRequestError) as e:
        SbatchRequest.from_config(request_, None, "t")
    assert needle in str(e.value)


@given(st.integers(1, 10**6), st.sampled_from(["", "K", "M", "G", "T", "m", "g"]))
def test_parse_mem_units(n: int, unit: str) -> None:
    factor = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2}[unit.upper()]
    assert parse_mem(f"{n}{unit}", "t") == max(1, int(n * factor))


def test_elastic_node_ids() -> None:
    assert elastic_node_id("55", 2) == "j55-2"


def test_squeue_lines() -> None:
    text = (
        "12|PENDING|2||Resources|3:00|N/A|3:00|eray.c.7.cpu\n"
        "13|RUNNING|2|n[1-2]|None|2:41|2026-12-03T20:01:30|10:00|eray.c.7.cpu\n"
        "14|PENDING|1||PartitionTimeLimit|INVALID|Unknown|INVALID|eray.c.7.x|with|bars\n"
        "15|COMPLETING|1|n3|None|0:00|2026-12-03T19:58:00|5:00|eray.c.7.cpu\n"
        "16|RUNNING|1|n3|None|eray.c.7.cpu\n"  # the six fields of an older format
        "17|RUNNING|1|n3|None|1:00|2026-12-03T19:58:00|eray.c.7.cpu\n"  # eight
        "garbage line\n"
    )
    jobs = parse_squeue(text)
    assert sorted(jobs) == ["12", "13", "14", "15"]
    assert jobs["12"].live and not jobs["12"].hopeless and jobs["12"].nodelist == ""
    assert jobs["13"].nodelist == "n[1-2]" and jobs["13"].num_nodes == 2
    assert jobs["13"].time_left == "2:41" and jobs["13"].end_time == "2026-12-03T20:01:30"
    assert jobs["13"].time_limit == "10:00" and jobs["14"].time_limit == ""
    assert jobs["12"].end_time == "" and jobs["14"].time_left == "" and jobs["14"].end_time == ""
    assert jobs["14"].hopeless and jobs["14"].name == "eray.c.7.x|with|bars"
    assert not jobs["15"].live


def test_sbatch_line_and_script() -> None:
    req = SbatchRequest.from_config({"cpus_per_node": 2}, None, "t")
    argv = sbatch_argv(req, "eray.c.7.cpu", Path("/s/logs/job-%j.log"))
    assert argv[:5] == ["sbatch", "--parsable", "--job-name=eray.c.7.cpu", "--output=/s/logs/job-%j.log",
                        "--open-mode=append"]  # fmt: skip
    assert "--test-only" in sbatch_argv(req, "x", Path("/dev/null"), test_only=True)
    script = batch_script("/venv/bin/python")
    assert script.startswith("#!/bin/bash\n") and "srun --ntasks-per-node=1" in script
    assert script.rstrip().endswith("/venv/bin/python -m eray_provider.runtime.node_run")


def test_shipped_yaml_fills_and_passes_rays_validation() -> None:
    cfg = fill_elastic_config(prepare_config(copy.deepcopy(YAML)), None, python="/venv/bin/python")
    validate_config(cfg)
    types = cfg["available_node_types"]
    assert cfg["head_node_type"] == "head" and types["head"]["max_workers"] == 0
    assert types["cpu"]["resources"]["CPU"] == 2 and types["cpu"]["max_workers"] == 4
    assert Filled.of(cfg["provider"]).elastic and "job_id" not in cfg["provider"]
    assert cfg["idle_timeout_minutes"] == YAML["idle_timeout_minutes"]  # the user's, not forced
    assert cfg["provider"]["disable_node_updaters"] is True
    assert cfg["provider"]["autoscaler_interval_s"] == 1  # demand to sbatch within a second

    # the head in a running job: its resources are what SLURM gave it
    alloc = Allocation("42", (NodeShare("n1", 16, 0, None, 32000), NodeShare("n2", 16)))
    cfg = fill_elastic_config(prepare_config(copy.deepcopy(YAML)), alloc)
    allocation = Filled.of(cfg["provider"]).allocation or {}
    assert cfg["provider"]["job_id"] == "42" and [n["name"] for n in allocation["nodes"]] == ["n1"]
    assert cfg["available_node_types"]["head"]["resources"]["CPU"] == 16


def test_elastic_config_errors() -> None:
    bad = copy.deepcopy(YAML)
    bad["available_node_types"]["cpu"]["node_config"] = {}
    with pytest.raises(ClusterConfigError, match=r"available_node_types.cpu.node_config.sbatch is missing"):
        fill_elastic_config(bad, None)
    bad = copy.deepcopy(YAML)
    bad["available_node_types"]["cpu"]["min_workers"] = 5
    with pytest.raises(ClusterConfigError, match=r"max_workers \(4\) is below min_workers \(5\)"):
        fill_elastic_config(bad, None)
    for value in (0, "fast", True):
        bad = copy.deepcopy(YAML)
        bad["provider"]["autoscaler_interval_s"] = value
        with pytest.raises(
            ClusterConfigError, match=rf"autoscaler_interval_s must be an integer >= 1, got {value!r}"
        ):
            fill_elastic_config(bad, None)
    bad = copy.deepcopy(YAML)
    bad["head_node_type"] = "boss"
    with pytest.raises(ClusterConfigError, match="head_node_type 'boss'"):
        fill_elastic_config(bad, None)

    def mode(provider: dict, in_allocation: bool) -> str:
        return head_mode(ProviderConfig.from_dict(provider, elastic=True), in_allocation)

    with pytest.raises(ClusterConfigError, match=r"provider\.head must be one of"):
        mode({"head": "login"}, False)
    assert mode({}, False) == "job" and mode({}, True) == "allocation"
    assert mode({"job_id": 5}, False) == "allocation" and mode({"head": "job"}, True) == "job"
    with pytest.raises(ClusterConfigError, match="not inside a SLURM allocation"):
        mode({"head": "allocation"}, False)
    with pytest.raises(ClusterConfigError, match=r"contradicts provider\.job_id: '5'"):
        mode({"head": "job", "job_id": 5}, False)
    # a type without max_workers may use the whole cluster's
    loose = copy.deepcopy(YAML)
    del loose["available_node_types"]["cpu"]["max_workers"]
    assert (
        fill_elastic_config(loose, None)["available_node_types"]["cpu"]["max_workers"] == YAML["max_workers"]
    )
    assert SbatchRequest.from_config({"cpus_per_node": 1, "extra": ["--exclusive", "--hold"]}, None, "t")


def test_clean_env_drops_the_slurm_commands_input_variables() -> None:
    from eray_provider.slurm.srun import clean_env

    env = {
        "SBATCH_EXPORT": "NONE",
        "SBATCH_ARRAY_INX": "0-3",
        "SALLOC_PARTITION": "p",
        "SRUN_CPUS_PER_TASK": "4",
        "SQUEUE_STATES": "RUNNING",
        "SCANCEL_STATE": "PENDING",
        "SLURM_NTASKS": "3",
        "SLURM_CONF": "/etc/slurm.conf",
        "PATH": "/bin",
    }
    assert clean_env(env, {"X": "1"}) == {"SLURM_CONF": "/etc/slurm.conf", "PATH": "/bin", "X": "1"}
    request = SbatchRequest.from_config({"cpus_per_node": 1}, None, "t")
    assert "--export=ALL" in sbatch_argv(request, "n", Path("l"))


def test_a_dotted_elastic_cluster_name_is_refused() -> None:
    from eray_provider.plan.names import ClusterNameError

    config = copy.deepcopy(YAML)
    config["cluster_name"] = "sweep.2"
    with pytest.raises(ClusterNameError, match=r"cluster_name: 'sweep\.2'"):
        fill_elastic_config(config, None)


def test_pending_worker_jobs_are_said_once_per_reason() -> None:
    from eray_provider.autoscaler.worker_pool import pending_news
    from eray_provider.slurm.squeue import JobInfo

    def jobs(reason12: str) -> dict[str, JobInfo]:
        return {
            "12": JobInfo("12", "PENDING", "eray.c.7.cpu", "", reason12, 1),
            "13": JobInfo("13", "PENDING", "eray.c.7.gpu", "", "Resources", 1),
            "9": JobInfo("9", "PENDING", "eray.c.8.cpu", "", "Resources", 1),  # another head's
            "10": JobInfo("10", "RUNNING", "eray.c.7.cpu", "n1", "None", 1),
        }

    lines, said = pending_news(jobs("Priority"), "c", "7", {})
    assert lines == ["worker job 12 (cpu) is pending: Priority", "worker job 13 (gpu) is pending: Resources"]
    lines, said = pending_news(jobs("Resources"), "c", "7", said)
    assert lines == ["worker job 12 (cpu) is pending: Resources"]
    assert said == {"12": "Resources", "13": "Resources"}
    assert pending_news({}, "c", "7", said) == ([], {})
