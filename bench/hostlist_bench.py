"""Hostlist expand/compress against python-hostlist, same run, printed as ratios (ours / theirs).

    python bench/hostlist_bench.py [--repeat 5]

Lists of 10,000 and 100,000 names in several shapes (one long range, many short runs with
gaps, several prefixes with zero padding). A ratio below 1.0 means eray-provider is faster.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

import hostlist as python_hostlist  # GPL: benchmark comparison only

from eray_provider.slurm.hostlist import compress, expand


def shapes(n: int) -> dict[str, list[str]]:
    rng = random.Random(n)
    gappy = sorted(rng.sample(range(n * 2), n))
    per = n // 4
    return {
        "one range": [f"node{i:06d}" for i in range(n)],
        "gaps": [f"gpu{i}" for i in gappy],
        "4 prefixes": [f"{p}{i:05d}" for p in ("a", "rack1-b", "c", "d-ib") for i in range(per)],
    }


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(f"{'names':>7} {'shape':12} {'op':9} {'ours ms':>9} {'theirs ms':>10} {'ratio':>6}")
    for n in (10_000, 100_000):
        for shape, names in shapes(n).items():
            ours_expr = compress(names)
            theirs_expr = python_hostlist.collect_hostlist(names)
            assert expand(ours_expr) == names
            assert sorted(python_hostlist.expand_hostlist(theirs_expr)) == sorted(names)
            rows = [
                (
                    "expand",
                    lambda e=ours_expr: expand(e),
                    lambda e=theirs_expr: python_hostlist.expand_hostlist(e, allow_duplicates=True),
                ),
                (
                    "compress",
                    lambda x=names: compress(x),
                    lambda x=names: python_hostlist.collect_hostlist(x),
                ),
            ]
            for op, ours, theirs in rows:
                a, b = best(ours, args.repeat), best(theirs, args.repeat)
                print(f"{n:>7} {shape:12} {op:9} {a * 1e3:9.2f} {b * 1e3:10.2f} {a / b:6.2f}")
    print("ratio = ours / python-hostlist (below 1.0: eray-provider is faster)")


if __name__ == "__main__":
    main()
