"""Walltime on the test bed: a fixed allocation's nodes are drained before the job's end
(Ray's drain API, with the end as deadline), a JAX group hears of it, and at the end
nothing is left. The job's end is brought near with ``scontrol update TimeLimit=`` (what
any user may do to a job of theirs), which also shows the watcher follows a moved end."""

from __future__ import annotations

import json
import math
import re
import subprocess
import threading
import time

import pytest
from ray_cluster_support import Cluster, node_tmp_entries, wait_gone
from testbed_support import REPO, Testbed

from eray_provider.slurm.walltime import parse_timestamp

pytestmark = [pytest.mark.slurm, pytest.mark.ray]

#: The drain's lead: long enough that, on a loaded machine, the drained workers' raylets
#: stop and the test sees Ray's view of it before the end
LEAD = 90
#: How far from the moment the limit is cut the job then ends.
END_IN = 150


def job_fields(testbed: Testbed, job: str) -> dict[str, str]:
    out = testbed.run(["scontrol", "show", "job", job]).stdout
    return dict(re.findall(r"(\w+)=(\S+)", out))


class Lines:
    """A process's output lines, read in a thread, waited for with a timeout."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self.proc = proc
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, prefix: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(line.startswith(prefix) for line in self.lines):
            if time.monotonic() > deadline or (self.proc.poll() is not None and not self.thread.is_alive()):
                last = "\n".join(self.lines[-40:])
                raise AssertionError(f"no {prefix!r} line within {timeout} s:\n{last}")
            time.sleep(0.5)

    def marked(self, prefix: str) -> list[str]:
        return [line[len(prefix) + 1 :] for line in self.lines if line.startswith(prefix + " ")]


def test_fixed_allocation_drains_before_its_end_and_leaves_nothing(testbed: Testbed, tmp_path) -> None:
    job = testbed.salloc("-N3", "-c2", "--mem=3000", "-t", "10", "-J", "eray-walltime")
    provider = {"drain_before_end_s": LEAD, "jax_env": {"JAX_PLATFORMS": "cpu"}}
    cluster = Cluster(testbed, job, tmp_path, "walltime", provider=provider)
    driver = None
    try:
        cluster.up()
        nodes = cluster.wait_nodes(3)
        end = parse_timestamp(job_fields(testbed, job)["EndTime"])
        # every node carries its job's end as SLURM said it when the node started
        assert sorted(abs(int(n["labels"]["slurm-end-time"]) - end) <= 1 for n in nodes) == [True] * 3, nodes
        driver = subprocess.Popen(
            ["ray", "submit", str(cluster.config), "tests/drivers/walltime_driver.py", "150"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=cluster.env,
            cwd=str(REPO),
        )
        out = Lines(driver)
        out.wait_for("READY", 180)
        fields = job_fields(testbed, job)
        start = parse_timestamp(fields["StartTime"])
        limit = math.ceil(time.time() + END_IN - start)
        hms = f"{limit // 3600}:{limit // 60 % 60:02d}:{limit % 60:02d}"
        testbed.run(["scontrol", "update", f"JobId={job}", f"TimeLimit={hms}"])
        new_end = parse_timestamp(job_fields(testbed, job)["EndTime"])
        driver.wait(timeout=240)
        out.thread.join(timeout=10)
        text = "\n".join(out.lines)
        head_lines = (cluster.state_dir / "logs" / "node1.1.log").read_text().splitlines()
        head_log = "\n".join(line for line in head_lines if "drain" in line)
        text += "\n--- head's drains:\n" + head_log

        # the driver's callback heard of every worker node (the head is never drained), with
        # the job's new end as deadline
        told = [json.loads(x) for x in out.marked("ONDRAIN")]
        assert sorted(t["node"] for t in told) == ["node2", "node3"], text[-3000:]
        assert all(abs(t["deadline"] - new_end) <= 1 for t in told), (told, new_end)
        # each rank saw a drain of the group through drain_notice()
        ranks = [json.loads(x.split(" ", 1)[1]) for x in out.marked("RANK")]
        assert len(ranks) == 3 and all(abs(r["deadline"] - new_end) <= 1 for r in ranks), text[-3000:]
        # Ray's own view: the two workers are draining, with that deadline
        (draining,) = [json.loads(x) for x in out.marked("DRAINING")]
        assert len(draining) == 2 and all(abs(d - new_end) <= 1 for d in draining.values()), draining
        # drained within the lead (the watcher looks every 10 s), not at the start
        records = [json.loads(p.read_text()) for p in cluster.state_dir.glob("nodes/*.drain")]
        assert len(records) == 2, list(cluster.state_dir.rglob("*"))
        for r in records:
            assert LEAD - 15 <= r["deadline"] - r["at"] <= LEAD + 1, r
            assert f"SLURM job {job} ends at" in r["message"]

        # a drained worker's raylet stops once idle (the group is gone): before the end,
        # only the head is left; its node's process ended then (the exit marker it writes)
        assert len(cluster.wait_nodes(1, timeout=120, at_most=True)) == 1
        exits = [p.with_suffix(".exit") for p in cluster.state_dir.glob("nodes/*.drain")]
        while not all(e.exists() for e in exits) and time.time() < new_end + 60:
            time.sleep(0.5)
        ended = {e.name: e.stat().st_mtime - new_end for e in exits if e.exists()}
        assert len(ended) == 2 and all(t < 0 for t in ended.values()), ended

        # at the end: the job times out, and nothing of the cluster is left on any node
        deadline = new_end + 90
        while job_fields(testbed, job).get("JobState") not in ("TIMEOUT", "CANCELLED", "COMPLETED"):
            assert time.time() < deadline, job_fields(testbed, job)
            time.sleep(2)
        assert job_fields(testbed, job)["JobState"] == "TIMEOUT"
        assert wait_gone(job, "walltime", timeout=60) == []
        for node in ("node1", "node2", "node3"):
            assert node_tmp_entries(testbed, node, job) == []
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()
        cluster.down(check=False)
        testbed.cancel(job)
