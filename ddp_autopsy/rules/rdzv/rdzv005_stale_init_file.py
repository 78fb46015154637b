"""The job rendezvoused through a `file://` init file left over from an earlier run.

## What it detects
A job whose init method is a file (`init_method="file:///…"`, `--dist-url file:///…`, seen in
its printed arguments, its logs or its environment) and whose ranks then failed to connect to
their peers during init: Gloo's "connectFullMesh failed … Connection refused", its last
"failed to connect, willRetry=0", or NCCL's bootstrap connect errors (the bootstrap root's
address also travels through the store).

## Why it hangs or kills the job
`FileStore` keeps every key of the rendezvous in that file and deletes it only when the last
process of the job exits cleanly. After a run is killed (OOM killer, preemption, `scancel`,
Ctrl-C) the file stays, with the dead run's addresses in it. A rank of the next run that reads a
peer's key before the peer has rewritten it connects to a port nobody listens on: refused, it
gives up, and the peers that did start wait in `init_process_group` until their timeout.
Whether a rank reads a stale address depends on which side of each pair connects (Gloo compares
the two listening addresses), so one stale file can break one relaunch and not the next.

## Evidence
The line naming the init file, and the connect failure with the stale address.

## Remedy
Delete the init file before relaunching, and give each launch its own path (e.g.
`file:///shared/init_${SLURM_JOB_ID}`), or rendezvous over TCP instead (`env://` with
MASTER_ADDR/MASTER_PORT, or torchrun's `--rdzv-endpoint`).

## Example
```
| distributed init (rank 1): file:///nfs/jobs/run7/dist_init
[E1122 07:41:47.965867341 ProcessGroupGloo.cpp:67] Gloo connectFullMesh failed with [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:152] timed out connecting: SO_ERROR: Connection refused, remote=[10.1.0.4]:21926$1
```
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Evidence, Finding, Rule, evidence_of, first_ts, ranks_of, subject


class StaleInitFile(Rule):
    code = "RDZV005"
    slug = "stale-init-file"
    cause = "stale_init_file"
    severity = "critical"

    def check(self, job: Job) -> Iterator[Finding]:
        # NCCL's bootstrap root address travels through the store too (the ncclUniqueId).
        failures = job.rows("gloo_connect_failure") + [
            r for r in job.rows("nccl_connect_failure") if "ootstrap" in r["text"]]
        if not failures:
            return
        urls = job.rows("init_file_url")
        evidence = [evidence_of(r) for r in urls[:1]]
        path = urls[0]["data"].get("path") if urls else None
        if path is None and job.env.height:
            in_env = job.env.filter(pl.col("value").str.starts_with("file://")).head(1)
            for row in in_env.iter_rows(named=True):
                path = row["value"].removeprefix("file://")
                evidence.append(Evidence(path=f"{row['host']} pid {row['pid']} (collect)",
                                         line=None, text=f"{row['key']}={row['value']}",
                                         rank=row["rank"], host=row["host"]))
        if path is None:
            return
        failures.sort(key=lambda r: "Connection refused" not in r["text"])
        ranks = ranks_of(failures)
        d = failures[0]["data"]
        why = "connection refused" if "Connection refused" in failures[0]["text"] else \
            d.get("why", "failed").lower()
        peer = f" ({d['addr']}:{d['port']}, {why})" if d.get("addr") and d.get("port") else ""
        yield self.finding(
            f"{subject(ranks, 'A rank')} could not connect to a peer address read from the "
            f"init file {path}{peer}: the file is left over from an earlier run that did not "
            "exit cleanly, and holds that run's addresses.",
            evidence=[*evidence, evidence_of(failures[0])], ranks=ranks, confidence=0.85,
            ts=first_ts(failures), details={"init_file": path},
        )
