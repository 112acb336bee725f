"""Parse what ``scontrol`` prints: jobs (``show job -d``), config, step lists, and whether
SLURM puts a job back in the queue (``requeue_verdict``).

Pure text-in, values-out; running the commands lives in ``slurm.client``. The job parser
is the only per-node source of CPUs, memory and GPU indices for nodes other than the
one we run on, so it reads the ``-d`` detail lines (``Nodes=... CPU_IDs=... Mem=...
GRES=...``) rather than the job-wide totals.
"""

from __future__ import annotations

import re
from dataclasses import replace

from .allocation import (
    Allocation,
    AllocationError,
    JobGoneError,
    NodeShare,
    add_shares,
    memory_mib,
    one_gpu_type,
    parse_gpu_spec,
)
from .forms import REQUEUE_STATES, UNKNOWN
from .hostlist import HostlistError, expand
from .walltime import WalltimeError, parse_duration, parse_timestamp

_FIELD = re.compile(r"(?:^|\s)([A-Za-z_:/]+)=(\S*)")
_GRES_ITEM = re.compile(r"([^,(]+)(?:\(([^)]*)\))?")


def _records(text: str) -> list[str]:
    """Split multi-record output (heterogeneous jobs print one record per component)."""
    return [r for r in re.split(r"\n\s*\n", text.strip()) if r.strip()]


def _int_list(expr: str) -> list[int]:
    """``0-1,4,6-7`` -> [0, 1, 4, 6, 7] (CPU_IDs, GPU IDX)."""
    out: list[int] = []
    for part in expr.split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise AllocationError(f"cannot read id list {expr!r}")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _gres_gpus(value: str) -> tuple[str | None, int, tuple[int, ...] | None]:
    """``gpu:a100:2(IDX:0-1)`` (possibly among other GRES) -> (type, count, ids)."""
    types: list[str | None] = []
    count = 0
    ids: list[int] | None = None
    for m in _GRES_ITEM.finditer(value):
        name, detail = m.group(1).strip(","), m.group(2)
        if not (name == "gpu" or name.startswith("gpu:")):
            continue
        if name == "gpu":
            name = "gpu:0"
        t, c = parse_gpu_spec(name, "GRES")
        if detail and detail.startswith("IDX:"):
            idx = [] if detail[4:] in ("", "N/A") else _int_list(detail[4:])
            ids = (ids or []) + idx
            c = len(idx)
        if c:
            types.append(t)
        count += c
    return one_gpu_type(types), count, tuple(ids) if ids is not None else None


def _memory_mb(value: str) -> int | None:
    """``500``, ``500M``, ``4G`` -> MiB; ``0`` (memory not tracked) -> None."""
    mib = memory_mib(value, decimals=True)
    if mib is None:
        raise AllocationError(f"cannot read memory {value!r} from scontrol")
    return int(mib) or None


def parse_fields(record: str) -> dict[str, str]:
    """``Key=Value`` pairs of one record; the first occurrence of a key wins."""
    fields: dict[str, str] = {}
    for key, value in _FIELD.findall(record):
        fields.setdefault(key, value)
    return fields


def being_preempted(job: dict[str, str]) -> bool:
    """A running job that SLURM preempts (``PreemptTime`` set): it runs out its grace."""
    return job.get("JobState") == "RUNNING" and job.get("PreemptTime", "").strip() not in UNKNOWN


#: ``requeue_verdict``'s answers: SLURM ends the job; it is being preempted and SLURM will
#: requeue it at the end of its grace time (whoever ends it before must requeue it, not
#: cancel it); it is requeued already (it pends, or is being put back).
ENDS, PREEMPTED_REQUEUE, REQUEUED = "ends", "preempted-requeue", "requeued"


def requeue_verdict(job: dict[str, str], partition_preempt_mode: str) -> str:
    """Whether SLURM runs this job again rather than ending it, from its ``scontrol show
    job`` fields and its partition's ``PreemptMode``: ``REQUEUED`` when it is being
    requeued, or was and pends (``Restarts`` > 0); ``PREEMPTED_REQUEUE`` when it is being
    preempted (``PreemptTime`` set: it runs out its ``GraceTime``) where preemption
    requeues (``REQUEUE`` in the partition's mode) and the job may be requeued
    (``Requeue=1``: ``sbatch --requeue``, or the site's ``JobRequeue``); else ``ENDS``. A
    preempted job that ends on its own (or is cancelled) during its grace is not requeued."""
    state = job.get("JobState", "")
    restarts = job.get("Restarts", "0")
    if state in REQUEUE_STATES or (state == "PENDING" and restarts.isdigit() and int(restarts) > 0):
        return REQUEUED
    if (
        being_preempted(job)
        and job.get("Requeue") == "1"
        and "REQUEUE" in partition_preempt_mode.upper().split(",")
    ):
        return PREEMPTED_REQUEUE
    return ENDS


def _this_job(
    parsed: list[tuple[dict[str, str], str]], job_id: str | None
) -> list[tuple[dict[str, str], str]]:
    """The records of one job: ``scontrol show job <array job id>`` lists every task of the
    array (each its own job, ``JobId=`` differing, ``ArrayJobId=`` shared), a heterogeneous
    job one record per component (``HetJobId=`` shared). Records of other jobs are dropped:
    merging them would hand one job the nodes of its sibling tasks."""
    if job_id is not None:
        job = str(job_id)
        array, _, task = job.partition("_")
        mine = [
            (f, r)
            for f, r in parsed
            if job in (f.get("JobId"), f.get("HetJobId"))
            or (task and f.get("ArrayJobId") == array and f.get("ArrayTaskId") == task)
        ]
        if not mine:
            ids = ", ".join(f.get("JobId", "?") for f, _ in parsed)
            raise AllocationError(f"scontrol printed no record of job {job} (JobId={ids})")
        return mine
    het = parsed[0][0].get("HetJobId")
    if het:
        return [(f, r) for f, r in parsed if f.get("HetJobId") == het]
    if len({f.get("JobId") for f, _ in parsed}) == 1:
        return parsed
    # an array job asked by its ArrayJobId: that job is the task whose JobId equals it
    mine = [(f, r) for f, r in parsed if f.get("ArrayJobId") and f.get("JobId") == f.get("ArrayJobId")]
    if len(mine) == 1:
        return mine
    ids = ", ".join(f.get("JobId", "?") for f, _ in parsed)
    raise AllocationError(f"scontrol printed records of several jobs (JobId={ids}): give the job id")


def _cpu_counts(fields: dict[str, str], job_id: str, counts: dict[str, int]) -> dict[str, int]:
    """CPUs per node as SLURM counts them (``NumCPUs``, as ``SLURM_JOB_CPUS_PER_NODE``).

    ``CPU_IDs`` lists the ids of the CPUs each node gives the job; where a node's ids
    number hardware threads while SLURM counts cores (``ThreadsPerCore`` above 1 with
    ``CPUs`` set to the cores), their count is a multiple of SLURM's. The record's
    ``NumCPUs`` is SLURM's total: the counts are divided by the one factor that makes
    them add up to it; counts that no factor reconciles are an error naming both fields.
    """
    num = fields.get("NumCPUs", "")
    total = sum(counts.values())
    if not num.isdigit() or int(num) == total or not counts:
        return counts
    want = int(num)
    if want and total % want == 0 and all(c % (total // want) == 0 for c in counts.values()):
        factor = total // want
        return {name: c // factor for name, c in counts.items()}
    if len(counts) == 1 and want:
        return {name: want for name in counts}
    detail = ", ".join(f"{n}: {c}" for n, c in counts.items())
    raise AllocationError(
        f"job {job_id}: NumCPUs={num!r} disagrees with the CPU_IDs of its nodes ({detail}, {total} "
        "in all), and no one factor (threads per core) reconciles them"
    )


def parse_job(text: str, job_id: str | None = None) -> Allocation:
    """An ``Allocation`` from ``scontrol show job -d <id>`` output (one or more records).

    ``job_id``: the job asked for; with several jobs' records (an array job) only its own
    are read. Without it, an array's records resolve to the task whose ``JobId`` is the
    ``ArrayJobId`` (the job ``scontrol show job <ArrayJobId>`` was asked about).
    """
    records = _records(text)
    if not records:
        raise AllocationError("scontrol printed no job record")
    parsed = _this_job([(parse_fields(r), r) for r in records], job_id)
    # heterogeneous components in offset order
    parsed.sort(key=lambda fr: int(fr[0].get("HetJobOffset", "0") or 0))
    first = parsed[0][0]
    job_id = first.get("HetJobId") or first.get("JobId")
    if not job_id:
        raise AllocationError(f"scontrol output has no JobId: {records[0][:200]!r}")
    nodes = _job_nodes(parsed, job_id)
    order = _node_order([fields for fields, _ in parsed])
    missing = [n for n in order if n not in nodes]
    if missing:
        raise AllocationError(f"job {job_id}: no detail line for nodes {missing}")
    try:
        end = parse_timestamp(first.get("EndTime", ""))
        limit = parse_duration(first.get("TimeLimit", ""))
    except WalltimeError as e:
        raise AllocationError(f"job {job_id}: {e}") from e
    return Allocation(
        job_id=job_id,
        nodes=tuple([nodes[n] for n in order] + [v for k, v in nodes.items() if k not in order]),
        partition=first.get("Partition"),
        source="scontrol",
        state=first.get("JobState"),
        end_time=end,
        time_limit_s=limit,
    )


def _job_nodes(parsed: list[tuple[dict[str, str], str]], job_id: str) -> dict[str, NodeShare]:
    """Every node of the job's components with what it holds, a node in two components
    holding both shares (``add_shares``); an ``AllocationError`` for a job that holds no
    node (``JobGoneError`` when it has ended)."""
    nodes: dict[str, NodeShare] = {}
    for fields, record in parsed:
        shares = _detail_shares(record)
        counts = _cpu_counts(fields, job_id, {s.name: s.cpus for s in shares})
        for share in shares:
            share = replace(share, cpus=counts[share.name])
            prev = nodes.get(share.name)
            nodes[share.name] = add_shares(prev, share) if prev is not None else share
        state = fields.get("JobState", "")
        if not nodes and state not in ("RUNNING", "COMPLETING", "SUSPENDED"):
            # a pending or ended job holds no nodes: say so rather than fail obscurely
            err = JobGoneError if state not in ("PENDING", "CONFIGURING", "") else AllocationError
            raise err(f"job {job_id} is {state or 'in an unknown state'}: it holds no nodes")
    if not nodes:
        raise AllocationError(f"scontrol shows no node detail lines for job {job_id} (use -d)")
    return nodes


def _detail_shares(record: str) -> list[NodeShare]:
    """The shares of one record's node detail lines (``-d``: ``Nodes=... CPU_IDs=...
    Mem=... GRES=...``), one per node they name."""
    shares: list[NodeShare] = []
    for line in record.splitlines():
        fields = parse_fields(line)
        if "CPU_IDs" not in fields or "Nodes" not in fields:
            continue
        cpus = len(_int_list(fields["CPU_IDs"]))
        memory = _memory_mb(fields.get("Mem", "0"))
        gpu_type, gpus, ids = _gres_gpus(fields.get("GRES", ""))
        for name in _expand(fields["Nodes"], "Nodes"):
            shares.append(NodeShare(name, cpus, gpus, gpu_type if gpus else None, memory, ids))
    return shares


def _node_order(components: list[dict[str, str]]) -> list[str]:
    """The job's nodes in ``NodeList`` order (the head is the first), then those only a
    later component names."""
    order: list[str] = []
    for fields in components:
        listed = fields.get("NodeList", "")
        if listed and listed != "(null)":
            order += [n for n in _expand(listed, "NodeList") if n not in order]
    return order


def _expand(text: str, key: str) -> list[str]:
    try:
        return expand(text)
    except HostlistError as e:
        raise AllocationError(f"scontrol {key}={text!r}: {e}") from e


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config``: ``Key = Value`` lines."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


def parse_port_range(value: str | None) -> tuple[int, int] | None:
    """``60001-63000`` -> (60001, 63000); ``(null)``/missing -> None."""
    if not value or value in ("(null)", "N/A"):
        return None
    m = re.fullmatch(r"(\d+)-(\d+)", value.strip())
    if not m:
        return None
    return int(m.group(1)), int(m.group(2))
