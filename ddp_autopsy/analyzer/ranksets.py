"""Rank sets in words: the one phraser the rules, the analyzer and every report use.

>>> format_ranks([0, 1, 2, 5, 7, 8])
'0-2,5,7-8'
>>> rank_phrase([3]), rank_phrase([0, 1, 2, 9]), rank_phrase([])
('rank 3', 'ranks 0-2,9', 'an unknown rank')
>>> rank_phrase(range(0, 4096, 2))
'ranks 0,2,4,6,8,10,12,…,4094 (2048 ranks)'
>>> subject([4]), subject([], "The job")
('Rank 4', 'The job')
"""

from __future__ import annotations

from collections.abc import Iterable

#: Ranges spelled out before a long set is elided with its size.
RANGES_SHOWN = 8


def format_ranks(ranks: Iterable[int]) -> str:
    """``[0,1,2,5,7,8]`` → ``"0-2,5,7-8"`` (every range, however many)."""
    rs = sorted(set(ranks))
    if not rs:
        return ""
    parts: list[str] = []
    start = prev = rs[0]
    for r in rs[1:]:
        if r == prev + 1:
            prev = r
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        start = prev = r
    parts.append(f"{start}-{prev}" if prev > start else str(start))
    return ",".join(parts)


def parse_ranks(text: object) -> set[int]:
    """The ranks a message lists: ``"1, 3"``, ``"1 3"`` (the numbers, separators ignored).

    >>> sorted(parse_ranks("5, 6, 3, 1")), parse_ranks(None)
    ([1, 3, 5, 6], set())
    """
    return {int(x) for x in str(text or "").replace(",", " ").split() if x.isdigit()}


def expand_ranks(text: object) -> set[int]:
    """The ranks of a list with ranges, as SLURM writes tasks: ``"0-5,7"``, ``"[2,4-5]"``.

    >>> sorted(expand_ranks("[0-2,7]")), expand_ranks(None)
    ([0, 1, 2, 7], set())
    """
    out: set[int] = set()
    for part in str(text or "").strip("[]").split(","):
        lo, _, hi = part.strip().partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            out |= set(range(int(lo), int(hi or lo) + 1))
    return out


def short_ranks(ranks: Iterable[int], limit: int = RANGES_SHOWN) -> str:
    """:func:`format_ranks`, elided past ``limit`` ranges.

    >>> short_ranks([0, 1, 2, 9]), short_ranks(range(0, 20, 2), limit=3)
    ('0-2,9', '0,2,…,18 (10 ranks)')
    """
    rs = sorted(set(ranks))
    parts = format_ranks(rs).split(",")
    if len(parts) <= limit:
        return ",".join(parts)
    return f"{','.join(parts[:limit - 1])},…,{parts[-1]} ({len(rs)} ranks)"


def rank_phrase(ranks: Iterable[int], empty: str = "an unknown rank",
                limit: int = RANGES_SHOWN) -> str:
    """``rank 3`` / ``ranks 0-2,9`` / ``empty`` (long sets elided)."""
    rs = sorted(set(ranks))
    if not rs:
        return empty
    return f"rank {rs[0]}" if len(rs) == 1 else f"ranks {short_ranks(rs, limit)}"


def subject(ranks: Iterable[int], default: str = "A rank") -> str:
    """The start of a sentence: ``"Ranks 0-2"``, ``"Rank 3"`` or ``default``."""
    rs = set(ranks)
    phrase = rank_phrase(rs) if rs else default
    return phrase[0].upper() + phrase[1:]


def writers_phrase(ids: Iterable[str], limit: int = 4) -> str:
    """``{"rank 3", "rank 1", "node2 pid 7"}`` → ``"ranks 1,3, node2 pid 7"``."""
    ids = set(ids)
    ranks = sorted(int(i[5:]) for i in ids if i.startswith("rank "))
    others = sorted(i for i in ids if not i.startswith("rank "))
    parts = [rank_phrase(ranks)] if ranks else []
    return ", ".join(parts + others[:limit] + (["…"] if len(others) > limit else []))
