"""collect is safe to interrupt and to share (issue #19): bundle and tarball modes, SIGINT
mid-copy and mid-tar, ``--tar`` never overwrites without ``--force``, ``--pid`` of a process
that is no distributed job is refused, a zombie rank is reported as exited, and a command line
that is not UTF-8 still leads to the log directory it names.

The jobs are small real processes: a Python program named ``torchrun`` (the agent, as discovery
sees it) that starts its ranks with ``RANK``/``WORLD_SIZE`` in their environment and never reaps
them. The privilege tests (tests/test_collect_privilege.py) run the same job as another user."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ddp_autopsy.collectors import logs
from ddp_autopsy.collectors.access import Access, Creds, Refused

# The agent: starts FAKE_NPROC ranks (FAKE_ZOMBIE_RANK exits at once and is never reaped: a
# zombie), writes what it is to stdout and sleeps. Its arguments are torchrun's, unused.
FAKE_AGENT = r"""
import os, sys, time
n = int(os.environ.get("FAKE_NPROC", "2"))
worker = (
    "import os, pathlib, sys, time\n"
    "pathlib.Path(os.environ['READY_DIR'], 'rank' + os.environ['RANK'])"
    ".write_text(str(os.getpid()))\n"
    "print('rank', os.environ['RANK'], 'started', flush=True)\n"
    "if os.environ['RANK'] == os.environ.get('FAKE_ZOMBIE_RANK'):\n"
    "    sys.exit(0)\n"
    "time.sleep(600)\n")
extra = [a for a in os.environ.get("FAKE_WORKER_ARG", "").split(" ") if a]
for r in range(n):
    env = {**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(n),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999", "TORCHELASTIC_RUN_ID": "fake"}
    os.posix_spawn(sys.executable, [sys.executable, "-c", worker, *extra], env)
print("agent up", flush=True)
time.sleep(600)
"""


@dataclass
class FakeJob:
    proc: subprocess.Popen[bytes]
    ready: Path
    nproc: int
    ranks: dict[int, int] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float = 30.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"fake agent exited with {self.proc.returncode}")
            markers = list(self.ready.glob("rank*"))
            if len(markers) >= self.nproc and all(m.read_text() for m in markers):
                self.ranks = {int(m.name[4:]): int(m.read_text()) for m in markers}
                return
            time.sleep(0.05)
        raise RuntimeError("fake job not ready")

    def stop(self) -> None:
        kids = [p for p in _children(self.pid)]
        for pid in [self.pid, *kids]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                stat_ = Path(f"/proc/{entry}/stat").read_text()
                if int(stat_.rpartition(")")[2].split()[1]) == pid:
                    out.append(int(entry))
    return out


def start_fake_job(workdir: Path, agent_args: Sequence[str | bytes], *, nproc: int = 2,
                   python: str = sys.executable, user: int | None = None,
                   stdout: Path | None = None, **env: str) -> FakeJob:
    """``python <workdir>/torchrun <agent_args>``; ranks write ``<workdir>/ready/rankN``."""
    script = workdir / "torchrun"
    script.write_text(FAKE_AGENT)
    ready = workdir / "ready"
    ready.mkdir(exist_ok=True)
    out = stdout or workdir / "agent.log"
    if user is not None:
        for p in (script, ready):
            os.chown(p, user, user)
        out.touch()
        os.chown(out, user, user)
    full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "READY_DIR": str(ready),
                "FAKE_NPROC": str(nproc), **env}
    with open(out, "ab") as fh:
        proc = subprocess.Popen([python, str(script), *agent_args], cwd=workdir, env=full_env,
                                stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True, user=user, group=user,
                                extra_groups=[] if user is not None else None)
    return FakeJob(proc, ready, nproc)


@contextlib.contextmanager
def fake_job(workdir: Path, agent_args: Sequence[str | bytes], **kw: object
             ) -> Iterator[FakeJob]:
    job = start_fake_job(workdir, agent_args, **kw)  # type: ignore[arg-type]
    try:
        job.wait_ready()
        yield job
    finally:
        job.stop()


def run_collect(*args: str, timeout: float = 120, **kw: object
                ) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess (umask 022, as on most hosts)."""
    return subprocess.run([sys.executable, "-m", "ddp_autopsy", "collect", *args],
                          capture_output=True, text=True, timeout=timeout, umask=0o022,
                          check=False, **kw)  # type: ignore[call-overload]


@pytest.fixture
def world_dir() -> Iterator[Path]:
    """A directory every user can reach (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="ddp-autopsy-sec-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob(".*") if p.name.endswith((".tmp", ".tail"))]


# -- log directories from the command line ----------------------------------------------------
def test_the_last_log_dir_before_the_script_wins() -> None:
    """As torchrun's parser: the last ``--log-dir``; a script's own ``--log-dir`` is not it."""
    cmd = ["/venv/bin/python", "/venv/bin/torchrun", "--log-dir", "/etc", "--nproc-per-node",
           "2", "--log_dir=/run/a", "--standalone", "--log-dir", "/run/b", "train.py",
           "--log-dir", "/etc/ssl"]
    assert logs.log_dirs_from_cmdline(cmd, "/w") == [Path("/run/b")]
    assert logs.log_dirs_from_cmdline(["python", "-u", "-m", "torch.distributed.run",
                                       "--log-dir", "rel", "-m", "pkg.train"], "/w") == \
        [Path("/w/rel")]
    assert logs.log_dirs_from_cmdline(["torchrun", "train.py", "--log-dir", "/x"], "/w") == []


# -- modes ------------------------------------------------------------------------------------
def test_bundle_and_tarball_are_private_whatever_the_umask(tmp_path: Path) -> None:
    """Directories 0700, files 0600 (a 0644 and a 0600 log alike), tarball 0600."""
    logs_dir = tmp_path / "given"
    logs_dir.mkdir()
    (logs_dir / "open.log").write_text("step 1\n")
    (logs_dir / "open.log").chmod(0o644)
    (logs_dir / "private.log").write_text("step 2\n")
    (logs_dir / "private.log").chmod(0o600)
    with fake_job(tmp_path, ["--nproc-per-node", "2", "train.py"]) as job:
        out = tmp_path / "out" / "bundle"
        res = run_collect("--pid", str(job.pid), "--out", str(out), "--tar", "--logs",
                          str(logs_dir))
    assert res.returncode == 0, res.stderr
    tarball = out.with_name("bundle.tar.gz")
    assert stat.S_IMODE(tarball.stat().st_mode) == 0o600
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    entries = list(out.rglob("*"))
    copied = [p for p in entries if p.name in ("open.log", "private.log")]
    assert len(copied) == 2
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in entries if p.is_dir()} == {"0o700"}
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in entries if p.is_file()} == {"0o600"}
    with tarfile.open(tarball) as tar:
        members = tar.getmembers()
    assert {m.mode for m in members if m.isdir()} == {0o700}
    assert {m.mode for m in members if m.isfile()} == {0o600}


# -- --tar never overwrites without --force ---------------------------------------------------
def test_tar_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    out = tmp_path / "b"
    tarball = tmp_path / "b.tar.gz"
    tarball.write_bytes(b"precious")
    with fake_job(tmp_path, ["--nproc-per-node", "2", "train.py"]) as job:
        res = run_collect("--pid", str(job.pid), "--out", str(out), "--tar")
        assert res.returncode == 2, res.stderr
        assert "exists" in res.stderr and "--force" in res.stderr
        assert tarball.read_bytes() == b"precious" and not out.exists()
        res = run_collect("--pid", str(job.pid), "--out", str(out), "--tar", "--force")
    assert res.returncode == 0, res.stderr
    with tarfile.open(tarball) as tar:
        assert "b/manifest.json" in tar.getnames()
    assert stat.S_IMODE(tarball.stat().st_mode) == 0o600


def test_tar_published_without_force_never_replaces_a_file_that_appeared(tmp_path: Path) -> None:
    """Between the check at start and the end of the tar another file may take the name."""
    from ddp_autopsy.collectors import bundle as bundle_mod
    from ddp_autopsy.collectors.collect import tar_bundle

    b = bundle_mod.Bundle(tmp_path / "b", bundle_mod.Deadline(30))
    b.write_text("x.txt", "data\n")
    (tmp_path / "b.tar.gz").write_bytes(b"someone else's")
    assert tar_bundle(b) is None
    assert (tmp_path / "b.tar.gz").read_bytes() == b"someone else's"
    assert b.manifest["tar"]["status"] == "error" and "--force" in b.manifest["tar"]["error"]
    assert not list(tmp_path.glob(".*"))


# -- --pid of something that is not a distributed job ----------------------------------------
def test_pid_of_a_plain_process_or_init_is_refused(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        for pid in (sleeper.pid, 1):
            out = tmp_path / f"b{pid}"
            res = run_collect("--pid", str(pid), "--out", str(out))
            assert res.returncode == 2, (pid, res.stdout, res.stderr)
            assert "is not part of a distributed job" in res.stderr
            assert "Traceback" not in res.stderr and not out.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


# -- zombie rank ------------------------------------------------------------------------------
def test_a_zombie_rank_is_reported_as_exited(tmp_path: Path) -> None:
    with fake_job(tmp_path, ["--nproc-per-node", "2", "train.py"], FAKE_ZOMBIE_RANK="1") as job:
        zombie = job.ranks[1]
        end = time.monotonic() + 10
        while time.monotonic() < end and \
                Path(f"/proc/{zombie}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            time.sleep(0.05)
        res = run_collect("--pid", str(job.pid), "--out", str(tmp_path / "b"), "--format",
                          "json")
    assert res.returncode == 0, res.stderr
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    procs = {p["pid"]: p for p in manifest["processes"]}
    assert procs[zombie]["role"] == "worker", procs[zombie]
    assert procs[zombie]["stack_status"] == "exited", procs[zombie]
    assert procs[job.ranks[0]]["stack_status"] == "ok" and procs[job.ranks[0]]["rank"] == 0
    assert any(w.startswith("stack dump process exited") and str(zombie) in w
               for w in manifest["warnings"]), manifest["warnings"]


# -- a command line that is not UTF-8 ---------------------------------------------------------
def test_a_latin1_log_dir_on_the_command_line_is_collected(tmp_path: Path) -> None:
    name = b"caf\xe9"  # Latin-1: not valid UTF-8
    log_dir = os.fsencode(tmp_path) + b"/" + name
    os.makedirs(log_dir + b"/fake_0/attempt_0/0")
    with open(log_dir + b"/fake_0/attempt_0/0/stderr.log", "w") as fh:
        fh.write("rank 0 says hello from a Latin-1 directory\n")
    with fake_job(tmp_path, [b"--log-dir", log_dir, b"--nproc-per-node", b"2", b"train.py"]
                  ) as job:
        res = run_collect("--pid", str(job.pid), "--out", str(tmp_path / "b"))
    assert res.returncode == 0, res.stderr
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    got = [e for e in manifest["logs"] if "log_dir" in e["kinds"]]
    assert len(got) == 1, manifest["logs"]
    assert os.fsencode(got[0]["source"]) == log_dir + b"/fake_0/attempt_0/0/stderr.log"
    copied = os.fsencode(tmp_path / "b") + b"/" + os.fsencode(got[0]["path"])
    assert b"Latin-1 directory" in Path(os.fsdecode(copied)).read_bytes()


# -- SIGINT -----------------------------------------------------------------------------------
def _big_log(path: Path, mb: int = 48) -> None:
    """Lines that gzip and the redactor take a while over (random hex)."""
    line = 0
    with open(path, "w") as fh:
        while fh.tell() < mb << 20:
            fh.write("".join(f"step {line + i} loss {secrets.token_hex(24)} ok\n"
                             for i in range(10000)))
            line += 10000


def _interrupt_when(proc: subprocess.Popen[bytes], seen: Callable[[], bool],
                    timeout: float = 60) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        if seen():
            proc.send_signal(signal.SIGINT)
            return True
        time.sleep(0.001)
    return False


@pytest.mark.parametrize("phase", ["copy", "tar"])
def test_sigint_leaves_no_partial_file_and_no_claim_of_completeness(tmp_path: Path,
                                                                    phase: str) -> None:
    """A real SIGINT to a real ``ddp-autopsy collect``: in the middle of a log copy (a ``.tmp``
    / ``.tail`` is in the bundle) or of the tar (its temp file is beside ``--out``)."""
    big = tmp_path / "given" / "big.log"
    big.parent.mkdir()
    _big_log(big)
    out = tmp_path / "out" / "b"
    tar_tmp = out.with_name(".b.tar.gz.tmp")
    with fake_job(tmp_path, ["--nproc-per-node", "2", "train.py"]) as job:
        proc = subprocess.Popen([sys.executable, "-m", "ddp_autopsy", "collect", "--pid",
                                 str(job.pid), "--out", str(out), "--tar", "--logs",
                                 str(big.parent),
                                 # a loaded machine must not time the big copy out first
                                 "--step-timeout", "240", "--deadline", "600"],
                                stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        try:
            if phase == "copy":  # the big log's own temp files: its copy is under way
                hit = _interrupt_when(proc, lambda: out.is_dir() and any(
                    p.name.startswith(".big.log.") for p in temp_files(out)))
            else:
                hit = _interrupt_when(proc, tar_tmp.exists)
            _, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert hit, f"never saw the {phase} in progress: {stderr.decode()[-2000:]}"
    assert proc.returncode == 130, stderr.decode()[-2000:]
    assert b"interrupted" in stderr
    assert not temp_files(out), temp_files(out)
    assert sorted(p.name for p in out.parent.iterdir()) == ["b"]  # no tarball, no temp file
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is False and manifest["interrupted"] is True
    kinds = {p["kind"] for p in manifest["problems"]}
    assert "interrupted" in kinds, manifest["problems"]
    # The interrupted step is not called a timeout (another step may really time out when the
    # machine is loaded: a probe, a /proc read; that is not this test's business).
    timed_out = [t for p in manifest["problems"] if p["kind"] == "step_timeout"
                 for t in p["targets"]]
    assert not [t for t in timed_out if t.startswith(("copy log", "tar"))], timed_out
    copies = [a for a in manifest["actions"] if a["name"] == "copy log"
              and a["target"] == str(big)]
    if phase == "copy":  # stopped at its next chunk, not run to its end
        assert [(a["status"], a["truncated"]) for a in copies] == [("skipped", True)], copies
        assert "interrupted" in copies[0]["error"]
    else:
        assert [a["status"] for a in copies] == ["ok"], copies
        assert manifest["tar"]["status"] == "skipped", manifest["tar"]


# -- the access check itself ------------------------------------------------------------------
def test_access_walk_refuses_what_the_user_could_not_reach(world_dir: Path) -> None:
    """Mode bits checked per component with another user's creds; a symlink is resolved and its
    target checked; a FIFO is never opened as a file."""
    if os.geteuid() != 0:
        pytest.skip("needs root to own files another user may not read")
    nobody = Creds(65534, frozenset({65534}))
    base = world_dir
    closed = base / "closed"
    closed.mkdir(mode=0o700)
    (closed / "open.log").write_text("x")
    (closed / "open.log").chmod(0o644)
    (base / "public.log").write_text("public\n")
    (base / "public.log").chmod(0o644)
    (base / "private.log").write_text("x")
    (base / "private.log").chmod(0o600)
    (base / "link").symlink_to(closed)
    (base / "ok-link").symlink_to("public.log")
    os.mkfifo(base / "fifo")
    (base / "fifo").chmod(0o666)
    access = Access((nobody,))
    with open(access.open(base / "public.log"), closefd=True) as fh:
        assert fh.read() == "public\n"
    with open(access.open(base / "ok-link"), closefd=True) as fh:
        assert fh.read() == "public\n"
    for path in (closed / "open.log", base / "private.log", base / "link" / "open.log"):
        with pytest.raises(Refused):
            access.open(path)
    with pytest.raises(Refused):
        access.listdir(base / "link")
    with pytest.raises(OSError, match="not a regular file"):
        access.open(base / "fifo")
    assert "public.log" in access.listdir(base)
