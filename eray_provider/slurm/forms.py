"""How SLURM's commands print what they do not know, and the states and reasons of a job:
one table, for every parser of SLURM's output (``walltime``, ``scontrol``, ``squeue``,
``client``).
"""

from __future__ import annotations

#: How SLURM prints a value it does not know or has not set (a time, a node list, a limit).
UNKNOWN = ("", "Unknown", "NONE", "None", "N/A", "(null)", "INVALID")
#: How SLURM prints a time limit that never ends.
UNLIMITED = ("UNLIMITED", "INFINITE", "NOT_SET")
#: Job states in which the job holds (or will hold) its nodes; any other state, or a job
#: squeue no longer lists, means its Ray nodes are gone.
LIVE_STATES = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "RESIZING", "SUSPENDED", "REQUEUED", "REQUEUE_FED", "SIGNALING"}
)
#: States after which a job never runs again: what it left behind may be removed. Not
#: among them: COMPLETING (its processes may still run), STOPPED, and the held or
#: requeued states, after which the same job id runs again.
TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)
#: Pending reasons after which the job will not start without the user changing something.
HOPELESS_REASONS = (
    "PartitionNodeLimit",
    "PartitionTimeLimit",
    "PartitionDown",
    "PartitionInactive",
    "BadConstraints",
    "InvalidAccount",
    "InvalidQOS",
    "QOSMaxWallDurationPerJobLimit",
    "QOSMaxNodePerJobLimit",
    "AssocMaxNodesPerJobLimit",
    "AssocMaxWallDurationPerJobLimit",
    "JobHeldAdmin",
    "JobHeldUser",
    "DependencyNeverSatisfied",
)
#: Job states of a job that SLURM is putting back in the queue.
REQUEUE_STATES = ("REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED")
#: SLURM's own answers about a job or step: a verdict, returned at once and never retried.
#: Every other failure (a timeout, a refused connection, an overloaded controller) says
#: nothing about the job.
ANSWERS = ("Invalid job id", "already completing or completed")
