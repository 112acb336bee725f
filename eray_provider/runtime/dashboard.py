"""``eray-provider dashboard CONFIG_OR_CLUSTER``: the head's dashboard on a local port.

``ray dashboard`` forwards through ssh, which a SLURM cluster does not offer, and the
port changes with the job. This listens on ``127.0.0.1:PORT`` where it runs (the login
node) and carries every connection to the head's dashboard:

- ``direct``: a TCP connection to the head's address, where the login node can route
  to the compute nodes;
- ``srun``: through one ``srun --overlap`` step on the head (``relay``), where it
  cannot; every connection is a channel of the step's stdin and stdout.

``auto`` (the default) tries a direct connection first. The dashboard demands the
cluster's token (Ray's token authentication). The browser never holds the token: the
printed link ``/eray-provider/login/<secret>`` (a random secret of this run, answered here
and never forwarded) sets a cookie of this forward (``eray-forward-<port>``) to a
*session* secret of this run, and the forward replaces it with Ray's own cookie holding the
token in each request it carries, unless the browser says the request comes from another
site (``Sec-Fetch-Site``: any page on another port of 127.0.0.1 counts as one). When the
forward ends the session is forgotten, so a cookie captured later (a co-tenant who binds
the freed local port, an ``ssh -L`` tunnel still pointing there) opens nothing. Only
connections of this user are served (the peer's uid, from the kernel's socket table);
another user's are closed at once, so they cannot hold the forward's slots. ``[::1]`` is
held on the same port. A request's head must arrive within one deadline, and the cluster's
end is checked (SLURM asked) off the accept path.

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
from ..plan.markers import Marker
from ..plan.modules import RELAY, python_m
from ..plan.names import step_name
from ..plan.provider_config import ProviderConfig, elastic_module
from ..slurm.client import SlurmCommandError, slurm_timeout
from ..slurm.env import job_id_from_env
from ..slurm.srun import job_state, srun_argv
from .cluster_state import ClusterState
from .loopback_hold import bind_held
from .node_run import current_head
from .relay_client import RelayClient
from .socket_table import connection_uid
from .stop_signals import StopSignal, shielded, stop_signals_raise

LOGIN_PREFIX = "/eray-provider/login/"
#: Ray's cookie for the dashboard's token (``authentication_constants``).
TOKEN_COOKIE = "ray-authentication-token"
#: Our cookie's name, one per local port: two forwards at once keep their own.
SESSION_COOKIE = "eray-forward-{port}"
#: ``Sec-Fetch-Site`` values of requests the browser made from the forward's own pages, or
#: that the user typed (``none``); absent for clients that are not browsers.
OWN_SITE = (b"same-origin", b"none")
DIRECT_CONNECT_TIMEOUT = 3.0
#: Seconds a connection may take to send its whole request head (one deadline, not per read).
HEAD_TIMEOUT = 10.0
#: The most a request head may hold.
MAX_HEAD = 64 * 1024
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
    ip = state.read_marker(head, Marker.IP) if head else None
    plan = state.ports()
    if head is None or ip is None or plan is None:
        raise ConfigError(f"cluster {state.cluster_name!r} of job {state.job_id} has no running head")
    if state.read_marker(head, Marker.EXIT) is not None:
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


def login_response(cookie: str, session: str, location: str = "/") -> bytes:
    """Set this forward's cookie to its session secret (``HttpOnly``, ``SameSite=Strict``; no
    ``Max-Age``: it ends with the browser, and is worth nothing once the forward ends) and
    send the browser on to ``location`` (a path ``login_target`` checked)."""
    return (
        "HTTP/1.1 303 See Other\r\n"
        f"Set-Cookie: {cookie}={session}; Path=/; HttpOnly; SameSite=Strict\r\n"
        f"Location: {location}\r\n"
        "Cache-Control: no-store\r\n"
        "Referrer-Policy: no-referrer\r\n"
        "Content-Length: 0\r\n"
        "Connection: close\r\n\r\n"
    ).encode()


def _swap_cookie(value: bytes, cookie: bytes, session: bytes, token: bytes) -> bytes | None:
    """A ``Cookie`` header's value with our session cookie replaced by Ray's token cookie;
    None when it holds no valid session of ours (then it is carried as it came)."""
    kept, ours = [], False
    for part in value.split(b";"):
        name, eq, val = part.strip().partition(b"=")
        if eq and name == cookie:
            ours = ours or hmac.compare_digest(val.strip(), session)
            continue
        if eq and name == TOKEN_COOKIE.encode():
            continue  # ours replaces any other
        if part.strip():
            kept.append(part.strip())
    if not ours:
        return None
    return b"; ".join([*kept, TOKEN_COOKIE.encode() + b"=" + token])


def rewrite_head(head: bytes, cookie: str, session: str, token: str) -> bytes:
    """The request head to carry: our session cookie replaced by Ray's cookie holding the
    cluster's token (only for a request of the forward's own pages or typed by the user,
    per ``Sec-Fetch-Site``), and ``Connection: close`` (one request per carried connection,
    so each request's head passes here; a protocol upgrade is left as asked). Any other
    cookie, a token of the user's own client among them, is carried as it came."""
    lines = head.split(b"\r\n")
    fields = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if line and colon:
            fields.append((name.strip().lower(), name, value))
    site = next((v.strip().lower() for k, _, v in fields if k == b"sec-fetch-site"), None)
    trusted = site is None or site in OWN_SITE
    upgrade = any(k == b"connection" and b"upgrade" in v.lower() for k, _, v in fields)
    out = [lines[0]]
    for key, name, value in fields:
        if key == b"cookie" and trusted:
            swapped = _swap_cookie(value, cookie.encode(), session.encode(), token.encode())
            out.append(name + b": " + (swapped if swapped is not None else value.strip()))
        elif key in (b"connection", b"keep-alive") and not upgrade:
            continue
        else:
            out.append(name + b":" + value)
    if not upgrade:
        out.append(b"Connection: close")
    return b"\r\n".join(out) + b"\r\n\r\n"


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


def read_head(sock: socket.socket, timeout: float = HEAD_TIMEOUT) -> tuple[bytes, bytes] | None:
    """A request's head (through its blank line) and what came after it, read within one
    deadline; None when the head does not end in time, within ``MAX_HEAD``, or at all."""
    deadline = time.monotonic() + timeout
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            left = deadline - time.monotonic()
            if left <= 0 or len(data) > MAX_HEAD:
                return None
            sock.settimeout(left)
            chunk = sock.recv(8192)
            if not chunk:
                return None
            data += chunk
    except OSError:
        return None
    sock.settimeout(None)
    head, _, rest = data.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", rest


class Forwarder:
    """Accepts local connections of its own user: answers the login link, carries the rest
    to the head with the session swapped for the token."""

    def __init__(self, state: ClusterState, head: Head, relay: RelayClient | None, port: int) -> None:
        self.state, self.head, self.relay = state, head, relay
        self.token = state.token_path.read_text().strip()
        self.secret = secrets.token_urlsafe(24)
        self.session = secrets.token_urlsafe(32)
        self.cookie = SESSION_COOKIE.format(port=port)
        self.owner = os.geteuid()
        self.refused = 0
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._end = threading.Event()
        self._reason = ""

    def serve_one(self, sock: socket.socket) -> None:
        try:
            got = read_head(sock)
            if got is None:
                return
            head, rest = got
            location = login_target(head.split(b"\r\n", 1)[0], self.secret)
            if location is not None:
                sock.sendall(login_response(self.cookie, self.session, location))
                return
            if self._end.is_set() or self.state.read_marker(self.head.node_id, Marker.EXIT) is not None:
                return  # the head has ended: its address may be another user's by now
            first = rewrite_head(head, self.cookie, self.session, self.token) + rest
            if self.relay is not None:
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

    def ended(self, slurm_checked: float) -> str | None:
        """Why the cluster is over, if it is; SLURM is asked when ``slurm_checked`` is
        ``SLURM_CHECK_SECONDS`` old (a failed or hanging ``squeue`` is no answer)."""
        if self.relay is not None and not self.relay.alive():
            return "the relay step ended (the job ended, or srun failed: see above)"
        if not self.state.exists():
            return "the cluster was torn down"
        if self.state.read_marker(self.head.node_id, Marker.EXIT) is not None:
            return f"the head {self.head.node_id} exited"
        if time.monotonic() - slurm_checked > SLURM_CHECK_SECONDS:
            try:
                if job_state(self.state.job_id) is None:
                    return f"SLURM says job {self.state.job_id} has ended"
            except SlurmCommandError:
                pass  # not an answer about the job
        return None

    def _watch_end(self) -> None:
        """The cluster's end, checked every ``CHECK_SECONDS`` in a thread of its own: a
        ``squeue`` that hangs delays this answer, never an accept."""
        slurm_checked = time.monotonic()
        while not self._end.wait(CHECK_SECONDS):
            asked = time.monotonic() - slurm_checked > SLURM_CHECK_SECONDS
            reason = self.ended(slurm_checked)
            if asked:
                slurm_checked = time.monotonic()
            if reason:
                self._reason = reason
                self._end.set()

    def _ours(self, sock: socket.socket) -> bool:
        """Whether the connection comes from this user (root's own, when we are root)."""
        return connection_uid(sock) == self.owner

    def serve(self, listener: socket.socket) -> str:
        """Accept until the cluster ends; returns why."""
        listener.settimeout(0.5)
        watcher = threading.Thread(target=self._watch_end, daemon=True)
        watcher.start()
        try:
            while not self._end.is_set():
                try:
                    sock, _ = listener.accept()
                except TimeoutError:
                    continue
                except OSError as e:  # out of descriptors, an aborted connection: wait, go on
                    print(f"eray-provider: accept: {e}", file=sys.stderr, flush=True)
                    time.sleep(0.5)
                    continue
                if not self._ours(sock):
                    self.refused += 1
                    sock.close()
                    continue
                if not self.slots.acquire(timeout=HEAD_TIMEOUT):
                    sock.close()  # MAX_CONNECTIONS of our own carried for that long
                    continue
                try:
                    threading.Thread(target=self.serve_one, args=(sock,), daemon=True).start()
                except RuntimeError:  # no thread to be had
                    sock.close()
                    self.slots.release()
            return self._reason
        finally:
            self._end.set()
            self.session = ""  # forgotten: a cookie of this run opens nothing any more


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
    v6 = _hold_v6_loopback(listener.getsockname()[1], out)
    with stop_signals_raise():
        reason = _forward(state, head, mode, listener, v6, out)
    print(f"eray-provider: dashboard forwarding ended: {reason}", file=out, flush=True)
    return 0 if reason in ("Ctrl-C", "SIGTERM", "SIGHUP") else 1


def _forward(state: ClusterState, head: Head, mode: str, listener: socket.socket, v6, out) -> str:
    """Serve until the cluster ends or a stop signal; returns why it ended. Whatever way it
    ends, the listeners close and the relay step ends before it returns."""
    relay = None
    reason = "?"
    try:
        if mode == "srun":
            relay = _start_relay(state, head)
            if not relay.wait_ready(RELAY_START_TIMEOUT):
                raise _RelayFailed(
                    f"the relay step on {head.slurm_node} did not start within {RELAY_START_TIMEOUT:.0f} s"
                )
        local = listener.getsockname()[1]
        forwarder = Forwarder(state, head, relay, local)
        print(
            f"eray-provider: the dashboard of cluster {state.cluster_name!r} (job {state.job_id}, head "
            f"{head.address}:{head.port}, {'through an srun step' if relay else 'direct'}) is at\n"
            f"  http://127.0.0.1:{local}{LOGIN_PREFIX}{forwarder.secret}\n"
            f"Open that link once: it sets a cookie of this forward (not the cluster's token, "
            f"worth nothing once it ends), then shows http://127.0.0.1:{local}/. From your own "
            f"machine: ssh -L {local}:127.0.0.1:{local} {socket.getfqdn()}. Ctrl-C ends it.",
            file=out,
            flush=True,
        )
        reason = forwarder.serve(listener)
    except StopSignal as e:
        reason = "Ctrl-C" if e.signum == signal.SIGINT else e.name
    except _RelayFailed as e:
        reason = str(e)
    finally:
        with shielded():  # a second Ctrl-C must not cut this
            listener.close()
            if v6 is not None:
                v6.close()
            if relay is not None:
                relay.stop()
    return reason


def _hold_v6_loopback(port: int, out) -> socket.socket | None:
    """``[::1]:port`` held while the forward runs (bound, not listening: refused there), so
    that ``localhost:PORT``, which may resolve to it, never reaches another user's listener.
    A port someone else holds there is said, not an error: the printed link is 127.0.0.1's."""
    try:
        return bind_held(socket.AF_INET6, "::1", port)
    except OSError as e:
        print(
            f"eray-provider: warning: [::1]:{port} is taken ({e.strerror or e}): open the 127.0.0.1 "
            "link below, never localhost",
            file=out,
            flush=True,
        )
        return None


def _start_relay(state: ClusterState, head: Head) -> RelayClient:
    python = str(state.cluster_config().get("provider", {}).get("python") or sys.executable)
    job = state.records()[head.node_id].slurm_job or state.job_id
    # unique across login nodes (a pid is not): the relay step is cancelled by this name
    name = step_name(state.cluster_name, f"dashboard.{secrets.token_hex(6)}")
    argv = srun_argv(
        job,
        [head.slurm_node],
        python_m(python, RELAY, f"{head.address}:{head.port}"),
        name=name,
        immediate=slurm_timeout(),
        unbuffered=True,  # the frames as they come, not held for a newline
    )
    return RelayClient(argv, (job, name))


class _RelayFailed(Exception):
    """The relay step did not start: the forward ends with this reason."""


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
        settings = ProviderConfig.from_dict(provider, elastic=elastic_module(provider))
        job = job or settings.job_id or job_id_from_env(os.environ)
        base = Path(settings.state_dir).expanduser() if settings.state_dir else base
    return ClusterState(name, find_cluster(base, name, job, state_dirs(base)), base)
