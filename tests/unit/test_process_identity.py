"""Signals by recorded PID reach only the recorded process (real processes, no mocks)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

from eray_provider.runtime.process_identity import identity, parse_identity, signal_command, start_time


def _wait_dead(proc: subprocess.Popen, timeout: float = 10) -> bool:
    try:
        proc.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def test_signal_reaches_the_recorded_process(tmp_path) -> None:
    # a command name with a space and a parenthesis: /proc/PID/stat's field 2 holds it
    odd = tmp_path / "node) run"
    shutil.copy(shutil.which("sleep"), odd)
    proc = subprocess.Popen([str(odd), "100"])
    try:
        record = identity(proc.pid)
        assert parse_identity(record) == (proc.pid, start_time(proc.pid))
        command = signal_command(record)
        assert command is not None
        assert subprocess.run(command).returncode == 0
        assert _wait_dead(proc)
    finally:
        proc.kill()


def test_a_reused_pid_is_left_alone(tmp_path) -> None:
    """The recorded PID now belongs to another process (same PID, other start time)."""
    proc = subprocess.Popen(["sleep", "100"])
    try:
        pid, start = parse_identity(identity(proc.pid)) or (0, "")
        stale = f"{pid} {int(start) - 1}"  # the process that had this PID before
        assert subprocess.run(signal_command(stale) or ["false"]).returncode == 3
        time.sleep(0.3)
        assert proc.poll() is None  # still running: not ours any more, not signalled
    finally:
        proc.kill()
        proc.wait()


def test_a_gone_process_or_a_bad_record_sends_nothing() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    record = f"{proc.pid} 1"
    assert subprocess.run(signal_command(record) or ["false"]).returncode == 3
    for bad in ("", "123", "12 ab", "1 2 3", "$(reboot) 1", None):
        assert signal_command(bad) is None  # type: ignore[arg-type]
    assert signal_command(identity(os.getpid()), "TERM; rm") is None
