"""Where artifacts live: what a file's path says about who wrote it.

All layout knowledge is kept here, so a new layout touches one file:

- torchrun ``--log-dir``: ``<run_id>/attempt_<n>/<local_rank>/{stdout,stderr,error}.log``
- per-rank files: ``rank3.log``, ``train_rank-3.out``, ``worker-3.txt``, ``proc3.log``
  (but not ``node-rank2.log``, which names a node)
- NCCL_DEBUG_FILE ``%h.%p``: ``gpu-node7.12345``, or named ``nccl-%h-%p.log`` and the like
- SLURM per-task output (``--output=...%t...``): ``train-task3.out``, ``job_1234.task-3.log``;
  a task is a rank only when the file's lines confirm it (see ``attribution``)
- one node's directory or file: ``node-1/console.log``, ``logs/gpu-node07/rank3.log``,
  ``host-b/``, ``nid001234/``, SLURM's ``--output=slurm-%j-%N.out`` (``slurm-123-node07.out``):
  the host of every line that names none itself. Only names that say "node" or "host" (or
  SLURM's ``%j-%N``): a directory ``run-3/``, ``exp42/`` or ``worker-1/`` (a Kubernetes pod,
  whose host name is longer) is no host

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
>>> attribution_from_path("/runs/logs/node-1/console.log").host
'node-1'
>>> attribution_from_path("logs/gpu-node07/attempt_0/3/stderr.log")[1:3]
(3, 'gpu-node07')
>>> attribution_from_path("out/slurm-4242-dgx-a07.out").host
'dgx-a07'
>>> [attribution_from_path(p).host for p in ("run-3/rank0.log", "worker-1/x.log", "nodes/a.log")]
[None, None, None]
"""

from __future__ import annotations

import functools
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
# One node's directory: a name whose last word is "node"/"host"/"nid"/"compute" followed by its
# number or letter ("node-1", "node_3", "gpu-node07", "host-b", "nid001234", "compute-0-12"),
# optionally with a domain ("node-1.cluster.local"); words before it joined by "-" as in host
# names (not "test_unresolved_host0", a pytest directory). Not "node-rank2" (a node's rank, not
# its name), not "nodes", not "worker-1" (a pod: its host name is "<job>-worker-1").
NODE_DIR = re.compile(
    r"^(?:[a-z][a-z0-9]*-)*(?:node|host|nid|compute)(?:[-_]?\d[a-z0-9]*|[-_][a-z])"
    r"(?:[-_]\d+)*(?:\.[a-z][a-z0-9-]*)*$", re.I)
# A file named for its node: that word alone ("node1.log", "host-b.txt"), no other words.
NODE_FILE = re.compile(r"^(?:node|host)(?:[-_]?\d+|[-_][a-z])$", re.I)
# SLURM's --output=slurm-%j-%N.out: job id, then the node's host name.
SLURM_NODE_FILE = re.compile(
    r"^slurm-\d+(?:_\d+)?[-.](?P<host>[a-z][a-z0-9-]*\d[a-z0-9-]*)$", re.I)
NOT_HOST = re.compile(r"(?:^|[-_])(?:rank|proc|process|task|worker|attempt|step|epoch)"
                      r"[-_.]?\d", re.I)
#: How many directories up a node's directory is looked for (``node-1/<run_id>/attempt_0/3/``).
NODE_DIR_DEPTH = 4


def host_from_path(posix: str) -> str | None:
    """The host a path names by one node's file or directory (nearest first), or None.

    >>> host_from_path("a/node_3/b/c.log"), host_from_path("host-b/out.txt")
    ('node_3', 'host-b')
    >>> host_from_path("slurm-12-task3.out"), host_from_path("node-rank1/x.log")
    (None, None)
    """
    parts = posix.split("/")
    stem = SUFFIXES.sub("", parts[-1])
    m = SLURM_NODE_FILE.match(stem)
    if m and not NOT_HOST.search(m.group("host")):
        return m.group("host")
    if NODE_FILE.match(stem):
        return stem
    return next((d for d in reversed(parts[:-1][-NODE_DIR_DEPTH:]) if NODE_DIR.match(d)), None)


@functools.lru_cache(maxsize=8192)  # asked several times per file (a PathCue is immutable)
def attribution_from_path(path: str) -> PathCue:
    """What a file's path says about its writer (its rank, local rank, task, pid, host)."""
    posix = path.replace("\\", "/").split("!")[-1]
    cue = _writer_from_path(posix)
    host = cue.host or host_from_path(posix)
    if host and not cue.cue:
        return PathCue(host=host, cue="node directory or file")
    return cue._replace(host=host)


def _writer_from_path(posix: str) -> PathCue:
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
