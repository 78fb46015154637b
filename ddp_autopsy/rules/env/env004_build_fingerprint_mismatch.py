"""The same torch message comes from different source lines on different ranks: different builds.

## What it detects
torch's C++ logger and torchelastic's glog-style logger stamp every line with the source file
and line that wrote it (`ProcessGroupNCCL.cpp:1556]`, `api.py:908]`). One build always writes a
given message from the same line, so when the same kind of message comes from, say,
`ProcessGroupNCCL.cpp:616` on some ranks and `ProcessGroupNCCL.cpp:632` on others, those ranks
run different torch builds, even when no log states a version. A process that itself writes a
message from two lines (two call sites) makes its file inconclusive: it is left out, and so are
bundled third-party sources (Gloo's `pair.cc` reports one error from several lines).

## Why it hangs or kills the job
Ranks on different torch builds can issue different collectives for the same code, disagree on
the layout of what they exchange, or time out differently; the symptoms look like a
collective mismatch or a hang with no culprit.

## Evidence
One line per build: the message with its source line, and the ranks or hosts that wrote it.

## Remedy
Run every node from one environment (one container image or module set); compare
`python -c "import torch; print(torch.__version__, torch.version.git_version)"` across nodes,
or run `ddp-autopsy collect` on each node, which records the versions.

## Example
```
[rank0]:[E1122 07:25:40.120000000 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=42, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600003 milliseconds before timing out.
[rank1]:[E1122 07:25:40.130000000 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=42, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600004 milliseconds before timing out.
[rank2]:[E1122 07:25:40.140000000 ProcessGroupNCCL.cpp:632] [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=42, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600002 milliseconds before timing out.
```
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Finding, Rule, evidence_of, writers_phrase

#: The logger's "<file>:<line>]" stamp (c10: basename; glog: a path such as torch/…/api.py).
SOURCE_STAMP = (r"(?:^|[\s\[])(?P<src>(?:[\w.-]+/)*[A-Za-z_][\w-]*\.(?:cpp|cc|hpp|h|py)):"
                r"(?P<src_line>\d+)\](?P<msg>.*)")
#: What a line must hold for SOURCE_STAMP to match (NCCL INFO lines, most events, do not).
STAMP_HINT = r"\.(?:cpp|cc|hpp|h|py):\d+\]"
#: What makes two lines of one kind the same message: their start, numbers and addresses masked
#: (one event kind covers several messages: NET/IB's "Got async event" and "Got completion").
MESSAGE_KEY = (pl.col("msg").str.replace_all(r"\([^)]*\)", "")
               .str.replace_all(r"0x[0-9a-fA-F]+|\d+", "#").str.strip_chars().str.slice(0, 40))


class BuildFingerprintMismatch(Rule):
    code = "ENV004"
    slug = "build-fingerprint-mismatch"
    cause = "version_mismatch"
    severity = "error"

    def check(self, job: Job) -> Iterator[Finding]:
        stamped = (
            # A rank's last line is whatever it printed last, not one message: never compared.
            job.active_events.filter(pl.col("kind") != "last_line")
            .filter(pl.col("text").str.contains(STAMP_HINT))  # (what SOURCE_STAMP needs: 10x
            .with_columns(                                     # faster than its groups on all)
                pl.col("text").str.extract_groups(SOURCE_STAMP).struct.unnest(),
                writer=pl.when(pl.col("rank").is_not_null())
                .then(pl.format("rank {}", pl.col("rank")))
                .when(pl.col("host").is_not_null() & pl.col("pid").is_not_null())
                .then(pl.format("{} pid {}", pl.col("host"), pl.col("pid"))),
            )
            .with_columns(pl.col("src_line").cast(pl.Int64, strict=False),
                          MESSAGE_KEY.alias("msg"))
            .drop_nulls(["src", "src_line", "writer"])
            .filter(~pl.col("src").str.contains("third_party/", literal=True))
        )
        # A writer with two lines for one (kind, file) has two call sites: inconclusive.
        per_writer = stamped.group_by("kind", "msg", "src", "writer").agg(
            pl.col("src_line").n_unique().alias("lines"), pl.col("src_line").first())
        ambiguous = per_writer.filter(pl.col("lines") > 1).select("kind", "msg", "src").unique()
        builds = (
            per_writer.join(ambiguous, on=["kind", "msg", "src"], how="anti")
            .group_by("kind", "msg", "src", "src_line")
            .agg(pl.col("writer").sort())
            .filter(pl.len().over("kind", "msg", "src") > 1)
            .sort("kind", "msg", "src", pl.col("writer").list.len(),
                  descending=[False, False, False, True])
        )
        if builds.is_empty():
            return
        kind, msg, src = builds.row(0)[:3]
        variants = builds.filter((pl.col("kind") == kind) & (pl.col("msg") == msg)
                                 & (pl.col("src") == src)).rows(named=True)
        minority = [w for v in variants[1:] for w in v["writer"]]
        ranks = [int(w[5:]) for w in minority if w.startswith("rank ")]
        desc = "; ".join(f"{src}:{v['src_line']} on {writers_phrase(v['writer'])}" for v in variants)
        first = stamped.filter((pl.col("kind") == kind) & (pl.col("msg") == msg)
                               & (pl.col("src") == src)) \
            .unique("src_line", keep="first", maintain_order=True)
        evidence = [evidence_of(row) for v in variants[:3] for row in
                    first.filter(pl.col("src_line") == v["src_line"]).iter_rows(named=True)]
        yield self.finding(
            f"The same message ({kind.replace('_', ' ')}) comes from different source lines, "
            f"so the ranks run different torch builds: {desc}.",
            evidence=evidence, ranks=ranks, confidence=0.6,
            details={"kind": kind, "file": src,
                     "lines": {str(v["src_line"]): v["writer"] for v in variants}},
        )

