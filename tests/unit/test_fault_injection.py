"""The fault-injection wrappers (tests/support/fault_injection.py) against fake SLURM commands."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from fault_injection import CONTROL_VAR, DEFAULT_STDERR, FaultyCommands

FAKE = """#!/bin/sh
echo "real-$(basename "$0") pid=$$ args=$*"
echo "real-stderr" >&2
exit "${FAKE_RC:-0}"
"""

# reads one line of stdin: the wrapper must leave stdin to the real command
FAKE_STDIN = """#!/bin/sh
read -r line
echo "real-scontrol got=$line"
"""


def write_exe(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def fake_dir(tmp_path: Path) -> Path:
    d = tmp_path / "real"
    write_exe(d / "squeue", FAKE)
    write_exe(d / "scancel", FAKE)
    write_exe(d / "scontrol", FAKE_STDIN)
    return d


@pytest.fixture
def fc(tmp_path: Path, fake_dir: Path) -> FaultyCommands:
    path = f"{fake_dir}:/usr/bin:/bin"
    # nosuchcmd: wrapped, but no real one anywhere
    harness = FaultyCommands(
        tmp_path / "fi", commands=("squeue", "scancel", "scontrol", "nosuchcmd"), path=path
    )
    harness.install()
    return harness


def run(fc: FaultyCommands, *argv: str, timeout: float = 10, **kw) -> subprocess.CompletedProcess[str]:
    env = fc.env({"PATH": f"{fake_dir_of(fc)}:/usr/bin:/bin", **kw.pop("extra_env", {})})
    return subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=timeout, **kw)


def fake_dir_of(fc: FaultyCommands) -> Path:
    return fc.root.parent / "real"


def test_install_resolves_the_real_commands_past_the_wrappers(fc: FaultyCommands, fake_dir: Path) -> None:
    assert fc.real("squeue") == str(fake_dir / "squeue")
    assert fc.real("nosuchcmd") is None
    assert os.access(fc.bin_dir / "squeue", os.X_OK)
    # a second install (the wrapper dir now also first on the search path) still finds the real ones
    again = FaultyCommands(fc.root, commands=fc.commands, path=f"{fc.bin_dir}:{fake_dir}:/usr/bin:/bin")
    again.install()
    assert again.real("squeue") == str(fake_dir / "squeue")


def test_env_puts_the_wrappers_first_once(fc: FaultyCommands) -> None:
    env = fc.env({"PATH": f"/a:{fc.bin_dir}:/b", "X": "1"})
    assert env["PATH"] == f"{fc.bin_dir}:/a:/b"
    assert env[CONTROL_VAR] == str(fc.control_dir) and env["X"] == "1"


def test_pass_through_keeps_stdout_stderr_rc_pid_and_stdin(fc: FaultyCommands) -> None:
    proc = run(fc, "squeue", "-h", "-j", "5", extra_env={"FAKE_RC": "3"})
    assert proc.returncode == 3
    assert proc.stdout.startswith("real-squeue pid=") and proc.stdout.endswith(" args=-h -j 5\n")
    assert proc.stderr == "real-stderr\n"
    [call] = fc.calls("squeue")
    assert (call.action, call.args, call.rule, call.faulted) == ("pass", ("-h", "-j", "5"), None, False)
    # exec in place: the real command runs under the wrapper's pid
    assert f"pid={call.pid} " in proc.stdout
    proc = run(fc, "scontrol", input="show job 5\n")
    assert proc.stdout == "real-scontrol got=show job 5\n"


def test_fail_n_times_then_pass(fc: FaultyCommands) -> None:
    rule = fc.fail("squeue", times=2)
    assert fc.remaining(rule) == 2
    first, second, third = (run(fc, "squeue", str(i)) for i in range(3))
    for proc in (first, second):
        assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", DEFAULT_STDERR + "\n")
    assert third.returncode == 0 and "args=2" in third.stdout
    assert fc.remaining(rule) == 0
    assert [c.args for c in fc.faulted("squeue")] == [("0",), ("1",)]
    assert [c.action for c in fc.calls("squeue")] == ["fail", "fail", "pass"]
    # scancel was never armed
    assert run(fc, "scancel", "7").returncode == 0


def test_fail_with_own_output_and_status(fc: FaultyCommands) -> None:
    fc.fail("scancel", stdout="garbage\n", stderr="scancel: error: Invalid job id", rc=7)
    proc = run(fc, "scancel", "9")
    assert (proc.returncode, proc.stdout, proc.stderr) == (7, "garbage\n", "scancel: error: Invalid job id\n")


def test_hang_then_real_answers_late(fc: FaultyCommands) -> None:
    fc.hang("squeue", seconds=0.4, then="real")
    t0 = time.monotonic()
    proc = run(fc, "squeue", "late")
    assert time.monotonic() - t0 >= 0.4
    assert proc.returncode == 0 and "args=late" in proc.stdout
    [call] = fc.faulted("squeue")
    assert call.action == "hang-real"
    t0 = time.monotonic()
    assert run(fc, "squeue").returncode == 0
    assert time.monotonic() - t0 < 0.4


def test_a_hang_until_a_path_is_held_until_it_exists(fc: FaultyCommands, tmp_path: Path) -> None:
    flag = tmp_path / "go"
    fc.hang("squeue", seconds=60, then="real", until=flag)
    proc = subprocess.Popen(
        ["squeue", "held"],
        env=fc.env({"PATH": f"{fake_dir_of(fc)}:/usr/bin:/bin"}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    fc.wait_calls("squeue", 1, timeout=5, faulted=True)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.5)  # held while the path is missing
    flag.touch()
    out, _ = proc.communicate(timeout=5)  # let go within a tick, not after 60 s
    assert proc.returncode == 0 and "args=held" in out
    [call] = fc.faulted("squeue")
    assert call.action == "hang-real"
    # a missing path holds a call no longer than the seconds
    fc.hang("squeue", seconds=0.3, then="real", until=tmp_path / "never")
    t0 = time.monotonic()
    assert run(fc, "squeue").returncode == 0
    assert 0.3 <= time.monotonic() - t0 < 5


def test_hang_then_fail(fc: FaultyCommands) -> None:
    fc.hang("squeue", seconds=0.2, rc=2, stderr="timed out")
    t0 = time.monotonic()
    proc = run(fc, "squeue")
    assert time.monotonic() - t0 >= 0.2
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", "timed out\n")
    assert [c.action for c in fc.calls()] == ["hang-fail"]


def sleepers(seconds: str) -> list[int]:
    """Pids of ``sleep <seconds>`` processes."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(cmdline) >= 2 and cmdline[0].endswith(b"sleep") and cmdline[1] == seconds.encode():
            pids.append(int(entry.name))
    return pids


def test_a_caller_timeout_is_not_held_up_and_the_sleep_is_bounded(fc: FaultyCommands) -> None:
    fc.hang("squeue", seconds=1.337)
    env = fc.env({"PATH": f"{fake_dir_of(fc)}:/bin"})
    proc = subprocess.Popen(["squeue"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        proc.communicate(timeout=0.3)
    proc.kill()  # as a caller that gives up does: SIGKILL, then read the pipes to EOF
    proc.communicate(timeout=5)
    assert time.monotonic() - t0 < 1.0, "the orphaned sleep kept the caller's pipes open"
    assert proc.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 5
    while sleepers("1.337") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not sleepers("1.337")


def test_sigterm_ends_a_hang_with_its_sleep(fc: FaultyCommands) -> None:
    fc.hang("squeue", seconds=7.321)
    proc = subprocess.Popen(
        ["squeue"],
        env=fc.env({"PATH": f"{fake_dir_of(fc)}:/bin"}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    fc.wait_calls("squeue", 1, timeout=5, faulted=True)
    deadline = time.monotonic() + 5
    while not sleepers("7.321") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sleepers("7.321")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=3) == 143
    deadline = time.monotonic() + 3
    while sleepers("7.321") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not sleepers("7.321")


def test_match_takes_only_matching_calls(fc: FaultyCommands) -> None:
    steps = fc.fail("squeue", times=None, match="-s -j")
    jobs = fc.fail("squeue", times=1, rc=4)
    assert run(fc, "squeue", "-h", "-s", "-j", "5").returncode == 1  # the step listing rule
    assert run(fc, "squeue", "-h", "-j", "5").returncode == 4  # falls through to the next rule
    assert run(fc, "squeue", "-h", "-j", "5").returncode == 0  # that one is used up
    assert run(fc, "squeue", "-s", "-j", "6").returncode == 1  # unlimited
    assert (fc.remaining(steps), fc.remaining(jobs)) == (None, 0)
    assert [c.rule for c in fc.calls("squeue")] == [steps, jobs, None, steps]


def test_concurrent_calls_take_exactly_the_armed_faults(fc: FaultyCommands) -> None:
    rule = fc.fail("squeue", times=3)
    env = fc.env({"PATH": f"{fake_dir_of(fc)}:/bin"})
    procs = [
        subprocess.Popen(["squeue", str(i)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for i in range(8)
    ]
    codes = sorted(p.wait(timeout=10) for p in procs)
    for p in procs:
        p.communicate()
    assert codes == [0] * 5 + [1] * 3
    assert fc.remaining(rule) == 0
    calls = fc.calls("squeue")
    assert sorted(c.seq for c in calls) == list(range(1, 9))
    assert sorted(c.args[0] for c in calls) == [str(i) for i in range(8)]
    assert len(fc.faulted("squeue")) == 3


def test_faults_armed_while_a_process_runs(fc: FaultyCommands) -> None:
    proc = subprocess.Popen(
        ["bash", "-c", "squeue one; echo rc=$?; read -r _; squeue two; echo rc=$?"],
        env=fc.env({"PATH": f"{fake_dir_of(fc)}:/usr/bin:/bin"}),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    fc.wait_calls("squeue", 1, timeout=5)
    fc.fail("squeue")
    out, _ = proc.communicate("go\n", timeout=10)
    assert out.splitlines()[1:] == ["rc=0", "rc=1"]
    assert [c.action for c in fc.calls("squeue")] == ["pass", "fail"]


def test_always_fail_until_clear(fc: FaultyCommands) -> None:
    rule = fc.always_fail("scancel")
    fc.fail("squeue", times=5)
    assert [run(fc, "scancel", "1").returncode for _ in range(3)] == [1, 1, 1]
    assert fc.remaining(rule) is None
    fc.clear("scancel")
    assert run(fc, "scancel", "1").returncode == 0
    with pytest.raises(KeyError):
        fc.remaining(rule)
    assert run(fc, "squeue").returncode == 1  # clear("scancel") left squeue's rule alone
    fc.clear()
    assert run(fc, "squeue").returncode == 0
    assert len(fc.faulted("scancel")) == 3 and len(fc.faulted()) == 4


def test_log_keeps_awkward_arguments_and_since(fc: FaultyCommands) -> None:
    run(fc, "squeue", "first")
    mark = fc.mark()
    assert mark == 1
    awkward = ("a b", "", "line1\nline2", "$HOME", "-o=%i %T")
    run(fc, "scancel", *awkward)
    [call] = fc.calls(since=mark)
    assert (call.command, call.args) == ("scancel", awkward)
    assert call.argv == ["scancel", *awkward]
    assert abs(call.time - time.time()) < 30
    assert [c.command for c in fc.calls()] == ["squeue", "scancel"]
    assert "scancel" in (fc.control_dir / "calls.log").read_text()


def test_real_command_found_again_at_call_time_or_127(fc: FaultyCommands, tmp_path: Path) -> None:
    (fake_dir_of(fc) / "squeue").unlink()  # the path baked in at install time is gone
    elsewhere = tmp_path / "elsewhere"
    write_exe(elsewhere / "squeue", FAKE)
    env = fc.env({"PATH": f"{elsewhere}:/usr/bin:/bin"})
    proc = subprocess.run(["squeue", "x"], env=env, capture_output=True, text=True, timeout=10)
    assert proc.returncode == 0 and "args=x" in proc.stdout
    proc = run(fc, "nosuchcmd")
    assert proc.returncode == 127 and "no real nosuchcmd" in proc.stderr
    assert [c.command for c in fc.calls()] == ["squeue", "nosuchcmd"]


def test_bad_arguments_are_refused(fc: FaultyCommands, tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        fc.fail("squeue", times=0)
    with pytest.raises(ValueError):
        fc.fail("sinfo")  # not wrapped
    with pytest.raises(ValueError):
        fc.hang("squeue", then="later")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        fc.fail("squeue", match="")
    with pytest.raises(RuntimeError):
        FaultyCommands(tmp_path / "other").env()
    assert not (fc.control_dir / "rules" / "squeue").exists() or not any(
        (fc.control_dir / "rules" / "squeue").iterdir()
    )
