"""A node's phase, derived once (``plan.node_phase``) for both providers and ``ray up``."""

from __future__ import annotations

import pytest

from eray_provider.plan.markers import Marker
from eray_provider.plan.node_phase import (
    LIVE,
    TRANSITIONS,
    NodePhase,
    Slurm,
    end_of,
    marker_test,
    node_phase,
)
from eray_provider.plan.node_record import NodeRecord

GONE_ONE = NodeRecord("worker", slurm_node="n2", terminated=True)
REQUEUED = NodeRecord("worker", slurm_job="80", requeued=True)
FIXED = NodeRecord("worker", slurm_node="n2", gen=2, step_name="eray.c.workers.2", launched=100.0)
ELASTIC = NodeRecord("worker", slurm_job="80", created=100.0)


def has(*kinds: Marker):
    return lambda kind: kind in kinds


def test_every_phase_has_its_next_ones_and_an_end_is_never_left_for_life() -> None:
    assert set(TRANSITIONS) == set(NodePhase)
    for end in (NodePhase.EXITED, NodePhase.TERMINATED, NodePhase.GONE):
        assert not TRANSITIONS[end] & LIVE, end
    for phase, after in TRANSITIONS.items():
        assert phase not in after, phase  # a phase that follows itself is no transition


@pytest.mark.parametrize(
    ("rec", "markers", "slurm", "grace", "phase"),
    [
        (NodeRecord("worker", slurm_node="n2"), (), Slurm.ENDED, False, NodePhase.RECORDED),
        (FIXED, (), Slurm.UNKNOWN, False, NodePhase.LAUNCHED),  # no answer: no verdict
        (FIXED, (), Slurm.UNLISTED, True, NodePhase.LAUNCHED),  # just started
        (FIXED, (), Slurm.UNLISTED, False, NodePhase.GONE),
        (FIXED, (Marker.TMPDIR, Marker.PID), Slurm.RUNS, False, NodePhase.SETTING_UP),
        (FIXED, (Marker.TMPDIR, Marker.IP), Slurm.RUNS, False, NodePhase.RUNNING),
        (FIXED, (Marker.IP, Marker.DRAIN), Slurm.RUNS, False, NodePhase.DRAINING),
        (FIXED, (Marker.IP, Marker.EXIT), Slurm.RUNS, False, NodePhase.EXITED),
        (FIXED, (Marker.IP,), Slurm.ENDED, False, NodePhase.GONE),
        (GONE_ONE, (Marker.IP,), Slurm.RUNS, False, NodePhase.TERMINATED),
        (ELASTIC, (), Slurm.QUEUED, False, NodePhase.PENDING),
        (ELASTIC, (), Slurm.NOT_THERE, True, NodePhase.GONE),  # the job runs fewer nodes
        (ELASTIC, (), Slurm.UNLISTED, True, NodePhase.LAUNCHED),  # submitted, not listed yet
        (REQUEUED, (Marker.IP,), Slurm.QUEUED, False, NodePhase.REQUEUED),
        # preempted: its run's exit marker stays until it runs again, and it will
        (REQUEUED, (Marker.EXIT,), Slurm.QUEUED, False, NodePhase.REQUEUED),
        (REQUEUED, (Marker.EXIT,), Slurm.ENDED, False, NodePhase.EXITED),  # cancelled meanwhile
        (REQUEUED, (), Slurm.ENDED, False, NodePhase.GONE),
        (REQUEUED, (Marker.RERUN,), Slurm.RUNS, False, NodePhase.LAUNCHED),  # back, not set up yet
        (ELASTIC, (Marker.IP, Marker.STANDBY), Slurm.RUNS, False, NodePhase.STANDING_BY),
        (ELASTIC, (Marker.IP, Marker.STANDBY, Marker.HANDOVER), Slurm.RUNS, False, NodePhase.RUNNING),
        (None, (), Slurm.RUNS, False, NodePhase.LAUNCHED),  # adopted from squeue, no record
        (None, (), Slurm.ENDED, False, NodePhase.GONE),
    ],
)
def test_a_nodes_phase_from_its_record_markers_and_slurms_word(rec, markers, slurm, grace, phase) -> None:
    assert node_phase(rec, has(*markers), slurm, grace) is phase
    # the autoscaler's question alone, answered from the same derivation
    assert (end_of(rec, has(*markers), slurm, grace) is None) == (phase in LIVE)


def test_markers_are_read_from_the_state_s_file_names() -> None:
    names = frozenset({"n2.3.ip", "n2.3.tmpdir", "n2.30.exit"})
    assert node_phase(FIXED, marker_test("n2.3", names), Slurm.RUNS) is NodePhase.RUNNING
    assert node_phase(FIXED, marker_test("n2.30", names), Slurm.RUNS) is NodePhase.EXITED
    assert node_phase(FIXED, marker_test("n2.4", names), Slurm.RUNS) is NodePhase.LAUNCHED
