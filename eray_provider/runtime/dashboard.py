"""``eray-provider dashboard CONFIG_OR_CLUSTER``: the head's dashboard on a local port.

``ray dashboard`` forwards through ssh, which a SLURM cluster does not offer, and the
port changes with the job. This listens on ``127.0.0.1:PORT`` where it runs (the login
node) and carries every connection to the head's dashboard:

- ``direct``: a TCP connection to the head's address, where the login node can route
  to the compute nodes;
- ``srun``: through one ``srun --overlap`` step on the head (``relay``), where it
  cannot; every connection is a channel of the step's stdin and stdout.

``auto`` (the default) tries a direct connection first. The dashboard demands the
cluster's token (Ray's token authentication) and this forwards bytes only: it adds no
token to what it carries, so whoever else reaches the local port (another user of the
login node) meets the same demand. The token reaches the browser through Ray's cookie
(``ray-authentication-token``): the printed link ``/eray-provider/login/<secret>``, a
random secret of this run, answered here and never forwarded, sets the cookie and
redirects to the dashboard.

It ends with the cluster (the relay step ends with the job; otherwise the head's exit,
the state's removal or SLURM's word that the job is gone) or on Ctrl-C, and the relay
step ends with it.
"""

from __future__ import annotations

import hmac
import os
import re
import secrets
import signal
import socket
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..plan.modules import RELAY, python_m
from ..plan.names import step_name
from ..slurm.client import SlurmCommandError, slurm_timeout
from ..slurm.env import job_id_from_env
from ..slurm.srun import job_state, srun_argv
from .cluster_state import ClusterState
from .node_run import current_head
from .relay_client import RelayClient

LOGIN_PREFIX = "/eray-provider/login/"
#: Ray's cookie for the dashboard's token (``authentication_constants``).
TOKEN_COOKIE = "ray-authentication-token"
DIRECT_CONNECT_TIMEOUT = 3.0
#: Seconds a browser may take to send a connection's first request line.
FIRST_LINE_TIMEOUT = 10.0
#: How often the cluster's end is checked (state, head marker), and SLURM asked.
CHECK_SECONDS, SLURM_CHECK_SECONDS = 2.0, 30.0
#: Seconds the relay's srun step may take to start (it is printed only once it runs).
RELAY_START_TIMEOUT = 60.0
#: Local connections carried at once; more wait in the listen queue.
MAX_CONNECTIONS = 256
_PATH = re.compile(r"/[A-Za-z0-9/_.~%?=&#:,+-]*")


@dataclass(frozen=True)
class Head:
    node_id: str
    slurm_node: str
    address: str
    port: int


def find_head(state: ClusterState) -> Head:
    """The head's dashboard address, from the state dir; ValueError when there is none."""
    if not state.exists():
        raise ConfigError(
            f"cluster {state.cluster_name!r} of job {state.job_id} is not running ({state.dir})"
        )
    head = current_head(state)
    ip = state.read_marker(head, "ip") if head else None
    plan = state.ports()
    if head is None or ip is None or plan is None:
        raise ConfigError(f"cluster {state.cluster_name!r} of job {state.job_id} has no running head")
    if state.read_marker(head, "exit") is not None:
        raise ConfigError(
            f"the head {head} of cluster {state.cluster_name!r} exited: see `eray-provider status`"
        )
    slurm_node = state.records()[head].slurm_node
    return Head(head, slurm_node, ip, plan.dashboard)


def login_target(first_line: bytes, secret: str) -> str | None:
    """Where to send the browser when a request line is ``GET <LOGIN_PREFIX><secret>``
    (``?next=/path``: a path of the dashboard, else ``/``); None for any other line. The
    secret is compared in constant time."""
    parts = first_line.split()
    if len(parts) != 3 or parts[0] != b"GET" or not parts[1].startswith(LOGIN_PREFIX.encode()):
        return None
    target = parts[1][len(LOGIN_PREFIX) :].decode("latin-1")
    given, _, query = target.partition("?")
    if not hmac.compare_digest(given.encode("latin-1"), secret.encode()):
        return None
    nxt = urllib.parse.parse_qs(query).get("next", ["/"])[0]
    # a path here only: no other site, no header injection
    if not _PATH.fullmatch(nxt) or nxt.startswith(("//", "/\\")):
        return "/"
    return nxt


def login_response(token: str, location: str = "/") -> bytes:
    """Set Ray's token cookie (HttpOnly, SameSite=Strict, as Ray's own login sets it) and
    send the browser on to ``location`` (a path ``login_target`` checked)."""
    return (
        "HTTP/1.1 303 See Other\r\n"
        f"Set-Cookie: {TOKEN_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict; Max-Age=86400\r\n"
        f"Location: {location}\r\n"
        "Cache-Control: no-store\r\n"
        "Referrer-Policy: no-referrer\r\n"
        "Content-Length: 0\r\n"
        "Connection: close\r\n\r\n"
    ).encode()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(1 << 16):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _reachable(head: Head) -> bool:
    """Whether this machine reaches the head's dashboard; ValueError when the head answers
    but refuses (the dashboard is down: a relay would not help)."""
    try:
        socket.create_connection((head.address, head.port), timeout=DIRECT_CONNECT_TIMEOUT).close()
        return True
    except ConnectionRefusedError as e:
        raise ConfigError(
            f"the head's dashboard at {head.address}:{head.port} refuses connections (is it up? "
            "see `eray-provider status` and `eray-provider logs CLUSTER --component dashboard`)"
        ) from e
    except OSError:
        return False


def _first_line(sock: socket.socket) -> bytes:
    """The bytes a connection sent until its first line ended (or the timeout)."""
    sock.settimeout(FIRST_LINE_TIMEOUT)
    data = b""
    try:
        while b"\r\n" not in data and len(data) < 8192:
            chunk = sock.recv(8192)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    sock.settimeout(None)
    return data


class Forwarder:
    """Accepts local connections: answers the login link, carries the rest to the head."""

    def __init__(self, state: ClusterState, head: Head, relay: RelayClient | None) -> None:
        self.state, self.head, self.relay = state, head, relay
        self.token = state.token_path.read_text().strip()
        self.secret = secrets.token_urlsafe(24)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._slurm_checked = time.monotonic()

    def serve_one(self, sock: socket.socket) -> None:
        try:
            first = _first_line(sock)
            location = login_target(first.split(b"\r\n", 1)[0], self.secret)
            if location is not None:
                sock.sendall(login_response(self.token, location))
            elif self.relay is not None:
                self.relay.carry(sock, first)
            else:
                self._direct(sock, first)
        except OSError:
            pass
        finally:
            sock.close()
            self.slots.release()

    def _direct(self, sock: socket.socket, first: bytes) -> None:
        remote = socket.create_connection((self.head.address, self.head.port), timeout=10)
        remote.settimeout(None)  # a dashboard request may take long: only the connect is bounded
        try:
            remote.sendall(first)
            threading.Thread(target=_pump, args=(remote, sock), daemon=True).start()
            _pump(sock, remote)
        finally:
            remote.close()

    def ended(self) -> str | None:
        """Why the cluster is over, if it is."""
        if self.relay is not None and not self.relay.alive():
            return "the relay step ended (the job ended, or srun failed: see above)"
        if not self.state.exists():
            return "the cluster was torn down"
        if self.state.read_marker(self.head.node_id, "exit") is not None:
            return f"the head {self.head.node_id} exited"
        if time.monotonic() - self._slurm_checked > SLURM_CHECK_SECONDS:
            self._slurm_checked = time.monotonic()
            try:
                if job_state(self.state.job_id) is None:
                    return f"SLURM says job {self.state.job_id} has ended"
            except SlurmCommandError:
                pass  # not an answer about the job
        return None

    def serve(self, listener: socket.socket) -> str:
        """Accept until the cluster ends; returns why. The end is checked every
        ``CHECK_SECONDS``, whether connections come or not."""
        listener.settimeout(CHECK_SECONDS)
        checked = time.monotonic()
        while True:
            if time.monotonic() - checked >= CHECK_SECONDS:
                checked = time.monotonic()
                if reason := self.ended():
                    return reason
            if not self.slots.acquire(timeout=CHECK_SECONDS):
                continue  # MAX_CONNECTIONS carried: the next waits in the listen queue
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                self.slots.release()
                continue
            except OSError as e:  # out of descriptors, an aborted connection: wait, go on
                self.slots.release()
                print(f"eray-provider: accept: {e}", file=sys.stderr, flush=True)
                time.sleep(0.5)
                continue
            try:
                threading.Thread(target=self.serve_one, args=(sock,), daemon=True).start()
            except RuntimeError:  # no thread to be had
                sock.close()
                self.slots.release()


def run(state: ClusterState, port: int = 0, via: str = "auto", out=None) -> int:
    """Forward until the cluster ends, Ctrl-C, SIGTERM or SIGHUP; returns the exit status."""
    out = out or sys.stdout
    if via not in ("auto", "direct", "srun"):
        raise ConfigError(f"--via {via!r} is not one of auto, direct, srun")
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port {port!r} is not a port number (0: any free port)")
    head = find_head(state)
    if not state.token_path.is_file():
        raise ConfigError(f"cluster {state.cluster_name!r} has no token file {state.token_path}")
    mode = "srun" if via == "srun" or (via == "auto" and not _reachable(head)) else "direct"
    try:
        listener = socket.create_server(("127.0.0.1", port))
    except OSError as e:
        raise ConfigError(f"--port {port}: cannot listen on 127.0.0.1:{port}: {e}") from e
    relay = None
    reason = "?"
    previous = {s: signal.signal(s, _terminate) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        if mode == "srun":
            relay = _start_relay(state, head)
            if not relay.wait_ready(RELAY_START_TIMEOUT):
                raise _Terminated(
                    f"the relay step on {head.slurm_node} did not start within {RELAY_START_TIMEOUT:.0f} s"
                )
        forwarder = Forwarder(state, head, relay)
        local = listener.getsockname()[1]
        print(
            f"eray-provider: the dashboard of cluster {state.cluster_name!r} (job {state.job_id}, head "
            f"{head.address}:{head.port}, {'through an srun step' if relay else 'direct'}) is at\n"
            f"  http://127.0.0.1:{local}{LOGIN_PREFIX}{forwarder.secret}\n"
            f"Open that link once: it sets the cluster's token as Ray's cookie, then shows "
            f"http://127.0.0.1:{local}/. From your own machine: ssh -L {local}:127.0.0.1:{local} "
            f"{socket.getfqdn()}. Ctrl-C ends it.",
            file=out,
            flush=True,
        )
        reason = forwarder.serve(listener)
    except KeyboardInterrupt:
        reason = "Ctrl-C"
    except _Terminated as e:
        reason = str(e)
    finally:
        interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut this
        listener.close()
        if relay is not None:
            relay.stop()
        signal.signal(signal.SIGINT, interrupt)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(f"eray-provider: dashboard forwarding ended: {reason}", file=out, flush=True)
    return 0 if reason in ("Ctrl-C", "SIGTERM", "SIGHUP") else 1


def _start_relay(state: ClusterState, head: Head) -> RelayClient:
    python = str(state.cluster_config().get("provider", {}).get("python") or sys.executable)
    job = state.records()[head.node_id].slurm_job or state.job_id
    name = step_name(state.cluster_name, f"dashboard.{os.getpid()}")
    argv = srun_argv(
        job,
        [head.slurm_node],
        python_m(python, RELAY, f"{head.address}:{head.port}"),
        name=name,
        immediate=slurm_timeout(),
        unbuffered=True,  # the frames as they come, not held for a newline
    )
    return RelayClient(argv, (job, name))


class _Terminated(Exception):
    pass


def _terminate(signum, _frame) -> None:
    raise _Terminated(signal.Signals(signum).name)


def resolve(target: str, job: str | None, base: Path) -> ClusterState:
    """A cluster from a cluster YAML (its ``cluster_name``, its ``provider.state_dir``, and
    ``provider.job_id`` or ``$SLURM_JOB_ID``) or a cluster name (``cluster_logs.find_cluster``
    picks its job, the running one first)."""
    from .cluster_logs import find_cluster
    from .status import state_dirs

    name = target
    if target.endswith((".yaml", ".yml")) and os.path.isfile(target):
        import yaml

        config = yaml.safe_load(Path(target).read_text()) or {}
        name = str(config.get("cluster_name", ""))
        provider = config.get("provider") or {}
        job = job or (str(provider["job_id"]) if provider.get("job_id") else job_id_from_env(os.environ))
        base = Path(provider.get("state_dir") or base).expanduser()
    return ClusterState(name, find_cluster(base, name, job, state_dirs(base)), base)
