"""Helpers for tests that bring up Ray clusters with the provider on the test bed."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml
from testbed_support import REPO, Testbed

from eray_provider.runtime.node_logs import collected

VENV_BIN = str(Path(sys.executable).parent)


class Cluster:
    """One cluster YAML on one job, driven through the real ``ray`` CLI."""

    def __init__(
        self, testbed: Testbed, job_id: str, workdir: Path, name: str, login_side: bool = False, **config
    ) -> None:
        self.testbed = testbed
        self.job_id = job_id
        self.name = name
        base = yaml.safe_load((REPO / "cluster_yamls" / "slurm-cluster.yaml").read_text())
        base["cluster_name"] = name
        provider_extra = config.pop("provider", {})
        base["provider"].update(provider_extra)
        if login_side:
            base["provider"]["job_id"] = job_id
        base.update(config)
        self.config = workdir / f"{name}.yaml"
        self.config.write_text(yaml.safe_dump(base))
        self.env = dict(testbed.env, PATH=f"{VENV_BIN}:{os.environ['PATH']}")
        self.env.pop("SLURM_JOB_ID", None)
        if not login_side:
            self.env["SLURM_JOB_ID"] = job_id
        self.state_dir = Path.home() / ".eray-provider" / f"{name}-{job_id}"

    def ray(self, *args: str, timeout: float = 300, check: bool = True, env=None):
        return self.testbed.run(
            ["ray", *args], timeout=timeout, check=check, env=env or self.env, cwd=str(REPO)
        )

    def up(self, env=None):
        return self.ray("up", "-y", str(self.config), env=env)

    def down(self, check: bool = True):
        return self.ray("down", "-y", str(self.config), check=check)

    def exec(self, command: str, **kw):
        return self.ray("exec", str(self.config), command, **kw)

    def alive_nodes(self) -> list[dict]:
        code = (
            "import json, ray; ray.init(); "
            "print('NODES=' + json.dumps([{'ip': n['NodeManagerAddress'], 'id': n['NodeID'], "
            "'resources': n['Resources'], 'labels': n.get('Labels', {})} "
            "for n in ray.nodes() if n['Alive']]))"
        )
        out = self.exec(f"python -c {shlex.quote(code)}", timeout=120).stdout
        line = next(line for line in out.splitlines() if line.startswith("NODES="))
        return json.loads(line[len("NODES=") :])

    def wait_nodes(
        self, count: int, timeout: float = 180, exclude: set[str] = frozenset(), at_most: bool = False
    ) -> list[dict]:
        """Poll the GCS (not a sleep) until ``count`` nodes are alive (``at_most``: no more
        than ``count``); fail after ``timeout``."""
        deadline = time.monotonic() + timeout
        nodes: list[dict] = []
        while time.monotonic() < deadline:
            nodes = [n for n in self.alive_nodes() if n["id"] not in exclude]
            if (len(nodes) <= count) if at_most else (len(nodes) >= count):
                return nodes
            time.sleep(2)
        raise AssertionError(f"{len(nodes)} of {count} nodes alive after {timeout} s: {nodes}")


def monitor_log(
    testbed: Testbed, job_id: str, until: Callable[[str], bool] = lambda _: True, timeout: float = 60
) -> str:
    """The head's ``monitor.log``, polled until ``until(text)`` holds or ``timeout`` passes.

    The autoscaler writes an instance's transitions a round (about 5 s) after the node
    joins the GCS, so a check made the moment ``ray up`` returns can come too early. At the
    timeout the last text is returned, and the caller's assertion shows it."""
    deadline = time.monotonic() + timeout
    while True:
        text = testbed.on_node(
            "node1", f"cat /tmp/eray-{job_id}-*/ray/session_latest/logs/monitor.log 2>/dev/null || true"
        ).stdout
        if until(text) or time.monotonic() >= deadline:
            return text
        time.sleep(1)


def cluster_pids(job_id: str, cluster: str) -> list[int]:
    """Processes of one cluster on any test bed node (the nodes share the PID namespace);
    ``cluster`` ending in ``*`` matches every cluster name with that prefix."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        named = (
            any(e.startswith(f"ERAY_CLUSTER={cluster[:-1]}".encode()) for e in environ)
            if cluster.endswith("*")
            else f"ERAY_CLUSTER={cluster}".encode() in environ
        )
        mine = f"ERAY_JOB_ID={job_id}".encode() in environ and named
        if mine or (f"eray.{cluster}." in cmd and f"--jobid={job_id} " in cmd):
            found.append(int(entry.name))
    return found


def wait_gone(job_id: str, cluster: str, timeout: float = 60) -> list[int]:
    deadline = time.monotonic() + timeout
    pids = cluster_pids(job_id, cluster)
    while pids and time.monotonic() < deadline:
        time.sleep(0.5)
        pids = cluster_pids(job_id, cluster)
    return pids


def state_left(state_dir: Path) -> list[str]:
    """What a teardown left of a cluster's state dir besides the node logs it keeps
    (``ray-logs/``, see ``node_logs``): [] when the teardown was complete."""
    if not state_dir.exists():
        return []
    return sorted(
        str(p.relative_to(state_dir))
        for p in state_dir.rglob("*")
        if p.relative_to(state_dir).parts[0] != "ray-logs"
    )


def collected_logs(state_dir: Path) -> dict[str, dict]:
    """Node id -> ``node.json`` of the Ray logs collected into a state dir."""
    return {c.node_id: c.meta for c in collected(state_dir)}


def node_tmp_entries(testbed: Testbed, node: str, job_id: str) -> list[str]:
    out = testbed.on_node(node, f"ls -d /tmp/eray-{job_id}-* 2>/dev/null || true").stdout
    return out.split()


def run_attach(cluster: Cluster, lines: list[str], timeout: float = 120) -> str:
    """``ray attach`` under a pseudo-terminal (script), typing ``lines`` into its shell."""
    feed = "; ".join(f"sleep 4; echo {shlex.quote(line)}" for line in lines) + "; sleep 2; echo exit"
    proc = subprocess.run(
        [
            "bash",
            "-c",
            f"({feed}) | script -qec {shlex.quote('ray attach ' + str(cluster.config))} /dev/null",
        ],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(REPO),
    )
    return proc.stdout
