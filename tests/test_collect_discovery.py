"""``ddp-autopsy collect`` without ``--pid``: finding the job on its own, and ``--job`` that
matches nothing. The job-less run and the single-job run happen in a PID namespace of their own,
so other jobs on the machine (other test runs, benchmarks) cannot make the choice ambiguous."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddp_autopsy.collectors.command import collect_command

# In a new PID namespace, bash is pid 1: it collects while no job runs, starts two srun-style
# ranks under a second shell (a launcher at pid 1 would not group its children), waits for
# them, and collects again with no arguments.
SCRIPT = r"""
set -u
"$PY" -m ddp_autopsy collect --out "$T/none" >"$T/none.out" 2>"$T/none.err"; echo $? >"$T/none.rc"
bash -c '
  for r in 0 1; do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 "$PY" -c "$CHILD" &
  done
  wait' &
echo $! >"$T/launcher.pid"
for _ in $(seq 300); do [ "$(ls "$T/ready" | wc -l)" -ge 2 ] && break; sleep 0.1; done
"$PY" -m ddp_autopsy collect --format json --out "$T/one" >"$T/one.out" 2>"$T/one.err"
echo $? >"$T/one.rc"
"""
# (the marker written whole, then renamed: never seen empty)
CHILD = ("import os, pathlib, time; "
         "t = pathlib.Path(os.environ['T'], '.r' + os.environ['RANK']); "
         "t.write_text(str(os.getpid())); "
         "os.replace(t, pathlib.Path(os.environ['T'], 'ready', os.environ['RANK'])); "
         "time.sleep(60)")


def _pid_namespaces() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                           capture_output=True, timeout=10, check=False)
    return probe.returncode == 0


@pytest.mark.skipif(not _pid_namespaces(), reason="needs PID namespaces (unshare --pid, root)")
def test_no_arguments_takes_the_only_job(tmp_path: Path) -> None:
    (tmp_path / "ready").mkdir()
    env = {"PATH": "/usr/bin:/bin", "PY": sys.executable, "T": str(tmp_path), "CHILD": CHILD,
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    # --kill-child: the ranks die with the namespace when the script ends
    subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
                    "bash", "-c", SCRIPT], env=env, timeout=120, check=True)

    def out(name: str) -> str:
        return (tmp_path / name).read_text()

    # nothing running: exit code 2 and a plain message, no bundle
    assert out("none.rc").strip() == "2", out("none.err")
    assert "no distributed training processes found on this host" in out("none.err")
    assert not (tmp_path / "none").exists()
    # exactly one job: taken without --pid or --job
    assert out("one.rc").strip() == "0", out("one.err")[-3000:]
    doc = json.loads(out("one.out"))
    launcher = int(out("launcher.pid"))
    ranks = {int(p.name): int(p.read_text()) for p in (tmp_path / "ready").iterdir()}
    assert doc["job"]["key"] == f"unknown-{launcher}" and doc["job"]["world_size"] == 2
    manifest = json.loads((tmp_path / "one" / "manifest.json").read_text())
    workers = {p["rank"]: p["pid"] for p in manifest["processes"] if p["role"] == "worker"}
    assert workers == ranks and doc["stacks_ok"] >= 2


def test_job_that_matches_nothing_is_a_usage_error(tmp_path: Path) -> None:
    res = CliRunner().invoke(collect_command, ["--job", "no-such-job-4711",
                                               "--out", str(tmp_path / "b")])
    assert res.exit_code == 2
    first = res.stderr.splitlines()[0]
    assert first == ("ddp-autopsy collect: no job matches 'no-such-job-4711'; "
                     "jobs on this host:")
    assert not (tmp_path / "b").exists()
