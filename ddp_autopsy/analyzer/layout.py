"""Where artifacts live: what a file's path says about who wrote it.

All layout knowledge is kept here, so a new layout touches one file:

- torchrun ``--log-dir``: ``<run_id>/attempt_<n>/<local_rank>/{stdout,stderr,error}.log``
- per-rank files: ``rank3.log``, ``train_rank-3.out``, ``worker-3.txt``, ``proc3.log``
  (but not ``node-rank2.log``, which names a node)
- NCCL_DEBUG_FILE ``%h.%p``: ``gpu-node7.12345``, or named ``nccl-%h-%p.log`` and the like
- SLURM per-task output (``--output=...%t...``): ``train-task3.out``, ``job_1234.task-3.log``;
  a task is a rank only when the file's lines confirm it (see ``attribution``)

>>> attribution_from_path("logs/0f3e/attempt_0/2/stderr.log")
PathCue(rank=None, local_rank=2, host=None, pid=None, task=None, cue='torchrun --log-dir path')
>>> attribution_from_path("out/rank-3.txt").rank
3
>>> attribution_from_path("out/worker-3.txt").rank is None  # a pod or node, not a rank
True
>>> attribution_from_path("nccl_logs/nccl-gpu-node7-12345.log")[2:4]
('gpu-node7', 12345)
>>> attribution_from_path("slurm/train-task3.out").task
3
>>> attribution_from_path("node-rank2.log").rank is None
True
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import NamedTuple


class PathCue(NamedTuple):
    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    task: int | None = None
    cue: str | None = None


LOG_DIR = re.compile(
    r"(?:^|/)attempt_(?P<attempt>\d+)/(?P<lr>\d+)/(?:stdout|stderr|error)\.(?:log|json)$"
)
# Not "worker-N": Kubernetes (PyTorchJob's master-0, worker-0...) and Ray name pods and nodes
# so, and a pod holds several ranks, or its ranks start after the master's.
RANK_NAME = re.compile(
    r"(?:^|[^a-z0-9])(?:global[-_]?)?(?:rank|proc|process)[-_.]?(?P<n>\d+)(?!\d)", re.I
)
TASK_NAME = re.compile(r"(?:^|[^a-z0-9])task[-_.]?(?P<n>\d+)(?!\d)", re.I)
NODE_NAME = re.compile(r"node[-_]?(?:rank)?[-_]?\d", re.I)
NCCL_DEBUG_FILE = re.compile(r"^(?P<host>[A-Za-z][\w-]*)\.(?P<pid>\d{2,})$")
NCCL_NAMED = re.compile(
    r"nccl[^/]*?[._-](?P<host>[A-Za-z][\w-]*?)[._-](?P<pid>\d{2,})(?:\.(?:log|txt|out))?$", re.I
)
SUFFIXES = re.compile(r"(?:\.(?:log|txt|out|err))?(?:\.(?:gz|bz2|xz|zst))?$", re.I)


def attribution_from_path(path: str) -> PathCue:
    posix = path.replace("\\", "/").split("!")[-1]
    m = LOG_DIR.search(posix)
    if m:
        return PathCue(local_rank=int(m.group("lr")), cue="torchrun --log-dir path")
    name = re.sub(r"\.(?:gz|bz2|xz|zst)$", "", PurePosixPath(posix).name, flags=re.I)
    m = NCCL_DEBUG_FILE.match(name) or NCCL_NAMED.search(name)
    if m:
        return PathCue(host=m.group("host"), pid=int(m.group("pid")), cue="NCCL_DEBUG_FILE name")
    stem = SUFFIXES.sub("", name)
    m = TASK_NAME.search(stem)
    if m:
        return PathCue(task=int(m.group("n")), cue="SLURM task in file name")
    if NODE_NAME.search(stem):
        return PathCue()
    m = RANK_NAME.search(stem)
    if m:
        return PathCue(rank=int(m.group("n")), cue="file name")
    return PathCue()
