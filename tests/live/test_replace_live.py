"""Elastic workers replaced before their SLURM jobs end, on the real test bed.

A worker type with ``min_workers: 2`` and jobs of a short time limit runs a load: the
provider submits each worker job's replacement ahead of its end (staggered), the
autoscaler sees one node of each pair, the old node is drained once its replacement has
joined, and the number of alive workers never drops below 2. ``squeue``, sampled every
second beside it, shows each replacement running while the job it replaces still runs.

``test_replacement_soak`` is the long version (``make soak``: 3-minute jobs under load for
10 minutes); ``make test`` runs the short one (2-minute jobs, about 2 minutes)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_elastic_live import ElasticCluster
from testbed_support import REPO, Testbed

from eray_provider.runtime.cluster_state import ClusterState

pytestmark = [pytest.mark.slurm, pytest.mark.ray]


class SqueueHistory(threading.Thread):
    """The cluster's worker jobs as squeue shows them, sampled every second: job ->
    {first, last} (epoch seconds it was seen RUNNING), its EndTime, ``running``: each span
    [first, last] it was seen RUNNING (a requeued job has several), and ``states``: each
    state it was seen in, with when, in order."""

    def __init__(self, testbed: Testbed, prefix: str) -> None:
        super().__init__(daemon=True)
        self.testbed, self.prefix = testbed, prefix
        self.jobs: dict[str, dict] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            out = self.testbed.run(["squeue", "-h", "-o", "%i|%T|%e|%j"], check=False).stdout
            now = time.time()
            for line in out.splitlines():
                job, state, end, name = line.split("|", 3)
                if not name.startswith(self.prefix) or name.endswith(".head"):
                    continue
                rec = self.jobs.setdefault(job, {"states": [], "running": []})
                if not rec["states"] or rec["states"][-1][0] != state:
                    rec["states"].append((state, now))
                    if state == "RUNNING":
                        rec["running"].append([now, now])
                if state == "RUNNING":
                    rec.setdefault("first", now)
                    rec["running"][-1][1] = now
                    rec.update(last=now, end=end)


class AutoscalerLog:
    """What the head's autoscaler (v2) says of its worker instances in monitor.log."""

    def __init__(self, monitor: str) -> None:
        #: the worker nodes it launched itself (one line per instance it queued)
        self.launched = re.findall(r"queuing new instance of cpu from scheduler", monitor)
        #: the nodes it learnt of from the provider's listing: a replacement, shown in its
        #: old node's place, appears this way (the old one's instance TERMINATED, the same round)
        self.adopted = re.findall(r"allocated unmanaged cloud instance :(j\d+-\d+)", monitor)
        #: worker Ray nodes that joined before the provider listed them (v2 stops such a
        #: node of a type at its count): none should, as a replacement starts Ray once shown.
        #: The head is one, always: it has registered when its autoscaler starts
        #: (``ray_compat.monitor_after_registration``), and v2 takes its instance from it.
        ahead = "allocated unmanaged worker cloud instance from ray node"
        self.from_ray = [line for line in monitor.splitlines() if ahead in line and "type=head," not in line]
        heads = [line for line in monitor.splitlines() if ahead in line and "type=head," in line]
        assert len(heads) <= 1, heads


def run_replacement(
    testbed: Testbed,
    tmp_path: Path,
    name: str,
    limit: str,
    seconds: float,
    provider: dict,
    workers: int = 2,
    task_seconds: float = 3,
    during=None,
    sbatch: dict | None = None,
    wait_for: str = "JOINED",
    most: int | None = None,
    done: Callable[[list[str], Any, dict], bool] | None = None,
):
    """Bring up an elastic cluster whose ``cpu`` type has exactly ``workers`` workers of
    1 CPU and time limit ``limit``; run ``replace_watch`` on it for at most ``seconds``;
    call ``during(cluster)`` once the driver printed ``wait_for`` (the workers joined).
    ``done(lines, happened, jobs)``: whether the driver's output so far, what ``during``
    returned and the squeue history so far show what the test waits for; the driver then
    samples a few seconds more and ends, rather than running out ``seconds``. ``most``: the
    type's ``max_workers`` when it is not ``workers``.
    Returns (the driver's summary, the squeue history, the state's node records, the
    state dir's markers, the head's monitor.log, the driver's output, what ``during``
    returned)."""
    cluster = ElasticCluster(testbed, tmp_path, name, idle_timeout_minutes=1, provider=provider)
    config = yaml.safe_load(cluster.config.read_text())
    config["available_node_types"]["cpu"].update(min_workers=workers, max_workers=most or workers)
    request = {"cpus_per_node": 1, "mem": "600M", "time": limit, **(sbatch or {}).get("cpu", {})}
    config["available_node_types"]["cpu"]["node_config"]["sbatch"] = request
    config["available_node_types"]["head"]["node_config"]["sbatch"].update((sbatch or {}).get("head", {}))
    cluster.config.write_text(yaml.safe_dump(config))
    history = SqueueHistory(testbed, f"eray.{name}.")
    driver = None
    stop = REPO / ".test-output" / f"{name}-{os.getpid()}.stop"  # the nodes see REPO
    stop.parent.mkdir(exist_ok=True)
    stop.unlink(missing_ok=True)
    try:
        cluster.up()
        (head_job,) = [j for j, n in cluster.jobs().items() if n.endswith(".head")]
        history.start()
        argv = ["ray", "submit", str(cluster.config), "tests/drivers/replace_watch.py", "--", str(seconds)]
        driver = subprocess.Popen(
            [*argv, str(workers), str(task_seconds), str(stop)],
            env=cluster.env,
            cwd=str(REPO),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        lines: list[str] = []
        reader = threading.Thread(target=read_lines, args=(driver, lines), daemon=True)
        reader.start()
        deadline = time.monotonic() + 300
        while not any(wait_for in line for line in lines):
            assert driver.poll() is None and time.monotonic() < deadline, "".join(lines[-60:])
            time.sleep(0.2)
        happened = during(cluster) if during else None
        deadline = time.monotonic() + seconds + 300
        while driver.poll() is None:
            assert time.monotonic() < deadline, "".join(lines[-60:])
            if done is not None and not stop.exists() and done(list(lines), happened, dict(history.jobs)):
                stop.touch()
            time.sleep(0.5)
        reader.join(timeout=30)
        out = "".join(lines)
        summary = next((line for line in out.splitlines() if line.startswith("SUMMARY ")), None)
        assert driver.returncode == 0 and summary, out[-4000:]
        state_dir = Path.home() / ".eray-provider" / f"{name}-{head_job}"
        records = json.loads((state_dir / "state.json").read_text())["nodes"]
        state = ClusterState(name, head_job, state_dir.parent)
        names = [n for n in state.markers() if n.startswith("j")]
        markers = {n: state.marker(*n.rsplit(".", 1)).read_text() for n in names}
        markers.update({f"log:{p.name}": p.read_text() for p in state.logs.iterdir() if p.is_file()})
        head_node = testbed.run(["squeue", "-h", "-j", head_job, "-o", "%N"]).stdout.strip()
        monitor = testbed.on_node(
            head_node, f"cat /tmp/eray-{head_job}-*/ray/session_latest/logs/monitor.log"
        ).stdout
    finally:
        history.stop.set()
        stop.unlink(missing_ok=True)
        if driver is not None and driver.poll() is None:
            driver.kill()
        cluster.down(check=False)
    assert cluster.wait_jobs(lambda j: not j, timeout=120, what="no job of the cluster") == {}
    summary = json.loads(summary[len("SUMMARY ") :])
    # the autoscaler's log, read from the head's node: it speaks of the worker instances
    assert re.search(r"\bj\d+-0\b", monitor), monitor[-3000:]
    # what a failure needs to be understood, beside the test's own files
    (tmp_path / "monitor.log").write_text(monitor)
    (tmp_path / "records.json").write_text(json.dumps(records, indent=1))
    (tmp_path / "driver.out").write_text(out)
    for key, text in markers.items():
        if key.startswith("log:"):
            (tmp_path / key[len("log:") :]).write_text(text)
    return summary, history.jobs, records, markers, monitor, out, happened


def read_lines(proc: subprocess.Popen, lines: list[str]) -> None:
    """Append ``proc``'s output lines to ``lines`` as they come (a thread's target)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)


def samples(lines: list[str]) -> list[list[str]]:
    """The alive worker jobs of each ``SAMPLE`` line of the driver, in order."""
    parts = [line.split() for line in lines if line.startswith("SAMPLE ")]
    return [part[2].split(",") if len(part) > 2 and part[2] != "-" else [] for part in parts]


def ran_on(lines: list[str]) -> set[str]:
    """The jobs a task of the driver ended on so far."""
    return {line.split()[1] for line in lines if line.startswith("RAN ") and len(line.split()) > 1}


def left_running(jobs: dict, job: str) -> bool:
    """Whether the squeue history shows ``job`` no longer in its first run."""
    rec = jobs.get(job)
    if rec is None or not rec["running"]:
        return False
    return len(rec["running"]) > 1 or rec["states"][-1][0] != "RUNNING" or time.time() - rec["last"] > 3


def replaced_first_pair(lines: list[str], _happened, _jobs) -> bool:
    """``done`` of the replacement test: both workers of the first pair left Ray, and a
    task ended on another worker."""
    seen = samples(lines)
    first = set(seen[0]) if seen else set()
    return bool(first) and not first & set(seen[-1]) and bool(ran_on(lines) - first)


def check_replacements(summary, jobs, records, markers, monitor, out, _happened, generations: int) -> None:
    samples = "\n".join(line for line in out.splitlines() if line.startswith("SAMPLE"))
    # never fewer than 2 alive workers once the first two had joined
    assert summary["fewest"] >= 2, samples
    worker_jobs = {rec["slurm_job"] for rec in records.values() if rec.get("slurm_job")}
    replacing = {
        rec["slurm_job"]: rec["replaces"].split("-")[0][1:] for rec in records.values() if rec.get("replaces")
    }
    first = worker_jobs - set(replacing)
    # the autoscaler launched the first two; every other job is a replacement
    assert len(first) == 2, records
    assert len(replacing) >= generations * 2 - 2, (replacing, samples)
    seen = summary["seen"]
    for new, old in replacing.items():
        if "first" in jobs.get(new, {}) and "last" in jobs.get(old, {}):
            # squeue showed the replacement running while the job it replaces still ran
            assert jobs[new]["first"] < jobs[old]["last"], (new, old, jobs)
        if old in seen and seen[old][1] < summary["seconds"] - 2:
            # the old node left Ray during the observation: drained once its replacement
            # was shown (handover) and had joined
            drain = json.loads(markers[f"j{old}-0.drain"])
            assert drain["message"].startswith(f"replaced by j{new}-0"), drain
            assert f"j{new}-0.handover" in markers and seen[new][0] <= seen[old][1], (new, old, seen)
    for old in first:
        # no job of the first pair ran out its time: each was replaced, and left Ray early
        assert old in replacing.values(), (old, replacing)
        assert seen[old][1] < summary["seconds"] - 2, (old, seen)
    # staggered: the two replacements of the first pair end apart
    a, b = (jobs[new]["end"] for new, old in replacing.items() if old in first and "end" in jobs.get(new, {}))
    ends = [time.mktime(time.strptime(e, "%Y-%m-%dT%H:%M:%S")) for e in (a, b)]
    assert abs(ends[0] - ends[1]) >= 10, (a, b)
    # tasks ran on the replacements; the autoscaler launched the first two workers only, and
    # learnt of no node but the replacements, each shown in its old node's place
    assert any(summary["ran"].get(new, 0) for new in replacing), summary
    log = AutoscalerLog(monitor)
    assert len(log.launched) == 2 and not log.from_ray, (log.launched, log.from_ray)
    assert set(log.adopted) <= {f"j{new}-0" for new in replacing}, (log.adopted, replacing)


def test_workers_are_replaced_before_their_jobs_end(testbed, tmp_path) -> None:
    provider = {"replace_before_end_s": 60, "end_stagger_s": 20, "drain_before_end_s": 10}
    result = run_replacement(testbed, tmp_path, "elrepl", "2:00", 110, provider, done=replaced_first_pair)
    check_replacements(*result, generations=2)


@pytest.mark.soak
def test_replacement_soak(testbed, tmp_path) -> None:
    """3-minute worker jobs under load for 10 minutes, with the default leads."""
    result = run_replacement(testbed, tmp_path, "elsoak", "3:00", 600, {})
    check_replacements(*result, generations=4)


class Preemption:
    """Preempts the cluster's one ``cpu`` worker job: a job of partition ``urgent`` (higher
    priority tier) takes its node; SLURM signals the worker's job and ends it (CANCEL) or
    requeues it (REQUEUE) a grace time later. ``during`` for ``run_replacement``."""

    def __init__(self, testbed: Testbed, hold_seconds: int = 300) -> None:
        self.testbed, self.hold_seconds = testbed, hold_seconds
        part = testbed.run(["scontrol", "show", "partition", "debug"]).stdout
        self.grace = int(re.search(r"GraceTime=(\d+)", part).group(1))
        assert self.grace > 0, part
        config = testbed.run(["scontrol", "show", "config"]).stdout
        #: after the grace time SLURM sends SIGTERM, and SIGKILL this much later
        self.kill_wait = int(re.search(r"KillWait\s*=\s*(\d+)", config).group(1))
        self.urgent: list[str] = []

    def __call__(self, cluster) -> dict:
        """Preempt; then wait (at most the grace time) for the node's drain marker: a job
        that runs again removes it."""
        jobs = cluster.jobs()
        (job,) = [j for j, n in jobs.items() if n.endswith(".cpu")]
        (head_job,) = [j for j, n in jobs.items() if n.endswith(".head")]
        node = self.testbed.run(["squeue", "-h", "-j", job, "-o", "%N"]).stdout.strip()
        at = time.time()
        argv = ["sbatch", "--parsable", "-p", "urgent", "--exclusive", "-w", node, "-o", "/dev/null"]
        argv += ["-J", "eray-test-urgent", "--wrap", f"sleep {self.hold_seconds}"]
        self.urgent.append(self.testbed.run(argv).stdout.strip())
        state = ClusterState(cluster.name, head_job, Path.home() / ".eray-provider")
        marker = state.marker(f"j{job}-0", "drain")
        while time.time() < at + self.grace and not marker.exists():
            time.sleep(0.2)
        drain = json.loads(marker.read_text()) if marker.exists() else None
        return {"job": job, "node": node, "at": at, "drain": drain}

    def release(self) -> None:
        for job in self.urgent:
            self.testbed.cancel(job)

    def check_drained(self, markers: dict[str, str], jobs: dict, happened: dict) -> None:
        """SLURM signalled the job (node_run says so in the job's log) and the node was
        drained within the grace time (by itself at the signal, or by the head's watcher,
        which saw the end move: whichever came first), its deadline the job's new end; the
        preempted job stopped running within its grace (and a bit)."""
        old, at, drain = happened["job"], happened["at"], happened["drain"]
        assert f"j{old}-0: SLURM signalled its job's end" in markers[f"log:job-{old}.log"], markers.keys()
        assert drain is not None, f"j{old}-0 was not drained within the grace time"
        by = (f"SLURM signalled the end of job {old}", f"SLURM job {old} ends")
        assert drain["message"].startswith(by), drain
        assert drain["at"] - at < self.grace, (drain, at)
        assert abs(drain["deadline"] - (at + self.grace)) < 10, (drain, at)
        # SLURM's own bound (grace, then SIGTERM, SIGKILL a KillWait later), plus squeue's
        # sampling and a loaded controller's lag
        ended = jobs[old]["running"][0][1] - at
        assert ended < self.grace + self.kill_wait + 15, (jobs[old], at, self.kill_wait)


def preempted_and_replaced(lines: list[str], happened: dict, jobs: dict) -> bool:
    """``done`` of the preemption test: the preempted job stopped running and left Ray, and
    a task ended on another worker."""
    old = happened["job"]
    seen = samples(lines)
    return bool(seen) and old not in seen[-1] and left_running(jobs, old) and bool(ran_on(lines) - {old})


def requeued_and_back(lines: list[str], happened: dict, jobs: dict) -> bool:
    """``done`` of the requeue test: the preempted job left Ray, and is back in it running
    again."""
    old = happened["job"]
    present = [old in alive for alive in samples(lines)]
    gone = present.index(False) if False in present else len(present)
    return True in present[gone:] and len(jobs.get(old, {}).get("running", [])) > 1


#: the cluster of the preemption tests: the head on node1, its one worker elsewhere
PREEMPT_SBATCH = {"head": {"extra": ["--nodelist=node1"]}, "cpu": {"extra": ["--exclude=node1"]}}


def test_a_preempted_worker_is_drained_and_replaced_within_grace(testbed, tmp_path) -> None:
    """A job of partition ``urgent`` takes the worker's node: SLURM sends the worker's job
    SIGURG (``--signal=URG@...``, ``preempt_send_user_signal``) and moves its end to now
    plus the grace time; the node is drained at once (by itself at the signal, or by the
    head's watcher), and Ray's autoscaler, seeing it drain, replaces it on another node
    while it still finishes its task."""
    preempt = Preemption(testbed)
    try:
        result = run_replacement(
            *(testbed, tmp_path, "elpre", "30:00", 100, {}, 1, 25, preempt, PREEMPT_SBATCH),
            wait_for="TASK STARTED",
            done=preempted_and_replaced,
        )
    finally:
        preempt.release()
    summary, jobs, records, markers, monitor, _out, happened = result
    old, at = happened["job"], happened["at"]
    preempt.check_drained(markers, jobs, happened)
    # replaced: another worker job joined after the preemption and ran tasks, while the
    # drained node still ran its 25-s task. Ray's autoscaler replaces a draining node
    # itself, so the provider submits no replacement of its own for it (that would be a
    # node too many, which the autoscaler would cancel)
    seen, since = summary["seen"], at - summary["start"]
    after = [job for job, (first, _last) in seen.items() if job != old and first > since]
    assert after and any(summary["ran"].get(job, 0) for job in after), summary
    assert min(seen[job][0] for job in after) <= seen[old][1], seen  # joined before the old one left
    assert not [r for r in records.values() if r.get("replaces") == f"j{old}-0"], (records, happened, summary)
    log = AutoscalerLog(monitor)  # the first worker, and the autoscaler's own replacement of it
    assert len(log.launched) == 2 and not log.adopted and not log.from_ray, vars(log)


def test_a_requeued_worker_comes_back_as_the_same_kind_of_node(testbed, tmp_path) -> None:
    """As above, but the worker's job is of partition ``requeue`` (PreemptMode=REQUEUE):
    drained within the grace time and replaced by the autoscaler as before, then SLURM
    requeues the job (it pends, reason ``BeginTime``) rather than ending it. It is not
    cancelled as the node Ray lost: when it runs again, it comes back as a ``cpu`` node
    (the same node id, tags and labels), the autoscaler learns of it from the provider's
    listing and keeps it (``max_workers: 2``), its Ray labelled as it was."""
    preempt = Preemption(testbed, hold_seconds=40)
    sbatch = {**PREEMPT_SBATCH, "cpu": {**PREEMPT_SBATCH["cpu"], "partition": "requeue"}}
    try:
        result = run_replacement(
            *(testbed, tmp_path, "elrq", "30:00", 200, {}, 1, 5, preempt, sbatch),
            wait_for="TASK STARTED",
            most=2,
            done=requeued_and_back,
        )
    finally:
        preempt.release()
    _summary, jobs, records, markers, monitor, out, happened = result
    old = happened["job"]
    preempt.check_drained(markers, jobs, happened)
    # requeued (by the provider, once its drained Ray had ended: SLURM requeues only a job
    # it ends itself, and would only at the end of the grace time): it left RUNNING within
    # the grace time, pended, and ran again
    states = [state for state, _t in jobs[old]["states"]]
    assert "PENDING" in states[states.index("RUNNING") :] and len(jobs[old]["running"]) >= 2, jobs[old]
    # gone from Ray meanwhile (the autoscaler replaced it at its drain), then back
    samples = [line.split() for line in out.splitlines() if line.startswith("SAMPLE ")]
    present = [old in sample[2].split(",") for sample in samples if len(sample) > 2]
    gone = present.index(False) if False in present else len(present)
    assert True in present[gone:], samples
    # the provider kept it (did not cancel it) and showed it again as the node of type cpu
    # it was (its record's tags), which the autoscaler adopted before its Ray joined;
    # never more than max_workers alive
    log = AutoscalerLog(monitor)
    assert f"job {old} is requeued (preempted)" in monitor, monitor[-3000:]
    assert log.adopted == [f"j{old}-0"] and not log.from_ray, vars(log)
    assert records[f"j{old}-0"]["tags"]["ray-user-node-type"] == "cpu", records
    assert max(len(sample[2].split(",")) for sample in samples if len(sample) > 2) <= 2, samples


def block_free_cpus(testbed: Testbed) -> list[str]:
    """Jobs that take every CPU left on the test bed's nodes, so that the next job pends
    (reason ``Resources``); their ids."""
    out = testbed.run(["scontrol", "-o", "show", "node"]).stdout
    blockers = []
    for line in out.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        free = int(fields["CPUTot"]) - int(fields["CPUAlloc"])
        if free > 0:
            argv = ["sbatch", "--parsable", "-w", fields["NodeName"], "-n1", f"-c{free}", "--mem=50M"]
            argv += ["-o", "/dev/null", "-J", "eray-test-block", "--wrap", "sleep 600"]
            blockers.append(testbed.run(argv).stdout.strip())
    return blockers


def test_a_worker_drained_first_gives_way_to_its_pending_replacement(testbed, tmp_path) -> None:
    """The replacement of a worker's job is submitted (60 s before its end: both leads are
    capped at half the job's 2-minute limit) but cannot start (every CPU is taken), so the
    worker drains first (30 s before: half its drain lead).
    The provider then shows the pending replacement in the drained node's place: Ray's
    autoscaler, which replaces a draining node it sees, launches nothing more, and one
    node's capacity is asked of SLURM once. Once the CPUs are free, the replacement runs,
    takes over at once (it was handed over while pending) and runs tasks."""
    blockers: list[str] = []

    def starve(cluster) -> dict:
        (old,) = [j for j, n in cluster.jobs().items() if n.endswith(".cpu")]
        end_text = testbed.run(["squeue", "-h", "-j", old, "-o", "%e"]).stdout.strip()
        end = time.mktime(time.strptime(end_text, "%Y-%m-%dT%H:%M:%S"))
        time.sleep(max(0.0, end - 75 - time.time()))
        blockers.extend(block_free_cpus(testbed))
        state = None
        deadline = end - 25
        new = None
        while time.time() < deadline:  # the replacement is submitted, and pends
            workers = [j for j, n in cluster.jobs().items() if n.endswith(".cpu") and j != old]
            if workers:
                new = workers[0]
                state = testbed.run(["squeue", "-h", "-j", new, "-o", "%T %r"]).stdout.strip()
                break
            time.sleep(1)
        assert new and state and state.startswith("PENDING"), (new, state)
        time.sleep(max(0.0, end - 30 + 22 - time.time()))  # drained at end - 30, 22 s to react
        during_drain = sorted(j for j, n in cluster.jobs().items() if n.endswith(".cpu"))
        for job in blockers:
            testbed.cancel(job)
        return {"old": old, "new": new, "pending": state, "jobs": during_drain, "freed": time.time()}

    provider = {"replace_before_end_s": 90, "drain_before_end_s": 100, "end_stagger_s": 0}
    try:
        result = run_replacement(
            *(testbed, tmp_path, "eldrain", "2:00", 200, provider, 1, 3, starve),
            done=lambda lines, happened, _jobs: happened["new"] in ran_on(lines),
        )
    finally:
        for job in blockers:
            testbed.cancel(job)
    summary, jobs, records, markers, monitor, _out, happened = result
    old, new = happened["old"], happened["new"]
    # the old node drained by its end (the replacement could not start), not by a handover
    # (by the head's watcher, or at SLURM's --signal of the same lead: whichever came first)
    drain = json.loads(markers[f"j{old}-0.drain"])
    by = (f"SLURM job {old} ends", f"SLURM signalled the end of job {old}")
    assert drain["message"].startswith(by), drain
    # while it drained, the pending replacement stood in its place: no other job was asked for
    assert happened["jobs"] == sorted([old, new]), happened
    assert {rec["slurm_job"] for rec in records.values() if rec.get("slurm_job")} == {old, new}, records
    assert records[f"j{new}-0"]["replaces"] == f"j{old}-0"
    # handed over while still pending (shown in the drained node's place), then ran tasks
    assert float(markers[f"j{new}-0.handover"]) < jobs[new]["first"], (markers, jobs)
    assert summary["ran"].get(new, 0) > 0, summary
    log = AutoscalerLog(monitor)  # it launched the first worker only
    assert len(log.launched) == 1 and log.adopted == [f"j{new}-0"] and not log.from_ray, vars(log)
