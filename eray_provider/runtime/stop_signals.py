"""The stop signals of a long-running command (Ctrl-C, SLURM's SIGTERM at a time limit or a
preemption, SIGHUP from a closed terminal) as one exception, handled alike everywhere.

A command that started something (steps, a forward, a cluster) must stop it whichever of the
three arrives and wherever it arrives; Python turns only SIGINT into an exception by itself,
and SIGTERM and SIGHUP would end the process with no ``finally`` run.

- :func:`stop_signals_raise` (a scope) and :func:`install` (the rest of the process, for
  `ray up` and `ray down`, whose top is Ray's CLI): each stop signal raises
  :class:`StopSignal` in the main thread, a ``KeyboardInterrupt``, so that code handling
  Ctrl-C (Ray's CLI among it) handles all three. The first one raises; later ones are only
  noted, so that stopping what the command began is not cut short by a second Ctrl-C.
- :func:`check` in a wait loop raises it again, and :func:`stopping` tells another thread:
  the handler's own exception is lost when the signal lands in code whose exceptions Python
  ignores (a weakref callback, a ``__del__``); seen on the test bed, where an interrupted
  `ray up` then waited on as if nothing had happened.
- :func:`shielded` ignores (notes) them while a command stops what it began.
- After :func:`install`, the process ends by the first stop signal it received, after the
  exit handlers registered once this module was imported (which stop what the command
  began); earlier ones (Ray's ``shutdown``, ``logging``'s) are skipped (:func:`exit_by`:
  the shell sees 128 + the signal).
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

#: The stop signals received in the current scope, oldest first.
received: list[int] = []


class _Scope:
    open = False  # a scope watches stop signals (``install``, ``watching``)
    shielded = 0  # depth of ``shielded``
    exit_by_signal = False  # ``install`` ran: the process ends by the first stop signal


_scope = _Scope()


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


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _noted(signum: int, _frame: FrameType | None) -> None:
    received.append(signum)


def raise_stop(signum: int, _frame: FrameType | None) -> None:
    """The handler: note the signal, make the next ones only noted (those this module
    raises on: a handler someone else installed stays), raise."""
    received.append(signum)
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is raise_stop:
            signal.signal(sig, _noted)
    raise StopSignal(signum)


def note(signum: int) -> None:
    """For a handler of its own (``eray-provider run`` passes the signal to its command):
    the signal counts for :func:`check` and :func:`stopping`."""
    received.append(signum)


def stopping() -> bool:
    """A stop signal arrived in the current scope (any thread may ask)."""
    return _scope.open and bool(received)


def check() -> None:
    """In the main thread, raise :class:`StopSignal` once a stop signal has arrived in the
    current scope (not while :func:`shielded`). Wait loops call it on every round."""
    if stopping() and not _scope.shielded and _main_thread():
        raise StopSignal(received[0])


def _unhandled(sig: int) -> bool:
    """Nobody but Python's defaults handles ``sig`` (Ray's monitor, say, has its own)."""
    return signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler, raise_stop, _noted)


def install() -> list[int]:
    """For the rest of the process: the stop signals nobody else handles (an embedding
    program's or Ray's monitor's handlers are left) raise :class:`StopSignal`, and the
    process ends by the first that arrived (:func:`exit_by`, after the other exit handlers,
    which stop what it began). Returns the signals taken over; nothing outside the main
    thread, where Python cannot install handlers."""
    if not _main_thread():
        return []
    taken: list[int] = [s for s in STOP_SIGNALS if _unhandled(s)]
    if taken and not _scope.open:
        received.clear()
        _scope.open = True
    for sig in taken:
        signal.signal(sig, raise_stop)
    _scope.exit_by_signal = bool(taken) or _scope.exit_by_signal
    return taken


@contextmanager
def watching() -> Iterator[None]:
    """A scope whose stop signals a handler of its own reports with :func:`note`; what it
    received stays in it (an enclosing :func:`install` sees only its own)."""
    outer = list(received)
    received.clear()
    was = _scope.open
    _scope.open = True
    try:
        yield
    finally:
        _scope.open = was
        received[:] = outer


@contextmanager
def stop_signals_raise() -> Iterator[None]:
    """Within: SIGINT, SIGTERM and SIGHUP raise :class:`StopSignal` (the first; later ones
    are noted); the handlers before are restored after (main thread only; elsewhere
    nothing changes). Stop what the command began inside this scope, under
    :func:`shielded`."""
    if not _main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    with watching():
        for sig in STOP_SIGNALS:
            signal.signal(sig, raise_stop)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


@contextmanager
def shielded() -> Iterator[None]:
    """Within: the stop signals are noted in :data:`received` and otherwise ignored, so that
    stopping what a command began runs to its end (each such step is bounded by its own
    timeout). The handlers before are restored after."""
    if not _main_thread():
        yield
        return
    previous = {s: signal.signal(s, _noted) for s in STOP_SIGNALS}
    _scope.shielded += 1
    try:
        yield
    finally:
        _scope.shielded -= 1
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def exit_by(signum: int) -> None:
    """End this process by ``signum`` with its default action, so that the parent (a shell,
    SLURM) sees a command stopped by that signal; skips what ``atexit`` has left to run."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # only if the signal is blocked here


@atexit.register  # at import: it runs after every exit handler registered later
def _exit_by_received() -> None:
    if _scope.exit_by_signal and received:
        exit_by(received[0])
