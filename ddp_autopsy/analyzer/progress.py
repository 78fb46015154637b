"""Progress of long reads, on a terminal only.

The CLI wraps its ``load`` in :func:`reading`::

    with progress.reading(enabled=fmt == "text"):
        job = load(paths)

Nothing is shown when disabled (``--format json``), when stderr is not a terminal (piped,
CI), or for runs shorter than :data:`DELAY` seconds; otherwise a transient rich line on stderr
says the bytes read so far, the rate and the file being read — and, when the bytes to read are
known beforehand (:func:`input_bytes`: plain files, no archive or bundle), the percentage done
and the time left.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, TextIO

from ddp_autopsy.analyzer.events import progress_to

if TYPE_CHECKING:  # rich is imported when a bar is shown (10-40 ms of start-up otherwise)
    from rich.progress import Progress, TaskID

#: Seconds of reading before the progress line appears.
DELAY = 1.0


#: Inputs whose bytes read are not their size on disk: archives (decompressed as read).
_PACKED = (".gz", ".tgz", ".tar", ".zip", ".xz", ".bz2", ".zst", ".lz4")
#: Files looked at by :func:`input_bytes` before it gives up (a huge tree: no total).
MAX_FILES = 100_000


def input_bytes(paths: Iterable[Path]) -> int | None:
    """The bytes an analysis of ``paths`` reads, when that is their size on disk: regular
    files and directories of them. None for archives (read decompressed), collect bundles
    (their pre-parsed summaries replace most reading) and unreadable or huge trees."""
    total = seen = 0
    for path in paths:
        try:
            if path.is_file():
                if path.name.lower().endswith(_PACKED):
                    return None
                total += path.stat().st_size
                continue
            if not path.is_dir():
                return None
            for root, _dirs, files in os.walk(path):
                if "manifest.json" in files:
                    return None
                for name in files:
                    seen += 1
                    if seen > MAX_FILES or name.lower().endswith(_PACKED):
                        return None
                    full = os.path.join(root, name)
                    if not os.path.islink(full):
                        total += os.stat(full).st_size
        except OSError:
            return None
    return total or None


class _Reporter:
    def __init__(self, stream: TextIO, total: int | None = None) -> None:
        self._total = total
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
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            known = (TaskProgressColumn(), TimeRemainingColumn()) if self._total else ()
            self._bar = Progress(
                TextColumn("reading logs"), BarColumn(), *known, DownloadColumn(),
                TransferSpeedColumn(), TimeElapsedColumn(), TextColumn("{task.description}"),
                console=Console(file=self._stream), transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task("", total=self._total, completed=self._done)
        assert self._task is not None
        name = PurePath(source.split("!")[-1]).name
        if self._total is not None and self._done > self._total:
            self._total = None  # more than the estimate (a file grew): no percentage
            self._bar.update(self._task, total=None)
        self._bar.update(self._task, completed=self._done, description=name)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


@contextmanager
def reading(enabled: bool = True, stream: TextIO | None = None,
            paths: Iterable[Path] | None = None) -> Iterator[None]:
    """Show the progress of every source read within this block (see the module doc);
    ``paths``: the inputs, for a percentage and the time left when their size tells."""
    out = stream or sys.stderr
    if not enabled or not out.isatty():
        yield
        return
    reporter = _Reporter(out, input_bytes(paths) if paths is not None else None)
    try:
        with progress_to(reporter):
            yield
    finally:
        reporter.close()
