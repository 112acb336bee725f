"""``eray-provider run -- COMMAND``: the job's Ray cluster for the length of one command.

For batch scripts that never type ``ray up``. Run from the batch step (or with ``srun
--ntasks-per-node=1``, where the task on the job's first node does the work and the others
return at once), it builds the same cluster the provider builds (port plan, token,
per-node temp dirs, resources, runtime hook): the head on the first node, every other
node a worker, each in a step of its own. It waits until every node has joined (bounded
by ``--timeout``), runs COMMAND once as the driver on this node with the cluster's address
and token set, then cancels the cluster's steps, removes its temp dirs and state, and
exits with COMMAND's status. SIGTERM/SIGINT (``scancel``, the end of the time limit) are
passed to COMMAND and the cluster is torn down the same way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from .allocation import Allocation, AllocationError
from .cluster_config import fill_config
from .cluster_state import ClusterState, ClusterStoppingError
from .launch import (
    LaunchError,
    TeardownError,
    ensure_port_plan,
    launch_head,
    launch_workers,
    node_client_env,
    teardown,
    wait_joined,
)
from .node_spec import worker_types
from .slurm_cli import SlurmCommandError, load_allocation
from .slurm_env import in_srun_step

DEFAULT_JOIN_TIMEOUT = 300.0


def _log(msg: str) -> None:
    print(f"eray-provider: {msg}", file=sys.stderr, flush=True)


def _records(state: ClusterState, specs: list[tuple[str, str, str]]) -> dict[str, str]:
    """Node records (slurm node, role, node type); returns slurm node -> node id."""
    ids = state.add_nodes([(node, role, {"ray-user-node-type": kind}) for node, role, kind in specs])
    return {spec[0]: node_id for spec, node_id in zip(specs, ids)}


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
    """Port plan, head, workers (one srun per node type), then wait until every node of
    ``alloc`` has joined; returns the GCS address. The caller tears down (``teardown``)."""
    t0 = time.monotonic()
    python = provider["python"]
    with state.lock(timeout=120):
        state.create()
        ensure_port_plan(state, alloc, python)
        state.save_cluster_config({"provider": provider})
    head = alloc.head.name
    ids = _records(state, [(head, "head", "ray.head.slurm")])
    address = launch_head(state, ids[head], head, {}, python)
    _log(f"head on {head} at {address} ({time.monotonic() - t0:.1f} s)")
    for batch, (node_type, shares) in enumerate(worker_types(alloc).items(), start=1):
        worker_ids = _records(state, [(s.name, "worker", node_type) for s in shares])
        launch_workers(state, worker_ids, node_type, python, batch)
    wait_joined(state, address, len(alloc.nodes), join_timeout, stopped)
    _log(f"{len(alloc.nodes)} nodes joined ({time.monotonic() - t0:.1f} s)")
    return address


def run(
    command: Sequence[str],
    cluster_name: str = "run",
    join_timeout: float = DEFAULT_JOIN_TIMEOUT,
    provider_options: dict | None = None,
) -> int:
    if not command:
        raise ValueError("eray-provider run needs a command after --")
    # under srun (several tasks on the first node too) only the step's first task builds
    # the cluster; the batch step is one task with SLURM_PROCID 0
    procid = os.environ.get("SLURM_PROCID", "0")
    if in_srun_step(os.environ) and procid != "0":
        _log(f"task {procid} on {os.environ.get('SLURMD_NODENAME')}: the step's first task runs the cluster")
        return 0
    alloc = load_allocation()
    if alloc.state not in (None, "RUNNING"):
        raise AllocationError(f"job {alloc.job_id} is {alloc.state}, not RUNNING")
    provider = job_cluster_config(alloc, cluster_name, provider_options)["provider"]
    state = ClusterState(cluster_name, alloc.job_id, provider["state_dir"])
    if state.exists():
        raise AllocationError(f"a cluster {cluster_name!r} of job {alloc.job_id} already runs ({state.dir})")

    proc: subprocess.Popen | None = None
    stopping = False

    def on_signal(signum, _frame):
        nonlocal stopping
        stopping = True
        if proc is not None and proc.poll() is None:
            proc.send_signal(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    code = 1
    try:
        start_cluster(state, alloc, provider, join_timeout, lambda: stopping)
        _log(f"running {' '.join(command)}")
        # this process runs on the job's first node, the head's
        head_id = next(i for i, rec in state.read()["nodes"].items() if rec["role"] == "head")
        proc = subprocess.Popen(list(command), env={**os.environ, **node_client_env(state, head_id)})
        code = proc.wait()
        _log(f"command exited {code}")
    except (LaunchError, AllocationError, TimeoutError, SlurmCommandError, ClusterStoppingError) as e:
        _log(f"error: {e}")
    finally:
        try:
            teardown(state)
            _log("cluster stopped")
        except TeardownError as e:
            _log(f"error: {e}")
            code = code or 1
    return code
