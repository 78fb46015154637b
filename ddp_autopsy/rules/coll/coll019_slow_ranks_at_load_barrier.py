"""Some ranks had not finished loading when a framework's barrier after loading timed out.

## What it detects
A serving framework's own barrier after every rank loads its weights, which fails when some
ranks are still loading at its timeout: SGLang's `ModelRunner` (`dist_barrier_after_load`, a
`monitored_barrier` of the tensor-parallel group) raises "TP rank 1 could finish the model
loading, but there are other ranks that didn't finish loading. It is likely due to unexpected
failures (e.g., OOM) or a slow node." on the ranks that did finish. Read when nothing else in
the inputs says a rank failed (an OOM, a crash: those come first).

## Why it hangs or kills the job
The ranks that finished wait in the barrier for the slow ones; at the barrier's timeout
(SGLang: `UNBALANCED_MODEL_LOADING_TIMEOUT_S`, 300 s, later 480 s) they give up and the server
does not start. The slow ranks were alive: a node reading the weights from a cold or shared file
system, a throttled disk, more weights on some ranks than others.

## Evidence
The barrier's message on the ranks that finished.

## Remedy
Make loading equally fast on every node (weights on local disk or pre-warmed in the page cache,
not one NFS export read cold by every node at once), or raise the framework's timeout (SGLang's
`UNBALANCED_MODEL_LOADING_TIMEOUT_S` in model_runner.py: a constant in most releases, an
environment override in some); if a rank did fail while loading, its own log says so: fix that.

## Example
```
ValueError: TP rank 1 could finish the model loading, but there are other ranks that didn't finish loading. It is likely due to unexpected failures (e.g., OOM) or a slow node.
```
"""

from __future__ import annotations

from collections.abc import Iterator

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Finding, Rule

BARRIER_TEXT = "could finish the model loading, but there are other ranks"


class SlowRanksAtLoadBarrier(Rule):
    code = "COLL019"
    slug = "slow-ranks-at-load-barrier"
    cause = "straggler"

    def check(self, job: Job) -> Iterator[Finding]:
        rows = job.rows("load_barrier_unfinished")
        if not rows or job.rows("oom"):
            return
        # (the barrier's own ValueError is the finished ranks' crash: any other is a failure)
        crashes = job.crashes.events
        if crashes.height and not crashes["text"].str.contains(BARRIER_TEXT, literal=True).all():
            return
        done = sorted({int(r["data"]["tp_rank"]) for r in rows if "tp_rank" in r["data"]})
        who = (f"tensor-parallel rank{'s' if len(done) > 1 else ''} "
               f"{', '.join(map(str, done))}" if done else "some ranks")
        yield self.from_rows(
            rows, f"Some ranks had not finished loading the model when the barrier after "
            f"loading timed out on {who}, which had: one node or rank was slow to load (a cold "
            "or shared file system, a slower disk), or failed while loading without a line in "
            "the inputs.", shown=2, ranks=(), confidence=0.5, details={"finished": done})
