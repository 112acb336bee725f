"""srun, squeue and scancel for the cluster's steps: how we reach nodes without ssh.

Every command reaches a node as a step of the user's job: ``srun --jobid=J --overlap
-N1 -n1 -w NODE``. A Ray node lives in a long-lived step of its own (``ray start
--block``), because under proctrack/cgroup a step's leftover processes die with the
step's main process. Steps are named by ``names.step_name`` so that teardown can
cancel exactly this cluster's steps and nothing else.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from .client import SlurmAnswerError, SlurmCommandError, command_env, execute, run_slurm
from .hostlist import compress

#: SLURM variables that must not leak from the caller's step into a new srun or sbatch:
#: they describe the caller's step (node count, tasks, step node list) and would silently
#: shape the new one.
_KEEP = {"SLURM_CONF"}
#: Seconds a cancelled step's Ray gets, after SIGTERM, to stop and collect its logs.
STOP_GRACE_SECONDS = 20.0


def clean_env(env: Mapping[str, str], extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` without the variables that would change our srun and sbatch calls (the
    caller's ``SLURM_*``, the commands' input variables: ``SBATCH_EXPORT=NONE`` would start
    workers without our variables), plus ``extra``: only the YAML decides."""
    out = {k: v for k, v in command_env(env).items() if not k.startswith("SLURM_") or k in _KEEP}
    out.update(extra or {})
    return out


def srun_argv(
    job_id: str,
    nodes: Sequence[str],
    command: Sequence[str],
    name: str | None = None,
    pty: bool = False,
    immediate: float | None = None,
    unbuffered: bool = False,
    output: str | None = None,
    container: Sequence[str] = (),
) -> list[str]:
    """One step with one task on each of ``nodes``; ``immediate``: seconds srun may wait
    for the step to be created (``--immediate``) before it gives up, as ssh's
    ``ConnectTimeout`` bounds the connection and not the command; ``unbuffered``: the
    tasks' output as it comes (srun holds it until a newline otherwise); ``output``: a
    file pattern for each task's output (``%N``: the node's name), written on the node;
    ``container``: the container runner's arguments (``plan.container.ContainerPlan``)."""
    argv = [
        "srun",
        f"--jobid={job_id}",
        "--overlap",
        f"--nodes={len(nodes)}",
        f"--ntasks={len(nodes)}",
        "--ntasks-per-node=1",
        f"--nodelist={compress(nodes)}",  # a short hostlist, also for 10,000 nodes
        "--cpu-bind=none",
        "--kill-on-bad-exit=0",
        "--quiet",
    ]
    if name:
        argv.append(f"--job-name={name}")
    if pty:
        argv.append("--pty")
    if immediate is not None:
        argv.append(f"--immediate={max(1, round(immediate))}")
    if unbuffered:
        argv.append("--unbuffered")
    if output:
        argv.append(f"--output={output}")
    return [*argv, *container, *command]


def bash_command(cmd: str, env: Mapping[str, str] | None = None) -> list[str]:
    """``bash -c`` run from $HOME with exports first; values quoted for the shell."""
    exports = "".join(f"export {k}={shlex.quote(str(v))}; " for k, v in (env or {}).items())
    return ["bash", "-c", exports + 'cd "$HOME" 2>/dev/null; ' + cmd]


def run_step(
    argv: Sequence[str], what: str, timeout: float, extra_env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a short srun (a probe, a cleanup, a signal) to its end, output captured; its
    tasks get ``extra_env`` too (a value other users must not see goes there: every
    process's argv is readable by all).

    Bounded by ``timeout``; a step that does not end in time is a ``SlurmCommandError``
    naming ``what`` (say which step, job and nodes), never a bare ``TimeoutExpired``."""
    try:
        return execute(argv, timeout, env=clean_env(os.environ, extra_env))
    except subprocess.TimeoutExpired as e:
        raise SlurmCommandError(f"{what} did not end within {timeout:.0f} s") from e
    except OSError as e:
        raise SlurmCommandError(f"{what} could not be run: {e}") from e


def launch_detached(argv: Sequence[str], log_path: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """Start an srun client in its own session, output to a file (never a pipe)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            env=dict(env),
            start_new_session=True,
        )
    finally:
        os.close(fd)


def spawn_step(argv: Sequence[str], *, pipes: bool = False) -> subprocess.Popen[bytes]:
    """Start an srun client that the caller waits on (a log reader, a relay), in its own
    session so that a Ctrl-C reaches the caller alone, which then ends the step in order;
    with SLURM's variables of the calling step hidden (``clean_env``). ``pipes``: stdin and
    stdout are pipes to the caller, else stdin is closed and stdout is the caller's."""
    return subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if pipes else subprocess.DEVNULL,
        stdout=subprocess.PIPE if pipes else None,
        env=clean_env(os.environ),
        start_new_session=True,
    )


def list_steps(job_id: str) -> dict[str, str] | None:
    """Step id -> step name of the job's running steps; None when SLURM says the job is
    gone. ``SlurmCommandError`` when squeue could not answer (retried): never a guess."""
    try:
        out = run_slurm(["squeue", "-h", "-s", "-j", str(job_id), "-o", "%i %j"])
    except SlurmAnswerError as e:
        if e.invalid_job:
            return None
        raise
    steps: dict[str, str] = {}
    for line in out.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2:
            steps[parts[0]] = parts[1]
    return steps


def job_state(job_id: str) -> str | None:
    """SLURM state of the job (``RUNNING``, ``PENDING``...), None when SLURM says it no
    longer exists; ``SlurmCommandError`` when squeue could not answer."""
    try:
        out = run_slurm(["squeue", "-h", "-j", str(job_id), "-o", "%T"])
    except SlurmAnswerError as e:
        if e.invalid_job:
            return None
        raise
    return out.strip().splitlines()[0] if out.strip() else None


def cancel_steps(
    step_ids: Sequence[str], job_id: str, wait: float = 60, grace: float = STOP_GRACE_SECONDS
) -> None:
    """End the given steps and wait until squeue no longer lists them.

    First SIGTERM (``scancel --signal=TERM``): a plain scancel of a step kills its
    processes at once, and a node's Ray then neither stops cleanly nor collects its logs
    (``node_run``). The steps still listed ``grace`` seconds later are cancelled (SIGKILL).
    Steps that ended meanwhile make scancel answer ``already completing``: fine, the wait
    decides. A scancel that cannot reach the controller is raised (after its retries)."""
    remaining = set(step_ids)
    if grace > 0 and remaining:
        try:
            run_slurm(["scancel", "--signal=TERM", *sorted(remaining)])
        except SlurmAnswerError:
            pass
        remaining = _wait_unlisted(remaining, job_id, grace)
    if not remaining:
        return
    try:
        run_slurm(["scancel", *sorted(remaining)])
    except SlurmAnswerError:
        pass
    remaining = _wait_unlisted(remaining, job_id, wait)
    if remaining:
        raise SlurmCommandError(f"steps {sorted(remaining)} still running {wait:.0f} s after scancel")


def _wait_unlisted(step_ids: set[str], job_id: str, timeout: float) -> set[str]:
    """The steps of ``step_ids`` squeue still lists after at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    remaining = set(step_ids)
    while remaining:
        steps = list_steps(job_id)
        if steps is None:
            return set()  # the job ended, and every step with it
        remaining &= set(steps)
        if not remaining or time.monotonic() >= deadline:
            break
        time.sleep(0.3)
    return remaining


def stop_foreground_step(proc: subprocess.Popen[bytes], job_id: str, name: str, wait: float = 10.0) -> None:
    """End an srun client we started in a session of its own (``start_new_session``, so
    that the terminal's Ctrl-C reaches us, not it) and the step it holds: SIGTERM (srun
    passes it to the task), then SIGKILL, then, if the step outlived its client, a
    scancel of the step named exactly ``name`` (a name with our pid: no other step). A
    client that ended by itself waited for its step: nothing to do."""
    if proc.poll() is not None:
        return
    for stop in (proc.terminate, proc.kill):
        if proc.poll() is None:
            stop()
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
    try:
        steps = list_steps(job_id) or {}
        cancel_steps([sid for sid, n in steps.items() if n == name], job_id, wait=wait * 3, grace=0)
    except SlurmCommandError as e:
        warning = f"could not check that step {name} of job {job_id} ended: {e}"
        print(f"eray-provider: warning: {warning}", file=sys.stderr)


class ForegroundStep:
    """A step whose one task the caller waits on and passes signals to, as to a child
    (``eray-provider run``'s COMMAND in the head's container).

    srun passes SIGINT to its tasks only with ``--disable-status``, and answers SIGTERM and
    SIGHUP by killing them; so a signal goes to the step itself (``scancel --signal``),
    found by its name (``name``: unique to the caller). The srun client runs in a session
    of its own: a terminal's Ctrl-C reaches the caller alone, which passes it on."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], job_id: str, name: str) -> None:
        self.job_id, self.name = job_id, name
        self.proc = subprocess.Popen(list(argv), env=dict(env), start_new_session=True)
        self._step: str | None = None

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self) -> int:
        return self.proc.wait()

    def step_id(self, timeout: float = 30.0) -> str | None:
        """The step's id once squeue lists it; None when the client ended first or squeue
        did not list it within ``timeout`` (a step not yet made cannot be signalled)."""
        deadline = time.monotonic() + timeout
        while self._step is None and self.proc.poll() is None and time.monotonic() < deadline:
            steps = list_steps(self.job_id) or {}
            self._step = next((sid for sid, n in steps.items() if n == self.name), None)
            if self._step is None:
                time.sleep(0.2)
        return self._step

    def send_signal(self, signum: int) -> None:
        """``signum`` to the step's task; to the srun client (which ends the step) when the
        step cannot be found or signalled."""
        try:
            step = self.step_id()
            if step is not None:
                run_slurm(["scancel", f"--signal={signal.Signals(signum).name[3:]}", step])
                return
        except SlurmCommandError as e:
            print(f"eray-provider: warning: cannot signal step {self.name}: {e}", file=sys.stderr)
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
