"""The job rendezvoused through a `file://` init file left over from an earlier run.

## What it detects
A job whose init method is a file (`init_method="file:///…"`, `--dist-url file:///…`, seen in
its printed arguments, its logs, its command line or its environment) and whose ranks then
failed to connect to their peers during init: Gloo's "connectFullMesh failed … Connection
refused", its last "failed to connect, willRetry=0", or NCCL's bootstrap connect errors (the
bootstrap root's address also travels through the store). `collect` also reads the file's
`refcount` (each process using the store adds 1 and removes it on a clean exit): more users
than the world size means processes of an earlier run never left. With no failure, that alone
is reported as information (a hazard for the next launch). Without collect, the store-based
barrier says the same: more workers checked in than the world size ("Waiting in store based
barrier ... (world_size=6, worker_count=287 ...") — a store still holding an earlier run's
check-ins.

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
from typing import Any

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
        # NCCL names the bootstrap in the line, or in the return chain it prints after it
        # ("NCCL INFO bootstrap.cc:100 -> 2") from the same process.
        in_bootstrap = {(r["source"], r["pid"]) for r in job.rows("nccl_error_trace")
                        if "bootstrap" in str(r["data"].get("file", ""))}
        failures = job.rows("gloo_connect_failure") + [
            r for r in job.rows("nccl_connect_failure")
            if "ootstrap" in r["text"] or (r["source"], r["pid"]) in in_bootstrap]
        failures.sort(key=lambda r: "Connection refused" not in r["text"])
        files = _collected_files(job)
        world = job.world_size
        for f, host in files:
            users = world or f.get("local_users")
            if isinstance(f.get("refcount"), int) and isinstance(users, int) \
                    and f["refcount"] > users:
                yield self._overcounted(job, f, host, users, failures)
                return
        # More check-ins than the world size, while waiting or in the barrier's timeout.
        over = [r for r in job.rows("store_barrier_wait", "store_clients_timeout")
                if r["data"]["joined"] > r["data"]["world"]]
        if over:
            yield self._over_barrier(job, over, files)
            return
        if not failures:
            return
        path, evidence = _named_init_file(job, files)
        if path is None:
            return
        ranks = ranks_of(failures)
        yield self.finding(
            f"{subject(ranks, 'A rank')} could not connect to a peer address read from the "
            f"init file {path}{_peer(failures)}: the file is left over from an earlier run "
            "that did not exit cleanly, and holds that run's addresses.",
            evidence=[*evidence, evidence_of(failures[0])], ranks=ranks, confidence=0.85,
            ts=first_ts(failures), details={"init_file": path},
        )

    def _over_barrier(self, job: Job, rows: list[dict[str, Any]],
                      files: list[tuple[dict[str, Any], str]]) -> Finding:
        """The store-based barrier counts more workers than the world size."""
        d = max(rows, key=lambda r: r["data"]["joined"])["data"]
        path, _ = _named_init_file(job, files)
        where = f"the init file {path}" if path else "the rendezvous store"
        return self.from_rows(
            rows, f"{d['joined']} workers checked in at the store barrier of a world of "
            f"{d['world']}: {where} still holds the check-ins of an earlier run that did not exit "
            "cleanly, so the barrier's count is wrong and the ranks cannot agree.", shown=2,
            ranks=(), confidence=0.8,
            details={"init_file": path, "worker_count": d["joined"], "world_size": d["world"]})

    def _overcounted(self, job: Job, f: dict[str, Any], host: str, world: int,
                     failures: list[dict[str, Any]]) -> Finding:
        """An init file collect read, counting more users than the world size."""
        summary = (f"the init file {f['path']} counts {f['refcount']} users, more than the "
                   f"world size of {world}: processes of an earlier run opened it and never "
                   "closed it (killed), so it still holds that run's addresses.")
        in_init = _ranks_in_init(job)
        if failures:
            ranks = ranks_of(failures) or in_init
            summary = (f"{subject(ranks_of(failures))} could not connect to a peer"
                       f"{_peer(failures)}: {summary}")
        elif in_init:
            ranks = in_init
            verb = "waits" if len(in_init) == 1 else "wait"
            summary = f"{subject(in_init)} {verb} in init_process_group: {summary}"
        else:  # nothing failed (yet): a hazard for the next launch
            ranks = set()
            summary = summary[0].upper() + summary[1:]
        return self.finding(
            summary, evidence=[_file_evidence(f, host), *map(evidence_of, failures[:1])],
            ranks=ranks, confidence=0.9, role=None if ranks or failures else "info",
            ts=first_ts(failures),
            details={"init_file": f["path"], "refcount": f["refcount"], "world_size": world},
        )


def _collected_files(job: Job) -> list[tuple[dict[str, Any], str]]:
    """``(file, host)`` of the FileStore init files collect read (bundle manifests)."""
    return [(f, str(b.manifest.get("host") or "host")) for b in job.bundles
            for f in b.manifest.get("init_files") or []
            if isinstance(f, dict) and f.get("filestore") and f.get("path")]


def _file_evidence(f: dict[str, Any], host: str) -> Evidence:
    return Evidence(path=f"{host} (collect: init file)", line=None, rank=None, host=host,
                    text=f"{f['path']}: refcount {f.get('refcount')}, {f.get('keys')} keys, "
                    f"{f.get('size')} bytes")


def _named_init_file(job: Job, files: list[tuple[dict[str, Any], str]]
                     ) -> tuple[str | None, list[Evidence]]:
    """The init file a log line, collect or an environment variable names, with its evidence."""
    urls = job.rows("init_file_url")
    if urls:
        return urls[0]["data"].get("path"), [evidence_of(urls[0])]
    if files:
        f, host = files[0]
        return f["path"], [_file_evidence(f, host)]
    for row in job.env.filter(pl.col("value").str.starts_with("file://")).head(1).iter_rows(
            named=True):
        return row["value"].removeprefix("file://"), [Evidence(
            path=f"{row['host']} pid {row['pid']} (collect)", line=None,
            text=f"{row['key']}={row['value']}", rank=row["rank"], host=row["host"])]
    return None, []


def _peer(failures: list[dict[str, Any]]) -> str:
    d = failures[0]["data"]
    why = "connection refused" if "Connection refused" in failures[0]["text"] else \
        d.get("why", "failed").lower()
    return f" ({d['addr']}:{d['port']}, {why})" if d.get("addr") and d.get("port") else ""


def _ranks_in_init(job: Job) -> set[int]:
    """Ranks whose stack dumps show them inside ``init_process_group``."""
    hits = job.stacks.filter(pl.col("func") == "init_process_group")["rank"]
    return set(hits.drop_nulls().unique().to_list())
