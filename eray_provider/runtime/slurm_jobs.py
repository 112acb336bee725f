"""Submitting, listing, cancelling and requeueing the cluster's own SLURM jobs (sbatch,
squeue, scancel, scontrol requeue).

The elastic provider's only way to get and give back nodes. Each call is one SLURM
command with a timeout; ``list_jobs`` is one ``squeue`` for all of the user's jobs, so
the autoscaler's per-round cost does not grow with the number of nodes.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..plan.container import ContainerPlan
from ..plan.modules import NODE_RUN
from ..plan.names import is_cluster_job
from ..plan.sbatch import SbatchRequest
from ..slurm.client import SlurmAnswerError, SlurmCommandError, SlurmFailedError, run_sbatch, run_slurm
from ..slurm.squeue import SQUEUE_FORMAT, JobInfo, parse_squeue
from ..slurm.walltime import END_SIGNAL
from .container_gate import job_gate


def squeue_user() -> str:
    """Whose jobs we list (``squeue -u``): this process's uid, which squeue takes as well
    as a name. Not ``$USER``/``$LOGNAME`` (``getpass``): a wrong one (``sudo -E``, a
    container) would list another user's jobs, and ours would look ended."""
    return str(os.getuid())


def batch_script(
    python: str, container: ContainerPlan | None = None, cluster: str = "", image: str = ""
) -> str:
    """The job's script: one long-lived step, one ``node_run`` per node (the Ray node).

    ``--overlap`` is not needed (the batch step holds no CPUs of the tasks); the step
    ends when Ray ends on every node, and so does the job. In a cluster with a container
    (``container``, of ``image``) the gate runs first on every node of the job
    (``container_gate.job_gate``), then the step runs in a container of its own, which
    pyxis removes when the step ends, also when the job is cancelled.
    """
    step = "srun --ntasks-per-node=1 --cpu-bind=none --kill-on-bad-exit=0 --quiet"
    node = f"{shlex.quote(python)} -m {NODE_RUN}"
    if container is None:
        return f"#!/bin/bash\nexec {step} {node}\n"
    args = " ".join(map(shlex.quote, container.job_args))
    return f"#!/bin/bash\n{job_gate(cluster, image)}exec {step} {args} {node}\n"


#: The most seconds before its end that sbatch ``--signal`` takes.
MAX_SIGNAL_LEAD = 65535


def sbatch_argv(
    request: SbatchRequest, name: str, log: Path, test_only: bool = False, warn_s: float = 0
) -> list[str]:
    """The sbatch line of one job. ``warn_s`` > 0: SLURM sends ``walltime.END_SIGNAL`` to its
    steps that long before its end, and at once when it is preempted (where the site sets
    ``preempt_send_user_signal``), unless the request's ``extra`` sets ``--signal`` itself."""
    # --export=ALL: the job gets exactly the environment we submit with (clean_env), whatever
    # the site's or the user's SBATCH_EXPORT says
    argv = ["sbatch", "--parsable", f"--job-name={name}", f"--output={log}", "--open-mode=append"]
    argv.append("--export=ALL")
    if warn_s > 0 and not any(e.startswith("--signal") for e in request.extra):
        argv.append(f"--signal={END_SIGNAL}@{min(MAX_SIGNAL_LEAD, max(1, round(warn_s)))}")
    if test_only:
        argv.append("--test-only")
    return [*argv, *request.argv()]


def submit(
    request: SbatchRequest,
    name: str,
    script: str,
    log: Path,
    env: Mapping[str, str],
    timeout: float = 60,
    warn_s: float = 0,
) -> str:
    """Submit one job; returns its id. ``SlurmCommandError`` quotes SLURM's refusal."""
    try:
        out = run_sbatch(sbatch_argv(request, name, log, warn_s=warn_s), script, env, timeout)
    except SlurmCommandError as e:
        raise SlurmCommandError(f"job {name}: {e}") from e
    job_id = out.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmCommandError(f"sbatch printed no job id for {name}: {out!r}")
    return job_id


def check_request(request: SbatchRequest, where: str, env: Mapping[str, str]) -> None:
    """``sbatch --test-only``: SLURM's verdict on the request without submitting anything
    (unknown partition, account or QOS, more nodes or CPUs than exist)."""
    argv = sbatch_argv(request, "eray-check", Path("/dev/null"), test_only=True)
    try:
        run_sbatch(argv, "#!/bin/bash\ntrue\n", env)
    except SlurmFailedError as e:  # SLURM's verdict on the request
        detail = e.detail.replace("sbatch: error: ", "")
        raise SlurmCommandError(
            f"{where}: SLURM refuses this request ({' '.join(request.argv())}): {detail}"
        ) from e
    except SlurmCommandError as e:  # no verdict: sbatch could not be run or did not answer
        raise SlurmCommandError(f"{where}: sbatch --test-only failed: {e}") from e


def user_jobs(ended_too: bool = False, timeout: float | None = None) -> dict[str, JobInfo]:
    """All of the user's jobs squeue lists (one call); with ``ended_too`` the ended ones it
    still remembers as well. ``SlurmCommandError`` when squeue fails: no verdict on a job."""
    states = ["-t", "all"] if ended_too else []
    out = run_slurm(["squeue", "-h", "-a", *states, "-u", squeue_user(), "-o", SQUEUE_FORMAT], timeout)
    return parse_squeue(out)


def list_jobs(cluster: str) -> dict[str, JobInfo]:
    """The user's jobs of exactly ``cluster`` (its head's job, its worker jobs): one squeue."""
    return {k: v for k, v in user_jobs().items() if is_cluster_job(v.name, cluster)}


def cancel_jobs(job_ids: Sequence[str]) -> None:
    """One scancel for the given jobs; jobs that already ended are not an error, a
    controller that does not answer is (``SlurmCommandError``, after the retries)."""
    if not job_ids:
        return
    try:
        run_slurm(["scancel", *job_ids])
    except SlurmAnswerError:
        pass


#: How long a teardown waits for cancelled worker jobs to end (their nodes collect their Ray
#: logs into the state dir on SIGTERM, before SLURM's KillWait ends them).
JOBS_END_WAIT = 120.0


def wait_jobs_ended(job_ids: Sequence[str], timeout: float = JOBS_END_WAIT) -> list[str]:
    """Wait until squeue lists none of ``job_ids`` as live; returns those still live at the
    timeout. A failed squeue is no verdict: it is asked again until the timeout."""
    left = set(job_ids)
    deadline = time.monotonic() + timeout
    while left:
        try:
            live = {j for j, info in user_jobs().items() if info.live}
            left &= live
        except SlurmCommandError:
            pass
        if not left or time.monotonic() > deadline:
            break
        time.sleep(1)
    return sorted(left)


def requeue_job(job_id: str) -> None:
    """``scontrol requeue``: the job goes back in the queue now (its steps end) and runs
    again later, keeping its id and its place in the queue. Tried once: a second try of a
    requeue that took effect would be refused. ``SlurmCommandError`` with SLURM's words."""
    run_slurm(["scontrol", "requeue", str(job_id)], attempts=1)
