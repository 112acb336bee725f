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


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_each_stop_signal_raises_one_exception_and_the_handlers_come_back(sig) -> None:
    before = {s: signal.getsignal(s) for s in stop_signals.STOP_SIGNALS}
    with pytest.raises(StopSignal) as caught, stop_signals_raise():
        os.kill(os.getpid(), sig)
        signal.sigtimedwait([], 0)  # a point where Python runs the handler
    assert caught.value.signum == sig and caught.value.exit_status == 128 + sig
    assert isinstance(caught.value, KeyboardInterrupt)  # Ray's CLI handles it as Ctrl-C
    assert {s: signal.getsignal(s) for s in stop_signals.STOP_SIGNALS} == before


def test_shielded_notes_the_signal_and_goes_on() -> None:
    stop_signals.received.clear()
    with stop_signals_raise(), shielded():
        os.kill(os.getpid(), signal.SIGTERM)
        signal.sigtimedwait([], 0)
        went_on = True
    assert went_on and stop_signals.received == [signal.SIGTERM]
    stop_signals.received.clear()


def test_install_leaves_a_handler_someone_else_set() -> None:
    def mine(_signum, _frame) -> None:
        pass

    previous = {s: signal.getsignal(s) for s in stop_signals.STOP_SIGNALS}
    signal.signal(signal.SIGTERM, mine)
    try:
        taken = stop_signals.install(only_unhandled=True)
        assert signal.SIGTERM not in taken and signal.getsignal(signal.SIGTERM) is mine
        assert set(taken) == {signal.SIGINT, signal.SIGHUP}
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def test_exit_by_ends_the_process_by_that_signal_and_skips_nothing_before() -> None:
    code = (
        "import sys; from eray_provider.runtime.stop_signals import exit_by; "
        "print('before', flush=True); exit_by(15)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGTERM and proc.stdout == "before\n", proc


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
        _wait_ready(state, timeout=60)
    assert time.monotonic() - t0 < 30  # not the join timeout
