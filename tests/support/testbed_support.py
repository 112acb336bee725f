"""Helpers for tests that run against the SLURM test bed (scripts/slurm-testbed)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

#: the checkout (this file is tests/support/testbed_support.py)
REPO = Path(__file__).resolve().parents[2]
#: the tests' data: what each Slurm prints (``data/capture.sh``), driver scripts
DATA = REPO / "tests" / "data"
TESTBED = REPO / "scripts" / "slurm-testbed"
IN_CI = os.environ.get("CI") == "true"


def up_options(net: str | int, slurm: str) -> list[str]:
    """``slurm-testbed up``'s options for the tests' beds (the session fixture's and
    ``scripts/live-lanes``'): the checkout (and its .venv) visible on the nodes, as on a shared
    file system; the newest Slurm with pyxis and enroot, as container sites run it."""
    containers = ["--containers"] if slurm == "25.11" else []
    return ["--net", str(net), "--share", str(REPO), "--slurm", slurm, *containers]


def require(reason: str) -> None:
    """Skip an integration test that cannot run here, but fail it under CI=true."""
    if IN_CI:
        pytest.fail(f"integration test cannot run under CI=true: {reason}")
    pytest.skip(reason)


class Testbed:
    """A handle on a running test bed: its environment and its SLURM commands."""

    __test__ = False  # not a test class

    def __init__(self, root: str) -> None:
        self.root = root
        self.env = dict(os.environ, SLURM_CONF=f"{root}/etc/slurm.conf")
        try:
            state = json.loads(Path(root, "state.json").read_text())
        except (OSError, ValueError):
            state = {}
        #: the SLURM cluster's name (``ClusterName``): each bed on the machine has its own
        self.cluster_name: str = state.get("cluster_name", "eraytest")
        #: a bed of a Slurm built here (``up --slurm 25.11``): its commands come first
        self.bindir: str = state.get("bindir") or ""
        #: pyxis and enroot (``up --containers``): enroot's prefix, "" without
        self.enroot: str = (state.get("containers") or {}).get("enroot") or ""
        dirs = [d for d in (self.bindir, self.enroot and f"{self.enroot}/bin") if d]
        if dirs:  # enroot on PATH, as a site installs it on every node
            self.env["PATH"] = ":".join([*dirs, self.env["PATH"]])

    def run(self, args: Sequence[str], timeout: float = 60, check: bool = True, **kw):
        proc = subprocess.run(
            list(args),
            env=kw.pop("env", self.env),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            **kw,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(args)} exited {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
            )
        return proc

    def on_node(self, node: str, command: str, timeout: float = 60, check: bool = True):
        """Run a shell command inside a node's namespaces, as if logged in there."""
        return self.run(
            [str(TESTBED), "--dir", self.root, "exec", node, "bash", "-c", command],
            timeout=timeout,
            check=check,
        )

    def salloc(self, *args: str, timeout: float = 60) -> str:
        """Allocate (``salloc --no-shell``) and return the job id."""
        proc = self.run(["salloc", "--no-shell", *args], timeout=timeout)
        m = re.search(r"Granted job allocation (\d+)", proc.stderr + proc.stdout)
        assert m, f"salloc printed no job id: {proc.stderr}"
        return m.group(1)

    def cancel(self, job_id: str) -> None:
        self.run(["scancel", job_id], check=False)

    def scontrol_batch(self, commands: Sequence[str], timeout: float = 120) -> list[list[str]]:
        """Run many ``scontrol`` commands in one process; one list of output lines each."""
        script = "".join(f"show hostnames ERAYMARK{i}\n{c}\n" for i, c in enumerate(commands))
        env = dict(self.env, TERM="dumb", COLUMNS="1000000")
        # "Invalid hostlist" goes to stderr: read both streams in order
        proc = subprocess.run(
            ["scontrol"],
            input=script,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
        results: list[list[str]] = [[] for _ in commands]
        current = -1
        sent = set(script.splitlines())
        for line in proc.stdout.splitlines():
            # scontrol prints its prompt before what it echoes (22.05, with readline) or
            # before its answer (25.11, built without readline)
            while line.startswith("scontrol: "):
                line = line[len("scontrol: ") :]
            if line.startswith("ERAYMARK"):
                current = int(line[len("ERAYMARK") :])
            elif line and line not in sent and not line.startswith(("scontrol:", "error:")) and current >= 0:
                results[current].append(line)
        assert current == len(commands) - 1, f"scontrol stopped early: {proc.stdout[-2000:]}"
        return results


#: A second Unix user for the hostile co-tenant tests (created on demand; the test bed's
#: nodes share the host's users).
OTHER_USER = "eray-mallory"


def other_user() -> str:
    """The second user's name, created (no home) when missing. Its shell is /bin/sh, as a
    site's users have one: enroot starts a container through the user's login shell."""
    import fcntl
    import pwd

    # one process at a time: make test runs unit suites side by side
    with open("/run/lock/eray-test-user.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            shell = pwd.getpwnam(OTHER_USER).pw_shell
            argv = ["usermod", "--shell", "/bin/sh", OTHER_USER] if shell != "/bin/sh" else None
        except KeyError:
            argv = ["useradd", "--system", "--no-create-home", "--shell", "/bin/sh", OTHER_USER]
        if argv:
            proc = subprocess.run(argv, capture_output=True, text=True)
            if proc.returncode != 0:
                require(f"cannot make the second user {OTHER_USER}: {proc.stderr.strip()}")
    return OTHER_USER


def wait_until(
    what: str, check: Callable[[], bool], proc: subprocess.Popen | None = None, timeout: float = 300
) -> None:
    """Poll ``check`` (an event, not a time) until it holds; fail naming ``what`` when
    ``timeout`` passes, or at once when ``proc`` ends first (with what it printed)."""
    deadline = time.monotonic() + timeout
    while not check():
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"the process ended before {what}: {out[-3000:]}")
        assert time.monotonic() < deadline, f"never saw {what} within {timeout} s"
        time.sleep(0.1)


#: Run as another user on a node: try to bind each (address, port) with every option that
#: might let it in; prints the JSON list of those it got.
_TRY_BINDS = r"""
import json, socket, sys
got = []
for addr, port in json.loads(sys.argv[1]):
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    s = socket.socket(fam)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        s.bind((addr, port))
        got.append([addr, port])
    except OSError:
        pass
    s.close()
print(json.dumps(got))
"""


def binds_as(testbed: Testbed, node: str, user: str, targets: list[tuple[str, int]]) -> list[list]:
    """What ``user`` can bind of ``targets`` (address, port) on ``node`` right now."""
    code = shlex.quote(_TRY_BINDS)
    arg = shlex.quote(json.dumps(targets))
    proc = testbed.on_node(node, f"runuser -u {user} -- /usr/bin/python3 -c {code} {arg}", timeout=60)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def listeners(testbed: Testbed, node: str) -> list[tuple[str, int, str]]:
    """(address, port, process) of every listening TCP socket in the node's namespace."""
    rows = []
    for line in testbed.on_node(node, "ss -ltnpH").stdout.splitlines():
        parts = line.split()
        addr, _, port = parts[3].rpartition(":")
        proc = parts[5].split('"')[1] if len(parts) > 5 and '"' in parts[5] else "?"
        rows.append((addr.strip("[]"), int(port), proc))
    return rows
