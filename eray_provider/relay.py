"""TCP connections carried over one byte stream: how the dashboard reaches a login node
that cannot route to the compute nodes.

``eray-provider dashboard`` runs ``python -m eray_provider.relay HOST:PORT`` on the head,
as an ``srun --overlap`` step of the cluster's job, and speaks to it over the step's
stdin and stdout (srun carries them, as it carries any task's I/O). Every browser
connection is one channel; frames are ``>IBI`` (channel, kind, length) and the payload:

- ``OPEN``: the relay connects a new socket to HOST:PORT for the channel
- ``DATA``: bytes for the channel's socket, either way
- ``CLOSE``: the channel ended on one side; the other closes its socket

The relay ends when its stdin closes (the login side ended, or srun did); the step ends
with it. The frame codec is pure (``encode``, ``Decoder``) and tested alone.
"""

from __future__ import annotations

import os
import selectors
import socket
import struct
import sys
from collections.abc import Iterator

OPEN, DATA, CLOSE = 1, 2, 3
_HEADER = struct.Struct(">IBI")
#: The most a frame carries; a larger write is split.
MAX_PAYLOAD = 1 << 16
CONNECT_TIMEOUT = 10.0


class FrameError(ValueError):
    """The stream is not a sequence of frames: the other side is not a relay."""


def encode(channel: int, kind: int, payload: bytes = b"") -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"a frame carries at most {MAX_PAYLOAD} bytes, not {len(payload)}")
    return _HEADER.pack(channel, kind, len(payload)) + payload


def encode_data(channel: int, data: bytes) -> Iterator[bytes]:
    for i in range(0, len(data), MAX_PAYLOAD):
        yield encode(channel, DATA, data[i : i + MAX_PAYLOAD])


class Decoder:
    """Frames out of a byte stream fed in pieces of any size."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        self._buf += data
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


def serve(host: str, port: int, stdin: int = 0, stdout: int = 1) -> int:
    """The relay's side: channels from ``stdin`` to HOST:PORT, until ``stdin`` closes."""
    sel = selectors.DefaultSelector()
    sel.register(stdin, selectors.EVENT_READ, None)
    socks: dict[int, socket.socket] = {}
    decoder = Decoder()

    def close(channel: int, tell: bool) -> None:
        sock = socks.pop(channel, None)
        if sock is not None:
            sel.unregister(sock)
            sock.close()
            if tell:
                _write_all(stdout, encode(channel, CLOSE))

    try:
        while True:
            for key, _ in sel.select():
                if key.data is None:
                    data = os.read(stdin, 1 << 16)
                    if not data:
                        return 0
                    for channel, kind, payload in decoder.feed(data):
                        if kind == OPEN:
                            try:
                                sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
                            except OSError as e:
                                print(f"relay: {host}:{port}: {e}", file=sys.stderr, flush=True)
                                _write_all(stdout, encode(channel, CLOSE))
                                continue
                            sock.setblocking(True)
                            socks[channel] = sock
                            sel.register(sock, selectors.EVENT_READ, channel)
                        elif kind == DATA and channel in socks:
                            try:
                                socks[channel].sendall(payload)
                            except OSError:
                                close(channel, tell=True)
                        elif kind == CLOSE:
                            close(channel, tell=False)
                else:
                    channel = key.data
                    sock = socks.get(channel)
                    if sock is None:
                        continue  # closed by a frame read earlier in this round
                    try:
                        data = sock.recv(1 << 16)
                    except OSError:
                        data = b""
                    if not data:
                        close(channel, tell=True)
                        continue
                    for frame in encode_data(channel, data):
                        _write_all(stdout, frame)
    except BrokenPipeError:
        return 0  # the login side is gone
    finally:
        for sock in socks.values():
            sock.close()


def main(argv: list[str]) -> int:
    if len(argv) != 1 or ":" not in argv[0]:
        print("usage: python -m eray_provider.relay HOST:PORT", file=sys.stderr)
        return 2
    host, _, port = argv[0].rpartition(":")
    return serve(host, int(port))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
