"""The login side of the dashboard's relay (``relay``): one srun step, many channels.

Local connections are carried as channels of the step's stdin and stdout. Reading the
relay never waits on one local socket: each channel has its own writer thread and a
queue of at most ``MAX_QUEUED`` frames, and a channel whose browser does not take them is
closed, so one slow (or hostile) connection cannot stall the others. When the relay's
output stops making sense, or ends, the client is dead (``alive()`` false) and every
channel is closed.
"""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import sys
import threading
import time

from ..slurm.srun import spawn_step, stop_foreground_step
from .relay import CLOSE, GREETING, OPEN, Decoder, encode, encode_data

#: Frames (of at most 64 KiB) held for one local connection that does not read them.
MAX_QUEUED = 64
#: Seconds ``stop`` waits for the relay to end after its stdin closed.
STOP_SECONDS = 10.0


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class _Channel:
    """One local connection: a writer thread drains what the relay sent for it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.queue: queue.Queue[bytes | None] = queue.Queue(maxsize=MAX_QUEUED)
        threading.Thread(target=self._write, daemon=True).start()

    def _write(self) -> None:
        while (data := self.queue.get()) is not None:
            try:
                self.sock.sendall(data)
            except OSError:
                break
        _shutdown(self.sock)  # its reader (``RelayClient.carry``) returns

    def end(self) -> None:
        try:
            self.queue.put_nowait(None)
        except queue.Full:
            _shutdown(self.sock)


class RelayClient:
    """The srun step running ``python -m eray_provider.runtime.relay``, and its channels."""

    def __init__(self, argv: list[str], step: tuple[str, str] | None = None) -> None:
        """``step``: (job, step name) of the srun step ``argv`` holds, for ``stop``."""
        self.step = step
        self.proc = spawn_step(argv, pipes=True)  # Ctrl-C reaches us; we end the step in order
        self._lock = threading.Lock()
        self._channels: dict[int, _Channel] = {}
        self._next = 0
        self._dead = False
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def wait_ready(self, timeout: float) -> bool:
        """Until the relay's greeting came (its step runs); False after ``timeout`` or
        when the relay ended first."""
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.2):
            if self._dead or self.proc.poll() is not None or time.monotonic() > deadline:
                return self._ready.is_set()
        return True

    def alive(self) -> bool:
        return not self._dead and self.proc.poll() is None

    def _send(self, frame: bytes) -> None:
        assert self.proc.stdin is not None
        with self._lock:
            self.proc.stdin.write(frame)
            self.proc.stdin.flush()

    def carry(self, sock: socket.socket, first: bytes = b"") -> None:
        """Carry one local connection (whose first bytes were read already) to its end."""
        with self._lock:
            self._next += 1
            channel = self._next
            self._channels[channel] = _Channel(sock)
        try:
            self._send(encode(channel, OPEN))
            data = first
            while True:
                for frame in encode_data(channel, data):
                    self._send(frame)
                data = sock.recv(1 << 16)
                if not data:
                    break
        except (OSError, ValueError):  # the local side reset, or the relay ended
            pass
        finally:
            if self._channels.pop(channel, None) is not None:
                try:
                    self._send(encode(channel, CLOSE))
                except (OSError, ValueError):
                    pass
            sock.close()

    def _end(self, channel: int) -> None:
        ch = self._channels.pop(channel, None)
        if ch is not None:
            ch.end()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        decoder = Decoder(greeting=GREETING)
        try:
            while chunk := os.read(fd, 1 << 16):
                frames = decoder.feed(chunk)
                if decoder.greeted:
                    self._ready.set()
                for channel, kind, payload in frames:
                    ch = self._channels.get(channel)
                    if ch is None or kind == OPEN:
                        continue
                    if kind == CLOSE:
                        self._end(channel)
                        continue
                    try:
                        ch.queue.put_nowait(payload)
                    except queue.Full:  # a browser that does not read: its carry ends it
                        _shutdown(ch.sock)
        except (OSError, ValueError) as e:
            print(f"eray-provider: the dashboard relay stopped: {e}", file=sys.stderr, flush=True)
        finally:
            self._dead = True
            for channel in list(self._channels):
                self._end(channel)

    def stop(self) -> None:
        """End every channel, then the relay (its stdin closes: it ends, and its step
        with it); bounded: then SIGTERM, SIGKILL, and a scancel of the step if it
        outlived its srun."""
        for ch in list(self._channels.values()):
            _shutdown(ch.sock)  # a carry thread blocked in a write lets go
        closer = threading.Thread(target=self._close_stdin, daemon=True)
        closer.start()
        closer.join(timeout=5)
        try:
            self.proc.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            pass
        if self.step is not None:
            stop_foreground_step(self.proc, *self.step)
        elif self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def _close_stdin(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except (OSError, ValueError):
            pass
