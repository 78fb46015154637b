"""``file://`` rendezvous files (torch's FileStore): where they are and how many users they count.

A job initialised with ``init_method="file:///path"`` keeps its store in that file. Each process
that opens the store adds 1 to the ``refcount`` key and subtracts 1 when it closes it cleanly;
the last one out deletes the file. So in a live job the count equals the processes using the
file; a higher count means users of an earlier run that never left (killed), i.e. the file is
stale and may hand out that run's addresses.

The file is a sequence of records ``<u32 key length><key><u32 value length><value>``
(little-endian); a key's latest record is its value. Only counts are kept, never the values
(they are socket addresses and the store's own data).
"""

from __future__ import annotations

import errno
import os
import re
import struct
from collections.abc import Iterable
from typing import Any

from ddp_autopsy.collectors.access import Access, Refused

FILE_URL = re.compile(r"file://(/[^\s'\",;)\]}]+)")
MAX_READ = 16 << 20


def urls_in(texts: Iterable[str]) -> list[str]:
    """Paths of the ``file://`` URLs in command-line arguments and environment values."""
    found: dict[str, None] = {}
    for text in texts:
        for m in FILE_URL.finditer(text):
            found.setdefault(m.group(1), None)
    return list(found)


def read_store(path: str, access: Access | None = None) -> dict[str, Any]:
    """What the FileStore at ``path`` says: size, records, keys, and its ``refcount``. Read as
    the job's user may (``access``); a store that user may not read is reported unreadable."""
    try:
        fd = (access or Access(None)).open(path)
    except Refused:
        return {"path": path, "exists": None, "unreadable": True}
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.EINVAL, errno.ENOTDIR):
            return {"path": path, "exists": False}
        raise
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        data = fh.read(MAX_READ)
    out: dict[str, Any] = {"path": path, "exists": True, "size": size,
                           "truncated_read": size > len(data)}
    records, keys, refcount, pos = 0, set(), None, 0
    while pos + 4 <= len(data):
        (klen,) = struct.unpack_from("<I", data, pos)
        if pos + 4 + klen + 4 > len(data):
            break
        key = data[pos + 4:pos + 4 + klen]
        (vlen,) = struct.unpack_from("<I", data, pos + 4 + klen)
        start = pos + 8 + klen
        if start + vlen > len(data):
            break
        value = data[start:start + vlen]
        records, pos = records + 1, start + vlen
        keys.add(key)
        if key.rstrip(b"/").endswith(b"refcount") and value.lstrip(b"-").isdigit():
            refcount = int(value)
    # Only a whole file of well-formed records (or one with a refcount key) is a FileStore.
    filestore = refcount is not None or (records > 0 and pos == len(data))
    out.update(filestore=filestore, records=records, keys=len(keys), refcount=refcount)
    return out
