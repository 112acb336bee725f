"""`eray-provider run` in sbatch jobs on the test bed: the cluster for one command."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest
from ray_cluster_support import VENV_BIN, cluster_pids, node_tmp_entries, state_left, wait_gone
from testbed_support import REPO, Testbed

from eray_provider.slurm.walltime import parse_timestamp

pytestmark = [pytest.mark.slurm, pytest.mark.ray]


@pytest.fixture
def outdir(tmp_path) -> Path:
    """Batch output is written on the job's first node: it must be on a shared path, not /tmp."""
    path = REPO / ".test-output" / tmp_path.name
    shutil.rmtree(path, ignore_errors=True)  # pytest reuses names: never read an earlier run's output
    path.mkdir(parents=True)
    return path


def sbatch(testbed: Testbed, out: Path, *driver_args: str, env: dict[str, str] | None = None) -> str:
    """Submit ``examples/sbatch-ray.sh`` with the test driver; ``env`` replaces the test
    bed's environment (the venv's bin is put first on PATH either way)."""
    env = dict(env or testbed.env)
    env["PATH"] = f"{VENV_BIN}:{env['PATH']}"
    env.pop("SLURM_JOB_ID", None)
    proc = testbed.run(
        [
            "sbatch",
            f"--output={out}",
            "--chdir",
            str(REPO),
            "examples/sbatch-ray.sh",
            "tests/drivers/batch_driver.py",
            *driver_args,
        ],
        env=env,
    )
    return re.search(r"Submitted batch job (\d+)", proc.stdout).group(1)


def wait_done(testbed: Testbed, job: str, timeout: float = 400) -> str:
    """Poll SLURM (squeue, then scontrol) until the job ended; returns its ExitCode."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = testbed.run(["scontrol", "show", "job", job], check=False).stdout
        state = re.search(r"JobState=(\S+)", out)
        if state and state.group(1) not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            return re.search(r"ExitCode=(\d+):", out).group(1)
        time.sleep(2)
    testbed.cancel(job)
    raise AssertionError(f"batch job {job} did not end within {timeout} s")


def test_two_batch_jobs_share_nodes_and_exit_codes_pass_through(testbed: Testbed, outdir: Path) -> None:
    out_a, out_b = outdir / "a.out", outdir / "b.out"
    job_a = sbatch(testbed, out_a)
    job_b = sbatch(testbed, out_b, "3")
    code_a, code_b = wait_done(testbed, job_a), wait_done(testbed, job_b)
    text_a, text_b = out_a.read_text(), out_b.read_text()
    assert code_a == "0", text_a[-3000:]
    assert code_b == "3", text_b[-3000:]
    for text in (text_a, text_b):
        assert "TASKS node1 node2 node3" in text, text[-3000:]
        assert "PSUM 6.0 6.0 6.0" in text
        assert "cluster stopped" in text
    for job in (job_a, job_b):
        assert cluster_pids(job, "run") == []
        for node in ("node1", "node2", "node3"):
            assert node_tmp_entries(testbed, node, job) == []
        assert state_left(Path.home() / ".eray-provider" / f"run-{job}") == []


def test_node_that_cannot_join_fails_in_bounded_time(testbed: Testbed, outdir: Path) -> None:
    """Nodes whose Ray cannot start (no interface in the requested network) make the job
    fail with the reason, within a bounded time, instead of hanging."""
    env = dict(testbed.env, PATH=f"{VENV_BIN}:{testbed.env['PATH']}")
    out = outdir / "bad.out"
    script = outdir / "bad.sh"
    script.write_text(
        "#!/bin/bash\nexec eray-provider run --timeout 60 --network 192.0.2.0/24 -- python -c 'print(1)'\n"
    )
    proc = testbed.run(["sbatch", "-N2", "-c1", "--mem=2000", f"--output={out}", str(script)], env=env)
    job = re.search(r"Submitted batch job (\d+)", proc.stdout).group(1)
    code = wait_done(testbed, job, timeout=300)
    assert code != "0"
    # bounded by the join timeout (60 s) and the teardown, on SLURM's clock: from the job's
    # start, not from its submission (a loaded bed may start it late)
    times = dict(
        re.findall(r"(StartTime|EndTime)=(\S+)", testbed.run(["scontrol", "show", "job", job]).stdout)
    )
    ran = parse_timestamp(times["EndTime"]) - parse_timestamp(times["StartTime"])
    assert ran < 150, times
    text = out.read_text()
    assert "192.0.2.0/24" in text and "cluster stopped" in text, text[-3000:]


def test_every_node_form_and_scancel_end_everything(testbed: Testbed, outdir: Path) -> None:
    """``srun --ntasks-per-node=1 eray-provider run -- ...`` (the first node's task runs the
    cluster, the others return), then ``scancel`` of the job while the driver runs: no
    process, node temp dir or state of the cluster is left."""
    env = dict(testbed.env, PATH=f"{VENV_BIN}:{testbed.env['PATH']}")
    out = outdir / "every.out"
    script = outdir / "every.sh"
    driver = "import ray, time; ray.init(); print('NODES', len(ray.nodes()), flush=True); time.sleep(600)"
    script.write_text(
        "#!/bin/bash\n"
        f'exec srun --ntasks-per-node=1 eray-provider run --timeout 120 -- python -c "{driver}"\n'
    )
    proc = testbed.run(
        ["sbatch", "-N3", "-c2", "--mem=2000", f"--output={out}", "--chdir", str(REPO), str(script)], env=env
    )
    job = re.search(r"Submitted batch job (\d+)", proc.stdout).group(1)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and "NODES 3" not in (out.read_text() if out.exists() else ""):
            time.sleep(1)
        text = out.read_text()
        assert "NODES 3" in text, text[-3000:]
        assert text.count("the step's first task runs the cluster") == 2
    finally:
        testbed.cancel(job)  # also when an assertion failed: no job left for the next tests
    wait_done(testbed, job, timeout=120)
    assert wait_gone(job, "run") == []
    for node in ("node1", "node2", "node3"):
        assert node_tmp_entries(testbed, node, job) == []
    assert state_left(Path.home() / ".eray-provider" / f"run-{job}") == [], out.read_text()[-2000:]
