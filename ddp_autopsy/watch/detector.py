"""When is a job hung? Pure logic over what :mod:`~ddp_autopsy.watch.probe` reads.

Progress is any of: the job's log files grew; a rank's main-thread stack signature changed
between two samples. A **hang** is declared when, for ``hang_after`` seconds, there was no
progress, and every rank was sampled at least ``min_samples`` times with the same signature
(stuck, not slow: a slow rank's stack moves between samples), and at least one rank waits (near-
zero CPU and I/O, and not runnable: a rank mostly in state R on a loaded host gets little CPU,
yet it does not wait). A rank that is busy (CPU or I/O) in the same frame while others wait is
stuck too; one that is busy while others wait for ``hang_after / 2`` is named as it happens
(:attr:`Status.busy_notice`).

When no rank's stack can be read (py-spy missing, not permitted, or a Python it cannot read),
the detector falls back to logs and CPU: a hang is then "no log growth and every rank idle".

Stack samples are taken only when they can tell something (adaptive, low rate): not while the
logs grow, every ``fast_period`` once they have been quiet that long, and twice as rarely (up
to ``hang_after / 3``) while the stacks keep moving.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ddp_autopsy.watch.probe import Sample, Usage

BUSY_CPU = 0.2  # of one core, over the window
BUSY_IO_BPS = 1 << 20  # bytes read + written per second
WINDOW_S = 5.0


@dataclass
class RankTrack:
    key: str  # "rank 0", or "pid 123" when the rank is unknown
    pid: int
    usage: deque[tuple[float, float, int | None]] = field(default_factory=lambda: deque(
        maxlen=64))  # (time, cpu seconds, io bytes)
    states: deque[tuple[float, str]] = field(default_factory=lambda: deque(maxlen=64))
    signature: str | None = None
    sig_since: float | None = None
    same: int = 0  # samples in a row with this signature
    where: str | None = None
    in_collective: bool = False
    sample_status: str | None = None
    sample_error: str | None = None
    python: str | None = None

    def runnable(self, now: float, window: float = WINDOW_S) -> bool:
        """In state R (running or waiting for a CPU) in most readings of the window: a rank
        starved of CPU on a loaded host uses little of it, yet it is not waiting."""
        seen = [st for t, st in self.states if now - t <= window]
        return len(seen) >= 2 and sum(st == "R" for st in seen) * 2 > len(seen)

    def active(self, now: float) -> bool:
        return (self.busy(now) or 0.0) >= BUSY_CPU or self.runnable(now)

    def busy(self, now: float, window: float = WINDOW_S) -> float | None:
        """CPU share of one core over the last ``window`` seconds (I/O counted as busy: 1.0);
        None until two readings exist."""
        old = next((u for u in self.usage if now - u[0] <= window), None)
        if old is None or not self.usage or self.usage[-1][0] - old[0] <= 0:
            if len(self.usage) >= 2:
                old = self.usage[-2]
            else:
                return None
        new = self.usage[-1]
        dt = new[0] - old[0]
        if dt <= 0:
            return None
        cpu = (new[1] - old[1]) / dt
        if new[2] is not None and old[2] is not None and (new[2] - old[2]) / dt >= BUSY_IO_BPS:
            return max(cpu, 1.0)
        return cpu


@dataclass
class Status:
    state: str  # active | quiet | hung
    quiet_s: float  # seconds without progress
    waiting: list[RankTrack]
    busy: list[RankTrack]
    reason: str = ""
    busy_notice: str | None = None  # set once per episode
    fallback: str | None = None  # set once: why stacks are not used


class Detector:
    def __init__(self, hang_after: float, now: float, *, min_samples: int = 3) -> None:
        self.hang_after = hang_after
        self.min_samples = min_samples
        self.fast_period = min(max(hang_after / 8, 1.0), 30.0)
        self.slow_period = max(self.fast_period, min(hang_after / 3, 120.0))
        self.period = self.fast_period
        self.ranks: dict[int, RankTrack] = {}
        self.last_activity = now  # start of watching counts as activity
        self.last_log_growth = now
        self.last_sample: float | None = None
        self.hung = False  # declared, not yet re-armed by progress
        self.failed_rounds = 0  # sampling rounds in a row where no rank could be read
        self._busy_noted = False
        self._fallback_noted = False

    # -- observations ---------------------------------------------------------------------
    def track(self, pid: int, key: str) -> RankTrack:
        if pid not in self.ranks:
            self.ranks[pid] = RankTrack(key, pid)
        return self.ranks[pid]

    def forget(self, pid: int) -> None:
        self.ranks.pop(pid, None)

    def usage(self, now: float, pid: int, u: Usage) -> None:
        if pid in self.ranks:
            self.ranks[pid].usage.append((now, u.cpu_s, u.io_bytes))
            self.ranks[pid].states.append((now, u.state))

    def logs(self, now: float, grown: int) -> None:
        if grown > 0:
            self.last_log_growth = now
            self._progress(now)

    def sample_due(self, now: float) -> bool:
        if now - self.last_log_growth < self.fast_period:
            return False  # the logs say it moves
        return self.last_sample is None or now - self.last_sample >= self.period

    def stacks(self, now: float, samples: dict[int, Sample]) -> list[RankTrack]:
        """Record one sampling round; returns the ranks that moved since the previous one."""
        previous = self.last_sample
        self.last_sample = now
        moved = []
        ok = any(s.status == "ok" for s in samples.values())
        self.failed_rounds = 0 if ok else self.failed_rounds + 1
        for pid, s in samples.items():
            t = self.ranks.get(pid)
            if t is None:
                continue
            t.sample_status, t.sample_error, t.python = s.status, s.error, s.python
            if s.status != "ok" or s.signature is None:
                continue
            t.where, t.in_collective = s.where, s.in_collective
            if s.signature == t.signature:
                t.same += 1
                continue
            if t.signature is not None:
                moved.append(t)
            t.signature, t.sig_since, t.same = s.signature, now, 1
        if moved:
            # it moved some time after the previous sample: count from there (never later than
            # the truth by more than one period, so a hang is not declared late)
            self._progress(previous if previous is not None else now)
            self.period = min(self.period * 2, self.slow_period)
        else:
            self.period = self.fast_period
        return moved

    def _progress(self, when: float) -> None:
        self.last_activity = max(self.last_activity, when)
        self.hung = False
        self._busy_noted = False

    # -- decision -------------------------------------------------------------------------
    def status(self, now: float) -> Status:
        tracks = list(self.ranks.values())
        quiet = now - self.last_activity
        busy = [t for t in tracks if t.active(now)]
        waiting = [t for t in tracks if t not in busy]
        sampled = [t for t in tracks if t.sample_status == "ok" and t.signature is not None]
        st = Status("active" if quiet < self.fast_period else "quiet", quiet, waiting, busy)
        if not tracks:
            return st
        if not sampled and not self._fallback_noted and self.failed_rounds >= 2:
            self._fallback_noted = True
            st.fallback = _fallback_reason(tracks)
        if busy and waiting and not self._busy_noted and quiet >= self.hang_after / 2 and \
                all(t.signature for t in waiting):
            self._busy_noted = True
            shares = ", ".join(f"{(t.busy(now) or 0) * 100:.0f}% CPU" for t in busy)
            st.busy_notice = (
                f"{_names(busy)} busy ({shares})"
                f" in {busy[0].where or 'unknown frame'} while {_names(waiting)} "
                f"wait{'s' if len(waiting) == 1 else ''} in {waiting[0].where or '?'} "
                f"for {quiet:.0f}s")
        if self.hung or quiet < self.hang_after:
            return st
        if sampled:
            unsampled_busy = [t for t in busy if t not in sampled]
            stuck = all(t.same >= self.min_samples for t in sampled)
            if not stuck or unsampled_busy or not waiting:
                return st
            st.reason = (f"no progress for {quiet:.0f}s: no log growth, the same stack in "
                         f"{self.min_samples}+ samples on every rank, "
                         f"{_names(waiting)} idle")
        else:
            if busy or not any(t.sample_status for t in tracks):
                return st
            st.reason = (f"no progress for {quiet:.0f}s: no log growth and every rank idle "
                         "(stacks unavailable)")
        self.hung = True
        st.state = "hung"
        return st


def _names(tracks: list[RankTrack]) -> str:
    ranks = [t.key.removeprefix("rank ") for t in tracks]
    if all(t.key.startswith("rank ") for t in tracks):
        return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(ranks)
    return ", ".join(t.key for t in tracks)


def _fallback_reason(tracks: list[RankTrack]) -> str:
    t = next((t for t in tracks if t.sample_status), tracks[0])
    version = f" (Python {t.python})" if t.python else ""
    return (f"stack samples unavailable ({t.sample_status}{version}: {t.sample_error}); "
            "hang detection falls back to log growth and CPU time only")
