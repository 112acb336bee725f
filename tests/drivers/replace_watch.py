"""Run by ``ray submit`` on the replacement test's elastic cluster: keeps a load on the
workers and samples the GCS every half second for at most ``SECONDS`` (argv[1]) once
``WORKERS`` (argv[2]) workers have joined; tasks last ``TASK_SECONDS`` (argv[3]). Once
the file ``STOP`` (argv[4], on a file system the nodes share) exists, it samples
``TAIL_SECONDS`` more and ends: the test writes it when what it waits for has happened.

The load: one task of 1 CPU at a time per worker, each a few seconds long, submitted
again as each ends (a drained node gets no new ones). Prints ``JOINED`` once the first
workers are alive, then ``SAMPLE <t> <alive worker jobs> <draining jobs>`` on each
change, ``RAN <job>`` as each task ends, and a last ``SUMMARY <json>``: the fewest alive
workers seen, every worker job seen with its first and last second alive, how many tasks
ran on each job, and the seconds it sampled."""

from __future__ import annotations

import json
import os
import sys
import time

import ray

from eray_provider.runtime.ray_compat import draining_nodes

SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 150.0
WORKERS = int(sys.argv[2]) if len(sys.argv) > 2 else 2
TASK_SECONDS = float(sys.argv[3]) if len(sys.argv) > 3 else 3.0
STOP = sys.argv[4] if len(sys.argv) > 4 else ""
#: Sampled after STOP appears: the last samples of nodes that just left.
TAIL_SECONDS = 5.0


@ray.remote(num_cpus=1)
def work(seconds: float) -> str:
    job = ray.get_runtime_context().get_node_labels().get("slurm-job", "")
    print("TASK STARTED", job, flush=True)  # forwarded to the driver's output
    time.sleep(seconds)
    return job


def workers(head_job: str) -> tuple[dict[str, str], set[str]]:
    """(alive Ray node id -> SLURM job, of the workers; the jobs of those draining)."""
    alive = {
        n["NodeID"]: n.get("Labels", {}).get("slurm-job", "")
        for n in ray.nodes()
        if n["Alive"] and n.get("Labels", {}).get("slurm-job", "") not in ("", head_job)
    }
    draining = draining_nodes()
    return alive, {job for node, job in alive.items() if node in draining}


def main() -> None:
    ray.init()
    head_job = ray.get_runtime_context().get_node_labels()["slurm-job"]
    deadline = time.monotonic() + 300
    while len(workers(head_job)[0]) < WORKERS:
        if time.monotonic() > deadline:
            print("NOT JOINED", workers(head_job), flush=True)
            sys.exit(1)
        time.sleep(0.5)
    print("JOINED", flush=True)
    start = time.time()
    fewest = WORKERS
    seen: dict[str, list[float]] = {}
    ran: dict[str, int] = {}
    # never on the head: its CPUs would hide a lost worker
    task = work.options(label_selector={"slurm-job": f"!{head_job}"})
    pending = [task.remote(TASK_SECONDS) for _ in range(WORKERS)]
    last = None
    end = start + SECONDS
    while time.time() < end:
        if STOP and end > time.time() + TAIL_SECONDS and os.path.exists(STOP):
            end = time.time() + TAIL_SECONDS
        done, pending = ray.wait(pending, timeout=0.5)
        for ref in done:
            job = ray.get(ref)
            ran[job] = ran.get(job, 0) + 1
            print("RAN", job, flush=True)
            pending.append(task.remote(TASK_SECONDS))
        alive, draining = workers(head_job)
        jobs = sorted(set(alive.values()))
        t = round(time.time() - start, 1)
        fewest = min(fewest, len(alive))
        for job in jobs:
            seen.setdefault(job, [t, t])[1] = t
        if (jobs, draining) != last:
            print("SAMPLE", t, ",".join(jobs), ",".join(sorted(draining)) or "-", flush=True)
            last = (jobs, draining)
    seconds = round(time.time() - start, 1)
    summary = {"fewest": fewest, "seen": seen, "ran": ran, "seconds": seconds, "start": start}
    print("SUMMARY", json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
