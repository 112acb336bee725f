"""Wall time from a granted allocation to every node alive in Ray, arm beside arm.

Arms, each in an allocation of its own of ``--nodes`` nodes on the SLURM test bed (several
sizes, ``--nodes 3,6``, run in the same rounds):

(a) ``eray``: ``ray up`` with eray-provider (readiness checked, every node started at
    once, ``ray up`` returning when all have joined);
(b) ``template``: the sbatch template from Ray's SLURM docs: ``srun ... ray start --head
    --block &``, ``sleep 10``, then one ``srun ... ray start --address ... --block &`` per
    worker with ``sleep 5`` after each (the template's values; ``--head-sleep``,
    ``--worker-sleep``);
(c) ``nosleep``: the same template without its sleeps (the workers' ``ray start`` may
    then meet no GCS yet: a run in which a node never joins is counted as failed);
(d) ``bare``: the limit, one node's bare ``ray start --head --block`` and nothing else.

"Alive" is measured the same way for every arm: one poller process per run, started with
the arm, that waits for the GCS port and then asks the GCS for its alive nodes every
0.2 s, so no arm pays a Python start per poll. The clock starts when the arm's first
command is run (the allocation is granted before). Each arm runs ``--repeats`` times, in
an order that alternates from round to round; round 0 is a warm-up (page cache, imports)
reported apart and left out of the figures. Printed per arm and size: min / median / max,
the ratios of medians against (a), and with several sizes (a)'s median at the largest over
the smallest.

    python bench/time_to_cluster.py [--nodes 3[,6]] [--repeats 3] [--cpus 1] [--cpu-quota Q]
                                    [--arms eray,template,nosleep,bare]

Run as root with the test bed up (``scripts/slurm-testbed up --nodes N [--cpu-quota Q]``).
With ``--cpu-quota Q`` the bed must run each node in a cpu cgroup of Q CPUs, so that nodes
do not draw on one pool of cores (without it, 3 nodes on a 2-core machine measure CPU
contention more than launch). The quota and the Slurm version head the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from eray_provider.plan.modules import GCS_PROBE, NODE_RUN, RAY_GATE

REPO = Path(__file__).resolve().parent.parent
TESTBED = REPO / "scripts" / "slurm-testbed"
ARMS = ("eray", "template", "nosleep", "bare")
RUN_TIMEOUT = 300.0

#: Waits for the GCS port, then polls the GCS in-process (Ray's client reads the token
#: variables once per process, and retries a GCS that is not up without a deadline).
POLLER = r"""
import socket, sys, time
host, port, want, deadline = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
while time.time() < deadline:
    try:
        socket.create_connection((host, port), timeout=1).close()
        print("open", time.time(), flush=True)
        break
    except OSError:
        time.sleep(0.1)
from ray._raylet import GcsClient
from ray.core.generated.gcs_pb2 import GcsNodeInfo
client = GcsClient(address=f"{host}:{port}")
seen = set()
while time.time() < deadline:
    try:
        alive = client.get_all_node_info(timeout=5, state_filter=GcsNodeInfo.GcsNodeState.ALIVE)
    except Exception:
        alive = {}
    for info in alive.values():
        if info.node_manager_address not in seen:
            seen.add(info.node_manager_address)
            print("alive", info.node_manager_address, time.time(), flush=True)
    if len(alive) >= want:
        print(time.time(), flush=True)
        sys.exit(0)
    time.sleep(0.2)
print(f"at most {len(alive)} of {want} alive", flush=True)
sys.exit(1)
"""


class BenchError(RuntimeError):
    pass


def testbed_env(nodes: int, cpu_quota: float | None) -> dict[str, str]:
    """The test bed's environment; a clear error when it is down, too small, or runs with
    another CPU quota than ``cpu_quota``."""
    status = subprocess.run([str(TESTBED), "status"], capture_output=True, text=True)
    first = (status.stdout + status.stderr).strip().splitlines()[:1]
    found = re.match(r"up: (\d+) nodes", first[0]) if first else None
    if found:
        quota = re.search(r", ([\d.]+) CPU per node", first[0])
        bed_quota = float(quota.group(1)) if quota else None
        if bed_quota != cpu_quota:
            want = f" --cpu-quota {cpu_quota:g}" if cpu_quota else ""
            raise BenchError(
                f"the test bed runs with cpu quota {bed_quota}, --cpu-quota asks {cpu_quota}: "
                f"`scripts/slurm-testbed down && scripts/slurm-testbed up --nodes {nodes}{want}`"
            )
    if status.returncode != 0 or not found:
        raise BenchError(
            f"the SLURM test bed is not up ({' '.join(first) or 'no status'}): run "
            f"`scripts/slurm-testbed up --nodes {nodes}` first"
        )
    if int(found.group(1)) < nodes:
        raise BenchError(
            f"the test bed has {found.group(1)} nodes, --nodes {nodes} needs more: "
            f"`scripts/slurm-testbed down && scripts/slurm-testbed up --nodes {nodes}`"
        )
    out = subprocess.run([str(TESTBED), "env"], capture_output=True, text=True, check=True).stdout
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    for line in out.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value.replace("$PATH", env["PATH"])
    return env


def salloc(env: dict[str, str], nodes: int, cpus: int, name: str) -> str:
    out = subprocess.run(
        ["salloc", "--no-shell", f"-N{nodes}", f"-c{cpus}", "--mem=2000", "-J", name],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = re.search(r"Granted job allocation (\d+)", out.stderr + out.stdout)
    if not found:
        raise BenchError(f"salloc -N{nodes} failed: {(out.stderr + out.stdout).strip()[-500:]}")
    return found.group(1)


def node_names(env: dict[str, str], job: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%N"], env=env, capture_output=True, text=True)
    hosts = out.stdout.strip()
    return subprocess.run(
        ["scontrol", "show", "hostnames", hosts], env=env, capture_output=True, text=True, check=True
    ).stdout.split()


def node_ip(env: dict[str, str], node: str) -> str:
    out = subprocess.run(["scontrol", "show", "node", node], env=env, capture_output=True, text=True)
    return re.search(r"NodeAddr=(\S+)", out.stdout).group(1)


def poller(env: dict[str, str], host: str, port: int, want: int) -> subprocess.Popen:
    deadline = time.time() + RUN_TIMEOUT
    return subprocess.Popen(
        [sys.executable, "-c", POLLER, host, str(port), str(want), str(deadline)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def busy_seconds() -> float:
    """CPU seconds this machine has spent busy (all cores, /proc/stat), to tell how much
    work a start took besides how long: on the test bed every node shares these cores."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:8]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # less idle, iowait


#: CPU seconds of the last run from its start to every node alive.
LAST_CPU: list[float] = [0.0]

#: What a process started during a run is, by its command line (first match wins).
KINDS = (
    ("ray up (the launcher CLI)", ("bin/ray up",)),
    ("ray start (CLI, per node)", ("bin/ray start", RAY_GATE)),
    ("gcs_server", ("gcs_server",)),
    ("raylet", ("raylet/raylet",)),
    ("dashboard (head)", ("dashboard/dashboard.py",)),
    ("dashboard modules (head)", ("ray-dashboard-", "multiprocessing.forkserver", "resource_tracker")),
    ("dashboard agent", ("DashboardAgent", "dashboard/agent.py")),
    ("runtime env agent", ("RuntimeEnvAgent", "runtime_env/agent")),
    ("log monitor", ("log_monitor",)),
    ("autoscaler monitor (head)", ("monitor.py",)),
    ("Ray client server (head)", ("ray.util.client.server",)),
    ("eray node_run", (NODE_RUN,)),
    ("eray GCS watcher", (GCS_PROBE,)),
    ("srun clients", ("srun",)),
)


def process_cpu(since: float, node: str | None = None) -> dict[str, float]:
    """CPU seconds per kind of every live process started after ``since`` (wall clock):
    on the test bed all nodes share this machine's PID namespace, so this is every
    process the run started, on every node. Ended ones are counted as the remainder.
    With ``node``, only the processes in that node's cpu cgroup (``--cpu-quota``)."""
    hz = os.sysconf("SC_CLK_TCK")
    with open("/proc/uptime") as f:
        boot = time.time() - float(f.read().split()[0])  # to 10 ms (btime is whole seconds)
    out: dict[str, float] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline") as f:
                cmd = f.read().replace("\0", " ")
        except OSError:
            continue
        # start times are in clock ticks: a process started right at ``since`` can read
        # a few ms early
        if boot + int(fields[19]) / hz < since - 0.1 or pid == str(os.getpid()):
            continue
        if node is not None and not _in_node(pid, node):
            continue
        kind = next((k for k, marks in KINDS if any(m in cmd for m in marks)), "other")
        out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / hz
    return out


def _in_node(pid: str, node: str) -> bool:
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return any(line.rstrip().endswith(f"/eray-testbed/{node}") for line in f)
    except OSError:
        return False


#: Per-kind CPU seconds of every profiled run: (nodes, the machine's, per kind).
PROFILES: list[tuple[int, float, dict[str, float]]] = []


def alive_at(proc: subprocess.Popen, t0: float, cpu0: float) -> float:
    """Seconds from ``t0`` to the moment the poller saw every node alive; the poller's
    events (the GCS port open, each node alive) go to ``POLLED``."""
    out, _ = proc.communicate(timeout=RUN_TIMEOUT + 30)
    LAST_CPU[0] = busy_seconds() - cpu0
    if proc.returncode != 0:
        raise BenchError(out.strip() or "the poller failed")
    POLLED[:] = [line.split() for line in out.splitlines()[:-1]]
    alive = [float(e[2]) for e in POLLED if e[0] == "alive"]
    FIRST_ALIVE[0] = min(alive) - t0 if alive else None
    HEAD_CPU[0] = sum(process_cpu(t0, HEAD_NODE[0]).values()) if HEAD_NODE[0] else None
    return float(out.split()[-1]) - t0


#: Each eray run's timeline (``eray_timeline``) by its number of nodes; the last printed.
TIMELINES: dict[int, str] = {}
#: The last poller's events: ``open <t>``, ``alive <address> <t>``.
POLLED: list[list[str]] = []
#: When the last poller saw its first node (the head) alive, seconds from the run's start.
FIRST_ALIVE: list[float | None] = [None]
#: The head node of the run under way (its allocation's first), and the CPU seconds of its
#: live processes from the run's start to every node alive (its cpu cgroup: ``--cpu-quota``)
HEAD_NODE: list[str | None] = [None]
HEAD_CPU: list[float | None] = [None]


def eray_timeline(state: Path, said: list[tuple[float, str]], t0: float, ips: dict[str, str]) -> str:
    """One ``ray up``, step by step, in seconds from its start: its own lines as it printed
    them (login side), the port plan written, each node's step launched (its record), its
    process started and Ray's start begun (the markers it writes, on the node), and the
    GCS port open and each node alive (the poller). Read before the teardown."""
    events: list[tuple[float, str]] = [(t, f"ray up: {line.split(' -- ', 1)[-1][:70]}") for t, line in said]
    if (state / "ports.json").exists():
        events.append(((state / "ports.json").stat().st_mtime, "port plan written"))
    doc = json.loads((state / "state.json").read_text()) if (state / "state.json").exists() else {}
    for node_id, rec in doc.get("nodes", {}).items():
        name = rec.get("slurm_node", node_id)
        if rec.get("launched"):
            events.append((float(rec["launched"]), f"{name}: step launched"))
        for kind, what in (("pid", "node process runs"), ("ip", "ray start begins")):
            marker = state / "nodes" / f"{node_id}.{kind}"
            if marker.exists():
                events.append((marker.stat().st_mtime, f"{name}: {what}"))
    by_ip = {ip: node for node, ip in ips.items()}
    for event in POLLED:
        if event[0] == "open":
            events.append((float(event[1]), "GCS port open"))
        elif event[0] == "alive":
            events.append((float(event[2]), f"{by_ip.get(event[1], event[1])}: alive"))
    return "\n".join(f"    {t - t0:6.2f}  {what}" for t, what in sorted(events))


# ------------------------------------------------------------------------------ arms
def arm_eray(env: dict[str, str], job: str, nodes: list[str], cpus: int, workdir: Path) -> float:
    config = yaml.safe_load((REPO / "cluster_yamls" / "slurm-cluster.yaml").read_text())
    config["cluster_name"] = f"ttc{job}"
    path = workdir / f"ttc-{job}.yaml"
    path.write_text(yaml.safe_dump(config))
    e = dict(env, SLURM_JOB_ID=job)
    state = Path.home() / ".eray-provider" / f"ttc{job}-{job}"
    try:
        t0, cpu0 = time.time(), busy_seconds()
        up = subprocess.Popen(
            ["ray", "up", "-y", str(path)], env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        lines: list[tuple[float, str]] = []  # ray up's output, each line as it came
        returned: list[float] = []

        def read() -> None:
            assert up.stdout is not None
            for line in up.stdout:
                lines.append((time.time(), line.rstrip()))
            up.wait()
            returned.append(time.time())

        waiter = threading.Thread(target=read, daemon=True)
        waiter.start()
        # the GCS port is in the port plan, written before the head starts
        deadline = time.monotonic() + 120
        while not (state / "ports.json").exists():
            if time.monotonic() > deadline or up.poll() not in (None, 0):
                raise BenchError(f"ray up wrote no port plan: {lines[-20:]}")
            time.sleep(0.05)
        gcs = json.loads((state / "ports.json").read_text())["gcs"]
        e.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(state / "auth_token"))
        poll = poller(e, node_ip(env, nodes[0]), gcs, len(nodes))
        seconds = alive_at(poll, t0, cpu0)
        PROFILES.append((len(nodes), LAST_CPU[0], process_cpu(t0)))
        waiter.join(timeout=RUN_TIMEOUT)
        out = "\n".join(line for _, line in lines)
        ours = [(t, line) for t, line in lines if "eray-provider" in line or "Cluster: " in line]
        ips = {node: node_ip(env, node) for node in nodes}
        if up.returncode != 0 or not returned:
            raise BenchError(f"ray up failed: {out[-2000:]}")
        TIMELINES[len(nodes)] = (
            eray_timeline(state, ours, t0, ips) + f"\n    {returned[0] - t0:6.2f}  ray up returned"
        )
        said = re.findall(r"eray-provider: \d+ of \d+ nodes alive", out)
        print(f"  (ray up returned at {returned[0] - t0:.1f} s: {said[-1] if said else 'no count'})")
        return seconds
    finally:
        subprocess.run(["ray", "down", "-y", str(path)], env=e, capture_output=True, timeout=300)


def _template(head_sleep: float, worker_sleep: float, head_only: bool = False):
    def arm(env: dict[str, str], job: str, nodes: list[str], cpus: int, workdir: Path) -> float:
        port = 36379 + int(job) % 1000
        e = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH")}
        e["RAY_AUTH_MODE"] = "disabled"
        head_ip = node_ip(env, nodes[0])
        procs = []

        def start(node: str, *args: str) -> None:
            argv = ["srun", f"--jobid={job}", "--overlap", "-N1", "-n1", "-w", node]
            argv += ["ray", "start", "--block", f"--num-cpus={cpus}", "--disable-usage-stats", *args]
            procs.append(subprocess.Popen(argv, env=e, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        want = 1 if head_only else len(nodes)
        t0, cpu0 = time.time(), busy_seconds()
        poll = poller(e, head_ip, port, want)
        try:
            start(nodes[0], "--head", f"--node-ip-address={head_ip}", f"--port={port}")
            if not head_only:
                time.sleep(head_sleep)
                for node in nodes[1:]:
                    start(node, f"--address={head_ip}:{port}")
                    time.sleep(worker_sleep)
            return alive_at(poll, t0, cpu0)
        finally:
            poll.kill()
            subprocess.run(["scancel", job], env=env)
            for p in procs:
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()

    return arm


# --------------------------------------------------------------------------- driver
def run_arm(name: str, arm: Callable, env: dict[str, str], n: int, cpus: int, workdir: Path) -> float | None:
    job = salloc(env, 1 if name == "bare" else n, cpus, f"ttc-{name}")
    try:
        nodes = node_names(env, job)
        HEAD_NODE[0] = nodes[0]
        return arm(env, job, nodes, cpus, workdir)
    except (BenchError, subprocess.SubprocessError) as e:
        print(f"  {name}: FAILED: {e}", flush=True)
        return None
    finally:
        subprocess.run(["scancel", job], env=env)
        wait_ended(env, job)


def wait_ended(env: dict[str, str], job: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], env=env, capture_output=True, text=True)
        if not out.stdout.strip():
            return
        time.sleep(0.5)


def print_profile(nodes: int) -> None:
    """Where the eray runs' CPU went at ``nodes`` nodes, from ``ray up`` to every node alive
    (medians)."""
    kinds = [k for k, _ in KINDS] + ["other"]
    runs = [(t, p) for n, t, p in PROFILES if n == nodes]
    total = statistics.median(t for t, _ in runs)
    print(
        f"\neray, {nodes} nodes: CPU-seconds by process, start to every node alive "
        f"(median of {len(runs)} runs):"
    )
    seen = 0.0
    for kind in kinds:
        value = statistics.median(p.get(kind, 0.0) for _, p in runs)
        seen += value
        if value >= 0.05:
            print(f"  {value:6.2f}  {kind}")
    print(f"  {total - seen:6.2f}  ended processes (port probe, uptime, rsync) and the SLURM daemons")
    print(f"  {total:6.2f}  the machine, all cores")


def spread(values: list[float]) -> str:
    if not values:
        return "no successful run"
    return f"min {min(values):6.1f}  median {statistics.median(values):6.1f}  max {max(values):6.1f} s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="3", help="nodes per allocation; several sizes: 3,6")
    ap.add_argument("--repeats", type=int, default=3, help="measured rounds, after one warm-up round")
    ap.add_argument("--cpus", type=int, default=1, help="CPUs per node of each allocation")
    ap.add_argument("--head-sleep", type=float, default=10.0)
    ap.add_argument("--worker-sleep", type=float, default=5.0)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--cpu-quota", type=float, default=None, help="the CPUs of each node's cgroup on the bed")
    args = ap.parse_args()
    arms = {
        "eray": arm_eray,
        "template": _template(args.head_sleep, args.worker_sleep),
        "nosleep": _template(0.0, 0.0),
        "bare": _template(0.0, 0.0, head_only=True),
    }
    chosen = [a for a in args.arms.split(",") if a]
    unknown = [a for a in chosen if a not in arms]
    try:
        sizes = [int(n) for n in args.nodes.split(",")]
    except ValueError:
        sizes = []
    if unknown or args.repeats < 1 or not sizes or min(sizes) < 2:
        ap.error(
            f"--arms {args.arms!r} (known: {', '.join(ARMS)}), --repeats >= 1, "
            f"--nodes {args.nodes!r} (sizes of 2 or more, comma-separated)"
        )
    try:
        env = testbed_env(max(sizes), args.cpu_quota)
    except BenchError as e:
        print(f"time_to_cluster: {e}", file=sys.stderr)
        return 2
    slurm = subprocess.run(["scontrol", "--version"], env=env, capture_output=True, text=True).stdout.strip()
    quota = f"{args.cpu_quota:g} CPU per node" if args.cpu_quota else "no CPU quota (nodes share the cores)"
    shown_sizes = " and ".join(map(str, sizes))
    print(f"time to cluster, {shown_sizes} nodes x {args.cpus} CPU, {args.repeats} rounds + 1 warm-up")
    print(f"{slurm}, {quota}, {time.strftime('%Y-%m-%d')}")
    runs = [(name, n) for n in sizes for name in chosen]
    times: dict[tuple[str, int], list[float]] = {run: [] for run in runs}
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.repeats + 1):
            for name, n in runs if rnd % 2 == 0 else runs[::-1]:
                seconds = run_arm(name, arms[name], env, n, args.cpus, Path(tmp))
                label = "warm-up" if rnd == 0 else f"round {rnd}"
                shown = "failed"
                if seconds is not None:
                    head = f"{FIRST_ALIVE[0]:4.1f} s" if FIRST_ALIVE[0] is not None else "?"
                    own = f"{HEAD_CPU[0]:4.1f}" if HEAD_CPU[0] is not None else "?"
                    shown = (
                        f"{seconds:6.1f} s  ({LAST_CPU[0]:5.1f} CPU-s, head alive at {head}, "
                        f"head node {own} CPU-s)"
                    )
                print(f"  {label:8} {name:9} {n:3} nodes {shown}", flush=True)
                if rnd > 0 and seconds is not None:
                    times[name, n].append(seconds)
    print()
    for name, n in runs:
        print(
            f"{name:9} {n:3} nodes {spread(times[name, n])}  ({len(times[name, n])} of {args.repeats} runs)"
        )
    for n in sizes:
        if any(size == n for size, _, _ in PROFILES):
            print_profile(n)
        if n in TIMELINES:
            print(f"\neray, {n} nodes: the last run, step by step (seconds from `ray up`):")
            print(TIMELINES[n])
    print()
    for n in sizes:
        base = times.get(("eray", n))
        for name in chosen:
            if base and name != "eray" and times[name, n]:
                ratio = statistics.median(base) / statistics.median(times[name, n])
                print(f"ratio of medians eray / {name} at {n} nodes: {ratio:.2f}")
    if "eray" in chosen and len(sizes) > 1 and times["eray", sizes[0]] and times["eray", sizes[-1]]:
        ratio = statistics.median(times["eray", sizes[-1]]) / statistics.median(times["eray", sizes[0]])
        print(f"ratio of medians eray at {sizes[-1]} nodes / at {sizes[0]} nodes: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
