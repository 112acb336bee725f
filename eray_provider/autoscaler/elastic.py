"""``SlurmJobProvider``: a Ray cluster that asks SLURM for its worker nodes with sbatch.

Use ``provider: {type: external, module: eray_provider.SlurmJobProvider}`` with
``cluster_yamls/slurm-autoscale.yaml``. The head runs as in ``SlurmNodeProvider`` on
the first node of a job: the user's allocation, or a job of its own that ``ray up``
submits (from a login node). Workers are SLURM jobs: each ``create_node`` submits
``ceil(count / nodes)`` jobs of the node type's request, named
``eray.<cluster>.<head job>.<type>``; every node of a job is a Ray node
``j<job>-<index>``, started by the job's own srun step (``node_run``) which joins the head.

The worker nodes are a part of the provider (``worker_pool.WorkerPool``: what squeue
says of them, launching, replacing and terminating them); this module holds what the
elastic provider does besides the allocation's provider: its config, the head's own
job, and ``ray down``, which cancels every job of the cluster's head and nothing else.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from filelock import FileLock
from ray.autoscaler.node_provider import NodeProvider
from ray.autoscaler.tags import (
    NODE_KIND_HEAD,
    TAG_RAY_NODE_KIND,
    TAG_RAY_USER_NODE_TYPE,
)

from ..plan.cluster_config import select_nodes
from ..plan.elastic_config import fill_elastic_config, head_mode, node_request
from ..plan.environment import launched_head_of
from ..plan.names import (
    head_job_name,
    is_head_job,
    parse_worker_job_name,
)
from ..plan.provider_config import ClusterConfigError, Filled, ProviderConfig, put_head_job, update_filled
from ..runtime import stop_signals
from ..runtime.cluster_state import ClusterState, ensure_private_dir, remove_state_dir
from ..runtime.ray_compat import cli_logger
from ..runtime.slurm_jobs import (
    cancel_jobs,
    check_request,
    list_jobs,
    submit,
    wait_jobs_ended,
)
from ..slurm.allocation import AllocationError, JobGoneError
from ..slurm.client import (
    SlurmCommandError,
    running_allocation,
    scontrol_job,
    slurm_timeout,
)
from ..slurm.env import job_id_from_env
from ..slurm.squeue import JobInfo
from ..slurm.srun import clean_env, job_state
from .provider import SlurmNodeProvider, gone_cluster, start_fillout
from .worker_pool import SUBMIT_GRACE_SECONDS, WorkerPool

logger = logging.getLogger(__name__)

#: Placeholder job of a cluster whose head job ``ray up`` has yet to submit.
NO_JOB = "0"


class SlurmJobProvider(SlurmNodeProvider):
    def __init__(self, provider_config: dict[str, Any], cluster_name: str) -> None:
        self._head_job_submitted = False  # by this `ray up`: an interrupt of it cancels it
        # replacements come from the head's autoscaler alone (its Ray's environment, from
        # node_run), never from a CLI's provider (`ray down` must not submit jobs)
        self._on_head = launched_head_of(os.environ, cluster_name)
        self.settings = ProviderConfig.from_dict(provider_config)
        if self.settings.job_id:
            super().__init__(provider_config, cluster_name)
            return
        # the head's job was not running when the config was filled (maybe in a cached
        # config): `ray up` submits it in create_node
        NodeProvider.__init__(self, provider_config, cluster_name)
        self._check_cached_config(provider_config, None)
        self.python = self.settings.python or "python3"
        self._bind(NO_JOB)
        head = _live_head_job(cluster_name)
        if head is not None and head.state == "RUNNING":
            self._use_head_job(head.job_id)

    # ------------------------------------------------------------------ config
    @staticmethod
    def fillout_available_node_types_resources(cluster_config: dict[str, Any]) -> dict[str, Any]:
        cache = start_fillout(cluster_config)
        if cache is None:
            return cluster_config
        settings = ProviderConfig.from_dict(cluster_config["provider"], elastic=True)
        env_job = job_id_from_env(os.environ)
        mode = head_mode(settings, env_job is not None)
        job = settings.job_id or (env_job if mode == "allocation" else None)
        head_owned = False
        if job is None:
            head = _live_head_job(cluster_config["cluster_name"])
            if head is not None and head.state == "RUNNING":
                job, head_owned = head.job_id, True
        head_alloc = None
        if job is not None:
            try:
                head_alloc = running_allocation(str(job))
            except JobGoneError as e:
                return gone_cluster(cluster_config, str(job), e, cache)
        filled = fill_elastic_config(cluster_config, head_alloc)
        update_filled(
            filled["provider"],
            job_id_from_config=bool(settings.job_id),
            head_job_owned=head_owned,
            cache_path=cache,
        )
        # checked before a new cluster starts; `ray down`, `ray exec`... of a running one
        # must not depend on what SLURM would accept today
        exists = (
            job is not None
            and ClusterState(cluster_config["cluster_name"], str(job), settings.state_base()).exists()
        )
        if not exists:
            _check_requests(filled)
        return filled

    def _worker_pool(self) -> WorkerPool | None:
        """The worker jobs of the head's job; none while ``ray up`` has yet to submit it."""
        if self.job_id == NO_JOB:
            return None
        return WorkerPool(
            self.state,
            self.settings,
            self.python,
            on_head=self._on_head,
            current=self._fresh_round,
            drop=self._drop_views,
        )

    # ------------------------------------------------------------------ create
    def create_node(self, node_config: dict[str, Any], tags: dict[str, str], count: int) -> None:
        gone = Filled.of(self.provider_config).job_gone
        if gone:
            raise JobGoneError(f"cannot start a cluster: {gone}")
        if tags.get(TAG_RAY_NODE_KIND) == NODE_KIND_HEAD:
            stop_signals.install()  # SIGTERM and SIGHUP end `ray up` as Ctrl-C does
            if self.job_id == NO_JOB:
                self._start_head_job(node_config, tags.get(TAG_RAY_USER_NODE_TYPE, "head"))
            self._create_head(self._allocation().head.name, tags)
            return None
        if self.pool is None:
            raise AllocationError(f"cannot launch {count} worker(s): the cluster has no head job yet")
        self.pool.submit_workers(node_config, tags, count)
        return None

    def _start_head_job(self, node_config: dict[str, Any], head_type: str) -> None:
        """Submit the head's own job (or find the one a racing `ray up` submitted), wait
        until SLURM runs it, and complete the provider config with it.

        Two `ray up`s submit one job: the look-up and the submission happen under a lock
        file of the cluster in the state base. The job is cancelled only by the `ray up`
        that submitted it, and only on SLURM's own verdict (it ended, it cannot start, it
        waited past ``head_start_timeout_s``) or an interrupt: a `ray up` that found the job
        of another (still waiting for it) leaves it alone whatever happens to itself. When
        SLURM does not answer the job is kept (the next `ray up` finds it by name, `ray
        down` cancels it) and the error says so."""
        base = ensure_private_dir(self.state.base)
        job: str | None = None
        ours = False
        try:
            with FileLock(str(base / f".{self.cluster_name}.head.lock"), timeout=slurm_timeout() * 4):
                head = _live_head_job(self.cluster_name)
                if head is None:
                    request = node_request(self.settings, node_config, head_type)
                    with stop_signals.shielded():  # a job SLURM accepted is known here
                        job = submit(
                            request,
                            head_job_name(self.cluster_name),
                            "#!/bin/bash\nexec sleep infinity\n",
                            self._head_log("%j"),
                            clean_env(os.environ),
                            warn_s=self.settings.drain_before_end_s,
                        )
                        ours = True
                    cli_logger.print(f"Submitted the head's SLURM job {job} ({' '.join(request.argv())})")
                else:
                    job = head.job_id
                    cli_logger.print(f"Using the head's SLURM job {job} ({head.state})")
            self._wait_head_job(job)
            self._use_head_job(job)
            if ours:
                self._head_job_submitted = True
                self._own_start()  # from here a stop at any point ends the job (at exit)
        except JobGoneError:
            raise
        except SlurmCommandError as e:
            if job is None:
                raise  # nothing was submitted
            raise SlurmCommandError(
                f"{e}; the head's SLURM job {job} was kept (SLURM did not answer, which says nothing "
                "about the job): `ray up` again uses it, `ray down` cancels it"
            ) from e
        except BaseException:
            if ours and job is not None:
                with stop_signals.shielded():  # a second Ctrl-C must not cut this
                    cancel_jobs([job])  # never leave a head job nobody tracks
                    self._head_log(job).unlink(missing_ok=True)
            elif job is not None:
                cli_logger.print(f"The head's SLURM job {job} was submitted by another `ray up`: left to it")
            raise

    def _wait_head_job(self, job: str) -> None:
        """Until SLURM runs the head's job; ``AllocationError`` on SLURM's verdict that it
        will not, ``SlurmCommandError`` when squeue stayed silent up to the timeout."""
        timeout = self.settings.head_start_timeout_s
        started = time.monotonic()
        reason = ""
        while True:
            stop_signals.check()
            waited = time.monotonic() - started
            try:
                info = list_jobs(self.cluster_name).get(job)
            except SlurmCommandError as e:
                if waited > timeout:
                    raise
                cli_logger.warning(f"squeue failed while waiting for the head's job {job}: {e}")
                time.sleep(1)
                continue
            if info is None and waited < SUBMIT_GRACE_SECONDS:
                time.sleep(1)  # not listed yet
                continue
            if info is None or not info.live:
                raise AllocationError(
                    f"the head's SLURM job {job} ended before it started"
                    + (f" ({info.state}, {info.reason})" if info else "")
                )
            if info.state == "RUNNING":
                return
            if info.hopeless or waited > timeout:
                raise AllocationError(
                    f"the head's SLURM job {job} did not start ({info.state}, reason {info.reason}) "
                    f"within provider.head_start_timeout_s={timeout:g}; it was cancelled"
                )
            if info.reason != reason:
                reason = info.reason
                cli_logger.print(f"The head's SLURM job {job} is {info.state} ({reason})")
            time.sleep(1)

    def _start_workers_with_head(self) -> None:
        """Nothing: an elastic cluster's workers are jobs that the autoscaler submits."""

    def _own_start(self) -> None:
        """Only the `ray up` that submitted the head's job owns the start: one that found
        another's job (both waiting for it) never stops what the other began."""
        if self._head_job_submitted:
            super()._own_start()

    def _stop_started(self) -> None:
        """An interrupted `ray up` that submitted the head's job stops the steps it began
        in it, then cancels it."""
        try:
            if self.state.exists():
                SlurmNodeProvider._stop_started(self)
        finally:
            cancel_jobs([self.job_id])
            self._head_log(self.job_id).unlink(missing_ok=True)

    def _use_head_job(self, job: str) -> None:
        """Complete the provider config with the head's running job, and attach to it."""
        alloc = select_nodes(scontrol_job(job), self.settings, 0)
        put_head_job(self.provider_config, job, alloc.to_dict())
        self.settings = ProviderConfig.from_dict(self.provider_config)
        self._bind(job)

    def prepare_for_head_node(self, cluster_config: dict[str, Any]) -> dict[str, Any]:
        """The config written for the head names the head's job (submitted after the
        CLI filled its config)."""
        provider = cluster_config["provider"]
        if self.job_id != NO_JOB and not ProviderConfig.from_dict(provider).job_id:
            put_head_job(provider, self.job_id, Filled.of(self.provider_config).allocation)
        return super().prepare_for_head_node(cluster_config)

    def stop_all(self) -> None:
        """``ray stop`` of this cluster (``ray down``): see ``cleanup_cluster_resources``."""
        self.cleanup_cluster_resources()

    def cleanup_cluster_resources(self) -> None:
        """The end of ``ray down``, also when the head is gone (then ``ray stop`` never
        reached ``stop_all``): cancel this head's worker jobs and those of earlier heads of
        this cluster that no longer run, wait (bounded) until they have ended, so that their
        nodes' logs reach the state dir before it goes, stop the head's steps, then cancel
        the head's own job when ``ray up`` submitted it."""
        stop_signals.install()  # SIGTERM and SIGHUP stop `ray down` as Ctrl-C does
        jobs = list_jobs(self.cluster_name)
        heads = {j.job_id for j in jobs.values() if is_head_job(j.name, self.cluster_name) and j.live}
        gone_heads: dict[str, bool] = {}
        doomed = []
        for job in jobs.values():
            parsed = parse_worker_job_name(job.name, self.cluster_name)
            if not parsed or not job.live:
                continue
            head = parsed[0]
            if head != self.job_id and head not in gone_heads:
                gone_heads[head] = head not in heads and job_state(head) is None
            if head == self.job_id or gone_heads[head]:
                doomed.append(job.job_id)
        cancel_jobs(doomed)
        # the workers collect their logs into the state dir as their jobs end: keep it until then
        still = wait_jobs_ended(doomed)
        if still:
            logger.warning("worker jobs %s did not end in time (their logs may be lost)", ", ".join(still))
        for head, gone in gone_heads.items():
            if gone:
                remove_state_dir(self.state.base / f"{self.cluster_name}-{head}")
                self._head_log(head).unlink(missing_ok=True)
        if self.job_id != NO_JOB and self.state.exists():
            SlurmNodeProvider.stop_all(self)
        if Filled.of(self.provider_config).head_job_owned:
            if self.job_id in heads:
                cancel_jobs([self.job_id])
            self._head_log(self.job_id).unlink(missing_ok=True)

    def _head_log(self, job: str) -> Path:
        return self.state.base / f"{self.cluster_name}-head-{job}.log"


def _live_head_job(cluster: str) -> JobInfo | None:
    """The head's own job of ``cluster`` (submitted by an earlier or racing ``ray up``)."""
    heads = [j for j in list_jobs(cluster).values() if is_head_job(j.name, cluster) and j.live]
    return min(heads, key=lambda j: int(j.job_id)) if heads else None


def _check_requests(config: dict[str, Any]) -> None:
    """SLURM's verdict on every worker type's request, before anything is submitted, so
    that ``ray up`` shows a refusal instead of the autoscaler failing in a log later."""
    env = clean_env(os.environ)
    settings = ProviderConfig.from_dict(config["provider"])
    for name, spec in config["available_node_types"].items():
        if name == config["head_node_type"] and settings.job_id:
            continue
        request = node_request(settings, spec["node_config"], name)
        try:
            check_request(request, f"available_node_types.{name}", env)
        except SlurmCommandError as e:
            raise ClusterConfigError(str(e)) from e
