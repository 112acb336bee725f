"""The JAX helpers' errors: both are cluster errors (the command line exits 1 for them)."""

from __future__ import annotations

from ..errors import ClusterError


class JaxInitError(ClusterError):
    """``jax.distributed`` cannot be (or already was) initialized in this process."""


class GroupError(ClusterError):
    """A rank of a process group died, was never placed, or never arrived."""

    def __init__(self, message: str, rank: int | None = None, node: str | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.node = node
