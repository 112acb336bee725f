"""``eray-provider status``: every cluster of the user, read from the state dirs, one
``squeue`` and each running head's GCS; ``--prune`` removes what ended jobs left.

Clusters are found from the state dirs (``<base>/<cluster>-<job>``, see
``cluster_state``), not from the shell's environment, so a login node sees every
cluster the user started anywhere on the shared file system. One ``squeue`` lists all
of the user's jobs (``-t all``: jobs that ended recently too, with their final state).
The GCS of each head whose job runs is asked, in parallel, which node ids are alive
(``gcs_probe``, with the cluster's token, bounded by ``GCS_TIMEOUT``). What the facts
mean is decided in ``cluster_status``.
"""

from __future__ import annotations

import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from filelock import Timeout

from ..errors import ClusterError
from ..plan.cluster_status import ClusterStatus, down_status, summarize, unreadable_status
from ..plan.markers import Marker
from ..plan.names import check_cluster_name, default_base
from ..slurm.client import SlurmCommandError, known_cluster_name
from ..slurm.squeue import JobInfo
from .cluster_state import ClusterState
from .launch import gcs_alive
from .node_logs import collected, logs_root
from .slurm_jobs import user_jobs

#: Seconds one head's GCS may take to answer ``status``.
GCS_TIMEOUT = 20.0


class PruneError(ClusterError):
    """Nothing was pruned: SLURM could not say which jobs ended."""


def state_dirs(base: Path) -> list[tuple[str, str, Path]]:
    """(cluster, job, dir) of every cluster dir under ``base``: ``<cluster>-<job>``, ours,
    not a link, holding a state file or collected node logs."""
    found = []
    try:
        entries = sorted(os.scandir(base), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    for entry in entries:
        name, sep, job = entry.name.rpartition("-")
        if not sep or not job.isdigit() or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            check_cluster_name(name)
        except ValueError:
            continue
        if entry.stat(follow_symlinks=False).st_uid != os.getuid():
            continue
        path = Path(entry.path)
        if (path / "state.json").exists() or logs_root(path).is_dir():
            found.append((name, job, path))
    return found


def _read_markers(state: ClusterState, kind: Marker) -> dict[str, str]:
    out = {}
    for node_id in sorted(kind.node_ids(state.markers())):
        value = state.read_marker(node_id, kind)
        if value is not None:
            out[node_id] = value
    return out


def _facts(state: ClusterState) -> dict:
    """Everything the state dir says of one cluster, read once."""
    try:
        provider = state.cluster_config().get("provider", {})
    except (OSError, ValueError):
        provider = {}
    return {
        "doc": state.read(),
        "ips": _read_markers(state, Marker.IP),
        "exits": _read_markers(state, Marker.EXIT),
        "drains": _read_markers(state, Marker.DRAIN),
        "markers": state.markers(),
        "provider": provider,
        "plan": state.ports(),
    }


def gather(base: Path | None = None) -> list[ClusterStatus]:
    """The status of every cluster under ``base`` (default: the state base)."""
    base = base or default_base()
    dirs = state_dirs(base)
    jobs: dict[str, JobInfo] | None
    squeue_error = ""
    try:
        jobs = user_jobs(ended_too=True) if dirs else {}
    except SlurmCommandError as e:
        jobs, squeue_error = None, str(e)
    here = known_cluster_name(os.environ) if dirs else None

    def one(entry: tuple[str, str, Path]) -> ClusterStatus:
        name, job, path = entry
        try:
            return _one(ClusterState(name, job, base), jobs, squeue_error, here)
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            return unreadable_status(name, job, str(path), f"{type(e).__name__}: {e}")

    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(one, dirs))


def _one(
    state: ClusterState, jobs: dict[str, JobInfo] | None, squeue_error: str, here: str | None
) -> ClusterStatus:
    logs = collected(state.dir)
    nodes = sorted({c.node_id for c in logs})
    if not state.exists():
        clusters = {c.meta.get("slurm_cluster") for c in logs} - {None, ""}
        same = not clusters or clusters == {here}
        return down_status(state.cluster_name, state.job_id, str(state.dir), nodes, jobs, same)
    facts = _facts(state)
    common = dict(
        facts,
        jobs=jobs,
        state_dir=str(state.dir),
        token_file=str(state.token_path),
        logs=nodes,
        squeue_error=squeue_error,
        slurm_cluster=here,
    )
    first = summarize(**common, alive=None)
    if first.state != "unreachable":
        return first
    # the job runs and a head is recorded: ask its GCS
    alive = gcs_alive(state, first.head_address, timeout=GCS_TIMEOUT) if first.head_address else None
    error = "" if alive is not None else f"no answer within {GCS_TIMEOUT:.0f} s"
    return summarize(**common, alive=alive, gcs_error=error if first.head_address else "no address recorded")


def prune(statuses: list[ClusterStatus]) -> tuple[list[str], list[str]]:
    """Remove the state dirs (node logs included) of the clusters whose job SLURM says is
    over; returns (the dirs removed, what could not be removed and why). ``PruneError``
    when squeue did not answer: nothing is removed on a guess."""
    if any(s.state == "unknown" for s in statuses):
        raise PruneError("squeue did not answer, so no job is known to have ended: nothing was pruned")
    removed, failed = [], []
    for st in statuses:
        if not st.prunable:
            continue
        state = ClusterState(st.name, st.job_id, Path(st.state_dir).parent)
        try:
            with state.lock(timeout=30, creating=True):
                shutil.rmtree(state.dir)
        except (OSError, RuntimeError, Timeout) as e:
            failed.append(f"{st.state_dir}: {type(e).__name__}: {e}")
            continue
        removed.append(st.state_dir)
    return removed, failed


def _cell(value: object) -> str:
    return "-" if value in (None, "") else str(value)


def format_table(statuses: list[ClusterStatus], base: Path | None = None) -> str:
    """The clusters as a table for people, each followed by its problems."""
    if not statuses:
        return f"no clusters (state dirs under {base or default_base()})"
    rows = [("CLUSTER", "JOB", "KIND", "STATE", "NODES", "HEAD", "TIME LEFT")]
    for st in statuses:
        alive = "?" if st.alive is None else str(st.alive)
        nodes = "-" if st.state in ("down", "ended") else f"{alive}/{st.expected}"
        rows.append(
            (st.name, st.job_id, st.kind, st.state, nodes, _cell(st.head_address), _cell(st.time_left))
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(rows[0], widths)).rstrip()]
    for st, row in zip(statuses, rows[1:]):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if st.dashboard and st.state not in ("ended", "down"):
            lines.append(f"    dashboard {st.dashboard}  token {st.token_file}")
        lines += [f"    ! {p}" for p in st.problems]
        lines += [
            f"    draining {n.node_id} ({n.slurm_node or n.slurm_job}) {n.draining}"
            for n in st.nodes
            if n.draining and n.state == "alive"
        ]
        lines += [f"    {n.node_id} {n.state} {n.detail}" for n in st.nodes if n.state == "replacing"]
        if st.logs:
            lines.append(
                f"    logs of {len(st.logs)} node(s): eray-provider logs {st.name} --job {st.job_id}"
            )
    return "\n".join(lines)


def to_json(statuses: list[ClusterStatus]) -> str:
    return json.dumps([s.to_dict() for s in statuses], indent=2, sort_keys=True)
