"""Reads of the index shared by the JSON API and the pages."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ddp_autopsy.server import db as t

PAGE_SIZE = 50
INCIDENT_FIELDS = ("id", "created_at", "updated_at", "status", "error", "job_key", "job_name",
                   "user_name", "cause", "rule", "summary", "group_id", "analysis_id", "uploads")


@dataclass
class Filters:
    cause: str | None = None
    rule: str | None = None
    host: str | None = None
    rank: int | None = None
    job: str | None = None
    user: str | None = None
    since: date | None = None
    until: date | None = None
    q: str | None = None
    group: str | None = None
    page: int = 1

    def params(self) -> dict[str, str]:
        """The non-empty filters as query parameters (for links to other pages)."""
        out = {k: str(v) for k, v in self.__dict__.items() if v not in (None, "") and k != "page"}
        return out


def _day(d: date, end: bool = False) -> float:
    dt = datetime(d.year, d.month, d.day, tzinfo=timezone.utc)
    return dt.timestamp() + (86400 if end else 0)


def _like(value: str) -> str:
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def incident_row(row: Any) -> dict[str, Any]:
    d = {k: row[k] for k in INCIDENT_FIELDS}
    d["culprit_ranks"] = [int(r) for r in (row["culprit_ranks"] or "").split(",") if r]
    d["hosts"] = [h for h in (row["hosts"] or "").split(",") if h]
    d["permalink"] = f"/i/{row['id']}"
    return d


def list_incidents(conn: Connection, f: Filters, page_size: int = PAGE_SIZE
                   ) -> tuple[list[dict[str, Any]], bool]:
    """One page of incidents, newest first, and whether there is a next page."""
    i = t.incidents
    q = sa.select(i)
    if f.cause:
        q = q.where(i.c.cause == f.cause)
    if f.rule:
        q = q.where(i.c.rule == f.rule.upper())
    if f.group:
        q = q.where(i.c.group_id == f.group)
    if f.host:
        q = q.where(i.c.hosts.like(f"%,{_like(f.host)},%", escape="\\"))
    if f.rank is not None:
        q = q.where(i.c.culprit_ranks.like(f"%,{int(f.rank)},%"))
    if f.job:
        pat = f"%{_like(f.job)}%"
        q = q.where(sa.or_(i.c.job_name.like(pat, escape="\\"),
                           i.c.job_key.like(pat, escape="\\")))
    if f.user:
        q = q.where(i.c.user_name == f.user)
    if f.since:
        q = q.where(i.c.created_at >= _day(f.since))
    if f.until:
        q = q.where(i.c.created_at < _day(f.until, end=True))
    if f.q:
        # The evidence text holds every finding's summary and evidence lines.
        if len(f.q) >= 3 and not set(f.q) & set("%_\\") and t.has_text_index(conn):
            # SQLite FTS5 trigrams: the same case-insensitive substring match, indexed.
            fts = sa.text("SELECT rowid FROM incidents_fts WHERE evidence LIKE :pat") \
                .bindparams(pat=f"%{f.q}%")
            q = q.where(sa.literal_column("incidents.rowid").in_(fts))
        else:  # PostgreSQL: served by the pg_trgm index on lower(evidence) when present
            pat = f"%{_like(f.q.lower())}%"
            q = q.where(sa.func.lower(i.c.evidence).like(pat, escape="\\"))
    page = max(1, f.page)
    q = q.order_by(i.c.created_at.desc(), i.c.id.desc()).offset((page - 1) * page_size) \
        .limit(page_size + 1)
    rows = [incident_row(r) for r in conn.execute(q).mappings()]
    return rows[:page_size], len(rows) > page_size


def get_incident(conn: Connection, incident_id: str) -> dict[str, Any] | None:
    row = conn.execute(sa.select(t.incidents).where(t.incidents.c.id == incident_id)) \
        .mappings().first()
    if row is None:
        return None
    d = incident_row(row)
    d["uploads_list"] = [
        {"sha256": u.sha256, "name": u.name, "kind": u.kind, "size": u.size,
         "host": u.host, "created_at": u.created_at, "raw": f"/api/v1/uploads/{u.sha256}/raw"}
        for u in conn.execute(sa.select(t.uploads).where(t.uploads.c.incident_id == incident_id)
                              .order_by(t.uploads.c.created_at))]
    d["analyses"] = [analysis_row(a) for a in conn.execute(
        sa.select(t.analyses).where(t.analyses.c.incident_id == incident_id)
        .order_by(t.analyses.c.id.desc())).mappings()]
    pending = conn.execute(sa.select(t.jobs.c.state).where(
        t.jobs.c.incident_id == incident_id, t.jobs.c.state.in_(["queued", "running"]))).first()
    d["pending"] = pending.state if pending else None
    return d


def analysis_row(a: Any) -> dict[str, Any]:
    return {k: a[k] for k in ("id", "started_at", "finished_at", "status", "error",
                              "tool_version", "cause", "rule", "summary", "fingerprint",
                              "fp_template", "fp_raw", "seconds")}


def list_groups(conn: Connection, cause: str | None = None, page: int = 1,
                page_size: int = PAGE_SIZE) -> tuple[list[dict[str, Any]], bool]:
    g = t.groups
    q = sa.select(g).where(g.c.n > 0)  # counters kept by db.refresh_groups
    if cause:
        q = q.where(g.c.cause == cause)
    q = q.order_by(g.c.last_seen.desc(), g.c.id).offset((max(1, page) - 1) * page_size) \
        .limit(page_size + 1)
    rows = [dict(r) for r in conn.execute(q).mappings()]
    for r in rows:
        r["count"] = r.pop("n")
        r["permalink"] = f"/groups/{r['id']}"
    return rows[:page_size], len(rows) > page_size


def get_group(conn: Connection, group_id: str) -> dict[str, Any] | None:
    g = conn.execute(sa.select(t.groups).where(t.groups.c.id == group_id)).mappings().first()
    if g is None:
        return None
    i, a = t.incidents, t.analyses
    members = conn.execute(
        sa.select(i.c.id, i.c.created_at, i.c.job_name, i.c.hosts, i.c.culprit_ranks,
                  i.c.summary, a.c.fp_raw)
        .join(a, a.c.id == i.c.analysis_id, isouter=True)
        .where(i.c.group_id == group_id).order_by(i.c.created_at.desc()).limit(500)).mappings()
    incidents = [{"id": m["id"], "created_at": m["created_at"], "job_name": m["job_name"],
                  "hosts": [h for h in (m["hosts"] or "").split(",") if h],
                  "culprit_ranks": [int(r) for r in (m["culprit_ranks"] or "").split(",") if r],
                  "summary": m["summary"], "matched": m["fp_raw"],
                  "permalink": f"/i/{m['id']}"} for m in members]
    stats = conn.execute(sa.select(sa.func.count(), sa.func.min(i.c.created_at),
                                   sa.func.max(i.c.created_at))
                         .where(i.c.group_id == group_id)).one()
    hosts = sorted({h for m in incidents for h in m["hosts"]})
    return {**{k: v for k, v in dict(g).items() if k != "n"}, "count": stats[0],
            "first_seen": stats[1], "last_seen": stats[2], "hosts": hosts,
            "incidents": incidents, "permalink": f"/groups/{group_id}"}
