"""The tool's own collection problems as findings: AUT002 (stacks, any role) and AUT003 (the
manifest's ``problems``), on small bundle manifests; tests/test_collect.py checks both on bundles
collected from real jobs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ddp_autopsy.analyzer.job import load
from ddp_autopsy.rules.aut.aut003_collection_incomplete import KINDS, CollectionIncomplete
from ddp_autopsy.rules.base import Finding
from ddp_autopsy.rules.engine import run

NEAR_MISS = Path(__file__).parent / "rules" / "near_miss"


def bundle(root: Path, host: str = "node1", **manifest: Any) -> Path:
    doc = {"schema": "ddp-autopsy/bundle/1", "host": host, "complete": True, "actions": [],
           "logs": [], **manifest}
    (root / "manifest.json").parent.mkdir(parents=True, exist_ok=True)
    (root / "manifest.json").write_text(json.dumps(doc))
    return root


def proc(pid: int, role: str, rank: int | None, status: str) -> dict[str, Any]:
    return {"pid": pid, "role": role, "rank": rank, "stack": None, "stack_status": status}


def problem(kind: str, count: int, pids: tuple[int, ...] = (), targets: tuple[str, ...] = (),
            detail: str | None = None) -> dict[str, Any]:
    return {"kind": kind, "count": count, "pids": list(pids), "targets": list(targets),
            "detail": detail}


def fired(paths: list[Path], code: str) -> list[Finding]:
    return [f for f in run(load(paths)).findings if f.rule == code]


@pytest.mark.parametrize("code", ["AUT002", "AUT003"])
def test_near_misses_do_not_fire_even_as_info(code: str) -> None:
    """The catalog meta-test lets info findings pass on a near-miss; these must not fire at all."""
    assert not fired([NEAR_MISS / code], code)


def test_stack_failures_of_agent_and_dataloader_count_after_the_ranks(tmp_path: Path) -> None:
    b = bundle(tmp_path / "b", processes=[
        proc(100, "agent", None, "timeout"), proc(101, "worker", 0, "ok"),
        proc(102, "worker", 1, "exited"), proc(103, "dataloader", 1, "permission_denied"),
        proc(104, "dataloader", 1, "permission_denied"), proc(99, "other", None, "not_python")])
    [f] = fired([b], "AUT002")
    assert f.summary == ("No stack dump for 1 rank(s) (rank 1: the process exited during "
                         "collection); also none for the torchrun agent (pid 100: py-spy timed "
                         "out), 2 DataLoader workers of rank 1 (pid 103, 104: ptrace not "
                         "permitted).")
    assert f.ranks == [1] and f.severity == "warning"
    assert [e.text for e in f.evidence][:2] == ["pid 102 (worker): exited",
                                                "pid 100 (agent): timeout"]
    assert 99 not in f.details["pids"]  # a non-Python launcher has no stack to miss


def test_only_a_helper_without_stack_is_a_minor_finding(tmp_path: Path) -> None:
    b = bundle(tmp_path / "b", processes=[
        proc(100, "agent", None, "skipped"), proc(101, "worker", 0, "ok"),
        proc(102, "worker", 1, "ok")])
    [f] = fired([b], "AUT002")
    assert f.summary == ("No stack dump for the torchrun agent (pid 100: skipped at the collect "
                         "deadline). Every rank's own stack was taken.")
    assert f.severity == "info" and f.ranks == []


def test_a_rank_that_is_not_python_still_counts(tmp_path: Path) -> None:
    b = bundle(tmp_path / "b", processes=[proc(101, "worker", 0, "not_python")])
    [f] = fired([b], "AUT002")
    assert "rank 0: not a Python process" in f.summary


def test_each_problem_kind_is_one_finding_with_its_remedy(tmp_path: Path) -> None:
    procs = [proc(101, "worker", 0, "ok"), proc(102, "worker", 1, "ok")]
    a = bundle(tmp_path / "a", host="node-a", processes=procs, problems=[
        problem("env_unreadable", 2, pids=(101, 102), detail="permission_denied"),
        problem("no_logs", 0),
        problem("tar", 1, targets=("a.tar.gz",), detail="timeout: stopped at the deadline")])
    b = bundle(tmp_path / "b", host="node-b", processes=[], problems=[
        problem("no_logs", 0),
        problem("log_not_collected", 1, targets=("/shared/run/3.log: Permission denied",)),
        problem("something_new", 1, targets=("x",))])
    found = {f.details["kind"]: f for f in fired([a, b], "AUT003")}
    assert set(found) == {"env_unreadable", "no_logs", "tar", "log_not_collected",
                          "something_new"}
    env = found["env_unreadable"]
    assert env.summary == ("collect on node-a could not read the environment of 2 process(es) "
                           "(permission denied); the ENV rules did not see their settings.")
    assert env.ranks == [0, 1] and env.remedy == KINDS["env_unreadable"][1]
    assert env.evidence[0].text == "env_unreadable (permission_denied): pids 101, 102"
    logs = found["no_logs"]  # the same kind on two hosts: one finding naming both
    assert logs.hosts == ["node-a", "node-b"] and len(logs.evidence) == 2
    assert "--logs PATH" in logs.remedy and logs.severity == "warning"
    assert found["tar"].severity == "info" and "tar czf" in found["tar"].remedy
    assert "/shared/run/3.log: Permission denied" in found["log_not_collected"].evidence[0].text
    # a kind this version does not know is still shown, with the rule's general remedy
    assert found["something_new"].remedy == CollectionIncomplete.remedy()


def test_every_problem_kind_is_documented() -> None:
    remedy = CollectionIncomplete.sections()["Remedy"]
    assert all(f"`{kind}`" in remedy for kind in KINDS)
