"""Runs on a node, as the task of the node's long-lived step: becomes that node's Ray.

``python -m eray_provider.runtime.node_run`` (started by the launcher for the head, by the
head's provider for workers) picks this node's address, makes a private temp dir,
runs the setup commands of workers, then runs ``ray start --block`` with the job's
port plan, token and resources (through ``ray_gate``, which loads Ray's CLI while a
worker waits for the head), and records the outcome for the provider. It forwards
SIGTERM/SIGINT to Ray and, when Ray ends, copies its logs into the state dir
(``node_logs``) and removes its temp dir.

Its input comes from the environment: ``plan.environment.NodeLaunch`` (the state dir,
cluster, job and role, and the launch's node ids as ``<hostlist>@<first generation>``).
A node of a cluster that is being stopped (``ray down`` has begun) exits at once.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..errors import ClusterError, ConfigError
from ..plan import environment
from ..plan.environment import ClusterEnv, NodeLaunch, hide_slurm, host_of
from ..plan.markers import Marker
from ..plan.modules import END_WATCH, RAY_GATE, python_m
from ..plan.names import ray_temp_dir
from ..plan.node_spec import StartSpec, start_env
from ..plan.ports import PortPlan, candidates, choose_plan, held_ranges
from ..plan.provider_config import Filled, ProviderConfig
from ..plan.sbatch import elastic_node_id
from ..slurm.allocation import Allocation
from ..slurm.client import load_allocation
from ..slurm.env import job_id_from_env, node_index, restart_count
from ..slurm.env import node_name as slurm_node_name
from ..slurm.hostlist import HostlistError, expand
from ..slurm.walltime import END_SIGNAL
from .bind_shim import bind_env, check_preloaded, shim_path
from .cluster_state import ClusterState
from .loopback_hold import LoopbackHold, hold_loopback
from .node_logs import CapReached, collect
from .port_probe import busy_ports, drop_dir, host_exclusions, port_open
from .process_identity import identity
from .ray_compat import (
    PYTHON_VERSION_TEXT,
    RAY_VERSION_TEXT,
    WORKER_TEMP_DIR_FROM_HEAD,
    WORKER_WAITS_FOR_HEAD_NODE,
)
from .shared_dir import SharedDir, is_private_dir, remove_tree

#: How long a worker waits for the head's GCS to accept connections (the head's own
#: start, its setup commands included, must fit in it).
HEAD_WAIT_SECONDS = 600.0
HEAD_POLL_SECONDS = 0.25
#: How long a worker's gate waits for the head's raylet after the GCS opened, before Ray's
#: own wait (about 40 s more) takes over: seconds at a third of a CPU, a minute on a
#: machine that starts many nodes at once.
HEAD_NODE_WAIT_SECONDS = 60.0
#: How long an elastic replacement stands by for the autoscaler to show it (``stand_by``).
STANDBY_SECONDS = 900.0
#: How long the head's autoscaler lets a node of a fixed allocation take to run Ray (an
#: elastic config sets ``provider.pending_timeout_s``): more than a worker's head wait
#: (``HEAD_WAIT_SECONDS``) plus its setup commands.
PENDING_TIMEOUT_SECONDS = 3600
#: How long Ray may take to stop on SIGTERM before its logs are collected regardless.
STOP_WAIT_SECONDS = 3.0


class NodeRunError(ClusterError):
    pass


def node_id_from(value: str, node_name: str) -> str | None:
    """This node's id in ``ERAY_NODE_IDS`` (``<hostlist>@<first generation>``, written by
    ``launch.encode_node_ids``); None when the launch does not name this node."""
    hosts, sep, first = value.rpartition("@")
    try:
        names = expand(hosts) if sep and first.isdigit() else None
    except HostlistError:
        names = None
    if names is None:
        raise NodeRunError(f"{environment.NODE_IDS}={value!r}: expected <hostlist>@<first generation>")
    if node_name not in names:
        return None
    return f"{node_name}.{int(first) + names.index(node_name)}"


def interface_addresses() -> list[str]:
    """IPv4 addresses of this host's interfaces (``ip -o -4 addr``), loopback excluded."""
    try:
        out = subprocess.run(
            ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    addrs = []
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            addr = parts[parts.index("inet") + 1].split("/")[0]
            if not addr.startswith("127."):
                addrs.append(addr)
    return addrs


def pick_ip(network: str | None) -> str:
    """The address other nodes reach this node on.

    With ``network`` (a CIDR from ``provider.network``): the interface address inside it.
    Otherwise the hostname's address unless it is a loopback alias (a ``127.0.1.1`` entry
    in /etc/hosts is common), else the address of the interface holding the default route.
    """
    if network:
        net = ipaddress.ip_network(network, strict=False)
        for addr in interface_addresses():
            if ipaddress.ip_address(addr) in net:
                return addr
        raise NodeRunError(
            f"provider.network={network!r}: no interface of {socket.gethostname()} is in it "
            f"(addresses: {interface_addresses()})"
        )
    try:
        for addr in socket.gethostbyname_ex(socket.gethostname())[2]:
            if not addr.startswith("127."):
                return addr
    except OSError:
        pass
    addrs = interface_addresses()
    if addrs:
        return addrs[0]
    raise NodeRunError(f"cannot find a non-loopback address of {socket.gethostname()}")


def local_port_plan(job_id: str) -> PortPlan:
    """The port plan of a node in a job of its own (an elastic worker): its job's first
    candidate block that is free on this node."""
    exclusions = host_exclusions()
    cands = candidates(job_id, exclusions)[:8]
    return choose_plan(job_id, exclusions, busy_ports([p for c in cands for p in c.all_ports()]))


def current_head(state: ClusterState) -> str | None:
    """The node id of the cluster's head: the last recorded one not terminated."""
    heads = [i for i, r in state.records().items() if r.live_head]
    return heads[-1] if heads else None


def stand_by(state: ClusterState, node_id: str, why: str) -> None:
    """A replacement of another job's node (elastic ``replace_before_end_s``), or a node
    whose job SLURM requeued and runs again, starts Ray only once the head's provider shows
    it to the autoscaler (its ``handover`` marker, written after its ``standby`` marker): a
    Ray node that the autoscaler does not know of would be taken for one too many of its
    type, and stopped. ``why``: what the node does, for its log. Bounded by
    ``STANDBY_SECONDS``; ``ClusterStoppingError`` when the cluster is being stopped
    meanwhile."""
    state.write_marker(node_id, Marker.STANDBY, str(time.time()))
    print(f"eray-provider: {node_id} {why}: standing by until the head shows it", flush=True)
    deadline = time.monotonic() + STANDBY_SECONDS
    while state.read_marker(node_id, Marker.HANDOVER) is None:
        state.check_launchable()
        if time.monotonic() > deadline:
            raise NodeRunError(
                f"{node_id} ({why}) stood by {STANDBY_SECONDS:.0f} s and the head's autoscaler never "
                f"showed it (is the head alive? see {state.logs})"
            )
        time.sleep(0.5)


def wait_for_head(state: ClusterState, gcs_port: int, timeout: float) -> str:
    """``ip:port`` of the head's GCS once it accepts connections: a worker launched with
    the head waits here. Raises ``NodeRunError`` when the head exits first or is not
    reachable within ``timeout`` (naming the head and its port), and
    ``ClusterStoppingError`` when the cluster is being stopped meanwhile."""
    deadline = time.monotonic() + timeout
    head = None
    while True:
        state.check_launchable()
        head = current_head(state)
        if head is not None:
            if state.read_marker(head, Marker.EXIT) is not None:
                raise NodeRunError(f"the head {head} exited before this node could join (see {state.logs})")
            ip = state.read_marker(head, Marker.IP)
            if ip and port_open(ip, gcs_port):
                return f"{ip}:{gcs_port}"
        if time.monotonic() > deadline:
            where = f"head {head}" if head else "no head recorded"
            raise NodeRunError(
                f"the head's GCS (port {gcs_port}, {where}) did not open within {timeout:.0f} s"
            )
        time.sleep(HEAD_POLL_SECONDS)


def heads_temp_dir(state: ClusterState) -> str:
    """The head's private dir, whose path a worker's Ray takes on a Ray before 2.55
    (``ray_compat.WORKER_TEMP_DIR_FROM_HEAD``), whatever ``--temp-dir`` says."""
    head = current_head(state)
    dirs = state.temp_dirs(head)[1] if head else []
    if not dirs:
        raise NodeRunError(f"the head ({head or 'none recorded'}) recorded no temp dir in {state.dir}")
    return dirs[-1]


def _wait_ray(proc: subprocess.Popen, stop_asked: list[float]) -> int:
    """Ray's exit code; once a stop was asked (``stop_asked`` holds when), at most
    ``STOP_WAIT_SECONDS`` more, then ``-SIGTERM`` while Ray still stops. Ray drains for up
    to 30 s on SIGTERM, longer than SLURM's ``KillWait`` may leave before SIGKILL: the
    logs are collected first, and the end of the step ends what is left of Ray."""
    while True:
        try:
            return proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            if stop_asked and time.monotonic() - stop_asked[0] > STOP_WAIT_SECONDS:
                return -signal.SIGTERM


def _collect_logs(
    state: ClusterState,
    node_id: str,
    private: str,
    settings: ProviderConfig,
    role: str,
    node_name: str,
    own_job: str | None,
    code: int,
) -> None:
    """Keep this node's Ray logs in the state dir (``node_logs``): its temp dir goes next.

    Best effort, and it never fails the node: a cluster torn down meanwhile (its state
    removed) or a full file system loses only the copy, said on stderr."""
    cap = int(settings.collect_logs_mb * 2**20)
    total = int(settings.collect_logs_total_mb * 2**20)
    try:
        slurm_cluster = state.read().get("slurm_cluster", "")
    except (OSError, ValueError, RuntimeError):
        slurm_cluster = ""
    meta = {
        "slurm_node": node_name,
        "slurm_job": own_job or state.job_id,
        "slurm_cluster": slurm_cluster,
        "role": role,
        "exit_code": code,
    }
    try:
        dest = collect(ray_temp_dir(private), state.dir, node_id, cap, meta, total)
    except (OSError, CapReached) as e:
        print(f"eray-provider: {node_id}: its Ray logs were not collected: {e}", file=sys.stderr, flush=True)
        return
    if dest is not None:
        print(f"eray-provider: {node_id}: Ray logs collected into {dest}", flush=True)


def _end_watch(gcs: str, args: list[str], ray_env: dict[str, str]) -> subprocess.Popen:
    """Start ``end_watch`` (the head's watcher, or one node's drain) beside Ray, with the
    cluster's token variables; it prints into this node's log."""
    argv = python_m(sys.executable, END_WATCH, gcs, *args)
    return subprocess.Popen(argv, env=hide_slurm(ray_env), stdin=subprocess.DEVNULL)


def _stop_helper(proc: subprocess.Popen) -> None:
    """End a helper this process started (our child, by its handle), bounded."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _start_again(state: ClusterState, node_id: str, env: Mapping[str, str]) -> int:
    """An elastic worker's job that SLURM requeued runs again from the start: what its last
    run left (its end, its drain, its hand-over) is removed, and a ``rerun`` marker tells the
    provider, which hid the node since the requeue, to show it again (then it stands by
    until shown, ``stand_by``). Returns how often SLURM requeued the job."""
    state.marker(node_id, Marker.EXIT).unlink(missing_ok=True)
    state.marker(node_id, Marker.DRAIN).unlink(missing_ok=True)
    restarts = restart_count(env)
    if restarts > 0:
        for old in (Marker.HANDOVER, Marker.STANDBY):
            state.marker(node_id, old).unlink(missing_ok=True)
        state.write_marker(node_id, Marker.RERUN, str(restarts))
    return restarts


def _run_setup(commands: list[str], env: dict[str, str]) -> None:
    for cmd in commands:
        print(f"eray-provider: setup: {cmd}", flush=True)
        rc = subprocess.run(["bash", "-c", cmd], env=env, stdin=subprocess.DEVNULL).returncode
        if rc != 0:
            raise NodeRunError(f"setup command failed with exit {rc}: {cmd}")


@dataclass(frozen=True)
class Identity:
    """Which node of which cluster this process is. ``own_job``: an elastic worker's own
    SLURM job (the provider submitted it with sbatch); None for a node of the cluster's job."""

    launch: NodeLaunch
    node_name: str
    node_id: str
    own_job: str | None


def identify(env: Mapping[str, str]) -> Identity:
    """This node's identity from what the launcher and SLURM handed it; ``ConfigError``
    naming what is missing."""
    launch = NodeLaunch.from_env(env)
    own_job = job_id_from_env(env) if launch.elastic else None
    if launch.elastic and own_job is None:
        raise ConfigError("SLURM_JOB_ID is not set: an elastic worker runs in a job of its own")
    node_name = slurm_node_name(env)
    if own_job is not None:
        return Identity(launch, node_name, elastic_node_id(own_job, node_index(env)), own_job)
    node_id = node_id_from(launch.node_ids, node_name)
    if node_id is None:
        raise ConfigError(f"node {node_name} is not in {environment.NODE_IDS}={launch.node_ids!r}")
    return Identity(launch, node_name, node_id, None)


def ray_environment(
    env: Mapping[str, str], cluster: ClusterEnv, tmp: str, node_id: str, n_workers: int
) -> dict[str, str]:
    """The environment of the node's setup commands and of its Ray, before its start spec:
    the step's own, the cluster's (``ClusterEnv``; no ``RAY_ADDRESS``: ``ray start`` is
    told its head), Ray's temp files in ``tmp`` (the user's ``TMPDIR`` kept aside for the
    nodes this one launches) and the node's instance id."""
    out = dict(env)
    out.pop("RAY_ADDRESS", None)
    out.update(cluster.to_env())
    out.update(
        {
            "TMPDIR": tmp,
            environment.USER_TMPDIR: env.get(environment.USER_TMPDIR, env.get("TMPDIR", "")),
            "RAY_CLOUD_INSTANCE_ID": node_id,
            "RAY_USAGE_STATS_ENABLED": "0",
            "AUTOSCALER_MAX_CONCURRENT_LAUNCHES": str(n_workers),
            "AUTOSCALER_MAX_LAUNCH_BATCH": str(n_workers),
        }
    )
    return out


def head_environment(settings: ProviderConfig) -> dict[str, str]:
    """What only the head's Ray gets: how long an adopted or launched node may take to
    run Ray before the autoscaler gives up on it (Ray's default differs by release:
    ray_compat), and an elastic cluster's autoscaler interval."""
    out = {
        "RAY_AUTOSCALER_RECONCILE_ALLOCATE_STATUS_TIMEOUT_S": str(
            settings.pending_timeout_s if settings.elastic else PENDING_TIMEOUT_SECONDS
        )
    }
    if settings.elastic:
        out["AUTOSCALER_UPDATE_INTERVAL_S"] = str(settings.autoscaler_interval_s)
    return out


def start_spec(
    alloc: Allocation,
    node_name: str,
    role: str,
    ip: str,
    plan: PortPlan,
    temp_dir: str,
    head_address: str | None,
    settings: ProviderConfig,
    autoscaling_config: str | None,
) -> StartSpec:
    """This node's ``ray start``, from its share of the allocation and the provider config."""
    return StartSpec(
        share=alloc.node(node_name),
        job_id=alloc.job_id,
        role=role,
        ip=ip,
        plan=plan,
        temp_dir=temp_dir,
        head_address=head_address,
        dashboard_host=settings.dashboard_host,
        object_store_fraction=settings.object_store_fraction,
        autoscaling_config=autoscaling_config,
        node_index=alloc.node_names.index(node_name),
        end_time=alloc.end_time,
    )


def head_node_poll(nodes: int) -> float:
    """How often a starting worker asks the GCS for the head node (``runtime.ray_gate``):
    every 0.2 s, less often from 200 nodes on, so that the workers of one cluster ask about
    1,000 times a second together at most (Ray's own asking, every 2 s, reaches that rate
    at 2,000 nodes)."""
    return max(0.2, nodes / 1000)


def _go(
    gate: subprocess.Popen[bytes], args: list[str], env: dict[str, str], head_wait: dict[str, Any] | None
) -> None:
    """Tells the gate (``runtime.ray_gate``) its ``ray`` arguments, the variables that name
    the head and whether to wait for the head node: from here on it is this node's Ray. A
    gate that already ended (Ray's CLI failed to load) is left as it is: its exit code is
    the node's."""
    assert gate.stdin is not None
    go = {"argv": args, "env": env, "head_wait": head_wait}
    try:
        gate.stdin.write(json.dumps(go).encode() + b"\n")
        gate.stdin.close()
    except BrokenPipeError:
        pass


def _supervise(
    proc: subprocess.Popen[bytes],
    node_id: str,
    gcs: str,
    job: str,
    ray_env: dict[str, str],
    drains: list[subprocess.Popen[bytes]],
) -> int:
    """Until the node's Ray ends: SIGTERM and SIGINT are passed on to it, and SLURM's
    warning of the job's end (``walltime.END_SIGNAL``) drains this node now (a helper
    appended to ``drains``, which the caller stops). Returns Ray's exit code."""
    stop_asked: list[float] = _asked  # a stop passed on before these handlers counts

    def forward(signum: int, _frame: object) -> None:
        stop_asked.append(time.monotonic())
        proc.send_signal(signum)

    def ending(_signum: int, _frame: object) -> None:
        print(f"eray-provider: {node_id}: SLURM signalled its job's end", flush=True)
        drains.append(_end_watch(gcs, ["--node", node_id, "--job", job], ray_env))

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    signal.signal(getattr(signal, f"SIG{END_SIGNAL}"), ending)
    return _wait_ray(proc, stop_asked)


class Stopped(ClusterError):
    """SIGTERM or SIGINT before Ray runs (``ray down``, ``scancel``, a preemption during the
    setup commands, the wait for the head or a stand-by): the node ends as a failure does,
    leaving its exit marker and removing its temp dir."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name} before its Ray ran")


#: How long a node keeps its holds after its Ray ended on its own (a crash, an OOM kill, a
#: drain), not by a stop signal: the rest of the cluster goes on calling this node's address,
#: with the token, until it learns the node is gone (the GCS marks a silent raylet dead within
#: about 30 s; workers call a lost head's GCS for ``gcs_rpc_server_reconnect_timeout_s``, 60
#: s by default), and another user could bind the address once it is free. A stop signal
#: ends the wait: in a teardown every node is being stopped.
HOLD_AFTER_CRASH_SECONDS = 75.0

#: The node's Ray once started: a stop signal from then on is passed to it, not raised.
_ray: list[subprocess.Popen[bytes]] = []
_asked: list[float] = []


def _stop_early(signum: int, _frame: object) -> None:
    if _ray:  # between Ray's start and _supervise's own handlers
        _asked.append(time.monotonic())
        _ray[0].send_signal(signum)
        return
    _asked.append(time.monotonic())
    raise Stopped(signum)


def _noted(signum: int, _frame: object) -> None:
    """While the node cleans up: a stop signal must not cut the cleanup short (SLURM sends
    SIGKILL after its ``KillWait`` anyway); it ends the holds' wait (``_linger``)."""
    _asked.append(time.monotonic())


def main() -> int:
    # from the first line: a stop at any point leaves the exit marker and no temp dir
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop_early)
    env = os.environ
    try:
        ident = identify(env)
    except ConfigError as e:
        print(f"eray-provider: {e}", file=sys.stderr)
        return 2
    launch, node_name, node_id, own_job = ident.launch, ident.node_name, ident.node_id, ident.own_job
    state = ClusterState(launch.cluster, launch.job_id, launch.state_base)
    role = launch.role
    tmp = None
    claimed: str | None = None
    ray_home: SharedDir | None = None
    settings = ProviderConfig()
    code = 1
    watcher: subprocess.Popen | None = None
    drains: list[subprocess.Popen] = []
    hold: LoopbackHold | None = None
    gate: subprocess.Popen[bytes] | None = None
    try:
        config = state.cluster_config()
        provider = config["provider"]
        settings, facts = ProviderConfig.from_dict(provider), Filled.of(provider)
        container = state.container()
        if container is not None:  # this process runs in the image
            mismatch = container.mismatch(RAY_VERSION_TEXT, PYTHON_VERSION_TEXT)
            if mismatch:
                raise NodeRunError(mismatch)
        plan = state.ports()
        if plan is None:
            raise NodeRunError(f"no port plan in {state.dir}")
        rerun = 0
        if own_job is not None:
            rerun = _start_again(state, node_id, env)
            alloc = load_allocation(own_job)
            node_plan = local_port_plan(own_job)
        else:
            alloc = facts.head_allocation()
            node_plan = plan
        ip = pick_ip(settings.network)
        shim = None if settings.bind_all_interfaces else shim_path()
        if shim:
            # before anything of Ray runs (and before the ip marker tells workers where the
            # head is), until it has ended (loopback_hold)
            hold = hold_loopback(held_ranges([node_plan, plan]), ip)
        # not $TMPDIR: the launching node's Ray sets it to its own temp dir
        claimed = state.claimed_temp_dir() if WORKER_TEMP_DIR_FROM_HEAD else None
        claimed = claimed if claimed and is_private_dir(claimed) else None
        if role == "head" and claimed:
            tmp = claimed  # the path workers take: made on every node first (launch.temp_dir_claim)
        else:
            tmp = tempfile.mkdtemp(prefix=f"eray-{state.job_id}-", dir=settings.temp_base)
        # a worker's claimed dir too, so that a teardown removes it if this node never runs
        state.write_temp_dirs(node_id, node_name, [tmp, *([claimed] if claimed and role == "worker" else [])])
        state.write_marker(node_id, Marker.PID, identity(os.getpid()))
        bootstrap = state.home / "ray_bootstrap_config.yaml"
        n_workers = max(len(alloc.workers), 10)
        cluster = ClusterEnv(
            token_path=str(state.token_path),
            home=str(state.home),
            jax_env=dict(settings.jax_env),
            job_id=state.job_id,
            jax_ports=(plan.jax_first, plan.jax_count),
        )
        ray_env = ray_environment(env, cluster, tmp, node_id, n_workers)
        if role == "worker":
            # while the head starts (a cluster of fixed nodes starts every node at once)
            _run_setup(list(facts.worker_setup_commands), ray_env)
        ray_env.update(start_env(node_plan, settings.metrics_export))
        if not settings.bind_all_interfaces:
            if shim:
                ray_env.update(bind_env(shim, ip, [node_plan, plan], env))
                check_preloaded(shim, ray_env)
            else:
                print(
                    "eray-provider: warning: the bind shim was not built (no C compiler at install "
                    "time?): Ray's gRPC servers listen on all interfaces (token-protected)",
                    file=sys.stderr,
                    flush=True,
                )
        if role == "head":
            ray_env.update(head_environment(settings))
        # Ray's CLI loads while this node waits for the head (runtime.ray_gate)
        gate = subprocess.Popen(
            python_m(sys.executable, RAY_GATE), env=hide_slurm(ray_env), stdin=subprocess.PIPE
        )
        head_address = None
        if role == "worker":
            head_address = wait_for_head(state, plan.gcs, HEAD_WAIT_SECONDS)
        # the dir Ray runs in, shared on this host with any other node of the cluster whose
        # Ray takes the same path (before Ray 2.55 every worker takes the head's)
        ray_home = SharedDir(heads_temp_dir(state) if role == "worker" and WORKER_TEMP_DIR_FROM_HEAD else tmp)
        ray_home.enter()
        if ray_home.path != tmp:
            state.write_temp_dirs(node_id, node_name, [tmp, ray_home.path])
        # the launcher's config: present under `ray up`, absent under `eray-provider run`
        autoscaling = str(bootstrap) if role == "head" and bootstrap.exists() else None
        spec = start_spec(
            alloc,
            node_name,
            role,
            ip,
            node_plan,
            ray_temp_dir(ray_home.path),
            head_address,
            settings,
            autoscaling,
        )
        head_env = replace(cluster, head_ip=ip if role == "head" else host_of(str(head_address))).to_env()
        ray_env.update(head_env)
        state.write_marker(node_id, Marker.IP, ip)
        print(f"eray-provider: {role} {node_id} on {node_name} ({ip}): {spec.shell()}", flush=True)
        if launch.replaces:
            stand_by(state, node_id, f"replaces job {launch.replaces}'s node")
        elif rerun:
            stand_by(state, node_id, f"runs again (SLURM requeued its job {rerun} time(s))")
        state.check_launchable()  # a teardown that began while this step started wins
        _ray.append(gate)  # a stop from here on is passed to it
        head_wait = None
        if role == "worker" and WORKER_WAITS_FOR_HEAD_NODE:
            poll = head_node_poll(len(alloc.nodes))
            head_wait = {"address": head_address, "interval": poll, "timeout": HEAD_NODE_WAIT_SECONDS}
        _go(gate, spec.argv()[1:], head_env, head_wait)
        gcs = f"{ip}:{plan.gcs}" if role == "head" else str(head_address)
        lead = settings.drain_before_end_s
        replaced = settings.elastic and settings.replace_before_end_s > 0
        if role == "head" and (lead > 0 or replaced):
            watcher = _end_watch(gcs, ["--lead", str(lead), *(["--replaced"] if replaced else [])], ray_env)

        code = _supervise(gate, node_id, gcs, own_job or state.job_id, ray_env, drains)
    except Stopped as e:
        print(f"eray-provider: {node_id}: {e}", file=sys.stderr, flush=True)
        code = 128 + e.signum
    except Exception as e:  # reported to the provider through the exit marker
        print(f"eray-provider: {node_id} failed: {e}", file=sys.stderr, flush=True)
        code = 1 if code == 0 else code
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _noted)
        if gate is not None and not _ray:
            gate.kill()  # it has run nothing of Ray yet
            gate.wait()
        for helper in [watcher, *drains]:
            if helper is not None:
                _stop_helper(helper)
        try:
            state.write_marker(node_id, Marker.EXIT, str(code))
        except FileNotFoundError:
            pass  # the cluster was torn down and its state removed: nobody waits for it
        # the head's path, claimed on this host, is kept for the node that replaces this one
        # (which takes the same path) unless the cluster is being stopped: its name has been
        # seen, and another user could make it first; the teardown removes it
        keep = claimed if claimed and role == "worker" and not _asked else None
        if ray_home is not None:
            _collect_logs(state, node_id, ray_home.path, settings, role, node_name, own_job, code)
            # removes it, unless another node of the cluster still runs in it
            ray_home.leave(remove=ray_home.path != keep)
        if tmp and (ray_home is None or ray_home.path != tmp):
            remove_tree(tmp)
        if claimed and role == "worker" and not keep:
            drop_dir(claimed)  # still empty if this node ended before its Ray ran in it
        if hold is not None:
            if _ray:
                _linger(HOLD_AFTER_CRASH_SECONDS)
            hold.release()  # last: what is left of Ray goes with the step
    return code


def _linger(seconds: float) -> None:
    """Wait ``seconds``, or until a stop signal (``ray down``, ``scancel``) comes."""
    stops = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    try:
        if not _asked:  # one that came while the node cleaned up (``_noted``) counts
            signal.sigtimedwait(stops, seconds)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)


if __name__ == "__main__":
    sys.exit(main())
