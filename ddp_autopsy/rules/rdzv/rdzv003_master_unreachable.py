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

import re
from collections.abc import Iterator

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Finding, Rule, ending, evidence_of, first_ts


class MasterUnreachable(Rule):
    code = "RDZV003"
    slug = "master-unreachable"
    cause = "master_unreachable"
    severity = "critical"

    def check(self, job: Job) -> Iterator[Finding]:
        rows = job.rows("connect_timeout", "connect_failed", "rdzv_connection_error")
        # A member's keep-alive that failed after the rendezvous completed (dynamic_rendezvous's
        # "has failed to send a keep-alive heartbeat to the rendezvous") is the store lost
        # mid-run: its host stopped, crashed or dropped off the network.
        # (or its shutdown of the rendezvous at the end: "has failed to shutdown the rendezvous")
        # (so is the agent's RendezvousConnectionError raised while it watched its workers:
        # "_invoke_run" / "num_nodes_waiting" in its traceback)
        watching = {(r["source"], r["line"]) for r in job.rows("exception")
                    if MONITORING & set(r["data"].get("callers") or ())}
        alive = [r for r in rows if any(w in r["text"] for w in AFTER_RENDEZVOUS)
                 or (r["kind"] == "rdzv_connection_error"
                     and (r["source"], r["line"]) in watching)]
        rows = [r for r in rows if r not in alive]
        if not rows:
            if not alive:
                yield from self._retrying_to_the_end(job)
                return
            if job.rows("worker_group_succeeded"):
                # (after the workers finished, the agent that hosts the store may exit first:
                # the others' shutdown or last keep-alive then fails, harmlessly)
                return
            node = KEEPALIVE_NODE.search(alive[0]["text"])
            who = f"node {node.group(1)!r}" if node else "a node"
            text = alive[0]["text"]
            what = (f"{who} failed to shut down the rendezvous after it had completed"
                    if "shutdown" in text else
                    f"{who} failed to send its keep-alive heartbeat to the rendezvous after it "
                    "had completed" if "keep-alive" in text else
                    "a node's agent lost the rendezvous store while it watched its workers")
            yield self.finding(
                f"The rendezvous store became unreachable mid-run: {what} "
                "(RendezvousConnectionError). The host of the rendezvous endpoint (the agent "
                "that serves the c10d store) stopped, crashed or lost its network: its own log "
                "says which.", evidence=[evidence_of(r) for r in alive[:2]],
                hosts=[r["host"] for r in alive], confidence=0.45, ts=first_ts(alive))
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


    def _retrying_to_the_end(self, job: Job) -> Iterator[Finding]:
        """The c10d client's "No socket on (host, port) is listening yet, will retry." (or a
        retried connect failure) is the last line its process wrote: it never reached the
        store. Port 0 is no store at all (an endpoint whose port was never set)."""
        # (the last line of its file, too: no other writer there went on after it)
        ended = ending(job, job.rows("connect_retry"), file_end=True)
        if not ended:
            return
        endpoints = sorted({f"{d.get('host')}:{d.get('port')}" for r in ended
                            if (d := r["data"]).get("host")})
        port0 = any(str(e).endswith(":0") for e in endpoints)
        where = ", ".join(endpoints) or "the rendezvous store"
        summary = (f"The ranks kept retrying to reach the store at {where} and their logs end "
                   "there, with nothing listening")
        summary += (". Port 0 is no store: the rendezvous endpoint's port was never set (a "
                    "launcher's or config's rendezvous override without one)." if port0 else
                    " (the master not started, or started elsewhere, or MASTER_ADDR/MASTER_PORT "
                    "pointing at the wrong place).")
        yield self.finding(
            summary, evidence=[evidence_of(r) for r in ended[:2]],
            ranks=[r["rank"] for r in ended], hosts=[r["host"] for r in ended],
            confidence=0.7 if port0 else 0.5, ts=first_ts(ended),
            details={"endpoints": endpoints})


#: torchelastic's agent frames while it watches its workers (its rendezvous complete).
MONITORING = frozenset({"_invoke_run", "num_nodes_waiting", "_monitor_workers"})


#: The member named in dynamic_rendezvous's keep-alive warning ("The node 'host_3427_0' ...").
KEEPALIVE_NODE = re.compile(r"The node '([^']+)' has failed to (?:send a keep-alive|shutdown the)")


#: dynamic_rendezvous's warnings of a member that lost the store after the rendezvous completed.
AFTER_RENDEZVOUS = ("keep-alive heartbeat", "has failed to shutdown the rendezvous")
