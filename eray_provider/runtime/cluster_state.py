"""Per-cluster state on disk: node records and tags, port plan, auth token, node markers.

Ray builds a new provider object in every CLI process and in the head's monitor, so
all state lives in one directory per cluster and job, ``<base>/<cluster>-<job>``, mode
0700, on a file system every node and the launcher see (the user's HOME on a cluster).
Writes go through a lock file and atomic renames; reads are cached by mtime so the
autoscaler's per-round calls cost a ``stat`` and no subprocess.

Layout::

    state.json        node records (plan.node_record), the next generation, elastic
                      node configs, refused node types, the teardown's start
    ports.json        the port plan chosen for the job (every node reads it)
    container.json    how steps reach the cluster's container (provider.container), if any
    auth_token        Ray token, mode 0600
    cluster.json      the filled cluster config (setup commands, resources)
    home/             HOME of the cluster's Ray processes (ray_bootstrap_config.yaml)
    logs/             output of the srun clients that hold the Ray steps
    nodes/<id>.ip     address a node's Ray runs on, written by the node
    nodes/<id>.tmpdir its private temp dir on that node, for teardown
    nodes/<id>.exit   written when a node's Ray ends (exit code)
    ray-logs/         each node's Ray logs, copied there when its Ray ends (node_logs);
                      the only part a teardown keeps
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from filelock import FileLock

from ..errors import ClusterError
from ..plan.container import ContainerPlan
from ..plan.markers import Marker
from ..plan.names import LOGS_DIR, check_cluster_name, default_base
from ..plan.node_record import NodeRecord, Requested, parse_records
from ..plan.ports import PortPlan
from ..plan.sbatch import elastic_node_id

T = TypeVar("T")

#: Another process's write is seen by readers at most this late.
READ_FRESH_SECONDS = 0.5


class ClusterStoppingError(ClusterError):
    """A launch was asked of a cluster whose teardown has begun."""


def remove_state_dir(path: Path) -> None:
    """Delete a cluster's state dir but the node logs collected into it (``node_logs``),
    which outlive the cluster until ``eray-provider status --prune``; the dir itself goes
    when there are none."""
    logs = path / LOGS_DIR
    if logs.is_dir() and not logs.is_symlink() and any(logs.iterdir()):
        for entry in path.iterdir():
            if entry.name == LOGS_DIR:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def _write_private(path: Path, text: str, mode: int = 0o600) -> None:
    """Atomic write of a file only the owner can read."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` with mode 0700, refusing a symlink or a directory of another user."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not Path(path).is_dir() or Path(path).is_symlink():
        raise ClusterError(f"{path} is not a plain directory")
    if st.st_uid != os.getuid():
        raise ClusterError(f"{path} belongs to uid {st.st_uid}, not to us ({os.getuid()})")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


class ClusterState:
    """The on-disk state of one cluster of one job."""

    def __init__(self, cluster_name: str, job_id: str, base: str | Path | None = None) -> None:
        self.cluster_name = check_cluster_name(cluster_name)
        self.job_id = str(job_id)
        self.base = Path(base) if base else default_base()
        self.dir = self.base / f"{cluster_name}-{self.job_id}"
        self._cache: tuple[float, dict[str, Any]] | None = None
        self._checked = 0.0
        self._state_file = str(self.dir / "state.json")
        self._lock: FileLock | None = None
        self._markers: tuple[float, frozenset[str]] | None = None
        self._records: tuple[dict[str, Any], dict[str, NodeRecord]] | None = None

    # ---------------------------------------------------------------- paths
    @property
    def home(self) -> Path:
        return self.dir / "home"

    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    @property
    def node_dir(self) -> Path:
        return self.dir / "nodes"

    @property
    def token_path(self) -> Path:
        return self.dir / "auth_token"

    @property
    def state_path(self) -> Path:
        return self.dir / "state.json"

    def exists(self) -> bool:
        return self.state_path.exists()

    @contextmanager
    def lock(self, timeout: float = 60, creating: bool = False) -> Iterator[None]:
        """The cluster's lock, reentrant within a thread (one FileLock per state object).

        Reads inside it see every write another process made before it was acquired. Of a
        cluster torn down (no state file) it is ``ClusterStoppingError``, unless
        ``creating`` (the caller creates the state, or removes what is left): a process
        that outlived the teardown must not bring its state back."""
        if not creating and not self.exists():
            raise self._gone()
        if self._lock is None:
            self._ensure_dir()
            self._lock = FileLock(str(self.dir / ".lock"))
        try:
            held = self._lock.acquire(timeout=timeout)
        except FileNotFoundError:  # the dir was removed while we waited
            if creating:
                raise
            self._lock = None
            raise self._gone() from None
        with held:
            self._cache = None
            if not creating and not self.exists():
                self._drop_recreated_lock()
                raise self._gone()
            yield

    def _drop_recreated_lock(self) -> None:
        """Remove the dir a waiter's lock file brought back. A process that waited on the
        lock while another removed the state (two `ray down` at once) re-creates the dir
        and its ``.lock`` when it retries (filelock makes the lock file's parents): left,
        they would make a torn-down cluster look half there (a waiter that retries after
        the dir is gone gets ``FileNotFoundError`` instead). Called holding the lock."""
        try:
            if [entry.name for entry in self.dir.iterdir()] == [".lock"]:
                (self.dir / ".lock").unlink()
                self.dir.rmdir()
        except OSError:
            pass  # another process put something there meanwhile: it is theirs
        self._lock = None

    def _gone(self, what: str = "written") -> ClusterStoppingError:
        return ClusterStoppingError(
            f"cluster {self.cluster_name!r} of job {self.job_id} has been torn down ({self.state_path} "
            f"is gone): nothing is {what}"
        )

    def create(self, slurm_cluster: str | None = None) -> None:
        """Create the directory tree, a fresh token and empty state (idempotent).

        ``slurm_cluster``: the SLURM cluster the job is of, recorded in a new state: job
        ids of two SLURM clusters that share a HOME are unrelated (``eray-provider
        status`` judges a cluster by its own controller's answer only)."""
        self._ensure_dir()
        for sub in (self.home, self.logs, self.node_dir):
            ensure_private_dir(sub)
        if not self.token_path.exists():
            _write_private(self.token_path, secrets.token_hex(32))
        if not self.state_path.exists():
            doc: dict[str, Any] = {"cluster_name": self.cluster_name, "job_id": self.job_id, "nodes": {}}
            if slurm_cluster:
                doc["slurm_cluster"] = slurm_cluster
            self.write(doc)

    def _ensure_dir(self) -> None:
        """The state dir, private; the base is made or checked with a new state dir only:
        an existing one was made in a private base, and in a container (where only the
        state dir is mounted) the base is the image's read-only mount point."""
        if not self.dir.is_dir():
            ensure_private_dir(self.base)
        ensure_private_dir(self.dir)

    def remove(self) -> None:
        """Delete the cluster's state (``remove_state_dir``)."""
        remove_state_dir(self.dir)
        self._cache = None
        self._lock = None

    # ---------------------------------------------------------------- state.json
    def read(self) -> dict[str, Any]:
        """The state document; cached until the file's mtime changes, and for
        ``READ_FRESH_SECONDS`` without even a stat (the autoscaler asks for every node's
        tags in one round; writes by this process are seen at once)."""
        now = time.monotonic()
        if self._cache is not None and now - self._checked < READ_FRESH_SECONDS:
            return self._cache[1]
        try:
            mtime = os.stat(self._state_file).st_mtime_ns
        except FileNotFoundError:
            return {"cluster_name": self.cluster_name, "job_id": self.job_id, "nodes": {}}
        self._checked = now
        if self._cache is None or self._cache[0] != mtime:
            doc = json.loads(self.state_path.read_text())
            if str(doc.get("job_id")) != self.job_id:
                raise ClusterError(f"{self.state_path} belongs to job {doc.get('job_id')}, not {self.job_id}")
            self._cache = (mtime, doc)
        return self._cache[1]

    def records(self) -> Mapping[str, NodeRecord]:
        """The node records by id, typed (``plan.node_record``); parsed once per document
        read, so the same object is returned while the document stays cached (the
        autoscaler's views are keyed by its identity; ``lock()`` and a changed file make
        a new one). Do not mutate it: change records through the named transitions."""
        doc = self.read()
        if self._records is None or self._records[0] is not doc:
            self._records = (doc, parse_records(doc["nodes"]))
        return self._records[1]

    def write(self, doc: dict[str, Any]) -> None:
        _write_private(self.state_path, json.dumps(doc, indent=1, sort_keys=True))
        self._cache = None

    def update(self, fn: Callable[[dict[str, Any], dict[str, NodeRecord]], T]) -> T:
        """Read-modify-write under the lock: ``fn(doc, nodes)`` may change the document's
        other keys (a copy) and put new records into ``nodes`` (a copy of the mapping;
        records are frozen, so a changed one is a new object); returns what ``fn``
        returns. Records ``fn`` left alone are written back as they were read."""
        with self.lock():
            current = self.read()
            doc = json.loads(json.dumps({k: v for k, v in current.items() if k != "nodes"}))
            parsed = self.records()
            nodes = dict(parsed)
            result = fn(doc, nodes)
            raw = current["nodes"]
            doc["nodes"] = {i: raw[i] if parsed.get(i) is r else r.to_dict() for i, r in nodes.items()}
            self.write(doc)
            return result

    def _change(self, node_ids: Iterable[str], **changes: Any) -> None:
        """The same fields changed on every record of ``node_ids`` (all recorded)."""
        ids = list(node_ids)

        def change(_doc: dict[str, Any], nodes: dict[str, NodeRecord]) -> None:
            for node_id in ids:
                nodes[node_id] = replace(nodes[node_id], **changes)

        self.update(change)

    def add_nodes(self, specs: list[tuple[str, str, dict[str, str]]]) -> list[str]:
        """Append node records ``(slurm node, role, tags)`` in one locked write; returns their
        ids, ``<slurm node>.<generation>`` (a node started again gets a new id)."""

        def add(doc: dict[str, Any], nodes: dict[str, NodeRecord]) -> list[str]:
            ids = []
            for slurm_node, role, tags in specs:
                gen = doc.get("next_gen", 1)
                doc["next_gen"] = gen + 1
                node_id = f"{slurm_node}.{gen}"
                nodes[node_id] = NodeRecord(role, dict(tags), time.time(), slurm_node=slurm_node, gen=gen)
                ids.append(node_id)
            return ids

        return self.update(add)

    # ------------------------------------------------- node record transitions
    # Every change of a node record, named, as one locked read-modify-write.

    def mark_launched(self, node_ids: Sequence[str], step_name: str) -> None:
        """The nodes' step started (``step_name``, now)."""
        self._change(node_ids, step_name=step_name, launched=time.time())

    def set_tags(self, node_id: str, tags: Mapping[str, str]) -> None:
        """Ray's tags of a node, updated (a node no longer recorded is left alone)."""

        def apply(_doc: dict[str, Any], nodes: dict[str, NodeRecord]) -> None:
            if node_id in nodes:
                nodes[node_id] = replace(nodes[node_id], tags={**nodes[node_id].tags, **tags})

        self.update(apply)

    def mark_requested(self, node_id: str, tags: Mapping[str, str]) -> None:
        """A caller asked for this node again (a racing ``ray up`` adopts the head)."""
        self._change([node_id], requested=Requested(dict(tags), time.time()))

    def mark_terminated(self, node_ids: Iterable[str]) -> None:
        """Ray's autoscaler let these nodes go: their steps are cancelled."""
        self._change(node_ids, terminated=True)

    def add_job_nodes(
        self,
        node_type: str,
        node_config: dict[str, Any],
        jobs: Sequence[tuple[str, float]],
        nodes_per_job: int,
        tags: Mapping[str, str],
        replaces: str | None = None,
    ) -> None:
        """Elastic worker jobs submitted (``(job, when)``), ``nodes_per_job`` nodes each,
        in one write (a write per job is O(N) each); with ``replaces``, node ``i`` of each
        is the successor of node ``i`` of that job. The type's node config is kept, for
        the replacements the provider submits on its own."""

        def add(doc: dict[str, Any], nodes: dict[str, NodeRecord]) -> None:
            doc.setdefault("node_configs", {})[node_type] = node_config
            for job, at in jobs:
                for index in range(nodes_per_job):
                    node_id = elastic_node_id(job, index)
                    old_id = elastic_node_id(replaces, index) if replaces else ""
                    nodes[node_id] = NodeRecord("worker", dict(tags), at, slurm_job=job, replaces=old_id)
                    if old_id in nodes:
                        nodes[old_id] = replace(nodes[old_id], successor=node_id)

        self.update(add)

    def forget_replacements(self, pairs: Mapping[str, str]) -> None:
        """``new -> old`` replacement pairs that failed: neither names the other any more."""

        def forget(_doc: dict[str, Any], nodes: dict[str, NodeRecord]) -> None:
            for new, old in pairs.items():
                if new in nodes:
                    nodes[new] = replace(nodes[new], replaces="")
                if old in nodes and nodes[old].successor == new:
                    nodes[old] = replace(nodes[old], successor="")

        self.update(forget)

    def end_jobs(self, by_job: Mapping[str, Sequence[str]], requeued: Iterable[str]) -> None:
        """Elastic worker jobs the autoscaler let go (``job -> node ids``): ``requeued``
        ones hidden until they run again, the others terminated. A node not recorded (its
        record lost) is recorded as ended, so it is not adopted again."""
        again = set(requeued)

        def mark(_doc: dict[str, Any], nodes: dict[str, NodeRecord]) -> None:
            for job, ids in by_job.items():
                for node_id in ids:
                    rec = nodes.get(node_id) or NodeRecord("worker", {}, time.time(), slurm_job=job)
                    ended = replace(rec, requeued=True) if job in again else replace(rec, terminated=True)
                    nodes[node_id] = ended

        self.update(mark)

    def note_refused(self, refused: Mapping[str, tuple[str, str]]) -> None:
        """Node types whose job SLURM can never start (``type -> (job, reason)``): the
        provider refuses to submit them again for a while."""

        def note(doc: dict[str, Any], _nodes: dict[str, NodeRecord]) -> None:
            for node_type, (job, reason) in refused.items():
                doc.setdefault("refused", {})[node_type] = {"job": job, "reason": reason, "at": time.time()}

        self.update(note)

    # ---------------------------------------------------------------- stopping
    def mark_stopping(self) -> None:
        """Record, under the lock, that the cluster is being torn down: every launch
        checks it under the same lock and refuses, and a node whose step starts after
        it exits without starting Ray (``node_run``)."""
        if self.exists():
            self.update(lambda doc, _nodes: doc.__setitem__("stopping", time.time()))

    def stopping(self) -> bool:
        return bool(self.read().get("stopping"))

    def check_launchable(self, what: str = "launched") -> None:
        """Raise ``ClusterStoppingError`` when the cluster is being stopped; call it
        under the lock, just before a launch (``what``: the error's word for it)."""
        if not self.exists():
            raise self._gone(what)
        if self.stopping():
            raise ClusterStoppingError(
                f"cluster {self.cluster_name!r} of job {self.job_id} is being stopped (`ray down` "
                f"began): nothing is {what}; if no teardown runs any more, run `ray down` again "
                f"(state: {self.dir})"
            )

    # ---------------------------------------------------------------- ports / config / token
    def ports(self) -> PortPlan | None:
        path = self.dir / "ports.json"
        try:
            return PortPlan.from_dict(json.loads(path.read_text()))
        except FileNotFoundError:
            return None

    def save_ports(self, plan: PortPlan) -> None:
        _write_private(self.dir / "ports.json", plan.to_json())

    def container(self) -> ContainerPlan | None:
        """How the cluster's steps reach its container (``provider.container``), or None."""
        try:
            return ContainerPlan.from_dict(json.loads((self.dir / "container.json").read_text()))
        except FileNotFoundError:
            return None

    def container_args(self) -> tuple[str, ...]:
        """The runner's ``srun`` arguments of every step of the cluster on a node: an
        instance of its container (none without one)."""
        plan = self.container()
        return plan.args if plan else ()

    def save_container(self, plan: ContainerPlan) -> None:
        _write_private(self.dir / "container.json", plan.to_json())

    def claimed_temp_dir(self) -> str | None:
        """The head's temp dir, made private on every node by the port probe before its name
        could be seen (Rays before 2.55, whose workers take the head's path); None if none."""
        try:
            return (self.dir / "claimed_temp_dir").read_text() or None
        except FileNotFoundError:
            return None

    def save_claimed_temp_dir(self, path: str) -> None:
        _write_private(self.dir / "claimed_temp_dir", path)

    def save_file(self, name: str, text: str) -> Path:
        """A private file in the state dir (which every node sees); returns its path."""
        path = self.dir / name
        _write_private(path, text)
        return path

    def cluster_config(self) -> dict[str, Any]:
        return json.loads((self.dir / "cluster.json").read_text())

    def save_cluster_config(self, config: dict[str, Any]) -> None:
        _write_private(self.dir / "cluster.json", json.dumps(config, sort_keys=True))

    # ---------------------------------------------------------------- node markers
    def marker(self, node_id: str, kind: Marker) -> Path:
        return self.node_dir / Marker(kind).file(node_id)  # a kind that is no Marker raises

    def read_marker(self, node_id: str, kind: Marker) -> str | None:
        try:
            return self.marker(node_id, kind).read_text().strip()
        except FileNotFoundError:
            return None

    def write_marker(self, node_id: str, kind: Marker, value: str) -> None:
        _write_private(self.marker(node_id, kind), value)
        self._markers = None

    def drained(self) -> str | None:
        """The reason of a drain ``end_watch`` recorded for a node of the cluster (its
        job's end is near), or None."""
        for path in sorted(self.node_dir.glob(Marker.DRAIN.file("*"))):
            try:
                return json.loads(path.read_text())["message"]
            except (OSError, ValueError, KeyError):
                continue
        return None

    def write_temp_dirs(self, node_id: str, slurm_node: str, paths: Sequence[str]) -> None:
        """Record the SLURM node a node's process runs on and the temp dirs it uses there
        (the teardown removes them, for a process that could not), one per line."""
        self.write_marker(node_id, Marker.TMPDIR, "\n".join([slurm_node, *paths]))

    def temp_dirs(self, node_id: str) -> tuple[str, list[str]]:
        """(SLURM node, temp dirs) as ``write_temp_dirs`` recorded them; ("", []) if not."""
        node, *paths = (self.read_marker(node_id, Marker.TMPDIR) or "").splitlines() or [""]
        return node, [p for p in paths if p.startswith("/")]

    def markers(self) -> frozenset[str]:
        """Names of all marker files: one listdir at most every ``READ_FRESH_SECONDS``."""
        now = time.monotonic()
        if self._markers is not None and now - self._markers[0] < READ_FRESH_SECONDS:
            return self._markers[1]
        try:
            names = frozenset(os.listdir(self.node_dir))
        except FileNotFoundError:
            names = frozenset()
        if self._markers is None or self._markers[1] != names:
            self._markers = (now, names)
        else:
            self._markers = (now, self._markers[1])  # keep the identity: nothing changed
        return self._markers[1]
