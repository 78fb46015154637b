"""Progress of long reads, on a terminal only.

The CLI wraps its ``load`` in :func:`reading`::

    with progress.reading(enabled=fmt == "text"):
        job = load(paths)

Nothing is shown when disabled (``--format json``), when stderr is not a terminal (piped,
CI), or for runs shorter than :data:`DELAY` seconds; otherwise a transient rich line on stderr
says the bytes read so far, the rate and the file being read.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import PurePath
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)

from ddp_autopsy.analyzer.events import progress_to

#: Seconds of reading before the progress line appears.
DELAY = 1.0


class _Reporter:
    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._t0 = time.monotonic()
        self._done = 0
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def __call__(self, source: str, nbytes: int) -> None:
        self._done += nbytes
        if self._bar is None:
            if time.monotonic() - self._t0 < DELAY:
                return
            self._bar = Progress(
                TextColumn("reading logs"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                TimeElapsedColumn(), TextColumn("{task.description}"),
                console=Console(file=self._stream), transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task("", total=None, completed=self._done)
        assert self._task is not None
        name = PurePath(source.split("!")[-1]).name
        self._bar.update(self._task, completed=self._done, description=name)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


@contextmanager
def reading(enabled: bool = True, stream: TextIO | None = None) -> Iterator[None]:
    """Show the progress of every source read within this block (see the module doc)."""
    out = stream or sys.stderr
    if not enabled or not out.isatty():
        yield
        return
    reporter = _Reporter(out)
    try:
        with progress_to(reporter):
            yield
    finally:
        reporter.close()
