"""The package's modules that are named as strings, in one place: those run as processes
(``python -m``) on nodes and login hosts, the hooks handed to Ray by path, the bind shim
that node_run preloads and the providers ``eray_provider`` loads on first access. A module
that moves is one edit here; ``tests/unit/test_layout.py`` imports every name."""

from __future__ import annotations

NODE_RUN = "eray_provider.runtime.node_run"
END_WATCH = "eray_provider.runtime.end_watch"
PORT_PROBE = "eray_provider.runtime.port_probe"
GCS_PROBE = "eray_provider.runtime.gcs_probe"
NODE_LOGS = "eray_provider.runtime.node_logs"
RELAY = "eray_provider.runtime.relay"
#: a node's ``ray`` CLI, loaded before its arguments are known
RAY_GATE = "eray_provider.runtime.ray_gate"
BIND_SHIM = "eray_provider.runtime._bindshim"
#: ``module.function`` paths that Ray imports on every node
RUNTIME_ENV_HOOK = "eray_provider.jax.hook.runtime_env_hook"
WORKER_SETUP_HOOK = "eray_provider.jax.hook.setup_worker"
#: the same hook under its path before the package had floors (``eray_provider.jax_hook``),
#: which the runtime envs of clusters started before then still name
OLD_WORKER_SETUP_HOOK = "eray_provider.jax_hook.setup_worker"
#: what ``eray_provider.<name>`` loads on first access (every public name: the providers
#: need Ray, and a node's processes start faster without what they do not use)
LAZY = {
    "DistributedConfig": "eray_provider.jax.distributed",
    "logical_cpu_core_count": "eray_provider.jax.distributed",
    "PortPlan": "eray_provider.plan.ports",
    "Allocation": "eray_provider.slurm.allocation",
    "AllocationError": "eray_provider.slurm.allocation",
    "NodeShare": "eray_provider.slurm.allocation",
    "HostlistError": "eray_provider.slurm.hostlist",
    "compress": "eray_provider.slurm.hostlist",
    "expand": "eray_provider.slurm.hostlist",
    "expand_counts": "eray_provider.slurm.hostlist",
    "SlurmNodeProvider": "eray_provider.autoscaler.provider",
    "SlurmJobProvider": "eray_provider.autoscaler.elastic",
    "auto_ray_cluster": "eray_provider.runtime.ray_cluster",
    "RayClusterConfig": "eray_provider.runtime.ray_cluster",
    "eSlurmCluster": "eray_provider.jax.slurm_cluster",  # imports JAX
}
RUN_AS_PROCESS = (NODE_RUN, END_WATCH, PORT_PROBE, GCS_PROBE, NODE_LOGS, RELAY, RAY_GATE)


def python_m(python: str, module: str, *args: str) -> list[str]:
    """``python -m module args...``: ``module`` one of ``RUN_AS_PROCESS``."""
    return [python, "-m", module, *args]
