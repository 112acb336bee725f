"""SLURM's commands from a container that has none, run by the host (slurm/host_commands.py):
the real server script in bash, the real client, a fake ``squeue``/``sbatch`` that only the
server's PATH holds (as the host's SLURM is missing from an image). The live test
(test_containers_live.py) runs an elastic cluster whose head's autoscaler submits and
cancels its worker jobs through it."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from eray_provider.slurm import client
from eray_provider.slurm.client import SlurmCommandError, execute, run_sbatch, run_slurm
from eray_provider.slurm.host_commands import RELAY_ENV, SERVER, relayed, serving

#: answers with what it was given: its arguments, a variable, its stdin; `sleep` hangs
FAKE = """#!/bin/bash
if [ "${1:-}" = sleep ]; then exec sleep 600; fi
echo "ARGS $(basename "$0") $*"
echo "SEEN ${SEEN:-unset} PRELOAD ${LD_PRELOAD:-none} AUDIT ${LD_AUDIT:-none} BASH_ENV ${BASH_ENV:-none}" \\
  "PATH $PATH"
echo "CONF ${SLURM_CONF:-none} PARENT $(tr '\\0' ' ' < /proc/$PPID/cmdline)"
[ -t 0 ] || sed 's/^/IN /'
[ "${1:-}" = fail ] && { echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; }
exit 0
"""


@pytest.fixture
def relay(tmp_path, monkeypatch):
    """A server on a host whose PATH has the fake commands; a client whose PATH has none."""
    host_bin = tmp_path / "host-bin"
    host_bin.mkdir()
    for name in ("squeue", "sbatch", "ls"):
        (host_bin / name).write_text(FAKE)
        (host_bin / name).chmod(0o755)
    where = tmp_path / "state" / "relay"
    where.mkdir(parents=True, mode=0o700)
    server_env = {"PATH": f"{host_bin}:/usr/bin:/bin", "SLURM_CONF": "/host/slurm.conf"}
    started = [
        subprocess.Popen(["bash", "-c", SERVER, "relay", str(where)], env=server_env, stderr=subprocess.PIPE)
    ]
    deadline = time.monotonic() + 30
    while not serving(where):
        assert time.monotonic() < deadline and started[0].poll() is None, "the relay did not start"
        time.sleep(0.05)
    monkeypatch.setenv("PATH", str(tmp_path / "container-bin"))  # the container's: no SLURM
    monkeypatch.setenv(RELAY_ENV, str(where))
    yield where, started, server_env
    for proc in started:
        proc.kill()
        proc.wait(timeout=30)


def test_a_command_missing_here_runs_on_the_host_with_its_input_and_answer(relay) -> None:
    where, _, _ = relay
    env = {"SEEN": "secret-1", "LD_PRELOAD": "/x/shim.so", "LD_AUDIT": "/x/a.so", "BASH_ENV": "/x/rc"}
    env.update(PATH="/container/bin", SLURM_CONF="/container/slurm.conf")
    out = run_sbatch(["sbatch", "--parsable", "-J", "a b"], "#!/bin/bash\ntrue\n", env)
    lines = out.splitlines()
    assert lines[0] == "ARGS sbatch --parsable -J a b"  # each argument as it was, spaces too
    # the caller's variables, less any that loads code (a container's shim means nothing
    # on the host); the host's PATH and SLURM_CONF, not the container's
    assert lines[1].startswith("SEEN secret-1 PRELOAD none AUDIT none BASH_ENV none PATH "), lines[1]
    assert "host-bin" in lines[1]
    # and never on an argv, which every user reads in /proc: not on the command's parent's
    assert lines[2].startswith("CONF /host/slurm.conf PARENT timeout -k 5 "), lines[2]
    assert "secret-1" not in lines[2]
    assert lines[3:] == ["IN #!/bin/bash", "IN true"]
    # a verdict of SLURM's comes back as one, as when squeue runs here
    with pytest.raises(client.SlurmAnswerError, match="Invalid job id"):
        run_slurm(["squeue", "fail"], attempts=1)
    # nothing of the requests is left in the relay's dir
    assert sorted(p.name for p in where.iterdir()) == ["lock", "wake"]


def test_requests_from_many_threads_at_once_each_get_their_own_answer(relay) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda i: run_slurm(["squeue", f"n{i}"], attempts=1), range(24)))
    assert [out.splitlines()[0] for out in outs] == [f"ARGS squeue n{i}" for i in range(24)]


def test_the_relay_runs_slurms_commands_only(relay) -> None:
    where, _, _ = relay
    proc = relayed(["ls", "/"], 10, None, {}, where)
    assert proc.returncode == 126 and "SLURM's commands only, not ls" in proc.stderr
    assert "ARGS" not in proc.stdout


def test_a_second_server_leaves_the_first_serving_and_a_stopped_one_fails_at_once(relay) -> None:
    where, started, server_env = relay
    second = subprocess.run(["bash", "-c", SERVER, "relay", str(where)], env=server_env, timeout=30)
    assert second.returncode == 0  # it ended at once: the first holds the lock
    assert run_slurm(["squeue", "x"], attempts=1).startswith("ARGS squeue x")
    started[0].kill()
    started[0].wait(timeout=30)
    begin = time.monotonic()
    with pytest.raises(SlurmCommandError, match="no relay runs it on the host"):
        run_slurm(["squeue", "x"], attempts=1)
    with pytest.raises(OSError, match="no relay runs it"):
        execute(["sbatch"], 30)
    assert time.monotonic() - begin < 5  # seen at once, not waited out


def test_a_command_that_hangs_is_bounded_by_its_timeout(relay) -> None:
    begin = time.monotonic()
    with pytest.raises(SlurmCommandError, match="did not answer within 1 s"):
        run_slurm(["squeue", "sleep"], timeout=1, attempts=1)
    assert time.monotonic() - begin < 1 + 10 + 5


def test_without_a_relay_a_missing_command_is_named(monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv(RELAY_ENV, raising=False)
    with pytest.raises(SlurmCommandError, match="squeue is not installed or not on PATH"):
        run_slurm(["squeue"], attempts=1)
    assert os.environ["PATH"] == "/nonexistent"


def test_a_command_here_is_run_here_even_with_a_relay_named(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(RELAY_ENV, str(tmp_path / "no-relay"))
    assert execute(["true"], 10).returncode == 0  # on PATH: no relay asked
    assert not Path(tmp_path / "no-relay").exists()


def test_a_request_that_is_a_link_is_not_followed_and_a_restarted_server_serves(relay, tmp_path) -> None:
    where, started, server_env = relay
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "argv").write_bytes(b"squeue\0")
    (where / "req.link").symlink_to(outside)
    assert run_slurm(["squeue", "y"], attempts=1).startswith("ARGS squeue y")
    assert sorted(p.name for p in outside.iterdir()) == ["argv"]  # nothing run, nothing written
    (where / "req.link").unlink()

    # a server killed while a command of its runs: the command does not keep its lock
    def hangs() -> None:
        with pytest.raises(SlurmCommandError):
            run_slurm(["squeue", "sleep"], timeout=3, attempts=1)

    slow = threading.Thread(target=hangs)
    slow.start()
    deadline = time.monotonic() + 10
    while not any(p.name.startswith("run.") for p in where.iterdir()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    started[0].kill()
    started[0].wait(timeout=30)
    started.append(
        subprocess.Popen(["bash", "-c", SERVER, "relay", str(where)], env=server_env, stderr=subprocess.PIPE)
    )
    deadline = time.monotonic() + 10
    while not serving(where) or started[-1].poll() is not None:
        assert time.monotonic() < deadline and started[-1].poll() is None, "the new server did not serve"
        time.sleep(0.05)
    assert run_slurm(["squeue", "z"], attempts=1).startswith("ARGS squeue z")
    slow.join(timeout=30)


def test_another_user_can_neither_ask_the_relay_nor_read_it(tmp_path) -> None:
    """The relay's dir as the launcher makes it (in the cluster's state dir, under a base
    that another user can reach): that user can list nothing, hand in no request, take or
    read nothing of it."""
    import pwd
    import tempfile

    from testbed_support import other_user

    from eray_provider.plan.container import relay_path
    from eray_provider.runtime.cluster_state import ClusterState, ensure_private_dir

    user = other_user()
    home = tempfile.mkdtemp(dir="/tmp")
    os.chmod(home, 0o755)  # a HOME others may enter
    try:
        state = ClusterState("c", "7", Path(home) / ".eray-provider")
        state.create()
        where = ensure_private_dir(Path(relay_path(str(state.dir))))  # as launch.start_relay
        (where / "lock").touch()
        assert pwd.getpwnam(user).pw_uid != os.getuid()
        for attempt in (
            f"ls {where}",
            f"mkdir {where}/req.mine",
            f"cat {where}/lock",
            f"echo x > {where}/wake",
            f"mkdir {state.dir}/relay2",
        ):
            proc = subprocess.run(
                ["runuser", "-u", user, "--", "sh", "-c", attempt], capture_output=True, text=True, timeout=30
            )
            assert proc.returncode != 0 and "Permission denied" in proc.stderr, (attempt, proc)
        assert sorted(p.name for p in where.iterdir()) == ["lock"]
    finally:
        subprocess.run(["rm", "-rf", home], check=True, timeout=30)
