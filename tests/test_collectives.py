"""The per-group collective timeline, the COLL005-COLL009 rules, and a side-by-side with
PyTorch's own analyzer (``python -m torch.distributed.flight_recorder.fr_trace``) on the same
dumps: real ones from a Gloo job, and NCCL-format ones written in torch's layout."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from test_flight_recorder import nccl_dump, nccl_entry

from ddp_autopsy.analyzer import collectives
from ddp_autopsy.analyzer import flight_recorder as fr
from ddp_autopsy.analyzer.job import load
from ddp_autopsy.rules.engine import get_rule, run

NEAR_MISS = Path(__file__).parent / "rules" / "near_miss"
FR_RULES = ("COLL005", "COLL006", "COLL007", "COLL008")


def write(directory: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return directory


def dumps_of(per_rank: dict[int, list[dict[str, Any]] | bytes | None],
             ranks: str = "[0, 1, 2, 3]", fmt: str = "pickle") -> dict[str, bytes]:
    out = {}
    for r, entries in per_rank.items():
        if entries is None:
            continue
        name = f"fr/nccl_trace_rank_{r}" + (".json" if fmt == "json" else "")
        out[name] = entries if isinstance(entries, bytes) else nccl_dump(entries, ranks=ranks,
                                                                         fmt=fmt)
    return out


def report_of(files: dict[str, bytes], world_size: int | None = None,
              events: pl.DataFrame | None = None) -> collectives.CollectiveReport:
    dumps = [fr.read_dump(data, name) for name, data in files.items()]
    return collectives.analyze_frames(fr.build_frames(dumps), world_size=world_size,
                                      events=events)


def steps(n: int, **kw: Any) -> list[dict[str, Any]]:
    """Collectives #1..#n, all completed."""
    return [nccl_entry(i, **kw) for i in range(1, n + 1)]


def hung(n: int, **kw: Any) -> list[dict[str, Any]]:
    """#1..#n-1 completed, #n timed out (started, retired)."""
    return [*steps(n - 1, **kw), nccl_entry(n, state="started", retired=True, **kw)]


# --------------------------------------------------------------------------- the timeline


def test_rank_that_never_joined_is_named_with_call_sites() -> None:
    rep = report_of(dumps_of({0: hung(5), 1: hung(5), 2: steps(4), 3: hung(5)}))
    (g,) = rep.groups
    assert (g.name, g.desc, g.members, g.members_from) == ("0", "default_pg", [0, 1, 2, 3],
                                                           "pg_config")
    assert g.stuck_at == 5 and g.waiting == [0, 1, 3] and g.not_joined == {2: 4}
    assert g.laggards == [2] and g.divergence is None
    assert g.stuck_call is not None and g.stuck_call.site == "train_step (train.py:41)"
    last = g.ranks[2].last
    assert last is not None and (last.seq, last.site) == (4, "train_step (train.py:41)")
    assert g.ranks[0].pending is not None and g.ranks[0].pending.seq == 5
    assert rep.stuck and "timed out" in rep.stuck_because[0]


def test_first_divergence_names_the_odd_rank_even_when_it_is_rank_0() -> None:
    bad = [*steps(2), nccl_entry(3, op="broadcast", state="started", retired=True)]
    rep = report_of(dumps_of({0: bad, 1: hung(3), 2: hung(3), 3: hung(3)}))
    d = rep.groups[0].divergence
    assert d is not None and (d.seq, d.aspect, d.culprits, d.majority) == (3, "op", [0], True)
    assert d.summary() == ("broadcast", "all_reduce")


@pytest.mark.parametrize(("change", "aspect"), [
    ({"sizes": [[5]]}, "sizes"), ({"dtype": "Half"}, "dtypes"), ({"line": 99}, "call site")])
def test_divergence_aspects(change: dict[str, Any], aspect: str) -> None:
    odd = [*steps(3), nccl_entry(4, **change), *steps(6)[4:]]
    rep = report_of(dumps_of({0: steps(6), 1: steps(6), 2: odd, 3: steps(6)}))
    d = rep.groups[0].divergence
    assert d is not None and (d.seq, d.aspect, d.culprits) == (4, aspect, [2])


def test_what_is_not_a_divergence() -> None:
    # all_to_all with per-rank sizes, a state difference (a hang), ring buffers that start at
    # different sequence numbers, and p2p entries.
    def ranked(r: int) -> list[dict[str, Any]]:
        a2a = nccl_entry(3, op="all_to_all", sizes=[[r + 1, 4]])
        send = nccl_entry(1, op=f"send {r}->{(r + 1) % 4}", p2p=True)
        return [*steps(2), a2a, send, nccl_entry(4, state="completed" if r else "scheduled")]
    files = dumps_of({r: ranked(r) for r in range(4)})
    files["fr/nccl_trace_rank_3"] = nccl_dump(ranked(3)[2:])  # its buffer starts at #3
    rep = report_of(files)
    assert rep.groups[0].divergence is None


def test_skipped_collective_is_recognised_by_the_shift(tmp_path: Path) -> None:
    sites = [41, 42, 41, 42, 41, 42, 41]
    full = [nccl_entry(i + 1, line=ln) for i, ln in enumerate(sites)]
    full[-1] = nccl_entry(7, line=41, state="started", retired=True)
    skipped = [nccl_entry(i + 1, line=ln) for i, ln in enumerate(sites[:2] + sites[3:])]
    rep = report_of(dumps_of({0: full, 1: full, 2: skipped, 3: full}))
    d = rep.groups[0].divergence
    assert d is not None and (d.seq, d.aspect, d.culprits, d.shift) == (3, "call site", [2], 1)
    # The same line difference without a shift (rank 0 broadcasts from its own branch) is
    # information only, even in a stuck job.
    root = [nccl_entry(1, op="broadcast", line=30), nccl_entry(2, state="started",
                                                                retired=True)]
    other = [nccl_entry(1, op="broadcast", line=33), nccl_entry(2, state="started",
                                                                 retired=True)]
    write(tmp_path, dumps_of({0: root, 1: other, 2: other, 3: other}))
    analysis = run(load([tmp_path]))
    found = [f for f in analysis.findings if f.rule == "COLL006"]
    assert len(found) == 1 and found[0].role == "info" and found[0].details["shift"] is None


def test_a_tie_names_every_rank() -> None:
    rep = report_of(dumps_of({0: steps(2), 1: [nccl_entry(1), nccl_entry(2, dtype="Half")]},
                             ranks="[0, 1]"))
    d = rep.groups[0].divergence
    assert d is not None and d.culprits == [0, 1] and not d.majority


def test_late_rank_is_a_straggler() -> None:
    late = [*steps(6), nccl_entry(7, state="started", t=707)]
    rep = report_of(dumps_of({0: hung(7), 1: hung(7), 2: hung(7), 3: late}))
    g = rep.groups[0]
    assert g.stuck_at == 7 and not g.not_joined
    assert list(g.late) == [3] and 690 < g.late[3] < 710


def test_missing_empty_and_groupless_ranks() -> None:
    tp = ("1", "tp")
    entries_tp = [nccl_entry(i, pg=tp, pg_id=1) for i in (1, 2)]
    files = dumps_of({0: [*hung(3), *entries_tp], 1: b"", 3: hung(3)})
    rep = report_of(files, world_size=4)
    g0 = rep.group("0")
    assert g0 is not None and g0.no_dump == [1, 2] and g0.waiting == [0, 3]
    g1 = rep.group("1")
    assert g1 is not None and g1.desc == "tp" and g1.members == [0]  # membership from dumps
    # A rank whose dump has no entry of a group the others use never joined it.
    files = dumps_of({0: [*steps(2), *entries_tp], 1: [*steps(2), *entries_tp], 2: steps(2)},
                     ranks="[0, 1, 2]")
    for name in list(files):
        rank = int(name.rsplit("_", 1)[1])
        obj = pickle.loads(files[name])
        obj["pg_config"]["1"] = {"name": "1", "desc": "tp", "ranks": "[0, 1, 2]"}
        files[name] = pickle.dumps(obj, protocol=2)
        assert rank in (0, 1, 2)
    g1 = report_of(files).group("1")
    assert g1 is not None and g1.never_joined_any == [2]
    assert g1.stuck_at is None and g1.not_joined == {}  # nothing pending: not a hang


def test_a_healthy_snapshot_is_not_called_stuck() -> None:
    # Rank 1 has not yet issued #10 when the dumps are taken half a second later.
    files = dumps_of({0: [*steps(9), nccl_entry(10, state="started")], 1: steps(9)},
                     ranks="[0, 1]")
    dumps = [fr.read_dump(d, n, mtime=(fr.EXAMPLE_EPOCH_NS / 1e9) + 10.5)
             for n, d in files.items()]
    rep = collectives.analyze_frames(fr.build_frames(dumps))
    g = rep.groups[0]
    assert g.not_joined == {1: 9} and not rep.stuck
    # ... but a collective pending for minutes is.
    dumps = [fr.read_dump(d, n, mtime=(fr.EXAMPLE_EPOCH_NS / 1e9) + 400) for n, d in files.items()]
    rep = collectives.analyze_frames(fr.build_frames(dumps))
    assert rep.stuck and "pending for 390 s" in rep.stuck_because[0]


WATCHDOG = """\
[rank0]:[E515 18:36:47.343377708 ProcessGroupNCCL.cpp:1595] [PG ID 1 PG GUID 1(tp) Rank 0]  failure detected by watchdog at work sequence id: 315 PG status: last enqueued work: 315, last completed work: 314
[rank1]:[E515 18:36:47.343391012 ProcessGroupNCCL.cpp:1595] [PG ID 1 PG GUID 1(tp) Rank 1]  failure detected by watchdog at work sequence id: 315 PG status: last enqueued work: 316, last completed work: 314
[rank0]:[E515 18:36:47.343377708 ProcessGroupNCCL.cpp:632] [PG ID 1 PG GUID 1(tp) Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=315, OpType=ALLREDUCE, NumelIn=4, NumelOut=4, Timeout(ms)=600000) ran for 600081 milliseconds before timing out.
[rank0]:[E515 18:36:47.343377708 ProcessGroupNCCL.cpp:1937] Rank 0
         - [0] Timeout at collective: ALLREDUCE, #315
         - To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are:
             [2, 3] finished collective #314, but didn't join collective #315 (count from 1)
"""


def test_logs_alone_give_the_group_timeline(tmp_path: Path) -> None:
    (tmp_path / "console.log").write_text(WATCHDOG)
    job = load([tmp_path])
    rep = collectives.analyze(job)
    g = rep.group("1")
    assert g is not None and not g.fr and g.desc == "tp"
    assert g.stuck_at == 315 and g.waiting == [0, 1] and g.not_joined == {2: 314, 3: 314}
    assert g.ranks[0].timed_out_op == "ALLREDUCE"
    assert len(g.log_rows) == 4 and rep.stuck
    analysis = run(job)
    coll9 = [f for f in analysis.findings if f.rule == "COLL009"]
    assert len(coll9) == 1 and coll9[0].ranks == [2, 3]
    assert "never joined ALLREDUCE #315 of process group 1 (tp)" in coll9[0].summary
    # Ranks 2, 3 joined the job and fell behind: laggards, not ranks missing from the job.
    assert not [f for f in analysis.findings if f.rule == "RDZV004"]
    assert analysis.verdict is not None and analysis.verdict.rule == "COLL009"


def test_logs_fold_into_flight_recorder_groups(tmp_path: Path) -> None:
    text = WATCHDOG.replace("PG ID 1 PG GUID 1(tp)", "PG ID 0 PG GUID 0(default_pg)")
    (tmp_path / "console.log").write_text(text)
    write(tmp_path, dumps_of({0: hung(5), 1: hung(5), 2: steps(4), 3: hung(5)}))
    job = load([tmp_path])
    g = collectives.analyze(job).group("0")
    assert g is not None and g.fr and len(g.log_rows) == 4
    assert g.not_joined == {2: 4}  # the dumps, not the (inconsistent) log counters
    analysis = run(job)
    assert {f.rule for f in analysis.findings} >= {"COLL005"}
    assert not [f for f in analysis.findings if f.rule == "COLL009"]  # COLL005 covers it
    coll5 = next(f for f in analysis.findings if f.rule == "COLL005")
    assert any(e.line is not None for e in coll5.evidence)  # a watchdog line corroborates


# --------------------------------------------------------------------------- rules


@pytest.mark.parametrize("code", FR_RULES)
def test_fr_rule_examples_fire_through_the_engine(code: str, tmp_path: Path) -> None:
    rule = get_rule(code)
    assert rule is not None
    write(tmp_path, rule.example_files())  # type: ignore[attr-defined]
    analysis = run(load([tmp_path]))
    fired = [f for f in analysis.findings if f.rule == code]
    assert fired and fired[0].role == "root_cause", [
        (f.rule, f.role, f.summary) for f in analysis.findings]
    assert fired[0].evidence and all(Path(e.path).is_file() for e in fired[0].evidence)


@pytest.mark.parametrize("code", [*FR_RULES, "COLL009"])
def test_near_misses_stay_silent_through_the_engine(code: str) -> None:
    case = NEAR_MISS / code
    analysis = run(load([case]))
    fired = [f for f in analysis.findings if f.rule == code and f.role != "info"]
    assert not fired, fired[0].summary
    status = {o.rule: o.status for o in analysis.outcomes}
    assert status[code] in ("ruled_out", "finding")


def test_verdicts_on_the_examples(tmp_path: Path) -> None:
    cases = {"COLL005": ("rank_stuck_outside_collective", [1]),
             "COLL006": ("collective_mismatch", [1]), "COLL007": ("missing_ranks", [2]),
             "COLL008": ("straggler", [2])}
    for code, (cause, ranks) in cases.items():
        d = tmp_path / code
        write(d, get_rule(code).example_files())  # type: ignore[union-attr]
        verdict = run(load([d])).verdict
        assert verdict is not None and (verdict.rule, verdict.cause, verdict.ranks) == (
            code, cause, ranks), verdict.summary


def test_a_crashed_rank_is_not_called_stuck(tmp_path: Path) -> None:
    write(tmp_path, dumps_of({0: hung(5), 1: hung(5), 2: steps(4), 3: hung(5)}))
    (tmp_path / "rank2.log").write_text(
        "[rank2]: Traceback (most recent call last):\n"
        '[rank2]:   File "/w/train.py", line 25, in train_step\n'
        "[rank2]: ValueError: bad batch 17\n")
    analysis = run(load([tmp_path]))
    assert not [f for f in analysis.findings if f.rule == "COLL005"]
    assert analysis.verdict is not None and analysis.verdict.cause == "rank_crashed"


# --------------------------------------------------------------------------- a real job


@pytest.mark.scenario("fr_skipped_allreduce")
def test_real_job_dumps_name_the_skipped_collective(scenario_run) -> None:
    sr = scenario_run("fr_skipped_allreduce")
    assert sr.error is None, sr.error
    expect = sr.expect
    # Dumps alone: the skip (call sites differ at #6) and who never joined #9.
    rep = collectives.analyze(load([sr.dir / "fr_dumps"]))
    (g,) = rep.groups
    assert g.divergence is not None
    assert (g.divergence.seq, g.divergence.aspect, g.divergence.culprits) == (
        expect["fr_seq"], "call site", [1])
    assert g.divergence.shift == 1  # rank 1's #n is the others' #n+1: it skipped one
    assert g.stuck_at == expect["fr_pending"] and g.not_joined == {1: 8} and g.waiting == [0, 2]
    assert g.stuck_call is not None and g.stuck_call.state == "not finished"
    # JSON dumps carry no stacks: who never joined, but no call-site divergence.
    g_json = collectives.analyze(load([sr.dir / "fr_json"])).groups[0]
    assert g_json.not_joined == {1: 8} and g_json.divergence is None
    # The bundle collect took (stacks, console, and the dumps it picked up): the verdict is the
    # skipped collective, rank 1 is seen in validate(), and both "stuck outside" findings follow.
    assert sr.bundle is not None
    assert sorted(p.name for p in (sr.bundle / "fr").rglob("nccl_trace_rank_*")) == [
        f"nccl_trace_rank_{r}" for r in range(3)]
    analysis = run(load([sr.bundle]))
    verdict = analysis.verdict
    assert verdict is not None and verdict.rule == "COLL006"
    assert (verdict.cause, verdict.ranks) == (expect["cause"], expect["ranks"])
    assert "#6" in verdict.summary and expect["site"] in verdict.summary
    assert "Rank 1 skipped a collective just before" in verdict.summary
    coll5 = next(f for f in analysis.findings if f.rule == "COLL005")
    assert coll5.role == "symptom" and coll5.explained_by == verdict.id
    assert "validate" in coll5.summary and "#9" in coll5.summary
    assert coll5.details["where"]["1"].startswith("in validate")
    coll2 = next(f for f in analysis.findings if f.rule == "COLL002")
    assert coll2.role == "symptom"
    for f in (verdict, coll5):
        assert all(Path(e.path).exists() for e in f.evidence), f.evidence


# --------------------------------------------------------------------------- fr_trace


FR_TRACE_DRIVER = r"""
import contextlib, io, logging, sys
from torch.distributed.flight_recorder.fr_trace import main
for arg in sys.argv[1:]:
    print(f"===== {arg}", file=sys.stderr, flush=True)
    try:
        main([arg])
    except BaseException as exc:
        print(f"EXCEPTION {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
"""


def fr_trace(dirs: list[Path]) -> dict[str, str]:
    """Run torch's analyzer on each directory (one process); its output per directory."""
    proc = subprocess.run([sys.executable, "-c", FR_TRACE_DRIVER, *map(str, dirs)],
                          capture_output=True, text=True, timeout=300)
    out: dict[str, str] = {}
    current = None
    for line in (proc.stdout + proc.stderr).splitlines():
        if line.startswith("===== "):
            current = line[6:]
            out[current] = ""
        elif current is not None and "NumPy" not in line and "_conversion" not in line:
            out[current] += line + "\n"
    return out


def _with_membership(src: Path, dst: Path, members: str) -> Path:
    """Copies of Gloo dumps whose pg_config names the default group (Gloo leaves it unnamed),
    the one thing fr_trace needs to run on them."""
    dst.mkdir(parents=True)
    for path in sorted(src.iterdir()):
        obj = fr.unpickle_plain(path.read_bytes())
        obj["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": members}}
        (dst / path.name).write_bytes(pickle.dumps(obj, protocol=2))
    return dst


@pytest.mark.scenario("fr_skipped_allreduce")
def test_side_by_side_with_fr_trace(scenario_run, tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed.flight_recorder.fr_trace")
    sr = scenario_run("fr_skipped_allreduce")
    real = sr.dir / "fr_dumps"
    cases = {
        "gloo": real,
        "gloo_named": _with_membership(real, tmp_path / "gloo_named", "[0, 1, 2]"),
        "rank0_culprit": write(tmp_path / "rank0_culprit", {
            k.removeprefix("fr/"): v for k, v in dumps_of({
                0: [*steps(2), nccl_entry(3, op="broadcast", state="started", retired=True)],
                1: hung(3), 2: hung(3), 3: hung(3)}).items()}),
        "missing_rank": write(tmp_path / "missing_rank", {
            k.removeprefix("fr/"): v for k, v in dumps_of(
                {0: hung(3), 1: hung(3), 3: hung(3)}).items()}),
        "host_rank": write(tmp_path / "host_rank", {
            "node-a_rank0": nccl_dump(hung(3)), "node-a_rank1": nccl_dump(hung(3)),
            "node-b_rank2": nccl_dump(steps(2)), "node-b_rank3": nccl_dump(hung(3))}),
        "json": write(tmp_path / "json", {
            f"nccl_trace_rank_{r}": nccl_dump(hung(3, fmt="json") if r != 2 else
                                              steps(2, fmt="json"), fmt="json")
            for r in range(4)}),
    }
    theirs = fr_trace(list(cases.values()))
    said = {name: theirs[str(path)] for name, path in cases.items()}
    ours = {name: collectives.analyze(load([path])).groups[0] for name, path in cases.items()}
    # Real Gloo dumps: fr_trace cannot run (Gloo records pg_config under an empty name).
    assert "EXCEPTION KeyError: ('0', 0)" in said["gloo"]
    # Given the membership, it agrees that rank 1 never joined #9 — and sees nothing at #6,
    # where rank 1's collective came from another line (it compares no call sites).
    assert "Not all ranks joining collective, sequence number: 9" in said["gloo_named"]
    assert "missing ranks: {1}" in said["gloo_named"]
    assert "sequence number: 6" not in said["gloo_named"]
    assert ours["gloo"].not_joined == {1: 8} and ours["gloo"].divergence.seq == 6
    # Rank 0 called broadcast where 1-3 called all_reduce: fr_trace assumes the first rank is
    # right and blames the three healthy ranks; the majority names rank 0.
    assert "Collective sequence number: 3 has errors" in said["rank0_culprit"]
    blamed = {int(x) for x in _culprits(said["rank0_culprit"])}
    assert blamed == {1, 2, 3}
    assert ours["rank0_culprit"].divergence.culprits == [0]
    # Inputs it refuses: a missing rank, host+rank names, JSON.
    assert "Missing dump files from ranks {2}" in said["missing_rank"]
    assert ours["missing_rank"].no_dump == [2] and ours["missing_rank"].waiting == [0, 1, 3]
    assert "Unable to automatically determine the common prefix" in said["host_rank"]
    assert ours["host_rank"].not_joined == {2: 2}
    assert "EXCEPTION UnpicklingError" in said["json"]
    assert ours["json"].not_joined == {2: 2}
    (tmp_path / "fr_trace_output.json").write_text(json.dumps(said, indent=1))


def _culprits(text: str) -> list[str]:
    import re

    return re.findall(r"Culprit rank (\d+)", text)



# --------------------------------------------------------------------------- HTML report


def test_html_report_shows_each_group_escaped(tmp_path: Path) -> None:
    from ddp_autopsy.reports import html

    hostile = [*steps(3), nccl_entry(4, state="started", retired=True)]
    for e in hostile:
        e["frames"][2]["name"] = "<img src=x onerror=alert(1)>"
    write(tmp_path, dumps_of({0: hostile, 1: hostile, 2: steps(3), 3: hostile}))
    doc = html.render(run(load([tmp_path])))
    section = doc.split('<section id="collectives"', 1)[1].split("</section>", 1)[0]
    assert 'href="#collectives"' in doc
    assert "process group 0 (default_pg)" in section
    assert "<dt>never joined</dt><dd>rank 2</dd>" in section
    assert "<td>ranks 0-1,3</td><td>waiting</td><td>#4</td><td>#3</td>" in section
    assert "<img" not in doc and "&lt;img src=x onerror=alert(1)&gt;" in section
    # Without Flight Recorder dumps there is no such section.
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "train.log").write_text("step 1\n")
    doc = html.render(run(load([tmp_path / "logs"])))
    assert 'id="collectives"' not in doc
