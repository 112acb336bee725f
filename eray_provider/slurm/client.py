"""Calls to SLURM's client commands (scontrol, squeue, scancel, sbatch), each with a timeout.

This is the only module that runs SLURM's client commands (``execute``; long-lived ``srun``
steps are ``srun``'s);
parsing lives in ``scontrol`` and ``slurm.env``. Every call has a timeout, so a hung
slurmctld gives an error instead of a hang. Reads and scancel may run twice and are
retried (``run_slurm``); a submission may not (``run_sbatch``).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

from ..errors import ClusterError, ConfigError
from .allocation import Allocation, AllocationError, JobGoneError
from .env import allocation_from_env, job_id_from_env
from .forms import ANSWERS
from .host_commands import relay_dir, relayed
from .scontrol import (
    ENDS,
    being_preempted,
    parse_config,
    parse_fields,
    parse_job,
    parse_port_range,
    requeue_verdict,
)

logger = logging.getLogger(__name__)

#: Seconds to wait for one SLURM client command; slurmctld answers in milliseconds when
#: healthy. A site with a slow controller raises it with ``ERAY_SLURM_TIMEOUT``.
DEFAULT_TIMEOUT = 30.0
#: Tries of a read (or an idempotent scancel) before a failure is raised; a controller
#: under load times out now and then (``Socket timed out on send/recv operation``).
#: ``ERAY_SLURM_ATTEMPTS`` changes it.
DEFAULT_ATTEMPTS = 3
#: Seconds between tries: 1, 2, 4... (doubling).
RETRY_DELAY = 1.0


#: Input variables of SLURM's client commands: a user's or site's ``SQUEUE_STATES`` would
#: hide pending worker jobs from our squeue, ``SCANCEL_STATE`` skip some of our cancels,
#: ``SBATCH_ARRAY_INX`` turn our jobs into arrays. Our calls say everything on the command
#: line and run without them.
INPUT_VARIABLES = ("SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SCANCEL_", "SCONTROL_")


class SlurmCommandError(ClusterError):
    """A SLURM command failed, timed out or is not installed: not a verdict about the job."""


class SlurmFailedError(SlurmCommandError):
    """A SLURM command ran and exited non-zero; ``detail`` is what it printed. From a read,
    not a verdict (the controller may be overloaded); from ``sbatch``, its refusal."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


class SlurmAnswerError(SlurmFailedError):
    """SLURM answered that the job or step does not exist (any more) or has ended
    (one of ``ANSWERS``): the caller may act on it."""

    @property
    def invalid_job(self) -> bool:
        return "Invalid job id" in str(self)


def _env_number(name: str, default: float, kind: type[float] | type[int] = float) -> float:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        number = kind(value)
    except ValueError:
        number = 0
    if number <= 0:
        # a setting, not a failed command: callers that keep going when SLURM fails must
        # not swallow it
        raise ConfigError(f"{name}={value!r} is not a positive {kind.__name__}")
    return number


def slurm_timeout() -> float:
    """Seconds one SLURM command may take (``ERAY_SLURM_TIMEOUT``, default 30)."""
    return _env_number("ERAY_SLURM_TIMEOUT", DEFAULT_TIMEOUT)


def slurm_attempts() -> int:
    """Tries of a SLURM read before its failure is raised (``ERAY_SLURM_ATTEMPTS``, default 3)."""
    return int(_env_number("ERAY_SLURM_ATTEMPTS", DEFAULT_ATTEMPTS, int))


def command_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the client commands' input variables (``INPUT_VARIABLES``)."""
    return {k: v for k, v in env.items() if not k.startswith(INPUT_VARIABLES)}


def execute(
    args: Sequence[str], timeout: float, stdin: str | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run one SLURM client command (or short srun) to its end, output captured, in its own
    session (the terminal's Ctrl-C is the caller's to handle: a teardown that ignores it
    must not lose its scancel to it; a job SLURM accepted is kept). In a container without
    the command, the host runs it (``host_commands``, when the cluster's container names its
    relay). ``FileNotFoundError``/``OSError`` when it cannot be run at all,
    ``subprocess.TimeoutExpired`` past ``timeout``."""
    env = os.environ if env is None else env
    where = relay_dir(os.environ)
    if where is not None and shutil.which(args[0]) is None:
        return relayed(args, timeout, stdin, env, where)
    return subprocess.run(
        list(args),
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        env=dict(env),
        start_new_session=True,
    )


def _run_once(
    args: Sequence[str], timeout: float, script: str | None = None, env: Mapping[str, str] | None = None
) -> str:
    """One call: its stdout, or ``SlurmAnswerError`` / ``SlurmCommandError`` with SLURM's
    words. ``script`` goes to its stdin (sbatch); ``env`` (default: ours) loses the client
    commands' input variables."""
    try:
        proc = execute(args, timeout, script, command_env(os.environ if env is None else env))
    except FileNotFoundError as e:
        raise SlurmCommandError(f"{args[0]} is not installed or not on PATH") from e
    except OSError as e:
        raise SlurmCommandError(f"{args[0]} could not be run: {e}") from e
    except subprocess.TimeoutExpired as e:
        raise SlurmCommandError(f"{' '.join(args)} did not answer within {timeout:.0f} s") from e
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip()
        message = f"{' '.join(args)} failed (exit {proc.returncode}): {detail}"
        if any(answer in detail for answer in ANSWERS):
            raise SlurmAnswerError(message, detail)
        raise SlurmFailedError(message, detail)
    return proc.stdout


def run_sbatch(args: Sequence[str], script: str, env: Mapping[str, str], timeout: float | None = None) -> str:
    """One ``sbatch`` (``args`` from ``sbatch`` on) with ``script`` on its stdin; its stdout.

    Never retried: a try that failed or timed out may still have submitted the job, and a
    second would submit another. ``SlurmCommandError`` quotes SLURM's refusal (an unknown
    partition, a limit) or says that sbatch did not answer within ``timeout``
    (``slurm_timeout()``)."""
    return _run_once(args, slurm_timeout() if timeout is None else timeout, script, env)


def run_slurm(args: Sequence[str], timeout: float | None = None, attempts: int | None = None) -> str:
    """Run a SLURM client command and return its stdout.

    Only for commands that may run twice (reads, scancel): a failure that is not one of
    SLURM's ``ANSWERS`` is retried ``attempts`` times (``slurm_attempts()``), each try
    bounded by ``timeout`` (``slurm_timeout()``), then raised as ``SlurmCommandError``
    with SLURM's words. An answer is raised at once as ``SlurmAnswerError``.
    """
    if shutil.which(args[0]) is None and relay_dir(os.environ) is None:
        raise SlurmCommandError(f"{args[0]} is not installed or not on PATH")
    timeout = slurm_timeout() if timeout is None else timeout
    attempts = slurm_attempts() if attempts is None else attempts
    delay = RETRY_DELAY
    for attempt in range(1, attempts + 1):
        try:
            return _run_once(args, timeout)
        except SlurmAnswerError:
            raise
        except SlurmCommandError as e:
            if attempt == attempts:
                raise SlurmCommandError(f"{e} (tried {attempts} times)") from e
            logger.warning("%s; trying again in %.0f s", e, delay)
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


def scontrol_job(job_id: str, timeout: float | None = None) -> Allocation:
    """The job as scontrol sees it; ``JobGoneError`` when the controller no longer knows it."""
    try:
        text = run_slurm(["scontrol", "show", "job", "-d", str(job_id)], timeout)
    except SlurmAnswerError as e:
        if e.invalid_job:
            raise JobGoneError(f"job {job_id} does not exist (any more): {e}") from e
        raise
    return parse_job(text, str(job_id))


def requeue_state(job_id: str, timeout: float | None = None) -> str:
    """Whether SLURM runs the job again rather than ending it (``scontrol.requeue_verdict``):
    one ``scontrol show job``, and one ``show partition`` for a job being preempted. A job
    the controller no longer knows ``ENDS``; ``SlurmCommandError`` when SLURM does not
    answer (no verdict)."""
    try:
        job = parse_fields(run_slurm(["scontrol", "-o", "show", "job", str(job_id)], timeout))
    except SlurmAnswerError as e:
        if e.invalid_job:
            return ENDS
        raise
    mode = ""
    if being_preempted(job):
        part = run_slurm(["scontrol", "-o", "show", "partition", job.get("Partition", "")], timeout)
        mode = parse_fields(part).get("PreemptMode", "")
    return requeue_verdict(job, mode)


def load_allocation(
    job_id: str | None = None,
    env: Mapping[str, str] | None = None,
    use_scontrol: bool = True,
) -> Allocation:
    """The allocation of ``job_id`` (default: the job of this environment).

    scontrol is asked first, because a step started from outside sees only its own
    nodes in its variables; the environment is the fallback when scontrol is missing or
    cannot reach the controller. With neither a job id nor SLURM variables, raises
    ``AllocationError``.
    """
    env = os.environ if env is None else env
    env_job = job_id_from_env(env)
    job_id = str(job_id) if job_id is not None else env_job
    if job_id is None:
        raise AllocationError("not inside a SLURM allocation (SLURM_JOB_ID is not set) and no job id given")
    scontrol_error: Exception | None = None
    if use_scontrol:
        try:
            alloc = scontrol_job(job_id)
        except SlurmCommandError as e:
            scontrol_error = e
        else:
            return _with_env_details(alloc, env if env_job == job_id else {})
    if env_job != job_id:
        raise AllocationError(
            f"cannot read job {job_id}: {scontrol_error or 'scontrol disabled'}, "
            f"and this environment belongs to job {env_job or '(none)'}"
        )
    return allocation_from_env(env)


def running_allocation(job_id: str | None = None) -> Allocation:
    """``load_allocation`` of a job that runs: ``JobGoneError`` when it holds no nodes
    any more, or SLURM says it is in a state other than running (completing, suspended)."""
    alloc = load_allocation(job_id)
    if alloc.state not in (None, "RUNNING"):
        raise JobGoneError(f"job {alloc.job_id} is {alloc.state}, not RUNNING")
    return alloc


def _with_env_details(alloc: Allocation, env: Mapping[str, str]) -> Allocation:
    """scontrol knows no cluster name and sometimes no GPU type: take them from the env."""
    cluster = env.get("SLURM_CLUSTER_NAME")
    if not env or (cluster is None and all(n.gpu_type or not n.gpus for n in alloc.nodes)):
        return alloc
    try:
        from_env = allocation_from_env(env)
    except AllocationError:
        from_env = None
    nodes = alloc.nodes
    if from_env is not None:
        types = {n.name: n.gpu_type for n in from_env.nodes}
        nodes = tuple(
            n if n.gpu_type or not n.gpus or not types.get(n.name) else replace(n, gpu_type=types[n.name])
            for n in alloc.nodes
        )
    return replace(alloc, nodes=nodes, cluster=cluster)


def srun_port_range() -> tuple[int, int] | None:
    """Slurm's ``SrunPortRange`` when scontrol can read the config, else None."""
    try:
        config = parse_config(run_slurm(["scontrol", "show", "config"], timeout=15))
    except SlurmCommandError:
        return None
    return parse_port_range(config.get("SrunPortRange"))


#: The SLURM cluster's name when neither the environment nor scontrol tells it.
FALLBACK_CLUSTER = "slurm"


def cluster_name(env: Mapping[str, str], use_scontrol: bool = True) -> str:
    """The SLURM cluster's name: ``SLURM_CLUSTER_NAME`` (not set in steps started with
    ``srun --jobid`` from outside the job), else ``ClusterName`` of the config, else
    ``slurm``. ``use_scontrol=False`` reads the environment only: what every task of one
    step computes alike (they share the step's environment), without one ``scontrol`` per
    task, which at scale floods the controller and, when one times out, splits the tasks."""
    if not use_scontrol:
        return env.get("SLURM_CLUSTER_NAME") or FALLBACK_CLUSTER
    return known_cluster_name(env) or FALLBACK_CLUSTER


def known_cluster_name(env: Mapping[str, str]) -> str | None:
    """The SLURM cluster's name as the environment or ``scontrol show config`` gives it;
    None when neither does (what is recorded to tell clusters apart must not be a guess)."""
    if env.get("SLURM_CLUSTER_NAME"):
        return env["SLURM_CLUSTER_NAME"]
    try:
        return parse_config(run_slurm(["scontrol", "show", "config"], timeout=15)).get("ClusterName") or None
    except SlurmCommandError:
        return None
