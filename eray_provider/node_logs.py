"""Ray's logs of a node: which files matter, what is kept of them when the node ends,
where they are kept, and how they are shown.

A node's Ray writes its logs in the node's private temp dir, on the node's local disk,
which the end of the job (or the site's temp cleaner) takes with it. When Ray ends on a
node (``ray down``, the end of ``eray-provider run``, the job's ``scancel`` or time
limit), ``node_run`` copies them into the cluster's state dir on the shared file system,
one dir per node and Ray session::

    <state dir>/ray-logs/<node id>/<session>/   the files, as under Ray's logs dir
    <state dir>/ray-logs/<node id>/<session>/node.json   what was kept, and of which node

At most ``provider.collect_logs_mb`` MiB a node (0: nothing is collected), the files that
explain a node's end first (raylet, GCS, autoscaler, dashboard), then workers' logs,
newest first. A file over a quarter of the cap, or over what is left of it, keeps its
last bytes, after a line that says how much was left out. The teardown keeps
``ray-logs/`` when it deletes the rest of the state dir, so ``eray-provider logs`` shows
them after the job; ``eray-provider status --prune`` removes them with the rest.

``python -m eray_provider.node_logs DIR [--component C] [--follow]`` prints the logs of a
live node (``eray-provider logs`` runs it on the node, as a step of the node's job).
"""

from __future__ import annotations

import argparse
import codecs
import fnmatch
import json
import os
import shutil
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The name of the dir of collected logs inside a cluster's state dir.
LOGS_DIR = "ray-logs"
#: Default of ``provider.collect_logs_mb``, and its largest value.
DEFAULT_CAP_MB = 50
MAX_CAP_MB = 10240
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
    ``--temp-dir``), from its ``session_latest`` link; None when Ray made none."""
    latest = Path(ray_temp_dir) / "session_latest"
    try:
        session = Path(os.readlink(latest)).name
    except OSError:
        return None
    logs = Path(ray_temp_dir) / session / "logs"
    return (session, logs) if logs.is_dir() else None


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


def plan_collection(files: Iterable[tuple[str, int, float]], cap_bytes: int) -> list[tuple[str, int]]:
    """Which files to keep and how many of their last bytes: pure.

    In order of what explains a node's end, newest first within a rank; each file gets
    at most a quarter of the cap and what is left of it, and is left out (not listed)
    rather than cut below ``MIN_TAIL_BYTES``."""
    per_file = max(cap_bytes // 4, MIN_TAIL_BYTES)
    left = cap_bytes
    keep = []
    for rel, size, _ in sorted(files, key=lambda f: (_rank(f[0]), -f[2], f[0])):
        take = min(size, per_file, left)
        if take < size and take < MIN_TAIL_BYTES:
            continue
        keep.append((rel, take))
        left -= take
    return keep


def _copy_tail(src: Path, dst: Path, size: int, take: int) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as f, open(dst, "wb") as out:
        if take < size:
            f.seek(size - take)
            chunk = f.read(take)
            cut = chunk.find(b"\n") + 1  # start at a whole line
            out.write(f"[eray-provider: the first {size - take + cut} bytes left out]\n".encode())
            out.write(chunk[cut:])
        else:
            shutil.copyfileobj(f, out)


def collect(
    ray_temp_dir: str | Path, state_dir: Path, node_id: str, cap_bytes: int, meta: Mapping[str, Any]
) -> Path | None:
    """Copy the newest session's logs of this node into the state dir; returns where.

    None when there was nothing to collect. Never creates the state dir: a cluster whose
    state was removed gets nothing back. Written under a temporary name and renamed, so
    a reader sees all of a node's logs or none."""
    found = session_logs(ray_temp_dir)
    if found is None or cap_bytes <= 0:
        return None
    session, src = found
    root = logs_root(state_dir)
    root.mkdir(mode=0o700, exist_ok=True)  # no parents: FileNotFoundError if the state is gone
    (root / node_id).mkdir(mode=0o700, exist_ok=True)
    dest = root / node_id / session
    tmp = root / node_id / f".{session}.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    files = _files(src)
    sizes = {rel: size for rel, size, _ in files}
    keep = plan_collection(files, cap_bytes)
    kept, cut = [], []
    for rel, take in keep:
        try:
            _copy_tail(src / rel, tmp / rel, sizes[rel], take)
        except OSError:
            continue  # a file Ray removed meanwhile
        kept.append(rel)
        if take < sizes[rel]:
            cut.append(rel)
    doc = dict(
        meta,
        node_id=node_id,
        session=session,
        collected_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        cap_bytes=cap_bytes,
        files=kept,
        cut=cut,
        left_out=sorted(set(sizes) - set(kept)),
    )
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "node.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(dest, ignore_errors=True)  # a session collected twice: the later copy
    os.rename(tmp, dest)
    return dest


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
            if sess.name.startswith(".") or sess.is_symlink():
                continue
            try:
                meta = json.loads((sess / "node.json").read_text())
            except (OSError, ValueError):
                continue
            out.append(Collected(node_dir.name, sess.name, sess, meta))
    return out


def collected_nodes(state_dir: Path) -> list[str]:
    """The ids of the nodes whose logs were collected into ``state_dir``."""
    return sorted({c.node_id for c in collected(state_dir)})


def select(files: Iterable[str], components: Sequence[str]) -> list[str]:
    """The files (relative paths) of ``components``, in the order of ``COMPONENTS``."""
    chosen = [(list(COMPONENTS).index(c), f) for f in files if (c := component_of(os.path.basename(f)))]
    return [f for i, f in sorted(chosen) if list(COMPONENTS)[i] in components]


def check_components(names: Sequence[str]) -> list[str]:
    bad = [n for n in names if n not in COMPONENTS]
    if bad:
        raise ValueError(f"--component {bad[0]!r} is not one of {', '.join(COMPONENTS)}")
    return list(names)


def show(root: Path, components: Sequence[str], title: str, out=None) -> int:
    """Print the files of ``components`` under ``root``, each after a header; returns how
    many files were printed."""
    out = out or sys.stdout
    files = select((rel for rel, _, _ in _files(root)), components)
    for rel in files:
        out.write(f"==> {title}: {rel} <==\n")
        decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode
        with open(root / rel, "rb") as f:
            while chunk := f.read(1 << 20):
                out.write(decode(chunk))
        out.write(decode(b"", final=True) + "\n")
    out.flush()
    return len(files)


def main(argv: list[str]) -> int:
    """On a live node: print (or follow) the logs of its Ray, whose private dir is given."""
    from .node_run import ray_temp_dir

    ap = argparse.ArgumentParser(prog="python -m eray_provider.node_logs")
    ap.add_argument("private_dir")
    ap.add_argument("--title", default="")
    ap.add_argument("--component", action="append", default=[])
    ap.add_argument("--follow", action="store_true")
    args = ap.parse_args(argv)
    components = check_components(args.component) or list(DEFAULT_COMPONENTS)
    found = session_logs(ray_temp_dir(args.private_dir))
    if found is None:
        print(f"no Ray session logs under {args.private_dir}", file=sys.stderr)
        return 1
    _, root = found
    if args.follow:
        files = [str(root / rel) for rel in select((r for r, _, _ in _files(root)), components)]
        if not files:
            print(f"no {'/'.join(components)} logs under {root}", file=sys.stderr)
            return 1
        sys.stdout.flush()
        os.execvp("tail", ["tail", "-n", "+1", "-F", *files])
    show(root, components, args.title or str(root))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
