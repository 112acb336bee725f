"""The dashboard's forwarding without a cluster: the relay's frames, the login link, and
the relay process itself carrying concurrent HTTP connections over its stdin and stdout
(run here as a plain subprocess; ``test_dashboard_live`` runs it as an srun step)."""

from __future__ import annotations

import http.server
import socket
import sys
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from eray_provider.plan.modules import RELAY
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
    head = login_response("tok", "/nodes?view=summary").decode()
    assert head.startswith("HTTP/1.1 303") and "Location: /nodes?view=summary\r\n" in head
    assert f"Set-Cookie: {TOKEN_COOKIE}=tok; Path=/; HttpOnly; SameSite=Strict" in head


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
