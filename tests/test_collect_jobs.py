"""Finding a job's processes and their roles (collectors/jobs.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ddp_autopsy.collectors import (
    find_jobs,
    job_for_pid,
    jobs,
    procs,
    pyspy,
)

try:
    from tests import collect_helpers as h
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    import collect_helpers as h  # type: ignore[no-redef]

HF_TOKEN, PEM_BODY, PLANTED = h.HF_TOKEN, h.PEM_BODY, h.PLANTED
SECRET_URL, SECRET_VALUE, URL_PASSWORD = h.SECRET_URL, h.SECRET_VALUE, h.URL_PASSWORD
frame_names, main_thread, wait_for = h.frame_names, h.main_thread, h.wait_for


@pytest.mark.parametrize("cmdline,agent", [
    (["/v/bin/python", "/v/bin/torchrun", "--nproc-per-node", "2", "x.py"], True),
    (["/v/bin/python", "-u", "-m", "torch.distributed.run", "x.py"], True),
    (["python", "-m", "torch.distributed.launch", "x.py"], True),
    (["python", "train.py", "--launcher", "torchrun"], False),
    (["python", "-c", "import torch.distributed.run"], False),
])
def test_agent_detection(cmdline: list[str], agent: bool) -> None:
    assert jobs.is_agent(cmdline) is agent


def test_spawn_child_detection() -> None:
    assert jobs.is_spawn_child(["python", "-c", "from multiprocessing.spawn import spawn_main; "
                                "spawn_main(tracker_fd=5, pipe_handle=7)", "--multiprocessing-fork"])
    assert not jobs.is_spawn_child(["python", "-c", "from multiprocessing.resource_tracker "
                                    "import main;main(4)"])


def test_sibling_ranks_under_a_shell_form_one_job(tmp_path: Path) -> None:
    """srun-style: ranks started side by side by a non-Python parent (here a shell loop)."""
    ready = tmp_path / "ready"
    ready.mkdir()
    child = (f"import os, pathlib, time; pathlib.Path({str(ready)!r}, os.environ['RANK'])"
             ".write_text(''); time.sleep(60)")
    script = "\n".join(f"RANK={r} LOCAL_RANK={r} WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 "
                       f"MASTER_PORT=1 {sys.executable} -c \"{child}\" &" for r in (0, 1))
    shell = subprocess.Popen(["bash", "-c", script + "\nwait"], start_new_session=True)
    try:
        assert wait_for(lambda: len(list(ready.iterdir())) == 2, 30)
        kids = h.descendants(shell.pid)
        job = job_for_pid(kids[0])
        assert job.launcher_pid == shell.pid and job.launcher == "unknown"
        assert sorted(job.pids) == sorted(kids) and job.world_size == 2
        assert sorted((m.role, m.rank) for m in job.members) == [("worker", 0), ("worker", 1)]
        # No-argument discovery lists these ranks (inside a larger job when a foreign launcher
        # above the test process also has ranks, as a full CI run once showed).
        assert any(set(job.pids) <= set(j.pids) for j in find_jobs())
    finally:
        h.kill_tree(shell.pid)
        shell.wait(timeout=10)


def test_spawn_index_is_read_only_from_torchs_wrap_frame() -> None:
    def doc(name: str, filename: str, i: str) -> list[dict[str, object]]:
        return [{"thread_name": "MainThread", "frames": [
            {"name": "work", "filename": "/job/train.py", "locals": [{"name": "i", "repr": "7"}]},
            {"name": name, "filename": filename, "locals": [
                {"name": "fn", "repr": "<function at 0x1>"}, {"name": "i", "repr": i}]}]}]

    wrap = "/venv/lib/python3.11/site-packages/torch/multiprocessing/spawn.py"
    assert pyspy.spawn_index_from_dump(doc("_wrap", wrap, "3")) == 3
    assert pyspy.spawn_index_from_dump(doc("_wrap", "/job/mine.py", "3")) is None
    assert pyspy.spawn_index_from_dump(doc("_wrap", wrap, "<unavailable>")) is None
    assert pyspy.spawn_index_from_dump({"not": "a dump"}) is None


def _snap(pid: int, ppid: int, cmdline: list[str], env: dict[str, str] | None = None
          ) -> procs.ProcSnapshot:
    return procs.ProcSnapshot(pid=pid, ppid=ppid, comm="python3", cmdline=tuple(cmdline),
                              exe="/usr/bin/python3.11", start_time=None, environ=env or {},
                              state="S")


def test_a_launcher_of_ranks_does_not_swallow_a_torchrun_it_also_started() -> None:
    """A Python process (pytest, a driver script) that started a torchrun job and, separately,
    a rank of its own: two jobs, not one (a CI run once merged them under pytest's pid)."""
    rank = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "29511"}
    table = {s.pid: s for s in [
        _snap(100, 1, ["python3", "-m", "pytest"]),
        _snap(200, 100, ["python3", "-m", "torch.distributed.run", "--nproc-per-node", "2",
                         "train.py"]),
        _snap(201, 200, ["python3", "train.py"], {**rank, "MASTER_PORT": "29500"}),
        _snap(202, 200, ["python3", "train.py"], {**rank, "RANK": "1", "LOCAL_RANK": "1",
                                                   "MASTER_PORT": "29500"}),
        _snap(300, 100, ["python3", "rank.py"], rank),
    ]}
    torchrun = job_for_pid(201, dict(table))
    assert (torchrun.launcher_pid, sorted(torchrun.pids)) == (200, [200, 201, 202])
    found = {j.launcher_pid: sorted(j.pids) for j in find_jobs(dict(table))}
    assert found[200] == [200, 201, 202]
    assert not {200, 201, 202} & set(found.get(100, []))
