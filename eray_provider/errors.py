"""The errors eray-provider raises on purpose, in one family, below every floor.

Catch ``ErayError`` for all of them. ``ConfigError`` is bad input (a config field, a
``SLURM_*`` variable, an argument, a hostlist): its message names it and quotes the value,
and it is a ``ValueError``. ``ClusterError`` is a cluster, node or SLURM command that could
not do what was asked (a launch, a teardown, a JAX group): a ``RuntimeError``. The command
line prints either as one line (``eray-provider: error: ...``), never as a traceback.
"""

from __future__ import annotations


class ErayError(Exception):
    """Any error eray-provider raises on purpose."""


class ConfigError(ErayError, ValueError):
    """Bad input, named and quoted in the message."""


class ClusterError(ErayError, RuntimeError):
    """A cluster, a node or SLURM could not do what was asked."""


class ClusterTimeoutError(ClusterError, TimeoutError):
    """A bounded wait ran out: nodes that did not join, a cluster that was not ready."""
