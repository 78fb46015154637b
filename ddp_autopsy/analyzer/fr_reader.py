"""Reading many Flight Recorder dumps on two cores.

With the native reader (``_frpickle``), :func:`read_native`: a thread of its own reads each
file and runs its opcodes without the GIL (phase A, ~1 ms per 2,000-entry dump), up to
:data:`AHEAD` dumps ahead, while the caller makes the Python objects and frames of the dumps
already parsed (phase B and :class:`~ddp_autopsy.analyzer.flight_recorder.DumpReader`). One
process, no transfer: both cores are busy, and memory stays that of one process.

Without it, reading a dump holds the GIL (~6 ms with Python's unpickler), so a second core
helps only from a second process. :func:`read_files` starts one helper process
(``python -m ddp_autopsy.analyzer.fr_reader DIR``, not ``multiprocessing``: nothing of the
caller's ``__main__`` is imported again) when there are enough dumps and a second core. Both
take dumps from a shared list, the caller from the front and the helper from the back, so the
split follows how busy each core really is. The helper sends its frames back as one LZ4
Arrow IPC file (~5 MB for 512 dumps: constant columns compress to nothing) and its dumps'
other fields as JSON.

The two ends are claimed without a lock, through two 64-bit counters in a shared file: the
caller publishes the next index it takes, the helper the lowest index it has taken. At the
meeting point both may read the same dump; the caller's copy is kept. If the helper fails
(cannot start, crashes, is killed, writes something unreadable), the caller reads what it had
claimed: the result is the same, only slower.

``DDP_AUTOPSY_WORKERS=0`` turns the thread and the helper off; ``DDP_AUTOPSY_WORKERS=1``
starts the helper for any two dumps or more when the native reader is off (tests); unset, it
is started for 32 dumps and 48 MB or more, on two cores.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl

from ddp_autopsy.analyzer.flight_recorder import (
    COLLECTIVES_SCHEMA,
    MAX_DUMP_BYTES,
    DumpReader,
    FRDump,
    _frpickle,
    dump_identity,
    native_available,
    read_dump,
)

#: Below these the helper's start (~0.2 s) and the frame transfer cost more than they save.
MIN_FILES = 32
MIN_BYTES = 48 << 20
#: The helper claims this many dumps at a time from the back: where the two ends meet, the
#: caller waits for at most this many (its frames are built in batches all the same).
BATCH = 2
_CLAIMS = struct.Struct("<qq")  # next index the caller takes, lowest index the helper took


@dataclass(frozen=True)
class DumpFile:
    """A dump on disk: where it is, the name it is shown under, the host it came from."""

    path: str
    source: str
    host: str | None = None


def read_file(f: DumpFile, reader: DumpReader | None = None) -> FRDump:
    """Read one dump from disk; an unreadable file is a dump with that status. With a
    ``reader``, its entries follow with the reader's batch (see :class:`DumpReader`)."""
    try:
        with open(f.path, "rb") as fh:
            st = os.fstat(fh.fileno())
            # read() sized from fstat: read(MAX_DUMP_BYTES + 1) would allocate 1 GiB and shrink it
            data = fh.read() if st.st_size <= MAX_DUMP_BYTES else fh.read(MAX_DUMP_BYTES + 1)
    except OSError as err:
        rank, host = dump_identity(f.source)
        return FRDump(source=f.source, rank=rank, host=f.host or host, format="unknown",
                      status="corrupt", error=f"cannot read: {err}")
    if reader is None:
        return read_dump(data, f.source, host=f.host, mtime=st.st_mtime)
    return reader.add(data, f.source, host=f.host, mtime=st.st_mtime)


def read_paths(paths: Sequence[str]) -> list[FRDump]:
    """Read dump files named by path (scripts, benchmarks; ``job.load`` reads archive members
    and bundles too)."""
    return read_files([DumpFile(p, p) for p in paths])


def helper_wanted(files: Sequence[DumpFile], sizes: Sequence[int]) -> bool:
    """Whether a helper process is worth starting."""
    setting = os.environ.get("DDP_AUTOPSY_WORKERS", "").strip()
    if setting.isdigit():
        return int(setting) > 0
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return cores >= 2 and len(files) >= MIN_FILES and sum(sizes) >= MIN_BYTES


HELPER_COMMAND = (sys.executable, "-m", "ddp_autopsy.analyzer.fr_reader")


def read_files(files: Sequence[DumpFile], *, helper: bool | None = None,
               command: Sequence[str] = HELPER_COMMAND) -> list[FRDump]:
    """Read dumps from disk, in input order; with a helper process when it pays (``helper``
    forces the choice; ``command`` starts it and gets the work directory as last argument)."""
    if helper is None and native_available():
        helper = False  # reading on threads (read_native) costs less than a second process
    if helper is None:
        sizes = []
        for f in files:
            try:
                sizes.append(os.stat(f.path).st_size)
            except OSError:
                sizes.append(0)
        helper = helper_wanted(files, sizes)
    if not helper or len(files) < 2:
        with DumpReader() as reader:
            if reader.native and len(files) >= 2:
                return read_native(files, reader)
            return [read_file(f, reader) for f in files]
    workdir = Path(tempfile.mkdtemp(prefix="ddp-autopsy-fr-"))
    try:
        return _read_with_helper(files, workdir, command)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def reader_threads() -> int:
    """Threads that read and parse ahead of the caller: one on two cores or more (the caller
    is busy with the rest), none with ``DDP_AUTOPSY_WORKERS=0`` or one core."""
    setting = os.environ.get("DDP_AUTOPSY_WORKERS", "").strip()
    if setting.isdigit():
        return min(int(setting), 1)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return 1 if cores >= 2 else 0


#: How many dumps the threads read ahead of the caller (memory: ~3x each dump's size).
AHEAD = 8


def read_native(files: Sequence[DumpFile], reader: DumpReader) -> list[FRDump]:
    """Read dumps with the native reader's threads (``_frpickle.Reader``): they read each file
    and run the opcodes without the GIL, ahead of the caller, which makes the Python objects
    and frames; what they cannot read (not a pickle, too large, an I/O error) is read here as
    :func:`read_file` reads it."""
    native = _frpickle.Reader([os.fsencode(f.path) for f in files], reader_threads(), AHEAD)
    out = []
    for i, f in enumerate(files):
        try:
            kind, value, size, mtime = native.take(i)
        except Exception:  # e.g. MemoryError making its objects: read here
            kind = "skip"
        if kind == "skip":
            out.append(read_file(f, reader))
        else:
            out.append(reader.add_parsed(value if kind != "data" else None,
                                         value if kind == "data" else None, size, f.source,
                                         host=f.host, mtime=mtime))
    return out


def _read_with_helper(files: Sequence[DumpFile], workdir: Path,
                      command: Sequence[str]) -> list[FRDump]:
    n = len(files)
    (workdir / "files.json").write_text(json.dumps([[f.path, f.source, f.host] for f in files]))
    claims_path = workdir / "claims"
    claims_path.write_bytes(_CLAIMS.pack(0, n))
    out: list[FRDump | None] = [None] * n
    with open(claims_path, "r+b") as fh, mmap.mmap(fh.fileno(), _CLAIMS.size) as claims, \
            open(workdir / "stderr", "wb") as err:
        try:
            proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                [*command, str(workdir)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        except OSError:
            proc = None
        i = 0
        try:
            with DumpReader() as reader:
                while i < n:
                    struct.pack_into("<q", claims, 0, i + 1)  # publish, then look at the end
                    if proc is not None and i >= _CLAIMS.unpack_from(claims)[1]:
                        break
                    out[i] = read_file(files[i], reader)
                    i += 1
            if proc is not None:
                helped = _collect(proc, workdir, n)
                for k, dump in helped.items():
                    if out[k] is None:
                        out[k] = dump
        finally:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    # Whatever the helper claimed and did not deliver (it failed): read here.
    with DumpReader() as reader:
        return [d if d is not None else read_file(files[k], reader) for k, d in enumerate(out)]


def _collect(proc: subprocess.Popen[bytes], workdir: Path, n: int) -> dict[int, FRDump]:
    """The helper's dumps by index; empty when it failed (the caller reads them itself)."""
    # Its last claim is at most one batch: reading BATCH dumps and writing the frame takes
    # well under a second; a stalled helper is abandoned rather than waited for.
    try:
        code = proc.wait(timeout=30 + BATCH * 5)
    except subprocess.TimeoutExpired:
        return {}
    if code != 0:
        return {}
    try:
        meta = json.loads((workdir / "dumps.json").read_text())
        frame = pl.read_ipc(workdir / "entries.arrow") if (workdir / "entries.arrow").exists() \
            else pl.DataFrame(schema=COLLECTIVES_SCHEMA)
        if frame.schema != pl.Schema(COLLECTIVES_SCHEMA):
            return {}
        return _dumps_from(meta, frame, n)
    except (OSError, ValueError, KeyError, TypeError, pl.exceptions.PolarsError):
        return {}


# --------------------------------------------------------------------------- the helper's side

_META_FIELDS = ("source", "rank", "host", "format", "status", "error", "version",
                "comm_lib_version", "bytes", "skipped_entries", "groups")


def _dump_meta(index: int, d: FRDump) -> dict[str, Any]:
    meta = {k: getattr(d, k) for k in _META_FIELDS}
    meta.update(index=index, rows=d.entries.height,
                dumped_at=d.dumped_at.timestamp() if d.dumped_at else None,
                pg_names=sorted(d._pg_names, key=repr))
    return meta


def _dumps_from(meta: list[dict[str, Any]], frame: pl.DataFrame, n: int) -> dict[int, FRDump]:
    out: dict[int, FRDump] = {}
    offset = 0
    for m in meta:
        index, rows = int(m["index"]), int(m["rows"])
        if not 0 <= index < n or offset + rows > frame.height:
            raise ValueError("helper output does not match its input")
        d = FRDump(**{k: m[k] for k in _META_FIELDS},
                   dumped_at=datetime.fromtimestamp(m["dumped_at"], timezone.utc)
                   if m["dumped_at"] is not None else None,
                   entries=frame.slice(offset, rows))
        d._pg_names = {tuple(t) for t in m["pg_names"]}  # type: ignore[misc]
        out[index] = d
        offset += rows
    return out


def helper_main(workdir: Path) -> int:
    """Read dumps from the back of the shared list until the caller's front reaches them."""
    files = [DumpFile(*row) for row in json.loads((workdir / "files.json").read_text())]
    done: list[tuple[int, FRDump]] = []
    with open(workdir / "claims", "r+b") as fh, mmap.mmap(fh.fileno(), _CLAIMS.size) as claims, \
            DumpReader() as reader:
        hi = len(files)
        while True:
            front = _CLAIMS.unpack_from(claims)[0]
            low = max(front, hi - BATCH)
            if low >= hi:
                break
            struct.pack_into("<q", claims, 8, low)
            for k in range(hi - 1, low - 1, -1):
                done.append((k, read_file(files[k], reader)))
            hi = low
    parts = [d.entries for _, d in done if d.entries.height]
    if parts:
        pl.concat(parts, how="vertical").write_ipc(workdir / "entries.arrow.tmp",
                                                  compression="lz4")
        os.replace(workdir / "entries.arrow.tmp", workdir / "entries.arrow")
    meta = [_dump_meta(k, d) for k, d in done]
    (workdir / "dumps.json.tmp").write_text(json.dumps(meta))
    os.replace(workdir / "dumps.json.tmp", workdir / "dumps.json")
    return 0


if __name__ == "__main__":
    status = helper_main(Path(sys.argv[1]))
    # Its results are on disk: skip the interpreter's teardown (freeing every object and
    # polars' thread pool), which the caller would wait for.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
