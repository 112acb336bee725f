"""The ``eray-provider`` command: hostlists, allocation inspection, ``run`` for batch
scripts, and ``status`` and ``logs`` of the user's clusters.

Exit codes: 0 success, 2 bad input or not inside an allocation (with the reason on
stderr), 1 any other failure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import ConfigError, ErayError
from .plan.container import ContainerConfig, ContainerPlan
from .plan.ports import PortPlan, choose_plan
from .slurm import hostlist
from .slurm.allocation import Allocation
from .slurm.walltime import describe_end


def _cmd_hostnames(args: argparse.Namespace) -> int:
    print("\n".join(hostlist.expand(args.expr)))
    return 0


def _cmd_hostlist(args: argparse.Namespace) -> int:
    names = [n for arg in args.names for n in arg.split(",") if n]
    print(hostlist.compress(names, sort=args.sorted))
    return 0


def _format_table(alloc: Allocation, plan: PortPlan) -> str:
    rows = [("NODE", "ROLE", "CPUS", "GPUS", "GPU_TYPE", "MEMORY_MB")]
    for i, n in enumerate(alloc.nodes):
        rows.append(
            (
                n.name,
                "head" if i == 0 else "worker",
                str(n.cpus),
                str(n.gpus),
                n.gpu_type or "-",
                "-" if n.memory_mb is None else str(n.memory_mb),
            )
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = [
        f"job {alloc.job_id}  cluster {alloc.cluster or '-'}  partition {alloc.partition or '-'}"
        f"  (from {alloc.source})",
        f"ends {describe_end(alloc.end_time, alloc.time_limit_s, time.time())}",
        *("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows),
        "",
        "ports:",
    ]
    for key, value in plan.to_dict().items():
        if key not in ("job_id", "block_start"):
            lines.append(f"  {key:24} {value}")
    return "\n".join(lines)


def _cmd_inspect(args: argparse.Namespace) -> int:
    from .runtime.port_probe import host_exclusions
    from .slurm.client import load_allocation

    alloc = load_allocation(args.job_id, use_scontrol=not args.no_scontrol)
    plan = choose_plan(alloc.job_id, host_exclusions())
    container = None
    if args.cluster:
        from .plan.names import default_base
        from .runtime.dashboard import resolve

        container = resolve(args.cluster, alloc.job_id, args.state_dir or default_base()).container()
    if args.json:
        doc = alloc.to_dict()
        doc["ports"] = plan.to_dict()
        if args.cluster:
            doc["container"] = json.loads(container.to_json()) if container else None
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(_format_table(alloc, plan))
        if args.cluster:
            print(_format_container(container))
    return 0


def _format_container(plan: ContainerPlan | None) -> str:
    """What ``inspect --cluster`` says of the cluster's container plan."""
    if plan is None:
        return "\ncontainer: none (every node's Ray runs on the node itself)"
    lines = ["", f"container: {plan.name} (Ray {plan.ray}, Python {plan.python} in the image)"]
    lines += [f"  srun {arg}" for arg in plan.args]
    lines += [f"  env {key}={value}" for key, value in sorted(plan.env.items())]
    return "\n".join(lines)


def _cmd_run(args: argparse.Namespace) -> int:
    from .runtime.batch import run

    command = args.command_args[1:] if args.command_args[:1] == ["--"] else args.command_args
    options: dict = {}
    if args.network:
        options["network"] = args.network
    if args.jax_env:
        pairs = [kv.partition("=") for kv in args.jax_env]
        bad = [k for k, sep, _ in pairs if not sep or not k]
        if bad:
            raise ConfigError(f"--jax-env expects KEY=VALUE, got {args.jax_env!r}")
        options["jax_env"] = {k: v for k, _, v in pairs}
    if args.container_image:
        container: dict = {"image": args.container_image}
        if args.container_mounts:
            container["mounts"] = args.container_mounts.split(",")
        if args.container_workdir:
            container["workdir"] = args.container_workdir
        ContainerConfig.from_value(container)  # checked before SLURM is asked anything
        options["container"] = container
    elif args.container_mounts or args.container_workdir:
        raise ConfigError("--container-mounts and --container-workdir need --container-image")
    return run(command, cluster_name=args.name, join_timeout=args.timeout, provider_options=options)


def _cmd_status(args: argparse.Namespace) -> int:
    from .runtime.status import PruneError, format_table, gather, prune, to_json

    statuses = gather(args.state_dir)
    failed: list[str] = []
    if args.prune:
        try:
            removed, failed = prune(statuses)
        except PruneError as e:
            print(f"eray-provider: {e}", file=sys.stderr)
            return 1
        for path in removed:
            print(f"eray-provider: removed {path}", file=sys.stderr)
        for why in failed:
            print(f"eray-provider: not removed: {why}", file=sys.stderr)
        statuses = [s for s in statuses if s.state_dir not in removed]
    print(to_json(statuses) if args.json else format_table(statuses, args.state_dir))
    return 1 if failed or any(s.state in ("unknown", "unreadable") for s in statuses) else 0


def _cmd_logs(args: argparse.Namespace) -> int:
    from .plan.names import default_base
    from .runtime.cluster_logs import show_logs
    from .runtime.status import state_dirs

    base = args.state_dir or default_base()
    return show_logs(base, args.cluster, args.job, state_dirs(base), args.node, args.component, args.follow)


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from .plan.names import default_base
    from .runtime.dashboard import resolve, run

    state = resolve(args.target, args.job, args.state_dir or default_base())
    return run(state, port=args.port, via=args.via)


def _cmd_env(args: argparse.Namespace) -> int:
    from .plan.names import default_base
    from .runtime.dashboard import resolve
    from .runtime.launch import client_exports

    state = resolve(args.target, args.job, args.state_dir or default_base())
    print("\n".join(client_exports(state)))
    return 0


def _job_and_state_dir(s: argparse.ArgumentParser, state_dir: dict[str, Any]) -> None:
    s.add_argument(
        "--job", help="which job's cluster of that name (default: the YAML's, or the one that runs)"
    )
    s.add_argument("--state-dir", **state_dir)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eray-provider",
        description="Ray and multi-host JAX on SLURM allocations.",
    )
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("hostnames", help="expand a hostlist (as scontrol show hostnames)")
    s.add_argument("expr")
    s.set_defaults(func=_cmd_hostnames)

    s = sub.add_parser("hostlist", help="compress host names (as scontrol show hostlist)")
    s.add_argument("names", nargs="+", help="names, comma- or space-separated")
    s.add_argument("--sorted", action="store_true", help="as scontrol show hostlistsorted")
    s.set_defaults(func=_cmd_hostlist)

    s = sub.add_parser("inspect", help="show the job's nodes, resources and port plan")
    s.add_argument("--job-id", help="a job id (default: the allocation this runs in)")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--no-scontrol", action="store_true", help="read the environment only, never scontrol")
    s.add_argument(
        "--cluster",
        metavar="CONFIG_OR_CLUSTER",
        help="also the container plan of this cluster of the job (provider.container)",
    )
    s.add_argument(
        "--state-dir", type=Path, help="the state base (default: $ERAY_STATE_DIR or ~/.eray-provider)"
    )
    s.set_defaults(func=_cmd_inspect)

    s = sub.add_parser(
        "run",
        help="in a batch script: the job's Ray cluster for the length of COMMAND",
        description="Bring up the job's Ray cluster (head on the first node), wait until every "
        "node has joined, run COMMAND as the driver here, tear everything down, exit with "
        "COMMAND's status.",
    )
    s.add_argument("--name", default="run", help="cluster name (state dir <name>-<job id>)")
    s.add_argument("--timeout", type=float, default=300.0, help="seconds for every node to join")
    s.add_argument("--network", help="CIDR of the network Ray uses on nodes with several")
    s.add_argument(
        "--jax-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment default for every job's workers (JAX_PLATFORMS=cpu, ...)",
    )
    s.add_argument(
        "--container-image",
        metavar="IMAGE",
        help="every node's Ray, and COMMAND, in this image through pyxis (provider.container)",
    )
    s.add_argument(
        "--container-mounts", metavar="SRC[:DST[:FLAGS]],...", help="more mounts, as pyxis takes them"
    )
    s.add_argument("--container-workdir", metavar="DIR", help="the working dir inside (default: the image's)")
    s.add_argument("command_args", nargs=argparse.REMAINDER, metavar="-- COMMAND...")
    s.set_defaults(func=_cmd_run)

    state_dir: dict[str, Any] = {
        "type": Path,
        "help": "the state base (default: $ERAY_STATE_DIR or ~/.eray-provider)",
    }
    s = sub.add_parser(
        "status",
        help="every cluster of yours: jobs, nodes alive, head, time left, what is wrong",
        description="List every cluster found in the state base (fixed and elastic, started from "
        "anywhere), with one squeue of your jobs and each running head's GCS. Exit 1 when squeue "
        "did not answer.",
    )
    s.add_argument("--json", action="store_true", help="print a JSON list, for scripts")
    s.add_argument("--prune", action="store_true", help="remove what clusters of ended jobs left (logs too)")
    s.add_argument("--state-dir", **state_dir)
    s.set_defaults(func=_cmd_status)

    s = sub.add_parser(
        "logs",
        help="the Ray logs of a cluster's nodes, live or collected when they ended",
        description="Print the Ray logs of a cluster's nodes: from the state dir for nodes whose "
        "Ray ended (collected at ray down, at the job's end, when a node died), from the node "
        "itself (an srun step) for live ones.",
    )
    s.add_argument("cluster", metavar="CLUSTER", help="the cluster name")
    _job_and_state_dir(s, state_dir)
    s.add_argument("--node", help="one node: its node id or its SLURM node")
    s.add_argument(
        "--component",
        action="append",
        default=[],
        help="raylet, gcs, monitor, dashboard or worker; repeatable (default: raylet, gcs, monitor)",
    )
    s.add_argument("--follow", action="store_true", help="follow one live node's logs until its Ray ends")
    s.set_defaults(func=_cmd_logs)

    s = sub.add_parser(
        "dashboard",
        help="the head's dashboard on a local port, with a link that logs the browser in",
        description="Forward 127.0.0.1:PORT here to the head's dashboard (directly, or through an "
        "srun step on the head where this machine cannot route to the nodes) until the cluster "
        "ends or Ctrl-C. The printed link logs the browser in with a cookie of this forward "
        "(never the token), worth nothing once it ends.",
    )
    s.add_argument("target", metavar="CONFIG_OR_CLUSTER", help="a cluster YAML or a cluster name")
    _job_and_state_dir(s, state_dir)
    s.add_argument("--port", type=int, default=8265, help="local port (default 8265; 0: any free port)")
    s.add_argument("--via", default="auto", help="auto (default), direct or srun")
    s.set_defaults(func=_cmd_dashboard)

    s = sub.add_parser(
        "env",
        help="the variables Ray's own clients need for a running cluster, as export lines to eval",
        description="Print `export` lines for ray.init(), the Jobs SDK, `ray job` and notebooks: "
        "RAY_ADDRESS (the head's GCS), RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH (the cluster's "
        'private token file). Use: eval "$(eray-provider env CLUSTER)".',
    )
    s.add_argument("target", metavar="CONFIG_OR_CLUSTER", help="a cluster YAML or a cluster name")
    _job_and_state_dir(s, state_dir)
    s.set_defaults(func=_cmd_env)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ErayError, ValueError) as e:  # bad input from any library call, too
        print(f"eray-provider: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, ValueError) else 1


if __name__ == "__main__":
    sys.exit(main())
