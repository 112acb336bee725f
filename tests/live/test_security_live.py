"""A hostile co-tenant on the real test bed: another Unix user plants, connects and reads.

One allocation, two clusters whose names extend each other (``pfx`` and ``pfx-b``):

- a config cache planted by another user for the stock YAML is refused, and nothing of
  it runs;
- a cluster name that breaks the step-name grammar (``pfx.b``) is refused, naming
  ``cluster_name``;
- ``ray exec 'echo ray stop'`` leaves the cluster running;
- no door opened first: on every node the other user can listen on no loopback port of
  the cluster's block (held by node_run), while a Ray driver without the bind shim runs;
- the listener census: every listening socket on every node belongs to one of the two
  clusters' port plans or to SLURM; each of the cluster's listeners is probed by the other
  user from another node without the token: the authenticated ones refuse, and every one
  that answers is named in docs/security.md as unauthenticated;
- the token file is unreadable to that user, and it can plant no node marker (exit,
  drain, standby, handover) in the cluster's state dir;
- ``ray down`` of ``pfx`` leaves every step of ``pfx-b`` running.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path

import pytest
import yaml
from ray.autoscaler._private.util import prepare_config
from ray_cluster_support import Cluster, node_tmp_entries
from testbed_support import REPO, Testbed, listeners, other_user, require

from eray_provider.autoscaler.config_cache import cache_path
from eray_provider.autoscaler.provider import SlurmNodeProvider
from eray_provider.plan.ports import Excluded, candidates
from eray_provider.plan.provider_config import update_filled
from eray_provider.runtime.port_probe import parse_reports
from eray_provider.runtime.ray_compat import AGENT_HTTP_TOKEN_CHECK, WORKER_TEMP_DIR_FROM_HEAD

pytestmark = [pytest.mark.slurm, pytest.mark.ray]

STOCK = REPO / "cluster_yamls" / "slurm-cluster.yaml"
NODES = ("node1", "node2", "node3")
#: The bed's port ranges (Linux's default ephemeral range, its SrunPortRange), for the plan's order.
BED_RANGES = [
    Excluded(60001, 63000, "SrunPortRange"),
    Excluded(32768, 60999, "ip_local_port_range", soft=True),
]
#: How each of a cluster's listeners is asked for something without the token.
PROBES = {
    "gcs": ("grpc", "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo"),
    "node_manager": ("grpc", "/ray.rpc.NodeManagerService/GetNodeStats"),
    "object_manager": ("grpc", "/ray.rpc.ObjectManagerService/Pull"),
    "dashboard_agent_grpc": ("grpc", "/ray.rpc.ReporterService/HealthCheck"),
    "client_server": ("grpc", "/ray.rpc.RayletDriver/ClusterInfo"),
    "worker": ("grpc", "/ray.rpc.CoreWorkerService/NumPendingTasks"),
    "dashboard": ("http", "/api/nodes"),
    "dashboard_agent_listen": ("http", "/api/job_agent/jobs/probe/logs"),
    "runtime_env_agent": ("http", "/get_or_create_runtime_env"),
    "metrics_export": ("http", "/metrics"),
    "autoscaler_metrics": ("http", "/metrics"),
    "dashboard_metrics": ("http", "/metrics"),
}


def port_names(plan: dict) -> dict[int, str]:
    """Port -> its name in a recorded port plan (named ports, JAX ports, worker range)."""
    names = {plan[k]: k for k in PROBES if k in plan}
    names.update({p: "jax" for p in range(plan["jax_first"], plan["jax_first"] + plan["jax_count"])})
    names.update({p: "worker" for p in range(plan["min_worker"], plan["max_worker"] + 1)})
    return names


def readme_unauthenticated() -> set[str]:
    """Listener names docs/security.md lists as answering without the token (its listener table)."""
    text = (REPO / "docs" / "security.md").read_text()
    section = text[text.index("# Security") :]
    end = section.find("\n## ")
    section = section if end < 0 else section[:end]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {re.match(r"\| `([a-z_]+)`", r).group(1) for r in rows if r.rstrip(" |").endswith("no")}


def other_python() -> str:
    """A Python the other user may run (ours may live under root's 0700 home), with our
    site-packages (for grpc) on its path."""
    system = "/usr/bin/python3"
    probe = subprocess.run(
        [system, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
    )
    if probe.stdout.strip() != str(tuple(sys.version_info[:2])):
        require(f"{system} is not Python {sys.version_info[:2]}: the other user cannot run our packages")
    site = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(str(REPO)))
    return f"env PYTHONPATH={shlex.quote(site)} {system}"


def node_shell(testbed: Testbed, node: str) -> list[str]:
    """The argv prefix that runs a shell command inside a node's namespaces."""
    return [str(REPO / "scripts" / "slurm-testbed"), "--dir", testbed.root, "exec", node, "bash", "-c"]


#: What a spy reports when the cluster's holds kept it out: it bound nothing, got nothing.
NOTHING = {"bound": [], "received": {}}


class LoopbackSpies:
    """The other user's spy (``drivers/loopback_spy.py``) on every node, listening on
    loopback wherever it can among ports LO..HI while the ``with`` block runs clients;
    ``caught`` is then what each node's spy bound and received."""

    def __init__(self, testbed: Testbed, user: str, lo: int, hi: int) -> None:
        spy = f"/usr/bin/python3 {REPO}/tests/drivers/loopback_spy.py {lo} {hi} 900"
        self.procs = {
            node: subprocess.Popen(
                [*node_shell(testbed, node), f"runuser -u {user} -- {spy}"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=testbed.env,
            )
            for node in NODES
        }
        self.caught: dict[str, object] = {}

    def __enter__(self) -> LoopbackSpies:
        for node, proc in self.procs.items():
            assert proc.stdout is not None
            first = proc.stdout.readline().strip()
            assert first.startswith("bound "), (node, first, proc.stderr.read() if proc.poll() else "")
        return self

    def __exit__(self, *exc: object) -> None:
        for node, proc in self.procs.items():
            out, err = proc.communicate(input="", timeout=120)  # stdin closed: the spy reports
            self.caught[node] = json.loads(out.strip().splitlines()[-1]) if out.strip() else err


def as_other_user(testbed: Testbed, node: str, user: str, command: str, check: bool = True):
    return testbed.on_node(node, f"runuser -u {user} -- {command}", check=check, timeout=120)


def plant_cache(job: str, login_tmp: Path, user: str, marker: Path) -> Path:
    """What another user can write: a complete, valid bootstrapped config for the stock
    YAML, at the name Ray will read, whose python and setup commands are the attacker's."""
    prepared = prepare_config(yaml.safe_load(STOCK.read_text()))
    config = json.loads(json.dumps(prepared))
    config["provider"]["job_id"] = job
    filled = SlurmNodeProvider.fillout_available_node_types_resources(config)
    evil = login_tmp / "evil.sh"
    evil.write_text(f'#!/bin/sh\ntouch {marker}\nexec python3 "$@"\n')
    evil.chmod(0o755)
    filled["provider"]["python"] = str(evil)
    for key in ("setup_commands", "head_setup_commands", "worker_setup_commands"):
        filled[key] = [f"touch {marker}"]
    update_filled(filled["provider"], job_id_from_config=True, worker_setup_commands=(f"touch {marker}",))
    doc = json.dumps({"_version": 1, "provider_log_info": None, "config": filled})
    path = login_tmp / Path(cache_path(prepared)).name
    write = f"import sys; open({str(path)!r}, 'w').write(sys.stdin.read())"
    subprocess.run(
        ["runuser", "-u", user, "--", "/usr/bin/python3", "-c", write], input=doc, text=True, check=True
    )
    return path


@pytest.mark.smoke
def test_a_hostile_cotenant_gets_nothing(testbed: Testbed, tmp_path) -> None:
    user = other_user()
    job = testbed.salloc("-N3", "-c2", "--mem=3000", "-J", "eray-sec")
    # the login node's world-writable /tmp, where Ray's CLI keeps its config cache
    login_tmp = Path(tempfile.mkdtemp(prefix="eray-login-tmp-", dir="/tmp"))
    login_tmp.chmod(0o1777)
    marker = REPO / ".test-output" / f"pwned-{uuid.uuid4().hex}"
    marker.parent.mkdir(exist_ok=True)
    a = Cluster(testbed, job, tmp_path, "pfx")
    b = Cluster(testbed, job, tmp_path, "pfx-b")
    try:
        # 1. a config cache planted by another user (0644, theirs) is refused, not run
        planted = plant_cache(job, login_tmp, user, marker)
        st = planted.stat()
        assert st.st_uid != os.getuid() and st.st_mode & 0o777 == 0o644
        env = dict(a.env, TMPDIR=str(login_tmp))
        proc = a.ray("up", "-y", str(STOCK), env=env, check=False, timeout=180)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and str(planted) in out and "refusing" in out, out[-3000:]
        assert not marker.exists(), "the planted config ran"
        assert not planted.exists()  # removed (we are root here)
        assert not (Path.home() / ".eray-provider" / f"slurm-demo-{job}").exists()

        # 2. a name that would extend another cluster's step names is refused
        dotted = Cluster(testbed, job, tmp_path, "pfx.b")
        proc = dotted.ray("up", "-y", str(dotted.config), check=False, timeout=180)
        assert proc.returncode != 0 and "cluster_name: 'pfx.b'" in proc.stdout + proc.stderr

        # 2b. a co-tenant holds 160 ports on node2, four in each of the job's first 40 candidate
        # blocks (as the plan on the bed's nodes orders them): the cluster starts all the
        # same, in a block the probe checked, none of whose ports is held
        squatted = [c.block_start + k for c in candidates(job, BED_RANGES)[:40] for k in (0, 3, 40, 200)]
        squatter = subprocess.Popen(
            [
                *node_shell(testbed, "node2"),
                f"runuser -u {user} -- /usr/bin/python3 "
                f"{REPO}/tests/drivers/port_squatter.py {' '.join(map(str, squatted))}",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=testbed.env,
        )
        try:
            assert squatter.stdout is not None
            assert squatter.stdout.readline().split() == ["holding", "160"]
            a.up(env=dict(a.env, TMPDIR=str(login_tmp)))
            b.up()
            a.wait_nodes(3)
            b.wait_nodes(3)
            for c in (a, b):
                plan = json.loads((c.state_dir / "ports.json").read_text())
                block = range(plan["block_start"], plan["max_worker"] + 1)
                assert not set(block) & set(squatted), (c.name, plan["block_start"])
                # before Ray 2.55, the path every worker's Ray takes is the head's, claimed on
                # every node by the probe before the head started (test_a_planted_temp_dir...)
                claimed = c.state_dir / "claimed_temp_dir"
                assert claimed.exists() == WORKER_TEMP_DIR_FROM_HEAD
                if WORKER_TEMP_DIR_FROM_HEAD:
                    dirs = [p.read_text().splitlines() for p in (c.state_dir / "nodes").glob("*.tmpdir")]
                    head = next(d for d in dirs if d[0] == "node1")  # the head's (node, dirs...)
                    assert head[1:] == [claimed.read_text()], dirs
        finally:
            squatter.communicate(input="", timeout=30)
        # what Ray's CLI cached for us is private, and is gone when the command ends
        assert not list(login_tmp.glob("ray-config-*"))

        # 3. `ray stop` as words inside another command does not stop the cluster
        assert "ray stop" in a.exec("echo ray stop").stdout
        assert len(a.wait_nodes(3, timeout=30)) == 3

        # 4. the listener census, and the other user's probes from another node
        plans = {c.name: json.loads((c.state_dir / "ports.json").read_text()) for c in (a, b)}
        names = {c: port_names(p) for c, p in plans.items()}
        head_ip = a.exec("echo $RAY_ADDRESS").stdout.strip().splitlines()[-1].split(":")[0]
        found: dict[str, list[tuple[str, str, int]]] = {}
        stray = []
        for node in NODES:
            for addr, port, proc_name in listeners(testbed, node):
                owner = next((c for c in names if port in names[c]), None)
                if owner == "pfx":
                    found.setdefault(names["pfx"][port], []).append((node, addr, port))
                elif owner is None and proc_name not in ("slurmd", "slurmstepd", "srun"):
                    stray.append((node, addr, port, proc_name))
        assert stray == [], f"listeners that belong to no cluster and not to SLURM: {stray}"
        wildcard = [(k, row) for k, rows in found.items() for row in rows if row[1] in ("*", "0.0.0.0", "::")]
        assert wildcard == [], wildcard
        assert "metrics_export" not in found  # off unless provider.metrics_export: true
        for required in ("gcs", "dashboard", "node_manager", "object_manager", "worker"):
            assert required in found, (required, sorted(found))
        targets = []
        for name, rows in found.items():
            for node, addr, port in rows:
                host = addr if addr not in ("127.0.0.1", "::1") else None
                if host and name in PROBES:
                    targets.append([f"{name}@{node}:{port}", host, port, *PROBES[name]])
        python = other_python()
        probe = as_other_user(
            testbed,
            "node2",
            user,
            f"{python} {REPO}/tests/drivers/auth_probe.py {shlex.quote(json.dumps(targets))}",
        )
        results = json.loads(probe.stdout.strip().splitlines()[-1])
        answered = {key.split("@")[0] for key, r in results.items() if r == "open"}
        # a tokenless gRPC call gets no answer (UNAVAILABLE here, not UNAUTHENTICATED: the
        # exact status is not what this test claims); HTTP must say 401/403 or answer
        for key, r in list(results.items()):
            if r.startswith("unreachable") and PROBES[key.split("@")[0]][0] == "grpc":
                results[key] = "refused"
        # before Ray 2.54 the dashboard agent's HTTP server has no token check (Ray's own
        # gap, said at every `ray` command and in docs/security.md): its job handler answers a
        # tokenless request, so the claim of docs/security.md is shown, both ways
        agent = {k: results.pop(k) for k in list(results) if k.startswith("dashboard_agent_listen@")}
        assert len(agent) == len(NODES), agent
        if AGENT_HTTP_TOKEN_CHECK:
            assert set(agent.values()) == {"refused"}, agent
        else:
            assert all(r == "open" or r.startswith("other:") for r in agent.values()), agent
        unexpected = {k: r for k, r in results.items() if r not in ("refused", "open")}
        assert unexpected == {}, unexpected
        assert answered - {"dashboard_agent_listen"} <= readme_unauthenticated(), answered
        for name in ("gcs", "node_manager", "object_manager", "dashboard", "worker", "runtime_env_agent"):
            assert all(r == "refused" for k, r in results.items() if k.startswith(f"{name}@")), results
        assert any(k.startswith("dashboard@") for k in results) and head_ip

        # 4b. no door opened first: the other user cannot listen on loopback on any named port
        # of the cluster's block, on any node (node_run holds them from before Ray starts), so
        # a Ray client without the bind shim (a user's own ray.init with the documented
        # variables, which sends its metrics with the token to 127.0.0.1) hands the spy nothing
        plan_a = json.loads((a.state_dir / "ports.json").read_text())
        lo, hi = plan_a["block_start"], plan_a["jax_first"] - 1
        with LoopbackSpies(testbed, user, lo, hi) as spies:
            address = a.exec("echo $RAY_ADDRESS").stdout.strip().splitlines()[-1]
            driver = (
                f"env -u LD_PRELOAD RAY_ADDRESS={address} RAY_AUTH_MODE=token "
                f"RAY_AUTH_TOKEN_PATH={a.state_dir / 'auth_token'} {sys.executable} -c "
                + shlex.quote(
                    "import ray, time; ray.init(); "
                    "print('R', sum(ray.get([ray.remote(lambda i: i).remote(i) for i in range(20)]))); "
                    "time.sleep(12)"  # long enough for the driver's metrics export
                )
            )
            # on the head's node (a driver on a worker node looks for the head's temp dir
            # there: Ray's own limit, not this test's); its tasks run on every node
            ran = testbed.on_node("node1", driver, timeout=180)
            assert "R 190" in ran.stdout, (ran.stdout[-2000:], ran.stderr[-2000:])
            # the JAX launcher's group (ranks in actors on every node, jax.distributed) from
            # a driver of `ray submit`
            out = a.ray("submit", str(a.config), "tests/drivers/jax_groups.py", "sequential", timeout=300)
            assert out.stdout.count('"sum": 6') >= 2, out.stdout[-3000:]
        assert spies.caught == {node: NOTHING for node in NODES}, spies.caught

        # 5. the token is unreadable to the other user, on any node, and so is every node's
        # temp dir: Ray makes its own temp dir world-writable, one level below a private one
        token = a.state_dir / "auth_token"
        for node in NODES:
            read = as_other_user(testbed, node, user, f"cat {shlex.quote(str(token))}", check=False)
            assert read.returncode != 0 and token.read_text() not in read.stdout
            dirs = node_tmp_entries(testbed, node, job)
            # one per cluster, and before Ray 2.55 a worker's own (its TMPDIR) beside the
            # head's path, which its Ray runs in
            per_cluster = 2 if WORKER_TEMP_DIR_FROM_HEAD and node != "node1" else 1
            assert len(dirs) == 2 * per_cluster, (node, dirs)
            for d in dirs:
                mode = testbed.on_node(node, f"stat -c %a {d}").stdout.strip()
                assert mode == "700", (node, d, mode)
                # Ray's own dir where this one holds it, else the dir itself; refused for
                # want of permission, not for a missing path
                inner = testbed.on_node(node, f"test -d {d}/ray && echo {d}/ray || echo {d}").stdout.strip()
                look = as_other_user(testbed, node, user, f"ls {inner}", check=False)
                plant = as_other_user(testbed, node, user, f"touch {inner}/planted", check=False)
                assert look.returncode != 0 and plant.returncode != 0, (node, inner, look.stdout)
                assert "Permission denied" in look.stderr + plant.stderr, (node, inner, look.stderr)

        # 6. nor can it plant a node's marker, which the providers and node processes act on
        # (an exit: the node is gone; a drain; an elastic replacement's standby or handover:
        # it starts Ray), or list the cluster's state dir, where they live
        for node in NODES[:2]:
            for kind in ("exit", "drain", "standby", "handover"):
                target = a.state_dir / "nodes" / f"planted.{kind}"
                plant = as_other_user(testbed, node, user, f"touch {shlex.quote(str(target))}", check=False)
                assert plant.returncode != 0 and "Permission denied" in plant.stderr, (node, kind)
                assert not target.exists()
            look = as_other_user(testbed, node, user, f"ls {shlex.quote(str(a.state_dir))}", check=False)
            assert look.returncode != 0 and "Permission denied" in look.stderr, (node, look.stderr)

        # 7. ray down of `pfx` leaves every step of `pfx-b` running
        def steps() -> dict[str, str]:
            out = testbed.run(["squeue", "-h", "-s", "-j", job, "-o", "%i %j"]).stdout
            return dict(line.split(None, 1) for line in out.splitlines() if line.strip())

        before = {sid: n for sid, n in steps().items() if n.startswith("eray.pfx-b.")}
        assert len(before) >= 2, steps()  # head and workers of pfx-b
        a.down()
        after = steps()
        assert not [n for n in after.values() if n.startswith("eray.pfx.")], after
        assert before.items() <= after.items()
        assert len(b.wait_nodes(3, timeout=30)) == 3
    finally:
        for cluster in (a, b):
            cluster.down(check=False)
        testbed.cancel(job)
        marker.unlink(missing_ok=True)
        subprocess.run(["rm", "-rf", str(login_tmp)], check=False)


@pytest.mark.smoke
def test_a_planted_temp_dir_is_reported_by_the_probe_and_never_used(testbed: Testbed) -> None:
    """The node side of the temp dir claim (``launch.temp_dir_claim``), on the real nodes: the
    probe's step makes the path (from its environment: every user can read an argv, as the
    attack review did to win every round) private on every node, and names the other user
    who made it first on one; ``--drop`` then removes ours and leaves theirs."""
    user = other_user()
    job = testbed.salloc("-N3", "-c1", "--mem=500", "-J", "eray-claim")
    path = f"/tmp/eray-{job}-{uuid.uuid4().hex[:12]}"
    try:
        as_other_user(testbed, "node2", user, f"mkdir -m 700 {path}")
        probe = [sys.executable, "-m", "eray_provider.runtime.port_probe"]
        srun = ["srun", f"--jobid={job}", "-N3", "--ntasks-per-node=1", "--overlap"]
        proc = testbed.run([*srun, *probe, "20001"], env=dict(testbed.env, ERAY_CLAIM_DIR=path), timeout=120)
        reports = parse_reports(proc.stdout)
        assert sorted(reports) == list(NODES)
        assert {n: r.planted for n, r in reports.items()} == {"node1": "", "node2": user, "node3": ""}
        for node in NODES:
            owner = testbed.on_node(node, f"stat -c '%U %a' {path}").stdout.split()
            assert owner == ([user, "700"] if node == "node2" else ["root", "700"]), (node, owner)
        testbed.run([*srun, *probe, f"--drop={path}"], timeout=120)
        left = {n: testbed.on_node(n, f"test -d {path}", check=False).returncode == 0 for n in NODES}
        assert left == {"node1": False, "node2": True, "node3": False}, left
    finally:
        testbed.on_node("node2", f"rm -rf {path}", check=False)
        testbed.cancel(job)


@pytest.mark.smoke
def test_the_seed_apis_drivers_hand_a_loopback_spy_nothing(testbed: Testbed) -> None:
    """``DistributedConfig`` then ``auto_ray_cluster`` in every task of ``srun -N3``: each
    task is a Ray driver without the bind shim (the path of item 1 of the co-tenant issue).
    The other user listens on loopback on the cluster's block on every node while they run
    tasks and export their metrics: nothing binds, nothing arrives."""
    user = other_user()
    job = testbed.salloc("-N3", "-c2", "--mem=3000", "-J", "eray-seed-spy")
    gate = REPO / ".test-output" / f"gate-{uuid.uuid4().hex}"
    gate.parent.mkdir(exist_ok=True)
    env = dict(testbed.env, JAX_PLATFORMS="cpu", ERAY_TEST_GATE=str(gate))
    argv = ["srun", f"--jobid={job}", "--overlap", "-N3", "-n3", "--ntasks-per-node=1",
            sys.executable, "tests/drivers/auto_cluster.py"]  # fmt: skip
    proc = subprocess.Popen(
        argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: queue.Queue[str] = queue.Queue()
    seen: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        ready = 0
        while ready < 3:
            seen.append(lines.get(timeout=300))  # every task's cluster is up, waiting at the gate
            ready += seen[-1].startswith("READY")
        (ports,) = (Path.home() / ".eray-provider").glob(f"step*-{job}/ports.json")
        plan = json.loads(ports.read_text())
        with LoopbackSpies(testbed, user, plan["block_start"], plan["jax_first"] - 1) as spies:
            gate.touch()
            code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        gate.unlink(missing_ok=True)
        testbed.cancel(job)
    reader.join(timeout=60)  # the output's end
    while not lines.empty():
        seen.append(lines.get())
    assert code == 0, "".join(seen)[-4000:]
    assert spies.caught == {node: NOTHING for node in NODES}, spies.caught
    gathers = sorted(line.split()[1:] for line in seen if line.startswith("GATHER "))
    assert gathers == [["0", "6"], ["1", "6"], ["2", "6"]], "".join(seen)[-4000:]
