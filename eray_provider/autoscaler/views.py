"""Cached views that make the autoscaler's per-node calls cost a dict lookup each.

Ray 2.60's autoscaler (v2's ``NodeProviderAdapter.get_non_terminated``) asks, every
round, ``non_terminated_nodes({})`` and then ``node_tags`` and ``is_running`` of every
node it returned: 20,000 calls a round at 10,000 nodes. The providers therefore compute
their answers once per change of what they are computed from (the state file's
records, the marker listing, squeue's listings) and serve the calls from that.

Change is told by identity, never by comparing contents (comparing 10,000 records costs
what recomputing does): the state file, the marker listing and the squeue listings hand
out the same object for as long as nothing changed (``ClusterState.read``,
``ClusterState.markers``, the providers' listing caches).
"""

from __future__ import annotations

from collections.abc import Callable
from time import monotonic
from typing import Any, Generic, NoReturn, TypeVar

from ..runtime.cluster_state import READ_FRESH_SECONDS

T = TypeVar("T")


class ReadOnlyTags(dict[str, str]):
    """A node's tags as ``node_tags`` hands them out from a round's answers: a real dict
    (reads, ``json.dumps``, ``dict(...)`` and ``.copy()`` as usual) that refuses to be
    changed, because it is shared by every call until the answers change. Handing out a
    fresh copy per call doubled the cost of a round at 10,000 nodes; a caller that
    changes what it got fails loudly instead of corrupting the next caller's answer."""

    __slots__ = ()

    def _refuse(self, *_args: Any, **_kwargs: Any) -> NoReturn:
        raise TypeError("node_tags() returns read-only tags: copy them, or change them with set_node_tags()")

    __setitem__ = __delitem__ = __ior__ = _refuse
    update = pop = popitem = clear = setdefault = _refuse

    def copy(self) -> dict[str, str]:
        return dict(self)


class Memo(Generic[T]):
    """A value computed from some inputs, reused while the inputs are the very same
    objects. The inputs are held, so that a new object can never take an input's id
    (and pass for it) while the memo compares against it."""

    __slots__ = ("_inputs", "_value")

    def __init__(self) -> None:
        self._inputs: tuple[Any, ...] | None = None
        self._value: T | None = None

    def get(self, inputs: tuple[Any, ...], compute: Callable[..., T]) -> T:
        held = self._inputs
        if held is None or len(held) != len(inputs) or any(a is not b for a, b in zip(held, inputs)):
            self._value = compute(*inputs)
            self._inputs = inputs
        return self._value  # type: ignore[return-value]

    def drop(self) -> None:
        self._inputs = self._value = None


class LiveView:
    """A provider's live node ids (in order, and as a set), computed from its inputs and
    reused while they are the same objects; for ``READ_FRESH_SECONDS`` (the state's own
    freshness) the inputs are not even asked for. ``drop`` after the provider's own
    writes and under the lock, where other processes' writes must count."""

    def __init__(self) -> None:
        self._memo: Memo[tuple[list[str], frozenset[str]]] = Memo()
        self._view: tuple[list[str], frozenset[str]] | None = None
        self._stamp = 0.0

    def get(
        self, inputs: Callable[[], tuple[Any, ...]], compute: Callable[..., list[str]]
    ) -> tuple[list[str], frozenset[str]]:
        now = monotonic()
        if self._view is not None and now - self._stamp < READ_FRESH_SECONDS:
            return self._view
        self._view = self._memo.get(inputs(), lambda *args: _with_set(compute(*args)))
        self._stamp = now
        return self._view

    def drop(self) -> None:
        self._view = None
        self._memo.drop()


def _with_set(ids: list[str]) -> tuple[list[str], frozenset[str]]:
    return ids, frozenset(ids)
