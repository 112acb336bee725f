"""``auto_ray_cluster`` / ``RayClusterConfig``: the seed's Ray API, on this package's machinery.

Called in every process of ``srun python train.py`` (after ``DistributedConfig().
initialize()`` or not): the step's first process (``SLURM_PROCID`` 0) builds the step's
Ray cluster exactly as ``eray-provider run`` does (port plan probed on every node, token,
private temp dirs, per-node resources, runtime hook; the head on the step's first node,
which is the JAX coordinator's, every Ray node in a step of its own, never a child of a
user's process) and publishes its address; every process waits for it (bounded) and
connects with ``ray.init``. At exit each process disconnects and reports; the first
process then stops the cluster's own steps and removes its state, after every process
has reported or ``EXIT_WAIT_SECONDS`` passed. No lock files in /tmp, no ``ray stop``.

With ``address`` (or ``RAY_ADDRESS``) it only connects; outside a SLURM step it starts a
local Ray, as the seed did.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ClusterError, ClusterTimeoutError
from ..plan.environment import CLIENT_VARIABLES
from ..plan.markers import Marker
from ..plan.names import safe_part
from ..plan.provider_config import Filled
from ..slurm.allocation import AllocationError
from ..slurm.client import FALLBACK_CLUSTER, SlurmCommandError, cluster_name, load_allocation
from ..slurm.env import in_srun_step, node_name, step_instance
from ..slurm.srun import job_state
from ..slurm.step import StepLayout, step_layout
from .batch import DEFAULT_JOIN_TIMEOUT, job_cluster_config, start_cluster
from .cluster_state import ClusterState, ensure_private_dir, remove_state_dir
from .launch import TeardownError, cluster_env, teardown
from .stop_signals import StopSignal, shielded, stop_signals_raise

logger = logging.getLogger(__name__)

#: How long the first process waits at exit for the others to disconnect.
EXIT_WAIT_SECONDS = 120.0
#: Seconds a stopped start waits for the other processes to learn it (``_tell_stopped``).
STOPPED_WAIT_SECONDS = 10.0
_initialized = False


def step_cluster_name(env: Mapping[str, str], slurm_cluster: str) -> str:
    """Unique per srun invocation: job ids start again after a controller's cold start, so
    the step id alone could meet an earlier job's leftovers. It names the SLURM cluster
    too: job ids of two SLURM clusters sharing a HOME are unrelated."""
    return f"step{step_instance(env)}@{safe_part(slurm_cluster)}"


#: File in a step cluster's state dir naming the SLURM cluster it ran on (its scontrol name).
_SLURM_CLUSTER_FILE = "slurm_cluster"
#: The step cluster's files in its state dir: the first task's outcome (the head's address,
#: or why the start failed) that every task waits for, and each task's end.
_READY_FILE, _FAILED_FILE, _DONE_FILE = "ready", "failed", "done"


def _leftover_job(path: Path, slurm_cluster: str) -> str | None:
    """The job of a step cluster's state dir of exactly this SLURM cluster, else None.

    A dir is this cluster's when its name says so, or when its name carries the fallback
    ``slurm`` (no ``SLURM_CLUSTER_NAME`` in the step) and the file it recorded names it:
    job ids of two SLURM clusters sharing a HOME are unrelated."""
    m = re.fullmatch(r"step\d+-\d+@(.+)-(\d+)", path.name)
    if m is None:
        return None
    if m.group(1) == safe_part(slurm_cluster):
        return m.group(2)
    try:
        recorded = (path / _SLURM_CLUSTER_FILE).read_text().strip()
    except OSError:
        return None
    return m.group(2) if m.group(1) == FALLBACK_CLUSTER and recorded == slurm_cluster else None


def _remove_leftovers(base: Path, slurm_cluster: str) -> None:
    """Best effort: state of this SLURM cluster's step clusters whose job has ended (their
    first task was killed before its exit handler ran; SLURM ended their processes)."""
    by_job: dict[str, list[Path]] = {}
    for path in base.glob("step*"):
        job = _leftover_job(path, slurm_cluster)
        if job is not None:
            by_job.setdefault(job, []).append(path)
    for job, paths in by_job.items():
        try:
            ended = job_state(job) is None
        except SlurmCommandError as e:
            logger.warning("not removing leftovers of job %s: %s", job, e)
            continue
        if ended:
            for path in paths:
                remove_state_dir(path)


def _build(
    state: ClusterState, layout: StepLayout, slurm_cluster: str, start_workers: bool, timeout: float
) -> str:
    """First process: the step's cluster, then the ``ready`` (or ``failed``) marker, which
    every other process waits for. A stop signal during the start (Ctrl-C; SLURM's SIGTERM
    at a time limit) ends it: what began is torn down at once (no other process has
    connected), and SIGTERM or SIGHUP ends the process with 128 + the signal
    (``SystemExit``, so the caller's ``finally`` blocks run)."""
    atexit.register(_teardown, state, layout.num_processes)
    with stop_signals_raise():
        try:
            return _start(state, layout, slurm_cluster, start_workers, timeout)
        except StopSignal as e:
            stopped = e
            atexit.unregister(_teardown)
            with shielded():
                try:
                    teardown(state)
                    _tell_stopped(state, layout.num_processes, stopped.name)
                except TeardownError as e:  # the state is how a later teardown finds the steps
                    logger.error("%s", e)
    logger.error("%s during the step's Ray cluster start: it was stopped", stopped.name)
    if stopped.signum == signal.SIGINT:
        raise stopped
    raise SystemExit(stopped.exit_status)


def _tell_stopped(state: ClusterState, processes: int, why: str) -> None:
    """After a stopped start's teardown: the other processes learn it from a ``failed``
    marker, also those that have not yet looked (a process slow to start would never see
    the state dir go, and would wait out its timeout); each answers with its ``done``
    marker. Then the state dir goes; waiting for the answers is bounded
    (``STOPPED_WAIT_SECONDS``: within SLURM's KillWait after a SIGTERM)."""
    state.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (state.dir / _FAILED_FILE).write_text(f"{why} during its start: it was stopped")
    deadline = time.monotonic() + STOPPED_WAIT_SECONDS
    while len(list(state.dir.glob(f"{_DONE_FILE}.*"))) < processes - 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    remove_state_dir(state.dir)


def _start(
    state: ClusterState, layout: StepLayout, slurm_cluster: str, start_workers: bool, timeout: float
) -> str:
    try:
        if state.exists():
            raise AllocationError(
                f"a cluster {state.cluster_name!r} of job {layout.job_id} exists ({state.dir})"
            )
        # the first task alone asks scontrol (one call, not one per task) for the cluster's
        # real name when the step's environment lacks it, and records it for a later cleanup
        real_cluster = slurm_cluster if slurm_cluster != FALLBACK_CLUSTER else cluster_name({})
        ensure_private_dir(state.base)
        ensure_private_dir(state.dir)
        (state.dir / _SLURM_CLUSTER_FILE).write_text(real_cluster)
        if real_cluster != FALLBACK_CLUSTER:  # unknown: whose leftovers they are is unknown too
            _remove_leftovers(state.base, real_cluster)
        nodes = list(layout.nodes if start_workers else layout.nodes[:1])
        alloc = load_allocation(layout.job_id)
        provider = job_cluster_config(alloc, state.cluster_name, {"nodes": nodes})["provider"]
        address = start_cluster(state, Filled.of(provider).head_allocation(), provider, timeout)
    except Exception as e:
        state.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        (state.dir / _FAILED_FILE).write_text(str(e))
        raise
    (state.dir / _READY_FILE).write_text(address)
    return address


def _wait_ready(state: ClusterState, rank: int, timeout: float) -> str:
    """Other processes: the address the first process published. A start that failed or
    was stopped is answered with this process's ``done`` marker (the first process waits
    for them before it removes the state)."""
    deadline = time.monotonic() + timeout
    seen = False
    while time.monotonic() < deadline:
        failed = state.dir / _FAILED_FILE
        if failed.exists():
            why = failed.read_text()
            with contextlib.suppress(OSError):  # the state may be gone already
                (state.dir / f"{_DONE_FILE}.{rank}").write_text("")
            raise ClusterError(f"the step's Ray cluster did not start: {why}")
        if seen and not state.dir.exists():
            raise ClusterError(f"the step's Ray cluster was stopped during its start ({state.dir})")
        seen = seen or state.dir.exists()
        ready = state.dir / _READY_FILE
        if ready.exists() and ready.read_text():
            return ready.read_text()
        time.sleep(0.5)
    raise ClusterTimeoutError(f"the step's Ray cluster was not ready after {timeout:.0f} s ({state.dir})")


def _report_done(state: ClusterState, rank: int) -> None:
    try:
        import ray

        ray.shutdown()
    finally:
        if state.exists():
            (state.dir / f"{_DONE_FILE}.{rank}").write_text("")


def _teardown(state: ClusterState, processes: int) -> None:
    deadline = time.monotonic() + EXIT_WAIT_SECONDS
    while time.monotonic() < deadline:
        done = list(state.dir.glob(f"{_DONE_FILE}.*")) if state.exists() else []
        if len(done) >= processes:
            break
        time.sleep(0.5)
    try:
        teardown(state)
    except TeardownError as e:
        logger.error("%s", e)


def _step_cluster(env: Mapping[str, str], start_workers: bool, timeout: float) -> tuple[str, str | None]:
    """(GCS address, the address of this node's Ray node, when it has one)."""
    layout = step_layout(env)
    # from the environment only: every task computes the same name, none asks scontrol
    slurm_cluster = cluster_name(env, use_scontrol=False)
    state = ClusterState(step_cluster_name(env, slurm_cluster), layout.job_id)
    if layout.process_id == 0:
        address = _build(state, layout, slurm_cluster, start_workers, timeout)
    else:
        address = _wait_ready(state, layout.process_id, timeout + 120)
    # registered before ray.init, so it runs after Ray's own exit handler
    atexit.register(_report_done, state, layout.process_id)
    client = cluster_env(state)
    # what a connecting process takes from the cluster's environment (not its HOME)
    os.environ.update({k: client[k] for k in CLIENT_VARIABLES if k in client})
    here = node_name(env)
    mine = [i for i, rec in state.records().items() if rec.slurm_node == here]
    return address, (state.read_marker(mine[0], Marker.IP) if mine else None)


def auto_ray_cluster(
    address: str | None = None,
    namespace: str | None = "eray-executor",
    start_workers: bool = True,
    fail_if_cluster_already_initialized: bool = False,
    timeout: float = DEFAULT_JOIN_TIMEOUT,
    **kwargs: Any,
) -> None:
    """Start (or join) the SLURM step's Ray cluster and ``ray.init`` to it; see the module.

    Call it in every process of the step, before anything else imports ``ray`` (Ray reads
    its token settings when first imported). ``start_workers=False`` starts the head only.
    ``kwargs`` go to ``ray.init``. A second call in a process is ignored with a warning.
    """
    global _initialized
    if _initialized:
        logger.warning("auto_ray_cluster has already been called. Ignoring subsequent calls.")
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address is None and in_srun_step(os.environ):
        address, node_ip = _step_cluster(os.environ, start_workers, timeout)
        if node_ip:
            # the driver must attach to the Ray node on its own host; left to guess, Ray
            # can pick another node's raylet (whose socket is not on this host)
            kwargs.setdefault("_node_ip_address", node_ip)
    import ray

    if ray.is_initialized():
        if fail_if_cluster_already_initialized:
            raise ClusterError("Ray is already initialized in this process")
        logger.warning("Ray is already initialized in this process: not connecting again")
    else:
        ray.init(address=address or "local", namespace=namespace, **kwargs)
    _initialized = True


@dataclass
class RayClusterConfig:
    """The seed's settings object: ``initialize()`` calls ``auto_ray_cluster``."""

    address: str | None = None
    start_workers: bool = True
    auto_start_cluster: bool = True

    def initialize(self) -> None:
        if self.auto_start_cluster:
            auto_ray_cluster(address=self.address, start_workers=self.start_workers)
