"""TCP connections carried over one byte stream: how the dashboard reaches a login node
that cannot route to the compute nodes.

``eray-provider dashboard`` runs ``python -m eray_provider.runtime.relay HOST:PORT`` on the head,
as an ``srun --overlap --unbuffered`` step of the cluster's job, and speaks to it over
the step's stdin and stdout (srun carries them, as it carries any task's I/O). The relay
first writes ``GREETING`` (what a site's task prolog printed before it is skipped); then
every browser connection is one channel, and frames are ``>IBI`` (channel, kind, length)
and the payload:

- ``OPEN``: the relay connects a new socket to HOST:PORT for the channel
- ``DATA``: bytes for the channel's socket, either way
- ``CLOSE``: the channel ended on one side; the other closes its socket

Neither side ever waits on one channel's socket: the relay's sockets are non-blocking,
with at most ``MAX_PENDING`` bytes held for one (a channel over it is closed), so one slow
connection cannot stall the others. The relay ends when its stdin closes (the login side
ended, or srun did); the step ends with it. The frame codec is pure (``encode``,
``Decoder``) and tested alone.
"""

from __future__ import annotations

import os
import selectors
import socket
import struct
import sys
from collections.abc import Iterator

from ..errors import ErayError
from ..plan.modules import RELAY

OPEN, DATA, CLOSE = 1, 2, 3
_HEADER = struct.Struct(">IBI")
#: The most a frame carries; a larger write is split.
MAX_PAYLOAD = 1 << 16
#: Bytes held for one channel's socket that does not take them: over it, the channel closes.
MAX_PENDING = 4 << 20
CONNECT_TIMEOUT = 10.0
#: What the relay writes first; what comes before it on its stdout is not its own.
GREETING = b"\x00eray-provider relay 1\n"


class FrameError(ErayError, ValueError):
    """The stream is not a sequence of frames: the other side is not a relay."""


def encode(channel: int, kind: int, payload: bytes = b"") -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"a frame carries at most {MAX_PAYLOAD} bytes, not {len(payload)}")
    return _HEADER.pack(channel, kind, len(payload)) + payload


def encode_data(channel: int, data: bytes) -> Iterator[bytes]:
    for i in range(0, len(data), MAX_PAYLOAD):
        yield encode(channel, DATA, data[i : i + MAX_PAYLOAD])


class Decoder:
    """Frames out of a byte stream fed in pieces of any size; with ``greeting``, the
    bytes up to and including it are skipped first (at most 64 KiB of them)."""

    def __init__(self, greeting: bytes = b"") -> None:
        self._buf = bytearray()
        self._greeting = greeting

    @property
    def greeted(self) -> bool:
        """The greeting (if one was asked for) has been seen."""
        return not self._greeting

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        self._buf += data
        if self._greeting:
            at = self._buf.find(self._greeting)
            if at < 0:
                if len(self._buf) > 65536:
                    raise FrameError(f"no relay greeting in its first 64 KiB: {bytes(self._buf[:200])!r}")
                return []
            del self._buf[: at + len(self._greeting)]
            self._greeting = b""
        frames = []
        while len(self._buf) >= _HEADER.size:
            channel, kind, length = _HEADER.unpack_from(self._buf)
            if kind not in (OPEN, DATA, CLOSE) or length > MAX_PAYLOAD:
                raise FrameError(f"not a relay frame: kind {kind}, length {length}")
            end = _HEADER.size + length
            if len(self._buf) < end:
                break
            frames.append((channel, kind, bytes(self._buf[_HEADER.size : end])))
            del self._buf[:end]
        return frames


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class _Relay:
    """The relay's side: channels from ``stdin`` to HOST:PORT, in one selector loop."""

    def __init__(self, host: str, port: int, stdin: int, stdout: int) -> None:
        self.target = (host, port)
        self.stdin, self.stdout = stdin, stdout
        self.sel = selectors.DefaultSelector()
        self.sel.register(stdin, selectors.EVENT_READ, None)
        self.socks: dict[int, socket.socket] = {}
        self.pending: dict[int, bytearray] = {}
        self.decoder = Decoder()

    def close(self, channel: int, tell: bool) -> None:
        sock = self.socks.pop(channel, None)
        self.pending.pop(channel, None)
        if sock is not None:
            self.sel.unregister(sock)
            sock.close()
            if tell:
                _write_all(self.stdout, encode(channel, CLOSE))

    def open(self, channel: int) -> None:
        try:
            sock = socket.create_connection(self.target, timeout=CONNECT_TIMEOUT)
        except OSError as e:
            print(f"relay: {self.target[0]}:{self.target[1]}: {e}", file=sys.stderr, flush=True)
            _write_all(self.stdout, encode(channel, CLOSE))
            return
        sock.setblocking(False)
        self.socks[channel] = sock
        self.pending[channel] = bytearray()
        self.sel.register(sock, selectors.EVENT_READ, channel)

    def send(self, channel: int, payload: bytes) -> None:
        """Queue ``payload`` for the channel's socket and send what it takes now."""
        buf = self.pending.get(channel)
        if buf is None:
            return
        buf += payload
        self.flush(channel)

    def flush(self, channel: int) -> None:
        sock, buf = self.socks[channel], self.pending[channel]
        try:
            while buf:
                del buf[: sock.send(buf)]
        except BlockingIOError:
            pass
        except OSError:
            self.close(channel, tell=True)
            return
        if len(buf) > MAX_PENDING:
            self.close(channel, tell=True)
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if buf else 0)
        self.sel.modify(sock, events, channel)

    def from_login(self) -> bool:
        data = os.read(self.stdin, 1 << 16)
        if not data:
            return False
        for channel, kind, payload in self.decoder.feed(data):
            if kind == OPEN:
                self.open(channel)
            elif kind == DATA:
                self.send(channel, payload)
            else:
                self.close(channel, tell=False)
        return True

    def from_target(self, channel: int, events: int) -> None:
        if channel not in self.socks:
            return  # closed by a frame read earlier in this round
        if events & selectors.EVENT_WRITE:
            self.flush(channel)
            if channel not in self.socks:
                return
        if events & selectors.EVENT_READ:
            try:
                data = self.socks[channel].recv(1 << 16)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.close(channel, tell=True)
                return
            for frame in encode_data(channel, data):
                _write_all(self.stdout, frame)

    def run(self) -> int:
        _write_all(self.stdout, GREETING)
        try:
            while True:
                for key, events in self.sel.select():
                    if key.data is None:
                        if not self.from_login():
                            return 0
                    else:
                        self.from_target(key.data, events)
        except BrokenPipeError:
            return 0  # the login side is gone
        finally:
            for sock in self.socks.values():
                sock.close()


def serve(host: str, port: int, stdin: int = 0, stdout: int = 1) -> int:
    """Carry channels from ``stdin`` to HOST:PORT until ``stdin`` closes."""
    return _Relay(host, port, stdin, stdout).run()


def main(argv: list[str]) -> int:
    if len(argv) != 1 or ":" not in argv[0]:
        print(f"usage: python -m {RELAY} HOST:PORT", file=sys.stderr)
        return 2
    host, _, port = argv[0].rpartition(":")
    return serve(host, int(port))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
