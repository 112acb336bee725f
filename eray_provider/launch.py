"""Starting and stopping a cluster's Ray steps: the part of the provider that spawns.

Head: launched from the launcher host (where ``ray up`` runs) as a detached srun client
holding the head's step, then waited for until the GCS reports the head alive. Workers:
launched by the head's provider in one srun step per launch batch (one task per node),
whatever the batch size. Teardown cancels exactly this cluster's steps (named
``eray.<cluster>.*``), then removes the nodes' temp dirs in one srun.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from .allocation import Allocation
from .bind_shim import bind_env, shim_path
from .cluster_state import ClusterState
from .names import is_cluster_step, step_name
from .ports import PortPlan, candidates, choose_plan
from .slurm_cli import SlurmCommandError, host_exclusions
from .srun import cancel_steps, clean_env, launch_detached, list_steps, srun_argv

HEAD_READY_TIMEOUT = 300.0


class LaunchError(RuntimeError):
    pass


def cluster_env(state: ClusterState) -> dict[str, str]:
    """Variables every process of the cluster and every client of it needs."""
    env = {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(state.token_path),
        "HOME": str(state.home),
        "RAY_RUNTIME_ENV_HOOK": "eray_provider.jax_hook.runtime_env_hook",
    }
    address = head_address(state)
    if address:
        env["RAY_ADDRESS"] = address
        env["ERAY_HEAD_IP"] = address.rsplit(":", 1)[0]
    plan = state.ports()
    if plan is not None:
        env["ERAY_JAX_PORTS"] = f"{plan.jax_first}:{plan.jax_count}"
        env["ERAY_JOB_ID"] = state.job_id
    try:
        jax_defaults = state.cluster_config()["provider"].get("jax_env") or {}
    except (OSError, KeyError, ValueError):
        jax_defaults = {}
    env["ERAY_JAX_ENV"] = json.dumps(jax_defaults)
    return env


def node_client_env(state: ClusterState, node_id: str) -> dict[str, str]:
    """``cluster_env`` for a command run on one of the cluster's nodes (``ray exec``, the
    driver of ``eray-provider run``): its Ray client talks to the node's metrics agent over
    loopback, so it gets the node's bind shim too."""
    env = cluster_env(state)
    ip = state.read_marker(node_id, "ip")
    plan = state.ports()
    shim = shim_path()
    try:
        everywhere = state.cluster_config()["provider"].get("bind_all_interfaces")
    except (OSError, KeyError, ValueError):
        everywhere = True
    if ip and plan and shim and not everywhere:
        env.update(bind_env(shim, ip, [plan], os.environ))
    return env


def head_address(state: ClusterState) -> str | None:
    plan = state.ports()
    for node_id, rec in state.read()["nodes"].items():
        if rec["role"] == "head" and not rec.get("terminated"):
            ip = state.read_marker(node_id, "ip")
            if ip and plan:
                return f"{ip}:{plan.gcs}"
    return None


#: Variables of the process that launches a node which describe *that* process's Ray node
#: (the head's monitor launches workers): a worker must not inherit them.
_NODE_SPECIFIC = (
    "RAY_OVERRIDE_",
    "RAY_NODE_TYPE_NAME",
    "RAY_CLOUD_INSTANCE_ID",
    "RAY_HEAD_IP",
    "RAY_ADDRESS",
    "ERAY_",
)


def node_env(state: ClusterState, role: str, ids: Mapping[str, str], extra: Mapping[str, str]):
    base = {k: v for k, v in os.environ.items() if not k.startswith(_NODE_SPECIFIC)}
    if "ERAY_USER_TMPDIR" in os.environ:  # launched from inside one of our Ray nodes
        base.pop("TMPDIR", None)
        if os.environ["ERAY_USER_TMPDIR"]:
            base["TMPDIR"] = os.environ["ERAY_USER_TMPDIR"]
    return clean_env(
        base,
        {
            **extra,
            "ERAY_STATE_BASE": str(state.base),
            "ERAY_CLUSTER": state.cluster_name,
            "ERAY_JOB_ID": state.job_id,
            "ERAY_ROLE": role,
            "ERAY_NODE_IDS": ",".join(f"{n}={i}" for n, i in ids.items()),
        },
    )


def ensure_port_plan(state: ClusterState, alloc: Allocation, python: str) -> PortPlan:
    """The recorded plan, or a new one checked free on every node with one srun."""
    plan = state.ports()
    if plan is not None:
        return plan
    exclusions = host_exclusions()
    cands = candidates(alloc.job_id, exclusions)
    # probe the first few candidates on every node at once
    probe = [p for c in cands[:4] for p in c.all_ports()]
    argv = srun_argv(
        alloc.job_id,
        alloc.node_names,
        [python, "-m", "eray_provider.port_probe", *map(str, probe)],
        name=step_name(state.cluster_name, "probe"),
    )
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(os.environ),
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0:
        raise LaunchError(f"port probe on the job's nodes failed: {proc.stderr.strip()[-2000:]}")
    busy = [int(p) for line in proc.stdout.splitlines() for p in line.split()[2:]]
    plan = choose_plan(alloc.job_id, exclusions, busy)
    state.save_ports(plan)
    return plan


def launch_head(
    state: ClusterState, node_id: str, slurm_node: str, extra_env: Mapping[str, str], python: str
) -> str:
    """Start the head's step and wait until its GCS reports it alive; returns ``ip:port``.

    Idempotent: a second ``ray up`` (or two racing ones) finds the head launched and only
    waits for it, so there is never a second head.
    """
    log = state.logs / f"{node_id}.log"
    with state.lock(timeout=120):
        doc = state.read()
        rec = doc["nodes"][node_id]
        proc = None
        if not rec.get("launched") or state.read_marker(node_id, "exit") is not None:
            name = step_name(state.cluster_name, f"head.{rec['gen']}")
            argv = srun_argv(state.job_id, [slurm_node], [python, "-m", "eray_provider.node_run"], name=name)
            proc = launch_detached(argv, log, node_env(state, "head", {slurm_node: node_id}, extra_env))
            doc = json.loads(json.dumps(doc))
            doc["nodes"][node_id].update(step_name=name, launched=time.time())
            state.write(doc)
    return wait_head_ready(state, node_id, proc, log)


def launch_workers(
    state: ClusterState, nodes: Mapping[str, str], node_type: str, python: str, batch: int
) -> subprocess.Popen:
    """One srun step for a batch of workers (``slurm node -> node id``); does not wait."""
    name = step_name(state.cluster_name, f"workers.{batch}")
    argv = srun_argv(state.job_id, list(nodes), [python, "-m", "eray_provider.node_run"], name=name)
    env = node_env(state, "worker", nodes, {"RAY_NODE_TYPE_NAME": node_type})
    _mark_launched(state, list(nodes.values()), name)
    return launch_detached(argv, state.logs / f"workers.{batch}.log", env)


def _mark_launched(state: ClusterState, node_ids: Sequence[str], step_name: str) -> None:
    now = time.time()

    def mark(doc):
        for node_id in node_ids:
            doc["nodes"][node_id].update(step_name=step_name, launched=now)

    state.update(mark)


def _tail(path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_head_ready(
    state: ClusterState,
    node_id: str,
    proc: subprocess.Popen,
    log,
    timeout: float = HEAD_READY_TIMEOUT,
) -> str:
    """Readiness: the head's IP is recorded and its GCS lists it as an alive node."""
    deadline = time.monotonic() + timeout
    plan = state.ports()
    assert plan is not None
    while time.monotonic() < deadline:
        if (proc is not None and proc.poll() is not None) or state.read_marker(node_id, "exit") is not None:
            raise LaunchError(f"the head's Ray exited during start; {log}:\n{_tail(log)}")
        ip = state.read_marker(node_id, "ip")
        if ip and _port_open(ip, plan.gcs):
            address = f"{ip}:{plan.gcs}"
            if ip in (gcs_alive_ips(state, address) or ()):
                return address
        time.sleep(0.5)
    raise LaunchError(f"the head was not alive after {timeout:.0f} s; {log}:\n{_tail(log)}")


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def gcs_alive_ips(state: ClusterState, address: str, timeout: float = 30) -> set[str] | None:
    """Addresses of the nodes the GCS at ``address`` lists as alive; None if unreachable."""
    env = dict(os.environ, **cluster_env(state))
    env.pop("RAY_ADDRESS", None)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "eray_provider.gcs_probe", address],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return None
    return set(proc.stdout.split()) if proc.returncode == 0 else None


def stop_cluster(state: ClusterState) -> list[str]:
    """Cancel every step of this cluster and remove the nodes' temp dirs; returns step ids."""
    try:
        steps = list_steps(state.job_id)
    except SlurmCommandError:
        steps = None
    if steps is None:
        return []  # the job has ended: SLURM has ended every process of it
    ours = [sid for sid, name in steps.items() if is_cluster_step(name, state.cluster_name)]
    cancel_steps(ours, wait=90, job_id=state.job_id)
    _remove_temp_dirs(state)
    return ours


def _remove_temp_dirs(state: ClusterState) -> None:
    """One srun over the nodes that recorded a temp dir; each removes only its own."""
    per_node: dict[str, list[str]] = {}
    # nodes of other jobs (elastic workers) clean up after themselves
    outside = {i for i, rec in state.read()["nodes"].items() if rec.get("slurm_job")}
    for name in state.markers():
        if name.endswith(".tmpdir") and name[: -len(".tmpdir")] not in outside:
            value = state.read_marker(name[: -len(".tmpdir")], "tmpdir") or ""
            node, _, path = value.partition(" ")
            if node and path.startswith("/"):
                per_node.setdefault(node, []).append(path)
    if not per_node:
        return
    script = (
        'case "$SLURMD_NODENAME" in '
        + " ".join(
            f"{shlex.quote(node)}) rm -rf -- {' '.join(map(shlex.quote, paths))};;"
            for node, paths in per_node.items()
        )
        + " esac"
    )
    argv = srun_argv(
        state.job_id,
        sorted(per_node),
        ["bash", "-c", script],
        name=step_name(state.cluster_name, "cleanup"),
    )
    subprocess.run(
        argv, env=clean_env(os.environ), capture_output=True, timeout=120, stdin=subprocess.DEVNULL
    )


def wait_joined(state: ClusterState, address: str, count: int, timeout: float, stopped=lambda: False) -> None:
    """Until the GCS lists ``count`` alive nodes; names the nodes missing on timeout."""
    deadline = time.monotonic() + timeout
    alive: set[str] = set()
    while time.monotonic() < deadline and not stopped():
        failed = [n for n in state.markers() if n.endswith(".exit")]
        if failed:
            raise LaunchError(f"node(s) {[n[:-5] for n in failed]} exited while joining; see {state.logs}")
        alive = gcs_alive_ips(state, address) or set()
        if len(alive) >= count:
            return
        time.sleep(1)
    recorded = {
        name[: -len(".ip")]: state.read_marker(name[: -len(".ip")], "ip")
        for name in state.markers()
        if name.endswith(".ip")
    }
    missing = sorted(
        rec["slurm_node"]
        for node_id, rec in state.read()["nodes"].items()
        if recorded.get(node_id) not in alive
    )
    raise TimeoutError(f"node(s) {missing} did not join within {timeout:.0f} s; see {state.logs}")
