"""Hostlist grammar: captured scontrol behaviour, invariants, python-hostlist as oracle."""

from __future__ import annotations

import random

import hostlist as python_hostlist  # GPL test oracle, never imported by eray_provider
import pytest
from hostlist_cases import expression, names
from hypothesis import given, settings
from hypothesis import strategies as st

from eray_provider.slurm.hostlist import MAX_NAMES, MAX_RANGE, HostlistError, compress, expand, expand_counts

# Captured from scontrol show hostnames (Slurm 22.05.8).
SCONTROL_HOSTNAMES = {
    "a[1-2]-b[3-4]": ["a1-b3", "a1-b4", "a2-b3", "a2-b4"],
    "n[098-101]": ["n098", "n099", "n100", "n101"],
    "n[01-2]": ["n01", "n02"],
    "n[1-02]": ["n1", "n2"],
    "a,,b": ["a", "b"],
    "n1,n1": ["n1", "n1"],
    "n[1-2],n[2-3]": ["n1", "n2", "n2", "n3"],
    "a b": ["a", "b"],
    "123,124": ["123", "124"],
    "[1-2]": ["1", "2"],
    "n[0-0]": ["n0"],
    "n[00-0]": ["n00"],
    "a[1-2],b[3-4]": ["a1", "a2", "b3", "b4"],
    "node1,node2": ["node1", "node2"],
    "n[1]": ["n1"],
    # three groups: the middle one is the outermost loop in Slurm
    "a[1-2]b[3-4]c[5-6]": [
        "a1b3c5",
        "a1b3c6",
        "a2b3c5",
        "a2b3c6",
        "a1b4c5",
        "a1b4c6",
        "a2b4c5",
        "a2b4c6",
    ],
}
# Accepted by newer Slurm and python-hostlist (22.05 rejects it).
SUFFIX_CASES = {"node[001-002]-ib": ["node001-ib", "node002-ib"]}

# Captured from scontrol show hostlist / hostlistsorted.
SCONTROL_HOSTLIST = [
    ("n3,n1,n2", "n[3,1-2]", "n[1-3]"),
    ("n1,n1", "n[1,1]", "n[1,1]"),
    ("n9,n10", "n[9-10]", "n[9-10]"),
    ("n09,n10", "n[09-10]", "n[09-10]"),
    ("n1,n01", "n[1,01]", "n[1,01]"),
    ("n1,n2,m1,n3", "n[1-2],m1,n3", "m1,n[1-3]"),
    ("123,124", "[123-124]", "[123-124]"),
    ("n1,a,n2", "n1,a,n2", "a,n[1-2]"),
    ("n1-ib,n2-ib", "n1-ib,n2-ib", "n1-ib,n2-ib"),
    ("x9,x010", "x[9,010]", "x[9,010]"),
    ("n010,n9", "n[010,9]", "n[9,010]"),
    ("n10,n9", "n[10,9]", "n[9-10]"),
    ("a1,a2,a,a3", "a[1-2],a,a3", "a,a[1-3]"),
    ("n99,n100", "n[99-100]", "n[99-100]"),
    ("n2,n1,n1", "n[2,1,1]", "n[1,1-2]"),
    ("n0,n00", "n[0,00]", "n[0,00]"),
    ("a1b2,a1b3", "a1b[2-3]", "a1b[2-3]"),
]


@pytest.mark.parametrize(("expr", "want"), [*SCONTROL_HOSTNAMES.items(), *SUFFIX_CASES.items()])
def test_expand_matches_captured_scontrol(expr: str, want: list[str]) -> None:
    assert expand(expr) == want


@pytest.mark.parametrize(("names_csv", "ordered", "sorted_"), SCONTROL_HOSTLIST)
def test_compress_matches_captured_scontrol(names_csv: str, ordered: str, sorted_: str) -> None:
    assert compress(names_csv.split(",")) == ordered
    assert compress(names_csv.split(","), sort=True) == sorted_


@pytest.mark.parametrize(
    ("expr", "position", "fragment"),
    [
        ("n[3-1]", 2, "lo > hi"),
        ("n[]", 2, "empty range"),
        ("n[1", 1, "never closed"),
        ("n]1", 1, "without a matching"),
        ("n[1,,2]", 4, "empty range"),
        ("n[-1]", 2, "not a number"),
        ("n[a]", 2, "not a number"),
        ("n[1-]", 2, "not a number"),
        ("n[[1]]", 2, "nested"),
        ("ok1,n[1-2", 5, "never closed"),
    ],
)
def test_invalid_expressions_raise_with_position(expr: str, position: int, fragment: str) -> None:
    with pytest.raises(HostlistError) as info:
        expand(expr)
    assert isinstance(info.value, ValueError)
    assert info.value.position == position
    assert fragment in str(info.value)
    assert repr(expr) in str(info.value)


def test_cap_on_names() -> None:
    with pytest.raises(HostlistError, match="more than"):
        expand(f"n[1-{MAX_NAMES + 1}]")
    with pytest.raises(HostlistError, match="more than"):
        expand("a[1-1000]b[1-1001]")
    assert len(expand("a[1-1000]b[1-1000]")) == MAX_NAMES


def test_one_range_of_more_than_65536_hosts_is_refused_as_slurm_does() -> None:
    assert len(expand(f"n[1-{MAX_RANGE}]")) == MAX_RANGE == 65536
    with pytest.raises(HostlistError) as info:
        expand(f"a1,n[5,0-{MAX_RANGE}]")
    assert info.value.position == 7 and f"range '0-{MAX_RANGE}' has 65537 hosts" in str(info.value)
    # many ranges adding up to more are fine, as in Slurm
    assert len(expand(f"n[1-{MAX_RANGE}],m[1-{MAX_RANGE}]")) == 2 * MAX_RANGE


def test_expand_counts() -> None:
    assert expand_counts("72(x2),36") == [72, 72, 36]
    assert expand_counts("1(x3)") == [1, 1, 1]
    assert expand_counts("4") == [4]
    for bad in ("", "x", "2(x)", "2(3)", "2(x0)", "-1"):
        with pytest.raises(HostlistError):
            expand_counts(bad)


def test_compress_rejects_bad_names() -> None:
    for bad in ("", "a[1]", "a,b", "a b"):
        with pytest.raises(HostlistError):
            compress([bad])


@settings(max_examples=1000, deadline=None)
@given(st.randoms(use_true_random=False))
def test_round_trip_and_sorted_multiset(rng: random.Random) -> None:
    xs = names(rng)
    assert expand(compress(xs)) == xs
    assert sorted(expand(compress(xs, sort=True))) == sorted(xs)
    assert compress(expand(compress(xs))) == compress(xs)


@settings(max_examples=1000, deadline=None)
@given(st.randoms(use_true_random=False))
def test_expand_agrees_with_python_hostlist(rng: random.Random) -> None:
    # python-hostlist orders three bracket groups differently from Slurm: compare up to two
    expr = expression(rng, max_groups=2)
    theirs = python_hostlist.expand_hostlist(expr, allow_duplicates=True)
    assert expand(expr) == theirs
