"""The elastic worker pool: Ray worker nodes that are SLURM jobs of their own.

A part of ``SlurmJobProvider`` (the provider answers Ray, the pool its worker nodes): each
launch submits ``ceil(count / nodes)`` jobs of the node type's request, named
``eray.<cluster>.<head job>.<type>``; every node of a job is a Ray node
``j<job>-<index>`` started by the job's own srun step (``node_run``), which joins the head.

Truth about workers comes from squeue (``JobListing``: one call for all of the user's
jobs of the cluster): a pending job is a pending node; a job that SLURM ended (failed to
start, cancelled, preempted, out of time) makes its nodes terminated, so the autoscaler
replaces them while the demand lasts. Jobs listed without a record (a lost state file)
are adopted by name. On the head, jobs that near their end are replaced before they go
(``replace_ending``), each replacement shown in its old node's place once it stands by.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from ray.autoscaler.tags import STATUS_UP_TO_DATE, TAG_RAY_NODE_STATUS, TAG_RAY_USER_NODE_TYPE

from ..plan.drain import EndingJob, due_replacements, failed_replacements, paired_visibility, worker_lead
from ..plan.elastic_config import node_request
from ..plan.markers import Marker
from ..plan.names import parse_worker_job_name, worker_job_name
from ..plan.node_phase import LIVE, NodePhase, Slurm, end_of, marker_test, node_phase
from ..plan.node_record import NodeRecord
from ..plan.provider_config import ClusterConfigError, ProviderConfig
from ..plan.sbatch import SbatchRequest, elastic_node_id, parse_elastic_node_id
from ..runtime.cluster_state import ClusterState, ClusterStoppingError
from ..runtime.launch import node_env, signal_node
from ..runtime.slurm_jobs import batch_script, cancel_jobs, requeue_job, submit
from ..slurm.client import SlurmCommandError, known_cluster_name, requeue_state
from ..slurm.hostlist import expand
from ..slurm.scontrol import ENDS, PREEMPTED_REQUEUE
from ..slurm.squeue import JobInfo
from ..slurm.walltime import WalltimeError, cut_short, parse_duration, parse_timestamp
from .listings import JobListing
from .views import Answer, PoolView, ReadOnlyTags, Round, WorkerJobs, adopted_tags

logger = logging.getLogger(__name__)

#: A submitted job that squeue does not list yet still counts as pending for this long.
SUBMIT_GRACE_SECONDS = 30.0
#: After SLURM refused a node type's job, launches of that type fail this long.
REFUSED_SECONDS = 600.0
#: After a replacement's sbatch failed, it is tried again this much later.
REPLACE_RETRY_SECONDS = 60.0


def pending_news(
    jobs: Mapping[str, JobInfo], cluster: str, head_job: str, said: dict[str, str]
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


class WorkerPool:
    """The worker jobs of one head's cluster: what a round shows of them, launching,
    replacing and terminating them. ``current`` is the provider's round, ``drop`` makes
    the provider read again after a write of the pool's."""

    def __init__(
        self,
        state: ClusterState,
        settings: ProviderConfig,
        python: str,
        *,
        on_head: bool,
        current: Callable[[], Round],
        drop: Callable[[], None],
    ) -> None:
        self.state = state
        self.cluster_name = state.cluster_name
        self.job_id = state.job_id
        self.settings = settings
        self.python = python
        #: replacements come from the head's autoscaler alone, never from a CLI's provider
        #: (`ray down` must not submit jobs)
        self.on_head = on_head
        self._current, self._drop = current, drop
        self.listing = JobListing(self.cluster_name)
        self._seen: dict[str, JobInfo] | None = None
        self._workers: tuple[dict[str, JobInfo] | None, WorkerJobs] = (None, {})
        self._pending_said: dict[str, str] = {}
        self._replaced_for: dict[str, JobInfo] | None = None
        #: (job, run) of worker jobs whose Ray ended unseen, asked of SLURM once each
        self._exit_asked: set[tuple[str, str]] = set()
        self._replace_retry: dict[str, float] = {}
        #: each running worker job's latest planned end: one that moves earlier was cut short
        self._planned_ends: dict[str, float] = {}

    @staticmethod
    def owns(node_id: str) -> bool:
        return parse_elastic_node_id(node_id) is not None

    # ------------------------------------------------------------------ squeue
    def jobs(self) -> dict[str, JobInfo]:
        """The cluster's jobs as squeue last listed them; a new listing is reported on
        (pending reasons, jobs that cannot start) once."""
        jobs = self.listing.get()
        if jobs is not self._seen:
            self._seen = jobs
            self._report_pending(jobs)
            try:
                self._report_stuck(jobs)
            except SlurmCommandError as e:
                logger.warning("could not give up on stuck jobs: %s", e)
        return jobs

    def worker_jobs(self, jobs: dict[str, JobInfo]) -> WorkerJobs:
        """The live worker jobs of this head in ``jobs``, computed once per listing."""
        if self._workers[0] is not jobs:
            out = {}
            for job in jobs.values():
                parsed = parse_worker_job_name(job.name, self.cluster_name)
                if parsed and parsed[0] == self.job_id and job.live:
                    out[job.job_id] = (job, parsed[1])
            self._workers = (jobs, out)
        return self._workers[1]

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

    def check_refused(self, node_type: str) -> None:
        refused = self.state.read().get("refused", {}).get(node_type)
        if refused and time.time() - refused["at"] < REFUSED_SECONDS:
            raise SlurmCommandError(
                f"SLURM does not start {node_type} jobs: job {refused['job']} waited for "
                f"{refused['reason']} and was cancelled; fix available_node_types.{node_type}"
                f".node_config.sbatch (retried {REFUSED_SECONDS:.0f} s after the refusal)"
            )

    # ------------------------------------------------------------------ the round
    def view(
        self, records: Mapping[str, NodeRecord], markers: frozenset[str], jobs: dict[str, JobInfo], now: float
    ) -> PoolView:
        """The worker nodes of one read: alive while their job is live in squeue (pending
        or running), not terminated and their Ray has not ended, a job just submitted
        counting as pending until squeue lists it (at most SUBMIT_GRACE_SECONDS); of a
        pair, the node the autoscaler is to count (``drain.paired_visibility``)."""
        workers = self.worker_jobs(jobs)
        candidates = {
            elastic_node_id(job.job_id, index): (job.job_id, index)
            for job, _node_type in workers.values()
            for index in range(max(job.num_nodes, 1))
        }
        for node_id, record in records.items():
            parsed = parse_elastic_node_id(node_id)
            if record.elastic and parsed:
                candidates.setdefault(node_id, parsed)

        def alive(node_id: str, job: str, index: int) -> bool:
            rec = records.get(node_id)
            found = workers.get(job)
            if found is None and rec is None:
                return False
            if found is not None:
                slurm = Slurm.QUEUED if found[0].state == "PENDING" else Slurm.RUNS
                if index >= max(found[0].num_nodes, 1):
                    slurm = Slurm.NOT_THERE  # SLURM runs fewer nodes of the job
            else:
                slurm = Slurm.ENDED if job in jobs else Slurm.UNLISTED  # listed but ended: gone at once
            grace = rec is not None and now - rec.created < SUBMIT_GRACE_SECONDS
            return end_of(rec, marker_test(node_id, markers), slurm, grace) is None

        live = [i for i, (job, index) in candidates.items() if alive(i, job, index)]
        successors = {i: r.replaces for i, r in records.items() if r.replaces}
        shown = live
        if successors:
            ready = [
                i
                for i in successors
                if Marker.STANDBY.file(i) in markers or Marker.HANDOVER.file(i) in markers
            ]
            handed = [i for i in successors if Marker.HANDOVER.file(i) in markers]
            drained = [old for old in successors.values() if Marker.DRAIN.file(old) in markers]
            hidden = paired_visibility(successors, live, ready, handed, drained)
            shown = [i for i in live if i not in hidden]
        answers: dict[str, Answer] = {}
        for node_id in shown:
            found = workers.get(candidates[node_id][0])
            rec = records.get(node_id)
            answers[node_id] = (
                ReadOnlyTags(rec.tags if rec else adopted_tags(found)),
                bool(found and found[0].state == "RUNNING"),
            )
        standing_by = frozenset(i for i in live if Marker.STANDBY.file(i) in markers)
        return PoolView(workers, answers, successors, frozenset(live), standing_by)

    def internal_ip(self, node_id: str) -> str:
        """Not cached: a requeued job's node comes back, maybe on another SLURM node."""
        ip = self.state.read_marker(node_id, Marker.IP)
        if ip:
            return ip
        job, index = parse_elastic_node_id(node_id) or ("", 0)
        found = self._current().pool.workers.get(job)
        if found and found[0].nodelist:
            names = expand(found[0].nodelist)
            if index < len(names):
                return names[index]
        return node_id

    def before_round(self) -> None:
        """On the head, once per squeue listing: submit the replacements of worker jobs
        that near their end (``replace_ending``)."""
        if not (self.on_head and self.state.exists()):
            return
        jobs = self.jobs()
        if jobs is not self._replaced_for:
            self._replaced_for = jobs
            self._replace_ending(jobs)
            self._requeue_exited(jobs)

    def _requeue_exited(self, jobs: dict[str, JobInfo]) -> None:
        """Worker jobs SLURM still lists whose every node's Ray has ended (an exit marker)
        before the autoscaler let them go: a node whose Ray ended is no longer listed, so the
        autoscaler never will (a late round on a loaded head; a preempted node drains and
        ends within seconds). Those SLURM runs again (a preemption that requeues) are
        requeued now, as ``terminate`` does, while still in their grace time, and hidden
        until they run again; the others are left to end. One ``scontrol`` per job and run;
        a SLURM that does not answer is asked again next round."""
        workers = self.worker_jobs(jobs)
        records = self.state.records()
        markers = self.state.markers()
        by_job: dict[str, list[str]] = {}
        for node_id, rec in records.items():
            parsed = parse_elastic_node_id(node_id)
            hidden = rec.requeued and Marker.RERUN.file(node_id) not in markers
            if parsed and rec.elastic and parsed[0] in workers and not (rec.terminated or hidden):
                by_job.setdefault(parsed[0], []).append(node_id)
        ended = {job: ids for job, ids in by_job.items() if all(Marker.EXIT.file(i) in markers for i in ids)}
        runs = {job: (job, self.state.read_marker(ids[0], Marker.RERUN) or "") for job, ids in ended.items()}
        exited = {job: ids for job, ids in ended.items() if runs[job] not in self._exit_asked}
        if not exited:
            return
        try:
            requeued = self._requeued(list(exited), exited)
        except SlurmCommandError as e:
            logger.warning("could not ask SLURM whether jobs %s run again: %s", ", ".join(exited), e)
            return
        self._exit_asked.update(runs[job] for job in exited)
        if requeued:
            self.state.end_jobs({job: exited[job] for job in requeued}, requeued)
            self.listing.expire()
            self._drop()

    def after_round(self, listed: Round) -> None:
        """Tell each replacement that this listing shows it to the autoscaler in place of
        the node it replaces (its ``handover`` marker): its ``node_run``, standing by, starts
        Ray now. Written after the listing, so that the autoscaler knows the node before
        its Ray joins (a Ray node it does not know of is taken for one too many). A node
        that stands by without a record of what it replaces (adopted after the state was
        lost) is handed over once shown, too, rather than standing by for nothing."""
        if not (self.on_head and self.state.exists()):
            return
        pool = listed.pool
        waiting = frozenset(pool.successors) | pool.standing_by
        if not waiting:
            return
        markers = self.state.markers()
        for node_id in waiting:
            if node_id not in listed.shown or Marker.HANDOVER.file(node_id) in markers:
                continue
            try:
                self.state.write_marker(node_id, Marker.HANDOVER, str(time.time()))
                rec = listed.records.get(node_id)
                replaces = (rec.replaces if rec else "") or "a node whose record was lost"
                logger.info("%s takes over from %s", node_id, replaces)
            except OSError as e:  # tried again with the next listing
                logger.warning("could not hand over to %s: %s", node_id, e)

    # ------------------------------------------------------------------ launch
    def submit_workers(self, node_config: dict[str, Any], tags: dict[str, str], count: int) -> None:
        """``create_node`` of ``count`` workers: ``ceil(count / nodes)`` jobs."""
        node_type = tags[TAG_RAY_USER_NODE_TYPE]
        request = node_request(self.settings, node_config, node_type)
        self.check_refused(node_type)
        self.state.create(slurm_cluster=None if self.state.exists() else known_cluster_name(os.environ))
        self._submit_jobs(node_type, node_config, request, tags, -(-count // request.nodes))

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
        image = self.settings.container.image if self.settings.container else ""
        script = batch_script(self.python, self.state.container(), self.cluster_name, image)
        submitted: list[tuple[str, float]] = []

        try:
            for _ in range(n_jobs):
                job = submit(
                    request,
                    name,
                    script,
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
                self._drop()

    def _signal_lead(self, request: SbatchRequest) -> float:
        """The ``--signal`` lead of a worker job (``drain.worker_lead``)."""
        try:
            limit = parse_duration(request.time) if request.time else None
        except WalltimeError:
            limit = None  # sbatch's own reading of it: SLURM says at submission
        replaced = self.settings.replace_before_end_s > 0
        return worker_lead(self.settings.drain_before_end_s, limit, replaced)

    # ------------------------------------------------------------------ replace
    def _forget_failed_replacements(self, markers: frozenset[str]) -> None:
        """Forget the pairs whose replacement ended before it was handed over
        (``drain.failed_replacements``): the old node, shown all along, is replaced
        again ``REPLACE_RETRY_SECONDS`` later, while its end is still ahead."""
        pool = self._current().pool
        handed = [i for i in pool.successors if Marker.HANDOVER.file(i) in markers]
        failed = failed_replacements(dict(pool.successors), pool.alive, handed)
        if not failed:
            return

        self.state.forget_replacements(failed)
        self._drop()
        for new, old in failed.items():
            old_job = (parse_elastic_node_id(old) or ("", 0))[0]
            self._replace_retry[old_job] = time.time() + REPLACE_RETRY_SECONDS
            again = f": replaced again in {REPLACE_RETRY_SECONDS:.0f} s" if old in pool.alive else ""
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
        self._forget_failed_replacements(self.state.markers())
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
                self.check_refused(due.node_type)
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
    def terminate(self, node_ids: list[str]) -> None:
        """Let worker nodes go: a whole job is cancelled (unless SLURM requeues it), a node
        of a job whose other nodes are still wanted is signalled alone; a replacement not
        handed over yet goes with the node it was to replace."""
        by_job: dict[str, list[str]] = {}
        for node_id in node_ids:
            parsed = parse_elastic_node_id(node_id)
            if parsed:
                by_job.setdefault(parsed[0], []).append(node_id)
        if not by_job:
            return
        listed = self._current()
        jobs = listed.pool.workers
        records = self.state.records()

        def terminated(node_id: str) -> bool:
            return node_id in records and records[node_id].terminated

        for ids in list(by_job.values()):
            for node_id in ids:
                successor = records[node_id].successor if node_id in records else ""
                parsed = parse_elastic_node_id(successor) if successor else None
                if parsed and successor not in listed.shown and not terminated(successor):
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
                    signal_node(self.state, node_id, job)
            else:
                whole.append(job)
        requeued = self._requeued(whole, by_job)
        cancel_jobs([job for job in whole if job not in requeued])

        if self.state.exists():
            self.state.end_jobs(by_job, requeued)
        self.listing.expire()
        self._drop()

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
