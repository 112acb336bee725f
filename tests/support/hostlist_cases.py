"""Random hostlist expressions and name lists, shared by the unit and the live tests.

One generator, driven by a ``random.Random``: hypothesis drives it in the unit tests
(``st.randoms()``), a seeded Random drives it in the batch comparison with scontrol.
"""

from __future__ import annotations

import random

from eray_provider.slurm.hostlist import expand

PREFIXES = ["n", "node", "gpu-", "r1n", "x", "", "rack0-", "a.b-", "c_"]
JOINERS = ["-", "b", "c0", "-ib-"]


def _number(rng: random.Random) -> str:
    width = rng.choice([1, 1, 2, 3, 4])
    value = rng.randint(0, 10 ** min(width, 3) - 1) if rng.random() < 0.8 else rng.randint(0, 1200)
    return str(value).zfill(width)


def _range(rng: random.Random) -> str:
    lo = _number(rng)
    if rng.random() < 0.5:
        return lo
    hi = int(lo) + rng.randint(0, 12)
    return f"{lo}-{str(hi).zfill(rng.choice([1, len(lo)]))}"


def token(rng: random.Random, max_groups: int = 3) -> str:
    prefix = rng.choice(PREFIXES)
    groups = rng.choice([0, 1, 1, 1, 2, 2, 3][: 4 + max_groups]) if prefix else 1
    groups = min(groups, max_groups)
    out = prefix
    for g in range(groups):
        out += "[" + ",".join(_range(rng) for _ in range(rng.randint(1, 3))) + "]"
        if g < groups - 1:
            out += rng.choice(JOINERS)
    if groups == 0:
        out += rng.choice(["", _number(rng)])
    return out or "h"


def expression(rng: random.Random, max_groups: int = 3) -> str:
    return ",".join(token(rng, max_groups) for _ in range(rng.randint(1, 4)))


def names(rng: random.Random) -> list[str]:
    """A list of host names with runs, gaps, duplicates and mixed widths."""
    out: list[str] = []
    for _ in range(rng.randint(1, 8)):
        out += expand(token(rng))[: rng.randint(1, 6)]
    if rng.random() < 0.5:
        rng.shuffle(out)
    return out
