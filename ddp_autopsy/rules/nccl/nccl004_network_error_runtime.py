"""The network failed under a running job.

## What it detects
Connection resets and receive failures between ranks in NCCL's socket transport ("Call to recv
from 10.0.0.2<33759> failed : Connection reset by peer"), InfiniBand completion errors
("Got completion from peer ... with status=12", i.e. IBV_WC_RETRY_EXC_ERR) and fatal IB async
events. Reported as the root cause only when nothing else failed first: a peer that crashed
resets its connections too.

## Why it hangs or kills the job
A collective in flight loses its connection; NCCL reports ncclRemoteError or ncclSystemError and
the watchdog takes the process down, and the others follow.

## Evidence
The transport error lines with the peer address and the decoded IB status.

## Remedy
Check the links between the named hosts (NIC and switch counters, `ibstat`, cabling, link
flaps), exclude flaky nodes, and for IB retry exhaustion consider `NCCL_IB_TIMEOUT`/
`NCCL_IB_RETRY_CNT`. If a rank crashed first, fix that instead.

## Example
```
torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, remote process exited or there was a network error, NCCL version 2.21.5
ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.
Last error:
socketProgressOpt: Call to recv from 172.16.0.4<33759> failed : Connection reset by peer
```
"""

from __future__ import annotations

from collections.abc import Iterator

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Finding, Rule

IB_STATUS = {4: "IBV_WC_LOC_PROT_ERR", 5: "IBV_WC_WR_FLUSH_ERR", 10: "IBV_WC_REM_ACCESS_ERR",
             12: "IBV_WC_RETRY_EXC_ERR (peer unreachable or link down)",
             13: "IBV_WC_RNR_RETRY_EXC_ERR"}


class NetworkErrorRuntime(Rule):
    code = "NCCL004"
    slug = "network-error-runtime"
    cause = "network_error_runtime"
    severity = "error"

    def check(self, job: Job) -> Iterator[Finding]:
        rows = job.rows("network_error")
        if not rows:
            return
        peers = sorted({r["data"]["peer"] for r in rows if r["data"].get("peer")})
        statuses = sorted({r["data"]["status"] for r in rows
                           if r["data"].get("status") is not None})
        what = "; ".join(IB_STATUS.get(s, f"IB status {s}") for s in statuses)
        summary = "The network failed under the running job"
        if peers:
            summary += f": connections to {', '.join(peers[:4])} broke"
        if what:
            summary += f" ({what})"
        yield self.from_rows(rows, summary + ".", confidence=0.55,
                             details={"peers": peers, "ib_status": statuses})
