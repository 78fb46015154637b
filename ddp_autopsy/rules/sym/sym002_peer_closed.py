"""Ranks lost the connection to a peer (a symptom).

## What it detects
"Connection closed by peer", "Connection reset by peer", "Failed to recv, got 0 bytes.
Connection was likely closed", "ncclRemoteError: ... remote process exiting prematurely".

## Why it hangs or kills the job
These ranks were talking to a peer that went away: the peer crashed, was killed, or the network
between them failed. The ranks reporting it are healthy; the peer is the one to look at.

## Evidence
The connection errors per rank, with the peer address where the message gives it.

## Remedy
Find the peer's own first failure among the other findings (an exception, OOM, a signal). When
no rank failed first, suspect the network (NIC, switch, InfiniBand) between the hosts.

## Example
```
[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:45067
```
"""

from __future__ import annotations

from collections.abc import Iterator

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Finding, Rule, ranks_of, subject


class PeerClosed(Rule):
    code = "SYM002"
    slug = "peer-closed"
    role = "symptom"
    severity = "warning"

    def check(self, job: Job) -> Iterator[Finding]:
        rows = job.rows("peer_closed")
        if not rows:
            return
        ranks = ranks_of(rows)
        peers = sorted({r["data"]["peer"] for r in rows if r["data"].get("peer")})
        who = subject(ranks, "Ranks")
        summary = f"{who} lost the connection to a peer"
        summary += f" ({', '.join(peers[:4])})." if peers else "."
        yield self.from_rows(rows, summary, ranks=ranks, confidence=0.9,
                             details={"peers": peers})
