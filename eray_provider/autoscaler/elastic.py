"""``SlurmJobProvider``: a Ray cluster that asks SLURM for its worker nodes with sbatch.

Use ``provider: {type: external, module: eray_provider.SlurmJobProvider}`` with
``cluster_yamls/slurm-autoscale.yaml``. The head runs as in ``SlurmNodeProvider`` on
the first node of a job: the user's allocation, or a job of its own that ``ray up``
submits (from a login node). Workers are SLURM jobs: each ``create_node`` submits
``ceil(count / nodes)`` jobs of the node type's request, named
``eray.<cluster>.<head job>.<type>``; every node of a job is a Ray node
``j<job>-<index>``, started by the job's own srun step (``node_run``) which joins the head.

Truth about workers comes from ``squeue`` (one call for all of the user's jobs, cached
for ``JOB_CACHE_SECONDS``): a pending job is a pending node, a job that SLURM ended
(failed to start, cancelled, preempted, out of time) makes its nodes terminated, so the
autoscaler replaces them while the demand lasts. Jobs found in squeue without a record
(a lost state file) are adopted by name. ``terminate_node`` cancels that node's job;
``ray down`` cancels every job of the cluster's head and nothing else.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from filelock import FileLock
from ray.autoscaler.node_provider import NodeProvider
from ray.autoscaler.tags import (
    NODE_KIND_HEAD,
    NODE_KIND_WORKER,
    STATUS_UP_TO_DATE,
    TAG_RAY_NODE_KIND,
    TAG_RAY_NODE_STATUS,
    TAG_RAY_USER_NODE_TYPE,
)

from ..plan.cluster_config import select_nodes
from ..plan.drain import EndingJob, due_replacements, failed_replacements, paired_visibility, worker_lead
from ..plan.elastic_config import fill_elastic_config, head_mode, node_request
from ..plan.environment import launched_head_of
from ..plan.markers import Marker
from ..plan.names import (
    head_job_name,
    is_head_job,
    parse_worker_job_name,
    worker_job_name,
)
from ..plan.node_phase import LIVE, NodePhase, Slurm, end_of, marker_test, node_phase
from ..plan.node_record import NodeRecord
from ..plan.provider_config import ClusterConfigError, Filled, ProviderConfig, put_head_job, update_filled
from ..plan.sbatch import SbatchRequest, elastic_node_id
from ..runtime import stop_signals
from ..runtime.cluster_state import ClusterState, ClusterStoppingError, ensure_private_dir, remove_state_dir
from ..runtime.launch import node_env
from ..runtime.ray_compat import cli_logger
from ..runtime.slurm_jobs import (
    batch_script,
    cancel_jobs,
    check_request,
    list_jobs,
    requeue_job,
    submit,
    wait_jobs_ended,
)
from ..slurm.allocation import AllocationError, JobGoneError
from ..slurm.client import (
    SlurmCommandError,
    known_cluster_name,
    requeue_state,
    running_allocation,
    scontrol_job,
    slurm_timeout,
)
from ..slurm.env import job_id_from_env
from ..slurm.hostlist import expand
from ..slurm.scontrol import ENDS, PREEMPTED_REQUEUE
from ..slurm.squeue import JobInfo
from ..slurm.srun import clean_env, job_state
from ..slurm.walltime import WalltimeError, cut_short, parse_duration, parse_timestamp
from .provider import Answers, SlurmNodeProvider, StepNames, gone_cluster, start_fillout
from .views import LiveView, Memo, ReadOnlyTags

logger = logging.getLogger(__name__)

JOB_CACHE_SECONDS = 5.0
#: A submitted job that squeue does not list yet still counts as pending for this long.
SUBMIT_GRACE_SECONDS = 30.0
#: After SLURM refused a node type's job, launches of that type fail this long.
REFUSED_SECONDS = 600.0
#: After a replacement's sbatch failed, it is tried again this much later.
REPLACE_RETRY_SECONDS = 60.0
#: Placeholder job of a cluster whose head job ``ray up`` has yet to submit.
NO_JOB = "0"
_NO_NODES: tuple[list[str], frozenset[str]] = ([], frozenset())


def _parse_node_id(node_id: str) -> tuple[str, int] | None:
    """``j<job>-<index>`` -> (job, index); None for the head's ids."""
    if not node_id.startswith("j"):
        return None
    job, _, index = node_id[1:].partition("-")
    return (job, int(index)) if job.isdigit() and index.isdigit() else None


def pending_news(
    jobs: dict[str, JobInfo], cluster: str, head_job: str, said: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """What to say of the head's pending worker jobs whose reason is new since ``said``
    (job -> reason said), and the new ``said``: pure."""
    lines, now = [], {}
    for job in jobs.values():
        parsed = parse_worker_job_name(job.name, cluster)
        if job.state == "PENDING" and parsed and parsed[0] == head_job:
            now[job.job_id] = job.reason
            if said.get(job.job_id) != job.reason:
                lines.append(f"worker job {job.job_id} ({parsed[1]}) is pending: {job.reason}")
    return lines, now


class SlurmJobProvider(SlurmNodeProvider):
    def __init__(self, provider_config: dict[str, Any], cluster_name: str) -> None:
        self._jobs_cache: tuple[float, dict[str, JobInfo]] = (0.0, {})
        self._pending_said: dict[str, str] = {}
        self._workers: Memo[dict[str, tuple[JobInfo, str]]] = Memo()
        self._elastic_live = LiveView()
        self._replaced_for: dict[str, JobInfo] | None = None
        self._head_job_submitted = False  # by this `ray up`: an interrupt of it cancels it
        # replacements come from the head's autoscaler alone (its Ray's environment, from
        # node_run), never from a CLI's provider (`ray down` must not submit jobs)
        env = os.environ
        self._on_head = launched_head_of(env, cluster_name)
        self._replace_retry: dict[str, float] = {}
        #: each running worker job's latest planned end: one that moves earlier was cut short
        self._planned_ends: dict[str, float] = {}
        #: of the last view: the replacement node ids and the nodes standing by
        #: (``_hand_over`` looks at these), and the worker nodes alive, shown or hidden
        self._replacements: frozenset[str] = frozenset()
        self._standing_by: frozenset[str] = frozenset()
        self._alive_workers: frozenset[str] = frozenset()
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

    def _drop_views(self) -> None:
        super()._drop_views()
        self._elastic_live.drop()

    # ------------------------------------------------------------------ squeue
    def _jobs(self) -> dict[str, JobInfo]:
        """This cluster's worker jobs (and the head's own job), refreshed every few seconds."""
        stamp, jobs = self._jobs_cache
        if time.monotonic() - stamp > JOB_CACHE_SECONDS:
            try:
                jobs = list_jobs(self.cluster_name)
            except SlurmCommandError as e:
                if not stamp:
                    raise  # no list yet: an empty one would make every worker look ended
                logger.warning("squeue failed, keeping the last job list: %s", e)
            self._jobs_cache = (time.monotonic(), jobs)
            self._report_pending(jobs)
            try:
                self._report_stuck(jobs)
            except SlurmCommandError as e:
                logger.warning("could not give up on stuck jobs: %s", e)
        return jobs

    def _report_pending(self, jobs: dict[str, JobInfo]) -> None:
        """Log each of this head's worker jobs that waits in the queue, with SLURM's reason,
        once per reason (in the head's monitor.log; ``eray-provider status`` shows them too)."""
        lines, self._pending_said = pending_news(jobs, self.cluster_name, self.job_id, self._pending_said)
        for line in lines:
            logger.info("%s", line)

    def _report_stuck(self, jobs: dict[str, JobInfo]) -> None:
        """Give up on worker jobs that wait for what will not change (a held job, a time
        limit over the partition's...): cancel them and remember the refusal, so that the
        next launch of that type fails with SLURM's reason (``ray status`` shows the launch
        failure, the head's monitor.log the reason)."""
        hopeless = []
        for job in jobs.values():
            parsed = parse_worker_job_name(job.name, self.cluster_name)
            if job.hopeless and parsed and parsed[0] == self.job_id:
                hopeless.append((job, parsed[1]))
        if not hopeless:
            return
        cancel_jobs([job.job_id for job, _ in hopeless])
        for job, node_type in hopeless:
            logger.error("SLURM job %s (%s) cannot start (%s): cancelled", job.job_id, node_type, job.reason)

        if self.state.exists():
            self.state.note_refused({node_type: (job.job_id, job.reason) for job, node_type in hopeless})

    def _check_refused(self, node_type: str) -> None:
        refused = self.state.read().get("refused", {}).get(node_type)
        if refused and time.time() - refused["at"] < REFUSED_SECONDS:
            raise SlurmCommandError(
                f"SLURM does not start {node_type} jobs: job {refused['job']} waited for "
                f"{refused['reason']} and was cancelled; fix available_node_types.{node_type}"
                f".node_config.sbatch (retried {REFUSED_SECONDS:.0f} s after the refusal)"
            )

    def _worker_jobs(self) -> dict[str, tuple[JobInfo, str]]:
        """Live worker jobs of this cluster's head: job id -> (info, node type); computed
        once per squeue listing (the autoscaler asks about every node in one round)."""
        return self._workers.get((self._jobs(), self.job_id), self._compute_worker_jobs)

    def _compute_worker_jobs(self, jobs: dict[str, JobInfo], head_job: str) -> dict[str, tuple[JobInfo, str]]:
        out = {}
        for job in jobs.values():
            parsed = parse_worker_job_name(job.name, self.cluster_name)
            if parsed and parsed[0] == head_job and job.live:
                out[job.job_id] = (job, parsed[1])
        return out

    # ------------------------------------------------------------------ node view
    def _alive(self, node_id: str, rec: NodeRecord, markers: frozenset[str], steps: StepNames | None) -> bool:
        if rec.elastic:
            return False  # worker jobs are judged by _elastic_ids
        return super()._alive(node_id, rec, markers, steps)

    def _elastic_alive(self, node_id: str, job: str, index: int) -> bool:
        """A worker node lives while its job is live in squeue (pending or running), it
        was not terminated and its Ray has not ended; a job just submitted counts as
        pending until squeue lists it (at most SUBMIT_GRACE_SECONDS)."""
        rec = self._records().get(node_id)
        found = self._worker_jobs().get(job)
        if found is None and rec is None:
            return False
        if found is not None:
            slurm = Slurm.QUEUED if found[0].state == "PENDING" else Slurm.RUNS
            if index >= max(found[0].num_nodes, 1):
                slurm = Slurm.NOT_THERE  # SLURM runs fewer nodes of the job
        else:
            slurm = Slurm.ENDED if job in self._jobs() else Slurm.UNLISTED  # listed but ended: gone at once
        grace = rec is not None and time.time() - rec.created < SUBMIT_GRACE_SECONDS
        return end_of(rec, marker_test(node_id, self.state.markers()), slurm, grace) is None

    def _elastic_ids(self) -> list[str]:
        return self._elastic_view()[0]

    def _elastic_view(self) -> tuple[list[str], frozenset[str]]:
        """(live worker node ids, the same as a set): recomputed when the job listing, the
        records or the markers changed, and reused for READ_FRESH_SECONDS (the state's
        own freshness; this provider's writes drop it), so that the autoscaler's
        per-node calls of a round cost a set lookup each."""
        if self.job_id == NO_JOB:
            return _NO_NODES
        return self._elastic_live.get(
            lambda: (self._worker_jobs(), self._records(), self.state.markers()),
            lambda *_inputs: self._compute_elastic_ids(),
        )

    def _compute_elastic_ids(self) -> list[str]:
        candidates = {
            elastic_node_id(job.job_id, index): (job.job_id, index)
            for job, _node_type in self._worker_jobs().values()
            for index in range(max(job.num_nodes, 1))
        }
        for node_id, rec in self._records().items():
            parsed = _parse_node_id(node_id)
            if rec.elastic and parsed:
                candidates.setdefault(node_id, parsed)
        alive = [i for i, (job, index) in candidates.items() if self._elastic_alive(i, job, index)]
        successors = self._successors()
        markers = self.state.markers()
        self._replacements = frozenset(successors)
        self._alive_workers = frozenset(alive)
        self._standing_by = frozenset(i for i in alive if Marker.STANDBY.file(i) in markers)
        if not successors:
            return alive
        ready = [
            i for i in successors if Marker.STANDBY.file(i) in markers or Marker.HANDOVER.file(i) in markers
        ]
        handed = [i for i in successors if Marker.HANDOVER.file(i) in markers]
        drained = [old for old in successors.values() if Marker.DRAIN.file(old) in markers]
        hidden = paired_visibility(successors, alive, ready, handed, drained)
        return [i for i in alive if i not in hidden]

    def _successors(self) -> dict[str, str]:
        """Replacement node id -> the node it replaces, of the pairs the records hold."""
        return {i: r.replaces for i, r in self._records().items() if r.replaces}

    def _round_inputs(self) -> tuple[Any, ...]:
        return (*super()._round_inputs(), self._elastic_ids(), self._worker_jobs())

    def _compute_answers(  # type: ignore[override]
        self,
        alive: list[str],
        records: Mapping[str, NodeRecord],
        elastic: list[str],
        workers: dict[str, tuple[JobInfo, str]],
    ) -> Answers:
        """The head's nodes as the base provider answers them, then the worker nodes."""
        answers = super()._compute_answers(alive, records)
        for node_id in elastic:
            job, _index = _parse_node_id(node_id) or ("", 0)
            found = workers.get(job)
            rec = records.get(node_id)
            answers[node_id] = (
                ReadOnlyTags(rec.tags if rec else _adopted_tags(found)),
                bool(found and found[0].state == "RUNNING"),
            )
        return answers

    def _read_tags(self, node_id: str) -> dict[str, str]:
        rec = self._records().get(node_id)
        if rec:
            return dict(rec.tags)
        parsed = _parse_node_id(node_id)
        return _adopted_tags(self._worker_jobs().get(parsed[0]) if parsed else None)

    def _read_running(self, node_id: str) -> bool:
        parsed = _parse_node_id(node_id)
        if parsed is None:
            return super()._read_running(node_id)
        found = self._worker_jobs().get(parsed[0])
        return bool(found and found[0].state == "RUNNING" and node_id in self._elastic_view()[1])

    def is_terminated(self, node_id: str) -> bool:
        parsed = _parse_node_id(node_id)
        if parsed is None:
            return super().is_terminated(node_id)
        return node_id not in self._elastic_view()[1]

    def internal_ip(self, node_id: str) -> str:
        parsed = _parse_node_id(node_id)
        if parsed is None:
            return super().internal_ip(node_id)
        ip = self.state.read_marker(node_id, Marker.IP)
        if ip:
            return ip
        found = self._worker_jobs().get(parsed[0])
        if found and found[0].nodelist:
            names = expand(found[0].nodelist)
            if parsed[1] < len(names):
                return names[parsed[1]]
        return node_id

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
        self._submit_workers(node_config, tags, count)
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
                            warn_s=self._drain_lead,
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

    def _submit_workers(self, node_config: dict[str, Any], tags: dict[str, str], count: int) -> None:
        node_type = tags[TAG_RAY_USER_NODE_TYPE]
        request: SbatchRequest = node_request(self.settings, node_config, node_type)
        self._check_refused(node_type)
        self.state.create(slurm_cluster=None if self.state.exists() else known_cluster_name(os.environ))
        self._submit_jobs(node_type, node_config, request, tags, math.ceil(count / request.nodes))

    def _submit_jobs(
        self,
        node_type: str,
        node_config: dict[str, Any],
        request: SbatchRequest,
        tags: dict[str, str],
        n_jobs: int,
        replaces: str | None = None,
    ) -> None:
        """Submit ``n_jobs`` jobs of ``request`` (node type ``node_type``) and record their
        nodes (``replaces``: the job these replace, node for node); the type's node config
        is kept in the state, for the replacements the provider submits on its own
        (``_replace_ending``)."""
        tags = {**tags, TAG_RAY_NODE_STATUS: STATUS_UP_TO_DATE}
        # with ``replaces``, node_run stands by until the node it replaces is shown
        env = node_env(
            self.state, "worker", {}, {"RAY_NODE_TYPE_NAME": node_type}, elastic=True, replaces=replaces
        )
        name = worker_job_name(self.cluster_name, self.job_id, node_type)
        submitted: list[tuple[str, float]] = []

        try:
            for _ in range(n_jobs):
                job = submit(
                    request,
                    name,
                    batch_script(self.python),
                    self.state.logs / "job-%j.log",
                    env,
                    warn_s=self._signal_lead(request),
                )
                submitted.append((job, time.time()))
                logger.info(
                    "submitted SLURM job %s for %d %s node(s)%s",
                    job,
                    request.nodes,
                    node_type,
                    f", to replace job {replaces} before it ends" if replaces else "",
                )
        finally:
            # one state write for the whole launch (a write per job is O(N) each), also
            # when a later sbatch failed: the jobs already submitted are recorded
            if submitted:
                self.state.add_job_nodes(node_type, node_config, submitted, request.nodes, tags, replaces)
                self._drop_views()

    # ------------------------------------------------------------------ replace
    def non_terminated_nodes(self, tag_filters: dict[str, str]) -> list[str]:
        """As the base provider's; first, once per squeue listing, the replacements of
        worker jobs that near their end are submitted (``_replace_ending``)."""
        if not (self._on_head and self.job_id != NO_JOB and self.state.exists()):
            return super().non_terminated_nodes(tag_filters)
        jobs = self._jobs()
        if jobs is not self._replaced_for:
            self._replaced_for = jobs
            self._replace_ending(jobs)
        nodes = super().non_terminated_nodes(tag_filters)
        self._hand_over()
        return nodes

    def _hand_over(self) -> None:
        """Tell each replacement that this listing shows it to the autoscaler in place of
        the node it replaces (its ``handover`` marker): its ``node_run``, standing by, starts
        Ray now. Written after the listing, so that the autoscaler knows the node before
        its Ray joins (a Ray node it does not know of is taken for one too many). A node
        that stands by without a record of what it replaces (adopted after the state was
        lost) is handed over once shown, too, rather than standing by for nothing."""
        shown = self._elastic_view()[1]  # computes the pairs and the nodes standing by
        waiting = self._replacements | self._standing_by
        if not waiting:
            return
        markers = self.state.markers()
        for node_id in waiting:
            if node_id not in shown or Marker.HANDOVER.file(node_id) in markers:
                continue
            try:
                self.state.write_marker(node_id, Marker.HANDOVER, str(time.time()))
                rec = self._records().get(node_id)
                replaces = (rec.replaces if rec else "") or "a node whose record was lost"
                logger.info("%s takes over from %s", node_id, replaces)
            except OSError as e:  # tried again with the next listing
                logger.warning("could not hand over to %s: %s", node_id, e)

    def _forget_failed_replacements(self, markers: frozenset[str]) -> None:
        """Forget the pairs whose replacement ended before it was handed over
        (``drain.failed_replacements``): the old node, shown all along, is replaced
        again ``REPLACE_RETRY_SECONDS`` later, while its end is still ahead."""
        self._elastic_view()  # computes the pairs and the alive workers
        handed = [i for i in self._replacements if Marker.HANDOVER.file(i) in markers]
        failed = failed_replacements(self._successors(), self._alive_workers, handed)
        if not failed:
            return

        self.state.forget_replacements(failed)
        self._drop_views()
        for new, old in failed.items():
            old_job = (_parse_node_id(old) or ("", 0))[0]
            self._replace_retry[old_job] = time.time() + REPLACE_RETRY_SECONDS
            again = f": replaced again in {REPLACE_RETRY_SECONDS:.0f} s" if old in self._alive_workers else ""
            logger.warning("%s, the replacement of %s, ended before it took over%s", new, old, again)

    def _replace_ending(self, jobs: dict[str, JobInfo]) -> None:
        """Submit a replacement for each running worker job that ends within
        ``provider.replace_before_end_s`` (staggered: ``drain.replacement_leads``), so
        that its capacity is back before it is lost. The replacement stays hidden from
        the autoscaler until its ``node_run`` stands by (or the old one is gone or
        drained); then the old node is hidden, and drained once the replacement's Ray has
        joined (``end_watch``): the autoscaler counts one node of each pair throughout
        (``drain.paired_visibility``).

        A job is replaced only whole, and only while every node of it is a plain
        running worker: none terminated (the autoscaler let a node of a multi-node job
        go), exited, drained (Ray's autoscaler replaces a draining node itself, at
        once), replaced already, or itself a replacement that has not taken over; and not
        when SLURM cut its end short (``walltime.cut_short``: a preemption, whose drain
        may not be recorded yet when this round runs)."""
        lead = self.settings.replace_before_end_s
        if lead <= 0:
            return
        markers = self.state.markers()
        self._forget_failed_replacements(markers)
        records, markers = self.state.records(), self.state.markers()
        configs = self.state.read().get("node_configs", {})

        def replaceable(node_id: str) -> bool:
            """A worker of a running job that is neither ending, nor drained, nor replaced
            already, nor a replacement that has not taken over."""
            rec = records.get(node_id)
            if rec is None or rec.successor:
                return False
            has = marker_test(node_id, markers)
            if rec.replaces and not has(Marker.HANDOVER):
                return False
            phase = node_phase(rec, has, Slurm.RUNS)  # the caller takes running jobs only
            return phase in LIVE and phase is not NodePhase.DRAINING

        ending = []
        self._planned_ends = {j: e for j, e in self._planned_ends.items() if j in jobs}
        for job in jobs.values():
            parsed = parse_worker_job_name(job.name, self.cluster_name)
            if job.state != "RUNNING" or not parsed or parsed[0] != self.job_id:
                continue
            if not all(replaceable(elastic_node_id(job.job_id, i)) for i in range(max(job.num_nodes, 1))):
                continue
            if parsed[1] not in configs or time.time() < self._replace_retry.get(job.job_id, 0):
                continue
            try:
                end, limit = parse_timestamp(job.end_time), parse_duration(job.time_limit)
            except WalltimeError as e:
                logger.warning("job %s: %s", job.job_id, e)
                continue
            if end is not None:
                planned = self._planned_ends.get(job.job_id)
                self._planned_ends[job.job_id] = max(end, planned or end)  # a requeue runs later
                if cut_short(planned, end):
                    continue  # preempted: drained at SLURM's signal, replaced by Ray's autoscaler
            if end is not None and limit is not None:
                ending.append(EndingJob(job.job_id, parsed[1], end, limit))
        stagger = self.settings.end_stagger_s
        for due in due_replacements(ending, time.time(), lead, stagger):
            rec = records[elastic_node_id(due.job_id, 0)]
            try:
                self.state.check_launchable()
                self._check_refused(due.node_type)
                config = configs[due.node_type]
                request = node_request(self.settings, config, due.node_type)
                self._submit_jobs(due.node_type, config, request, dict(rec.tags), 1, replaces=due.job_id)
            except ClusterStoppingError:
                return
            except (SlurmCommandError, ClusterConfigError) as e:
                self._replace_retry[due.job_id] = time.time() + REPLACE_RETRY_SECONDS
                logger.warning(
                    "could not submit the replacement of job %s (ends in %.0f s; tried again in %.0f s): %s",
                    due.job_id,
                    due.end - time.time(),
                    REPLACE_RETRY_SECONDS,
                    e,
                )

    # ------------------------------------------------------------------ terminate
    def terminate_nodes(self, node_ids: list[str]) -> None:
        fixed = [i for i in node_ids if _parse_node_id(i) is None]
        by_job: dict[str, list[str]] = {}
        for node_id in node_ids:
            parsed = _parse_node_id(node_id)
            if parsed:
                by_job.setdefault(parsed[0], []).append(node_id)
        if by_job:
            self._terminate_workers(by_job)
        if fixed:
            super().terminate_nodes(fixed)

    def _terminate_workers(self, by_job: dict[str, list[str]]) -> None:
        jobs = self._worker_jobs()
        records = self._records()
        shown = self._elastic_view()[1]

        def terminated(node_id: str) -> bool:
            return node_id in records and records[node_id].terminated

        for ids in list(by_job.values()):
            for node_id in ids:
                # a replacement not handed over yet goes with the node it was to replace
                successor = records[node_id].successor if node_id in records else ""
                parsed = _parse_node_id(successor) if successor else None
                if parsed and successor not in shown and not terminated(successor):
                    by_job.setdefault(parsed[0], []).append(successor)
        whole = []
        for job, ids in by_job.items():
            size = jobs[job][0].num_nodes if job in jobs else len(ids)
            others = [
                elastic_node_id(job, i)
                for i in range(size)
                if elastic_node_id(job, i) not in ids and not terminated(elastic_node_id(job, i))
            ]
            if others:
                for node_id in ids:  # the job's other nodes are still wanted
                    self._signal_node(node_id, job)
            else:
                whole.append(job)
        requeued = self._requeued(whole, by_job)
        cancel_jobs([job for job in whole if job not in requeued])

        if self.state.exists():
            self.state.end_jobs(by_job, requeued)
        self._jobs_cache = (0.0, self._jobs_cache[1])
        self._drop_views()

    def _requeued(self, jobs: list[str], ids: dict[str, list[str]]) -> set[str]:
        """Of the jobs Ray's autoscaler lets go, those SLURM runs again (preempted where
        preemption requeues: ``slurm.client.requeue_state``): requeued now if still in their
        grace time (``scontrol requeue``: their nodes are free for the job that preempts
        them at once), never cancelled, as that would undo the site's requeue and lose the
        job's place in the queue. Their nodes are hidden until they run again (a ``rerun``
        marker), then shown as the nodes of the same type they were, which the autoscaler
        adopts. Only a node whose Ray ended or was drained by its job's end is asked about
        (one ``scontrol`` or two, rare): an autoscaler's scale-down of a live node is not.
        ``SlurmCommandError`` when SLURM does not answer: no verdict, nothing cancelled."""
        markers = self.state.markers()
        asked = [
            job
            for job in jobs
            if any(
                Marker.EXIT.file(i) in markers or Marker.DRAIN.file(i) in markers for i in ids.get(job, [])
            )
        ]
        out = set()
        for job in asked:
            verdict = requeue_state(job)
            if verdict == ENDS:
                continue
            out.add(job)
            for node_id in ids[job]:
                self.state.marker(node_id, Marker.RERUN).unlink(missing_ok=True)
            if verdict == PREEMPTED_REQUEUE:
                try:
                    requeue_job(job)
                except SlurmCommandError as e:  # SLURM requeues it at the end of its grace
                    logger.warning("could not requeue job %s now: %s", job, e)
            logger.info(
                "job %s is requeued (preempted): not cancelled; %s come back when it runs again",
                job,
                ", ".join(ids[job]),
            )
        return out

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

    def _signal_lead(self, request: SbatchRequest) -> float:
        """The ``--signal`` lead of a worker job (``drain.worker_lead``)."""
        try:
            limit = parse_duration(request.time) if request.time else None
        except WalltimeError:
            limit = None  # sbatch's own reading of it: SLURM says at submission
        replaced = self.settings.replace_before_end_s > 0
        return worker_lead(self._drain_lead, limit, replaced)

    @property
    def _drain_lead(self) -> float:
        return self.settings.drain_before_end_s

    def _head_log(self, job: str) -> Path:
        return self.state.base / f"{self.cluster_name}-head-{job}.log"


def _adopted_tags(found: tuple[JobInfo, str] | None) -> dict[str, str]:
    """The tags of a worker node whose record was lost, adopted from squeue: what its job
    name says; none for a node that squeue does not list either."""
    if found is None:
        return {}
    return {
        TAG_RAY_NODE_KIND: NODE_KIND_WORKER,
        TAG_RAY_USER_NODE_TYPE: found[1],
        TAG_RAY_NODE_STATUS: STATUS_UP_TO_DATE,
    }


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
