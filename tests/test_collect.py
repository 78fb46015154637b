"""Tests of ``ddp_autopsy.collectors``: unit tests of the parts, then real hung Gloo jobs (torchrun
and mp.spawn, CPU only) collected for real — no mocks of what can run here."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import pickle
import pty
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tarfile
import tempfile
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from ddp_autopsy.analyzer.job import load
from ddp_autopsy.bundle_layout import CALL_ARGS
from ddp_autopsy.collectors import (
    CollectError,
    CollectOptions,
    Member,
    collect,
    collect_job,
    find_jobs,
    job_for_pid,
)
from ddp_autopsy.collectors.command import collect_command
from ddp_autopsy.redact import (
    MASK,
)
from ddp_autopsy.rules.base import Finding
from ddp_autopsy.rules.engine import run

try:
    from tests import collect_helpers as h
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    import collect_helpers as h  # type: ignore[no-redef]

HF_TOKEN, PEM_BODY, PLANTED = h.HF_TOKEN, h.PEM_BODY, h.PLANTED
SECRET_URL, SECRET_VALUE, URL_PASSWORD = h.SECRET_URL, h.SECRET_VALUE, h.URL_PASSWORD
frame_names, main_thread, wait_for = h.frame_names, h.main_thread, h.wait_for

#: Every test here drives (or reads a collect of) a real hung torchrun job.
pytestmark = pytest.mark.scenario

READY_TIMEOUT_S = 120.0
LOG_CAP = 64 << 10  # the collected fixture's log size cap (CollectOptions.max_log_bytes)


def findings(bundle: Path, code: str) -> list[Finding]:
    """The findings of rule ``code`` when the bundle is analyzed."""
    return [f for f in run(load([bundle])).findings if f.rule == code]

# -- redaction ---------------------------------------------------------------------------------


# -- /proc/net/tcp and the endpoint probe -------------------------------------------------------


# -- the action framework -----------------------------------------------------------------------


# -- logs -----------------------------------------------------------------------------------------


# -- kernel messages --------------------------------------------------------------------------------


# -- Flight Recorder ------------------------------------------------------------------------------


# -- versions and roles ---------------------------------------------------------------------------


# -- real jobs ------------------------------------------------------------------------------------


class _FakeRankDumper(threading.Thread):
    """Plays a rank's Flight Recorder: waits on its FIFO and writes a dump when poked."""

    def __init__(self, fifo: Path, dump: Path) -> None:
        super().__init__(daemon=True)
        os.mkfifo(fifo)
        self.fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        self.dump = dump
        self.poked = threading.Event()

    def run(self) -> None:
        end = time.monotonic() + 120
        try:
            while time.monotonic() < end:
                readable, _, _ = select.select([self.fd], [], [], 0.2)
                if readable and os.read(self.fd, 64):
                    self.dump.write_bytes(pickle.dumps({"version": "2.10", "entries": []}))
                    self.poked.set()
                    return
        finally:
            os.close(self.fd)  # later collects find no reader (and do not wait for a dump)


@pytest.fixture(scope="module")
def hung(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """A 3-rank torchrun job (rank 1 in evaluate(), ranks 0 and 2 in all_reduce, rank 2 with two
    DataLoader workers) and a 2-process mp.spawn job, both hung, started together."""
    root = tmp_path_factory.mktemp("hung")
    fr = root / "fr"
    fr.mkdir()
    tr = sp = None
    try:
        tr = h.start_torchrun(root / "torchrun", run_id=f"autopsy-test-{os.getpid()}",
                            TORCH_FR_DUMP_TEMP_FILE=str(fr / "trace_rank_"),
                            TORCH_NCCL_DEBUG_INFO_PIPE_FILE=str(fr / "pipe_"))
        sp = h.start_spawn(root / "spawn")
        tr.wait_ready(3, READY_TIMEOUT_S)
        sp.wait_ready(2, READY_TIMEOUT_S)
        time.sleep(1.0)  # let the ranks step from the ready marker into their blocking call
        yield SimpleNamespace(torchrun=tr, spawn=sp, root=root, fr=fr,
                              run_id=f"autopsy-test-{os.getpid()}")
    finally:
        for job in (tr, sp):
            if job is not None:
                job.stop()


@pytest.fixture(scope="module")
def collected(hung: SimpleNamespace) -> SimpleNamespace:
    """One collect of the torchrun job, shared by the assertions below."""
    fr = hung.fr
    # Flight Recorder: rank 0's pipe has no reader, rank 1's is served by a fake dumper, rank 2
    # has none; one fresh dump is already there, one stale dump predates the job.
    os.mkfifo(fr / "pipe_0.pipe")
    dumper = _FakeRankDumper(fr / "pipe_1.pipe", fr / "trace_rank_1")
    dumper.start()
    (fr / "trace_rank_0").write_bytes(pickle.dumps({"version": "2.10", "entries": []}))
    stale = fr / "trace_rank_7"
    stale.write_bytes(b"old")
    os.utime(stale, (time.time() - 86400, time.time() - 86400))
    extra = hung.root / "extra"
    extra.mkdir()
    (extra / "train.log").write_text(
        f"step 1 loss 2.3\nwandb: url {SECRET_URL}\nMY_SECRET_KEY={SECRET_VALUE}\n"
        f"-----BEGIN PRIVATE KEY-----\n{PEM_BODY}\n-----END PRIVATE KEY-----\nstep 2\n")
    (extra / "big.log").write_text("".join(f"step {i} loss 1.0\n" for i in range(20000)))
    out = hung.root / "bundle"
    start = time.monotonic()
    result = collect(CollectOptions(pid=hung.torchrun.pid, out=out, logs=[extra], tar=True,
                                    max_log_bytes=LOG_CAP))
    wall = time.monotonic() - start
    print(f"\ncollect wall time for the 3-rank torchrun job: {wall:.2f}s")
    return SimpleNamespace(result=result, wall=wall, out=out, dumper=dumper,
                           procs={p["pid"]: p for p in result.manifest["processes"]})


@pytest.mark.scenario
def test_collect_finds_agent_workers_and_ranks(hung: SimpleNamespace,
                                               collected: SimpleNamespace) -> None:
    m = collected.result.manifest
    procs = collected.procs
    workers = {p["rank"]: p for p in procs.values() if p["role"] == "worker"}
    assert sorted(workers) == [0, 1, 2]
    assert {r: p["pid"] for r, p in workers.items()} == hung.torchrun.ranks
    agents = [p for p in procs.values() if p["role"] == "agent"]
    assert [a["pid"] for a in agents] == [hung.torchrun.pid]
    assert m["job"]["launcher"] == "torchrun" and m["job"]["launcher_pid"] == hung.torchrun.pid
    assert m["job"]["world_size"] == 3 and m["job"]["master_port"] == hung.torchrun.port
    assert all(p["world_size"] == 3 and p["spawn_index"] is None for p in workers.values())
    assert collected.wall < 30


@pytest.mark.scenario
def test_stacks_show_the_hang(hung: SimpleNamespace, collected: SimpleNamespace) -> None:
    out = collected.out
    for rank, pid in hung.torchrun.ranks.items():
        entry = collected.procs[pid]
        assert entry["stack_status"] == "ok", entry
        stack = json.loads((out / entry["stack"]).read_text())
        names = frame_names(main_thread(stack, pid))
        if rank == 1:
            assert "evaluate" in names, names
        else:
            assert any(n.endswith("all_reduce") for n in names), names
        # the locals py-spy read: torch.distributed's call arguments only (all_reduce's
        # async_op), none of the user's frames (``token`` in run() holds a secret)
        kept = [(f["name"], v["name"], v["repr"]) for t in stack for f in t["frames"]
                for v in f.get("locals") or []]
        assert all("torch/distributed/" in f["filename"] for t in stack for f in t["frames"]
                   if f.get("locals")), kept
        assert {name for _, name, _ in kept} <= CALL_ARGS, kept
        assert (("all_reduce", "async_op", "False") in kept) == (rank != 1), kept
        text = (out / entry["stack_text"]).read_text()
        assert text.startswith(f"Process {pid}:") and ("evaluate" in text) == (rank == 1)


@pytest.mark.scenario
def test_earlier_samples_tell_a_hang_from_a_job_between_steps(
        hung: SimpleNamespace, collected: SimpleNamespace, tmp_path: Path) -> None:
    out = collected.out
    snaps = collected.result.manifest["snapshots"]
    workers = {str(pid) for pid in hung.torchrun.ranks.values()}
    assert [s["index"] for s in snaps] == [0, 1] and all(s["by"] == "collect" for s in snaps)
    for snap in snaps:
        assert set(snap["stacks"]) == workers, snap
        for pid, rel in snap["stacks"].items():
            names = frame_names(main_thread(json.loads((out / rel).read_text()), int(pid)))
            assert ("evaluate" in names) == (pid == str(hung.torchrun.ranks[1])), names
    stuck = run(load([out]))
    (coll,) = [f for f in stuck.findings if f.rule == "COLL002"]
    assert coll.ranks == [1] and "(the same in 3 stack snapshots)" in coll.summary
    assert coll.details["snapshots"] == 3
    # The same bundle, but rank 0 was elsewhere in the first sample: its all_reduce completed
    # between the samples, so the job only passed by: no rank is stuck.
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    rank0, rank1 = (str(hung.torchrun.ranks[r]) for r in (0, 1))
    first = moved / snaps[0]["stacks"][rank0]
    first.write_text((moved / snaps[0]["stacks"][rank1]).read_text()
                     .replace(f'"os_thread_id": {rank1}', f'"os_thread_id": {rank0}'))
    passing = run(load([moved]))
    assert not [f for f in passing.findings if f.rule == "COLL002"], passing.findings
    assert passing.verdict is None or passing.verdict.rule != "COLL002"


@pytest.mark.scenario
def test_manifest_and_info_follow_the_contract(hung: SimpleNamespace,
                                               collected: SimpleNamespace) -> None:
    out = collected.out
    m = json.loads((out / "manifest.json").read_text())
    assert m == collected.result.manifest
    assert m["schema"] == "ddp-autopsy/bundle/1" and m["complete"] is True
    assert m["tool"]["name"] == "ddp-autopsy" and m["host"] == socket.gethostname()
    assert "T" in m["created"] and ("+" in m["created"] or m["created"].endswith("Z"))
    action_keys = {"name", "kind", "command", "target", "path", "status", "exit_code", "started",
                   "duration_s", "timeout_s", "timeout_hit", "truncated", "error"}
    for action in m["actions"]:
        assert set(action) == action_keys and action["kind"] in ("command", "file", "probe")
        if action["path"]:
            assert (out / action["path"]).is_file(), action
    spy = [a for a in m["actions"] if a["name"].startswith("py-spy")]
    assert spy and all("--nonblocking" in a["command"] and a["exit_code"] == 0 for a in spy)
    info = json.loads((out / "processes" / str(hung.torchrun.ranks[0]) / "info.json").read_text())
    assert info["rank"] == 0 and info["local_rank"] == 0 and info["role"] == "worker"
    import torch  # the job's own torch: tests that run jobs need it, the others do not

    assert info["versions"]["torch"] == torch.__version__
    assert info["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert info["master_addr"] == "127.0.0.1" and info["env"]["RANK"] == "0"
    assert info["stdout"].endswith("/0/stdout.log") and info["cwd"]
    host = json.loads((out / "host" / "host.json").read_text())
    assert any(i["loopback"] and any(a.startswith("127.") for a in i["addresses"])
               for i in host["interfaces"])
    assert host["shm"]["size"] > 0 and host["limits"]["values"]["Max open files"]["soft"]
    assert host["nvidia_smi"] in ("absent", "ok", "error", "timeout")
    # logs: torchrun --log-dir files, the agent's stdout file, and the --logs directory
    sources = {entry["source"]: entry for entry in m["logs"]}
    assert str(hung.torchrun.log) in sources
    assert str(hung.root / "extra" / "train.log") in sources
    rank_logs = [s for s in sources if "/trlogs/" in s and s.endswith("stdout.log")]
    assert len(rank_logs) == 3
    for entry in m["logs"]:
        assert (out / entry["path"]).is_file() and entry["path"].startswith("logs/")
    assert collected.result.tarball is not None
    with tarfile.open(collected.result.tarball) as tar:
        assert f"{out.name}/manifest.json" in tar.getnames()
    assert m["tar"]["path"] == collected.result.tarball.name and m["tar"]["status"] == "ok"
    assert m["tar"]["files"] == m["tar"]["total"] == len(h.bundle_files(out))
    assert [a["status"] for a in m["actions"] if a["name"] == "tar"] == ["ok"]


@pytest.mark.scenario
def test_log_over_the_size_cap_keeps_head_and_tail(hung: SimpleNamespace,
                                                   collected: SimpleNamespace) -> None:
    m = collected.result.manifest
    big = hung.root / "extra" / "big.log"
    entry = next(e for e in m["logs"] if e["source"] == str(big))
    assert entry["truncated"] is True and entry["size"] == big.stat().st_size > LOG_CAP
    assert entry["copied"] < entry["size"]
    lines = (collected.out / entry["path"]).read_text().splitlines()
    assert lines[0] == "step 0 loss 1.0" and lines[-1] == "step 19999 loss 1.0"
    assert sum("bytes omitted from the middle of this file]" in ln for ln in lines) == 1
    assert (collected.out / entry["path"]).stat().st_size < LOG_CAP + 200
    copy = next(a for a in m["actions"] if a["name"] == "copy log" and a["target"] == str(big))
    assert copy["truncated"] is True and copy["status"] == "ok"
    assert not [e["source"] for e in m["logs"] if e["truncated"] and e is not entry]


@pytest.mark.scenario
def test_secrets_are_redacted_everywhere(hung: SimpleNamespace,
                                         collected: SimpleNamespace) -> None:
    files = h.bundle_files(collected.out)
    assert len(files) > 10
    for path in files:
        data = path.read_bytes()
        for secret in PLANTED:
            assert secret.encode() not in data, f"{secret!r} leaked into {path}"
    with tarfile.open(collected.result.tarball) as tar:
        for member in tar.getmembers():
            if member.isfile():
                data = tar.extractfile(member).read()  # type: ignore[union-attr]
                assert not any(s.encode() in data for s in PLANTED), member.name
    info = json.loads((collected.out / "processes" / str(hung.torchrun.ranks[1]) / "info.json")
                      .read_text())
    assert info["env"]["HF_TOKEN"] == MASK and info["env"]["MY_SECRET_KEY"] == MASK
    assert info["env"]["DATA_URL"] == f"https://alice:{MASK}@data.example.com/shards"
    assert info["cmdline"][info["cmdline"].index("--hf-token") + 1] == MASK
    log = next(e for e in collected.result.manifest["logs"] if e["source"].endswith("train.log"))
    text = (collected.out / log["path"]).read_text()
    assert f"MY_SECRET_KEY={MASK}" in text and "step 2" in text
    ready_lines = [ln for p in files if p.name == "stdout.log"
                   for ln in p.read_text().splitlines() if ln.startswith("READY")]
    assert len(ready_lines) == 3 and all(MASK in ln for ln in ready_lines)


@pytest.mark.scenario
def test_network_probe_sees_the_agent_store(hung: SimpleNamespace,
                                            collected: SimpleNamespace) -> None:
    probes = json.loads((collected.out / "network" / "probe.json").read_text())
    entry = next(p for p in probes if p["master_port"] == hung.torchrun.port)
    assert entry["master_addr"] == "127.0.0.1" and entry["resolves"] is True
    assert entry["listening_here"] is True and entry["holder_pid"] == hung.torchrun.pid
    assert entry["connect"]["ok"] is True and entry["status"] == "ok"


@pytest.mark.scenario
def test_dataloader_workers_have_their_role(hung: SimpleNamespace,
                                            collected: SimpleNamespace) -> None:
    rank2 = hung.torchrun.ranks[2]
    loaders = [p for p in collected.procs.values() if p["role"] == "dataloader"]
    assert len(loaders) == 2
    assert all(p["ppid"] == rank2 and p["worker_pid"] == rank2 for p in loaders)
    assert all(p["stack_status"] == "ok" for p in loaders)
    stack = json.loads((collected.out / loaders[0]["stack"]).read_text())
    assert "_worker_loop" in frame_names(main_thread(stack, loaders[0]["pid"]))


@pytest.mark.scenario
def test_flight_recorder_trigger_and_pickup(hung: SimpleNamespace,
                                            collected: SimpleNamespace) -> None:
    m = collected.result.manifest
    pipes = {Path(p["pipe"]).name: p["result"] for p in m["fr"]["pipes"]}
    assert pipes == {"pipe_0.pipe": "no_reader", "pipe_1.pipe": "triggered",
                     "pipe_2.pipe": "absent"}
    assert collected.dumper.poked.is_set()
    assert sorted(m["fr_dumps"]) == ["fr/trace_rank_0", "fr/trace_rank_1"]
    assert m["fr"]["skipped_stale"] == [str(hung.fr / "trace_rank_7")]
    assert pickle.loads((collected.out / "fr" / "trace_rank_1").read_bytes())["version"] == "2.10"
    assert any("without a reader" in w for w in collected.result.warnings)
    assert {"kind": "fr_no_reader", "count": 1, "pids": [], "detail": None,
            "targets": [str(hung.fr / "pipe_0.pipe")]} in m["problems"]


@pytest.mark.scenario
def test_collected_bundle_reports_what_was_not_collected(hung: SimpleNamespace,
                                                         collected: SimpleNamespace) -> None:
    """analyze reads the manifest's problems (AUT003, one finding per kind, its own remedy);
    every stack was taken, so AUT002 stays quiet."""
    kinds = [p["kind"] for p in collected.result.manifest["problems"]]
    assert "fr_no_reader" in kinds and not {"env_unreadable", "info_failed", "no_logs"} & set(kinds)
    analysis = run(load([collected.out]))
    found = {f.details["kind"]: f for f in analysis.findings if f.rule == "AUT003"}
    assert set(found) == set(kinds)
    fr = found["fr_no_reader"]
    assert fr.role == "info" and "TORCH_NCCL_TRACE_BUFFER_SIZE" in fr.remedy
    assert "1 Flight Recorder pipe(s) nobody reads" in fr.summary
    assert str(hung.fr / "pipe_0.pipe") in fr.evidence[0].text
    assert not [f for f in analysis.findings if f.rule == "AUT002"]


@pytest.mark.scenario
def test_pid_of_a_rank_or_dataloader_finds_the_same_job(hung: SimpleNamespace,
                                                        collected: SimpleNamespace) -> None:
    expected = sorted(collected.procs)
    for pid in (hung.torchrun.ranks[1], next(p for p, e in collected.procs.items()
                                             if e["role"] == "dataloader")):
        job = job_for_pid(pid)
        assert job.launcher_pid == hung.torchrun.pid and sorted(job.pids) == expected


@pytest.mark.scenario
def test_collect_from_a_rank_pid_with_native_frames(hung: SimpleNamespace,
                                                    tmp_path: Path) -> None:
    rank1 = hung.torchrun.ranks[1]
    result = collect(CollectOptions(pid=rank1, out=tmp_path / "b", native=True))
    assert result.manifest["job"]["launcher_pid"] == hung.torchrun.pid
    entry = next(p for p in result.manifest["processes"] if p["pid"] == rank1)
    spy = [a for a in result.manifest["actions"] if a["target"] == f"pid {rank1}"
           and a["name"].startswith("py-spy")]
    native = [a for a in spy if a["name"] == "py-spy dump --json"]
    assert native and all("--native" in a["command"] and "--nonblocking" not in a["command"]
                          for a in native)
    # the text dump (Python frames and version header) does not pause the process again
    assert all("--nonblocking" in a["command"] for a in spy if a not in native)
    assert entry["stack_status"] == "ok", entry
    names = frame_names(main_thread(json.loads((tmp_path / "b" / entry["stack"]).read_text()),
                                    rank1))
    assert "evaluate" in names


@pytest.mark.scenario
def test_find_jobs_without_a_pid(hung: SimpleNamespace, tmp_path: Path) -> None:
    found = {j.key: j for j in find_jobs()}
    tr_key, sp_key = f"torchrun-{hung.torchrun.pid}", f"mp.spawn-{hung.spawn.pid}"
    assert tr_key in found and sp_key in found
    assert set(hung.torchrun.ranks.values()) <= set(found[tr_key].pids)
    assert found[tr_key].world_size == 3 and found[tr_key].launcher == "torchrun"
    with pytest.raises(CollectError) as err:  # two jobs (at least ours): the user must choose
        collect(CollectOptions(out=tmp_path / "ambiguous"))
    assert tr_key in str(err.value) and sp_key in str(err.value)
    assert not (tmp_path / "ambiguous").exists()


@pytest.mark.scenario
def test_mp_spawn_job_roles(hung: SimpleNamespace, tmp_path: Path) -> None:
    result = collect(CollectOptions(job=f"mp.spawn-{hung.spawn.pid}", out=tmp_path / "b"))
    m = result.manifest
    assert m["job"]["launcher"] == "mp.spawn" and m["job"]["launcher_pid"] == hung.spawn.pid
    assert m["job"]["master_port"] == hung.spawn.port
    procs = {p["pid"]: p for p in m["processes"]}
    assert procs[hung.spawn.pid]["role"] == "other"
    workers = sorted((p for p in procs.values() if p["role"] == "worker"),
                     key=lambda p: p["spawn_index"])
    assert [w["spawn_index"] for w in workers] == [0, 1]
    # The index each child got from mp.spawn (read from its _wrap frame), not its pid order.
    assert [w["pid"] for w in workers] == [hung.spawn.ranks[0], hung.spawn.ranks[1]]
    assert {w["spawn_index_source"] for w in workers} == {"py-spy locals"}
    index_reads = [a for a in m["actions"] if a["name"] == "mp.spawn index (py-spy --locals)"]
    assert len(index_reads) == 2 and not any(a.get("path") for a in index_reads)
    assert all(w["rank"] is None for w in workers)  # no RANK env: never guessed
    evaluating = [w for w in workers if "evaluate" in frame_names(main_thread(
        json.loads((tmp_path / "b" / w["stack"]).read_text()), w["pid"]))]
    assert [w["pid"] for w in evaluating] == [hung.spawn.ranks[1]]


@pytest.mark.scenario
def test_exited_and_bogus_processes_are_recorded(hung: SimpleNamespace, tmp_path: Path) -> None:
    job = job_for_pid(hung.torchrun.pid)
    gone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gone.kill()
    gone.wait(timeout=10)
    bogus = 2**22 + 12345  # above pid_max's default: never a live process
    extra = (Member(pid=gone.pid, ppid=hung.torchrun.pid, role="worker", rank=9),
             Member(pid=bogus, ppid=hung.torchrun.pid, role="worker", rank=10))
    job = dataclasses.replace(job, members=job.members + extra,
                              pids=(*job.pids, gone.pid, bogus))
    result = collect_job(job, CollectOptions(out=tmp_path / "b"))
    procs = {p["pid"]: p for p in result.manifest["processes"]}
    for pid in (gone.pid, bogus):
        assert procs[pid]["stack_status"] == "exited" and procs[pid]["stack"] is None
        info = json.loads((tmp_path / "b" / "processes" / str(pid) / "info.json").read_text())
        assert info["status"] == "exited"
    assert all(procs[p]["stack_status"] == "ok" for p in hung.torchrun.ranks.values())
    assert any("process exited" in w for w in result.warnings)
    assert result.manifest["complete"] is True
    with pytest.raises(CollectError, match="no process with pid"):
        collect(CollectOptions(pid=bogus, out=tmp_path / "c"))


@pytest.mark.scenario
def test_pyspy_timeout_is_recorded(hung: SimpleNamespace, tmp_path: Path) -> None:
    job = job_for_pid(hung.torchrun.pid)
    start = time.monotonic()
    result = collect_job(job, CollectOptions(out=tmp_path / "b", step_timeout_s=0.002))
    assert time.monotonic() - start < 20
    spy = [a for a in result.manifest["actions"] if a["name"] == "py-spy dump --json"]
    seen = [(a["target"], a["status"], a["timeout_hit"], a.get("error"), a.get("duration_s"))
            for a in spy]
    # 2 ms is a race py-spy now and then wins on a small process: each dump either finished
    # (ok) or is recorded as a timeout, and most must have hit it.
    assert spy and sum(a["timeout_hit"] for a in spy) > len(spy) / 2, seen
    assert all((a["status"] == "timeout") == a["timeout_hit"] for a in spy), seen
    assert all(a["status"] in ("ok", "timeout") for a in spy), seen
    timed_out = {int(a["target"].split()[1]) for a in spy if a["timeout_hit"]}
    status = {p["pid"]: p["stack_status"] for p in result.manifest["processes"]}
    assert all(status[pid] == "timeout" for pid in timed_out), (status, seen)
    assert any("stack dump timed out" in w for w in result.warnings)
    assert result.manifest["complete"] is True


@pytest.mark.scenario
def test_cli_text_json_and_exit_codes(hung: SimpleNamespace, tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(collect_command, ["--pid", str(hung.torchrun.pid), "--format", "json",
                                          "--out", str(tmp_path / "j")])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["bundle"] == str(tmp_path / "j") and doc["processes"] == 6
    assert doc["stacks_ok"] == 6 and doc["actions"]["ok"] > 10 and isinstance(doc["warnings"],
                                                                             list)
    res = runner.invoke(collect_command, ["--pid", str(hung.spawn.pid), "--out",
                                          str(tmp_path / "t")])
    assert res.exit_code == 0 and "Bundle: " in res.stdout and "Stacks: 4/4 ok" in res.stdout
    assert "mp.spawn" in res.stdout and "Next: ddp-autopsy analyze" in res.stdout
    res = runner.invoke(collect_command, ["--pid", str(2**22 + 12345)])
    assert res.exit_code == 2 and "no process with pid" in res.stderr
    res = runner.invoke(collect_command, ["--pid", "1", "--job", "x"])
    assert res.exit_code == 2


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "ddp_autopsy", "collect", *args]


@pytest.mark.scenario
def test_cli_job_by_run_id_shows_progress_on_a_terminal(hung: SimpleNamespace,
                                                         tmp_path: Path) -> None:
    """The real CLI with stderr on a pseudo-terminal: ``--job RUN_ID`` finds the torchrun job
    and rich draws its progress there."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(_cli("--job", hung.run_id, "--out", str(tmp_path / "b")),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave,
                            env={**os.environ, "TERM": "xterm-256color"})
    os.close(slave)
    seen = b""
    end = time.monotonic() + 120
    try:  # drain the terminal as it is written: a full pty buffer would block the CLI
        while time.monotonic() < end:
            if select.select([master], [], [], 0.1)[0]:
                try:
                    chunk = os.read(master, 1 << 16)
                except OSError:  # EIO: the CLI exited and closed its end
                    break
                if not chunk:
                    break
                seen += chunk
            elif proc.poll() is not None:
                break
        stdout = proc.communicate(timeout=30)[0].decode()
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, seen[-2000:]
    assert f"Job torchrun-{hung.torchrun.pid}:" in stdout
    assert b"collecting:" in seen and b"\x1b[" in seen, seen[-2000:]


@pytest.mark.scenario
def test_cli_job_by_launcher_pid_is_quiet_when_piped(hung: SimpleNamespace,
                                                      tmp_path: Path) -> None:
    res = subprocess.run(_cli("--job", str(hung.torchrun.pid), "--out", str(tmp_path / "b")),
                         stdin=subprocess.DEVNULL, capture_output=True, timeout=120,
                         env={**os.environ, "TERM": "xterm-256color"}, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"Job torchrun-{hung.torchrun.pid}:" in res.stdout.decode()
    assert b"collecting" not in res.stderr and b"\x1b" not in res.stderr + res.stdout


@pytest.mark.scenario
def test_killed_collect_leaves_a_readable_partial_bundle(hung: SimpleNamespace,
                                                         tmp_path: Path) -> None:
    out = tmp_path / "killed"
    code = ("import sys; from ddp_autopsy.collectors.command import collect_command; "
            "collect_command(sys.argv[1:])")
    proc = subprocess.Popen([sys.executable, "-c", code, "--pid", str(hung.torchrun.pid),
                             "--out", str(out), "--native"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: (out / "manifest.json").exists(), 30, interval=0.002)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        with contextlib.suppress(OSError):
            proc.kill()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is False
    assert manifest["job"]["launcher_pid"] == hung.torchrun.pid


@pytest.mark.scenario
def test_unprivileged_collect_records_permission_denied(hung: SimpleNamespace) -> None:
    """Run collect as ``nobody`` against the root-owned job: py-spy may not attach and the
    environments are unreadable — both recorded, with the remedy, and the bundle still written."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to drop to an unprivileged user")
    work = Path(tempfile.mkdtemp(prefix="ddp-autopsy-nobody-"))
    try:
        work.chmod(0o777)
        code = ("import json, sys; from pathlib import Path; "
                "from ddp_autopsy.collectors import collect, CollectOptions; "
                "r = collect(CollectOptions(pid=int(sys.argv[1]), out=Path(sys.argv[2]))); "
                "print(json.dumps(r.manifest))")
        proc = subprocess.run(
            [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
             sys.executable, "-c", code, str(hung.torchrun.pid), str(work / "b")],
            cwd=work, capture_output=True, text=True, timeout=120,
            env={**os.environ, "HOME": str(work)})
        if proc.returncode != 0 and "Permission denied" in proc.stderr and "import" in proc.stderr:
            pytest.skip("the virtualenv is not readable by nobody")
        assert proc.returncode == 0, proc.stderr[-3000:]
        m = json.loads(proc.stdout)
        statuses = {p["pid"]: p["stack_status"] for p in m["processes"]}
        assert set(statuses.values()) == {"permission_denied"}, statuses
        roles = sorted(p["role"] for p in m["processes"])
        assert roles.count("agent") == 1 and roles.count("worker") == 3
        warning = next(w for w in m["warnings"] if w.startswith("stack dump not permitted"))
        assert "CAP_SYS_PTRACE" in warning and "ptrace_scope" in warning
        assert any("environment unreadable" in w for w in m["warnings"])
        assert m["complete"] is True
        env = next(p for p in m["problems"] if p["kind"] == "env_unreadable")
        assert env["detail"] == "permission_denied" and set(env["pids"]) == set(statuses)
        # without the environments the ranks are unknown: the roles still tell them apart
        stacks = findings(work / "b", "AUT002")[0]
        assert stacks.summary.startswith("No stack dump for 3 rank(s) (3 of unknown rank: "
                                         "ptrace not permitted); also none for the torchrun "
                                         f"agent (pid {hung.torchrun.pid}: ptrace not "
                                         "permitted), 2 DataLoader workers (pid "), stacks.summary
        unread = next(f for f in findings(work / "b", "AUT003")
                      if f.details["kind"] == "env_unreadable")
        assert "the environment of 6 process(es) (permission denied)" in unread.summary
        assert "job's user or as root" in unread.remedy
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.scenario
def test_global_deadline_skips_the_rest(hung: SimpleNamespace, tmp_path: Path) -> None:
    job = job_for_pid(hung.torchrun.pid)
    start = time.monotonic()
    result = collect_job(job, CollectOptions(out=tmp_path / "b", deadline_s=0.01))
    assert time.monotonic() - start < 10
    m = result.manifest
    skipped = [a for a in m["actions"] if a["status"] == "skipped"]
    assert skipped and all(a["error"].startswith("deadline reached") for a in skipped)
    assert any(w.startswith("deadline of 0.01s reached") for w in result.warnings)
    assert m["complete"] is True and json.loads((tmp_path / "b" / "manifest.json").read_text())
    problems = {p["kind"]: p for p in m["problems"]}
    assert problems["deadline"]["count"] == len(skipped)
    assert problems["deadline"]["targets"] == sorted({f"{a['name']} ({a['target']})"
                                                     for a in skipped})
    # every stack was skipped: AUT002 names the ranks first, then the agent and DataLoader workers
    stacks = findings(tmp_path / "b", "AUT002")[0]
    assert stacks.summary.startswith("No stack dump for 3 rank(s) (ranks 0-2: skipped at the "
                                     "collect deadline); also none for the torchrun agent "
                                     f"(pid {hung.torchrun.pid}: skipped"), stacks.summary
    assert "2 DataLoader workers of rank 2" in stacks.summary and stacks.ranks == [0, 1, 2]
    assert stacks.severity == "warning"
    late = {f.details["kind"]: f for f in findings(tmp_path / "b", "AUT003")}
    assert late["deadline"].summary.startswith(f"collect on {socket.gethostname()} reached its "
                                               f"global deadline: {len(skipped)} step(s)")
    assert "--deadline" in late["deadline"].remedy




def test_collect_upload_sends_the_bundle_to_a_real_service(hung: SimpleNamespace,
                                                          tmp_path: Path) -> None:
    """collect --upload: the bundle goes to `ddp-autopsy serve` (a real server on loopback),
    which analyzes it; a wrong token keeps the bundle and says so."""
    pytest.importorskip("httpx")
    import server_helpers as sh

    server = sh.Server(tmp_path / "data").start()
    try:
        runner = CliRunner()
        res = runner.invoke(collect_command, ["--pid", str(hung.torchrun.pid), "--out",
                                              str(tmp_path / "b"), "--upload", server.url,
                                              "--token", sh.TOKEN])
        assert res.exit_code == 0, res.output
        link = next(line for line in res.stdout.splitlines() if line.startswith("uploaded: "))
        incident = link.rstrip("/").rsplit("/", 1)[-1]
        done = server.wait_analysed(incident)
        assert done["status"] == "done", (done.get("error"), done)
        res = runner.invoke(collect_command, ["--pid", str(hung.torchrun.pid), "--out",
                                              str(tmp_path / "c"), "--upload", server.url,
                                              "--token", "wrong"])
        assert res.exit_code == 1 and "bundle is kept" in res.stderr
        assert (tmp_path / "c" / "manifest.json").exists()
    finally:
        server.stop()
