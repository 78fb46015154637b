"""Time stamps as logs write them, normalised to one naive ``datetime`` plus the clock it reads.

The stamps found in distributed-training logs:

====================  ==========================================  ============================
writer                example                                     notes
====================  ==========================================  ============================
c10 logger (pip)      ``[E1218 20:27:21.426415540 file.cpp:12]``  no year; month-day not
                                                                  zero-padded (``E515``); the
                                                                  9-digit fraction is
                                                                  CLOCK_MONOTONIC: dropped
glog / torchelastic   ``W1026 03:51:31.222000 2521679 api.py:1]`` no year; real microseconds
Python logging        ``[2024-04-10 16:02:56,193]``               local time
NCCL 2.26+            ``[2025-05-01 10:11:12] host:pid:tid ...``  local time (strftime ``%F %T``)
torchelastic summary  ``time      : 2026-01-15_05:44:28``          local time
ISO 8601              ``2024-05-01T10:11:12.5+02:00``             converted to UTC when zoned
====================  ==========================================  ============================

Each normalised stamp carries a *clock* (the ``clock`` column of the events frame):

- ``local``: the writing host's wall clock, date as written;
- ``local-noyear``: the same, but the stamp has no year (taken from the file's modification time
  or the bundle manifest, one year earlier when the stamp's month-day falls after it) and at most
  second precision for c10 stamps;
- ``utc``: the stamp named its zone.

Stamps of one rank are ordered by its line order; stamps of different ranks compare only when
their clocks are comparable (:func:`comparable`).

>>> ref = Reference.at(datetime(2025, 1, 3, 12, 0))
>>> glog("1231", "23:59:58", "426415540", ref)    # a c10 stamp written before the new year
Stamp(ts=datetime.datetime(2024, 12, 31, 23, 59, 58), clock='local-noyear')
>>> iso("2024-05-01", "10:11:12", "5", "+02:00")
Stamp(ts=datetime.datetime(2024, 5, 1, 8, 11, 12, 500000), clock='utc')
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

LOCAL = "local"
LOCAL_NOYEAR = "local-noyear"
UTC = "utc"

#: c10's fraction has 9 digits and comes from CLOCK_MONOTONIC; glog's real one has 6.
MONOTONIC_FRACTION_DIGITS = 9


@dataclass(frozen=True)
class Stamp:
    ts: datetime
    clock: str


@dataclass(frozen=True)
class Reference:
    """When the file was last written (mtime or bundle manifest): fills in missing years."""

    year: int
    month: int = 12
    day: int = 31

    @classmethod
    def at(cls, when: datetime) -> Reference:
        # One day of slack: a stamp a few hours "after" the mtime is a timezone artefact.
        when = when + timedelta(days=1)
        return cls(when.year, when.month, when.day)

    def year_of(self, month: int, day: int) -> int:
        """A year-less stamp after the reference date was written the year before."""
        return self.year - 1 if (month, day) > (self.month, self.day) else self.year


def _micros(frac: str | None) -> int:
    if not frac or len(frac) >= MONOTONIC_FRACTION_DIGITS:
        return 0
    return int(frac[:6].ljust(6, "0"))


def _hms(hms: str) -> tuple[int, int, int]:
    h, m, s = (int(x) for x in hms.split(":"))
    return h, m, s


def glog(mmdd: str | None, hms: str | None, frac: str | None, ref: Reference) -> Stamp | None:
    """A c10/glog stamp: ``mmdd`` is month*100+day without zero padding (``515`` is May 15)."""
    if not (mmdd and hms):
        return None
    try:
        month, day = divmod(int(mmdd), 100)
        ts = datetime(ref.year_of(month, day), month, day, *_hms(hms), _micros(frac))
    except ValueError:
        return None
    return Stamp(ts, LOCAL_NOYEAR)


def iso(date: str | None, hms: str | None, frac: str | None = None,
        zone: str | None = None) -> Stamp | None:
    """A dated stamp (ISO, Python logging ``,mmm``, NCCL ``[%F %T]``); zoned ones become UTC."""
    if not (date and hms):
        return None
    try:
        ts = datetime.fromisoformat(f"{date}T{hms}").replace(microsecond=_micros(frac))
        if not zone:
            return Stamp(ts, LOCAL)
        if zone not in ("Z", "z"):
            sign = -1 if zone[0] == "-" else 1
            digits = zone[1:].replace(":", "")
            offset = timedelta(hours=int(digits[:2]), minutes=int(digits[2:4] or 0))
            ts = ts.replace(tzinfo=timezone(sign * offset))
        else:
            ts = ts.replace(tzinfo=timezone.utc)
    except (ValueError, IndexError):
        return None
    return Stamp(ts.astimezone(timezone.utc).replace(tzinfo=None), UTC)


def elastic(value: str) -> Stamp | None:
    """torchelastic's failure summary time, ``2026-01-15_05:44:28`` (the agent's local time)."""
    date, _, hms = value.strip().partition("_")
    return iso(date, hms)


def comparable(a: str | None, b: str | None) -> bool:
    """Whether stamps on these clocks may be compared across ranks (same kind of clock)."""
    if a is None or b is None:
        return False
    return (a == UTC) == (b == UTC)
