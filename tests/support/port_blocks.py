"""Port blocks for tests that bind real ports, one per test process on this host.

`make test` runs several unit suites side by side (one per Python and Ray, scripts/compat),
so a test that binds a fixed block collides with its twin in the next suite and reads it
as a co-tenant's port. Each process takes a block of its own under an exclusive file
lock held until it exits (the kernel drops the lock with the process, so a killed suite
leaves nothing to clean).
"""

from __future__ import annotations

import fcntl
import os
from typing import IO

from eray_provider.plan.ports import BLOCK, PortPlan, plan_for_block

#: blocks 24576-32511: above Ray client's proxier range (23000-24000) and below the
#: kernel's ephemeral range (32768-), so no outgoing connection's TIME_WAIT lands in one;
#: a test may bind up to 300 ports past a block's start and stay below 32768
FIRST = 24576
COUNT = 30
_held: list[IO[str]] = []


def reserved_plan(job_id: str) -> PortPlan:
    """The plan of ``job_id`` on a block no other test process on this host holds.

    Blocks are tried from one chosen by the process id, so side-by-side suites rarely
    contend for a lock; ``RuntimeError`` when all ``COUNT`` are held."""
    for k in range(COUNT):
        start = FIRST + ((os.getpid() + k) % COUNT) * BLOCK
        lock = open(f"/run/lock/eray-test-ports-{start}.lock", "a")  # noqa: SIM115 - held until exit
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        _held.append(lock)
        return plan_for_block(job_id, start)
    raise RuntimeError(f"all {COUNT} test port blocks from {FIRST} are held by other test processes")
