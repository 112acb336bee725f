"""Which process a recorded PID means: the PID and its start time, checked before a signal.

A node process records its PID so that one node of a multi-node step can be stopped
alone. PIDs are reused: by the time the provider acts, the number may belong to another
process of the same user (another job's, on a shared node). A PID together with its start
time (field 22 of ``/proc/PID/stat``, in clock ticks since boot) names one process for the
life of the host, so the record holds both and the signal is sent only when both still
match, by a check that runs on the node itself, in the same shell that sends it.
"""

from __future__ import annotations

import shlex


def start_time(pid: int) -> str | None:
    """The start time of ``pid`` as ``/proc`` gives it, None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: count after the last ')'
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[19]


def identity(pid: int) -> str:
    """``"<pid> <start time>"`` of a live process (this one, typically), for the record."""
    start = start_time(pid)
    if start is None:
        raise ProcessLookupError(f"no process {pid}")
    return f"{pid} {start}"


def parse_identity(text: str | None) -> tuple[int, str] | None:
    """(pid, start time) of a record written by ``identity``; None for anything else."""
    parts = (text or "").split()
    if len(parts) != 2 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    return int(parts[0]), parts[1]


def signal_command(record: str, signal: str = "TERM") -> list[str] | None:
    """A command that sends ``signal`` to the recorded process only while that PID still
    has the recorded start time; exits 3 (sending nothing) otherwise. None for a record
    that is not a valid identity."""
    parsed = parse_identity(record)
    if parsed is None or not signal.isalnum():
        return None
    pid, start = parsed
    script = (
        f"s=$(cat /proc/{pid}/stat 2>/dev/null) || exit 3; s=${{s##*) }}; set -- $s; "
        f'[ "${{20}}" = {shlex.quote(start)} ] || exit 3; exec kill -{signal} {pid}'
    )
    return ["bash", "-c", script]
