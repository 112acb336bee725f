"""The stop signals as one exception (``runtime/stop_signals``), with real signals sent to
this process and to a child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from eray_provider.runtime import stop_signals
from eray_provider.runtime.stop_signals import StopSignal, shielded, stop_signals_raise


@pytest.fixture(autouse=True)
def _fresh_scope():
    """Each test starts with nothing received and no scope open, and leaves none; and from
    the dispositions of a Python started from a terminal, whatever this run inherited (a
    runner may start it with SIGINT ignored, as ``cmd &`` does in a shell without job
    control, and ``install`` rightly leaves an ignored signal ignored)."""
    before = {s: signal.getsignal(s) for s in stop_signals.STOP_SIGNALS}
    for s in stop_signals.STOP_SIGNALS:
        signal.signal(s, signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL)
    stop_signals.received.clear()
    yield
    stop_signals.received.clear()
    stop_signals._scope.open = False
    stop_signals._scope.exit_by_signal = False
    for s, handler in before.items():
        signal.signal(s, handler)


def _deliver(sig: int) -> None:
    os.kill(os.getpid(), sig)
    signal.sigtimedwait([], 0)  # a point where Python runs the handler


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_each_stop_signal_raises_one_exception_and_the_handlers_come_back(sig) -> None:
    before = {s: signal.getsignal(s) for s in stop_signals.STOP_SIGNALS}
    with pytest.raises(StopSignal) as caught, stop_signals_raise():
        _deliver(sig)
    assert caught.value.signum == sig and caught.value.exit_status == 128 + sig
    assert isinstance(caught.value, KeyboardInterrupt)  # Ray's CLI handles it as Ctrl-C
    assert {s: signal.getsignal(s) for s in stop_signals.STOP_SIGNALS} == before


def test_only_the_first_signal_raises_and_a_lost_one_is_raised_again_by_check() -> None:
    with stop_signals_raise():
        with pytest.raises(StopSignal):
            _deliver(signal.SIGTERM)
        _deliver(signal.SIGINT)  # a second Ctrl-C while the command stops: noted only
        assert stop_signals.received == [signal.SIGTERM, signal.SIGINT]
        with pytest.raises(StopSignal) as again:
            stop_signals.check()  # as a wait loop does when the first raise was lost
        assert again.value.signum == signal.SIGTERM
        with shielded():
            stop_signals.check()  # never while what began is being stopped
    stop_signals.check()  # nor outside the scope: a caller that caught it goes on


def test_shielded_notes_the_signal_and_goes_on() -> None:
    with stop_signals_raise():
        with shielded():
            _deliver(signal.SIGTERM)
            went_on = True
        assert went_on and stop_signals.received == [signal.SIGTERM]
    assert stop_signals.received == []  # a scope's signals stay in it


def test_install_leaves_a_handler_someone_else_set() -> None:
    def mine(_signum, _frame) -> None:
        pass

    signal.signal(signal.SIGTERM, mine)
    taken = stop_signals.install()
    assert signal.SIGTERM not in taken and signal.getsignal(signal.SIGTERM) is mine
    assert set(taken) == {signal.SIGINT, signal.SIGHUP}
    with pytest.raises(StopSignal):
        _deliver(signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is mine  # still, after a stop signal came


_CHILD = """
import sys
from eray_provider.runtime import stop_signals
from eray_provider.runtime.stop_signals import StopSignal, stop_signals_raise
try:
    if sys.argv[1] == "install":
        stop_signals.install()
        print("ready", flush=True)
        sys.stdin.read()
    else:
        with stop_signals_raise():
            print("ready", flush=True)
            sys.stdin.read()
except StopSignal:
    print("caught", flush=True)
"""


@pytest.mark.parametrize("mode, status", [("scope", 0), ("install", -signal.SIGTERM)])
def test_the_process_ends_by_the_signal_only_after_install(mode, status) -> None:
    """A command that caught the signal in a scope (dashboard, logs) exits as it says; one
    that installed the handlers for good (`ray up`, `ray down`) ends by the signal."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert out == "caught\n" and proc.returncode == status


def test_the_other_tasks_of_a_step_cluster_stopped_during_its_start_are_told_at_once(tmp_path) -> None:
    """``auto_ray_cluster``'s first task tears down a start that a stop signal ended: the
    other tasks, waiting for its address, see its state dir go and fail at once."""
    import threading
    import time

    from eray_provider.errors import ClusterError
    from eray_provider.runtime.cluster_state import ClusterState, remove_state_dir
    from eray_provider.runtime.ray_cluster import _wait_ready

    state = ClusterState("step3@c", "77", tmp_path)
    state.dir.mkdir(parents=True)
    threading.Timer(1.0, remove_state_dir, args=(state.dir,)).start()
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match="was stopped during its start"):
        _wait_ready(state, 1, timeout=60)
    assert time.monotonic() - t0 < 30  # not the join timeout


def test_a_task_that_looks_only_after_a_stopped_start_is_told_too(tmp_path) -> None:
    """A task slow to start (its imports on a loaded node) never saw the state dir of a
    start that was stopped: the first task leaves a ``failed`` marker after its teardown,
    the late task reads it and answers (``done``), and the state dir goes once every other
    task answered, not at the end of the bounded wait."""
    import threading
    import time

    from eray_provider.errors import ClusterError
    from eray_provider.runtime.cluster_state import ClusterState
    from eray_provider.runtime.ray_cluster import STOPPED_WAIT_SECONDS, _tell_stopped, _wait_ready

    state = ClusterState("step3@c", "77", tmp_path)
    told = threading.Thread(target=_tell_stopped, args=(state, 2, "SIGTERM"))
    t0 = time.monotonic()
    told.start()
    time.sleep(0.5)  # the late task's first look
    with pytest.raises(ClusterError, match="did not start: SIGTERM during its start: it was stopped"):
        _wait_ready(state, 1, timeout=60)
    told.join(timeout=60)
    assert not state.dir.exists()
    assert time.monotonic() - t0 < STOPPED_WAIT_SECONDS  # it answered: no waiting out the bound
