"""A failed SLURM command is not a verdict: retries, SLURM's answers, the provider's view
before squeue has answered, and per-node data that stays small at 10,000 nodes.

The SLURM commands here are small scripts first on PATH (this is the logic around the
commands; the live fault-injection tests drive the real test bed).
"""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from ray.autoscaler.tags import TAG_RAY_NODE_KIND

from eray_provider.errors import ConfigError
from eray_provider.plan.cluster_config import fill_config
from eray_provider.plan.ports import choose_plan
from eray_provider.plan.provider_config import Filled, ProviderConfig, update_filled
from eray_provider.runtime.cluster_state import ClusterState, ClusterStoppingError
from eray_provider.runtime.launch import TeardownError, encode_node_ids, teardown
from eray_provider.runtime.node_run import NodeRunError, node_id_from
from eray_provider.slurm.allocation import Allocation, AllocationError, NodeShare
from eray_provider.slurm.client import SlurmAnswerError, SlurmCommandError, run_slurm
from eray_provider.slurm.srun import list_steps


def fake(bindir: Path, name: str, body: str) -> Path:
    bindir.mkdir(exist_ok=True)
    path = bindir / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def flaky(bindir: Path, name: str, failures: int, stdout: str = "", stderr: str = "") -> Path:
    """``name`` fails ``failures`` times with a controller timeout, then prints ``stdout``;
    every call is counted in ``<bindir>/<name>.calls``."""
    count = bindir / f"{name}.calls"
    body = (
        f"echo x >> {count}\n"
        f"n=$(wc -l < {count})\n"
        f'if [ "$n" -le {failures} ]; then echo "slurm_load_jobs error: Socket timed out on send/recv '
        'operation" >&2; exit 1; fi\n'
        f"printf '%s\\n' {shlex.quote(stdout)}\n"
    )
    if stderr:
        body += f"echo {stderr!r} >&2; exit 1\n"
    return fake(bindir, name, body)


def calls(bindir: Path, name: str) -> int:
    path = bindir / f"{name}.calls"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_transient_failure_is_retried_and_the_answer_returned(bindir: Path) -> None:
    flaky(bindir, "squeue", failures=2, stdout="77.0 eray.c.head.1")
    assert list_steps("77") == {"77.0": "eray.c.head.1"}
    assert calls(bindir, "squeue") == 3


def test_a_controller_that_stays_down_is_an_error_with_slurms_words(bindir: Path) -> None:
    flaky(bindir, "squeue", failures=99)
    with pytest.raises(SlurmCommandError) as e:
        list_steps("77")
    assert "Socket timed out" in str(e.value) and "tried 3 times" in str(e.value)
    assert not isinstance(e.value, SlurmAnswerError)
    assert calls(bindir, "squeue") == 3


def test_invalid_job_id_is_slurms_answer_taken_at_once(bindir: Path) -> None:
    fake(
        bindir,
        "squeue",
        'echo x >> "$0.calls"\necho "slurm_load_jobs error: Invalid job id specified" >&2\nexit 1\n',
    )
    assert list_steps("77") is None
    assert calls(bindir, "squeue") == 1


def test_a_hung_command_times_out_per_try(bindir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake(bindir, "scontrol", 'echo x >> "$0.calls"\nexec sleep 30\n')
    monkeypatch.setenv("ERAY_SLURM_TIMEOUT", "0.5")
    monkeypatch.setenv("ERAY_SLURM_ATTEMPTS", "2")
    with pytest.raises(SlurmCommandError, match="did not answer within"):
        run_slurm(["scontrol", "show", "config"])
    assert calls(bindir, "scontrol") == 2


@pytest.mark.parametrize("name,value", [("ERAY_SLURM_TIMEOUT", "soon"), ("ERAY_SLURM_ATTEMPTS", "0")])
def test_bad_retry_settings_name_the_variable(bindir: Path, monkeypatch, name: str, value: str) -> None:
    fake(bindir, "squeue", "true\n")
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=f"{name}='{value}'") as raised:
        run_slurm(["squeue"])
    # a setting, not a failed command: code that rides out SLURM failures must not hide it
    assert not isinstance(raised.value, SlurmCommandError)


def test_node_ids_of_10000_nodes_fit_in_a_few_bytes() -> None:
    names = [f"gpu{i:05d}" for i in range(10_000)]
    ids = {n: f"{n}.{i + 7}" for i, n in enumerate(names)}
    value = encode_node_ids(ids)
    assert len(value) < 64
    assert all(node_id_from(value, n) == ids[n] for n in names[::997] + names[-1:])
    assert node_id_from(value, "other1") is None
    mixed = {"b3": "b3.5", "a1": "a1.6", "a10": "a10.7"}
    assert all(node_id_from(encode_node_ids(mixed), n) == i for n, i in mixed.items())
    with pytest.raises(ValueError, match="follow on"):
        encode_node_ids({"a1": "a1.5", "a2": "a2.9"})
    with pytest.raises(NodeRunError, match=r"ERAY_NODE_IDS='a1=a1\.5'"):
        node_id_from("a1=a1.5", "a1")


# ---------------------------------------------------------------------- the provider
def _provider(tmp_path: Path, nodes: int = 3):
    from eray_provider.autoscaler.provider import SlurmNodeProvider

    alloc = Allocation("77", tuple(NodeShare(f"n{i}", 2, 0, None, 4000) for i in range(1, nodes + 1)))
    base = {
        "cluster_name": "c",
        "max_workers": -1,
        "provider": {"type": "external", "module": "x", "state_dir": str(tmp_path / "state")},
    }
    config = fill_config(base, alloc, python="python3")
    state = ClusterState("c", "77", tmp_path / "state")
    state.create()
    state.save_ports(choose_plan("77", []))
    state.save_cluster_config({"provider": config["provider"]})
    old = time.time() - 600  # long past the start grace: only squeue can vouch for them
    doc = state.read()
    for i, (name, role) in enumerate([("n1", "head"), ("n2", "worker")], start=1):
        doc["nodes"][f"{name}.{i}"] = {
            "slurm_node": name,
            "role": role,
            "gen": i,
            "tags": {TAG_RAY_NODE_KIND: role},
            "launched": old,
            "step_name": f"eray.c.{role}.{i}",
        }
    state.write(doc)
    return SlurmNodeProvider(config["provider"], "c"), state


def test_before_squeue_answers_launched_nodes_are_not_reported_terminated(
    bindir: Path, tmp_path: Path
) -> None:
    flaky(bindir, "squeue", failures=99)
    provider, _ = _provider(tmp_path)
    # `ray up` asks for a live head; an empty answer here would start a second head
    assert provider.non_terminated_nodes({TAG_RAY_NODE_KIND: "head"}) == ["n1.1"]
    assert not provider.is_terminated("n2.2") and provider.is_running("n2.2")
    # and a node cannot be marked terminated while its step may run
    with pytest.raises(SlurmCommandError, match="cannot terminate"):
        provider.terminate_nodes(["n2.2"])
    assert not provider.state.records()["n2.2"].terminated


def test_a_node_answers_its_tag_filters_and_for_a_while_the_tags_it_was_requested_with(
    bindir: Path, tmp_path: Path
) -> None:
    fake(bindir, "squeue", "echo '77.0 eray.c.head.1'; echo '77.1 eray.c.worker.2'\n")
    provider, _ = _provider(tmp_path)
    assert provider.non_terminated_nodes({TAG_RAY_NODE_KIND: "worker"}) == ["n2.2"]
    assert provider.non_terminated_nodes({TAG_RAY_NODE_KIND: "head", "other": "x"}) == []
    # a racing `ray up` looks the head up by the tags it asked for
    provider.state.mark_requested("n1.1", {TAG_RAY_NODE_KIND: "head", "other": "x"})
    assert provider.non_terminated_nodes({TAG_RAY_NODE_KIND: "head", "other": "x"}) == ["n1.1"]
    assert provider.node_tags("n1.1") == {TAG_RAY_NODE_KIND: "head"}  # its own tags stay


def test_squeues_answer_decides_once_it_comes(bindir: Path, tmp_path: Path) -> None:
    fake(bindir, "squeue", "echo '77.0 eray.c.head.1'\n")  # the worker's step has ended
    provider, _ = _provider(tmp_path)
    assert provider.non_terminated_nodes({}) == ["n1.1"]
    assert provider.is_terminated("n2.2")


def test_teardown_keeps_the_state_while_squeue_cannot_answer(bindir: Path, tmp_path: Path) -> None:
    flaky(bindir, "squeue", failures=99)
    fake(bindir, "srun", "exit 0\n")
    _, state = _provider(tmp_path)
    with pytest.raises(TeardownError, match="state is kept"):
        teardown(state)
    assert state.exists() and state.stopping()
    with pytest.raises(ClusterStoppingError, match="being stopped"):
        state.check_launchable()


def test_teardown_cancels_then_removes_the_state(bindir: Path, tmp_path: Path) -> None:
    listing = bindir / "steps"
    listing.write_text("77.0 eray.c.head.1\n77.1 eray.c.workers.2\n77.2 eray.cc.head.1\n")
    fake(bindir, "squeue", f"cat {listing}\n")
    # scancel ends the steps it is given: the next listing no longer has them
    fake(
        bindir,
        "scancel",
        f'for s in "$@"; do grep -v "^$s " {listing} > {listing}.new; mv {listing}.new {listing}; done\n',
    )
    srun_log = bindir / "srun.log"
    fake(bindir, "srun", f'echo "$*" >> {srun_log}\n')
    _, state = _provider(tmp_path)
    state.write_temp_dirs("n1.1", "n1", ["/tmp/eray-77-a"])
    assert sorted(teardown(state)) == ["77.0", "77.1"]
    assert listing.read_text() == "77.2 eray.cc.head.1\n"  # another cluster's step is left alone
    assert not state.dir.exists()
    assert "--nodelist=n1" in srun_log.read_text() and "cleanup.sh" in srun_log.read_text()


def test_a_yaml_naming_an_ended_job_is_no_stale_cache_inside_another_job(
    bindir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ray down`` of a YAML with ``provider.job_id`` of a job that has ended, typed inside
    another allocation: the cluster is reported gone, not refused as another job's cache."""
    from ray.autoscaler._private.util import prepare_config

    from eray_provider.autoscaler.config_cache import write_private
    from eray_provider.autoscaler.provider import SlurmNodeProvider

    fake(bindir, "scontrol", 'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1\n')
    monkeypatch.setenv("SLURM_JOB_ID", "456")
    user = {
        "cluster_name": "gone",
        "max_workers": 0,
        "provider": {
            "type": "external",
            "module": "eray_provider.SlurmNodeProvider",
            "job_id": 123,
            "state_dir": str(tmp_path / "state"),
        },
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
    }
    filled = SlurmNodeProvider.fillout_available_node_types_resources(prepare_config(user))
    provider = filled["provider"]
    facts = Filled.of(provider)
    assert "job 123" in (facts.job_gone or "") and facts.job_id_from_config is True
    provider["_config_cache_path"] = cache = str(tmp_path / "ray-config-cache")
    write_private(cache, filled)
    SlurmNodeProvider(provider, "gone")  # the cache is the YAML's own job's: accepted
    assert Path(cache).exists()
    # a config bootstrapped for the job this runs in, read in another job, is stale
    stale = {**provider, "job_id": "789"}
    update_filled(stale, job_id_from_config=False)
    with pytest.raises(AllocationError, match="is for job 789, but this is job 456"):
        SlurmNodeProvider(stale, "gone")

    # a YAML naming no job, whose $SLURM_JOB_ID has ended: its cache is the environment's
    # job's, so inside another job it is stale (not the YAML's own)
    del user["provider"]["job_id"]
    filled = SlurmNodeProvider.fillout_available_node_types_resources(prepare_config(user))
    facts = Filled.of(filled["provider"])
    assert "job 456" in (facts.job_gone or "") and facts.job_id_from_config is False
    filled["provider"]["_config_cache_path"] = cache
    write_private(cache, filled)
    monkeypatch.setenv("SLURM_JOB_ID", "457")
    with pytest.raises(AllocationError, match="is for job 456, but this is job 457"):
        SlurmNodeProvider(filled["provider"], "gone")
    assert not Path(cache).exists()  # the stale cache is removed


def test_a_section_an_earlier_release_filled_is_read_not_refused() -> None:
    """A Ray config cache or a saved cluster config written before the provider's facts
    moved under ``provider._eray`` (their keys among the user's, ``_eray_filled`` set)."""
    old = {
        "type": "external",
        "_eray_filled": True,
        "elastic": True,
        "allocation": {"job_id": "7", "nodes": []},
        "job_id": "7",
        "job_id_from_config": True,
        "_eray_cache_path": "/tmp/ray-config-x",
        "_config_cache_path": "/tmp/ray-config-x",
        "worker_setup_commands": ["echo w"],
        "disable_node_updaters": True,
        "end_stagger_s": 30,
    }
    facts = Filled.of(old)
    assert facts.elastic and facts.job_id_from_config and facts.cache_path == "/tmp/ray-config-x"
    assert facts.allocation == {"job_id": "7", "nodes": []} and facts.worker_setup_commands == ("echo w",)
    settings = ProviderConfig.from_dict(old)
    assert settings.elastic and settings.end_stagger_s == 30 and settings.job_id == "7"


def test_a_request_check_tells_a_refusal_from_no_answer(
    bindir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sbatch --test-only`` refusing is SLURM's verdict (its words, without sbatch's
    prefix); sbatch not answering is no verdict, and says so."""
    from eray_provider.plan.sbatch import SbatchRequest
    from eray_provider.runtime.slurm_jobs import check_request

    request = SbatchRequest(cpus_per_node=1, partition="nope")
    fake(bindir, "sbatch", 'echo "sbatch: error: invalid partition specified: nope" >&2\nexit 1\n')
    with pytest.raises(SlurmCommandError) as e:
        check_request(request, "available_node_types.cpu", os.environ)
    assert str(e.value) == (
        "available_node_types.cpu: SLURM refuses this request (--nodes=1 --ntasks-per-node=1 "
        "--cpus-per-task=1 --partition=nope): invalid partition specified: nope"
    )
    monkeypatch.setenv("ERAY_SLURM_TIMEOUT", "1")
    fake(bindir, "sbatch", "sleep 5\n")
    with pytest.raises(
        SlurmCommandError, match=r"cpu: sbatch --test-only failed: .*did not answer within 1 s"
    ):
        check_request(request, "available_node_types.cpu", os.environ)


def test_a_job_that_ended_is_a_cluster_error_not_bad_input(bindir, capsys) -> None:
    """``JobGoneError`` is SLURM's word about the job, not the user's input: exit 1, not 2."""
    from eray_provider import cli
    from eray_provider.errors import ClusterError, ConfigError
    from eray_provider.slurm.allocation import JobGoneError

    assert issubclass(JobGoneError, ClusterError) and not issubclass(JobGoneError, ConfigError)
    scontrol = bindir / "scontrol"
    scontrol.write_text("#!/bin/sh\necho 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n")
    scontrol.chmod(0o755)
    assert cli.main(["inspect", "--job-id", "4242"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("eray-provider: error: ") and "4242" in err and "Traceback" not in err


def test_a_lock_waiter_that_outlives_the_teardown_leaves_nothing(tmp_path: Path) -> None:
    """Two `ray down` at once: the second waits on the cluster's lock while the first
    removes the state. Its lock file, made again when it retries, must not stay behind."""
    state = ClusterState("c", "77", base=tmp_path)
    state.create()
    waiter = textwrap.dedent(
        f"""
        import fcntl
        from eray_provider.runtime.cluster_state import ClusterState, ClusterStoppingError
        flock = fcntl.flock
        def told(fd, op):  # says when its first try finds the lock held
            try:
                return flock(fd, op)
            except OSError:
                if not told.said:
                    told.said = True
                    print("waiting", flush=True)
                raise
        told.said = False
        fcntl.flock = told
        state = ClusterState("c", "77", base={str(tmp_path)!r})
        try:
            with state.lock(timeout=30):
                print("held", flush=True)
        except ClusterStoppingError as e:
            print("gone", e, flush=True)
        """
    )
    with state.lock():
        proc = subprocess.Popen([sys.executable, "-c", waiter], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline() == "waiting\n"
        state.remove()
    out, _ = proc.communicate(timeout=60)
    assert out.startswith("gone") and "has been torn down" in out, out
    assert not state.dir.exists(), sorted(p.name for p in state.dir.iterdir())


def test_a_lock_taken_just_as_the_state_goes_removes_the_dir_it_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other order of the same race: the state is there when ``lock()`` looks, gone
    when it holds the lock; the dir and lock file it made for that are removed again."""
    state = ClusterState("c", "77", base=tmp_path)
    state.create()
    state.remove()
    seen = iter([True, False])
    monkeypatch.setattr(state, "exists", lambda: next(seen))
    with pytest.raises(ClusterStoppingError, match="has been torn down"), state.lock():
        pass
    assert not state.dir.exists()


def test_sbatch_goes_through_the_one_client_once_with_slurms_words(bindir: Path, tmp_path: Path) -> None:
    """A submission is never retried (a try that failed may have submitted the job): one
    call, SLURM's refusal quoted; the script reaches sbatch's stdin; the submitted job's
    environment loses the client commands' input variables."""
    from eray_provider.plan.sbatch import SbatchRequest
    from eray_provider.runtime.slurm_jobs import submit

    calls, seen = tmp_path / "calls", tmp_path / "seen"
    fake(
        bindir,
        "sbatch",
        f'echo x >> {calls}\ncat > {seen}\nenv | grep -c "^SBATCH_" >> {seen}\n'
        'echo "sbatch: error: Batch job submission failed: Invalid partition name specified" >&2\nexit 1\n',
    )
    request = SbatchRequest(cpus_per_node=1)
    env = {**os.environ, "SBATCH_ARRAY_INX": "0-1"}
    with pytest.raises(SlurmCommandError, match=r"job eray\.c\.1\.cpu: .*Invalid partition name specified"):
        submit(request, "eray.c.1.cpu", "#!/bin/bash\necho hi\n", tmp_path / "log", env)
    assert calls.read_text() == "x\n"  # once, whatever ERAY_SLURM_ATTEMPTS says
    assert seen.read_text() == "#!/bin/bash\necho hi\n0\n"
    fake(bindir, "sbatch", 'cat > /dev/null\necho "4242;cluster"\n')
    assert submit(request, "eray.c.1.cpu", "#!/bin/bash\n", tmp_path / "log", env) == "4242"
