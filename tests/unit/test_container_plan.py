"""``provider.container``: the config's checks and the pyxis arguments of a node's steps."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from eray_provider.plan.container import (
    ContainerConfig,
    ContainerConfigError,
    ContainerPlan,
    plan_container,
    start_args,
)
from eray_provider.plan.names import container_name


def test_an_image_alone_is_a_config_with_the_safe_defaults() -> None:
    config = ContainerConfig.from_value("/images/train.sqsh")
    assert config == ContainerConfig(image="/images/train.sqsh")
    assert (config.writable, config.root, config.runner) == (False, False, "pyxis")
    assert ContainerConfig.from_value(None) is None
    assert ContainerConfig.from_value(config.to_dict()) == config


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({"imgae": "b"}, ".imgae is not a container setting; valid keys: env, image, mounts"),
        ({"image": ""}, ".image must be an image"),
        ({"image": "a.sqsh,b.sqsh"}, ".image must be an image"),
        ({"runner": "docker"}, ".runner must be one of ['pyxis'], got 'docker'"),
        ({"mounts": "/data"}, ".mounts must be a list"),
        ({"workdir": "rel"}, ".workdir must be an absolute path, got 'rel'"),
        ({"env": {"A B": 1}}, ".env must map variable names"),
        ({"root": "yes"}, ".root must be true or false, got 'yes'"),
    ],
)
def test_a_bad_container_value_is_named_and_quoted(value: dict, named: str) -> None:
    with pytest.raises(ContainerConfigError) as e:
        ContainerConfig.from_value({"image": "a.sqsh", **value})
    assert str(e.value).startswith("provider.container" + named), str(e.value)
    with pytest.raises(ContainerConfigError, match=r"a mapping \(image: ...\) or an image, got \[.a.\]"):
        ContainerConfig.from_value(["a"])


def test_every_step_starts_in_the_named_container_with_the_same_mounts() -> None:
    config = ContainerConfig.from_value(
        {"image": "nvcr.io#nvidia/pytorch:24.05-py3", "mounts": ["/data:/data:ro"], "workdir": "/work"}
    )
    assert config is not None
    name = container_name("train", "4242")
    args = start_args(config, name, ["/home/u/.eray-provider/train-4242", "/tmp"])
    assert args == [
        "--container-image=nvcr.io#nvidia/pytorch:24.05-py3",
        "--container-name=eray.train.4242:no_exec",
        "--container-mounts=/home/u/.eray-provider/train-4242:/home/u/.eray-provider/train-4242,/tmp:/tmp,/data:/data:ro",
        "--container-workdir=/work",
        "--container-readonly",
        "--no-container-remap-root",
    ]
    root = start_args(ContainerConfig(image="i.sqsh", writable=True, root=True), name, [])
    assert root[-2:] == ["--container-writable", "--container-remap-root"]
    assert not any("mounts" in a for a in root)


def test_the_plan_mounts_what_the_nodes_share_and_names_a_version_mismatch() -> None:
    config = ContainerConfig(image="i.sqsh", env={"A": "1"})
    plan = plan_container(
        config, "c", "7", "/home/u/.eray-provider/c-7", "/tmp", "/opt/src", ("2.60.0", "3.11")
    )
    mounts = next(a for a in plan.args if a.startswith("--container-mounts="))
    assert mounts.split("=", 1)[1].split(",") == [
        "/home/u/.eray-provider/c-7:/home/u/.eray-provider/c-7",
        "/tmp:/tmp",
        "/opt/src/eray_provider:/opt/src/eray_provider:ro",
    ]
    # the containers hand SLURM's commands to the host through the state dir's relay
    relay = "/home/u/.eray-provider/c-7/relay"
    assert plan.env == {"A": "1", "PYTHONPATH": "/opt/src", "ERAY_HOST_RELAY": relay}
    # an elastic worker job's step: the same image and mounts, in a container of its own
    # (no name: pyxis removes it when the step ends)
    assert plan.job_args == tuple(a for a in plan.args if not a.startswith("--container-name="))
    assert len(plan.job_args) == len(plan.args) - 1
    assert ContainerPlan.from_dict(json.loads(plan.to_json())) == plan
    assert plan.mismatch("2.60.0", "3.11") is None
    assert plan.mismatch("2.52.0", "3.11") == (
        "the container image has Ray 2.52.0 and Python 3.11, the login side Ray 2.60.0 and Python 3.11: they "
        "must match (install the login side's Ray in the image, or run ray up from a Python with the image's)"
    )
    assert "Python 3.12" in (plan.mismatch("2.60.0", "3.12") or "")


def test_run_options_need_an_image_and_are_checked_as_the_yaml_key() -> None:
    def run(*args: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "eray_provider.cli", "run", *args, "--", "true"]
        return subprocess.run(argv, capture_output=True, text=True, env={"PATH": "/usr/bin"}, timeout=60)

    proc = run("--container-mounts", "/data:/data")
    assert (
        proc.returncode == 2
        and "--container-mounts and --container-workdir need --container-image" in proc.stderr
    )
    proc = run("--container-image", "/i.sqsh", "--container-workdir", "relative")
    assert (
        proc.returncode == 2
        and "provider.container.workdir must be an absolute path, got 'relative'" in proc.stderr
    )


def test_inspect_shows_a_clusters_container_plan(tmp_path) -> None:
    from eray_provider.runtime.cluster_state import ClusterState

    state = ClusterState("cont", "77", tmp_path)
    state.create()
    config = ContainerConfig.from_value({"image": "/i.sqsh", "env": {"A": "1"}})
    assert config is not None
    plan = plan_container(config, "cont", "77", str(state.dir), "/tmp", "/pkg", versions=("2.60.0", "3.11"))
    state.save_container(plan)
    ClusterState("plain", "77", tmp_path).create()
    slurm = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_CPUS_PER_NODE": "4"}

    def inspect(*args: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "eray_provider.cli", "inspect", "--no-scontrol", *args]
        env = {"PATH": "/usr/bin", "HOME": str(tmp_path), **slurm}
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)

    doc = json.loads(inspect("--json", "--cluster", "cont", "--state-dir", str(tmp_path)).stdout)
    assert ContainerPlan.from_dict(doc["container"]) == plan
    text = inspect("--cluster", "cont", "--state-dir", str(tmp_path)).stdout
    assert "container: eray.cont.77 (Ray 2.60.0, Python 3.11 in the image)" in text, text
    assert "  srun --container-image=/i.sqsh" in text and "  env A=1" in text, text
    none = inspect("--cluster", "plain", "--state-dir", str(tmp_path)).stdout
    assert "container: none" in none, none
    missing = inspect("--cluster", "nosuch", "--state-dir", str(tmp_path))
    assert missing.returncode == 2 and "no cluster 'nosuch'" in missing.stderr, missing.stderr
