"""The stop signals of a long-running command (Ctrl-C, SLURM's SIGTERM at a time limit or a
preemption, SIGHUP from a closed terminal) as one exception, handled alike everywhere.

A command that started something (steps, a forward, a cluster) must stop it whichever of the
three arrives and wherever it arrives; Python turns only SIGINT into an exception by itself,
and SIGTERM and SIGHUP would end the process with no ``finally`` run. Within
:func:`stop_signals_raise` each of them raises :class:`StopSignal` in the main thread, a
``KeyboardInterrupt`` so that code handling Ctrl-C (Ray's CLI among it) handles all three.
:func:`shielded` ignores them while the command stops what it started: a second Ctrl-C must
not cut a teardown short. :func:`exit_by` ends the process the way the shell expects of a
command stopped by a signal (its status 128 + the signal).
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

#: The stop signals this process received through :func:`raise_stop`, oldest first.
received: list[int] = []


class StopSignal(KeyboardInterrupt):
    """A stop signal arrived; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(self.name)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


def raise_stop(signum: int, _frame: FrameType | None) -> None:
    received.append(signum)
    raise StopSignal(signum)


def check() -> None:
    """Raise :class:`StopSignal` again in the main thread once a stop signal has arrived: a
    wait loop calls it on every round. The handler's own exception is lost when the signal
    lands in code whose exceptions Python ignores (a weakref callback, a ``__del__``); seen
    on the test bed, where an interrupted `ray up` then waited on as if nothing happened."""
    if received and threading.current_thread() is threading.main_thread():
        raise StopSignal(received[-1])


def _unhandled(sig: int) -> bool:
    """Nobody but Python's defaults handles ``sig`` (Ray's monitor, say, has its own)."""
    return signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler, raise_stop)


def install(only_unhandled: bool = True) -> list[int]:
    """Make the stop signals raise :class:`StopSignal` for the rest of the process, and the
    process end by the first of them that arrived (:func:`exit_by`, after the other
    ``atexit`` handlers registered later, which stop what it began); returns the signals
    this took over. ``only_unhandled`` leaves a signal that someone else handles (an
    embedding program's own handler). Nothing outside the main thread, where Python cannot
    install handlers."""
    if threading.current_thread() is not threading.main_thread():
        return []
    taken: list[int] = [s for s in STOP_SIGNALS if not only_unhandled or _unhandled(s)]
    for sig in taken:
        signal.signal(sig, raise_stop)
    if taken and not _exit_registered:
        _exit_registered.append(True)
        atexit.register(_exit_by_received)
    return taken


_exit_registered: list[bool] = []


def _exit_by_received() -> None:
    if received:
        exit_by(received[0])


@contextmanager
def stop_signals_raise() -> Iterator[None]:
    """Within: SIGINT, SIGTERM and SIGHUP raise :class:`StopSignal`; the handlers before are
    restored after (main thread only; elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    install(only_unhandled=False)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _noted(signum: int, _frame: FrameType | None) -> None:
    received.append(signum)


@contextmanager
def shielded() -> Iterator[None]:
    """Within: the stop signals are noted in :data:`received` and otherwise ignored, so that
    stopping what a command started runs to its end (each such step is bounded by its own
    timeout). The handlers before are restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _noted) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def exit_by(signum: int) -> None:
    """End this process by ``signum`` with its default action, so that the parent (a shell,
    SLURM) sees a command stopped by that signal; skips what ``atexit`` has left to run."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # only if the signal is blocked here
