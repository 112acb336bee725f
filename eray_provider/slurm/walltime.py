"""When the cluster's SLURM jobs end, as SLURM says it: pure.

A SLURM job ends at its time limit or, when preempted, at the end of its grace time: in
both cases SLURM moves the job's ``EndTime`` to when it will end (preemption sets it to
now plus the partition's ``GraceTime``; ``scontrol update TimeLimit=`` moves it too), so
``EndTime`` is the one fact to follow. squeue's ``%L`` (time left) is not: it keeps
counting down to the old time limit after a preemption. What the cluster does about an
end (drains, replacements) is ``plan.drain``'s.

SLURM can also warn a job's steps with a signal before it ends (``--signal=SIG@SECONDS``,
and at preemption with ``SlurmctldParameters=preempt_send_user_signal``). It signals every
process of the step, Ray's too, so the signal must be one that kills nothing:
``END_SIGNAL`` (SIGURG), which every process ignores unless it asks for it, and which
``node_run`` takes as "this job is ending: drain this node now".
"""

from __future__ import annotations

import time

from ..errors import ConfigError
from .forms import UNKNOWN, UNLIMITED

#: The signal SLURM is asked to send before a job's end (``--signal=URG@<lead>``).
END_SIGNAL = "URG"


class WalltimeError(ConfigError):
    """A SLURM time that cannot be read."""


def parse_timestamp(text: str) -> float | None:
    """``2026-12-04T13:11:43`` (SLURM's local time, as squeue ``%e`` and scontrol
    ``EndTime=`` print it) -> seconds since the epoch; None for an unknown or unlimited end."""
    text = text.strip()
    if text in UNKNOWN:
        return None
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError as e:
        raise WalltimeError(f"cannot read the SLURM time {text!r} (expected YYYY-MM-DDTHH:MM:SS)") from e


def parse_duration(text: str) -> float | None:
    """SLURM's durations (``%l``, ``TimeLimit=``): ``MM``, ``MM:SS``, ``HH:MM:SS``,
    ``D-HH[:MM[:SS]]`` -> seconds; None for ``UNLIMITED`` or unknown."""
    text = text.strip()
    if text in UNKNOWN or text in UNLIMITED:
        return None
    days, sep, rest = text.partition("-")
    if not sep:
        days, rest = "0", text
    parts = rest.split(":")
    if not days.isdigit() or not all(p.isdigit() for p in parts) or len(parts) > 3:
        raise WalltimeError(f"cannot read the SLURM duration {text!r}")
    nums = [int(p) for p in parts]
    if sep:  # D-HH, D-HH:MM, D-HH:MM:SS
        h, m, sec = [*nums, 0, 0][:3]
    elif len(nums) == 3:
        h, m, sec = nums
    elif len(nums) == 2:
        h, m, sec = 0, nums[0], nums[1]
    else:
        h, m, sec = 0, nums[0], 0
    return float(((int(days) * 24 + h) * 60 + m) * 60 + sec)


def format_timestamp(epoch: float) -> str:
    """The inverse of ``parse_timestamp``: local time, SLURM's format."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


def format_duration(seconds: float) -> str:
    """``3725`` -> ``1:02:05``; with days ``1-00:00:00`` (SLURM's way)."""
    total = max(0, round(seconds))
    days, rest = divmod(total, 86400)
    minutes = f"{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{rest // 3600:02d}:{minutes}" if days else f"{rest // 3600}:{minutes}"


def describe_end(end: float | None, time_limit_s: float | None, now: float) -> str:
    """What ``inspect`` says of a job's end: ``2026-12-04T13:20:06 (in 0:09:52; time
    limit 0:10:00)``, or that it has none known."""
    limit = "unlimited" if time_limit_s is None else format_duration(time_limit_s)
    if end is None:
        return f"unknown (time limit {limit})"
    return f"{format_timestamp(end)} (in {format_duration(end - now)}; time limit {limit})"


#: How much earlier than first seen a job's end must move to count as cut short.
CUT_SHORT_SECONDS = 60.0


def cut_short(first_end: float | None, end: float) -> bool:
    """Whether SLURM moved a job's end earlier than it was first seen (preemption sets it to
    now plus ``GraceTime``; an update of its end time): such a job is not replaced ahead of
    its end, since its node is drained at SLURM's signal and Ray's autoscaler replaces a
    draining node itself (one replacement more would be a node too many)."""
    return first_end is not None and end < first_end - CUT_SHORT_SECONDS
