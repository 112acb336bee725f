"""Fault injection for the live tests: SLURM commands that fail, time out or answer late.

:class:`FaultyCommands` writes one small bash wrapper per SLURM command (``squeue``,
``scontrol``, ``scancel``, ``srun``, ``sbatch`` by default) into ``<root>/bin``. Put that
directory first on ``PATH`` (:meth:`FaultyCommands.env`) and every process that runs one of
those commands by name -- ``ray up``, ``ray down``, the autoscaler on the head, the srun
clients, ``eray-provider run`` in a batch job -- reaches the wrapper. While no fault is armed
the wrapper ``exec``\\ s the real command (same pid, same stdin/stdout/stderr, same exit
status). A test arms faults at any time, also while the process under test is running::

    fc = FaultyCommands(root)  # see "Where root must be" below
    fc.install()
    env = fc.env(testbed.env)
    fc.fail("squeue", times=3)  # the next 3 squeue calls exit 1 with a socket timeout
    fc.hang("scancel", times=1, seconds=20, then="real")  # the next scancel answers 20 s late
    fc.fail("squeue", times=None, match=" -s")  # every step listing (squeue ... -s) fails
    testbed.run(["ray", "down", "-y", yaml], env=env, timeout=300)
    assert len(fc.faulted("squeue")) == 3 and fc.calls("scancel")
    fc.clear()  # back to the real commands

Faults per command are rules, tried in the order they were armed; the first rule that
matches a call (``match``: a substring of the arguments joined by single spaces, the command
name left out) and has calls left takes the call and counts it down. Counting and the call
log are under one ``flock``, so concurrent calls never take more faults than armed. Every
call is logged (:meth:`FaultyCommands.calls`), faulted or not; :meth:`FaultyCommands.mark`
and ``since=`` restrict the log to what happened after a point.

A late answer (:meth:`FaultyCommands.hang`) sleeps ``seconds`` in a child whose streams are
``/dev/null``: a caller that gives up and kills the wrapper gets its pipes closed at once,
SIGTERM/SIGINT/SIGHUP also end the sleep, and after SIGKILL the orphaned ``sleep`` still
ends within ``seconds``.

Where root must be: the test bed's nodes each have a private ``/tmp`` (only the test bed and
``--share`` paths are mounted there), so a pytest ``tmp_path`` is invisible to processes on
the nodes -- the head's autoscaler, batch scripts. For faults seen on the nodes, put ``root``
outside ``/tmp`` or under a shared path (e.g. a directory under the checkout); ``tmp_path``
is enough for commands run on the launcher host only (``ray up``/``ray down`` themselves).

The real command is found when :meth:`FaultyCommands.install` runs: ``PATH`` (``os.environ``
or the ``path`` given) without the wrapper directory; its absolute path is written into the
wrapper. If that file is gone at call time the wrapper searches its own ``PATH`` again, minus
its own directory, and exits 127 when there is no real command.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

#: The commands wrapped unless told otherwise.
DEFAULT_COMMANDS: tuple[str, ...] = ("squeue", "scontrol", "scancel", "srun", "sbatch")
#: What a failing call prints on stderr unless told otherwise.
DEFAULT_STDERR = "slurm_load_jobs error: Socket timed out on send/recv operation"
#: Set by :meth:`FaultyCommands.env` to the control directory (informational: the wrappers
#: carry the path themselves, so a process that drops the variable still reaches it).
CONTROL_VAR = "ERAY_FAULT_DIR"

Then = Literal["fail", "real"]

_WRAPPER = r"""#!/bin/bash -p
# Fault-injection wrapper written by tests/support/fault_injection.py -- not the real @@NAME@@.
# Without an armed fault it execs the real command.
__fi_cmd=@@CMD@@
__fi_real=@@REAL@@
__fi_ctl=@@CTL@@
__fi_self=@@BIN@@
__fi_flock=@@FLOCK@@
__fi_sleep=@@SLEEP@@

__fi_run_real() {
    if [ -z "$__fi_real" ] || [ ! -x "$__fi_real" ]; then
        # the path found at install time is gone: search PATH without this directory
        __fi_real=
        local __fi_d __fi_dirs
        IFS=: read -r -a __fi_dirs <<< "$PATH"
        for __fi_d in "${__fi_dirs[@]}"; do
            [ -n "$__fi_d" ] || __fi_d=.
            [ "$__fi_d" -ef "$__fi_self" ] && continue
            if [ -f "$__fi_d/$__fi_cmd" ] && [ -x "$__fi_d/$__fi_cmd" ]; then
                __fi_real=$__fi_d/$__fi_cmd
                break
            fi
        done
        if [ -z "$__fi_real" ]; then
            printf '%s\n' "fault_injection: no real $__fi_cmd on PATH" >&2
            exit 127
        fi
    fi
    exec "$__fi_real" "$@"
}

# a control directory this process cannot write (another user): no faults, no log
if [ ! -w "$__fi_ctl/lock" ] || ! { exec {__fi_lk}>>"$__fi_ctl/lock"; } 2>/dev/null; then
    __fi_run_real "$@"
fi
if ! "$__fi_flock" "$__fi_lk"; then
    exec {__fi_lk}>&-
    __fi_run_real "$@"
fi

__fi_action=pass __fi_rule= __fi_rc=0 __fi_secs=0 __fi_then=fail __fi_out= __fi_err=
IFS=' '
__fi_args="$*"
unset IFS
for __fi_dir in "$__fi_ctl/rules/$__fi_cmd"/*; do
    [ -d "$__fi_dir" ] || continue
    __fi_left=0
    read -r __fi_left < "$__fi_dir/remaining" || [ -n "$__fi_left" ] || continue
    [ "$__fi_left" = 0 ] && continue
    if [ -f "$__fi_dir/match" ]; then
        __fi_match=
        IFS= read -r __fi_match < "$__fi_dir/match"
        case "$__fi_args" in *"$__fi_match"*) ;; *) continue ;; esac
    fi
    read -r __fi_action __fi_rc __fi_secs __fi_then < "$__fi_dir/params"
    __fi_until=
    [ -f "$__fi_dir/until" ] && IFS= read -r __fi_until < "$__fi_dir/until"
    IFS= read -r -d '' __fi_out < "$__fi_dir/stdout"
    IFS= read -r -d '' __fi_err < "$__fi_dir/stderr"
    if [ "$__fi_left" != inf ]; then
        printf '%s\n' "$((__fi_left - 1))" > "$__fi_dir/remaining"
    fi
    __fi_rule=${__fi_dir##*/}
    break
done

__fi_seq=0
read -r __fi_seq < "$__fi_ctl/seq"
__fi_seq=$((__fi_seq + 1))
printf '%s\n' "$__fi_seq" > "$__fi_ctl/seq"
__fi_kind=$__fi_action
[ "$__fi_action" = hang ] && __fi_kind=hang-$__fi_then
__fi_now=${EPOCHREALTIME:-0}
printf '%s\0' "$__fi_now" "$$" "$__fi_cmd" "$__fi_kind" "$__fi_rule" "$@" > "$__fi_ctl/calls/$__fi_seq"
{
    printf '%s %s %s %s %s %s' "$__fi_seq" "$__fi_now" "$$" "$__fi_kind" "${__fi_rule:--}" "$__fi_cmd"
    printf ' %q' "$@"
    printf '\n'
} >> "$__fi_ctl/calls.log"
exec {__fi_lk}>&-

case $__fi_action in
    fail)
        printf '%s' "$__fi_out"
        printf '%s' "$__fi_err" >&2
        exit "$__fi_rc"
        ;;
    hang)
        if [ -n "$__fi_until" ]; then
            # until that path exists, at most the seconds
            (
                __fi_n=$(((${__fi_secs%.*} + 1) * 10))
                while [ ! -e "$__fi_until" ] && [ "$__fi_n" -gt 0 ]; do
                    "$__fi_sleep" 0.1
                    __fi_n=$((__fi_n - 1))
                done
            ) < /dev/null > /dev/null 2>&1 &
        else
            "$__fi_sleep" "$__fi_secs" < /dev/null > /dev/null 2>&1 &
        fi
        __fi_sp=$!
        trap 'kill "$__fi_sp" 2>/dev/null; exit 143' TERM INT HUP
        wait "$__fi_sp"
        trap - TERM INT HUP
        [ "$__fi_then" = real ] && __fi_run_real "$@"
        printf '%s' "$__fi_out"
        printf '%s' "$__fi_err" >&2
        exit "$__fi_rc"
        ;;
esac
__fi_run_real "$@"
"""


@dataclass(frozen=True)
class Call:
    """One logged call of a wrapped command."""

    seq: int  # 1, 2, ... in the order the calls took the lock
    time: float  # epoch seconds when the call was logged
    pid: int  # the wrapper's pid (also the real command's: it is exec'd in place)
    command: str
    args: tuple[str, ...]  # the arguments, without the command name
    action: str  # "pass", "fail", "hang-fail" or "hang-real"
    rule: str | None  # the id of the rule that took the call (None for "pass")

    @property
    def faulted(self) -> bool:
        return self.action != "pass"

    @property
    def argv(self) -> list[str]:
        return [self.command, *self.args]


class FaultyCommands:
    """Wrappers for SLURM commands under ``root`` and the faults they inject."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        commands: Iterable[str] = DEFAULT_COMMANDS,
        path: str | None = None,
    ) -> None:
        self.root = Path(root).absolute()
        self.bin_dir = self.root / "bin"
        self.control_dir = self.root / "ctl"
        self.commands: tuple[str, ...] = tuple(commands)
        for name in self.commands:
            if not name or "/" in name:
                raise ValueError(f"not a command name: {name!r}")
        self._path = path
        self._real: dict[str, str | None] = {}
        self._next_rule = 0
        self._installed = False

    # ---- setting up ----

    def install(self) -> Path:
        """Write the wrappers (again: rules and log are kept) and return the bin directory."""
        flock = shutil.which("flock")
        sleep = shutil.which("sleep")
        if flock is None or sleep is None:
            raise RuntimeError("fault injection needs the flock (util-linux) and sleep commands")
        self.bin_dir.mkdir(parents=True, exist_ok=True)
        for sub in ("rules", "calls"):
            (self.control_dir / sub).mkdir(parents=True, exist_ok=True)
        (self.control_dir / "lock").touch()
        seq = self.control_dir / "seq"
        if not seq.exists():
            seq.write_text("0\n")
        search = os.pathsep.join(d for d in self._search_path() if not _same_dir(d, self.bin_dir))
        existing = [int(p.name) for p in (self.control_dir / "rules").glob("*/*") if p.name.isdigit()]
        self._next_rule = max([self._next_rule, *(n + 1 for n in existing)])
        for name in self.commands:
            real = shutil.which(name, path=search)
            self._real[name] = real
            text = (
                _WRAPPER.replace("@@NAME@@", name)
                .replace("@@CMD@@", shlex.quote(name))
                .replace("@@REAL@@", shlex.quote(real or ""))
                .replace("@@CTL@@", shlex.quote(str(self.control_dir)))
                .replace("@@BIN@@", shlex.quote(str(self.bin_dir)))
                .replace("@@FLOCK@@", shlex.quote(flock))
                .replace("@@SLEEP@@", shlex.quote(sleep))
            )
            wrapper = self.bin_dir / name
            tmp = self.bin_dir / f".{name}.tmp"
            tmp.write_text(text)
            tmp.chmod(0o755)
            os.replace(tmp, wrapper)  # a running process never sees half a wrapper
        self._installed = True
        return self.bin_dir

    def real(self, cmd: str) -> str | None:
        """The real command the wrapper for ``cmd`` execs (None: not found at install time)."""
        self._check(cmd)
        return self._real[cmd]

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default ``os.environ``) with the wrappers first on ``PATH``."""
        self._check()
        env = dict(os.environ if base is None else base)
        rest = [d for d in env.get("PATH", os.defpath).split(os.pathsep) if not _same_dir(d, self.bin_dir)]
        env["PATH"] = os.pathsep.join([str(self.bin_dir), *rest])
        env[CONTROL_VAR] = str(self.control_dir)
        return env

    # ---- arming faults ----

    def fail(
        self,
        cmd: str,
        times: int | None = 1,
        *,
        stderr: str = DEFAULT_STDERR,
        rc: int = 1,
        stdout: str = "",
        match: str | None = None,
    ) -> str:
        """The next ``times`` calls (None: every call) print ``stdout``/``stderr`` and exit
        ``rc`` without running the real command. Returns the rule's id."""
        return self._arm(
            cmd, "fail", times, rc=rc, seconds=0.0, then="fail", stdout=stdout, stderr=stderr, match=match
        )

    def always_fail(
        self,
        cmd: str,
        *,
        stderr: str = DEFAULT_STDERR,
        rc: int = 1,
        stdout: str = "",
        match: str | None = None,
    ) -> str:
        """Every call fails until :meth:`clear`. Returns the rule's id."""
        return self.fail(cmd, None, stderr=stderr, rc=rc, stdout=stdout, match=match)

    def hang(
        self,
        cmd: str,
        times: int | None = 1,
        *,
        seconds: float = 30.0,
        then: Then = "fail",
        stderr: str = DEFAULT_STDERR,
        rc: int = 1,
        stdout: str = "",
        match: str | None = None,
        until: Path | None = None,
    ) -> str:
        """The next ``times`` calls (None: every call) sleep ``seconds`` first, then fail as
        :meth:`fail` does (``then="fail"``) or run the real command (``then="real"``, an
        answer that comes late). With ``until``, the sleep ends early once that path
        exists (a test holds a call until it has done something else: an event, not a
        time). Returns the rule's id."""
        if then not in ("fail", "real"):
            raise ValueError(f"then must be 'fail' or 'real', not {then!r}")
        if not seconds >= 0:
            raise ValueError(f"seconds must be >= 0, not {seconds!r}")
        if until is not None and "\n" in str(until):
            raise ValueError(f"until must be a single-line path, not {str(until)!r}")
        return self._arm(
            cmd,
            "hang",
            times,
            rc=rc,
            seconds=seconds,
            then=then,
            stdout=stdout,
            stderr=stderr,
            match=match,
            until=until,
        )

    def remaining(self, rule: str) -> int | None:
        """Calls a rule has left (None: unlimited). KeyError when cleared or unknown."""
        with self._locked():
            for path in (self.control_dir / "rules").glob(f"*/{rule}"):
                text = (path / "remaining").read_text().strip()
                return None if text == "inf" else int(text)
        raise KeyError(rule)

    def clear(self, cmd: str | None = None) -> None:
        """Drop the rules of ``cmd`` (None: of every command); the call log stays."""
        if cmd is not None:
            self._check(cmd)
        with self._locked():
            rules = self.control_dir / "rules"
            for path in [rules / cmd] if cmd is not None else list(rules.iterdir()):
                if path.is_dir():
                    shutil.rmtree(path)

    # ---- the call log ----

    def mark(self) -> int:
        """The number of calls logged so far, for ``calls(since=...)``."""
        with self._locked():
            return int((self.control_dir / "seq").read_text().strip() or 0)

    def calls(self, cmd: str | None = None, since: int = 0) -> list[Call]:
        """Logged calls of ``cmd`` (None: of all commands) after ``since``, oldest first."""
        with self._locked():
            records = [(int(p.name), p.read_bytes()) for p in (self.control_dir / "calls").iterdir()]
        out = []
        for seq, data in sorted(records):
            if seq <= since:
                continue
            fields = [f.decode(errors="surrogateescape") for f in data.split(b"\0")[:-1]]
            when, pid, command, action, rule, *args = fields
            if cmd is None or command == cmd:
                out.append(
                    Call(
                        seq,
                        float(when.replace(",", ".") or 0),
                        int(pid),
                        command,
                        tuple(args),
                        action,
                        rule or None,
                    )
                )
        return out

    def faulted(self, cmd: str | None = None, since: int = 0) -> list[Call]:
        """The logged calls that a rule took (failed or hung)."""
        return [c for c in self.calls(cmd, since) if c.faulted]

    def wait_calls(
        self, cmd: str | None, count: int, timeout: float, faulted: bool = False, since: int = 0
    ) -> list[Call]:
        """Wait until ``count`` calls (or faulted calls) are logged; AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.faulted(cmd, since) if faulted else self.calls(cmd, since)
            if len(got) >= count:
                return got
            if time.monotonic() > deadline:
                kind = "faulted calls" if faulted else "calls"
                raise AssertionError(
                    f"{len(got)} {kind} of {cmd or 'any command'} in {timeout} s, wanted {count}"
                )
            time.sleep(0.05)

    # ---- internals ----

    def _search_path(self) -> list[str]:
        path = self._path if self._path is not None else os.environ.get("PATH", os.defpath)
        return path.split(os.pathsep)

    def _check(self, cmd: str | None = None) -> None:
        if not self._installed:
            raise RuntimeError("FaultyCommands.install() first")
        if cmd is not None and cmd not in self.commands:
            raise ValueError(f"{cmd!r} is not wrapped (wrapped: {', '.join(self.commands)})")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self._check()
        with open(self.control_dir / "lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _arm(
        self,
        cmd: str,
        action: str,
        times: int | None,
        *,
        rc: int,
        seconds: float,
        then: str,
        stdout: str,
        stderr: str,
        match: str | None,
        until: Path | None = None,
    ) -> str:
        self._check(cmd)
        if times is not None and (isinstance(times, bool) or times < 1):
            raise ValueError(f"times must be >= 1 or None, not {times!r}")
        if not 0 <= rc <= 255:
            raise ValueError(f"rc must be 0..255, not {rc}")
        if match is not None and ("\n" in match or not match):
            raise ValueError("match must be a non-empty single line")
        if "\0" in stdout + stderr:
            raise ValueError("stdout and stderr cannot hold NUL bytes")
        if stderr and not stderr.endswith("\n"):
            stderr += "\n"
        with self._locked():
            rule = f"{self._next_rule:06d}"
            self._next_rule += 1
            rules = self.control_dir / "rules"
            tmp = rules / f".new-{rule}"
            tmp.mkdir()
            (tmp / "remaining").write_text(f"{'inf' if times is None else times}\n")
            (tmp / "params").write_text(f"{action} {rc} {seconds:.3f} {then}\n")
            (tmp / "stdout").write_text(stdout)
            (tmp / "stderr").write_text(stderr)
            if match is not None:
                (tmp / "match").write_text(match + "\n")
            if until is not None:
                (tmp / "until").write_text(f"{Path(until).absolute()}\n")
            (rules / cmd).mkdir(exist_ok=True)
            tmp.rename(rules / cmd / rule)
        return rule


def _same_dir(entry: str, directory: Path) -> bool:
    """Whether a PATH entry names ``directory`` (also through a link or a relative path)."""
    try:
        return os.path.samefile(entry or ".", directory)
    except OSError:
        return False
