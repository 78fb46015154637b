"""A root collect copies only what the job's own user may read (issue #19, finding 1).

A real job runs as ``nobody``; its command line names a root-only (0700) directory holding a
0600 file through ``--log-dir``, its environment points Flight Recorder there, its ranks name a
``file://`` store there. collect runs as root (the real CLI, with ``--tar``): the file must be in
neither the bundle nor the tarball, and the manifest must say what was refused and why."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddp_autopsy.analyzer.job import load
from ddp_autopsy.rules.engine import run

try:
    from tests import test_collect_safety as safety
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    import test_collect_safety as safety  # type: ignore[no-redef]

NOBODY = 65534
REFUSED = "refused_unreadable_by_job_owner"


def _python_for(uid: int) -> str | None:
    """An interpreter ``uid`` may run (the venv's may live under a private home)."""
    for candidate in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
        if not candidate:
            continue
        try:
            res = subprocess.run([candidate, "-c", "print('ok')"], user=uid, group=uid,
                                 extra_groups=[], capture_output=True, text=True, timeout=30,
                                 check=False)
        except OSError:
            continue
        if res.stdout.strip() == "ok":
            return candidate
    return None


@pytest.fixture
def setting(tmp_path: Path) -> Iterator[dict[str, Path | str]]:
    """``work`` (0755, root) with ``job/`` (nobody's: its log dir, a symlink to the secret
    directory) and ``rootonly/`` (root, 0700) holding ``secret.log`` (0600) and ``open.log``
    (0644: unreachable for nobody all the same)."""
    if os.geteuid() != 0:
        pytest.skip("the privilege test collects as root: run the tests as root")
    try:
        import pwd
        pwd.getpwuid(NOBODY)
    except KeyError:
        pytest.skip(f"no user with uid {NOBODY} (nobody) on this host")
    python = _python_for(NOBODY)
    if python is None:
        pytest.skip("no Python interpreter the user nobody may run")
    work = Path(tempfile.mkdtemp(prefix="ddp-autopsy-priv-"))
    try:
        work.chmod(0o755)
        job = work / "job"
        (job / "logs" / "fake_0" / "attempt_0" / "0").mkdir(parents=True)
        (job / "logs" / "fake_0" / "attempt_0" / "0" / "stderr.log").write_text(
            "rank 0: the job's own log line\n")
        secret = work / "rootonly"
        secret.mkdir(mode=0o700)
        token = "TOPSECRET-" + secrets.token_hex(8)
        (secret / "secret.log").write_text(f"root only: {token}\n")
        (secret / "secret.log").chmod(0o600)
        (secret / "open.log").write_text(f"in a closed directory: {token}\n")
        (secret / "open.log").chmod(0o644)
        (secret / "trace_rank_0").write_text(f"a Flight Recorder dump? {token}\n")
        (secret / "trace_rank_0").chmod(0o644)
        (job / "link").symlink_to(secret)
        for dirpath, _, files in os.walk(job):
            os.chown(dirpath, NOBODY, NOBODY)
            for f in files:
                os.chown(os.path.join(dirpath, f), NOBODY, NOBODY)
        os.lchown(job / "link", NOBODY, NOBODY)
        yield {"work": work, "job": job, "secret": secret, "token": token, "python": python}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _bundle_text(bundle: Path, tarball: Path) -> bytes:
    data = b"".join(p.read_bytes() for p in bundle.rglob("*") if p.is_file())
    with tarfile.open(tarball) as tar:
        for member in tar.getmembers():
            if member.isfile():
                data += tar.extractfile(member).read()  # type: ignore[union-attr]
    return data


@pytest.mark.parametrize("layout", ["last_log_dir_is_root_only", "last_log_dir_links_there"])
def test_root_collect_of_a_nobody_job_copies_nothing_nobody_could_not_read(
        setting: dict[str, Path | str], layout: str) -> None:
    work, job_dir = Path(setting["work"]), Path(setting["job"])
    secret, token = Path(setting["secret"]), str(setting["token"])
    own = job_dir / "logs"
    named = secret if layout == "last_log_dir_is_root_only" else job_dir / "link"
    # torchrun takes the last --log-dir; the first one names the job's real directory
    args = ["--log-dir", str(own), "--nproc-per-node", "2", "--log-dir", str(named),
            "train.py", "--lr", "0.1"]
    out = work / "out" / "b"
    with safety.fake_job(job_dir, args, python=str(setting["python"]), user=NOBODY,
                         TORCH_FR_DUMP_TEMP_FILE=str(secret / "trace_rank_"),
                         FAKE_WORKER_ARG=f"--init-method=file://{secret / 'secret.log'}"
                         ) as job:
        assert Path(f"/proc/{job.ranks[0]}/status").read_text().count(f"\t{NOBODY}\t") >= 1
        res = safety.run_collect("--pid", str(job.pid), "--out", str(out), "--tar",
                                 "--logs", "rootonly/open.log", cwd=work)  # relative to cwd
    assert res.returncode == 0, res.stderr
    tarball = out.with_name("b.tar.gz")
    data = _bundle_text(out, tarball)
    assert token.encode() not in data  # neither in the bundle nor in the tarball
    assert b"the job's own log line" not in data  # the first --log-dir is not torchrun's
    manifest = json.loads((out / "manifest.json").read_text())
    # Checked as nobody (a path must pass for every user among the job's processes; root among
    # them, as a full test run once found, weakens nothing: root passes every check).
    assert manifest["read_as"]["checked"] and NOBODY in manifest["read_as"]["uids"]
    assert manifest["fr_dumps"] == []
    assert [f.get("size") for f in manifest.get("init_files", [])] in ([], [None])
    refused = next(p for p in manifest["problems"] if p["kind"] == REFUSED)
    assert refused["detail"] == f"job owner uid {NOBODY}"
    targets = "\n".join(refused["targets"])
    # (through the symbolic link too: its target is what is checked)
    assert f"{named}: not readable by uid {NOBODY} (mode 0700, owner uid 0)" in targets
    assert f"{secret / 'open.log'}: a directory on the way is not searchable" in targets
    # the Flight Recorder prefix's directory is not listed, the init file not read
    assert f"{secret}: not readable by uid {NOBODY}" in targets
    assert f"{secret / 'secret.log'}: not readable by the job's user" in targets
    assert any("the job's user may not read" in w for w in manifest["warnings"])
    # the rest of the job's own output is still there (its stdout, a file nobody owns)
    assert any(e["source"] == str(job_dir / "agent.log") for e in manifest["logs"])
    # analyze reports the refusal with its remedy
    found = [f for f in run(load([out])).findings
             if f.rule == "AUT003" and f.details["kind"] == REFUSED]
    assert found and "copy it yourself" in found[0].remedy
    assert "the job's own user may not read (job owner uid 65534)" in found[0].summary


def test_a_job_owned_log_dir_is_still_collected_as_root(setting: dict[str, Path | str]) -> None:
    """The check does not refuse what the job's user may read (the last --log-dir is its own)."""
    work, job_dir, secret = Path(setting["work"]), Path(setting["job"]), Path(setting["secret"])
    args = ["--log-dir", str(secret), "--log-dir", str(job_dir / "logs"), "train.py"]
    out = work / "b"
    with safety.fake_job(job_dir, args, python=str(setting["python"]), user=NOBODY) as job:
        res = safety.run_collect("--pid", str(job.pid), "--out", str(out))
    assert res.returncode == 0, res.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    sources = {e["source"] for e in manifest["logs"]}
    assert str(job_dir / "logs" / "fake_0" / "attempt_0" / "0" / "stderr.log") in sources
    assert not any(str(secret) in s for s in sources)
    # Nothing of the job's own is refused (other paths collect looks at, e.g. the default
    # Flight Recorder dump locations other tests may leave root's files in, are not this test's).
    refused = [t for p in manifest["problems"] if p["kind"] == REFUSED
               for t in p.get("targets") or [str(p)]]
    assert not [t for t in refused if str(job_dir) in t], refused
