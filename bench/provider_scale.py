"""Both providers and every teardown path against a synthetic 10,000-node allocation.

No SLURM is needed or touched: fake ``srun``, ``squeue``, ``scancel``, ``sbatch`` and
``scontrol`` go first on PATH. Each fake records, for every call, the bytes of its argv,
its longest argument and its longest environment string (``NAME=value``) and the total
environment, and answers as SLURM would for the state the bench set up: ``squeue -s``
lists the job's steps (``%i %j``), ``squeue -u`` the user's jobs (``sbatch.SQUEUE_FORMAT``),
``scancel`` removes steps and jobs from later listings, an ``srun`` of a node's Ray step
(``node_run``) adds its step, ``sbatch`` adds a pending job.

The kernel refuses an exec with E2BIG when one argument or environment string exceeds
MAX_ARG_STRLEN (131,072 bytes with its NUL) or argv + environment exceed ARG_MAX (about
2 MB); Python raises ``OSError`` then. A path that completes has passed; the largest sizes
the fakes measured are printed beside the limits, and beside them what the old per-node
encodings (``--nodelist=a,b,c``, ``ERAY_NODE_IDS=a=a.1,...``, the inline teardown ``case``
script) would have put into one string.

The synthetic cluster (``--nodes`` N, default 10,000):

- ``SlurmNodeProvider``: job 4242 of N nodes; head on the first (its own step), N - 1
  workers launched by one ``create_node`` (one srun step), every node with the markers
  ``node_run`` writes (``.ip``, ``.tmpdir``, ``.pid``); launch times are set a minute in
  the past, so teardown's 30 s grace for steps that squeue may not list yet is not what
  is timed.
- ``SlurmJobProvider``: the head in job 4242, N worker nodes as N / ``--nodes-per-job``
  running SLURM jobs (default 1 node per job, as the shipped ``slurm-autoscale.yaml``:
  the longest squeue listing and scancel argv), with records and markers as
  ``WorkerPool.submit_workers`` and ``node_run`` write them.

Paths, one line each (time; fake calls; largest argument / environment string built):

(a) SlurmNodeProvider per autoscaler round: what Ray 2.60's autoscaler (v2,
    ``NodeProviderAdapter.get_non_terminated``) asks every round, ``non_terminated_nodes({})``
    then ``node_tags`` and ``is_running`` of every node. "warm" is the
    median of ``--rounds`` rounds back to back (squeue listing, state file and marker
    listing cached): the figure gated at 5 ms. "cold" expires those caches before each
    round, as an autoscaler 5 s apart meets them (one squeue, one stat, one listdir), and
    says how much of it the fake squeue subprocess took. Timed beside it, not gated:
    ``is_terminated`` and ``internal_ip`` of every node (Ray's updater polls the first
    in its wait loops, the v1 autoscaler asks the second of every node).
(b) SlurmJobProvider per round, the same calls and figures.
(c) ``create_node`` of N - 1 workers in one launch batch: srun argv and environment
    (``--nodelist`` hostlist, ``ERAY_NODE_IDS``), and the srun calls against one per worker.
(d) ``terminate_nodes`` of 10 workers of the big step (one signalling srun each), then of
    the whole step (one scancel, waited for until squeue drops it).
(d2) the same 10, then the step's remaining workers in a second call (what a scale-down
    in two rounds asks): the per-node signals it decides on are counted, not run, and the
    time they would take is estimated from (d)'s srun time.
(e) teardown, ``provider.stop_all()`` on the cluster as (c) left it: one scancel of both
    steps, the cleanup script in the state dir, one srun over a compressed nodelist; the
    script is checked (one case per node, it removes a node's own temp dir).
(f) ``SlurmJobProvider.cleanup_cluster_resources``: one scancel of every worker job, then
    the head's teardown.
(g) ``SlurmJobProvider.create_node`` of ``--submit`` one-node jobs (one sbatch each), per job.

The summary FAILS (exit 1) when a path raised or a check failed, any measured argument
or environment string exceeds 131,072 bytes, argv + environment exceed ARG_MAX, or the
warm per-round median of either provider is 5 ms or more. A path over 10 s is flagged SLOW.

    python bench/provider_scale.py [--nodes 10000] [--rounds 20] [--nodes-per-job 1] [--submit 20]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray.autoscaler.tags import TAG_RAY_NODE_KIND

from eray_provider.plan.cluster_config import fill_config
from eray_provider.plan.elastic_config import fill_elastic_config
from eray_provider.plan.modules import NODE_RUN
from eray_provider.plan.node_record import NodeRecord
from eray_provider.plan.ports import choose_plan
from eray_provider.plan.sbatch import elastic_node_id
from eray_provider.runtime.cluster_state import ClusterState
from eray_provider.slurm.allocation import Allocation, NodeShare
from eray_provider.slurm.hostlist import expand
from eray_provider.slurm.squeue import SQUEUE_FORMAT

#: MAX_ARG_STRLEN: one argument or ``NAME=value`` string, its NUL included.
ARG_LIMIT = 131072
#: ARG_MAX: argv and environment together (strings, NULs; the kernel also counts pointers).
TOTAL_LIMIT = os.sysconf("SC_ARG_MAX") if hasattr(os, "sysconf") else 2 * 1024 * 1024
ROUND_LIMIT_MS = 5.0
SLOW_SECONDS = 10.0
JOB = "4242"
CLUSTER = "scale"
ECLUSTER = "escale"
FIRST_ELASTIC_JOB = 1_000_000

FAKE = r"""
import fcntl, json, os, sys

D = @DIR@
ALLOC = @JOB@
FORMAT = @FORMAT@
cmd = os.path.basename(sys.argv[0])
args = sys.argv[1:]
argv = [cmd.encode()] + [os.fsencode(a) for a in args]
env = [k + b"=" + v for k, v in os.environb.items()]
arg = max(argv[1:], key=len, default=b"")
var = max(env, key=len, default=b"")
rec = {
    "cmd": cmd, "argc": len(argv), "argv_bytes": sum(len(a) + 1 for a in argv),
    "arg_max": len(arg) + 1, "arg_what": arg[:48].decode(errors="replace"),
    "env_bytes": sum(len(e) + 1 for e in env), "env_max": len(var) + 1,
    "env_what": var.split(b"=", 1)[0].decode(errors="replace"),
}
if cmd in ("srun", "sbatch"):
    rec["args"] = [a[:300] for a in args]
    rec["node_ids"] = os.environ.get("ERAY_NODE_IDS", "")[:2000]


def opt(flag):
    return args[args.index(flag) + 1] if flag in args else None


def value(prefix):
    return next((a[len(prefix):] for a in args if a.startswith(prefix)), None)


def lines(name):
    try:
        with open(os.path.join(D, name)) as f:
            return [x for x in f.read().splitlines() if x]
    except FileNotFoundError:
        return []


def save(name, rows):
    with open(os.path.join(D, name + ".tmp"), "w") as f:
        f.write("".join(r + "\n" for r in rows))
    os.replace(os.path.join(D, name + ".tmp"), os.path.join(D, name))


def counter():
    n = int((lines("counter") or ["0"])[0]) + 1
    save("counter", [str(n)])
    return n


def invalid():
    sys.stderr.write("slurm_load_jobs error: Invalid job id specified\n")
    sys.exit(1)


lock = open(os.path.join(D, "lock"), "a")
fcntl.flock(lock, fcntl.LOCK_EX)
with open(os.path.join(D, "calls.jsonl"), "a") as f:
    f.write(json.dumps(rec) + "\n")
jobs = {r.split("|", 1)[0]: r for r in lines("jobs")}
code = 0
if cmd == "squeue":
    job = opt("-j")
    if "-s" in args:
        if job != ALLOC and job not in jobs:
            invalid()
        sys.stdout.write("".join(r + "\n" for r in lines("steps") if r.split(".", 1)[0] == job))
    elif job is not None:
        if job == ALLOC:
            print("RUNNING")
        elif job in jobs:
            print(jobs[job].split("|")[1])
        else:
            invalid()
    elif opt("-o") != FORMAT:
        sys.stderr.write("fake squeue: unexpected format %r\n" % opt("-o"))
        code = 2
    else:
        sys.stdout.write("".join(r + "\n" for r in jobs.values()))
elif cmd == "scancel":
    gone = {a for a in args if not a.startswith("-")}
    save("steps", [r for r in lines("steps") if r.split()[0] not in gone and r.split(".")[0] not in gone])
    save("jobs", [r for k, r in jobs.items() if k not in gone])
elif cmd == "srun":
    name = value("--job-name=")
    if name and @NODE_RUN@ in args:
        save("steps", lines("steps") + ["%s.%d %s" % (ALLOC, counter(), name)])
    if len(args) >= 2 and args[-2] == "bash" and os.path.isfile(args[-1]):
        with open(args[-1]) as src, open(os.path.join(D, "script-%d.sh" % counter()), "w") as dst:
            dst.write(src.read())
elif cmd == "sbatch":
    sys.stdin.read()
    job = str(@FIRST@ + counter())
    fields = (job, value("--nodes="), value("--job-name="))
    row = "%s|PENDING|%s|(null)|Priority|INVALID|N/A|UNLIMITED|%s" % fields
    save("jobs", list(jobs.values()) + [row])
    print(job)
else:
    sys.stderr.write("fake %s: not faked\n" % cmd)
    code = 1
sys.exit(code)
"""


class FakeSlurm:
    """The fake commands, their shared state (``steps``, ``jobs``) and their call log."""

    COMMANDS = ("srun", "squeue", "scancel", "sbatch", "scontrol")

    def __init__(self, root: Path) -> None:
        self.dir = root / "fake"
        self.bin = root / "bin"
        self.dir.mkdir()
        self.bin.mkdir()
        script = (
            FAKE.replace("@DIR@", repr(str(self.dir)))
            .replace("@JOB@", repr(JOB))
            .replace("@FORMAT@", repr(SQUEUE_FORMAT))
            .replace("@FIRST@", str(FIRST_ELASTIC_JOB))
            .replace("@NODE_RUN@", repr(NODE_RUN))
        )
        for name in self.COMMANDS:
            path = self.bin / name
            path.write_text(f"#!{sys.executable} -S\n{script}")
            path.chmod(0o755)
        self.log = self.dir / "calls.jsonl"
        self.log.write_text("")

    def calls(self, since: int = 0) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()[since:]]

    def mark(self) -> int:
        return len(self.log.read_text().splitlines())

    def write(self, name: str, rows: list[str]) -> None:
        (self.dir / name).write_text("".join(r + "\n" for r in rows))

    def read(self, name: str) -> list[str]:
        path = self.dir / name
        return path.read_text().splitlines() if path.exists() else []

    def scripts(self) -> list[Path]:
        return sorted(self.dir.glob("script-*.sh"))


@dataclass
class Result:
    name: str
    seconds: float = 0.0
    calls: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    round_ms: float | None = None
    #: seconds the path would take with the calls the bench counted instead of running
    estimate: float | None = None

    @property
    def slow(self) -> bool:
        return max(self.seconds, self.estimate or 0.0) > SLOW_SECONDS

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            self.failed.append(what)


def kb(n: float) -> str:
    return f"{n:,.0f} B" if n < 10_000 else f"{n / 1024:,.1f} KiB"


def sizes(calls: list[dict[str, Any]]) -> str:
    if not calls:
        return "no SLURM calls"
    count: dict[str, int] = {}
    for c in calls:
        count[c["cmd"]] = count.get(c["cmd"], 0) + 1
    arg = max(calls, key=lambda c: c["arg_max"])
    var = max(calls, key=lambda c: c["env_max"])
    total = max(c["argv_bytes"] + c["env_bytes"] for c in calls)
    what = arg["arg_what"] if len(arg["arg_what"]) < 40 else arg["arg_what"][:37] + "..."
    return (
        f"{', '.join(f'{k} x{v}' for k, v in count.items())}; largest arg {kb(arg['arg_max'])} "
        f"({arg['cmd']} {what!r}), env string {kb(var['env_max'])} ({var['env_what']}), "
        f"argv+env {kb(total)}"
    )


@contextmanager
def timed(result: Result, fake: FakeSlurm) -> Iterator[None]:
    start = fake.mark()
    t = time.perf_counter()
    try:
        yield
    except Exception as e:  # a path that raises is reported and fails the summary
        traceback.print_exc()
        result.failed.append(f"raised {type(e).__name__}: {e}"[:400])
    finally:
        result.seconds += time.perf_counter() - t
        result.calls += fake.calls(start)


# ---------------------------------------------------------------------------- setup
def write_markers(state: ClusterState, nodes: dict[str, str], temp_base: Path) -> dict[str, str]:
    """``.ip``, ``.tmpdir`` and ``.pid`` as ``node_run`` writes them; returns id -> temp dir."""
    tmpdirs = {}
    for k, (node_id, slurm_node) in enumerate(nodes.items()):
        tmpdirs[node_id] = f"{temp_base}/eray-{state.job_id}-{k:08x}"
        state.write_marker(node_id, "ip", f"10.{k >> 16 & 255}.{k >> 8 & 255}.{k & 255}")
        state.write_temp_dirs(node_id, slurm_node, [tmpdirs[node_id]])
        state.write_marker(node_id, "pid", f"{100000 + k} {5000000 + k}")
    return tmpdirs


def fixed_cluster(n: int, root: Path) -> tuple[dict[str, Any], ClusterState, list[str]]:
    names = [f"gpu{i:05d}" for i in range(n)]
    alloc = Allocation(JOB, tuple(NodeShare(x, 64, 8, "h100", 512_000) for x in names), partition="gpu")
    base = {
        "cluster_name": CLUSTER,
        "max_workers": -1,
        "provider": {
            "type": "external",
            "module": "eray_provider.SlurmNodeProvider",
            "state_dir": str(root / "state"),
        },
    }
    config = fill_config(base, alloc, python=sys.executable)
    state = ClusterState(CLUSTER, JOB, root / "state")
    state.create()
    state.save_ports(choose_plan(JOB, []))
    state.save_cluster_config({"provider": config["provider"]})
    return config, state, names


def add_head(state: ClusterState, fake: FakeSlurm, slurm_node: str, cluster: str) -> str:
    from ray.autoscaler.tags import TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE

    (head,) = state.add_nodes(
        [(slurm_node, "head", {TAG_RAY_NODE_KIND: "head", TAG_RAY_USER_NODE_TYPE: "head"})]
    )
    name = f"eray.{cluster}.head.1"
    state.mark_launched([head], name)
    backdate(state, 60)
    fake.write("steps", [*fake.read("steps"), f"{JOB}.0 {name}"])
    return head


def backdate(state: ClusterState, seconds: float) -> None:
    def shift(_doc: dict[str, Any], nodes: dict[str, NodeRecord]) -> None:
        for node_id, rec in nodes.items():
            launched = rec.launched - seconds if rec.launched else 0.0
            nodes[node_id] = dataclasses.replace(rec, launched=launched, created=rec.created - seconds)

    state.update(shift)


# ---------------------------------------------------------------------------- rounds
def expire_caches(provider: Any) -> None:
    """What 5 s between autoscaler rounds does: the squeue listings, the state file's
    freshness window and the marker listing are all due again (private stamps reset)."""
    provider.steps.expire()
    if provider.pool is not None:
        provider.pool.listing.expire()
    provider.state._checked = 0.0
    provider._view.expire()
    if provider.state._markers is not None:
        provider.state._markers = (float("-inf"), provider.state._markers[1])


def one_round(provider: Any) -> tuple[list[float], list[str]]:
    """The provider calls of one autoscaler round, in the order v2's adapter makes them
    (each node's tags read as it reads them), timed per kind of call."""
    t0 = time.perf_counter()
    ids = provider.non_terminated_nodes({})
    t1 = time.perf_counter()
    kinds = [provider.node_tags(i).get(TAG_RAY_NODE_KIND) for i in ids]
    t2 = time.perf_counter()
    running = [i for i in ids if provider.is_running(i)]
    t3 = time.perf_counter()
    assert None not in kinds, "a live node without its kind tag"
    return [t1 - t0, t2 - t1, t3 - t2], running


def rounds(result: Result, provider: Any, n_nodes: int, count: int, refresh: Callable[[Any], Any]) -> None:
    """Warm rounds back to back, then cold ones: caches expired, and the listings fetched
    first by the provider's own ``refresh`` (timed apart), then the round."""
    _, running = one_round(provider)  # the first call: squeue, state file, markers
    result.check(len(running) == n_nodes, f"{len(running)} of {n_nodes} nodes running")
    warm = [one_round(provider)[0] for _ in range(count)]
    cold, fetch = [], []
    for _ in range(5):
        expire_caches(provider)
        t = time.perf_counter()
        refresh(provider)
        fetch.append(time.perf_counter() - t)
        cold.append(time.perf_counter() - t + sum(one_round(provider)[0]))
    ids = provider.non_terminated_nodes({})
    t = time.perf_counter()
    terminated = [i for i in ids if provider.is_terminated(i)]
    term_ms = (time.perf_counter() - t) * 1e3
    result.check(not terminated, f"{len(terminated)} listed nodes report is_terminated")
    t = time.perf_counter()
    for i in ids:
        provider.internal_ip(i)
    ip_ms = (time.perf_counter() - t) * 1e3
    totals = [sum(w) * 1e3 for w in warm]
    med = statistics.median(totals)
    parts = [statistics.median(w[k] for w in warm) * 1e3 for k in range(3)]
    cold_ms, fetch_ms = statistics.median(cold) * 1e3, statistics.median(fetch) * 1e3
    result.round_ms = med
    result.notes += [
        f"warm round median {med:.2f} ms (min {min(totals):.2f}, max {max(totals):.2f}, {count} rounds): "
        f"non_terminated_nodes {parts[0]:.2f}, node_tags x{len(ids)} {parts[1]:.2f}, "
        f"is_running {parts[2]:.2f} ms",
        f"cold round (caches expired, as 5 s apart) median {cold_ms:.1f} ms: squeue listings (fake "
        f"subprocess + parse) {fetch_ms:.1f} ms, the rest {cold_ms - fetch_ms:.1f} ms; not gated: "
        f"is_terminated x{len(ids)} {term_ms:.1f} ms, internal_ip x{len(ids)} {ip_ms:.1f} ms",
    ]
    result.check(med < ROUND_LIMIT_MS, f"warm round median {med:.2f} ms >= {ROUND_LIMIT_MS} ms")


# ---------------------------------------------------------------------------- SlurmNodeProvider
def fixed_paths(n: int, root: Path, fake: FakeSlurm, count: int) -> list[Result]:
    from ray.autoscaler.tags import TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE

    from eray_provider.autoscaler.provider import SlurmNodeProvider
    from eray_provider.runtime.node_run import node_id_from

    results = []
    config, state, names = fixed_cluster(n, root)
    head = add_head(state, fake, names[0], CLUSTER)
    worker_type = next(k for k in config["available_node_types"] if k.startswith("ray.worker"))
    node_config = config["available_node_types"][worker_type]["node_config"]

    # ---- (c) one launch batch of n - 1 workers
    c = Result(f"(c) create_node of {n - 1:,} workers, one batch")
    provider = SlurmNodeProvider(config["provider"], CLUSTER)
    with timed(c, fake):
        provider.create_node(
            node_config, {TAG_RAY_NODE_KIND: "worker", TAG_RAY_USER_NODE_TYPE: worker_type}, n - 1
        )
        deadline = time.monotonic() + 60
        while not any(r.startswith(f"{JOB}.") and ".workers." in r for r in fake.read("steps")):
            if time.monotonic() > deadline:
                raise TimeoutError("the fake srun of the launch did not run")
            time.sleep(0.02)
    sruns = [x for x in c.calls if x["cmd"] == "srun"]
    c.check(len(sruns) == 1, f"{len(sruns)} srun calls, expected 1")
    ids = {rec["slurm_node"]: i for i, rec in state.read()["nodes"].items() if rec["role"] == "worker"}
    c.check(len(ids) == n - 1, f"{len(ids)} worker records")
    if sruns:
        args = sruns[0]["args"]
        nodelist = next(a for a in args if a.startswith("--nodelist="))[len("--nodelist=") :]
        c.check(expand(nodelist) == list(ids), "the --nodelist hostlist is not the workers in order")
        value = sruns[0]["node_ids"]
        for slurm_node in (names[1], names[n // 2], names[-1]):
            got = node_id_from(value, slurm_node)
            c.check(
                got == ids[slurm_node], f"ERAY_NODE_IDS gives {slurm_node} -> {got}, not {ids[slurm_node]}"
            )
        c.notes.append(f"--nodelist={nodelist}, ERAY_NODE_IDS={value}")
    old_list = len("--nodelist=" + ",".join(ids)) + 1
    old_ids = len("ERAY_NODE_IDS=" + ",".join(f"{k}={v}" for k, v in ids.items())) + 1
    c.notes.append(
        f"old approach: --nodelist {kb(old_list)}, ERAY_NODE_IDS {kb(old_ids)} (limit {ARG_LIMIT:,} B); "
        f"srun calls {len(sruns)} against {n - 1:,} for one per worker (ratio {len(sruns) / (n - 1):.5f})"
    )
    results.append(c)

    temp_base = root / "t"
    temp_base.mkdir()
    tmpdirs = write_markers(
        state, {i: rec["slurm_node"] for i, rec in state.read()["nodes"].items()}, temp_base
    )
    backdate(state, 60)  # the cluster is up a minute: no step is in its launch grace
    snapshot, steps_snapshot = copy.deepcopy(state.read()), fake.read("steps")

    # ---- (a) per round
    a = Result(f"(a) SlurmNodeProvider round, {n:,} nodes")
    provider = SlurmNodeProvider(config["provider"], CLUSTER)  # as the head's monitor builds it
    with timed(a, fake):
        rounds(a, provider, n, count, lambda p: p.steps.by_id())
    results.append(a)

    # ---- (d) terminate some workers, then the whole step
    d = Result("(d) terminate_nodes: 10 workers, then the whole step")
    workers = [i for i, rec in state.read()["nodes"].items() if rec["role"] == "worker"]
    with timed(d, fake):
        t = time.perf_counter()
        provider.terminate_nodes(workers[:10])
        some = time.perf_counter() - t
        t = time.perf_counter()
        provider.terminate_nodes(workers)
        whole = time.perf_counter() - t
        alive = provider.non_terminated_nodes({})
        d.check(
            alive == [head], f"{len(alive)} nodes alive after terminating every worker, expected the head"
        )
    count_by = [x["cmd"] for x in d.calls]
    d.check(count_by.count("srun") == 10, f"{count_by.count('srun')} signalling sruns, expected 10")
    d.check(count_by.count("scancel") == 1, f"{count_by.count('scancel')} scancels, expected 1")
    d.check(
        not any(r.split()[1].startswith(f"eray.{CLUSTER}.workers") for r in fake.read("steps")), "step listed"
    )
    if not d.failed:
        d.notes.append(f"10 workers {some * 1e3:.0f} ms (one srun each), whole step {whole * 1e3:.0f} ms")
    results.append(d)

    # ---- (d2) the rest of a step some of whose nodes were terminated before
    d2 = Result(f"(d2) terminate_nodes of the {len(workers) - 10:,} remaining workers of the step")
    state.write(snapshot)
    fake.write("steps", steps_snapshot)
    provider = SlurmNodeProvider(config["provider"], CLUSTER)
    signalled: list[str] = []
    with timed(d2, fake):
        provider.terminate_nodes(workers[:10])
        module = sys.modules[SlurmNodeProvider.__module__]
        real_signal = module.signal_node
        # counted, not run: one srun each would take many minutes at this size
        module.signal_node = lambda _state, node_id, _job: signalled.append(node_id)
        t = time.perf_counter()
        provider.terminate_nodes(workers[10:])
        rest = time.perf_counter() - t
        module.signal_node = real_signal
    cancels = [x for x in d2.calls if x["cmd"] == "scancel"]
    if signalled:
        estimate = rest + len(signalled) * some / 10
        d2.notes.append(
            f"SLOW: {len(signalled):,} nodes signalled one srun each (counted, not run: about "
            f"{estimate:.0f} s at {some / 10 * 1e3:.0f} ms per srun), {len(cancels)} scancel of the step; "
            "terminate_nodes takes a step as whole only when every record of it is in the call, "
            "terminated ones included"
        )
        d2.estimate = estimate
    else:
        d2.check(len(cancels) == 1, f"{len(cancels)} scancels of the step, expected 1")
        d2.notes.append(f"the rest of the step: {rest * 1e3:.0f} ms, one scancel")
    results.append(d2)

    # ---- (e) teardown of the cluster as (c) left it
    e = Result(f"(e) teardown (stop_all), {n:,} nodes with temp dirs")
    state.write(snapshot)
    fake.write("steps", steps_snapshot)
    for node_id in (workers[0], workers[1], workers[-1]):
        Path(tmpdirs[node_id]).mkdir()
    provider = SlurmNodeProvider(config["provider"], CLUSTER)  # as `ray down` builds it
    scripts_before = set(fake.scripts())
    with timed(e, fake):
        provider.stop_all()
    cmds = [x["cmd"] for x in e.calls]
    e.check(cmds.count("scancel") == 1, f"{cmds.count('scancel')} scancels, expected 1")
    e.check(not fake.read("steps"), f"steps still listed: {fake.read('steps')}")
    e.check(not state.dir.exists(), "the state dir is still there")
    cleanup = [x for x in e.calls if x["cmd"] == "srun"]
    e.check(len(cleanup) == 1, f"{len(cleanup)} cleanup sruns, expected 1")
    new_scripts = [p for p in fake.scripts() if p not in scripts_before]
    e.check(len(new_scripts) == 1, "the cleanup srun got no script file")
    if cleanup and new_scripts:
        args = cleanup[0]["args"]
        nodelist = next(x for x in args if x.startswith("--nodelist="))[len("--nodelist=") :]
        e.check(sorted(expand(nodelist)) == sorted(names), "the cleanup nodelist is not every node")
        script = new_scripts[0].read_text()
        cases = sum(1 for line in script.splitlines() if line.strip().endswith(";;"))
        e.check(cases == n, f"{cases} cases in the cleanup script, expected {n}")
        for node_id in (workers[0], workers[-1]):
            slurm_node = snapshot["nodes"][node_id]["slurm_node"]
            subprocess.run(["bash", str(new_scripts[0])], env={**os.environ, "SLURMD_NODENAME": slurm_node})
            e.check(not Path(tmpdirs[node_id]).exists(), f"the script did not remove {tmpdirs[node_id]}")
        e.check(Path(tmpdirs[workers[1]]).exists(), "the script removed another node's temp dir")
        e.notes.append(
            f"--nodelist={nodelist}; script in the state dir {kb(len(script))}; old approach: the inline "
            f"case script as one argument {kb(len(script) + 1)}, --nodelist {kb(len(','.join(names)) + 12)}"
        )
    results.append(e)
    return results


# ---------------------------------------------------------------------------- SlurmJobProvider
def elastic_paths(n: int, per_job: int, root: Path, fake: FakeSlurm, count: int, submit: int) -> list[Result]:
    from ray.autoscaler.tags import TAG_RAY_NODE_KIND, TAG_RAY_NODE_STATUS, TAG_RAY_USER_NODE_TYPE

    from eray_provider.autoscaler.elastic import SlurmJobProvider

    results = []
    yaml = {
        "cluster_name": ECLUSTER,
        "max_workers": n + submit * per_job,
        "provider": {
            "type": "external",
            "module": "eray_provider.SlurmJobProvider",
            "state_dir": str(root / "estate"),
        },
        "head_node_type": "head",
        "available_node_types": {
            "head": {"node_config": {"sbatch": {"cpus_per_node": 2, "mem": "2G"}}},
            "cpu": {
                "min_workers": 0,
                "max_workers": n + submit * per_job,
                "node_config": {"sbatch": {"nodes": per_job, "cpus_per_node": 64, "mem": "500G"}},
            },
        },
    }
    head_alloc = Allocation(JOB, (NodeShare("login00", 2, 0, None, 2048),))
    config = fill_elastic_config(yaml, head_alloc, python=sys.executable)
    state = ClusterState(ECLUSTER, JOB, root / "estate")
    state.create()
    state.save_ports(choose_plan(JOB, []))
    state.save_cluster_config({"provider": config["provider"]})
    add_head(state, fake, "login00", ECLUSTER)
    tags = {TAG_RAY_NODE_KIND: "worker", TAG_RAY_USER_NODE_TYPE: "cpu", TAG_RAY_NODE_STATUS: "up-to-date"}
    name = f"eray.{ECLUSTER}.{JOB}.cpu"
    rows, nodes = [], {}
    now = time.time() - 60
    doc = state.read()
    for j in range(-(-n // per_job)):
        job = str(FIRST_ELASTIC_JOB + 500_000 + j)
        hosts = [f"cn{j * per_job + k:05d}" for k in range(per_job)]
        nodelist = hosts[0] if per_job == 1 else f"cn[{j * per_job:05d}-{j * per_job + per_job - 1:05d}]"
        rows.append(f"{job}|RUNNING|{per_job}|{nodelist}|None|UNLIMITED|Unknown|UNLIMITED|{name}")
        for k, host in enumerate(hosts):
            node_id = elastic_node_id(job, k)
            nodes[node_id] = host
            doc["nodes"][node_id] = {"slurm_job": job, "role": "worker", "tags": dict(tags), "created": now}
    other = "777|RUNNING|1|login01|None|1:00:00|2026-12-03T20:00:00|1:00:00|interactive"
    rows.append(other)  # another job of the user
    fake.write("jobs", rows)
    state.write(doc)
    temp_base = root / "et"
    temp_base.mkdir()
    write_markers(state, nodes, temp_base)
    workers = len(nodes)
    note = f"{workers:,} worker nodes as {len(rows) - 1:,} running {per_job}-node jobs, head in job {JOB}"

    # ---- (b) per round
    b = Result(f"(b) SlurmJobProvider round, {workers + 1:,} nodes")
    provider = SlurmJobProvider(config["provider"], ECLUSTER)
    with timed(b, fake):
        # a cold round lists the jobs (the workers) and the head's job's steps (the head)
        rounds(b, provider, workers + 1, count, lambda p: (p.pool.jobs(), p.steps.by_id()))
    b.notes.insert(0, note)
    results.append(b)

    # ---- (b2) the head's round with replacement on (1% of the jobs paired)
    results.append(replacing_round(config, state, fake, rows, doc, name, per_job, workers, count))

    # ---- (g) submit a few more jobs (one sbatch each)
    g = Result(f"(g) SlurmJobProvider create_node of {submit} {per_job}-node jobs")
    if submit:
        node_config = config["available_node_types"]["cpu"]["node_config"]
        with timed(g, fake):
            provider.create_node(
                node_config, {TAG_RAY_NODE_KIND: "worker", TAG_RAY_USER_NODE_TYPE: "cpu"}, submit * per_job
            )
        cmds = [x["cmd"] for x in g.calls]
        g.check(cmds.count("sbatch") == submit, f"{cmds.count('sbatch')} sbatch calls, expected {submit}")
        t = time.perf_counter()
        state.update(lambda doc, nodes: None)
        rewrite = time.perf_counter() - t
        per = g.seconds / max(submit, 1)
        g.notes.append(
            f"{per * 1e3:.0f} ms per job (one sbatch each, the fake's own cost included) plus one "
            f"state rewrite per create_node ({workers + 1:,} records: {rewrite * 1e3:.0f} ms)"
        )
        results.append(g)

    # ---- (f) ray down of the elastic cluster
    f = Result(f"(f) SlurmJobProvider cleanup_cluster_resources, {len(rows) - 1 + submit:,} jobs")
    provider = SlurmJobProvider(config["provider"], ECLUSTER)
    with timed(f, fake):
        provider.cleanup_cluster_resources()
    cancels = [x for x in f.calls if x["cmd"] == "scancel"]
    f.check(len(cancels) == 2, f"{len(cancels)} scancels, expected 2 (the worker jobs, the head's step)")
    left = [r for r in fake.read("jobs") if r.endswith(name)]
    f.check(not left, f"{len(left)} worker jobs still listed")
    f.check(any(r.startswith("777|") for r in fake.read("jobs")), "the user's other job was cancelled")
    f.check(not state.dir.exists(), "the state dir is still there")
    if cancels:
        f.notes.append(
            f"one scancel of {cancels[0]['argc'] - 1:,} job ids, argv {kb(cancels[0]['argv_bytes'])}"
        )
    results.append(f)
    return results


def replacing_round(
    config: dict[str, Any],
    state: ClusterState,
    fake: FakeSlurm,
    rows: list[str],
    doc: dict[str, Any],
    name: str,
    per_job: int,
    workers: int,
    count: int,
) -> Result:
    """(b2): the round of (b) as the head's autoscaler makes it with
    ``replace_before_end_s`` on: every job has a 1-hour limit and ends in 40 minutes (none
    due, but each listing weighs them all: ``WorkerPool._replace_ending``), and 1% of them are being
    replaced by a running job, half of those handed over (old hidden, replacement shown),
    half standing by (``WorkerPool.after_round`` looks at them every call). The synthetic state is put
    back afterwards."""
    from eray_provider.autoscaler.elastic import SlurmJobProvider

    result = Result(f"(b2) SlurmJobProvider head round, replacing, {workers + 1:,} nodes")
    end = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 2400))
    timed_rows = [r.replace("|UNLIMITED|Unknown|UNLIMITED|", f"|1:00:00|{end}|1:00:00|") for r in rows]
    paired = copy.deepcopy(doc)
    olds = [r.split("|", 1)[0] for r in timed_rows if r.endswith(name)][: max(1, len(rows) // 100)]
    written = []
    for j, old in enumerate(olds):
        new = str(FIRST_ELASTIC_JOB + 900_000 + j)
        timed_rows.append(f"{new}|RUNNING|{per_job}|cx{j:05d}|None|1:00:00|{end}|1:00:00|{name}")
        for k in range(per_job):
            new_id, old_id = elastic_node_id(new, k), elastic_node_id(old, k)
            rec = {**paired["nodes"][old_id], "slurm_job": new, "replaces": old_id}
            paired["nodes"][new_id] = rec
            paired["nodes"][old_id]["successor"] = new_id
            kinds = ("standby", "handover") if j % 2 == 0 else ("standby",)
            for kind in kinds:
                state.write_marker(new_id, kind, "0")
                written.append((new_id, kind))
    fake.write("jobs", timed_rows)
    state.write(paired)
    env = {"ERAY_ROLE": "head", "ERAY_CLUSTER": ECLUSTER}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        provider = SlurmJobProvider({**config["provider"], "replace_before_end_s": 600}, ECLUSTER)
        result.check(provider._on_head, "the provider does not take itself for the head's")
        with timed(result, fake):
            rounds(result, provider, workers + 1, count, lambda p: (p.pool.jobs(), p.steps.by_id()))
        submitted = [c for c in result.calls if c["cmd"] == "sbatch"]
        result.check(not submitted, f"{len(submitted)} replacements submitted, none was due")
        handed = sum(1 for _new, kind in written if kind == "handover")
        all_handed = sum(1 for m in state.markers() if m.endswith(".handover"))
        result.check(all_handed == len(olds) * per_job, f"{all_handed} handover markers, expected all")
        result.notes.insert(
            0,
            f"{len(olds):,} jobs paired: {handed:,} handed over, {len(olds) * per_job - handed:,} "
            "standing by (handed over in the first round)",
        )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        fake.write("jobs", rows)
        state.write(doc)
        for m in state.markers():
            if m.endswith((".standby", ".handover")):
                state.marker(*m.rsplit(".", 1)).unlink()
    return result


# ---------------------------------------------------------------------------- main
def report(results: list[Result]) -> bool:
    ok = True
    order = sorted(results, key=lambda r: r.name)
    for r in order:
        status = "FAIL" if r.failed else ("SLOW" if r.slow else "ok")
        estimate = f" (estimated {r.estimate:.0f} s)" if r.estimate else ""
        print(f"{status:4} {r.name:58} {r.seconds * 1e3:10.1f} ms{estimate}  {sizes(r.calls)}")
        for note in r.notes:
            print(f"       {note}")
        for what in r.failed:
            print(f"       FAILED: {what}")
        ok = ok and not r.failed
    calls = [c for r in results for c in r.calls]
    print()
    if calls:
        arg = max(calls, key=lambda c: c["arg_max"])
        var = max(calls, key=lambda c: c["env_max"])
        total = max(calls, key=lambda c: c["argv_bytes"] + c["env_bytes"])
        size = total["argv_bytes"] + total["env_bytes"]
        lim, top = f"{ARG_LIMIT:,}", f"{TOTAL_LIMIT:,}"
        print(f"largest argument     {arg['arg_max']:>9,} B  limit {lim}  {arg['cmd']} {arg['arg_what']!r}")
        print(f"largest env string   {var['env_max']:>9,} B  limit {lim}  {var['cmd']} {var['env_what']}")
        print(f"largest argv + env   {size:>9,} B  limit {top}  {total['cmd']}, {total['argc']:,} args")
        if arg["arg_max"] > ARG_LIMIT or var["env_max"] > ARG_LIMIT or size > TOTAL_LIMIT:
            print("FAIL: a command was built over the kernel's limits")
            ok = False
        unexpected = sorted({c["cmd"] for c in calls if c["cmd"] == "scontrol"})
        if unexpected:
            print(f"FAIL: unexpected calls of {unexpected} (not faked)")
            ok = False
    for r in results:
        if r.round_ms is not None:
            verdict = "ok" if r.round_ms < ROUND_LIMIT_MS else "OVER"
            what = f"{r.round_ms:9.2f} ms limit {ROUND_LIMIT_MS} ms"
            print(f"per-round median     {what}  {verdict}  {r.name[4:]}")
    slow = [r.name for r in results if r.slow]
    if slow:
        print(f"SLOW (> {SLOW_SECONDS:.0f} s): {', '.join(slow)}")
    print("PASS" if ok else "FAIL")
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--nodes-per-job", type=int, default=1, help="nodes of each elastic worker job")
    ap.add_argument("--submit", type=int, default=20, help="jobs submitted in (g)")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        fake = FakeSlurm(root)
        # only the fakes, whatever SLURM this host has; a failed fake call is not retried
        for key in [k for k in os.environ if k.startswith(("SLURM_", "SQUEUE_", "SRUN_", "SBATCH_"))]:
            del os.environ[key]
        os.environ["PATH"] = f"{fake.bin}:{os.environ['PATH']}"
        os.environ["ERAY_SLURM_ATTEMPTS"] = "1"
        os.environ.pop("ERAY_USER_TMPDIR", None)
        results = fixed_paths(args.nodes, root, fake, args.rounds)
        results += elastic_paths(args.nodes, args.nodes_per_job, root, fake, args.rounds, args.submit)
        ok = report(results)
    print(f"total {time.perf_counter() - started:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
