"""The runtime hook the provider installs on every node at ``ray start``.

``RAY_RUNTIME_ENV_HOOK=eray_provider.jax.hook.runtime_env_hook`` is in the environment of
every Ray node and of the drivers ``ray exec``/``ray submit`` start, so every job (also
``ray job submit`` drivers, which inherit the raylet's environment) passes through it in
``ray.init``, without the user passing a runtime_env. It merges into the user's
runtime_env, never replacing it:

- ``env_vars``: the cluster YAML's ``provider.jax_env`` defaults (``JAX_PLATFORMS``...),
  under the user's own values;
- ``worker_process_setup_hook``: ``setup_worker`` below, which first runs the user's own
  hook when one was given (as an import path), then initializes ``jax.distributed`` in
  actors created with ``eray_provider.jax.actor_options(rank, world_size)``.

The ``SLURM_*`` variables that make JAX's auto-detection override explicit settings are
not in the workers' environment at all: the provider moves them to ``ERAY_SLURM_*`` when
it starts Ray on a node.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any

from ..errors import ConfigError
from ..plan.environment import USER_SETUP_HOOK, read_jax_env
from ..plan.modules import OLD_WORKER_SETUP_HOOK, WORKER_SETUP_HOOK

logger = logging.getLogger(__name__)
SETUP_HOOK = WORKER_SETUP_HOOK
#: the provider's own hook under every path it has had: never chained as a user's hook
#: (it would call itself)
OWN_HOOKS = (WORKER_SETUP_HOOK, OLD_WORKER_SETUP_HOOK)
ENV_USER_HOOK = USER_SETUP_HOOK


def runtime_env_hook(runtime_env: dict[str, Any] | None) -> dict[str, Any]:
    merged = dict(runtime_env or {})
    try:
        env_vars = read_jax_env(os.environ)
    except ConfigError as e:
        logger.warning("ignoring the cluster's JAX defaults: %s", e)
        env_vars = {}
    env_vars.update(merged.get("env_vars") or {})
    user_hook = merged.get("worker_process_setup_hook")
    if user_hook and user_hook not in OWN_HOOKS:
        if not isinstance(user_hook, str):
            # a callable cannot be chained through a variable: keep the user's hook as is
            logger.warning("worker_process_setup_hook is not an import path: JAX auto-init is off")
            merged["env_vars"] = env_vars
            return merged
        env_vars[ENV_USER_HOOK] = user_hook
    merged["env_vars"] = env_vars
    merged["worker_process_setup_hook"] = SETUP_HOOK
    return merged


def setup_worker() -> None:
    user_hook = os.environ.get(ENV_USER_HOOK)
    if user_hook and user_hook not in OWN_HOOKS:
        module, _, name = user_hook.rpartition(".")
        getattr(importlib.import_module(module), name)()
    from . import initialize_from_env

    initialize_from_env()
