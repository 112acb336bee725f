"""Ray's logs of a node: which files matter, what is kept of them when the node ends,
where they are kept, and how they are shown.

A node's Ray writes its logs in the node's private temp dir, on the node's local disk,
which the end of the job (or the site's temp cleaner) takes with it. When Ray ends on a
node (``ray down``, the end of ``eray-provider run``, the job's ``scancel`` or time
limit), ``node_run`` copies them into the cluster's state dir on the shared file system,
one dir per node and Ray session::

    <state dir>/ray-logs/<node id>/<session>/   the files, as under Ray's logs dir
    <state dir>/ray-logs/<node id>/<session>/node.json   what was kept, and of which node

At most ``provider.collect_logs_mb`` MiB (and ``MAX_FILES`` files) a node (0: nothing is
collected), the files that
explain a node's end first (raylet, GCS, autoscaler, dashboard), then workers' logs,
newest first. A file over a quarter of the cap, or over what is left of it, keeps its
last bytes, after a line that says how much was left out. All nodes of a cluster
together keep at most ``provider.collect_logs_total_mb`` MiB: a running total under a
lock (``ray-logs/.usage``) is what each collection may still take, and a node that finds
it spent collects nothing (said in its log). The teardown keeps
``ray-logs/`` when it deletes the rest of the state dir, so ``eray-provider logs`` shows
them after the job; ``eray-provider status --prune`` removes them with the rest.

``python -m eray_provider.runtime.node_logs DIR [--component C] [--follow]`` prints the logs of a
live node (``eray-provider logs`` runs it on the node, as a step of the node's job).
"""

from __future__ import annotations

import argparse
import codecs
import fcntl
import fnmatch
import json
import os
import re
import shutil
import stat
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ClusterError, ConfigError
from ..plan.modules import NODE_LOGS
from ..plan.names import LOGS_DIR, ray_temp_dir

#: The name of the dir of collected logs inside a cluster's state dir.
#: At most this many files a node (a node's many small worker logs: inodes on HOME).
MAX_FILES = 400
#: Sessions kept of one node id (``ray up`` after ``ray down`` in one job reuses ids).
KEEP_SESSIONS = 3
_SESSION = re.compile(r"session_[A-Za-z0-9_.-]+")
#: A file is not cut to fewer bytes than this: below it, the file is left out.
MIN_TAIL_BYTES = 4096

#: The components ``eray-provider logs --component`` names, by their files' names.
COMPONENTS: dict[str, tuple[str, ...]] = {
    "raylet": ("raylet.out", "raylet.err"),
    "gcs": ("gcs_server.out", "gcs_server.err"),
    "monitor": ("monitor.log", "monitor.out", "monitor.err"),
    "dashboard": ("dashboard.log", "dashboard.err", "dashboard_*.log", "dashboard_*.err"),
    "worker": ("worker-*.out", "worker-*.err", "python-core-worker-*.log"),
}
#: What a node's end is read from first, then these, then all else (newest first).
_FIRST = ("raylet", "gcs", "monitor", "dashboard")
_THEN = ("runtime_env*", "log_monitor*", "python-core-driver-*")
#: What ``eray-provider logs`` shows when no component is named.
DEFAULT_COMPONENTS = ("raylet", "gcs", "monitor")


def logs_root(state_dir: Path) -> Path:
    return Path(state_dir) / LOGS_DIR


def session_logs(ray_temp_dir: str | Path) -> tuple[str, Path] | None:
    """(session name, logs dir) of the newest Ray session under ``ray_temp_dir`` (Ray's
    ``--temp-dir``), from its ``session_latest`` link; None when Ray made none (or the
    link names no ``session_*`` dir of it)."""
    latest = Path(ray_temp_dir) / "session_latest"
    try:
        session = Path(os.readlink(latest)).name
    except OSError:
        return None
    if not _SESSION.fullmatch(session):
        return None
    logs = Path(ray_temp_dir) / session / "logs"
    return (session, logs) if logs.is_dir() and not logs.is_symlink() else None


def component_of(name: str) -> str | None:
    """The component a log file (its base name) belongs to, if any."""
    for comp, patterns in COMPONENTS.items():
        if any(fnmatch.fnmatch(name, p) for p in patterns):
            return comp
    return None


def _rank(rel: str) -> int:
    name = os.path.basename(rel)
    comp = component_of(name)
    if comp in _FIRST:
        return _FIRST.index(comp)
    if any(fnmatch.fnmatch(name, p) for p in _THEN):
        return len(_FIRST)
    return len(_FIRST) + (1 if comp == "worker" else 2)


def _files(root: Path) -> list[tuple[str, int, float]]:
    """(relative path, size, mtime) of the regular files under ``root``; no links."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
        for name in filenames:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if os.path.isfile(path) and not os.path.islink(path):
                out.append((os.path.relpath(path, root), st.st_size, st.st_mtime))
    return out


def plan_collection(
    files: Iterable[tuple[str, int, float]], cap_bytes: int, max_files: int = MAX_FILES
) -> list[tuple[str, int]]:
    """Which files to keep and how many of their last bytes: pure.

    In order of what explains a node's end, newest first within a rank; each file gets
    at most a quarter of the cap and what is left of it, and is left out (not listed)
    rather than cut below ``MIN_TAIL_BYTES``; at most ``max_files`` files."""
    per_file = max(cap_bytes // 4, MIN_TAIL_BYTES)
    left = cap_bytes
    keep = []
    for rel, size, _ in sorted(files, key=lambda f: (_rank(f[0]), -f[2], f[0])):
        take = min(size, per_file, left)
        if take < size and take < MIN_TAIL_BYTES:
            continue
        keep.append((rel, take))
        left -= take
        if len(keep) == max_files:
            break
    return keep


def open_regular(path: Path) -> int:
    """A read-only fd of a regular file, never through a link, never blocking on a FIFO
    put in its place: OSError for anything else."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    return fd


def _copy_tail(src: Path, dst: Path, take: int) -> bool:
    """Copy the last ``take`` bytes of ``src`` (whole lines, after a header when cut);
    returns whether it was cut."""
    dst.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with os.fdopen(open_regular(src), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        out_fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(out_fd, "wb") as out:
            if take >= size:
                out.write(f.read(take))  # what it held when planned: never more than planned
                return False
            f.seek(size - take)
            chunk = f.read(take)
            cut = chunk.find(b"\n") + 1  # start at a whole line
            out.write(f"[eray-provider: the first {size - take + cut} bytes left out]\n".encode())
            out.write(chunk[cut:])
            return True


def _write_meta(dest: Path, doc: Mapping[str, Any]) -> None:
    tmp = dest / f".node.json.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, dest / "node.json")


USAGE_FILE = ".usage"


@contextmanager
def _usage(root: Path) -> Iterator[list[int]]:
    """The cluster's collected bytes, ``[total]``, read and written back under an exclusive
    lock (one small file: nodes end at once, 10,000 of them)."""
    fd = os.open(root / USAGE_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        raw = os.read(fd, 64).decode(errors="replace").strip()
        total = [int(raw) if raw.isdigit() else 0]
        yield total
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, str(max(0, total[0])).encode())
    finally:
        os.close(fd)


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def collect(
    ray_temp_dir: str | Path,
    state_dir: Path,
    node_id: str,
    cap_bytes: int,
    meta: Mapping[str, Any],
    total_cap_bytes: int | None = None,
) -> Path | None:
    """Copy the newest session's logs of this node into the state dir; returns where.

    None when there was nothing to collect. Never creates the state dir: a cluster whose
    state was removed gets nothing back. ``node.json`` is written first (``complete``:
    false) and again at the end, and the files are copied in order of what matters, so a
    collection cut short by SIGKILL keeps what it had copied, and says so. Of each node,
    the newest ``KEEP_SESSIONS`` sessions are kept. With ``total_cap_bytes``, what all
    nodes keep together stays under it (``CapReached`` when it is spent)."""
    found = session_logs(ray_temp_dir)
    if found is None or cap_bytes <= 0:
        return None
    session, src = found
    root = logs_root(state_dir)
    _private_dir(root)  # no parents: FileNotFoundError if the state is gone
    _private_dir(root / node_id)
    dest = root / node_id / session
    files = _files(src)
    with _usage(root) as total:
        earlier = _size(dest) if dest.exists() else 0  # a session collected twice: the later copy
        if total_cap_bytes is not None:
            cap_bytes = min(cap_bytes, total_cap_bytes - (total[0] - earlier))
            if cap_bytes < MIN_TAIL_BYTES:  # raised before anything changed: the total holds
                raise CapReached(
                    f"the cluster's collected logs reached provider.collect_logs_total_mb "
                    f"({total_cap_bytes / 2**20:.0f} MiB): {node_id}'s were not collected"
                )
        if earlier:
            total[0] -= earlier
            shutil.rmtree(dest, ignore_errors=True)
        keep = plan_collection(files, cap_bytes)
        total[0] += sum(take for _, take in keep)  # reserved before copying
    _private_dir(dest)
    doc: dict[str, Any] = dict(
        meta,
        node_id=node_id,
        session=session,
        collected_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        cap_bytes=cap_bytes,
        complete=False,
        files=[rel for rel, _ in keep],
    )
    _write_meta(dest, doc)
    kept, cut = [], []
    for rel, take in keep:
        try:
            if _copy_tail(src / rel, dest / rel, take):
                cut.append(rel)
        except OSError:
            continue  # a file Ray removed meanwhile, or no regular file
        kept.append(rel)
    doc.update(complete=True, files=kept, cut=cut, left_out=sorted({f[0] for f in files} - set(kept)))
    _write_meta(dest, doc)
    old = sorted(p for p in (root / node_id).iterdir() if _SESSION.fullmatch(p.name))[:-KEEP_SESSIONS]
    if old:
        with _usage(root) as total:
            for path in old:
                total[0] -= _size(path)
                shutil.rmtree(path, ignore_errors=True)
    return dest


class CapReached(ClusterError):
    """The cluster-wide cap of collected logs is spent: this node's are not collected."""


def _private_dir(path: Path) -> None:
    """``path`` as a dir of ours, mode 0700, made without parents; not a link."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        if path.is_symlink() or not path.is_dir():
            raise OSError(f"{path} is not a directory of ours") from None


@dataclass(frozen=True)
class Collected:
    """One node's logs of one session, as collected into a state dir."""

    node_id: str
    session: str
    path: Path
    meta: dict[str, Any]


def collected(state_dir: Path) -> list[Collected]:
    """Every node's collected logs in ``state_dir``, by node id, then session."""
    root = logs_root(state_dir)
    out = []
    for node_dir in sorted(root.iterdir()) if root.is_dir() else []:
        if node_dir.is_symlink() or not node_dir.is_dir():
            continue
        for sess in sorted(node_dir.iterdir()):
            if not _SESSION.fullmatch(sess.name) or sess.is_symlink():
                continue
            try:
                meta = json.loads((sess / "node.json").read_text())
            except (OSError, ValueError):
                continue
            out.append(Collected(node_dir.name, sess.name, sess, meta))
    return out


def select(files: Iterable[str], components: Sequence[str]) -> list[str]:
    """The files (relative paths) of ``components``, in the order of ``COMPONENTS``."""
    chosen = [(list(COMPONENTS).index(c), f) for f in files if (c := component_of(os.path.basename(f)))]
    return [f for i, f in sorted(chosen) if list(COMPONENTS)[i] in components]


def component_files(root: Path, components: Sequence[str]) -> list[str]:
    """The files of ``components`` under ``root`` (relative paths), as ``select`` orders them."""
    return select((rel for rel, _, _ in _files(root)), components)


def check_components(names: Sequence[str]) -> list[str]:
    bad = [n for n in names if n not in COMPONENTS]
    if bad:
        raise ConfigError(f"--component {bad[0]!r} is not one of {', '.join(COMPONENTS)}")
    return list(names)


def show(root: Path, components: Sequence[str], title: str, out=None) -> int:
    """Print the files of ``components`` under ``root``, each after a header; returns how
    many files were printed."""
    out = out or sys.stdout
    files = component_files(root, components)
    for rel in files:
        out.write(f"==> {title}: {rel} <==\n")
        decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode
        try:
            f = os.fdopen(open_regular(root / rel), "rb")
        except OSError as e:
            out.write(f"[eray-provider: not shown: {e}]\n")
            continue
        with f:
            while chunk := f.read(1 << 20):
                out.write(decode(chunk))
        out.write(decode(b"", final=True) + "\n")
    out.flush()
    return len(files)


def _show_mapped(path: str, components: list[str]) -> int:
    """One task of a step over many nodes: the logs of every node the map (JSON,
    ``{slurm node: [[private dir, title], ...]}``) names for this host."""
    from ..slurm.env import node_name

    with open(path) as f:
        mine = json.load(f).get(node_name(os.environ), [])
    status = 0
    for private, title in mine:
        found = session_logs(ray_temp_dir(private))
        if found is None:
            print(f"no Ray session logs under {private}", file=sys.stderr)
            status = 1
            continue
        show(found[1], components, title)
    return status


def main(argv: list[str]) -> int:
    """On a live node: print (or follow) the logs of its Ray, whose private dir is given;
    with ``--map``, of every node of this host that a step over many nodes reads."""

    ap = argparse.ArgumentParser(prog=f"python -m {NODE_LOGS}")
    ap.add_argument("private_dir", nargs="?")
    ap.add_argument("--map", help="JSON: {slurm node: [[private dir, title], ...]}")
    ap.add_argument("--title", default="")
    ap.add_argument("--component", action="append", default=[])
    ap.add_argument("--follow", action="store_true")
    ap.add_argument("--pid", type=int, help="with --follow: end when this process ends")
    args = ap.parse_args(argv)
    components = check_components(args.component) or list(DEFAULT_COMPONENTS)
    if args.map:
        return _show_mapped(args.map, components)
    if not args.private_dir:
        ap.error("a private dir or --map is needed")
    found = session_logs(ray_temp_dir(args.private_dir))
    if found is None:
        print(f"no Ray session logs under {args.private_dir}", file=sys.stderr)
        return 1
    _, root = found
    if args.follow:
        files = [str(root / rel) for rel in component_files(root, components)]
        if not files:
            print(f"no {'/'.join(components)} logs under {root}", file=sys.stderr)
            return 1
        sys.stdout.flush()
        pid = [f"--pid={args.pid}"] if args.pid else []
        os.execvp("tail", ["tail", "-n", "+1", "-F", *pid, *files])
    show(root, components, args.title or str(root))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
