"""SLURM hostlist expressions, exactly as ``scontrol`` reads and writes them.

``expand`` is ``scontrol show hostnames``, ``compress`` is ``scontrol show hostlist``
(and, with ``sort=True``, ``scontrol show hostlistsorted``), ``expand_counts`` reads the
run-length lists of ``SLURM_JOB_CPUS_PER_NODE`` and friends. The quirks of Slurm's own
implementation are kept on purpose, because node names we print are read back by Slurm
and node names Slurm prints are read by us: order and duplicates are preserved, zero
padding comes from the written width of a range's low bound, and several bracket groups
in one name form a product in Slurm's order (the last group varies fastest, the others
are taken from right to left).

Pure functions, no I/O: safe to call in hot paths of the node provider.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence

__all__ = ["MAX_NAMES", "MAX_RANGE", "HostlistError", "compress", "expand", "expand_counts"]

from ..errors import ConfigError

#: Upper bound on the names one expression may expand to; a typo such as
#: ``n[1-1000000000]`` must fail fast instead of exhausting memory.
MAX_NAMES = 1_000_000
#: Slurm's ``MAX_RANGE``: one ``lo-hi`` range of more hosts is refused by Slurm ("Too many
#: hosts in range"), so a name list we accept is one Slurm accepts too.
MAX_RANGE = 64 * 1024

_SEPARATORS = frozenset(", \t\n")
_NUMBER = re.compile(r"\d+")
_BODY = re.compile(r"\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*")
_ITEM = re.compile(r"(\d+)(?:-(\d+))?")
_TRAILING_DIGITS = re.compile(r"\d*\Z")
_COUNT_ITEM = re.compile(r"(\d+)(?:\(x(\d+)\))?\Z")


class HostlistError(ConfigError):
    """An expression that is not a valid hostlist; the message quotes it and the position."""

    def __init__(self, expr: str, position: int, reason: str) -> None:
        self.expr = expr
        self.position = position
        self.reason = reason
        super().__init__(f"invalid hostlist {expr!r} at position {position}: {reason}")


# --------------------------------------------------------------------------- expand


def _tokens(expr: str) -> list[tuple[int, str]]:
    """Split at separators outside brackets; returns (start offset, token) pairs."""
    tokens: list[tuple[int, str]] = []
    start = -1
    depth_open = -1  # offset of the currently open '[' or -1
    for i, ch in enumerate(expr):
        if ch == "[":
            if depth_open >= 0:
                raise HostlistError(expr, i, "nested '['")
            depth_open = i
            if start < 0:
                start = i
        elif ch == "]":
            if depth_open < 0:
                raise HostlistError(expr, i, "']' without a matching '['")
            depth_open = -1
        elif ch in _SEPARATORS and depth_open < 0:
            if start >= 0:
                tokens.append((start, expr[start:i]))
                start = -1
        elif start < 0:
            start = i
    if depth_open >= 0:
        raise HostlistError(expr, depth_open, "'[' is never closed")
    if start >= 0:
        tokens.append((start, expr[start:]))
    return tokens


def _parse_ranges(expr: str, offset: int, body: str) -> list[tuple[int, int, int]]:
    """The (lo, hi, width) ranges of one bracket body that starts at ``offset``."""
    ranges: list[tuple[int, int, int]] = []
    if _BODY.fullmatch(body):  # the common, valid case in one pass
        for lo_text, hi_text in _ITEM.findall(body):
            lo = int(lo_text)
            hi = int(hi_text) if hi_text else lo
            if lo > hi or hi - lo >= MAX_RANGE:
                break
            ranges.append((lo, hi, len(lo_text)))
        else:
            return ranges
    # find the offending item for the message
    pos = offset
    for item in body.split(","):
        lo_text, dash, hi_text = item.partition("-")
        if not item:
            raise HostlistError(expr, pos, "empty range")
        if not _NUMBER.fullmatch(lo_text) or (dash and not _NUMBER.fullmatch(hi_text)):
            raise HostlistError(expr, pos, f"range {item!r} is not a number or lo-hi")
        lo, hi = int(lo_text), int(hi_text or lo_text)
        if lo > hi:
            raise HostlistError(expr, pos, f"range {item!r} has lo > hi")
        if hi - lo + 1 > MAX_RANGE:
            raise HostlistError(
                expr,
                pos,
                f"range {item!r} has {hi - lo + 1} hosts, more than Slurm's {MAX_RANGE} in one range",
            )
        pos += len(item) + 1
    raise AssertionError(f"unreachable: {body!r}")


def _expand_token(expr: str, offset: int, token: str) -> list[str]:
    # literal pieces and bracket bodies alternate: lit0 [b0] lit1 [b1] ... litN
    literals: list[str] = []
    groups: list[list[tuple[int, int, int]]] = []
    pos = 0
    while True:
        open_at = token.find("[", pos)
        if open_at < 0:
            literals.append(token[pos:])
            break
        close_at = token.index("]", open_at)  # balanced: checked by _tokens
        literals.append(token[pos:open_at])
        groups.append(_parse_ranges(expr, offset + open_at + 1, token[open_at + 1 : close_at]))
        pos = close_at + 1
    if not groups:
        return [token]

    total = 1
    for group in groups:
        total *= sum(hi - lo + 1 for lo, hi, _ in group)
    if total > MAX_NAMES:
        raise HostlistError(expr, offset, f"expands to {total} names, more than {MAX_NAMES}")

    # Slurm's order: the last group is the innermost loop; the groups before it are
    # substituted one at a time from the right, each new value of a group to the
    # right enclosing all values of the groups to its left.
    last = groups[-1]
    suffix = literals[-1]

    def with_prefix(prefix: str) -> list[str]:
        out: list[str] = []
        formats: dict[int, str] = {}
        for lo, hi, w in last:
            # printf-style formatting is the fastest way to pad in CPython
            fmt = formats.get(w)
            if fmt is None:
                fmt = formats[w] = prefix.replace("%", "%%") + f"%0{w}d" + suffix.replace("%", "%%")
            if lo == hi:
                out.append(fmt % lo)
            else:
                out += [fmt % n for n in range(lo, hi + 1)]
        return out

    def substitute(
        template_literals: list[str], template_groups: list[list[tuple[int, int, int]]]
    ) -> list[str]:
        if not template_groups:
            return with_prefix("".join(template_literals))
        *left_groups, right = template_groups
        out: list[str] = []
        head, before, after = template_literals[:-2], template_literals[-2], template_literals[-1]
        for lo, hi, w in right:
            for n in range(lo, hi + 1):
                out.extend(substitute([*head, f"{before}{n:0{w}d}{after}"], left_groups))
        return out

    return substitute(literals[:-1], groups[:-1])


def expand(expr: str) -> list[str]:
    """Every name of a hostlist expression, in order, duplicates kept.

    ``expand("a[1-2],b[3-4]") == ["a1", "a2", "b3", "b4"]``. Raises ``HostlistError``
    for unbalanced brackets, empty, non-numeric or descending ranges, and for
    expressions of more than ``MAX_NAMES`` names.
    """
    if not isinstance(expr, str):
        raise TypeError(f"hostlist expression must be a str, got {type(expr).__name__}")
    names: list[str] = []
    for offset, token in _tokens(expr):
        names.extend(_expand_token(expr, offset, token))
        if len(names) > MAX_NAMES:
            raise HostlistError(expr, offset, f"expands to more than {MAX_NAMES} names")
    return names


def expand_counts(expr: str) -> list[int]:
    """Expand SLURM's run-length lists: ``"72(x2),36" -> [72, 72, 36]``."""
    counts: list[int] = []
    pos = 0
    for item in expr.split(","):
        match = _COUNT_ITEM.match(item.strip())
        if match is None:
            raise HostlistError(expr, pos, f"{item!r} is not N or N(xK)")
        repeat = int(match.group(2) or 1)
        if repeat == 0:
            raise HostlistError(expr, pos, f"{item!r} repeats zero times")
        if len(counts) + repeat > MAX_NAMES:
            raise HostlistError(expr, pos, f"expands to more than {MAX_NAMES} entries")
        counts.extend([int(match.group(1))] * repeat)
        pos += len(item) + 1
    return counts


# --------------------------------------------------------------------------- compress


def _natcmp(a: str, b: str) -> int:
    """Slurm's ``strnatcmp``: digit runs compare by value (fractional if led by 0)."""
    i = j = 0
    la, lb = len(a), len(b)
    while True:
        ca = a[i] if i < la else ""
        cb = b[j] if j < lb else ""
        if ca.isdigit() and cb.isdigit():
            # Slurm compares the digit runs and, when they tie, goes on char by char.
            ra = _NUMBER.match(a, i).group()  # type: ignore[union-attr]
            rb = _NUMBER.match(b, j).group()  # type: ignore[union-attr]
            if ca == "0" or cb == "0":
                for da, db in zip(ra, rb):
                    if da != db:
                        return -1 if da < db else 1
                if len(ra) != len(rb):
                    return -1 if len(ra) < len(rb) else 1
            elif len(ra) != len(rb):
                return -1 if len(ra) < len(rb) else 1
            elif ra != rb:
                return -1 if ra < rb else 1
        if not ca and not cb:
            return 0
        if ca != cb:
            return -1 if ca < cb else 1
        i += 1
        j += 1


def _zero_padded(num: int, width: int) -> int:
    return max(width - len(str(num)), 0)


class _Range:
    """One run ``prefix[lo-hi]`` of Slurm's internal hostlist; widths are mutable as in Slurm."""

    __slots__ = ("hi", "lo", "prefix", "single", "width")

    def __init__(self, prefix: str, lo: int, hi: int, width: int, single: bool) -> None:
        self.prefix, self.lo, self.hi, self.width, self.single = prefix, lo, hi, width, single

    @classmethod
    def of_name(cls, name: str) -> _Range:
        digits = _TRAILING_DIGITS.search(name).group()  # type: ignore[union-attr]
        if not digits:
            return cls(name, 0, 0, 0, True)
        num = int(digits)
        return cls(name[: len(name) - len(digits)], num, num, len(digits), False)

    def copy(self) -> _Range:
        return _Range(self.prefix, self.lo, self.hi, self.width, self.single)

    def count(self) -> int:
        return 1 if self.single else self.hi - self.lo + 1

    def prefix_cmp(self, other: _Range | None) -> int:
        if other is None:
            return -1
        if self.prefix == other.prefix:
            return int(other.single) - int(self.single)
        return _natcmp(self.prefix, other.prefix)

    def width_combine(self, other: _Range) -> bool:
        """Whether both widths print both low bounds alike; unifies the widths if so."""
        if self.width == other.width:
            return True
        npad, nmpad = _zero_padded(self.lo, self.width), _zero_padded(self.lo, other.width)
        mpad, mnpad = _zero_padded(other.lo, other.width), _zero_padded(other.lo, self.width)
        if npad != nmpad and mpad != mnpad:
            return False
        if npad != nmpad:
            other.width = self.width
        else:
            self.width = other.width
        return True

    def follows(self, prev: _Range) -> bool:
        """True when this range continues ``prev`` without a gap (Slurm's join rule)."""
        return (
            not self.single
            and not prev.single
            and prev.hi == self.lo - 1
            and prev.prefix_cmp(self) == 0
            and prev.width_combine(self)
        )

    def within(self, other: _Range | None) -> bool:
        return self.prefix_cmp(other) == 0 and not self.single and not other.single  # type: ignore[union-attr]

    def numstr(self) -> str:
        if self.single:
            return ""
        if self.hi > self.lo:
            return f"{self.lo:0{self.width}d}-{self.hi:0{self.width}d}"
        return f"{self.lo:0{self.width}d}"


def _cmp(h1: _Range, h2: _Range) -> int:
    result = h1.prefix_cmp(h2)
    if result == 0:
        result = h1.lo - h2.lo if h1.width_combine(h2) else h1.width - h2.width
    return result


def _collapse(ranges: list[_Range]) -> None:
    for i in range(len(ranges) - 1, 0, -1):
        if ranges[i].follows(ranges[i - 1]):
            ranges[i - 1].hi = ranges[i].hi
            del ranges[i]


def _coalesce(ranges: list[_Range]) -> None:
    """Slurm's split of overlapping sorted ranges, duplicates kept as single points."""
    i = len(ranges) - 1
    while i > 0:
        prev, nxt = ranges[i - 1], ranges[i]
        if (
            not prev.single
            and not nxt.single
            and prev.hi > nxt.lo
            and prev.prefix_cmp(nxt) == 0
            and prev.width_combine(nxt)
        ):
            lo, hi = nxt.lo, min(nxt.hi, prev.hi)
            if hi < prev.hi:
                nxt.hi = prev.hi
            prev.hi, nxt.lo = lo, hi
            j = i
            for n in range(lo, hi + 1):
                for _ in range((n > prev.hi) + (n < nxt.lo)):
                    ranges.insert(j, _Range(prev.prefix, n, n, prev.width, False))
                    j += 1
            i = len(ranges)
        i -= 1
    _collapse(ranges)


def compress(names: Iterable[str], sort: bool = False) -> str:
    """The shortest hostlist Slurm writes for ``names``.

    Without ``sort`` the order is kept (``["n3", "n1", "n2"] -> "n[3,1-2]"``), as
    ``scontrol show hostlist``; with ``sort=True`` the result is that of
    ``scontrol show hostlistsorted``. ``expand(compress(x)) == x`` for any list
    of valid names.
    """
    ranges: list[_Range] = []
    for name in names:
        _check_name(name)
        r = _Range.of_name(name)
        if ranges and r.follows(ranges[-1]):
            ranges[-1].hi = r.hi
        else:
            ranges.append(r)
    if sort and len(ranges) > 1:
        ranges.sort(key=functools.cmp_to_key(_cmp))
        _coalesce(ranges)
    return _ranged_string(ranges)


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not name:
        raise HostlistError(str(name), 0, "a host name must be a non-empty string")
    for i, ch in enumerate(name):
        if ch in "[]" or ch in _SEPARATORS:
            raise HostlistError(name, i, f"{ch!r} is not allowed in a host name")


def _ranged_string(ranges: Sequence[_Range]) -> str:
    parts: list[str] = []
    i, n = 0, len(ranges)
    while i < n:
        first = ranges[i]
        following = ranges[i + 1] if i + 1 < n else None
        bracket = first.count() > 1 or (following is not None and first.within(following))
        nums = [first.numstr()]
        i += 1
        while i < n and ranges[i].within(ranges[i - 1]):
            nums.append(ranges[i].numstr())
            i += 1
        body = ",".join(nums)
        parts.append(f"{first.prefix}[{body}]" if bracket else f"{first.prefix}{body}")
    return ",".join(parts)
