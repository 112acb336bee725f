"""What Slurm 22.05 and 25.11 print for the forms eray-provider parses, read alike.

``tests/data/slurm-<version>/`` was captured from the test bed running each version
(``tests/data/capture.sh``): the same two jobs (three nodes with a typed GPU each; a
heterogeneous job whose components differ), their ``scontrol show job -d`` and ``-o``
records, salloc's and a step's environment, ``squeue`` in the elastic provider's format,
and a partition. Where the versions differ (25.11's ``SLUID`` line, ``gres/gpu`` instead of
``gres:gpu`` in ``TresPerNode``, an ``-o`` record that spans lines when the job's command
does, ``SLURM_JOB_END_TIME`` and ``SLURM_TRES_PER_TASK`` in a step, no
``SLURM_NODE_ALIASES``), the answers must not."""

from __future__ import annotations

import pytest
from testbed_support import DATA

from eray_provider.slurm.env import allocation_from_env
from eray_provider.slurm.scontrol import ENDS, parse_fields, parse_job, requeue_verdict
from eray_provider.slurm.squeue import parse_squeue
from eray_provider.slurm.step import step_layout
from eray_provider.slurm.walltime import parse_timestamp

VERSIONS = ["22.05", "25.11"]


def _text(version: str, name: str) -> str:
    return (DATA / f"slurm-{version}" / name).read_text()


def _env(version: str, name: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in _text(version, name).splitlines() if "=" in line)


def _shares(alloc) -> list[tuple]:
    return [(n.name, n.cpus, n.gpus, n.gpu_type, n.memory_mb) for n in alloc.nodes]


TYPED = [(f"node{k}", 3, 1, "testgpu", 1500) for k in (1, 2, 3)]
HET = [("node1", 2, 0, None, 1000), ("node2", 2, 0, None, 1000), ("node3", 1, 2, "testgpu", 700)]


@pytest.mark.parametrize("version", VERSIONS)
def test_scontrol_records_give_the_same_allocation(version: str) -> None:
    typed = parse_job(_text(version, "typed.scontrol"))
    assert typed.state == "RUNNING" and _shares(typed) == TYPED
    assert typed.end_time is not None  # --time=30:00
    het = parse_job(_text(version, "het.scontrol"))
    assert _shares(het) == HET and het.end_time is None  # no time limit: EndTime=Unknown


@pytest.mark.parametrize("version", VERSIONS)
def test_salloc_environments_give_the_same_allocation(version: str) -> None:
    assert _shares(allocation_from_env(_env(version, "typed.salloc.env"))) == TYPED
    # the environment names no GPU type for an untyped request; scontrol does
    het = [(n, c, g, None, m) for n, c, g, _, m in HET]
    assert _shares(allocation_from_env(_env(version, "het.salloc.env"))) == het


@pytest.mark.parametrize("version", VERSIONS)
def test_a_step_sees_its_layout_and_the_jobs_end_where_slurm_says_it(version: str) -> None:
    env = _env(version, "typed.step.env")
    layout = step_layout(env)
    assert (layout.nodes, layout.tasks_per_node, layout.process_id) == (("node1",), (1,), 0)
    assert step_layout(_env(version, "het.step.env")).nodes == ("node1",)
    from_env = allocation_from_env(env).end_time
    if "SLURM_JOB_END_TIME" in env:  # 23.02 and later: the walltime without asking scontrol
        assert version != "22.05"
        assert from_env == parse_job(_text(version, "typed.scontrol")).end_time
    else:
        assert version == "22.05" and from_env is None


@pytest.mark.parametrize("version", VERSIONS)
def test_one_line_records_read_alike_even_when_the_command_spans_lines(version: str) -> None:
    for name in ("typed", "het"):
        fields = parse_fields(_text(version, f"{name}.scontrol-o"))
        assert fields["JobState"] == "RUNNING" and fields["Partition"] == "debug"
        assert requeue_verdict(fields, "") == ENDS
    partition = parse_fields(_text(version, "partition.scontrol-o"))
    assert (partition["MaxTime"], partition["PreemptMode"]) == ("UNLIMITED", "CANCEL")


@pytest.mark.parametrize("version", VERSIONS)
def test_squeue_lines_read_alike(version: str) -> None:
    jobs = {info.name: info for info in parse_squeue(_text(version, "squeue.txt")).values()}
    running, held = jobs["eray.forms.head"], jobs["eray.forms.1.cpu"]
    assert (running.state, running.nodelist, running.time_limit) == ("RUNNING", "node1", "10:00")
    assert parse_timestamp(running.end_time) is not None
    assert (held.state, held.reason, held.nodelist, held.end_time) == ("PENDING", "JobHeldUser", "", "")
