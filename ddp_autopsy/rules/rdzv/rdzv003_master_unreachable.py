"""Ranks cannot reach the rendezvous master.

## What it detects
A rank's TCPStore client gave up connecting to MASTER_ADDR:MASTER_PORT: "The client socket has
timed out after 60s while trying to connect to (HOST, PORT)", "failed to connect to any network
address of (HOST, PORT) ... (errno: 113 - No route to host)", or torchelastic's
RendezvousConnectionError.

## Why it hangs or kills the job
Every rank must connect to the store on the master before anything else happens; a rank that
cannot reach it waits until the rendezvous timeout and dies, and the others wait for it.

## Evidence
The connect failures with host and port; `collect`'s probe of the master (does it resolve, is the
port listening, does a connect succeed) when a bundle is given.

## Remedy
Check that the master is up and that its store listens on that address and port (the master
host's firewall, the node's network, MASTER_ADDR pointing at the right node); start the master
node first or raise the rendezvous timeout when nodes start far apart.

## Example
```
torch.distributed.DistNetworkError: The client socket has timed out after 5s while trying to connect to (127.0.0.1, 29511).
```
"""

from __future__ import annotations

from collections.abc import Iterator

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Finding, Rule, evidence_of, first_ts


class MasterUnreachable(Rule):
    code = "RDZV003"
    slug = "master-unreachable"
    cause = "master_unreachable"
    severity = "critical"

    def check(self, job: Job) -> Iterator[Finding]:
        rows = job.rows("connect_timeout", "connect_failed", "rdzv_connection_error")
        if not rows:
            return
        endpoints = sorted({f"{r['data']['host']}:{r['data']['port']}" for r in rows
                            if r["data"].get("host")})
        target = ", ".join(endpoints) if endpoints else "the rendezvous master"
        errors = sorted({r["data"]["err"] for r in rows if r["data"].get("err")})
        summary = f"Ranks could not connect to {target}"
        summary += f" ({'; '.join(errors)})." if errors else " (timed out)."
        for b in job.bundles:
            for p in b.probes:
                if f"{p.get('master_addr')}:{p.get('master_port')}" in endpoints:
                    conn = p.get("connect") or {}
                    if not conn.get("ok"):
                        summary += (f" collect on {b.manifest.get('host')} also failed to "
                                    f"connect: {conn.get('error')}.")
        yield self.finding(
            summary,
            evidence=[evidence_of(r) for r in rows[:3]],
            ranks=[r["rank"] for r in rows],
            hosts=[r["host"] for r in rows],
            confidence=0.75,
            ts=first_ts(rows),
            details={"endpoints": endpoints},
        )
