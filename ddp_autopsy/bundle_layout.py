"""Where things lie in a collect bundle (docs/bundle.md): the one layout the writer
(``collectors/``) and the reader (``analyzer/``) share.

The reader follows the manifest's own pointers (``network``, each process's ``info`` and
``stack``, ``logs[].path``, ``fr_dumps``, ``summaries.events``) and falls back to these paths
only for bundles that predate a pointer.

>>> process_info(4242), fr_dump("nccl_trace_rank_0"), fr_dump("nccl_trace_rank_0", 2)
('processes/4242/info.json', 'fr/nccl_trace_rank_0', 'fr/2/nccl_trace_rank_0')
>>> log_copy("/tmp/run/0.log")
'logs/tmp/run/0.log'
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

SCHEMA = "ddp-autopsy/bundle/1"
#: Manifests whose ``schema`` starts with this are bundles (any version of the layout).
SCHEMA_PREFIX = "ddp-autopsy/bundle/"

MANIFEST = "manifest.json"
#: The only locals a process's ``stack.json`` keeps (``py-spy dump --locals``): the arguments of
#: torch.distributed's own calls that say whom a rank waits for (the root or peer rank, global
#: and group-relative; a point-to-point tag; whether the call was asynchronous), when a number,
#: a bool or None.
CALL_ARGS = frozenset({"src", "dst", "group_src", "group_dst", "tag", "async_op"})
CALL_ARG_VALUE = re.compile(r"^(?:-?\d{1,10}|True|False|None)$")


def call_arg_locals(frame: dict[str, Any]) -> list[dict[str, Any]]:
    """The locals of a ``py-spy dump --locals --json`` frame that a bundle keeps: the
    :data:`CALL_ARGS` of torch.distributed's own frames, when a number, a bool or None."""
    if "torch/distributed/" not in str(frame.get("filename", "")).replace("\\", "/"):
        return []
    return [v for v in frame.get("locals") or [] if isinstance(v, dict)
            and v.get("name") in CALL_ARGS and CALL_ARG_VALUE.match(str(v.get("repr", "")))]
NETWORK_PROBES = "network/probe.json"
HOST_FACTS = "host/host.json"
HOST_COMMANDS = {"nvidia-smi": "host/nvidia-smi.txt", "dmesg": "host/dmesg.txt"}
#: The node's packet-filter rules, as each tool prints them (analyzer/firewall.py).
FIREWALL = {"iptables-save": "host/firewall/iptables-save.txt",
            "ip6tables-save": "host/firewall/ip6tables-save.txt",
            "nft": "host/firewall/nft-ruleset.txt"}
SUMMARY_EVENTS = "summaries/events.parquet"
LOGS = "logs"
#: Earlier stack samples (manifest ``snapshots``): ``collect``'s quick ones, ``watch``'s rounds.
SNAPSHOTS = "snapshots"


def process_dir(pid: int) -> str:
    return f"processes/{pid}"


def process_info(pid: int) -> str:
    return f"{process_dir(pid)}/info.json"


def fr_dump(name: str, copy: int | None = None) -> str:
    """A Flight Recorder dump's place; ``copy`` numbers a second dump of the same name."""
    return f"fr/{name}" if copy is None else f"fr/{copy}/{name}"


def log_copy(source: str) -> str:
    """A copied log lands at ``logs/<its absolute path>`` (``..`` and empty parts dropped)."""
    parts = [p for p in source.split("/") if p not in ("", ".", "..")]
    return f"{LOGS}/" + "/".join(parts)


def deleted_log(pid: int, fd: int, name: str) -> str:
    """A log a process still holds open after it was deleted."""
    return f"{LOGS}/deleted/{pid}-fd{fd}-{name}"


def manifest_processes(manifest: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The manifest's process entries that have a pid, with mp.spawn children's rank filled in
    from their spawn index (they carry no RANK: the index is the rank by convention)."""
    for proc in manifest.get("processes") or []:
        if not isinstance(proc, dict) or not isinstance(proc.get("pid"), int):
            continue
        if proc.get("rank") is None and proc.get("role") == "worker" \
                and isinstance(proc.get("spawn_index"), int):
            proc = {**proc, "rank": proc["spawn_index"], "rank_cue": "mp.spawn process index"}
        yield proc
