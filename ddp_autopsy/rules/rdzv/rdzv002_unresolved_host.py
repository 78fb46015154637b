"""A host name in the rendezvous address does not resolve.

## What it detects
PyTorch's c10d could not resolve MASTER_ADDR (or this machine's own host name):
"The IPv6 network addresses of (HOST, PORT) cannot be retrieved (gai error: -2 - Name or service
not known)", Python's `socket.gaierror`, or NCCL's "error encountered when getting address info";
and a launcher's ssh that could not resolve a node ("ssh: Could not resolve hostname worker-5:
Name or service not known", from mpirun's rsh agent, pdsh or DeepSpeed's runner), which ends
that launch whatever help text follows it.

## Why it hangs or kills the job
c10d retries the lookup until the rendezvous timeout, so the job hangs at start-up and then dies
with a connect timeout. Warnings for one address family followed by a working run are harmless:
then this is reported as information only.

## Evidence
The resolution warnings (host, port, gai error), and whether a connect failure or a timeout
followed them. The culprit is the node whose lookups failed: the host its lines name, or the
node its log file's directory names (`node-1/console.log`): the other nodes resolved the name.

## Remedy
Use a name every node resolves, or the master's IP address, in MASTER_ADDR /
`--master-addr` / `--rdzv-endpoint`; fix DNS or /etc/hosts (a machine whose own host name does
not resolve needs an /etc/hosts entry for it).

## Example
```
[W socket.cpp:601] [c10d] The IPv6 network addresses of (no-such-host.invalid, 29500) cannot be retrieved (gai error: -2 - Name or service not known).
torch.distributed.DistNetworkError: The client socket has timed out after 10s while trying to connect to (no-such-host.invalid, 29500).
```
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Finding, Rule, evidence_of, first_ts

SLOTS = re.compile(r":\d+$")
TERMINAL = ("connect_timeout", "connect_failed", "rdzv_connection_error", "store_clients_timeout")


class UnresolvedHost(Rule):
    code = "RDZV002"
    slug = "unresolved-host"
    cause = "unresolved_host"
    severity = "critical"

    def check(self, job: Job) -> Iterator[Finding]:
        rows = job.rows("unresolved_host")
        if not rows:
            return
        hosts = sorted({r["data"]["host"] for r in rows if r["data"].get("host")})
        named = ", ".join(hosts) if hosts else "A rendezvous host"
        if any(SLOTS.search(h) for h in hosts):
            # ssh was handed Open MPI's "-H host:slots" whole (an Open MPI older than that form)
            named += " (a host:slots pair used as a host name: this Open MPI is too old for "
            named += "`-H host:slots`; use a hostfile with `slots=N`, or upgrade it)"
        terminal = job.rows(*TERMINAL) + [
            r for r in job.rows("exception") if any(h in r["text"] for h in hosts)
        ]
        # The resolution error is itself a traceback's exception ("ValueError: host not found:
        # ..."): it ended that process, whatever the agent did after it (a restart is no progress).
        at = {(r["source"], r["line"]) for r in rows}
        terminal += [r for r in job.rows("exception") if (r["source"], r["line"]) in at]
        # ssh's own (a launcher's: mpirun's rsh agent, pdsh, DeepSpeed's runner): that ssh never
        # ran its command, so the daemon or worker on that host never started
        by_ssh = [r for r in rows if "ssh: Could not resolve hostname" in r["text"]]
        terminal += by_ssh[:1]
        last_line = max(r["line"] for r in rows)
        source = rows[-1]["source"]
        # A traceback after the last warning: the process died there, even when the paste cuts
        # off before its exception line.
        terminal += [r for r in job.rows("traceback")
                     if r["source"] == source and r["line"] > last_line][:1]
        continued = job.lines_in(source) - last_line
        evidence = [evidence_of(r) for r in rows[:2]] + [evidence_of(r) for r in terminal[:1]]
        # The nodes that could not resolve (not the name they looked up: that is `hosts`).
        failing = [r["host"] for r in rows]
        on = sorted({h for h in failing if h})
        where = f" on {', '.join(on)}" if on else ""
        if terminal:
            yield self.finding(
                f"{named} does not resolve{where} (gai error: "
                f"{rows[0]['data'].get('msg', 'unknown')}); "
                + ("the launcher's ssh could not reach it, so nothing started there."
                   if by_ssh and len(by_ssh) == len(rows) else "the rendezvous could not connect."),
                evidence=evidence, ranks=[r["rank"] for r in rows], hosts=failing,
                confidence=0.9, ts=first_ts(rows), details={"hosts": hosts},
            )
        elif continued <= 3:
            yield self.finding(
                f"{named} does not resolve{where}, and the log ends there (the job hung at "
                "rendezvous).",
                evidence=evidence, ranks=[r["rank"] for r in rows], hosts=failing, confidence=0.6,
                ts=first_ts(rows), details={"hosts": hosts},
            )
        else:
            yield self.finding(
                f"Resolution warnings for {named[0].lower() + named[1:] if not hosts else named}, but the job went on: not a failure by itself.",
                evidence=evidence, role="info", severity="info", confidence=0.5,
                ts=first_ts(rows), details={"hosts": hosts},
            )
