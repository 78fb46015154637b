"""The job rendezvoused through a `file://` init file left over from an earlier run.

## What it detects
A job whose init method is a file (`init_method="file:///…"`, `--dist-url file:///…`, seen in
its printed arguments, its logs, its command line or its environment) and whose ranks then
failed to connect to their peers during init: Gloo's "connectFullMesh failed … Connection
refused", its last "failed to connect, willRetry=0", or NCCL's bootstrap connect errors (the
bootstrap root's address also travels through the store). `collect` also reads the file's
`refcount` (each process using the store adds 1 and removes it on a clean exit): more users
than the world size means processes of an earlier run never left. With no failure, that alone
is reported as information (a hazard for the next launch).

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
        failures = job.rows("gloo_connect_failure") + [
            r for r in job.rows("nccl_connect_failure") if "ootstrap" in r["text"]]
        failures.sort(key=lambda r: "Connection refused" not in r["text"])
        counted = _overcounted_files(job)
        if counted:
            yield self._from_bundle(job, counted[0], failures)
            return
        if not failures:
            return
        path, evidence = _named_init_file(job)
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

    def _from_bundle(self, job: Job, found: tuple[dict[str, Any], int, str],
                     failures: list[dict[str, Any]]) -> Finding:
        f, world, host = found
        in_init = _ranks_in_init(job)
        ranks = ranks_of(failures) or in_init
        what = (f"{subject(ranks_of(failures))} could not connect to a peer{_peer(failures)}"
                if failures else f"{subject(in_init)} wait{'s' if len(in_init) == 1 else ''} "
                "in init_process_group" if in_init else "")
        summary = (f"The init file {f['path']} counts {f['refcount']} users, more than the "
                   f"world size of {world}: processes of an earlier run opened it and never "
                   "closed it (killed), so it still holds that run's addresses.")
        evidence = [Evidence(path=f"{host} (collect: init file)", line=None, rank=None,
                             host=host, text=f"{f['path']}: refcount {f['refcount']}, "
                             f"{f.get('keys')} keys, {f.get('size')} bytes")]
        evidence += [evidence_of(r) for r in failures[:1]]
        return self.finding(
            (f"{what}: " + summary[0].lower() + summary[1:]) if what else summary,
            evidence=evidence, ranks=ranks, confidence=0.9,
            role=None if what else "info", ts=first_ts(failures),
            details={"init_file": f["path"], "refcount": f["refcount"], "world_size": world},
        )


def _overcounted_files(job: Job) -> list[tuple[dict[str, Any], int, str]]:
    """Init files (seen by collect) whose refcount exceeds the job's world size."""
    out = []
    for b in job.bundles:
        host = str(b.manifest.get("host") or "host")
        for f in b.manifest.get("init_files") or []:
            world = job.world_size or f.get("local_users")
            if isinstance(f, dict) and f.get("filestore") and isinstance(f.get("refcount"), int) \
                    and isinstance(world, int) and f["refcount"] > world:
                out.append((f, world, host))
    return out


def _named_init_file(job: Job) -> tuple[str | None, list[Evidence]]:
    urls = job.rows("init_file_url")
    if urls:
        return urls[0]["data"].get("path"), [evidence_of(urls[0])]
    for b in job.bundles:
        for f in b.manifest.get("init_files") or []:
            if isinstance(f, dict) and f.get("filestore") and f.get("path"):
                host = str(b.manifest.get("host") or "host")
                return f["path"], [Evidence(
                    path=f"{host} (collect: init file)", line=None, rank=None, host=host,
                    text=f"{f['path']}: refcount {f.get('refcount')}, {f.get('keys')} keys")]
    if job.env.height:
        for row in job.env.filter(pl.col("value").str.starts_with("file://")).head(1).iter_rows(
                named=True):
            return row["value"].removeprefix("file://"), [Evidence(
                path=f"{row['host']} pid {row['pid']} (collect)", line=None,
                text=f"{row['key']}={row['value']}", rank=row["rank"], host=row["host"])]
    return None, []


def _peer(failures: list[dict[str, Any]]) -> str:
    if not failures:
        return ""
    d = failures[0]["data"]
    why = "connection refused" if "Connection refused" in failures[0]["text"] else \
        d.get("why", "failed").lower()
    return f" ({d['addr']}:{d['port']}, {why})" if d.get("addr") and d.get("port") else ""


def _ranks_in_init(job: Job) -> set[int]:
    """Ranks whose main thread the stack dumps show inside ``init_process_group``."""
    if not job.stacks.height or "func" not in job.stacks.columns:
        return set()
    hits = job.stacks.filter(pl.col("func") == "init_process_group")
    return {int(r) for r in hits["rank"].drop_nulls().unique().to_list()} \
        if "rank" in hits.columns else set()
