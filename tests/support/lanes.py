"""The lanes of ``make test``'s live tests (``scripts/live-lanes``): pytest sessions side by
side, each on a test bed of its own (``slurm-testbed up --net``), so that one lane's waits
for SLURM's time limits and grace times overlap the other's clusters. The live suite spends
most of its time waiting (about 0.6 of the machine's 2 cores busy, measured 2026-12-07).

A lane holds whole modules (a module's fixtures and clusters stay in one session). The
split balances the modules' times in CI; ``tests/unit/test_layout.py`` checks that every
live module is in exactly one lane."""

from __future__ import annotations

import os

#: Lane k (1-based) runs the modules of ``LANES[k - 1]``. The first holds the long waits
#: (replacement, walltime, interrupts), the second the many short clusters. The first lane
#: to end takes ``make test``'s smoke tests on Slurm 22.05 (about 4 minutes), so the first is
#: the shorter by about that much (2026-12-07: about 760 and 1040 s of CI's serial times).
LANES: tuple[tuple[str, ...], ...] = (
    (
        "test_replace_live",
        "test_walltime_live",
        "test_interrupts_live",
        "test_testbed_live",
    ),
    (
        "test_provider_live",
        "test_status_live",
        "test_containers_live",
        "test_elastic_live",
        "test_controller_faults_live",
        "test_security_live",
        "test_isolation_live",
        "test_jax_live",
        "test_batch_live",
        "test_ray_cluster_live",
        "test_dashboard_live",
        "test_eformer_live",
        "test_distributed_live",
    ),
)

#: The lane this pytest session runs (``ERAY_TEST_LANE``, 1-based), or None for every test.
LANE_VARIABLE = "ERAY_TEST_LANE"


def current_lane() -> int | None:
    """This session's lane from ``ERAY_TEST_LANE``, checked; None when unset."""
    value = os.environ.get(LANE_VARIABLE, "")
    if not value:
        return None
    if not value.isdigit() or not 1 <= int(value) <= len(LANES):
        raise ValueError(f"{LANE_VARIABLE}={value!r}: a lane is 1..{len(LANES)}")
    return int(value)


def in_lane(module: str, lane: int) -> bool:
    """Whether the test module named ``module`` (``test_x_live``) runs in ``lane``."""
    return module in LANES[lane - 1]
