"""``eray_provider.jax_hook``: where the runtime hook lived before the package had floors.

Ray imports hooks by the path a cluster was started with (``RAY_RUNTIME_ENV_HOOK``, and
``worker_process_setup_hook`` in each job's runtime env), so a cluster started before an
upgrade of a shared install, or a user's own config, may still name this path. The hook
itself is ``eray_provider.jax.hook``.
"""

from __future__ import annotations

from .jax.hook import runtime_env_hook, setup_worker

__all__ = ["runtime_env_hook", "setup_worker"]
