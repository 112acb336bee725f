"""``eray-provider logs CLUSTER``: the Ray logs of a cluster's nodes, live or ended.

A node whose Ray ended left its logs in the cluster's state dir (``node_logs``), and
they are read there, also after ``ray down`` and after the job. A node whose Ray still
runs is read where its logs are, on the node's local disk: ``python -m
eray_provider.runtime.node_logs`` runs there as a step of the node's job (``srun --overlap``,
named as a step of the cluster, so a teardown ends it), printing or following (``tail
-F``) the files. All live nodes of one job are read by one step (each task writes its
node's logs to a file of its own, printed here in node order), at most ``LIVE_FANOUT``
jobs at once: a cluster of 10,000 nodes is read in one step, not 10,000. ``--follow``
ends with the node's Ray, or on Ctrl-C; no step outlives this command.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..plan.markers import Marker
from ..plan.modules import NODE_LOGS, python_m
from ..plan.names import check_cluster_name, step_name
from ..slurm.client import slurm_timeout
from ..slurm.srun import spawn_step, srun_argv, stop_foreground_step
from .cluster_state import ClusterState
from .node_logs import DEFAULT_COMPONENTS, check_components, collected, show
from .process_identity import parse_identity
from .stop_signals import StopSignal, shielded, stop_signals_raise

#: Seconds the live nodes of one batch of jobs may take to print their logs (``--follow``
#: has no limit but the job).
LIVE_READ_TIMEOUT = 120.0
#: Jobs whose live nodes are read at once (one step each; an elastic cluster has a job per
#: worker).
LIVE_FANOUT = 16


def logs_step_name(cluster: str) -> str:
    """A name for one read's step, unique across login nodes (not a pid, which another
    login node may share): a teardown of the cluster still finds it by its prefix."""
    return step_name(cluster, f"logs.{secrets.token_hex(6)}")


@dataclass(frozen=True)
class NodeLogs:
    """Where one node's logs are: collected into ``path``, or live in its private dir
    ``path`` on ``slurm_node``, reached as a step of ``slurm_job``."""

    node_id: str
    slurm_node: str
    slurm_job: str
    live: bool
    path: str
    session: str = ""

    @property
    def title(self) -> str:
        where = "live" if self.live else f"collected, {self.session}"
        return f"{self.node_id} on {self.slurm_node or '?'} ({where})"


def find_cluster(base: Path, cluster: str, job: str | None, dirs: list[tuple[str, str, Path]]) -> str:
    """The job of ``cluster`` to read: ``job`` when given, else the one whose cluster runs
    (its state is there), else the one torn down last; the newest state first when there
    are several. Not the highest job id: a controller whose state was reset hands out
    low ids again. A ValueError names what exists."""
    check_cluster_name(cluster, "CLUSTER")
    mine = [(j, path) for name, j, path in dirs if name == cluster]
    jobs = sorted((j for j, _ in mine), key=int)
    if not jobs:
        raise ConfigError(f"no cluster {cluster!r} under {base} (`eray-provider status` lists them)")
    if job is not None:
        if job not in jobs:
            raise ConfigError(
                f"--job {job!r}: cluster {cluster!r} has state of job(s) {', '.join(jobs)} only"
            )
        return job
    chosen = max(mine, key=lambda m: _recency(m[1]))[0]
    if len(jobs) > 1:
        print(
            f"eray-provider: cluster {cluster!r} has state of jobs {', '.join(jobs)}: showing {chosen} "
            "(--job picks another)",
            file=sys.stderr,
        )
    return chosen


def _recency(path: Path) -> tuple[bool, float]:
    """(whether its cluster runs, when its state or logs last changed)."""
    state = path / "state.json"
    try:
        return True, state.stat().st_mtime
    except OSError:
        pass
    try:
        return False, path.stat().st_mtime
    except OSError:
        return False, 0.0


def node_logs(state: ClusterState) -> list[NodeLogs]:
    """Every node with logs to show: its collected logs once its Ray ended (the newest
    session), else its live dir."""
    out: dict[str, NodeLogs] = {}
    for c in collected(state.dir):
        meta = c.meta
        out[c.node_id] = NodeLogs(
            c.node_id,
            str(meta.get("slurm_node", "")),
            str(meta.get("slurm_job", "")),
            False,
            str(c.path),
            c.session,
        )
    if state.exists():
        markers = state.markers()
        for node_id, rec in state.records().items():
            if rec.terminated or Marker.EXIT.file(node_id) in markers:
                continue
            slurm_node, dirs = state.temp_dirs(node_id)
            if dirs:
                job = rec.slurm_job or state.job_id
                out[node_id] = NodeLogs(node_id, slurm_node, job, True, dirs[-1])
    return sorted(out.values(), key=lambda n: n.node_id)


def pick(nodes: list[NodeLogs], node: str | None) -> list[NodeLogs]:
    """The nodes ``--node`` names (a node id or a SLURM node); all when None."""
    if node is None:
        return nodes
    chosen = [n for n in nodes if node in (n.node_id, n.slurm_node)]
    if not chosen:
        have = ", ".join(f"{n.node_id} ({n.slurm_node})" for n in nodes) or "none"
        raise ConfigError(f"--node {node!r} has no logs here; nodes with logs: {have}")
    return chosen


def _python(state: ClusterState) -> str:
    return str(state.cluster_config().get("provider", {}).get("python") or sys.executable)


def _stop_steps(running: list[tuple[str, str, subprocess.Popen]]) -> None:
    """End the steps this read started (each bounded by ``stop_foreground_step``)."""
    with shielded():  # a second Ctrl-C must not cut this
        for job, name, proc in running:
            stop_foreground_step(proc, job, name)


def _follow(state: ClusterState, n: NodeLogs, components: list[str]) -> int:
    """Follow a live node's logs through a step of its job until its Ray ends; the step
    ends with this, also on Ctrl-C."""
    command = python_m(_python(state), NODE_LOGS, n.path, "--title", n.title, "--follow")
    command += [f"--component={c}" for c in components]
    pid = parse_identity(state.read_marker(n.node_id, Marker.PID))
    if pid is not None:
        command.append(f"--pid={pid[0]}")  # tail ends with the node's Ray
    name = logs_step_name(state.cluster_name)
    argv = srun_argv(n.slurm_job, [n.slurm_node], command, name=name, immediate=slurm_timeout())
    sys.stdout.flush()
    proc = spawn_step(argv)
    try:
        return proc.wait()
    finally:
        _stop_steps([(n.slurm_job, name, proc)])


def _read_live(state: ClusterState, nodes: list[NodeLogs], components: list[str]) -> int:
    """Print the logs of live nodes: one step per job over all its nodes, ``LIVE_FANOUT``
    jobs at a time, each task's output in a file of its own (in the state dir, which the
    nodes see), printed in node order once its step ended."""
    by_job: dict[str, dict[str, list[list[str]]]] = {}
    for n in nodes:
        by_job.setdefault(n.slurm_job, {}).setdefault(n.slurm_node, []).append([n.path, n.title])
    jobs = list(by_job.items())
    python = _python(state)
    out = Path(tempfile.mkdtemp(prefix=".logs-read-", dir=state.dir))
    status = 0
    try:
        for i in range(0, len(jobs), LIVE_FANOUT):
            running: list[tuple[str, str, subprocess.Popen]] = []
            try:
                for job, hosts in jobs[i : i + LIVE_FANOUT]:
                    mapping = out / f"{job}.json"
                    mapping.write_text(json.dumps(hosts))
                    command = python_m(python, NODE_LOGS, "--map", str(mapping))
                    command += [f"--component={c}" for c in components]
                    name = logs_step_name(state.cluster_name)
                    argv = srun_argv(
                        job,
                        list(hosts),
                        command,
                        name=name,
                        immediate=slurm_timeout(),
                        output=str(out / f"{job}.%N"),
                    )
                    proc = spawn_step(argv)
                    running.append((job, name, proc))
                deadline = time.monotonic() + LIVE_READ_TIMEOUT
                for job, _name, proc in running:
                    try:
                        status = max(status, proc.wait(timeout=max(0.0, deadline - time.monotonic())))
                    except subprocess.TimeoutExpired:
                        print(
                            f"eray-provider: reading the logs of job {job}'s nodes took over "
                            f"{LIVE_READ_TIMEOUT:.0f} s",
                            file=sys.stderr,
                        )
                        status = 1
                    for host in by_job[job]:
                        _print_file(out / f"{job}.{host}", f"{host} (job {job})")
            finally:
                _stop_steps(running)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return status


def _print_file(path: Path, what: str) -> None:
    try:
        with open(path, errors="replace") as f:
            shutil.copyfileobj(f, sys.stdout)
    except FileNotFoundError:
        print(f"eray-provider: no output from {what}", file=sys.stderr)


def show_logs(
    base: Path,
    cluster: str,
    job: str | None,
    dirs: list[tuple[str, str, Path]],
    node: str | None = None,
    components: list[str] | None = None,
    follow: bool = False,
) -> int:
    """Print the logs; returns the exit status (1: nothing to show, or a node not read;
    128 + the signal: stopped by Ctrl-C, SIGTERM or SIGHUP, after the steps it held ended)."""
    try:
        with stop_signals_raise():
            return _show_logs(base, cluster, job, dirs, node, components, follow)
    except StopSignal as e:
        return e.exit_status


def _show_logs(
    base: Path,
    cluster: str,
    job: str | None,
    dirs: list[tuple[str, str, Path]],
    node: str | None,
    components: list[str] | None,
    follow: bool,
) -> int:
    components = check_components(components or []) or list(DEFAULT_COMPONENTS)
    job = find_cluster(base, cluster, job, dirs)
    state = ClusterState(cluster, job, base)
    chosen = pick(node_logs(state), node)
    if not chosen:
        print(f"eray-provider: cluster {cluster!r} of job {job}: no node logs here", file=sys.stderr)
        return 1
    if follow:
        live = [n for n in chosen if n.live]
        if len(live) != 1 or len(chosen) != 1:
            raise ConfigError(
                "--follow follows one live node: name it with --node (live: "
                f"{', '.join(n.node_id for n in live) or 'none'})"
            )
        return _follow(state, live[0], components)
    for n in chosen:
        if not n.live and show(Path(n.path), components, n.title) == 0:
            print(
                f"eray-provider: {n.title}: no {'/'.join(components)} logs were collected",
                file=sys.stderr,
            )
    live = [n for n in chosen if n.live]
    return _read_live(state, live, components) if live else 0
