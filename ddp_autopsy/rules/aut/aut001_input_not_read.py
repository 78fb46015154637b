"""An input could not be read (fully).

## What it detects
Files the analyzer could not read or only partly read: truncated or corrupt archives and
compressed files, unreadable files and directories, symlink loops, paths that do not exist.
(Binary files, empty files and replaced invalid UTF-8 are listed as notes only.)

## Why it hangs or kills the job
It doesn't: it is about this analysis. Evidence in the unread part is missing from the verdict.

## Evidence
The path and what went wrong.

## Remedy
Re-copy the file (a transfer may have been cut off), fix its permissions, or pass the missing
path; then analyze again.

## Example
```
train.log.gz: read stopped after line 1 (truncated or corrupt: compressed file ended before the end-of-stream marker)
```
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator

from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Evidence, Finding, Rule


class InputNotRead(Rule):
    code = "AUT001"
    slug = "input-not-read"
    role = "info"
    severity = "warning"
    requires = ()

    @classmethod
    def example_files(cls) -> dict[str, bytes]:
        data = gzip.compress(b"step 0 loss 1.0\n" * 20000)
        return {"train.log.gz": data[: len(data) // 2]}

    def check(self, job: Job) -> Iterator[Finding]:
        notes = [n for n in job.notes if n.level in ("warning", "error")]
        if not notes:
            return
        yield self.finding(
            f"{len(notes)} input(s) could not be read completely; evidence there is missing.",
            evidence=[Evidence(path=n.path, line=None, text=n.message) for n in notes[:5]],
            confidence=1.0, details={"paths": [n.path for n in notes]},
        )
