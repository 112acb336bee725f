"""Which of the given TCP ports are taken on this node, and the node's own port ranges.

``python -m eray_provider.runtime.port_probe 20224 20225 ...`` prints, for this node::

    <node> busy <port or lo-hi>...      (one or more lines; a line always, even empty)
    <node> holder <user> <port or lo-hi>...  (who listens on busy ports, where the kernel shows it)
    <node> ephemeral <lo> <hi>          (when ip_local_port_range is readable)
    <node> reserved <lo>-<hi>,...       (when ip_local_reserved_ports is not empty)
    <node> planted <user>               (the claimed PATH was made by another first)

With ``ERAY_CLAIM_DIR=PATH`` in its environment (which other users cannot read, unlike its
argv) the probe makes PATH, a private (0700) dir of the caller, on every node at once,
before its name can be seen anywhere (``launch.ensure_port_plan``); ``--drop=PATH`` removes
an empty dir of the caller that an earlier claim made.

Run once on every node of a job in a single srun step before a port plan is fixed. The
ranges are each node's own: nodes of one job can differ (a login node that runs ``ray up``
differs from the compute nodes often), so the launcher merges what every node reports
(``exclusions_from_reports``) instead of trusting its own ``/proc``. Stdlib only, fast to
start; the parsing half is pure, for unit tests.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..errors import ClusterError
from ..plan.environment import CLAIM_DIR
from ..plan.ports import Excluded, port_runs, ranges_text
from ..slurm.client import srun_port_range
from ..slurm.env import node_name
from .shared_dir import SharedDirError, check_private, is_private_dir
from .socket_table import listeners, login, read_rows

EPHEMERAL_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
RESERVED_FILE = "/proc/sys/net/ipv4/ip_local_reserved_ports"
_RANGE = re.compile(r"(\d+)(?:-(\d+))?\Z")


class ProbeError(ClusterError):
    """A probe's output that cannot be read, or a node that did not answer."""


@dataclass(frozen=True)
class NodeReport:
    """What the probe saw on one node."""

    node: str
    busy: tuple[int, ...] = ()
    ephemeral: tuple[int, int] | None = None
    reserved: tuple[tuple[int, int], ...] = ()
    #: (user, ports) of those who listen on busy ports
    holders: tuple[tuple[str, tuple[int, ...]], ...] = ()
    #: who made the claimed dir first ("" when it was claimed)
    planted: str = ""


def _wildcard_free(family: int, port: int) -> bool:
    """Whether this family's wildcard can be bound on ``port``: it clashes with any bound
    address of that family (an IPv6-only wildcard with ``[::1]`` too, which an IPv4 bind
    does not see). A host without IPv6 has nothing bound there."""
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
        return family == socket.AF_INET6  # no IPv6 here: nothing is bound there
    with s:
        try:
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
        except OSError as e:
            return family == socket.AF_INET6 and e.errno == errno.EADDRNOTAVAIL
    return True


def busy_ports(ports: list[int]) -> list[int]:
    """The ports some socket of this host is bound to, on any address of either family."""
    return [
        p for p in ports if not (_wildcard_free(socket.AF_INET, p) and _wildcard_free(socket.AF_INET6, p))
    ]


def port_open(host: str, port: int, timeout: float = 2) -> bool:
    """Whether something accepts TCP connections at ``host:port`` (a GCS that is up)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def parse_ephemeral(text: str, where: str = EPHEMERAL_FILE) -> tuple[int, int]:
    """``32768\\t60999`` -> (32768, 60999); anything else raises naming ``where``."""
    parts = text.split()
    if len(parts) != 2 or not all(p.isdigit() for p in parts) or int(parts[0]) > int(parts[1]):
        raise ProbeError(f"{where}={text.strip()!r} is not 'LO HI'")
    return int(parts[0]), int(parts[1])


def parse_reserved(text: str, where: str = RESERVED_FILE) -> tuple[tuple[int, int], ...]:
    """``8080,9148-9150`` -> ((8080, 8080), (9148, 9150)); empty -> ()."""
    out: list[tuple[int, int]] = []
    for item in text.strip().split(","):
        if not item.strip():
            continue
        m = _RANGE.match(item.strip())
        if m is None or int(m.group(1)) > int(m.group(2) or m.group(1)):
            raise ProbeError(f"{where}={text.strip()!r}: {item!r} is not PORT or LO-HI")
        out.append((int(m.group(1)), int(m.group(2) or m.group(1))))
    return tuple(out)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def ephemeral_range() -> tuple[int, int] | None:
    """This host's ephemeral port range, None where it cannot be read."""
    text = _read(EPHEMERAL_FILE)
    try:
        return parse_ephemeral(text) if text is not None else None
    except ProbeError:
        return None


def host_exclusions() -> list[Excluded]:
    """Port ranges of this host that a job's port plan avoids: the ephemeral range (soft:
    blocks inside it are the fallback where it covers everything, as 1024-65535 does) and
    Slurm's ``SrunPortRange`` (hard). Only this host's view: a plan for other nodes merges
    what each of them reports (``launch.ensure_port_plan``)."""
    out: list[Excluded] = []
    eph = ephemeral_range()
    if eph is not None:
        out.append(Excluded(*eph, "ip_local_port_range", soft=True))
    srun = srun_port_range()
    if srun is not None:
        out.append(Excluded(*srun, "SrunPortRange"))
    return out


def claim_dir(path: str) -> str:
    """Make ``path`` a private dir of this user; "" when it is one now, else who owns what
    stands there (a co-tenant who planted the name, or a dir of ours that others can enter)."""
    try:
        os.mkdir(path, 0o700)
        return ""
    except FileExistsError:
        pass
    st = os.lstat(path)
    try:
        check_private(path, st)
    except SharedDirError:
        return login(st.st_uid)
    return ""


def drop_dir(path: str) -> None:
    """Remove ``path`` if it is an empty private dir of this user (an earlier claim's)."""
    if is_private_dir(path):
        try:
            os.rmdir(path)
        except OSError:
            pass  # not empty: a node of the cluster entered it after all


def local_report(ports: Sequence[int], planted: str = "") -> NodeReport:
    """This node's busy ports among ``ports`` and its own ranges (unreadable ones omitted)."""
    node = node_name(os.environ)
    eph_text, res_text = _read(EPHEMERAL_FILE), _read(RESERVED_FILE)
    busy = busy_ports(list(ports))
    by_user: dict[str, list[int]] = {}
    for port, uids in sorted(listeners(busy, read_rows()).items()) if busy else ():
        for uid in uids:
            by_user.setdefault(login(uid), []).append(port)
    return NodeReport(
        node=node,
        busy=tuple(busy),
        ephemeral=parse_ephemeral(eph_text) if eph_text is not None else None,
        reserved=parse_reserved(res_text) if res_text is not None else (),
        holders=tuple((user, tuple(found)) for user, found in sorted(by_user.items())),
        planted=planted,
    )


#: Busy ranges per output line: srun interleaves the lines of several tasks, and a long line
#: may be cut by another node's output, so every line stays short.
RUNS_PER_LINE = 32


def _port_lines(prefix: str, ports: Sequence[int]) -> list[str]:
    runs = [ranges_text([r]) for r in port_runs(ports)]
    chunks = [runs[i : i + RUNS_PER_LINE] for i in range(0, len(runs), RUNS_PER_LINE)] or [[]]
    return [" ".join([prefix, *chunk]) for chunk in chunks]


def _parse_ports(words: Sequence[str], node: str, line: str) -> list[int]:
    out: list[int] = []
    for word in words:
        m = _RANGE.match(word)
        if m is None:
            raise ProbeError(f"port probe of {node} printed {line!r}: busy ports must be PORT or LO-HI")
        out.extend(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1))
    return out


def format_report(report: NodeReport) -> list[str]:
    lines = _port_lines(f"{report.node} busy", report.busy)
    for user, ports in report.holders:
        lines += _port_lines(f"{report.node} holder {user}", ports)
    if report.ephemeral is not None:
        lines.append(f"{report.node} ephemeral {report.ephemeral[0]} {report.ephemeral[1]}")
    if report.reserved:
        ranges = ",".join(f"{lo}-{hi}" for lo, hi in report.reserved)
        lines.append(f"{report.node} reserved {ranges}")
    if report.planted:
        lines.append(f"{report.node} planted {report.planted}")
    return lines


def parse_reports(text: str) -> dict[str, NodeReport]:
    """The probe's stdout of every node (lines in any order) -> report per node."""
    busy: dict[str, list[int]] = {}
    ephemeral: dict[str, tuple[int, int]] = {}
    reserved: dict[str, tuple[tuple[int, int], ...]] = {}
    holders: dict[str, dict[str, list[int]]] = {}
    planted: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) < 2:
            raise ProbeError(f"port probe printed {line!r}: expected '<node> busy|ephemeral|reserved ...'")
        node, kind, rest = parts[0], parts[1], parts[2:]
        if kind == "busy":
            busy.setdefault(node, []).extend(_parse_ports(rest, node, line))
        elif kind == "holder" and rest:
            holders.setdefault(node, {}).setdefault(rest[0], []).extend(_parse_ports(rest[1:], node, line))
        elif kind == "ephemeral":
            ephemeral[node] = parse_ephemeral(" ".join(rest), f"{EPHEMERAL_FILE} on {node}")
        elif kind == "reserved":
            reserved[node] = parse_reserved(" ".join(rest), f"{RESERVED_FILE} on {node}")
        elif kind == "planted" and len(rest) == 1:
            planted[node] = rest[0]
        else:
            raise ProbeError(f"port probe of {node} printed {line!r}: unknown kind {kind!r}")
    nodes = [*busy, *(n for n in (*ephemeral, *reserved) if n not in busy)]
    return {
        n: NodeReport(
            n,
            tuple(busy.get(n, ())),
            ephemeral.get(n),
            reserved.get(n, ()),
            tuple((u, tuple(ports)) for u, ports in holders.get(n, {}).items()),
            planted.get(n, ""),
        )
        for n in nodes
    }


def merge_reports(old: NodeReport | None, new: NodeReport) -> NodeReport:
    """One node's reports of two probe rounds: the busy ports and holders of both."""
    if old is None:
        return new
    holders: dict[str, set[int]] = {}
    for user, ports in (*old.holders, *new.holders):
        holders.setdefault(user, set()).update(ports)
    return NodeReport(
        new.node,
        tuple(sorted({*old.busy, *new.busy})),
        new.ephemeral,
        new.reserved,
        tuple((u, tuple(sorted(p))) for u, p in holders.items()),
        new.planted,
    )


def describe_busy(reports: Iterable[NodeReport], limit: int = 10) -> str:
    """Per node, the busy ports and who listens on them: why no block could be had."""
    parts = []
    for report in reports:
        if not report.busy:
            continue
        runs = port_runs(report.busy)
        ports = ranges_text(runs[:limit]) + (" ..." if len(runs) > limit else "")
        who = "; ".join(
            f"{user} listens on {ranges_text(port_runs(p)[:limit])}" for user, p in report.holders
        )
        parts.append(f"{report.node}: busy {ports}" + (f" ({who})" if who else ""))
        if len(parts) >= limit:
            parts.append("...")
            break
    return "; ".join(parts) or "no node reported a busy port"


def check_answered(reports: dict[str, NodeReport], nodes: Sequence[str]) -> None:
    """Every node of the probe's step answered (the probe prints a ``busy`` line always)."""
    missing = [n for n in nodes if n not in reports]
    if missing and len(reports) < len(nodes):
        raise ProbeError(
            f"the port probe got no answer from {len(nodes) - len(reports)} of {len(nodes)} nodes "
            f"(not answered: {', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''})"
        )


def exclusions_from_reports(reports: Iterable[NodeReport]) -> list[Excluded]:
    """Every node's ephemeral range (soft) and reserved ports (hard), one entry per distinct
    range: a job's plan must suit all its nodes, not only the host that computes it."""
    seen: set[tuple[int, int, bool]] = set()
    out: list[Excluded] = []
    for report in reports:
        found = [(r, False, RESERVED_FILE) for r in report.reserved]
        if report.ephemeral is not None:
            found.append((report.ephemeral, True, EPHEMERAL_FILE))
        for (lo, hi), soft, path in found:
            if (lo, hi, soft) not in seen:
                seen.add((lo, hi, soft))
                out.append(Excluded(lo, hi, f"{os.path.basename(path)} on {report.node}", soft))
    return out


def main(argv: list[str]) -> int:
    claim = os.environ.get(CLAIM_DIR, "")
    ports: list[str] = []
    for arg in argv:
        if arg.startswith("--drop="):
            drop_dir(arg.split("=", 1)[1])
        else:
            ports.append(arg)
    bad = [p for p in ports if not p.isdigit()]
    if bad:
        print(f"port_probe: ports must be numbers, got {bad[:5]!r}", file=sys.stderr)
        return 2
    try:
        planted = claim_dir(claim) if claim else ""
        report = local_report([int(p) for p in ports], planted)
    except OSError as e:
        print(f"port_probe: cannot make the temp dir {claim!r}: {e}", file=sys.stderr)
        return 2
    except ProbeError as e:
        print(f"port_probe: {e}", file=sys.stderr)
        return 2
    print("\n".join(format_report(report)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
