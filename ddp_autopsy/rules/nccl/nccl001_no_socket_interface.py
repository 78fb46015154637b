"""No usable network interface for NCCL or Gloo sockets.

## What it detects
NCCL's "Bootstrap : no socket interface found" / "NET/Socket : no interface found", the garbage
address NCCL produces when NCCL_SOCKET_IFNAME names a missing interface ("... with family
59936 is neither AF_INET(2) nor AF_INET6(10)"), and Gloo's "Unable to find address for: eth2"
when GLOO_SOCKET_IFNAME matches nothing, or, unset, no interface holds the address the host name
resolves to ("Unable to find interface for: [0.0.8.34]"). Not NCCL's "No usable listening interface found" after
it found no interface in NCCL_COMM_ID's subnet (NCCL006: the host is on another network).

## Why it hangs or kills the job
The communicator cannot open its sockets, so process-group creation fails on that rank (and the
others wait for it until they time out).

## Evidence
The interface error, and the NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME value the logs show.

## Remedy
Set NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME to an interface that exists, is up and has an
address on every node (`ip -br addr`); a prefix such as `eth` matches eth0/eth1, `=eth0` is
exact, `^docker,lo` excludes. Unset it to let NCCL choose.

## Example
```
[trainer3]:twshared1016:1958:1958 [3] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth2
[trainer0|0]:ncclInternalError: Internal check failed.
[trainer0|0]:Last error:
[trainer0|0]:ncclSocketInit: connecting to address  with family 59936 is neither AF_INET(2) nor AF_INET6(10)
```
"""

from __future__ import annotations

from collections.abc import Iterator

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Finding, Rule, evidence_of, first_ts, ranks_of, subject


class NoSocketInterface(Rule):
    code = "NCCL001"
    slug = "no-socket-interface"
    cause = "no_socket_interface"
    severity = "critical"

    def check(self, job: Job) -> Iterator[Finding]:
        rows = job.rows("no_socket_interface")
        if job.rows("nccl_subnet_mismatch"):
            # (no listening interface because none is in NCCL_COMM_ID's subnet: NCCL006's)
            rows = [r for r in rows if "No usable listening interface" not in r["text"]]
        if not rows:
            return
        settings = job.rows("socket_ifname")
        values = sorted({f"{r['data']['var']}={r['data']['value']}" for r in settings})
        values += sorted({f"GLOO_SOCKET_IFNAME={r['data']['ifname']}" for r in rows
                          if r["data"].get("ifname")} - set(values))
        ranks = ranks_of(rows)
        who = subject(ranks, "A rank")
        summary = f"{who} found no usable socket interface"
        resolved = sorted({str(r["data"]["addr"]) for r in rows if r["data"].get("addr")})
        summary += f" ({', '.join(values)} matches no interface with an address)." if values \
            else (f": its host name resolves to {', '.join(resolved)}, an address no interface "
                  "of the host has (Gloo picks its interface so when GLOO_SOCKET_IFNAME is "
                  "unset)." if resolved else ".")
        yield self.finding(summary, evidence=[evidence_of(r) for r in (settings[:1] + rows[:2])],
                           ranks=ranks, hosts=[r["host"] for r in rows], confidence=0.9,
                           ts=first_ts(rows), details={"settings": values})
