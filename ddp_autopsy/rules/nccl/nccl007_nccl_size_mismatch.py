"""NCCL received a message of another size than it expected: ranks disagree on a collective.

## What it detects
NCCL's "NET/Socket : peer 10.0.0.2<4125> message truncated : receiving 1048576 bytes instead of
65536" (2.12.10+) and its InfiniBand form "peer … posted incorrect receive info: size …". Not
the bootstrap's "Message truncated : received N bytes instead of M" of communicator set-up.
Gloo's counterpart: "op.preamble.length <= op.nbytes. 8 vs 4. Received data size doesn't match
expected size. Is there a distributed collective mismatch in your code?" (the receiving process
aborts with SIGABRT). With three ranks or more and one alone aborting (its own line's prefix, or
its launcher's SIGABRT), that rank is named as a lead, at a lower confidence: more arrived than
its buffer holds, so it is the odd one when one rank is short, and the successor of the odd one
when one rank is long (not in an all_to_all, where a rank sending one peer too much makes that
peer abort).

## Why it hangs or kills the job
A truncated message means two ranks ran the same collective with different sizes (a tensor
shaped differently on one rank, a collective one rank skipped so the next one pairs with
another), or with different NCCL_PROTO / NCCL_ALGO settings or NCCL versions: NCCL fails the
operation with ncclInvalidUsage.

## Evidence
The NCCL warning, with the peer and both sizes.

## Remedy
Compare what each rank runs at that step (TORCH_DISTRIBUTED_DEBUG=DETAIL names the first
differing collective, op, shape and dtype); make NCCL_PROTO, NCCL_ALGO and the NCCL version the
same on every rank.

## Example
```
[rank1]:gpu2:4021:4130 [1] transport/net_socket.cc:544 NCCL WARN NET/Socket : peer 10.0.0.1<43561> message truncated : receiving 1048576 bytes instead of 65536. If you believe your socket network is in healthy state,     there may be a mismatch in collective sizes or environment settings (e.g. NCCL_PROTO, NCCL_ALGO) between ranks
```
"""

from __future__ import annotations

from collections.abc import Iterator

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Finding, Rule, evidence_of, first_ts, ranks_of, subject


class NcclSizeMismatch(Rule):
    code = "NCCL007"
    slug = "nccl-size-mismatch"
    cause = "collective_mismatch"
    severity = "critical"

    def check(self, job: Job) -> Iterator[Finding]:
        # A bootstrap message of the wrong size is exchanged while communicators are set up,
        # before any collective: different NCCL builds (ENV001 when the versions show) or an
        # NCCL bug, not ranks disagreeing on a collective.
        truncated = [r for r in job.rows("nccl_message_truncated")
                     if not r["data"].get("bootstrap")]
        if truncated:
            d = truncated[0]["data"]
            sizes = (f": {d['got']} bytes arrived where {d['want']} were expected"
                     if "got" in d and "want" in d else "")
            ranks = ranks_of(truncated)
            yield self.finding(
                f"{subject(ranks, 'A rank')} received an NCCL message of the wrong size{sizes}: "
                "ranks ran a collective with different sizes (or different NCCL_PROTO / "
                "NCCL_ALGO settings or NCCL versions).",
                evidence=[evidence_of(r) for r in truncated[:2]], ranks=ranks,
                hosts=[r["host"] for r in truncated], confidence=0.8, ts=first_ts(truncated),
                details={k: d.get(k) for k in ("peer", "got", "want") if k in d},
            )
            return
        yield from self._gloo(job)

    def _gloo(self, job: Job) -> Iterator[Finding]:
        """Gloo's own check on a received message: "op.preamble.length <= op.nbytes. 8 vs 4.
        Received data size doesn't match expected size. Is there a distributed collective
        mismatch in your code?" (an uncaught gloo::EnforceNotMet: the receiving process aborts).
        The receiver reports it; which side ran the odd collective the message does not say."""
        rows = job.rows("gloo_size_mismatch")
        if not rows:
            return
        d = rows[0]["data"]
        sizes = (f" ({d['got']} bytes arrived where {d['want']} were expected)"
                 if "got" in d and "want" in d else "")
        receivers = ranks_of(rows) or _aborted(job)
        seen = set(job.events["rank"].drop_nulls().to_list()) if job.events.height else set()
        world = job.world_size or (max(seen) + 1 if seen else 0)
        # (not all_to_all: there a rank sending one peer too much makes only that peer abort)
        alltoall = job.of_kind("exception")["data"].str.contains(
            "all_to_all|alltoall", literal=False).any() if job.has("events") else False
        if len(receivers) == 1 and world >= 3 and not alltoall:
            # Gloo checks sizes on the receiver: more arrived than its buffer holds. The rank
            # that aborted first had the smaller buffer of the pair: the odd one when one rank
            # is short (the usual case: one rank with less data, a field fewer), its sender's
            # successor when one rank is long. A lead, not a proof.
            (odd,) = receivers
            yield self.finding(
                f"Gloo received a message of the wrong size{sizes} and aborted rank {odd} first: "
                "the ranks ran a collective with different sizes or dtypes (or one skipped a "
                f"collective, so the next ones paired wrongly). Rank {odd}'s buffer was smaller "
                f"than its sender's: rank {odd} is the likelier odd one (a rank with less data "
                "than the others); if instead one rank had more, it is the one that sent to "
                f"rank {odd}.",
                evidence=[evidence_of(r) for r in rows[:2]], ranks=[odd],
                hosts=[r["host"] for r in rows], confidence=0.5, ts=first_ts(rows),
                details={"receivers": [odd], "got": d.get("got"), "want": d.get("want")})
            return
        yield self.finding(
            f"Gloo received a message of the wrong size{sizes}: the ranks ran a collective with "
            "different sizes or dtypes (or one rank skipped a collective, so the next ones "
            f"paired wrongly); {subject(receivers, 'a rank').lower()} received it and aborted, "
            "its peer sent it, and which side is the odd one the message does not say.",
            evidence=[evidence_of(r) for r in rows[:2]], ranks=[], hosts=[r["host"] for r in rows],
            confidence=0.8, ts=first_ts(rows),
            details={"receivers": sorted(receivers), "got": d.get("got"), "want": d.get("want")})


def _aborted(job: Job) -> set[int]:
    """Ranks their launcher saw end by SIGABRT (torchelastic's exit code -6, mp.spawn's
    "terminated with signal SIGABRT"): where Gloo's abort line has no rank prefix."""
    ranks: set[int] = set()
    for r in job.rows("elastic_failure", "worker_failed", "spawn_failed"):
        d = r["data"]
        if d.get("exitcode") == -6 or "SIGABRT" in str(d.get("signal") or r["text"]):
            rank = d.get("rank", d.get("index", r["rank"]))
            if isinstance(rank, str) and rank.isdigit():
                rank = int(rank)  # (mp.spawn's process index: the rank it passed)
            if isinstance(rank, int):
                ranks.add(rank)
    return ranks
