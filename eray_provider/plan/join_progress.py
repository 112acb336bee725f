"""What ``ray up`` and ``eray-provider run`` say while nodes join: how many are alive,
which are missing and why, instead of silence until the end.

A line when the count changed (at most every ``MIN_GAP_SECONDS``), and at least every
``every`` seconds::

    2 of 3 nodes alive; waiting for node3 (setting up)

Why a node is missing is read from what it recorded so far (``node_run``): nothing yet
(its step has not started: srun waits, or the node is slow to start Python), a temp dir
(its setup commands run, or it waits for the head), an address (Ray starts), an exit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence

from .markers import Marker
from .node_phase import NodePhase, Slurm, marker_test, node_phase

#: Nodes named in one line; the rest are counted.
NAMED = 6
#: At most a line this often while the count changes (thousands of nodes join in seconds).
MIN_GAP_SECONDS = 2.0


#: How ``ray up`` says what a node it waits for is doing (other phases by their name).
_SAID = {NodePhase.RUNNING: "Ray starting", NodePhase.LAUNCHED: "step not started"}


def why_missing(node_id: str, markers: Collection[str], exits: Mapping[str, str]) -> str:
    """One missing node's stage, from the names of its markers: pure."""
    if node_id in exits:
        return f"exited, exit {exits[node_id]}"
    phase = node_phase(None, marker_test(node_id, markers), Slurm.UNKNOWN)
    return _SAID.get(phase, phase.value)


def progress_line(alive: int, total: int, missing: Sequence[tuple[str, str]], named: int = NAMED) -> str:
    """``missing``: (SLURM node, why) of each node not yet alive."""
    line = f"{alive} of {total} nodes alive"
    if missing:
        shown = ", ".join(f"{node} ({why})" for node, why in missing[:named])
        more = f" and {len(missing) - named} more" if len(missing) > named else ""
        line += f"; waiting for {shown}{more}"
    return line


class JoinProgress:
    """Fed the ids that joined (``joined``, on every poll of the wait); says a line
    through ``say`` when the count changed or ``every`` seconds passed, until all joined."""

    def __init__(
        self,
        node_ids: Sequence[str],
        slurm_nodes: Mapping[str, str],
        read_markers: Callable[[], Collection[str]],
        read_exit: Callable[[str], str | None],
        say: Callable[[str], None],
        already: int = 0,
        every: float = 15.0,
    ) -> None:
        self.node_ids = list(node_ids)
        self._waited = set(self.node_ids)
        self.slurm_nodes = slurm_nodes
        self.read_markers, self.read_exit, self.say = read_markers, read_exit, say
        self.already, self.every = already, every
        self.alive: set[str] = set()
        self._said: tuple[float, int] | None = None

    def joined(self, node_ids: Sequence[str]) -> None:
        self.alive.update(i for i in node_ids if i in self._waited)
        self.tick()

    def tick(self) -> None:
        now = time.monotonic()
        count = len(self.alive)
        if self._said is not None:
            since = now - self._said[0]
            if since < (self.every if self._said[1] == count else min(self.every, MIN_GAP_SECONDS)):
                return
        self._said = (now, count)
        if count == len(self.node_ids):
            return  # the caller says the end in its own words
        markers = self.read_markers()
        missing = [i for i in self.node_ids if i not in self.alive]
        exits = {
            i: e for i in missing if Marker.EXIT.file(i) in markers and (e := self.read_exit(i)) is not None
        }
        described = [(self.slurm_nodes.get(i, i), why_missing(i, markers, exits)) for i in missing]
        total = self.already + len(self.node_ids)
        self.say(progress_line(self.already + count, total, described))
