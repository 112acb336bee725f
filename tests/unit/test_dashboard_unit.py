"""The dashboard's forwarding without a cluster: the relay's frames, the login link, and
the relay process itself carrying concurrent HTTP connections over its stdin and stdout
(run here as a plain subprocess; ``test_dashboard_live`` runs it as an srun step)."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from testbed_support import other_user, require

from eray_provider.plan.modules import RELAY
from eray_provider.runtime import dashboard
from eray_provider.runtime.dashboard import LOGIN_PREFIX, TOKEN_COOKIE, login_response, login_target
from eray_provider.runtime.relay import (
    CLOSE,
    DATA,
    GREETING,
    MAX_PAYLOAD,
    OPEN,
    Decoder,
    FrameError,
    encode,
    encode_data,
)
from eray_provider.runtime.relay_client import RelayClient


def test_frames_survive_any_split() -> None:
    stream = encode(1, OPEN) + b"".join(encode_data(1, b"x" * (MAX_PAYLOAD + 5))) + encode(7, CLOSE)
    for step in (1, 3, 4096, len(stream)):
        dec = Decoder()
        frames = [f for i in range(0, len(stream), step) for f in dec.feed(stream[i : i + step])]
        assert [(c, k, len(p)) for c, k, p in frames] == [
            (1, OPEN, 0),
            (1, DATA, MAX_PAYLOAD),
            (1, DATA, 5),
            (7, CLOSE, 0),
        ]
    with pytest.raises(FrameError):
        Decoder().feed(b"GET / HTTP/1.1\r\n")
    # what a site's task prolog printed before the relay's greeting is skipped
    dec = Decoder(greeting=GREETING)
    assert dec.feed(b"Welcome to the cluster!\n" + GREETING[:5]) == []
    assert dec.feed(GREETING[5:] + encode(3, CLOSE)) == [(3, CLOSE, b"")]
    with pytest.raises(FrameError, match="no relay greeting"):
        Decoder(greeting=GREETING).feed(b"x" * 70000)


def test_the_login_link_needs_the_secret() -> None:
    assert login_target(f"GET {LOGIN_PREFIX}s3cret HTTP/1.1".encode(), "s3cret") == "/"
    line = f"GET {LOGIN_PREFIX}s3cret?next=/nodes%3Fview%3Dsummary HTTP/1.1"
    assert login_target(line.encode(), "s3cret") == "/nodes?view=summary"
    for bad in ("//evil.example/", "http://evil.example/", "/x%0d%0aSet-Cookie:%20a=b", "/\\\\evil"):
        line = f"GET {LOGIN_PREFIX}s3cret?next={bad} HTTP/1.1"
        assert login_target(line.encode(), "s3cret") == "/", bad
    for line in (
        f"GET {LOGIN_PREFIX}s3cre HTTP/1.1",
        f"POST {LOGIN_PREFIX}s3cret HTTP/1.1",
        "GET / HTTP/1.1",
        "",
    ):
        assert login_target(line.encode(), "s3cret") is None, line
    head = login_response("eray-forward-8265", "sess", "/nodes?view=summary").decode()
    assert head.startswith("HTTP/1.1 303") and "Location: /nodes?view=summary\r\n" in head
    assert "Set-Cookie: eray-forward-8265=sess; Path=/; HttpOnly; SameSite=Strict\r\n" in head


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the dashboard's server

    def do_GET(self) -> None:
        body = (self.path * 40000).encode()  # 160 kB: several frames
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def _relayed(server_port: int):
    """A relay process (a plain subprocess here) and a local listener carried through it."""
    relay = RelayClient([sys.executable, "-m", RELAY, f"127.0.0.1:{server_port}"])
    listener = socket.create_server(("127.0.0.1", 0))

    def accept() -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=relay.carry, args=(sock,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return relay, listener, listener.getsockname()[1]


def _get(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
        return r.read()


def test_the_relay_carries_concurrent_connections_and_ends_with_its_stdin() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    relay, listener, port = _relayed(server.server_port)
    try:
        with ThreadPoolExecutor(8) as pool:
            bodies = list(pool.map(lambda i: _get(port, f"/p{i}"), range(24)))
        assert all(body == f"/p{i}".encode() * 40000 for i, body in enumerate(bodies))
    finally:
        listener.close()
        relay.stop()
        server.shutdown()
    assert relay.proc.returncode == 0  # it ended because its stdin closed, not killed


def test_a_connection_that_never_reads_stalls_no_other() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    relay, listener, port = _relayed(server.server_port)
    hog = socket.create_connection(("127.0.0.1", port))
    try:
        # pipelined requests for 160 kB answers each, never read: far more than any buffer
        hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        request = b"GET /hog-hog-hog HTTP/1.1\r\nHost: x\r\n\r\n"
        hog.sendall(request * 200)
        for i in range(5):  # the others are answered all the same, in full
            assert _get(port, f"/q{i}") == f"/q{i}".encode() * 40000
        assert relay.alive()
    finally:
        hog.close()
        listener.close()
        relay.stop()
        server.shutdown()
    assert relay.proc.returncode == 0


# --- the forward itself (Forwarder), against a local stand-in for the dashboard ---------

TOKEN_HEADER = "X-Seen-Cookie"


class _Dashboard(http.server.BaseHTTPRequestHandler):
    """Answers 200 only to Ray's cookie holding the cluster's token (as Ray's dashboard
    does), and says which cookie it received."""

    protocol_version = "HTTP/1.1"
    token = ""

    def do_GET(self) -> None:
        cookie = self.headers.get("Cookie", "")
        ok = f"{TOKEN_COOKIE}={self.token}" in [c.strip() for c in cookie.split(";")]
        body = b"ok" if ok else b"unauthorized"
        self.send_response(200 if ok else 401)
        self.send_header(TOKEN_HEADER, cookie)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def forward(tmp_path):
    """A running Forwarder (direct mode) in front of a stand-in dashboard."""
    from eray_provider.runtime.cluster_state import ClusterState
    from eray_provider.runtime.dashboard import Forwarder, Head

    state = ClusterState("fwd", "77", tmp_path / "state")
    state.create()
    token = state.token_path.read_text().strip()
    handler = type("Dash", (_Dashboard,), {"token": token})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    listener = socket.create_server(("127.0.0.1", 0))
    head = Head("fwd-head", "node1", "127.0.0.1", server.server_port)
    fwd = Forwarder(state, head, None, listener.getsockname()[1])
    ended: list[str] = []
    thread = threading.Thread(target=lambda: ended.append(fwd.serve(listener)), daemon=True)
    thread.start()
    yield fwd, listener.getsockname()[1], token, state, server.server_port
    fwd._end.set()
    thread.join(timeout=10)
    listener.close()
    server.shutdown()


def _ask(port: int, path: str, cookie: str | None = None, timeout: float = 30, headers=None):
    """(status, headers) of a GET that does not follow redirects."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers={**({"Cookie": cookie} if cookie else {}), **(headers or {})})
        r = conn.getresponse()
        r.read()
        return r.status, r.headers
    finally:
        conn.close()


def test_the_browser_gets_a_session_secret_which_the_forward_swaps_for_the_token(forward) -> None:
    fwd, port, token, _state, backend = forward
    status, headers = _ask(port, f"{LOGIN_PREFIX}{fwd.secret}")
    assert status == 303
    cookie = headers["Set-Cookie"].split(";")[0]
    name, _, session = cookie.partition("=")
    assert name == f"eray-forward-{port}" and session == fwd.session and session != token
    assert token not in str(headers)
    # carried with the session: the dashboard sees the token; the browser never held it
    status, headers = _ask(port, "/api/nodes", f"other=1; {cookie}")
    assert status == 200 and headers[TOKEN_HEADER] == f"other=1; {TOKEN_COOKIE}={token}"
    # a page of another site (any other port of 127.0.0.1) makes the browser send the cookie
    # too: such a request is carried as it came, and refused
    assert _ask(port, "/api/nodes", cookie, headers={"Sec-Fetch-Site": "same-site"})[0] == 401
    assert _ask(port, "/api/nodes", cookie, headers={"Sec-Fetch-Site": "same-origin"})[0] == 200
    # no cookie, or a wrong one: carried as it came, refused by the dashboard
    assert _ask(port, "/api/nodes")[0] == 401
    assert _ask(port, "/api/nodes", f"{TOKEN_COOKIE}=guess")[0] == 401
    # the session itself opens nothing at the dashboard: only this forward knows it
    assert _ask(backend, "/api/nodes", cookie)[0] == 401


def test_once_the_head_has_ended_no_request_is_carried(forward) -> None:
    """The head's address may be another user's once its node has let go of it: from the
    head's exit marker on, the forward carries nothing there (checked per request, not by
    the end watcher's round, which comes up to ``CHECK_SECONDS`` later)."""
    import http.client

    fwd, port, _token, state, _backend = forward
    _, headers = _ask(port, f"{LOGIN_PREFIX}{fwd.secret}")
    cookie = headers["Set-Cookie"].split(";")[0]
    assert _ask(port, "/api/nodes", cookie)[0] == 200
    state.write_marker("fwd-head", "exit", "137")
    with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
        _ask(port, "/api/nodes", cookie)


def test_rewrite_head_one_request_per_connection() -> None:
    from eray_provider.runtime.dashboard import rewrite_head

    head = (
        b"GET /x HTTP/1.1\r\nHost: h\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n"
        b"Cookie: a=b; eray-forward-1=SESS; ray-authentication-token=OLD\r\n\r\n"
    )
    out = rewrite_head(head, "eray-forward-1", "SESS", "TOK")
    assert out == (
        b"GET /x HTTP/1.1\r\nHost: h\r\nCookie: a=b; ray-authentication-token=TOK\r\n"
        b"Connection: close\r\n\r\n"
    )
    up = b"GET /ws HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    assert rewrite_head(up, "eray-forward-1", "SESS", "TOK") == up  # an upgrade is left as asked
    # no valid session of ours (another forward's, a guess, the user's own client's token):
    # the cookie is carried as it came
    for cookie in (b"eray-forward-2=SESS", b"eray-forward-1=GUESS", b"ray-authentication-token=TOK2"):
        mine = b"GET / HTTP/1.1\r\nCookie: " + cookie + b"\r\n\r\n"
        assert b"Cookie: " + cookie + b"\r\n" in rewrite_head(mine, "eray-forward-1", "SESS", "TOK")
    cross = b"GET / HTTP/1.1\r\nSec-Fetch-Site: cross-site\r\nCookie: eray-forward-1=SESS\r\n\r\n"
    assert b"TOK" not in rewrite_head(cross, "eray-forward-1", "SESS", "TOK")


SLOW_CLIENTS = """
import socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
held = []
for _ in range(n):
    s = socket.create_connection(("127.0.0.1", port)); s.sendall(b"GET / HT"); held.append(s)
answered = 0
s = socket.create_connection(("127.0.0.1", port)); s.settimeout(20)
s.sendall(b"GET /api/nodes HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
try:
    data = s.recv(100)
except OSError:
    data = b""
print("held", len(held), "answer", repr(data[:12]), flush=True)
sys.stdin.read()
"""


def test_another_users_connections_are_closed_unanswered_and_hold_up_nothing(forward) -> None:
    """300 slow connections of another user: none is served, and the owner is answered
    while they are held."""
    import os

    if os.geteuid() != 0:
        require("another Unix user needs root (runuser)")
    fwd, port, _token, _state, _backend = forward
    user = other_user()
    proc = subprocess.Popen(
        ["runuser", "-u", user, "--", "/usr/bin/python3", "-c", SLOW_CLIENTS, str(port), "300"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line[:2] == ["held", "300"] and line[3] == "b''", line  # not even a 401
        assert fwd.refused >= 301
        status, _ = _ask(port, "/api/nodes", timeout=5)  # answered though they are held
        assert status == 401
    finally:
        proc.communicate(timeout=30)


def test_a_hanging_squeue_does_not_stop_the_forward_accepting(forward, tmp_path, monkeypatch) -> None:
    """The cluster's end is checked off the accept path: with an squeue that hangs, the
    owner's requests are still answered."""
    _fwd, port, _token, _state, _backend = forward
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text("#!/bin/sh\necho started >> " + str(tmp_path / "squeue.calls") + "\nexec sleep 60\n")
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(dashboard, "SLURM_CHECK_SECONDS", 0.0)
    deadline = time.monotonic() + 30
    while not (tmp_path / "squeue.calls").exists():  # the watcher is in squeue now
        assert time.monotonic() < deadline, "the forward never asked squeue"
        time.sleep(0.1)
    for _ in range(3):
        assert _ask(port, "/api/nodes", timeout=5)[0] == 401
