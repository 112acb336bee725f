"""Step and job names: one grammar, exact matches, no cluster's name read as another's."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eray_provider.plan.cluster_config import fill_config
from eray_provider.plan.names import (
    ClusterNameError,
    check_cluster_name,
    head_job_name,
    is_cluster_job,
    is_cluster_step,
    parse_worker_job_name,
    safe_part,
    step_name,
    worker_job_name,
)
from eray_provider.runtime.cluster_state import ClusterState
from eray_provider.runtime.ray_cluster import _leftover_job, step_cluster_name

NAME = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_@-]{0,20}", fullmatch=True)


@pytest.mark.parametrize("bad", ["pfx.b", "run.gpu", "", ".x", "a/b", "a b", "-x", "x;y", "é", "a" * 65, 3])
def test_names_that_break_the_grammar_are_refused_naming_the_field(bad) -> None:
    with pytest.raises(ClusterNameError) as e:
        check_cluster_name(bad)
    assert "cluster_name" in str(e.value) and repr(bad) in str(e.value)
    with pytest.raises(ClusterNameError):
        ClusterState(bad, "1")  # type: ignore[arg-type]


def test_fill_config_refuses_a_dotted_cluster_name() -> None:
    with pytest.raises(ClusterNameError, match=r"cluster_name: 'pfx\.b'"):
        fill_config({"cluster_name": "pfx.b", "provider": {}}, None)  # type: ignore[arg-type]


def test_steps_of_a_cluster_whose_name_extends_another_are_not_its_steps() -> None:
    assert is_cluster_step(step_name("pfx", "head.1"), "pfx")
    for other in ("pfx-b", "pfxb", "pf", "pfx@x"):
        assert not is_cluster_step(step_name(other, "head.1"), "pfx")
        assert not is_cluster_step(step_name("pfx", "workers.2"), other)
    # names a user might give their own steps or jobs
    for foreign in ("eray.pfx", "eray.pfx.", "eray..head", "erayx.pfx.head", "pfx.head.1", "eray.pfx"):
        assert not is_cluster_step(foreign, "pfx"), foreign


def test_elastic_job_names_parse_exactly() -> None:
    name = worker_job_name("sweep", "81234", "gpu.big")
    assert parse_worker_job_name(name, "sweep") == ("81234", "gpu.big")
    # the example: cluster `sweep.2` is refused, so `eray.sweep.2.81234.gpu` is no
    # worker job of `sweep` (head job `2`, type `81234.gpu`) by accident of a dotted name
    with pytest.raises(ClusterNameError):
        worker_job_name("sweep.2", "81234", "gpu")
    assert parse_worker_job_name(worker_job_name("sweep-2", "81234", "gpu"), "sweep") is None
    assert parse_worker_job_name("eray.sweep.head", "sweep") is None
    assert parse_worker_job_name("train", "sweep") is None
    assert is_cluster_job(head_job_name("sweep"), "sweep")
    assert not is_cluster_job(head_job_name("sweep-2"), "sweep")
    assert not is_cluster_job("eray.sweep", "sweep")


@given(NAME, NAME, st.from_regex(r"[a-z0-9.]{1,12}", fullmatch=True))
def test_no_two_cluster_names_share_a_step_or_job(a: str, b: str, what: str) -> None:
    assert is_cluster_step(step_name(a, what), b) == (a == b)
    assert is_cluster_job(worker_job_name(a, "7", what), b) == (a == b)
    assert is_cluster_job(head_job_name(a), b) == (a == b)


def test_step_cluster_names_are_valid_and_leftovers_match_one_slurm_cluster(tmp_path) -> None:
    env = {"SLURM_STEP_ID": "3", "SLURM_SRUN_COMM_PORT": "40001"}
    name = step_cluster_name(env, "my.cluster")
    assert check_cluster_name(name) == name == "step3-40001@my_cluster"
    assert safe_part("a.b c") == "a_b_c"
    assert _leftover_job(tmp_path / f"{name}-12", "my.cluster") == "12"
    # another SLURM cluster whose name extends this one's
    other = step_cluster_name(env, "my.cluster-prod")
    assert _leftover_job(tmp_path / f"{other}-12", "my.cluster") is None
    assert _leftover_job(tmp_path / "step3-40001@my_cluster-x-12", "my.cluster") is None
    # a step without SLURM_CLUSTER_NAME is named with the fallback; the SLURM cluster it
    # recorded decides whose leftover it is
    fallback = tmp_path / "step3-40001@slurm-12"
    fallback.mkdir()
    assert _leftover_job(fallback, "my.cluster") is None  # nothing recorded: not ours to remove
    (fallback / "slurm_cluster").write_text("other")
    assert _leftover_job(fallback, "my.cluster") is None
    (fallback / "slurm_cluster").write_text("my.cluster")
    assert _leftover_job(fallback, "my.cluster") == "12"
