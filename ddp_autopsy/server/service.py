"""What the server does, apart from HTTP: keep an upload, and analyse an incident.

``ingest`` stores an inspected upload by content hash and queues its incident's analysis;
``Workers`` is the bounded pool that claims queued analyses from the database and runs the
same code as the CLI on them (``analyzer.job.load``, ``rules.engine.run``,
``reports.html.render``, ``reports.json_report.to_dict``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from ddp_autopsy import __version__
from ddp_autopsy.server import db as t
from ddp_autopsy.server import fingerprint
from ddp_autopsy.server.config import Settings
from ddp_autopsy.server.db import Database
from ddp_autopsy.server.safety import UploadInfo
from ddp_autopsy.server.storage import Store

log = logging.getLogger("ddp_autopsy.server")

#: Nodes of one job uploaded within this window join one incident.
JOIN_WINDOW_S = 24 * 3600
EVIDENCE_CHARS = 8000
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(name: str) -> str:
    """A client's file name reduced to a harmless basename (for display and work files)."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    base = _SAFE.sub("_", base).strip("._") or "upload"
    return base[:120]


def blob_key(sha: str, kind: str) -> str:
    return f"uploads/{sha[:2]}/{sha}.{kind}"


def incident_id_for(sha: str, project: str) -> str:
    """The permalink id of an incident whose first upload has this SHA-256: its first 20 hex
    digits in the default project (ids made before projects keep meaning the same), else of
    the SHA-256 of project and content (one content in two projects is two incidents)."""
    if project == t.DEFAULT_PROJECT:
        return sha[:20]
    return hashlib.sha256(f"{project}\n{sha}".encode()).hexdigest()[:20]


@dataclass
class Ingested:
    incident_id: str
    sha256: str
    duplicate: bool
    joined: bool


def ingest(database: Database, store: Store, tmp: Path, sha: str, name: str,
           info: UploadInfo, client: str, project: str = t.DEFAULT_PROJECT) -> Ingested:
    """Keep an inspected upload in the project: blob first (blobs are shared by content), then
    the rows (an upload is never half-indexed)."""
    mine = sa.select(t.uploads.c.incident_id).where(t.uploads.c.sha256 == sha,
                                                     t.uploads.c.project == project)
    with database.read() as conn:
        row = conn.execute(mine).first()
    if row is not None:
        return Ingested(row.incident_id, sha, duplicate=True, joined=False)
    key = blob_key(sha, info.kind)
    store.put_file(key, tmp)
    now = time.time()
    incident_id = incident_id_for(sha, project)
    joined = False
    try:
        with database.write() as conn:
            if info.job_key:
                incident_id, joined = _join(conn, project, info.job_key, incident_id, now)
            conn.execute(t.uploads.insert().values(
                project=project, sha256=sha, incident_id=incident_id, name=safe_name(name),
                kind=info.kind,
                size=tmp.stat().st_size, expanded=info.expanded, files=info.files,
                blob_key=key, job_key=info.job_key, host=info.host, client=client[:100],
                created_at=now))
            if joined:
                conn.execute(t.incidents.update().where(t.incidents.c.id == incident_id).values(
                    uploads=t.incidents.c.uploads + 1, updated_at=now, status="queued"))
            else:
                conn.execute(t.incidents.insert().values(
                    id=incident_id, project=project, created_at=now, updated_at=now,
                    status="queued",
                    job_key=info.job_key, job_name=info.job_name, uploads=1,
                    hosts=f",{info.host}," if info.host else None))
            database.enqueue(conn, incident_id)
    except IntegrityError:
        # The same content, uploaded at the same moment through another request or server.
        with database.read() as conn:
            row = conn.execute(mine).first()
        if row is None:
            raise
        return Ingested(row.incident_id, sha, duplicate=True, joined=False)
    return Ingested(incident_id, sha, duplicate=False, joined=joined)


def _join(conn: sa.Connection, project: str, job_key: str, incident_id: str, now: float
          ) -> tuple[str, bool]:
    """The incident of this job in this project (another node's upload made it), or claim the
    key for ours."""
    k = t.job_keys
    this = sa.and_(k.c.project == project, k.c.join_key == job_key)
    row = conn.execute(sa.select(k).where(this)).first()
    if row is not None and now - row.created_at < JOIN_WINDOW_S:
        return row.incident_id, True
    if row is None:
        conn.execute(k.insert().values(project=project, join_key=job_key,
                                       incident_id=incident_id, created_at=now))
    else:  # an old job that reused the id: a new incident from now on
        conn.execute(k.update().where(this).values(incident_id=incident_id, created_at=now))
    return incident_id, False


def reanalyze(database: Database, incident_ids: list[str] | None = None) -> int:
    """Queue a new analysis (the old ones are kept) of the given incidents, or of all."""
    with database.write() as conn:
        q = sa.select(t.incidents.c.id)
        if incident_ids is not None:
            q = q.where(t.incidents.c.id.in_(incident_ids))
        ids = list(conn.execute(q).scalars())
        for iid in ids:
            database.enqueue(conn, iid)
        return len(ids)


def _delimited(values: Any) -> str | None:
    vals = sorted({str(v) for v in values if v is not None and str(v) != ""})
    return "," + ",".join(vals) + "," if vals else None


def _evidence_text(result: dict[str, Any]) -> str:
    parts: list[str] = []
    for f in result.get("findings") or []:
        parts.append(str(f.get("summary", "")))
        parts += [str(e.get("text", "")) for e in f.get("evidence") or []]
    return "\n".join(parts)[:EVIDENCE_CHARS]


def _user_of(job: Any) -> str | None:
    env = job.env
    if not env.height:
        return None
    for key in ("USER", "LOGNAME", "SLURM_JOB_USER"):
        vals = env.filter(env["key"] == key)["value"].drop_nulls().to_list()
        vals = [v for v in vals if v and "*" not in v]
        if vals:
            return str(vals[0])[:100]
    return None


class Workers:
    """A bounded pool of analysis threads fed from the database queue."""

    def __init__(self, settings: Settings, database: Database, store: Store) -> None:
        self.settings = settings
        self.db = database
        self.store = store
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for i in range(self.settings.workers):
            th = threading.Thread(target=self._loop, name=f"analysis-{i}", daemon=True)
            th.start()
            self._threads.append(th)

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        for th in self._threads:
            th.join(timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                job = self.db.claim(self.settings.lease_s)
            except Exception:  # the database is away: try again shortly
                log.exception("claiming an analysis job failed")
                job = None
            if job is None:
                self._wake.wait(self.settings.poll_s)
                self._wake.clear()
                continue
            self._run(job)

    def _run(self, job: dict[str, Any]) -> None:
        stop_beat = threading.Event()
        beat = threading.Thread(target=self._heartbeat, args=(job, stop_beat), daemon=True)
        beat.start()
        try:
            analyse(self.settings, self.db, self.store, job["incident_id"])
            self.db.finish(job["id"], job["owner"], "done")
        except Exception as err:  # recorded on the incident; the server goes on
            log.exception("analysis of %s failed", job["incident_id"])
            self.db.finish(job["id"], job["owner"], "failed", f"{type(err).__name__}: {err}")
        finally:
            stop_beat.set()
            beat.join()

    def _heartbeat(self, job: dict[str, Any], stop: threading.Event) -> None:
        while not stop.wait(self.settings.lease_s / 3):
            try:
                self.db.renew(job["id"], job["owner"], self.settings.lease_s)
            except Exception:
                log.exception("renewing the lease of job %s failed", job["id"])


def analyse(settings: Settings, database: Database, store: Store, incident_id: str) -> int:
    """Analyse every upload of the incident as one job; record the result as a new analysis."""
    from ddp_autopsy.analyzer.job import load
    from ddp_autopsy.redact import redact_obj
    from ddp_autopsy.reports import html, json_report
    from ddp_autopsy.rules.engine import run

    started = time.time()
    with database.read() as conn:
        project = conn.execute(sa.select(t.incidents.c.project).where(
            t.incidents.c.id == incident_id)).scalar() or t.DEFAULT_PROJECT
        ups = conn.execute(sa.select(t.uploads).where(t.uploads.c.incident_id == incident_id,
                                                      t.uploads.c.project == project)
                           .order_by(t.uploads.c.created_at, t.uploads.c.sha256)).all()
    with database.write() as conn:
        # An analysis left "running" by a server killed mid-way (its job's lease ran out).
        conn.execute(t.analyses.update().where(
            t.analyses.c.incident_id == incident_id, t.analyses.c.status == "running",
            t.analyses.c.started_at < started - settings.lease_s).values(
            status="interrupted", error="the server stopped during this analysis",
            finished_at=started))
        aid = conn.execute(t.analyses.insert().values(
            incident_id=incident_id, started_at=started, status="running",
            tool_version=__version__, uploads=",".join(u.sha256 for u in ups))
        ).inserted_primary_key[0]
    work = settings.work / f"{incident_id}-{aid}"
    work.mkdir(parents=True, exist_ok=True)
    try:
        paths: list[Path] = []
        for u in ups:
            stem = safe_name(u.name).split(".", 1)[0] or "upload"
            local = work / f"{stem}-{u.sha256[:8]}.{u.kind}"
            src = store.local_copy(u.blob_key, local)
            if src != local:
                local.symlink_to(src)
            paths.append(local)
        job = load(paths)
        if settings.hold_s:  # testing only: a window to kill the server mid-analysis
            time.sleep(settings.hold_s)
        if not job.readable:
            notes = "; ".join(n.message for n in job.notes[:5])
            raise ValueError(f"nothing readable in the upload ({notes or 'no logs found'})")
        analysis = run(job)
        # What the service shows a team is redacted, like the HTML report (docs/redaction.md).
        result = redact_obj(json_report.to_dict(analysis))
        page = html.render(analysis)
    except Exception as err:
        msg = f"{type(err).__name__}: {err}"[:2000]
        with database.write() as conn:
            conn.execute(t.analyses.update().where(t.analyses.c.id == aid).values(
                status="error", error=msg, finished_at=time.time()))
            conn.execute(t.incidents.update().where(t.incidents.c.id == incident_id).values(
                status="error", error=msg, updated_at=time.time()))
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)

    verdict = result.get("verdict")
    fp = fingerprint.of(verdict)
    json_key, html_key = f"analyses/{aid}.json", f"analyses/{aid}.html"
    store.put_bytes(json_key, json.dumps(result, default=str).encode())
    store.put_bytes(html_key, page.encode())
    hosts = {h for r in result["ranks"]["known"] for h in (r.get("hosts") or [])}
    hosts |= {u.host for u in ups if u.host}
    hosts |= {h for f in result.get("findings") or [] for h in f.get("hosts") or []}
    finished = time.time()
    with database.write() as conn:
        exists = conn.execute(sa.select(t.groups.c.id).where(t.groups.c.id == fp.id)).first()
        if exists is None:
            try:
                with conn.begin_nested():
                    conn.execute(t.groups.insert().values(
                        id=fp.id, version=fp.version, cause=fp.cause, rule=fp.rule,
                        template=fp.template, created_at=finished))
            except IntegrityError:
                pass  # another worker made the group a moment ago
        old_group = conn.execute(sa.select(t.incidents.c.group_id).where(
            t.incidents.c.id == incident_id)).scalar()
        # Counters are written under their groups' row locks, taken in one order (no deadlock
        # between two workers whose incidents move between two groups).
        t.lock_groups(conn, [fp.id, old_group])
        # New to this project (the webhook's event): the first to make its counter row.
        new_group = False
        stats = t.group_stats
        if conn.execute(sa.select(stats.c.n).where(stats.c.group_id == fp.id,
                                                   stats.c.project == project)).first() is None:
            try:
                with conn.begin_nested():
                    conn.execute(stats.insert().values(group_id=fp.id, project=project, n=0))
                new_group = True
            except IntegrityError:
                pass
        conn.execute(t.analyses.update().where(t.analyses.c.id == aid).values(
            status="done", finished_at=finished, cause=verdict and verdict.get("cause"),
            rule=verdict and verdict.get("rule"), summary=verdict and verdict.get("summary"),
            fingerprint=fp.id, fp_template=fp.template, fp_raw=fp.raw, json_key=json_key,
            html_key=html_key, seconds=finished - started))
        # The newest analysis (by start) is the incident's; a slower, older one never wins.
        current = conn.execute(
            sa.select(t.analyses.c.id).where(t.analyses.c.incident_id == incident_id,
                                             t.analyses.c.status == "done")
            .order_by(t.analyses.c.started_at.desc(), t.analyses.c.id.desc()).limit(1)).scalar()
        if current == aid:
            pending = conn.execute(sa.select(t.jobs.c.id).where(
                t.jobs.c.incident_id == incident_id, t.jobs.c.state == "queued")).first()
            conn.execute(t.incidents.update().where(t.incidents.c.id == incident_id).values(
                status="queued" if pending else "done", error=None, updated_at=finished,
                cause=(verdict or {}).get("cause") or "none",
                rule=(verdict or {}).get("rule"), summary=(verdict or {}).get("summary"),
                culprit_ranks=_delimited((verdict or {}).get("ranks") or []),
                hosts=_delimited(hosts), evidence=_evidence_text(result),
                group_id=fp.id, analysis_id=aid, user_name=_user_of(job)))
            t.refresh_groups(conn, [fp.id, old_group])
            t.refresh_group_stats(conn, project, [fp.id, old_group])
    if new_group and settings.webhook:
        notify(settings, {"event": "new_group", "project": project, "group": fp.id,
                          "cause": fp.cause, "rule": fp.rule, "template": fp.template,
                          "incident": incident_id,
                          "summary": (verdict or {}).get("summary"),
                          "group_url": f"{settings.public_url}/groups/{fp.id}",
                          "incident_url": f"{settings.public_url}/i/{incident_id}"})
    return int(aid)


def notify(settings: Settings, payload: dict[str, Any]) -> None:
    """POST the payload to the webhook; a failing hook is logged, never fails the analysis."""
    import httpx

    assert settings.webhook
    try:
        httpx.post(settings.webhook, json=payload, timeout=10).raise_for_status()
    except httpx.HTTPError as err:
        log.warning("webhook %s failed: %s", settings.webhook, err)
