"""The container gate's script (runtime/container_gate.py) on real directories, and its
verdicts read. The live test (test_containers_live.py) runs it on the test bed's nodes with
the real enroot and pyxis; here an ``enroot`` on PATH exports its paths the way enroot's
own config code does (``config::export``), so the walk over owners and modes is shown on
every shape of path, including another user's."""

from __future__ import annotations

import os
import pwd
import subprocess
from pathlib import Path

import pytest
from testbed_support import other_user, require

from eray_provider.runtime.container_gate import ANSWER, GATE, ContainerGateError, image_file, judge

NAME = "eray.c.7"

#: answers ``info`` as enroot does (its final ENROOT_* values, a variable of the caller's
#: environment over the configured value, as enroot's ``config::export`` takes it: the gate
#: must unset those pyxis does not pass), and ``remove -f NAME`` under the data path
FAKE_ENROOT = """#!/usr/bin/env bash
set -euo pipefail
data="${{ENROOT_DATA_PATH:-{data}}}" config="${{ENROOT_CONFIG_PATH:-{config}}}"
case "$1" in
info) printf '  ENROOT_CONFIG_PATH=%s\\n  ENROOT_DATA_PATH=%s\\n  ENROOT_RUNTIME_PATH=%s\\n' \\
        "$config" "$data" "${{ENROOT_RUNTIME_PATH:-{runtime}}}" ;;
remove) rm -rf "$data/$3" ;;
esac
"""


def gate(tmp_path: Path, data: Path, runtime: Path, image: str = "", config: Path | None = None) -> str:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    enroot = bindir / "enroot"
    config = config or tmp_path / "home" / ".config" / "enroot"
    enroot.write_text(FAKE_ENROOT.format(data=data, runtime=runtime, config=config))
    enroot.chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", SLURMD_NODENAME="n1", SLURM_JOB_ID="7")
    env["ENROOT_DATA_PATH"] = "/elsewhere"  # ours, which pyxis never passes: ignored
    proc = subprocess.run(
        ["bash", "-c", GATE, "gate", NAME, image], env=env, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith(ANSWER)]
    return line


def private(path: Path) -> Path:
    path.mkdir(parents=True)
    path.chmod(0o700)
    return path


def test_private_paths_pass_and_leftovers_of_ours_are_removed(tmp_path) -> None:
    base = private(tmp_path / "base")
    data, runtime = private(base / "data with space"), private(base / "runtime")
    assert gate(tmp_path, data, runtime) == f"{ANSWER} n1 ok"
    # enroot's config dir (hooks run as the user) is made, private, where it was missing
    config = tmp_path / "home" / ".config" / "enroot"
    assert config.is_dir() and config.stat().st_mode & 0o777 == 0o700
    # a leftover under pyxis' global-scope name and one under its job-scope name
    leftovers = [private(data / f"pyxis_{NAME}"), private(data / f"pyxis_7_{NAME}")]
    assert gate(tmp_path, data, runtime) == f"{ANSWER} n1 ok removed {leftovers[0]} {leftovers[1]}"
    assert not any(path.exists() for path in leftovers)


def test_a_dir_writable_by_others_is_refused_unless_sticky(tmp_path) -> None:
    shared = private(tmp_path / "shared")
    data, runtime = private(shared / "me" / "data"), private(shared / "me" / "run")
    shared.chmod(0o1777)  # as /tmp: others may not rename what is ours
    assert gate(tmp_path, data, runtime).endswith(" ok")
    shared.chmod(0o777)  # others may rename `me` and put their own in its place
    line = gate(tmp_path, data, runtime)
    assert line == f"{ANSWER} n1 open {data} {shared} {os.getuid()} 777", line
    with pytest.raises(ContainerGateError, match=f"on n1, {shared} .* mode 777"):
        judge(line, ["n1"])


def test_another_users_dir_on_the_way_is_refused_as_written_and_resolved(tmp_path) -> None:
    if os.geteuid() != 0:
        require("another user's dir needs root (chown)")
    user = other_user()
    uid = pwd.getpwnam(user).pw_uid
    base = private(tmp_path / "base")
    base.chmod(0o1777)
    theirs = private(base / "enroot-0")  # made first by the other user
    data, runtime = private(theirs / "data"), private(theirs / "runtime")
    os.chown(theirs, uid, -1)
    line = gate(tmp_path, data, runtime)
    assert line == f"{ANSWER} n1 open {data} {theirs} {uid} 700", line
    with pytest.raises(ContainerGateError, match=rf"{theirs} .* belongs to {user} \(uid {uid}\)"):
        judge(line, ["n1"])
    # a link of theirs to a dir of ours
    os.chown(theirs, 0, -1)
    link = base / "link"
    link.symlink_to(data)
    os.lchown(link, uid, -1)
    assert gate(tmp_path, link, runtime) == f"{ANSWER} n1 open {link} {link} {uid} 777"
    # a link of ours through a dir of theirs: a hop the written and resolved paths both miss
    hop_dir = private(base / "evil")
    (hop_dir / "hop").symlink_to(data)
    os.chown(hop_dir, uid, -1)
    os.lchown(hop_dir / "hop", uid, -1)
    (base / "lnk").symlink_to(hop_dir / "hop")
    line = gate(tmp_path, base / "lnk", runtime)
    assert line.startswith(f"{ANSWER} n1 open {base / 'lnk'} {hop_dir} {uid} ") or line.startswith(
        f"{ANSWER} n1 open {base / 'lnk'} {hop_dir / 'hop'} {uid} "
    ), line
    # enroot's config dir made first by them (its hooks would run as us)
    config = private(base / "config")
    os.chown(config, uid, -1)
    line = gate(tmp_path, data, runtime, config=config)
    assert line == f"{ANSWER} n1 open {config} {config} {uid} 700", line
    # an image file of theirs, or one that is not there (they could make it later)
    image = theirs / "image.sqsh"
    image.write_text("")
    assert gate(tmp_path, data, runtime, str(image)).endswith(" ok")
    os.chown(image, uid, -1)
    assert gate(tmp_path, data, runtime, str(image)) == f"{ANSWER} n1 open {image} {image} {uid} 644"
    line = gate(tmp_path, data, runtime, str(base / "none.sqsh"))
    assert line == f"{ANSWER} n1 failed the image {base / 'none.sqsh'} is not a file on this node", line


def test_verdicts_read() -> None:
    ok = f"{ANSWER} a ok\n{ANSWER} b ok removed /d/pyxis_x\nnoise\n"
    assert judge(ok, ["a", "b"]) == ["b: removed /d/pyxis_x"]
    with pytest.raises(ContainerGateError, match="c did not answer"):
        judge(ok, ["a", "b", "c"])
    with pytest.raises(ContainerGateError, match="on a, the check could not run: enroot is not on the PATH"):
        judge(f"{ANSWER} a missing enroot is not on the PATH of a step", ["a"])
    with pytest.raises(ContainerGateError, match="a answered the check with 'twice'"):
        judge(f"{ANSWER} a ok\n{ANSWER} a open /d /d 1 777\n", ["a"])
    with pytest.raises(ContainerGateError, match="a answered the check with 'open garbled'"):
        judge(f"{ANSWER} a open garbled", ["a"])
    assert image_file("/img/x.sqsh") == "/img/x.sqsh" and image_file(".x.sqsh") == ".x.sqsh"
    assert image_file("nvcr.io#nvidia/pytorch:24.05-py3") == image_file("docker://ubuntu") == ""


#: srun in a worker job's script: the gate's step prints the answers it is given, the
#: node's step records that it ran (and how)
FAKE_SRUN = """#!/bin/bash
case "$*" in
*--job-name=eray.c.container-gate*) printf '%s' "$ANSWERS"; exit "${GATE_EXIT:-0}" ;;
*) echo "STEP $*" >> "$RAN" ;;
esac
"""


@pytest.mark.parametrize(
    ("answers", "runs"),
    [
        (f"{ANSWER} n1 ok\n{ANSWER} n2 ok removed /d/pyxis_7.1\n", True),
        (f"{ANSWER} n1 ok\n{ANSWER} n2 open /d /d 1001 755\n", False),  # one node refused
        (f"{ANSWER} n1 ok\n", False),  # a node did not answer
        (f"{ANSWER} n1 ok\n{ANSWER} n1 ok\n", False),  # one node answered for two
        (f"{ANSWER} n1 ok\n{ANSWER} n2 ok\n{ANSWER} n3 ok\n", False),  # more answers than nodes
        (f"{ANSWER} n1 ok\n{ANSWER} n2 okay\n", False),  # garbled
    ],
)
def test_a_worker_job_enters_its_container_only_when_every_node_answered_ok(
    tmp_path, answers: str, runs: bool
) -> None:
    """The script of an elastic worker job in a cluster with a container: the gate's step
    over the job's nodes first, then the node step in the image, or nothing."""
    from eray_provider.plan.container import ContainerConfig, plan_container
    from eray_provider.runtime.slurm_jobs import batch_script

    plan = plan_container(
        ContainerConfig(image="/img/i.sqsh"), "c", "7", "/s/c-7", "/tmp", "/src", ("2.60.0", "3.11")
    )
    script = tmp_path / "job.sh"
    script.write_text(batch_script("python3", plan, "c", "/img/i.sqsh"))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "srun").write_text(FAKE_SRUN)
    (bindir / "srun").chmod(0o755)
    ran = tmp_path / "ran"
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", ANSWERS=answers, RAN=str(ran))
    env.update(SLURM_JOB_ID="8", SLURM_JOB_NUM_NODES="2")
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    if runs:
        assert proc.returncode == 0, proc.stderr
        (step,) = ran.read_text().splitlines()
        assert step.endswith(" python3 -m eray_provider.runtime.node_run"), step
        assert "--container-image=/img/i.sqsh" in step and "--container-name" not in step, step
    else:
        assert proc.returncode == 1 and not ran.exists()
        assert "the container check refused the nodes of job 8" in proc.stderr, proc.stderr
        assert answers.strip() in proc.stderr
    # a gate step that failed is a refusal too, whatever it printed
    env["GATE_EXIT"] = "1"
    ran.unlink(missing_ok=True)
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1 and not ran.exists() and "(exit 1," in proc.stderr
