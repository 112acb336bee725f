"""SLURM's two listings a provider's round reads: the head job's steps and the cluster's jobs.

Each is one squeue call, kept for a few seconds and shared by every node of a round (no
subprocess per node). A listing hands out the same object until squeue is asked again, so
that the round built from it (``SlurmNodeProvider._fresh_round``) is reused by identity. A failed squeue keeps
the last answer: it says nothing about the steps or jobs (only SLURM's own answer does).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from ..runtime.slurm_jobs import list_jobs
from ..slurm.client import SlurmCommandError
from ..slurm.squeue import JobInfo
from ..slurm.srun import list_steps

logger = logging.getLogger(__name__)

#: How long one squeue listing answers for every node (the autoscaler asks every ~5 s).
LISTING_SECONDS = 5.0
#: The step list before squeue has answered once: launched nodes count as alive, because a
#: failed squeue is not SLURM saying they ended (a second head would follow).
UNKNOWN: Mapping[str, str] = {}
#: the job's steps by name (step name -> step id)
StepNames = Mapping[str, str]


class StepListing:
    """The running steps of the head's job, step id -> step name: None when SLURM says
    the job has ended, ``UNKNOWN`` (that very object) until squeue has answered once."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self._stamp = 0.0
        self._steps: Mapping[str, str] | None = UNKNOWN
        self._names: StepNames | None = UNKNOWN

    def by_id(self) -> Mapping[str, str] | None:
        if time.monotonic() - self._stamp > LISTING_SECONDS:
            try:
                steps = list_steps(self.job_id)
            except SlurmCommandError as e:
                logger.warning("squeue failed, keeping the last step list: %s", e)
            else:
                self._steps = steps
                self._names = None if steps is None else {name: sid for sid, name in steps.items()}
            self._stamp = time.monotonic()
        return self._steps

    def by_name(self) -> StepNames | None:
        """Step name -> step id, one dict per listing (kept for its identity)."""
        self.by_id()
        return self._names

    def answered(self) -> Mapping[str, str] | None:
        """As ``by_id``, asking squeue at once when it has never answered (a decision that
        needs SLURM's word); still ``UNKNOWN`` when it does not answer now either."""
        if self._steps is UNKNOWN:
            self.expire()
        return self.by_id()

    def expire(self) -> None:
        """Ask squeue at the next call."""
        self._stamp = 0.0


class JobListing:
    """The user's jobs of one cluster (the head's own job and its worker jobs), by job id.
    The first listing must come from squeue: with none yet, its error is raised rather
    than an empty listing that would make every worker look ended."""

    def __init__(self, cluster_name: str) -> None:
        self.cluster_name = cluster_name
        self._stamp = 0.0
        self._listed = False
        self._jobs: dict[str, JobInfo] = {}

    def get(self) -> dict[str, JobInfo]:
        if time.monotonic() - self._stamp > LISTING_SECONDS:
            try:
                self._jobs = list_jobs(self.cluster_name)
                self._listed = True
            except SlurmCommandError as e:
                if not self._listed:
                    raise
                logger.warning("squeue failed, keeping the last job list: %s", e)
            self._stamp = time.monotonic()
        return self._jobs

    def expire(self) -> None:
        """Ask squeue at the next call (the last listing stays the fallback)."""
        self._stamp = 0.0
