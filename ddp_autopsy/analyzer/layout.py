"""Where artifacts live: what a file's path says about who wrote it.

All layout knowledge is kept here, so a new layout touches one file:

- torchrun ``--log-dir``: ``<run_id>/attempt_<n>/<local_rank>/{stdout,stderr,error}.log``
- per-rank files: ``rank3.log``, ``train_rank-3.out``, ``worker-3.txt``, ``proc3.log``
  (but not ``node-rank2.log``, which names a node)
- NCCL_DEBUG_FILE ``%h.%p``: ``gpu-node7.12345``
- SLURM per-task output: ``slurm-<jobid>_<taskid>.out`` / ``%t`` task ids

>>> attribution_from_path("logs/0f3e/attempt_0/2/stderr.log")
PathCue(rank=None, local_rank=2, host=None, pid=None, cue='torchrun --log-dir path')
>>> attribution_from_path("out/worker-3.txt").rank
3
>>> attribution_from_path("node-rank2.log").rank is None
True
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath


@dataclass(frozen=True)
class PathCue:
    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    cue: str | None = None


LOG_DIR = re.compile(
    r"(?:^|/)attempt_(?P<attempt>\d+)/(?P<lr>\d+)/(?:stdout|stderr|error)\.(?:log|json)$"
)
RANK_NAME = re.compile(
    r"(?:^|[^a-z0-9])(?:global[-_]?)?(?:rank|worker|proc|process|task)[-_.]?(?P<n>\d+)(?!\d)", re.I
)
NODE_NAME = re.compile(r"node[-_]?(?:rank)?[-_]?\d", re.I)
NCCL_DEBUG_FILE = re.compile(r"^(?P<host>[A-Za-z][\w-]*)\.(?P<pid>\d{2,})$")


def attribution_from_path(path: str) -> PathCue:
    posix = path.replace("\\", "/").split("!")[-1]
    m = LOG_DIR.search(posix)
    if m:
        return PathCue(local_rank=int(m.group("lr")), cue="torchrun --log-dir path")
    name = PurePosixPath(posix).name
    m = NCCL_DEBUG_FILE.match(name)
    if m:
        return PathCue(host=m.group("host"), pid=int(m.group("pid")), cue="NCCL_DEBUG_FILE name")
    stem = re.sub(r"\.(log|txt|out|err|gz|bz2|xz|zst)$", "", name, flags=re.I)
    stem = re.sub(r"\.(log|txt|out|err)$", "", stem, flags=re.I)
    if NODE_NAME.search(stem):
        return PathCue()
    m = RANK_NAME.search(stem)
    if m:
        return PathCue(rank=int(m.group("n")), cue="file name")
    return PathCue()
