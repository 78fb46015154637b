"""The call arguments a stack dump keeps (py-spy ``--locals``): only torch.distributed's own
``src``/``dst``/... when they are plain values, and what the rules make of them."""

from __future__ import annotations

import json
from typing import Any

import polars as pl

from ddp_autopsy.analyzer import stacktree
from ddp_autopsy.analyzer.stacks import STACK_SCHEMA, StackOwner, parse_pyspy_json
from ddp_autopsy.collectors.pyspy import keep_call_args
from ddp_autopsy.rules.coll.coll011_ranks_in_different_collectives import unpaired_peer

DIST = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def frame(name: str, filename: str, **local_vars: str) -> dict[str, Any]:
    return {"name": name, "filename": filename, "line": 10,
            "locals": [{"name": k, "addr": 1, "arg": True, "repr": v}
                       for k, v in local_vars.items()]}


def dump(pid: int, *frames: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"pid": pid, "thread_id": pid, "os_thread_id": pid, "thread_name": "MainThread",
             "active": False, "owns_gil": False, "frames": list(frames)}]


def test_only_torch_distributed_scalars_are_kept() -> None:
    doc = dump(1,
               frame("recv", DIST, tensor="<Tensor at 0x7f>", src="2", tag="0",
                     group="<ProcessGroup at 0x7f>"),
               frame("wrapper", "/venv/torch/distributed/c10d_logger.py",
                     kwargs='{"src": 2, "token": "hf_abc"}'),
               frame("stage", "/home/me/train.py", src="1", token="'hf_secret'"))
    kept = json.loads(keep_call_args(json.dumps(doc).encode()))
    frames = kept[0]["frames"]
    assert frames[0]["locals"] == [{"name": "src", "repr": "2", "arg": True},
                                   {"name": "tag", "repr": "0", "arg": True}]
    assert "locals" not in frames[1] and "locals" not in frames[2]  # a dict; the user's frame
    assert b"hf_" not in keep_call_args(json.dumps(doc).encode())


def test_output_that_does_not_parse_is_not_kept() -> None:
    doc = json.dumps(dump(1, frame("recv", DIST, src="2", secret="'x'"))).encode()
    assert keep_call_args(doc[: len(doc) // 2]) == b""
    assert keep_call_args(b'{"not": "a list"}') == b""


def p2p_tree(calls: dict[int, tuple[str, str, str]]) -> stacktree.StackTree:
    """One dump per rank, waiting in ``op`` with ``arg=value`` (called from the user's stage)."""
    rows = []
    for rank, (op, arg, value) in calls.items():
        doc = dump(100 + rank, frame(op, DIST, **{arg: value}), frame("stage", "/home/me/p.py"))
        rows += parse_pyspy_json(json.dumps(doc), StackOwner(f"r{rank}.json", "h", 100 + rank,
                                                             rank))
    return stacktree.build(pl.DataFrame(rows, schema=STACK_SCHEMA))


def test_the_rank_every_unpaired_call_waits_on_is_named() -> None:
    # a pipeline 0 -> 1 -> 2 -> 3 where stage 2 receives from 3
    tree = p2p_tree({0: ("send", "dst", "1"), 1: ("send", "dst", "2"),
                     2: ("recv", "src", "3"), 3: ("recv", "src", "2")})
    assert tree.procs[2].call_args == {"src": "3"}
    found = unpaired_peer(tree)
    assert found is not None and found[0] == 2
    assert sorted(p.rank for p, *_ in found[1]) == [1, 3]


def test_two_ranks_receiving_from_each_other_name_no_side() -> None:
    tree = p2p_tree({0: ("recv", "src", "1"), 1: ("recv", "src", "0")})
    assert unpaired_peer(tree) is None


def test_a_receive_from_any_source_pairs_with_a_send() -> None:
    tree = p2p_tree({0: ("send", "dst", "1"), 1: ("recv", "src", "None"),
                     2: ("recv", "src", "1"), 3: ("recv", "src", "1")})
    # 0 -> 1 pairs (any source); 2 and 3 both wait on rank 1, which does not send
    found = unpaired_peer(tree)
    assert found is not None and found[0] == 1
    assert sorted(p.rank for p, *_ in found[1]) == [2, 3]
