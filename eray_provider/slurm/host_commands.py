"""SLURM's client commands for a process in a container that has none: run by the host.

A cluster's image seldom holds SLURM's commands, its config and munge's socket, and a
container cannot reach them. Yet some processes of a cluster in a container need SLURM:
the head's autoscaler of an elastic cluster submits, lists and cancels its worker jobs
(``sbatch``, ``squeue``, ``scancel``, ``scontrol``) and stops one node with a short
``srun``; the head's walltime watch lists jobs. So a plain step on the head's node, outside
the container (``SERVER``, started with the head: ``launch.start_relay``), runs these
commands for the cluster's processes, which hand them over through files in the cluster's
state dir (``<state dir>/relay``, mounted at its own path in every container).

Who can ask: whoever can write in the state dir, that is the user alone (the state base and
every state dir are the user's and private, made before anything of the cluster runs, so no
one else could have made them first). What can be asked: ``sbatch``, ``squeue``,
``scancel``, ``scontrol`` and ``srun`` as the user, no other program. A request is a
directory: ``argv`` and ``env`` (NUL-separated), ``stdin``, ``timeout``; the server claims
it by renaming ``req.X`` to ``run.X`` (one server runs it, even if two were started), runs
it under ``timeout`` with the host's ``PATH`` and ``SLURM_CONF`` (the container's mean
nothing there) and the caller's other variables, set by builtins (never on an argv, which
``/proc`` shows to every user), less any that makes a program load code (``LD_*``,
``BASH_ENV``, ``GCONV_PATH``...), and answers ``out``, ``err`` and, last, ``rc``. A caller
that gives up withdraws its request whole (renamed away) unless the server took it. The
caller is woken by polling; the server by a line on ``wake`` (a FIFO, on its node) or
within a second. A server that does not run is seen at once (its lock is
free) and is an error, as a missing command is: no verdict about any job.

Used only where the command is not on the caller's ``PATH`` and ``RELAY_ENV`` names a dir
(``slurm.client.execute``), so an image that has SLURM's commands runs them itself.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

#: The variable that names the relay's dir, in the environment of a cluster's containers.
RELAY_ENV = "ERAY_HOST_RELAY"
#: The programs the server runs.
COMMANDS = ("sbatch", "squeue", "scancel", "scontrol", "srun")
#: Seconds the caller waits for the answer beyond the command's own timeout (the server's
#: ``timeout -k 5``, the files' round trip).
ANSWER_SLACK = 10.0

#: The exit statuses of ``timeout`` when it ended the command (TERM, then KILL).
TIMED_OUT = (124, 137)

#: The server: ``bash -c SERVER relay DIR``, on the host, for the cluster's life.
SERVER = (
    r"""
set -u
dir="$1" host_path="$PATH" host_conf="${SLURM_CONF:-}"
[ -d "$dir" ] && [ ! -L "$dir" ] || exit 1
exec 9>>"$dir/lock" || exit 1
flock -n -E 200 9
case $? in
0) ;;
200) exit 0 ;;  # one server per cluster: a second start leaves the first serving
*) echo "eray-provider: cannot lock $dir/lock (flock): SLURM's commands cannot be relayed" >&2; exit 1 ;;
esac
rm -f "$dir/wake" && mkfifo -m 600 "$dir/wake" && exec 8<>"$dir/wake" || exit 1
allowed=" """
    + " ".join(COMMANDS)
    + r""" "
serve() {
  local r="$1" argv=() envs=() e seconds=30
  mapfile -d '' -t argv < "$r/argv"
  mapfile -d '' -t envs < "$r/env"
  read -r seconds < "$r/timeout" || true
  [[ $seconds =~ ^[1-9][0-9]{0,5}$ ]] || seconds=30
  if [[ ${#argv[@]} -eq 0 || $allowed != *" ${argv[0]} "* || ${argv[0]} == *[!a-z]* ]]; then
    : > "$r/out"
    echo "eray-provider: the host relay runs SLURM's commands only, not ${argv[0]:-nothing}" > "$r/err"
    echo 126 > "$r/rc.part" && mv -f "$r/rc.part" "$r/rc"
    return
  fi
  set -- -k 5 "$seconds" "${argv[@]}"
  (
    exec < "$r/stdin" > "$r/out" 2> "$r/err" || exit 1
    # the caller's variables set by builtins, never on an argv (/proc shows those to all);
    # the host's PATH and SLURM_CONF, none that makes a program load code
    for e in $(compgen -e); do unset -v "$e" 2> /dev/null; done
    export PATH="$host_path"
    for e in "${envs[@]}"; do
      case $e in
      PATH=* | LD_* | BASH_ENV=* | ENV=* | BASH_FUNC_* | SLURM_CONF=* | GCONV_PATH=*) continue ;;
      esac
      [[ $e =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] && export -- "$e" 2> /dev/null
    done
    [ -z "$host_conf" ] || export SLURM_CONF="$host_conf"
    exec timeout "$@"
  )
  echo $? > "$r/rc.part" && mv -f "$r/rc.part" "$r/rc"
}
while [ -d "$dir" ]; do
  for req in "$dir"/req.*; do
    [[ -d $req && ! -L $req ]] || continue
    run="$dir/run.${req#"$dir"/req.}"
    mv -T -- "$req" "$run" 2>/dev/null || continue
    serve "$run" 8>&- 9>&- &
  done
  read -r -t 1 -u 8 _ || true
done
"""
)


class _RelayError(OSError):
    """No server runs the commands (the head's host step has ended or not begun)."""


def relay_dir(env: Mapping[str, str]) -> Path | None:
    """The relay's dir this process may hand commands to, or None."""
    value = env.get(RELAY_ENV)
    return Path(value) if value else None


def serving(where: Path) -> bool:
    """Whether a server holds the relay's lock (it takes it for its life)."""
    try:
        fd = os.open(where / "lock", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        return e.errno in (errno.EAGAIN, errno.EACCES)
    else:
        return False  # free: nobody serves (closing the fd lets it go)
    finally:
        os.close(fd)


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _wake(where: Path) -> None:
    """A line on the server's FIFO, when it runs on this node (elsewhere it polls)."""
    try:
        fd = os.open(where / "wake", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.write(fd, b"\n")
    except OSError:
        pass
    finally:
        os.close(fd)


def relayed(
    args: Sequence[str], timeout: float, stdin: str | None, env: Mapping[str, str], where: Path
) -> subprocess.CompletedProcess[str]:
    """Run ``args`` (one of ``COMMANDS``) by the relay in ``where``: its exit status and
    output, as ``subprocess.run`` gives them. ``_RelayError`` when no server runs;
    ``subprocess.TimeoutExpired`` when no answer came within ``timeout`` (and the slack)."""
    if not serving(where):
        raise _RelayError(
            f"{args[0]} is not on this container's PATH, and no relay runs it on the host ({where}: "
            "the head's host step has ended or not begun)"
        )
    token = secrets.token_hex(8)
    draft = where / f"draft.{token}"
    draft.mkdir(mode=0o700)
    request, running = where / f"req.{token}", where / f"run.{token}"
    try:
        _write(draft / "argv", b"\0".join(a.encode() for a in args) + b"\0")
        _write(draft / "env", b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
        _write(draft / "stdin", (stdin or "").encode())
        _write(draft / "timeout", f"{max(1, round(timeout))}\n".encode())
        os.rename(draft, request)
    except BaseException:
        shutil.rmtree(draft, ignore_errors=True)  # a full disk must not stay full of drafts
        raise
    _wake(where)
    deadline = time.monotonic() + timeout + ANSWER_SLACK
    pause = 0.01
    try:
        while True:
            try:
                code = int((running / "rc").read_text().strip() or "1")
            except (FileNotFoundError, ValueError):
                pass
            else:
                if code in TIMED_OUT:
                    raise subprocess.TimeoutExpired(list(args), timeout)
                out, err = (running / "out").read_text(), (running / "err").read_text()
                return subprocess.CompletedProcess(list(args), code, out, err)
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(list(args), timeout)
            if request.exists() and not serving(where):
                raise _RelayError(f"the relay on the host ({where}) ended before it took {args[0]}")
            time.sleep(pause)
            pause = min(0.2, pause * 2)
    finally:
        # a request not taken yet is withdrawn whole first (renamed away, the server can no
        # longer take it), never half removed under a server that takes it meanwhile
        gone = where / f"gone.{token}"
        try:
            os.rename(request, gone)
        except OSError:
            pass
        for left in (gone, running):
            shutil.rmtree(left, ignore_errors=True)
