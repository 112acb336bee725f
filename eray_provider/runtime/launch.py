"""Starting and stopping a cluster's Ray steps: the part of the provider that spawns.

Head: launched from the launcher host (where ``ray up`` runs) as a detached srun client
holding the head's step, then waited for until the GCS reports the head alive. Workers:
one srun step per launch batch (one task per node), whatever the batch size. A cluster
of fixed nodes starts every node at once: its workers are launched with the head, not
after it, and each waits on its node for the head's GCS (``node_run``), so the cluster
is up in one node's start time, not two. Teardown cancels exactly this cluster's steps
(named ``eray.<cluster>.*``), then removes the nodes' temp dirs in one srun.
"""

from __future__ import annotations

import logging
import os
import queue
import secrets
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ..errors import ClusterError, ClusterTimeoutError
from ..plan import environment
from ..plan.container import plan_container
from ..plan.environment import ClusterEnv, host_of
from ..plan.join_progress import JoinProgress
from ..plan.markers import Marker
from ..plan.modules import GCS_PROBE, NODE_RUN, PORT_PROBE, python_m
from ..plan.names import is_cluster_step, step_name
from ..plan.ports import PortPlan, PortPlanError, candidates, choose_probed, next_to_probe
from ..plan.provider_config import Filled, ProviderConfig
from ..slurm.allocation import Allocation
from ..slurm.client import SlurmCommandError, slurm_timeout
from ..slurm.host_commands import RELAY_ENV
from ..slurm.host_commands import SERVER as RELAY_SERVER
from ..slurm.hostlist import compress
from ..slurm.srun import cancel_steps, clean_env, job_state, launch_detached, list_steps, run_step, srun_argv
from . import stop_signals
from .bind_shim import bind_env, shim_path
from .cluster_state import ClusterState, ensure_private_dir
from .container_gate import gate_containers
from .port_probe import (
    NodeReport,
    ProbeError,
    check_answered,
    describe_busy,
    exclusions_from_reports,
    host_exclusions,
    merge_reports,
    parse_reports,
)
from .process_identity import signal_command
from .ray_compat import PYTHON_VERSION_TEXT, RAY_VERSION_TEXT, WORKER_TEMP_DIR_FROM_HEAD

logger = logging.getLogger(__name__)

HEAD_READY_TIMEOUT = 300.0
#: A launched node whose step squeue does not list yet is still starting for this long.
STEP_GRACE_SECONDS = 30.0
#: Seconds the temp dir cleanup (one srun over the nodes) may take.
CLEANUP_TIMEOUT = 120.0
#: The cleanup's ``gone DIR...``: removes the dirs, again for up to 20 s while they come
#: back (a Ray process of a cancelled step that SLURM has not killed yet may still write
#: its logs there), then lists what is left and fails.
REMOVE_DIRS = """gone() {
  for _ in $(seq 40); do
    rm -rf -- "$@" 2>/dev/null
    left=0; for d in "$@"; do [ -e "$d" ] && left=1; done
    [ "$left" = 0 ] && return 0
    sleep 0.5
  done
  ls -la -- "$@" >&2; return 1
}
"""


def _job_nodes(state: ClusterState) -> list[str]:
    """The nodes of the cluster's job (the head's allocation), or, when its config cannot
    say, those its records name."""
    try:
        return list(Filled.of(state.cluster_config()["provider"]).head_allocation().node_names)
    except (OSError, KeyError, ValueError):  # ClusterConfigError is a ValueError
        records = state.records().values()
        return sorted({rec.slurm_node for rec in records if rec.slurm_node and not rec.elastic})


def remove_container(name: str) -> str:
    """The cleanup's lines that remove the cluster's named container on a node: pyxis keeps
    it under enroot's data path after its steps have ended, as ``pyxis_<name>`` (its default
    global scope: after the job too) or ``pyxis_<job>_<name>`` (``container_scope=job``:
    until the job's end). Nothing to do where it is not (never made there); a removal that
    fails fails the cleanup."""
    quoted = shlex.quote(name)
    return (
        "if command -v enroot >/dev/null; then\n"
        f'  for made in pyxis_{quoted} "pyxis_${{SLURM_JOB_ID}}_"{quoted}; do\n'
        '    if enroot list | grep -qxF "$made"; then enroot remove -f "$made" >&2 || exit 1; fi\n'
        "  done\n"
        "fi\n"
    )


#: Seconds the port probe (one srun over the nodes) may take.
PROBE_TIMEOUT = 120.0
#: Probe rounds before giving up (4, 16, 64, 256... blocks: more than any port space holds).
MAX_PROBE_ROUNDS = 6


class LaunchError(ClusterError):
    pass


def cluster_env(state: ClusterState) -> dict[str, str]:
    """Variables every process of the cluster and every client of it needs."""
    address = head_address(state)
    plan = state.ports()
    try:
        jax_defaults = dict(ProviderConfig.from_dict(state.cluster_config()["provider"]).jax_env)
    except (OSError, KeyError, ValueError):  # ClusterConfigError is a ValueError
        jax_defaults = {}
    return ClusterEnv(
        token_path=str(state.token_path),
        home=str(state.home),
        jax_env=jax_defaults,
        job_id=state.job_id if plan is not None else None,
        jax_ports=(plan.jax_first, plan.jax_count) if plan is not None else None,
        head_ip=host_of(address) if address else None,
        address=address,
    ).to_env()


def client_exports(state: ClusterState) -> list[str]:
    """``export NAME=value`` lines of what Ray's own clients need to reach the running
    cluster (``ray.init()``, the Jobs SDK, ``ray job``, a notebook): the GCS address, token
    mode and path, and the variables of ``eray_provider.jax``; for ``eval`` in a shell.
    ``ClusterError`` when the cluster does not run (no state, no head)."""
    which = f"cluster {state.cluster_name!r} of job {state.job_id}"
    if not state.exists():
        raise ClusterError(f"{which} is not running ({state.dir})")
    env = cluster_env(state)
    if "RAY_ADDRESS" not in env:
        raise ClusterError(f"{which} has no running head")
    names = ("RAY_ADDRESS", *environment.CLIENT_VARIABLES)
    return [f"export {k}={shlex.quote(env[k])}" for k in names if k in env]


def node_client_env(state: ClusterState, node_id: str) -> dict[str, str]:
    """``cluster_env`` for a command run on one of the cluster's nodes (``ray exec``, the
    driver of ``eray-provider run``): its Ray client talks to the node's metrics agent over
    loopback, so it gets the node's bind shim too."""
    env = cluster_env(state)
    ip = state.read_marker(node_id, Marker.IP)
    plan = state.ports()
    shim = shim_path()
    try:
        everywhere = ProviderConfig.from_dict(state.cluster_config()["provider"]).bind_all_interfaces
    except (OSError, KeyError, ValueError):  # ClusterConfigError is a ValueError
        everywhere = True
    if ip and plan and shim and not everywhere:
        env.update(bind_env(shim, ip, [plan], os.environ))
    container = state.container()
    if container is not None:  # a driver in the container imports the mounted package too
        env.update(container.env)
    return env


def head_address(state: ClusterState) -> str | None:
    plan = state.ports()
    for node_id, rec in state.records().items():
        if rec.live_head:
            ip = state.read_marker(node_id, Marker.IP)
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
    environment.PREFIX,
)


def encode_node_ids(ids: Mapping[str, str]) -> str:
    """``slurm node -> node id`` of one launch as ``<hostlist>@<first generation>``: node
    ``i`` of the (order-kept, compressed) hostlist is ``<name>.<first + i>``. A few bytes
    for 10,000 nodes, where ``name=id,...`` overflows one environment value (E2BIG).
    Ids come from one ``ClusterState.add_nodes`` call, so their generations follow on."""
    if not ids:
        return ""
    names = list(ids)
    first = int(ids[names[0]].rpartition(".")[2])
    for i, name in enumerate(names):
        if ids[name] != f"{name}.{first + i}":
            raise ValueError(f"node ids of one launch must follow on: {name} -> {ids[name]}")
    return f"{compress(names)}@{first}"


def node_env(
    state: ClusterState,
    role: str,
    ids: Mapping[str, str],
    extra: Mapping[str, str],
    elastic: bool = False,
    replaces: str | None = None,
) -> dict[str, str]:
    """The environment of a node's step or job: this process's, less what describes its own
    Ray node and every ``ERAY_*`` (a launch from inside a node), plus ``extra`` and the
    ``NodeLaunch`` that node_run reads."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(_NODE_SPECIFIC)}
    user_tmpdir = os.environ.get(environment.USER_TMPDIR)
    if user_tmpdir is not None:  # launched from inside one of our Ray nodes
        base.pop("TMPDIR", None)
        if user_tmpdir:
            base["TMPDIR"] = user_tmpdir
    launch = environment.NodeLaunch(
        state_base=str(state.base),
        cluster=state.cluster_name,
        job_id=state.job_id,
        role=role,
        node_ids=encode_node_ids(ids),
        elastic=elastic,
        replaces=replaces,
    )
    container = state.container()
    if container is not None:  # the image's Python imports the package mounted at its path
        extra = {**container.env, **extra}
    return clean_env(base, {**extra, **launch.to_env()})


def temp_dir_claim(settings: ProviderConfig) -> str | None:
    """Where the launcher claims the head's temp dir on every node, or None when no claim is
    needed: on Rays before 2.55 every worker's Ray takes the head's temp dir path on its own
    host (``ray_compat.WORKER_TEMP_DIR_FROM_HEAD``), a path another user can see on the head
    and make first on a worker's host. Made on every node in the port probe's step, before
    the head starts, the name is ours on a node before it can be seen there, but for the gap
    between two nodes' tasks of that step (``ensure_port_plan``)."""
    return settings.temp_base if WORKER_TEMP_DIR_FROM_HEAD else None


def ensure_port_plan(
    state: ClusterState, alloc: Allocation, python: str, claim_base: str | None = None
) -> PortPlan:
    """The recorded plan, or a new one checked free on every node: one srun, two when the
    nodes' own port ranges move the job's candidates away from those first probed.

    Exclusions come from the probed nodes: each reports its ephemeral range (soft: on
    nodes with 1024-65535 the blocks inside it are the fallback, checked by this probe)
    and its reserved ports; ``SrunPortRange`` comes from the controller's config, the same
    for every node. The launcher's own ranges only pick what the first probe checks, since
    ``ray up`` may run on a login node set up unlike the compute nodes.

    With ``claim_base`` (``temp_dir_claim``) the same steps make the head's temp dir
    ``<claim_base>/eray-<job>-<random>`` on every node, the name passed in the step's
    environment (an argv is readable by every user). A name that another user made first on
    some node (by seeing it appear on another node of the job and racing this step's task)
    is dropped and a new one claimed in the next round; ``MAX_PROBE_ROUNDS`` such rounds end
    the start with an error naming the nodes and users. The name is recorded for the head
    (``ClusterState.claimed_temp_dir``)."""
    plan = state.ports()
    if plan is not None:
        return plan
    batch = 4  # candidate blocks in the first probe: about 1,000 ports on every node
    launcher = host_exclusions()
    controller = [e for e in launcher if not e.soft]
    busy: set[int] = set()
    probed: set[int] = set()
    reports: dict[str, NodeReport] = {}
    to_probe = candidates(alloc.job_id, launcher)[:batch]
    claim = _new_claim(claim_base, alloc.job_id) if claim_base else ""
    dropped: list[str] = []
    planted: dict[str, str] = {}
    # every round probes blocks not probed yet (four times as many as the last): a co-tenant
    # who holds a port of many blocks delays the plan by a round or two, and a plan is never
    # a block that no node checked
    for _ in range(MAX_PROBE_ROUNDS):
        ports = [] if plan is not None else sorted({p for c in to_probe for p in c.all_ports()} - probed)
        found = _probe(state, alloc, python, ports, claim, dropped)
        if claim:
            planted = {node: r.planted for node, r in found.items() if r.planted}
            if planted:  # seen and made first by another user: never used, removed where ours
                dropped = [claim]
                claim = _new_claim(str(claim_base), alloc.job_id)
            else:
                state.save_claimed_temp_dir(claim)
                claim, dropped = "", []
        if plan is None:
            for node, report in found.items():
                busy.update(report.busy)
                reports[node] = merge_reports(reports.get(node), report)
            probed.update(ports)
            from_nodes = exclusions_from_reports(reports.values())
            if not any(e.soft for e in from_nodes):  # no node could read its range: assume ours
                from_nodes += [e for e in launcher if e.soft]
            exclusions = [*controller, *from_nodes]
            try:
                plan = choose_probed(alloc.job_id, exclusions, busy, probed)
            except PortPlanError as e:
                raise PortPlanError(f"{e}: {describe_busy(reports.values())}") from e
            if plan is None:
                batch *= 4
                to_probe = next_to_probe(alloc.job_id, exclusions, busy, batch)
        if plan is not None and not claim:
            break
    else:
        if plan is None:
            raise PortPlanError(
                f"no port block was found free in {MAX_PROBE_ROUNDS} probes of job {alloc.job_id}'s nodes: "
                f"{describe_busy(reports.values())}"
            )
        _probe(state, alloc, python, [], "", dropped)
        where = ", ".join(f"{node} (made by {user})" for node, user in sorted(planted.items()))
        raise LaunchError(
            f"the head's temp dir could not be claimed on every node in {MAX_PROBE_ROUNDS} tries: another "
            f"user made each name first, last on {where}; on nodes shared with other users, use "
            f"Ray 2.55 or later (its workers do not take the head's temp dir path)"
        )
    state.save_ports(plan)
    return plan


def _new_claim(base: str, job_id: str) -> str:
    return os.path.join(base, f"eray-{job_id}-{secrets.token_hex(6)}")


def _probe(
    state: ClusterState, alloc: Allocation, python: str, ports: Sequence[int], claim: str, drop: Sequence[str]
) -> dict[str, NodeReport]:
    """One round of the port probe over every node of ``alloc``: its report per node."""
    args = [*(f"--drop={d}" for d in drop), *map(str, ports)]
    name = step_name(state.cluster_name, "probe")
    container = state.container()
    command = python_m(python, PORT_PROBE, *args)
    runner = container.args if container else ()  # one read of the plan: its args and env
    argv = srun_argv(alloc.job_id, alloc.node_names, command, name=name, container=runner)
    what = f"the port probe (step {name} of job {alloc.job_id} on {compress(alloc.node_names)})"
    env = {**(container.env if container else {}), **({environment.CLAIM_DIR: claim} if claim else {})}
    proc = run_step(argv, what, PROBE_TIMEOUT, env or None)
    if proc.returncode != 0:
        raise LaunchError(f"{what} failed: {proc.stderr.strip()[-2000:]}")
    try:
        found = parse_reports(proc.stdout)
        check_answered(found, alloc.node_names)
    except ProbeError as e:
        raise LaunchError(f"{what}: {e}") from e
    return found


def ensure_container_plan(state: ClusterState, settings: ProviderConfig, alloc: Allocation) -> None:
    """Record how the cluster's steps reach its container (``provider.container``), once,
    after the gate has found the container's paths closed to other users on every node of
    ``alloc`` (``runtime.container_gate``): every step the cluster starts after this reads
    the plan from the state dir."""
    if settings.container is None or state.container() is not None:
        return
    import eray_provider

    root = str(Path(eray_provider.__file__).resolve().parent.parent)
    plan = plan_container(
        settings.container,
        *(state.cluster_name, state.job_id, str(state.dir), settings.temp_base, root),
        versions=(RAY_VERSION_TEXT, PYTHON_VERSION_TEXT),
    )
    removed = gate_containers(
        state.cluster_name, state.job_id, alloc.node_names, plan.name, settings.container.image, plan.env
    )
    for line in removed:
        logger.info("removed a leftover container of this cluster's name on %s", line)
    state.save_container(plan)


def head_log(state: ClusterState, node_id: str):
    return state.logs / f"{node_id}.log"


def start_head(
    state: ClusterState, node_id: str, slurm_node: str, extra_env: Mapping[str, str], python: str
) -> subprocess.Popen | None:
    """Launch the head's step unless it is launched already (and has not exited); does not
    wait. Returns the srun client, None when nothing was launched."""
    log = head_log(state, node_id)
    with state.lock(timeout=120):
        state.check_launchable()
        rec = state.records()[node_id]
        proc = None
        if not rec.launched or state.read_marker(node_id, Marker.EXIT) is not None:
            start_relay(state, slurm_node)
            name = step_name(state.cluster_name, f"head.{rec.gen}")
            argv = srun_argv(
                state.job_id,
                [slurm_node],
                python_m(python, NODE_RUN),
                name=name,
                container=state.container_args(),
            )
            proc = launch_detached(argv, log, node_env(state, "head", {slurm_node: node_id}, extra_env))
            state.mark_launched([node_id], name)
    return proc


def start_relay(state: ClusterState, slurm_node: str) -> None:
    """In a cluster with a container: the host step on the head's node that runs SLURM's
    commands for the cluster's containers (``slurm.host_commands``), detached, for the
    cluster's life (the teardown cancels it with the cluster's steps; the head's job's end
    ends it). Started with the head: a server that already runs keeps serving and the new
    one ends at once."""
    container = state.container()
    relay = container.env.get(RELAY_ENV) if container is not None else None
    if not relay:
        return
    where = ensure_private_dir(Path(relay))  # in the private state dir; never a link
    argv = srun_argv(
        state.job_id,
        [slurm_node],
        ["bash", "-c", RELAY_SERVER, "relay", str(where)],
        name=step_name(state.cluster_name, "relay"),
    )
    launch_detached(argv, state.logs / "relay.log", clean_env(os.environ))


def launch_workers(
    state: ClusterState, nodes: Mapping[str, str], node_type: str, python: str, batch: int
) -> subprocess.Popen:
    """One srun step for a batch of workers (``slurm node -> node id``); does not wait.

    Under the cluster's lock, so a teardown that has begun (``mark_stopping``) is seen and
    the launch refused, and a teardown that begins later finds the step's record."""
    name = step_name(state.cluster_name, f"workers.{batch}")
    argv = srun_argv(
        state.job_id, list(nodes), python_m(python, NODE_RUN), name=name, container=state.container_args()
    )
    env = node_env(state, "worker", nodes, {"RAY_NODE_TYPE_NAME": node_type})
    with state.lock(timeout=120):
        state.check_launchable()
        state.mark_launched(list(nodes.values()), name)
        return launch_detached(argv, state.logs / f"workers.{batch}.log", env)


def _tail(path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_head_ready(
    state: ClusterState,
    node_id: str,
    proc: subprocess.Popen | None,
    log,
    timeout: float = HEAD_READY_TIMEOUT,
    workers: Sequence[str] = (),
    workers_timeout: float = 0,
) -> AliveWatch:
    """Readiness: the head's IP is recorded and its GCS lists it as an alive node. Returns
    the watch that saw it, which goes on watching ``workers`` (up to ``workers_timeout``
    more) for ``wait_joined``: one watcher process for the whole start. The caller closes
    it (a context manager)."""
    deadline = time.monotonic() + timeout
    plan = state.ports()
    assert plan is not None

    def failed() -> str | None:
        if (proc is not None and proc.poll() is not None) or state.read_marker(
            node_id, Marker.EXIT
        ) is not None:
            return f"the head's Ray exited during start; {log}:\n{_tail(log)}"
        if stop_signals.stopping():  # in another thread than the one the signal stopped
            return "a stop signal ended the start"
        return None

    while (ip := state.read_marker(node_id, Marker.IP)) is None and time.monotonic() < deadline:
        stop_signals.check()
        if reason := failed():
            raise LaunchError(reason)
        time.sleep(0.25)
    if ip is None:
        raise LaunchError(f"the head recorded no IP within {timeout:.0f} s; {log}:\n{_tail(log)}")
    left = deadline - time.monotonic()
    watch = AliveWatch(state, f"{ip}:{plan.gcs}", [node_id, *workers], left + workers_timeout)
    try:
        if watch.wait([node_id], left, failed):
            raise LaunchError(f"the head was not alive after {timeout:.0f} s; {log}:\n{_tail(log)}")
    except BaseException:
        watch.close()
        raise
    return watch


class AliveWatch:
    """Which of a start's nodes the GCS at ``address`` lists alive, as they join.

    One watcher process does the polling (``gcs_probe --wait``) for the whole start, the
    head and then its workers: a Python and Ray client started once, not once per poll or
    per phase, on machines busy starting Ray. It ends when every node of ``node_ids`` is
    alive, after ``timeout``, or when the watch is closed (a context manager)."""

    def __init__(self, state: ClusterState, address: str, node_ids: Sequence[str], timeout: float) -> None:
        env = dict(os.environ, **cluster_env(state))
        env.pop("RAY_ADDRESS", None)
        limit = max(timeout, 1.0)
        self.address = address
        self.joined: set[str] = set()
        self._deadline = time.monotonic() + limit + 30  # the watcher's own deadline, and a margin
        self._new: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._proc = subprocess.Popen(
            python_m(
                sys.executable,
                GCS_PROBE,
                address,
                "--wait",
                f"--timeout={limit:.1f}",
                f"--parent={os.getpid()}",
            ),
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        try:
            assert self._proc.stdin is not None
            self._proc.stdin.write("\n".join(node_ids) + "\n")
            self._proc.stdin.close()
        except BaseException:
            self.close()
            raise
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.startswith("joined "):
                self._new.put(line.split()[1])

    def _collect(self, node_ids: Sequence[str], on_poll: Callable[[list[str]], None]) -> list[str]:
        new = []
        while not self._new.empty():
            new.append(self._new.get())
        self.joined.update(new)
        on_poll([i for i in new if i in node_ids])
        return [i for i in node_ids if i not in self.joined]

    def wait(
        self,
        node_ids: Sequence[str],
        timeout: float,
        failed: Callable[[], str | None] = lambda: None,
        stopped: Callable[[], bool] = lambda: False,
        on_poll: Callable[[list[str]], None] = lambda joined: None,
    ) -> list[str]:
        """Until every node of ``node_ids`` is alive; returns those still missing after
        ``timeout`` (or when ``stopped()``, or the watcher ended), [] when all are alive.
        ``failed()`` is asked meanwhile and ends the wait with ``LaunchError`` (a node that
        exited); ``on_poll`` gets the ids of ``node_ids`` that joined since its last call,
        on every poll, and first those that joined before this wait."""
        deadline = min(time.monotonic() + max(timeout, 0.0), self._deadline)
        on_poll([i for i in node_ids if i in self.joined])
        while missing := self._collect(node_ids, on_poll):
            stop_signals.check()
            if self._proc.poll() is not None:
                self._reader.join(timeout=5)
                return self._collect(node_ids, on_poll)
            if reason := failed():
                raise LaunchError(reason)
            if stopped() or time.monotonic() > deadline:
                return missing
            time.sleep(0.25)
        return []

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()

    def __enter__(self) -> AliveWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def gcs_alive(state: ClusterState, address: str, timeout: float = 30) -> dict[str, str] | None:
    """The nodes the GCS at ``address`` lists as alive, node id -> address ("-" for a Ray
    node that no provider started); None if it did not answer within ``timeout``."""
    env = dict(os.environ, **cluster_env(state))
    env.pop("RAY_ADDRESS", None)
    try:
        proc = subprocess.run(
            python_m(sys.executable, GCS_PROBE, address),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return None
    if proc.returncode != 0:
        return None
    return dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)


#: Seconds the srun that signals one node's process may take.
SIGNAL_TIMEOUT = 60.0


def signal_node(state: ClusterState, node_id: str, job_id: str) -> None:
    """Stop one node of a multi-node step or job (``job_id``): SIGTERM to its node_run, by
    the PID it recorded, and only while that PID is still that process
    (``process_identity``); nothing when it recorded none."""
    command = signal_command(state.read_marker(node_id, Marker.PID) or "")
    slurm_node = state.temp_dirs(node_id)[0]  # where its node_run runs
    if command is None or not slurm_node:
        return
    argv = srun_argv(job_id, [slurm_node], command, immediate=slurm_timeout())
    proc = run_step(
        argv, f"stopping node {node_id} (an srun to {slurm_node} in job {job_id})", SIGNAL_TIMEOUT
    )
    if proc.returncode == 3:
        logger.info("node %s: its recorded process has already ended; nothing signalled", node_id)


class TeardownError(LaunchError):
    """The cluster's steps could not be shown to have ended: its state is kept."""


def teardown(state: ClusterState) -> list[str]:
    """The end of a cluster of fixed nodes (``ray down``, the end of ``eray-provider run``
    and of ``auto_ray_cluster``); returns the ids of the steps it cancelled.

    Mark the cluster stopping (launches refuse from then on), cancel its steps until SLURM
    lists none of them, remove the nodes' temp dirs, and only then delete the state, under
    the lock. When SLURM cannot be reached the state is kept (steps may still run: the
    state is how a later teardown finds them) and ``TeardownError`` says so.
    """
    if not state.exists():
        return []
    with state.lock(timeout=300):
        state.mark_stopping()
    try:
        ours = stop_cluster(state)
    except (SlurmCommandError, LaunchError, subprocess.SubprocessError, OSError) as e:
        raise TeardownError(
            f"could not stop cluster {state.cluster_name!r} of job {state.job_id}: {e}. Its steps "
            f"may still run, so its state is kept in {state.dir}: run `ray down` (or the "
            "teardown) again when SLURM answers"
        ) from e
    with state.lock(timeout=300):
        state.remove()
    return ours


def stop_cluster(state: ClusterState) -> list[str]:
    """Cancel every step of this cluster and remove the nodes' temp dirs; returns step ids.

    A step whose srun was started just before the teardown began may not be listed by
    squeue yet: until every step launched in the last ``STEP_GRACE_SECONDS`` has been
    seen (and cancelled), squeue is asked again. Raises ``SlurmCommandError`` when squeue
    or scancel cannot answer: not knowing is never taken for "nothing runs"."""
    launched = {
        rec.step_name: rec.launched
        for rec in state.records().values()
        if rec.launched and rec.step_name and not (rec.elastic or rec.terminated)
    }
    cancelled: list[str] = []
    seen: set[str] = set()
    while True:
        steps = list_steps(state.job_id)
        if steps is None:
            return cancelled  # SLURM says the job has ended: it ended every process of it
        ours = {sid: name for sid, name in steps.items() if is_cluster_step(name, state.cluster_name)}
        cancel_steps(list(ours), state.job_id, wait=90)
        cancelled += ours
        seen.update(ours.values())
        unseen = [t for name, t in launched.items() if name not in seen and not _ended(state, name)]
        if not unseen or time.time() - max(unseen) > STEP_GRACE_SECONDS:
            break
        if job_state(state.job_id) != "RUNNING":
            break  # the job is ending (scancel, time limit): no step of it can start now
        time.sleep(1)
    _remove_temp_dirs(state)
    return cancelled


def _ended(state: ClusterState, step: str) -> bool:
    """Every node of the step recorded its exit: the step ran, so it is not one that
    squeue has yet to list."""
    markers = state.markers()
    ids = [i for i, rec in state.records().items() if rec.step_name == step]
    return bool(ids) and all(Marker.EXIT.file(i) in markers for i in ids)


def _remove_temp_dirs(state: ClusterState) -> None:
    """One srun over the nodes that recorded a temp dir; each removes only its own.

    The per-node script is a file in the state dir (every node sees it), not an
    argument: for thousands of nodes an argument would exceed the kernel's limit."""
    per_node: dict[str, list[str]] = {}
    # nodes of other jobs (elastic workers) clean up after themselves
    records = state.records()
    outside = {i for i, rec in records.items() if rec.elastic}
    for node_id in sorted(Marker.TMPDIR.node_ids(state.markers()) - outside):
        node, paths = state.temp_dirs(node_id)
        if node and paths:
            per_node.setdefault(node, []).extend(paths)
    container = state.container()
    if container is not None:  # every node of the job: the port probe made it on each
        for node in _job_nodes(state):
            per_node.setdefault(node, [])
    if not per_node:
        return
    lines = [f"  {shlex.quote(n)}) gone {' '.join(map(shlex.quote, p))};;" for n, p in per_node.items()]
    remove = remove_container(container.name) if container is not None else ""
    script = state.save_file(
        "cleanup.sh", REMOVE_DIRS + remove + 'case "$SLURMD_NODENAME" in\n' + "\n".join(lines) + "\nesac\n"
    )
    nodes = sorted(per_node)
    name = step_name(state.cluster_name, "cleanup")
    argv = srun_argv(state.job_id, nodes, ["bash", str(script)], name=name)
    what = (
        f"the temp dir cleanup (step {name} of job {state.job_id} on {len(nodes)} node(s): {compress(nodes)})"
    )
    proc = run_step(argv, what, CLEANUP_TIMEOUT)
    if proc.returncode == 0:
        return
    error = f"{what} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}"
    if job_state(state.job_id) == "RUNNING":
        raise LaunchError(error)  # a teardown run again can still reach the nodes
    # the job is ending (scancel, its time limit): no step can start any more, and SLURM
    # has ended every process; each node_run removes its own dir when its Ray ends
    print(f"eray-provider: warning: {error}; the job has ended, so it is left there", file=sys.stderr)


def wait_joined(
    state: ClusterState,
    watch: AliveWatch,
    node_ids: Sequence[str],
    timeout: float,
    stopped=lambda: False,
    say: Callable[[str], None] | None = None,
    already: int = 0,
) -> None:
    """Until ``watch`` (from ``wait_head_ready``) sees every node of ``node_ids`` alive.
    Raises ``LaunchError`` when one of them exited, ``TimeoutError`` naming the SLURM nodes
    missing after ``timeout``. ``say``: where the progress goes (``join_progress``),
    ``already`` nodes counted alive besides these (the head, when the workers are waited
    for)."""

    def failed() -> str | None:
        markers = state.markers()
        gone = [i for i in node_ids if Marker.EXIT.file(i) in markers]
        if gone:
            return f"node(s) {gone} exited while joining; see {state.logs}"
        records = state.records()
        ended = [i for i in node_ids if i in records and records[i].terminated]
        return f"node(s) {ended} were terminated while joining" if ended else None

    progress = None
    if say is not None:
        records = state.records()
        progress = JoinProgress(
            node_ids,
            {i: records[i].slurm_node or i for i in node_ids if i in records},
            state.markers,
            lambda i: state.read_marker(i, Marker.EXIT),
            say,
            already=already,
        )
    on_poll = progress.joined if progress is not None else lambda joined: None
    missing = watch.wait(node_ids, timeout, failed, stopped, on_poll)
    if missing:
        records = state.records()
        names = sorted(records[i].slurm_node if i in records else i for i in missing)
        raise ClusterTimeoutError(f"node(s) {names} did not join within {timeout:.0f} s; see {state.logs}")
