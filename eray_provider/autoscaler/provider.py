"""``SlurmNodeProvider``: a SLURM allocation as a Ray cluster, for Ray's cluster launcher.

Use ``provider: {type: external, module: eray_provider.SlurmNodeProvider}``. Head =
first node of the job, workers = the others, each with exactly its SLURM share. Ray
nodes are reached with srun (``SrunCommandRunner``), never ssh; each lives in a step of
its own that dies with the job. All state is in ``ClusterState`` because Ray builds a
provider in every CLI process and in the head's monitor.

Ray's autoscaler asks ``non_terminated_nodes`` once a round, then ``node_tags`` and
``is_running`` of every node: as Ray's ``BatchingNodeProvider`` does, the provider reads
once per round (the records, the marker listing, squeue's listings: a ``Round``) and
answers every per-node call from it, a dict lookup each at 10,000 nodes. The elastic
provider's worker jobs are a part of its own (``worker_pool``): each per-node call goes
to the part that owns the node.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ray.autoscaler.node_provider import NodeProvider
from ray.autoscaler.tags import (
    NODE_KIND_HEAD,
    NODE_KIND_WORKER,
    STATUS_UP_TO_DATE,
    STATUS_UPDATE_FAILED,
    TAG_RAY_NODE_KIND,
    TAG_RAY_NODE_NAME,
    TAG_RAY_NODE_STATUS,
    TAG_RAY_USER_NODE_TYPE,
)

from ..plan.cluster_config import fill_config, gone_config
from ..plan.markers import Marker
from ..plan.names import check_cluster_name
from ..plan.node_phase import Slurm, end_of, marker_test
from ..plan.node_record import NodeRecord, tags_match
from ..plan.node_spec import worker_types
from ..plan.provider_config import (
    Filled,
    ProviderConfig,
    elastic_module,
    is_filled,
    ray_cache_path,
    set_ray_cache_path,
    update_filled,
)
from ..runtime import stop_signals
from ..runtime.cluster_state import ClusterState, ClusterStoppingError
from ..runtime.launch import (
    STEP_GRACE_SECONDS,
    LaunchError,
    ensure_container_plan,
    ensure_port_plan,
    gcs_alive,
    head_log,
    launch_workers,
    signal_node,
    start_head,
    teardown,
    temp_dir_claim,
    wait_head_ready,
    wait_joined,
)
from ..runtime.ray_compat import cli_logger, require_supported_ray
from ..slurm.allocation import Allocation, AllocationError, JobGoneError
from ..slurm.client import SlurmCommandError, known_cluster_name, running_allocation
from ..slurm.env import job_id_from_env
from ..slurm.squeue import JobInfo
from ..slurm.srun import cancel_steps, job_state
from .command_runner import SrunCommandRunner
from .config_cache import UnsafeConfigCacheError, cache_path, refuse_unsafe, write_private
from .listings import UNKNOWN, StepListing, StepNames
from .views import NO_POOL, Answer, FreshView, ReadOnlyTags, Round

if TYPE_CHECKING:
    from .worker_pool import WorkerPool

logger = logging.getLogger(__name__)

#: The steps of a cluster none of whose nodes was launched: squeue is not asked.
NO_STEPS: StepNames = {}
#: How long Ray's updater thread is held once `ray up` is stopped: the main thread's exit
#: stops the cluster meanwhile; should the main thread have lost the signal (it waits on this
#: thread), it goes on after this and meets the stop in its next provider call.
STOP_PARK_SECONDS = 30.0
#: How long ``ray up`` waits for the workers launched with the head to join.
WORKERS_JOIN_TIMEOUT = 300.0
#: How long a node also answers to the tags a racing create_node asked for.
REQUESTED_TAGS_SECONDS = 120.0
_CACHES_TO_REMOVE: set[str] = set()


def start_fillout(cluster_config: dict[str, Any]) -> str | None:
    """Both providers' first step of Ray's fillout: this Ray is one we support, the
    cluster's name is valid; None when the config is filled already, else the path of
    Ray's config cache for it (Ray's key: the config as Ray hashed it, before filling)."""
    require_supported_ray()
    if is_filled(cluster_config["provider"]):
        return None
    check_cluster_name(cluster_config.get("cluster_name"))
    return cache_path(cluster_config)


def gone_cluster(cluster_config: dict[str, Any], job: str, error: JobGoneError, cache: str) -> dict[str, Any]:
    """The config of a cluster whose job has ended (``gone_config``): ``ray down`` and
    friends then report it gone rather than fail. ``job_id_from_config`` as for a running
    job: a YAML naming the job is never taken for a stale cache of another one."""
    logger.warning("%s: the cluster on it is gone", error)
    from_config = (
        ProviderConfig.from_dict(
            cluster_config["provider"], elastic=elastic_module(cluster_config["provider"])
        ).job_id
        is not None
    )  # the user's section: gone_config writes the job it names into it
    filled = gone_config(cluster_config, job, str(error))
    update_filled(filled["provider"], job_id_from_config=from_config, cache_path=cache)
    return filled


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _say(line: str) -> None:
    cli_logger.print(f"eray-provider: {line}")


def _tell(line: str) -> None:
    """A line on stderr at exit, when Ray's logger has ended; a closed terminal (the
    SIGHUP case) or a pipe whose reader died must not stop what follows."""
    with contextlib.suppress(OSError, ValueError):
        print(f"eray-provider: {line}", file=sys.stderr, flush=True)


class SlurmNodeProvider(NodeProvider):
    #: this `ray up` began the cluster's start (``_own_start``), and saw it end
    _start_owned = False
    _started_here = False

    def __init__(self, provider_config: dict[str, Any], cluster_name: str) -> None:
        super().__init__(provider_config, cluster_name)
        self.settings = ProviderConfig.from_dict(provider_config)
        job = self.settings.job_id
        if not job:
            raise AllocationError("provider.job_id is missing: the config was not bootstrapped")
        self._check_cached_config(provider_config, job)
        self.python = self.settings.python or "python3"
        self._bind(job)
        if Filled.of(provider_config).job_gone:
            # SLURM ended every process of the job; what is left is our bookkeeping
            self.state.remove()

    def _bind(self, job_id: str) -> None:
        """Attach to the cluster of ``job_id`` (the job that holds the head)."""
        self.job_id = job_id
        self.state = ClusterState(self.cluster_name, job_id, self.settings.state_dir)
        self.steps = StepListing(job_id)
        #: the round being read (``_fresh_round``), and the answers of the last listing's
        #: (a field of their own: a dict lookup is all a per-node call of a round costs)
        self._view: FreshView[Round] = FreshView()
        self._answers: Mapping[str, Answer] = {}
        self._ips: dict[str, str] = {}
        self.pool = self._worker_pool()

    def _worker_pool(self) -> WorkerPool | None:
        """The part that owns the elastic worker nodes; none in a fixed allocation."""
        return None

    def _drop_views(self) -> None:
        """After this provider's own writes, and under the lock where other processes'
        writes must count: the next call reads the state file again."""
        self._view.drop()
        self._answers = {}

    @staticmethod
    def _check_cached_config(provider_config: dict[str, Any], job: str | None) -> None:
        """Ray caches bootstrapped configs in /tmp keyed by the YAML's content, so a cache
        written in one job would silently be reused in the next. The cache is removed when
        this process exits, a cache that is not provably ours (``config_cache``) is
        refused, and a cache from another job (a crash, an older version) is refused and
        removed. ``job``: the section's ``provider.job_id``."""
        cache = ray_cache_path(provider_config)
        if not cache:
            return
        try:
            refuse_unsafe(cache)  # before anything of the cached config is used
        except UnsafeConfigCacheError as e:
            cli_logger.abort(str(e))
        if cache not in _CACHES_TO_REMOVE:
            _CACHES_TO_REMOVE.add(cache)
            atexit.register(_unlink_quietly, cache)
        env_job = job_id_from_env(os.environ)
        if not Filled.of(provider_config).job_id_from_config and env_job not in (None, job):
            _unlink_quietly(cache)
            raise AllocationError(
                f"Ray's cached config {cache} is for job {job}, but this "
                f"is job {env_job}; the stale cache was removed: run the command again "
                "(or pass --no-config-cache)"
            )

    # ------------------------------------------------------------------ config
    @staticmethod
    def fillout_available_node_types_resources(cluster_config: dict[str, Any]) -> dict[str, Any]:
        """Called by Ray before validation: fill node types from the SLURM allocation."""
        cache = start_fillout(cluster_config)
        if cache is None:
            return cluster_config
        job = ProviderConfig.from_dict(cluster_config["provider"], elastic=False).job_id
        try:
            alloc = running_allocation(job)
        except JobGoneError as e:
            return gone_cluster(cluster_config, str(job or job_id_from_env(os.environ)), e, cache)
        filled = fill_config(cluster_config, alloc)
        update_filled(filled["provider"], job_id_from_config=job is not None, cache_path=cache)
        return filled

    @staticmethod
    def bootstrap_config(cluster_config: dict[str, Any]) -> dict[str, Any]:
        """The last step before Ray writes its config cache: create that file ourselves,
        private, so Ray's write never follows a planted link or lands in another user's
        file (see ``config_cache``)."""
        path = Filled.of(cluster_config["provider"]).cache_path
        if path:
            set_ray_cache_path(cluster_config["provider"], path)
            try:
                write_private(path, cluster_config)
            except UnsafeConfigCacheError as e:
                cli_logger.abort(str(e))
        return cluster_config

    def prepare_for_head_node(self, cluster_config: dict[str, Any]) -> dict[str, Any]:
        """The head's copy of the config does not name the launcher's config cache: that
        path means nothing on the head node (whose /tmp another user could fill)."""
        set_ray_cache_path(cluster_config["provider"], None)
        return cluster_config

    # ------------------------------------------------------------------ the round
    def _records(self) -> Mapping[str, NodeRecord]:
        return self.state.records()

    def _fresh_round(self) -> Round:
        """The round of what the state and SLURM say now: read again only when
        ``READ_FRESH_SECONDS`` have passed or this provider wrote, and rebuilt only when
        one of its inputs is another object (the state file, the marker listing and the
        squeue listings hand out the same object while nothing changed)."""
        return self._view.get(self._round_inputs, self._build_round)

    def _round_inputs(
        self,
    ) -> tuple[Mapping[str, NodeRecord], frozenset[str], StepNames | None, dict[str, JobInfo] | None]:
        records = self._records()
        markers = self.state.markers()
        needs_steps = any(r.launched and not r.terminated for r in records.values())
        steps = self.steps.by_name() if needs_steps else NO_STEPS
        jobs = self.pool.jobs() if self.pool is not None else None
        return records, markers, steps, jobs

    def _build_round(
        self,
        records: Mapping[str, NodeRecord],
        markers: frozenset[str],
        steps: StepNames | None,
        jobs: dict[str, JobInfo] | None,
    ) -> Round:
        """The allocation's live nodes (``node_phase.end_of``: SLURM's word is the listing
        of the job's steps; None: the job has ended; ``UNKNOWN``: no answer yet), then
        the worker pool's, with their answers; one pass over the records, whatever N."""
        now = time.time()
        answers: dict[str, Answer] = {}
        for node_id, rec in records.items():
            if rec.elastic:
                continue  # the pool's
            if steps is None:
                slurm = Slurm.ENDED
            elif steps is UNKNOWN:
                slurm = Slurm.UNKNOWN
            else:
                slurm = Slurm.RUNS if rec.step_name in steps else Slurm.UNLISTED
            grace = now - rec.launched < STEP_GRACE_SECONDS
            if end_of(rec, marker_test(node_id, markers), slurm, grace) is None:
                answers[node_id] = (ReadOnlyTags(rec.tags), bool(rec.launched))
        pool = NO_POOL
        if self.pool is not None and jobs is not None:
            pool = self.pool.view(records, markers, jobs, now)
            answers.update(pool.answers)
        return Round(records, answers, frozenset(answers), pool)

    def non_terminated_nodes(self, tag_filters: dict[str, str]) -> list[str]:
        """The live nodes. Their tags and running state are kept as this round's answers
        to ``node_tags`` and ``is_running``, as Ray's own cloud providers cache them from
        their last listing: the autoscaler asks both of every node right after this call,
        and a dict lookup each is what 10,000 nodes can afford. The pool submits the
        replacements of worker jobs near their end before the listing, and hands over to
        those the listing shows after it."""
        stop_signals.check()  # `ray up`'s main thread polls here for the head: a lost stop
        if self.pool is not None:
            self.pool.before_round()
        listed = self._fresh_round()
        self._answers = listed.answers
        if self.pool is not None:
            self.pool.after_round(listed)
        if not tag_filters:
            return list(listed.answers)
        records, now = self._records(), time.time()  # the tags a racing `ray up` asked for
        return [
            i
            for i, (tags, _) in listed.answers.items()
            # a node without a record (an adopted elastic worker) has its answered tags only
            if (
                records[i].answers_to(tag_filters, now, REQUESTED_TAGS_SECONDS)
                if i in records
                else tags_match(tags, tag_filters)
            )
        ]

    def is_running(self, node_id: str) -> bool:
        answer = self._answers.get(node_id)
        return answer[1] if answer is not None else self._fresh_round().running(node_id)

    def is_terminated(self, node_id: str) -> bool:
        """Not from the last listing: Ray's updater polls it alone, in wait loops."""
        return node_id not in self._fresh_round().shown

    def node_tags(self, node_id: str) -> dict[str, str]:
        """The node's tags: when listed, a read-only dict (``ReadOnlyTags``, shared between
        calls), else a copy."""
        answer = self._answers.get(node_id)
        return answer[0] if answer is not None else self._fresh_round().tags_of(node_id)

    def internal_ip(self, node_id: str) -> str:
        """The address the node's Ray runs on; for the allocation's nodes cached, because
        Ray's autoscaler asks it of every node each round and such a node id's address
        never changes (a node started again gets a new id)."""
        if self.pool is not None and self.pool.owns(node_id):
            return self.pool.internal_ip(node_id)
        if node_id in self._ips:
            return self._ips[node_id]
        ip = self.state.read_marker(node_id, Marker.IP)
        if ip:
            self._ips[node_id] = ip
            return ip
        rec = self._records().get(node_id)
        return rec.slurm_node if rec else node_id

    def external_ip(self, node_id: str) -> str:
        return self.internal_ip(node_id)

    def set_node_tags(self, node_id: str, tags: dict[str, str]) -> None:
        """Ray's tags of a node, recorded. Of a cluster torn down meanwhile (a `ray down`
        while `ray up` set up the head) ``ClusterStoppingError``, which ends Ray's updater;
        only the failure tag its updater then sets is dropped with a warning: the error
        that failed it was reported, and a second traceback would hide it."""
        try:
            self.state.set_tags(node_id, tags)
        except ClusterStoppingError as e:
            if tags.get(TAG_RAY_NODE_STATUS) != STATUS_UPDATE_FAILED:
                raise
            cli_logger.warning(str(e))
        self._drop_views()

    # ------------------------------------------------------------------ create / terminate
    def _allocation(self) -> Allocation:
        return Filled.of(self.provider_config).head_allocation()

    def create_node(self, node_config: dict[str, Any], tags: dict[str, str], count: int) -> None:
        gone = Filled.of(self.provider_config).job_gone
        if gone:
            raise JobGoneError(f"cannot start a cluster: {gone}")
        wanted = list(node_config.get("slurm_nodes") or [])
        if tags.get(TAG_RAY_NODE_KIND) == NODE_KIND_HEAD:
            try:
                self._create_head(wanted[0], tags)
            except ClusterStoppingError as e:
                cli_logger.abort(str(e))  # `ray up` of a cluster whose `ray down` did not finish
            return None
        self._create_workers(wanted, tags, count)
        return None

    def _create_head(self, slurm_node: str, tags: dict[str, str]) -> str:
        state = self.state
        stop_signals.install()  # SIGTERM and SIGHUP end `ray up` as Ctrl-C does
        if job_state(self.job_id) != "RUNNING":
            raise AllocationError(f"job {self.job_id} is not running: cannot start a cluster on it")
        with state.lock(timeout=300, creating=True):
            state.create(slurm_cluster=known_cluster_name(os.environ))
            state.check_launchable()
            self._drop_views()  # under the lock: what other processes wrote counts
            live = self.non_terminated_nodes({TAG_RAY_NODE_KIND: NODE_KIND_HEAD})
            if live:
                # a racing `ray up` created it: let this caller find it under its own tags
                logger.info("head %s already exists", live[0])

                state.mark_requested(live[0], tags)
                return live[0]
            self._own_start()
            alloc = self._allocation()
            ensure_container_plan(state, self.settings, alloc)
            ensure_port_plan(state, alloc, self.python, temp_dir_claim(self.settings))
            state.save_cluster_config({"provider": self.provider_config})
            (node_id,) = state.add_nodes([(slurm_node, "head", tags)])
        self._drop_views()
        self._start_workers_with_head()
        return node_id

    def _start_workers_with_head(self) -> None:
        """A cluster of fixed nodes starts every node at once: the workers that the head's
        autoscaler would launch once the head is up (``min_workers`` of each type, that
        is every node of the allocation) are launched now, with the head, and wait on
        their nodes for its GCS (``node_run.wait_for_head``). The autoscaler finds them
        among this provider's nodes and adopts them (Ray matches its nodes to them by
        ``RAY_CLOUD_INSTANCE_ID``); a worker that ends later is replaced by it."""
        for node_type, shares in worker_types(self._allocation()).items():
            tags = {
                TAG_RAY_NODE_KIND: NODE_KIND_WORKER,
                TAG_RAY_USER_NODE_TYPE: node_type,
                TAG_RAY_NODE_NAME: f"ray-{self.cluster_name}-worker",
            }
            self._create_workers([s.name for s in shares], tags, len(shares))

    def _create_workers(self, candidates: list[str], tags: dict[str, str], count: int) -> None:
        tags = {**tags, TAG_RAY_NODE_STATUS: STATUS_UP_TO_DATE}
        drained = self.state.drained()
        if drained:
            # the job ends within the drain lead (end_watch drained its workers, whose
            # raylets stop once idle): a new node would be drained again at once
            logger.info("not launching %d worker(s): %s", count, drained)
            return
        with self.state.lock(timeout=120):
            self.state.check_launchable()
            self._drop_views()  # under the lock: what other processes wrote counts
            alive = self._fresh_round().shown
            busy = {rec.slurm_node for node_id, rec in self._records().items() if node_id in alive}
            free = [n for n in candidates if n not in busy][:count]
            if len(free) < count:
                logger.warning("asked for %d workers, only %d SLURM nodes are free", count, len(free))
            if not free:
                return
            ids = dict(zip(free, self.state.add_nodes([(n, "worker", tags) for n in free])))
            batch = self.state.read()["next_gen"]
        self._drop_views()
        launch_workers(self.state, ids, tags[TAG_RAY_USER_NODE_TYPE], self.python, batch)

    def launch_head_node(self, node_id: str, extra_env: dict[str, str]) -> None:
        """The head's start command under ``ray up``: start it, wait until it is alive, then
        (``provider.wait_for_workers``, default true) until the workers launched with it
        have joined, and say how many nodes are alive."""
        rec = self._records()[node_id]
        launched = [i for i, r in self._records().items() if r.fixed_worker and r.launched]
        workers = launched if self.settings.wait_for_workers else []
        try:
            proc = start_head(self.state, node_id, rec.slurm_node, extra_env, self.python)
            watch = wait_head_ready(
                self.state,
                node_id,
                proc,
                head_log(self.state, node_id),
                workers=workers,
                workers_timeout=WORKERS_JOIN_TIMEOUT,
            )
        except (LaunchError, ClusterStoppingError) as e:
            if stop_signals.stopping():
                # stopped: the main thread's exit stops the cluster; this thread (Ray's
                # updater) must not go on to tag or report it meanwhile
                threading.Event().wait(STOP_PARK_SECONDS)
                return
            self._start_owned = False  # failed, not stopped: `ray down` removes it
            cli_logger.abort(str(e))
        address = watch.address
        logger.info("head %s alive at %s", node_id, address)
        with watch:
            if not workers:
                cli_logger.print(
                    f"eray-provider: head alive at {address}; {len(launched)} worker(s) starting"
                )
                return
            total = len(workers) + 1
            try:
                stopped = stop_signals.stopping
                wait_joined(self.state, watch, workers, WORKERS_JOIN_TIMEOUT, stopped, say=_say, already=1)
                counted = f"{total} of {total} nodes alive"
            except (LaunchError, TimeoutError) as e:
                cli_logger.warning(f"{e}; the head's autoscaler replaces workers that end")
                alive = gcs_alive(self.state, address)
                counted = (
                    f"{len(alive)} of {total} nodes alive" if alive is not None else "the GCS did not answer"
                )
            _say(f"{counted} (head at {address})")
        self._start_owned = False
        self._started_here = True

    def _own_start(self) -> None:
        """From here this `ray up` owns the cluster's start: stopped (Ctrl-C, SIGTERM,
        SIGHUP) before the start ends, its exit stops what it began."""
        if not self._start_owned:
            self._start_owned = True
            atexit.register(self._stop_unfinished_start)

    def _stop_unfinished_start(self) -> None:
        """At the exit of a `ray up` that a stop signal ended before the cluster it began was
        up: stop that cluster (steps, temp dirs, state; an elastic head's job it submitted),
        so that nothing is left running half-started; the process then ends by that signal
        (``stop_signals.install``). A `ray up` that found the head another started leaves
        it; one that failed or finished leaves its cluster to `ray down`."""
        if not stop_signals.received:
            return
        name = signal.Signals(stop_signals.received[0]).name
        with stop_signals.shielded():
            if not self._start_owned:
                if self._started_here:
                    _tell(f"{name} after the cluster came up: `ray down` stops it")
                return
            _tell(f"{name} during `ray up`: stopping the cluster it began")
            try:
                self._stop_started()
                _tell("stopped; nothing of it is left")
            except Exception as e:  # whatever it is, said; the next `ray down` finishes
                _tell(f"error: {e}; `ray down` finishes the teardown")

    def _stop_started(self) -> None:
        """What an interrupted `ray up` stops: the cluster's steps, temp dirs and state."""
        teardown(self.state)

    def stop_all(self) -> None:
        """``ray stop`` of this cluster: its steps only, then temp dirs and state
        (``launch.teardown``; the state stays when SLURM cannot say the steps ended).
        SIGTERM and SIGHUP stop `ray down` as Ctrl-C does; the next one finishes it."""
        stop_signals.install()
        teardown(self.state)

    def cleanup_cluster_resources(self) -> None:
        """The end of ``ray down``, once no node remains (Ray calls it then): a teardown that
        was interrupted (Ctrl-C, a ``TeardownError``) left the state "stopping" with nodes
        that have all exited, so Ray finds nothing to stop and never reaches ``stop_all``;
        it is finished here, so that the next ``ray up`` starts afresh. Nothing when the
        state is gone (the usual case: ``stop_all`` ran)."""
        stop_signals.install()
        teardown(self.state)

    def terminate_node(self, node_id: str) -> None:
        self.terminate_nodes([node_id])

    def terminate_nodes(self, node_ids: list[str]) -> None:
        """Worker jobs go through the pool; the allocation's nodes by their steps: a step
        whose every live node goes is cancelled whole, a node of a step that stays is
        signalled alone."""
        if self.pool is not None:
            self.pool.terminate([i for i in node_ids if self.pool.owns(i)])
            node_ids = [i for i in node_ids if not self.pool.owns(i)]
        records = self._records()
        targets = [i for i in node_ids if i in records]
        if not targets:
            return
        steps = self.steps.answered()  # squeue asked now if it has never answered
        if steps is UNKNOWN:
            raise SlurmCommandError(
                f"cannot terminate {targets}: squeue does not answer for job {self.job_id}"
            )
        steps = steps or {}
        by_step: dict[str, list[str]] = {}
        for node_id in targets:
            by_step.setdefault(records[node_id].step_name, []).append(node_id)
        whole = []
        for step_name, ids in by_step.items():
            # members already terminated do not keep the step from being cancelled whole
            members = [i for i, r in records.items() if r.step_name == step_name and not r.terminated]
            if step_name and set(members) <= set(ids):
                whole += [sid for sid, name in steps.items() if name == step_name]
            else:
                for node_id in ids:
                    signal_node(self.state, node_id, self.job_id)
        cancel_steps(whole, self.job_id, wait=60)

        self.state.mark_terminated(targets)
        self._drop_views()
        if all(r.terminated for r in self.state.records().values()):
            self.stop_all()

    # ------------------------------------------------------------------ runner
    def get_command_runner(
        self,
        log_prefix: str,
        node_id: str,
        auth_config: dict[str, Any],
        cluster_name: str,
        process_runner: Any,
        use_internal_ip: bool,
        docker_config: dict[str, Any] | None = None,
    ) -> SrunCommandRunner:
        rec = self._records().get(node_id)
        slurm_node = rec.slurm_node if rec else self._allocation().head.name
        return SrunCommandRunner(
            self.state,
            node_id,
            slurm_node,
            launch_head=self.launch_head_node,
            stop_cluster=self.stop_all,
        )
