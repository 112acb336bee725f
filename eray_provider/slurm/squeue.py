"""What ``squeue`` says of the user's jobs: the listing's format and its parser."""

from __future__ import annotations

from dataclasses import dataclass

from .forms import HOPELESS_REASONS, LIVE_STATES, UNKNOWN


@dataclass(frozen=True)
class JobInfo:
    """One job as squeue lists it (``SQUEUE_FORMAT``); "" where squeue printed an unknown."""

    job_id: str
    state: str
    name: str
    nodelist: str
    reason: str
    num_nodes: int
    #: squeue's ``%L``: ``[days-]hours:minutes:seconds``, ``UNLIMITED``, or "" when unknown
    time_left: str = ""
    #: squeue's ``%e``: the (expected) end, ISO local time, or "" when unknown
    end_time: str = ""
    #: squeue's ``%l``: the time limit, as ``time_left``
    time_limit: str = ""

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def hopeless(self) -> bool:
        return self.state == "PENDING" and self.reason.startswith(HOPELESS_REASONS)


#: ``squeue -o`` format matching ``parse_squeue`` (the name last: it may hold '|'). ``%A``,
#: not ``%i``: an element of a job array is listed by its own job id (``SLURM_JOB_ID``),
#: not as ``<array job>_<index>``.
SQUEUE_FORMAT = "%A|%T|%D|%N|%r|%L|%e|%l|%j"


def parse_squeue(text: str) -> dict[str, JobInfo]:
    """Lines of ``squeue -h -o SQUEUE_FORMAT`` -> job id -> JobInfo."""
    jobs: dict[str, JobInfo] = {}
    for line in text.splitlines():
        parts = line.strip().split("|", 8)
        if len(parts) != 9 or not parts[0].isdigit():
            continue
        job_id, state, count, nodelist, reason, left, end, limit, name = parts
        jobs[job_id] = JobInfo(
            job_id=job_id,
            state=state.split()[0] if state else "",
            name=name,
            nodelist="" if nodelist in UNKNOWN else nodelist,
            reason=reason,
            num_nodes=int(count) if count.isdigit() else 0,
            time_left="" if left in UNKNOWN else left,
            end_time="" if end in UNKNOWN else end,
            time_limit="" if limit in UNKNOWN else limit,
        )
    return jobs
