"""``eray-provider run -- COMMAND``: the job's Ray cluster for the length of one command.

For batch scripts that never type ``ray up``. Run from the batch step (or with ``srun
--ntasks-per-node=1``, where the task on the job's first node does the work and the others
return at once), it builds the same cluster the provider builds (port plan, token,
per-node temp dirs, resources, runtime hook): the head on the first node, every other
node a worker, each in a step of its own, all started at once. It waits until every
node has joined (bounded by ``--timeout``), runs COMMAND once as the driver on this node
with the cluster's address and token set, then cancels the cluster's steps, removes its
temp dirs and state, and exits with COMMAND's status. SIGTERM, SIGINT and SIGHUP
(``scancel``, the end of the time limit, Ctrl-C) are passed to COMMAND once it runs; one
that comes during the cluster's start ends the start at once, COMMAND never runs, and the
exit status is 128 + the signal. The cluster is torn down the same way in every case.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from ..errors import ConfigError, ErayError
from ..plan.cluster_config import fill_config
from ..plan.names import step_name
from ..plan.node_spec import worker_types
from ..plan.provider_config import ProviderConfig
from ..slurm.allocation import Allocation, AllocationError
from ..slurm.client import known_cluster_name, running_allocation
from ..slurm.env import in_srun_step, node_name, task_index
from ..slurm.srun import ForegroundStep, clean_env, srun_argv
from .cluster_state import ClusterState
from .launch import (
    TeardownError,
    ensure_container_plan,
    ensure_port_plan,
    head_log,
    launch_workers,
    node_client_env,
    start_head,
    teardown,
    temp_dir_claim,
    wait_head_ready,
    wait_joined,
)
from .ray_compat import RAY_VERSION_TEXT, check_version
from .stop_signals import STOP_SIGNALS, StopSignal, note, shielded, watching

DEFAULT_JOIN_TIMEOUT = 300.0


def _log(msg: str) -> None:
    print(f"eray-provider: {msg}", file=sys.stderr, flush=True)


def job_cluster_config(alloc: Allocation, cluster_name: str, provider_options: dict | None = None) -> dict:
    """The filled config of a cluster on ``alloc`` that no ``ray up`` drives."""
    base_config = {
        "cluster_name": cluster_name,
        "max_workers": -1,
        "provider": {
            "type": "external",
            "module": "eray_provider.SlurmNodeProvider",
            **(provider_options or {}),
        },
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
    }
    return fill_config(base_config, alloc)


def start_cluster(
    state: ClusterState, alloc: Allocation, provider: dict, join_timeout: float, stopped=lambda: False
) -> str:
    """Port plan, then every node at once: the head's step and the workers' (one srun per
    node type), the workers waiting on their nodes for the head's GCS; then wait until
    every node of ``alloc`` has joined. Returns the GCS address; the caller tears down
    (``teardown``). An unsupported Ray raises ``UnsupportedRayError`` before anything starts."""
    warning = check_version(RAY_VERSION_TEXT)
    if warning:
        print(f"eray-provider: warning: {warning}", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    settings = ProviderConfig.from_dict(provider)
    python = settings.python or sys.executable
    with state.lock(timeout=120, creating=True):
        state.create(slurm_cluster=known_cluster_name(os.environ))
        ensure_container_plan(state, settings, alloc)
        ensure_port_plan(state, alloc, python, temp_dir_claim(settings))
        state.save_cluster_config({"provider": provider})
    head = alloc.head.name
    types = worker_types(alloc)
    specs = [(head, "head", {"ray-user-node-type": "ray.head.slurm"})] + [
        (share.name, "worker", {"ray-user-node-type": node_type})
        for node_type, shares in types.items()
        for share in shares
    ]
    ids = dict(zip((spec[0] for spec in specs), state.add_nodes(specs)))
    proc = start_head(state, ids[head], head, {}, python)
    for batch, (node_type, shares) in enumerate(types.items(), start=1):
        launch_workers(state, {s.name: ids[s.name] for s in shares}, node_type, python, batch)
    nodes = list(ids.values())
    with wait_head_ready(
        state, ids[head], proc, head_log(state, ids[head]), workers=nodes, workers_timeout=join_timeout
    ) as watch:
        _log(f"head on {head} at {watch.address} ({time.monotonic() - t0:.1f} s)")
        wait_joined(state, watch, nodes, join_timeout, stopped, say=_log)
    _log(f"{len(alloc.nodes)} nodes joined ({time.monotonic() - t0:.1f} s)")
    return watch.address


def run(
    command: Sequence[str],
    cluster_name: str = "run",
    join_timeout: float = DEFAULT_JOIN_TIMEOUT,
    provider_options: dict | None = None,
) -> int:
    if not command:
        raise ConfigError("eray-provider run needs a command after --")
    # under srun (several tasks on the first node too) only the step's first task builds
    # the cluster; the batch step is one task with SLURM_PROCID 0
    procid = task_index(os.environ)
    if in_srun_step(os.environ) and procid != 0:
        _log(f"task {procid} on {node_name(os.environ)}: the step's first task runs the cluster")
        return 0
    if shutil.which(command[0]) is None:  # before a cluster is started for nothing
        raise ConfigError(f"eray-provider run: the command {command[0]!r} is not found or not executable")
    alloc = running_allocation()
    provider = job_cluster_config(alloc, cluster_name, provider_options)["provider"]
    state = ClusterState(cluster_name, alloc.job_id, ProviderConfig.from_dict(provider).state_base())
    with watching():
        return _run_cluster(state, alloc, provider, join_timeout, command)


def _start_command(
    state: ClusterState, alloc: Allocation, command: Sequence[str], env: Mapping[str, str]
) -> subprocess.Popen | ForegroundStep:
    """COMMAND as the driver on the head's node: here, or in a step of the head's container
    when the cluster has one (``provider.container``: the image has what the command needs,
    as ``ray submit`` runs it there)."""
    container = state.container()
    if container is None:
        return subprocess.Popen(list(command), env=dict(env))
    name = step_name(state.cluster_name, f"command.{os.getpid()}")
    argv = srun_argv(alloc.job_id, [alloc.head.name], command, name=name, container=container.args)
    return ForegroundStep(argv, clean_env(env), alloc.job_id, name)


def _run_cluster(
    state: ClusterState, alloc: Allocation, provider: dict, join_timeout: float, command: Sequence[str]
) -> int:
    """Start the cluster, run the command, tear down; the exit status."""
    cluster_name = state.cluster_name
    proc: subprocess.Popen | ForegroundStep | None = None
    stopping = False
    launching = False  # the command's Popen runs: a signal now waits for its handle
    pending: list[int] = []

    def on_signal(signum, _frame):
        nonlocal stopping
        stopping = True
        note(signum)  # wait loops see it (``stop_signals.check``) should the raise be lost
        if proc is None and not launching:
            raise StopSignal(signum)  # the start ends here; the command never runs
        if proc is None:
            pending.append(signum)  # passed on once the command's handle is known
        elif proc.poll() is None:
            proc.send_signal(signum)

    for sig in STOP_SIGNALS:  # passed to the command once it runs
        signal.signal(sig, on_signal)
    code = 1
    owned = False  # this run created the cluster: only then does it tear it down
    try:
        with state.lock(timeout=120, creating=True):  # two runs at once: one cluster, one owner
            if state.exists():
                raise AllocationError(
                    f"a cluster {cluster_name!r} of job {alloc.job_id} already runs ({state.dir}): "
                    "give this one another --name"
                )
            state.create(slurm_cluster=known_cluster_name(os.environ))
            owned = True
        start_cluster(state, alloc, provider, join_timeout, lambda: stopping)
        _log(f"running {' '.join(command)}")
        # this process runs on the job's first node, the head's
        head_id = next(i for i, rec in state.records().items() if rec.role == "head")
        env = {**os.environ, **node_client_env(state, head_id)}
        # a signal while the command starts is kept and passed on once `proc` is set (not a
        # blocked signal mask: the command would inherit it, and never see SIGTERM)
        launching = True
        try:
            proc = _start_command(state, alloc, command, env)
        except OSError as e:
            raise ConfigError(f"cannot run the command {command[0]!r}: {e.strerror or e}") from e
        for signum in pending:
            proc.send_signal(signum)
        code = proc.wait()
        _log(f"command exited {code}")
    except StopSignal as e:
        _log(f"{e.name} during the cluster's start: the command was not run")
        code = e.exit_status
    except ConfigError as e:
        _log(f"error: {e}")
        code = 2
    except (ErayError, TimeoutError) as e:  # TimeoutError: the state's lock (filelock)
        _log(f"error: {e}")
    finally:
        if owned:
            with shielded():  # the teardown runs to its end (SLURM's KillWait bounds it)
                try:
                    teardown(state)
                    _log("cluster stopped")
                except TeardownError as e:
                    _log(f"error: {e}")
                    code = code or 1
    return code
