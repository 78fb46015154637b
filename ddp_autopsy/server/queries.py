"""Reads of the index shared by the JSON API and the pages.

Every read is a project's: it sees the project's own incidents and those shared with it (or
with every project), nothing else; an incident it cannot see does not exist for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ddp_autopsy.server import db as t

PAGE_SIZE = 50
INCIDENT_FIELDS = ("id", "project", "created_at", "updated_at", "status", "error", "job_key",
                   "job_name", "user_name", "cause", "rule", "summary", "group_id", "analysis_id",
                   "uploads")


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


def _shared_ids(project: str) -> sa.Select[Any]:
    return sa.select(t.shares.c.incident_id).where(
        t.shares.c.project.in_([project, t.EVERY_PROJECT]))


def visible(conn: Connection, project: str) -> sa.ColumnElement[bool]:
    """The incidents the project may see: its own, and those shared with it."""
    own = t.incidents.c.project == project
    if conn.execute(_shared_ids(project).limit(1)).first() is None:
        return own  # the common case, served by the (project, created_at) index
    return sa.or_(own, t.incidents.c.id.in_(_shared_ids(project)))


def causes(conn: Connection, project: str) -> list[str]:
    """The causes of the groups the project sees (the list page's choices)."""
    g, st, i = t.groups, t.group_stats, t.incidents
    own = sa.select(g.c.cause).join(st, st.c.group_id == g.c.id).where(
        st.c.project == project, st.c.n > 0)
    shared = sa.select(i.c.cause).where(i.c.id.in_(_shared_ids(project)),
                                        i.c.cause.is_not(None))
    return sorted({c for c in conn.execute(sa.union(own, shared)).scalars() if c})


def list_incidents(conn: Connection, f: Filters, project: str, page_size: int = PAGE_SIZE
                   ) -> tuple[list[dict[str, Any]], bool]:
    """One page of the project's incidents, newest first, and whether there is a next page."""
    i = t.incidents
    conds: list[sa.ColumnElement[bool]] = []
    if f.cause:
        conds.append(i.c.cause == f.cause)
    if f.rule:
        conds.append(i.c.rule == f.rule.upper())
    if f.group:
        conds.append(i.c.group_id == f.group)
    if f.host:
        conds.append(i.c.hosts.like(f"%,{_like(f.host)},%", escape="\\"))
    if f.rank is not None:
        conds.append(i.c.culprit_ranks.like(f"%,{int(f.rank)},%"))
    if f.job:
        pat = f"%{_like(f.job)}%"
        conds.append(sa.or_(i.c.job_name.like(pat, escape="\\"),
                            i.c.job_key.like(pat, escape="\\")))
    if f.user:
        conds.append(i.c.user_name == f.user)
    if f.since:
        conds.append(i.c.created_at >= _day(f.since))
    if f.until:
        conds.append(i.c.created_at < _day(f.until, end=True))
    # The evidence text holds every finding's summary and evidence lines. PostgreSQL serves
    # the plain match by the pg_trgm index on lower(evidence) when present.
    text = [sa.func.lower(i.c.evidence).like(f"%{_like(f.q.lower())}%", escape="\\")] \
        if f.q else []
    indexed = text
    if f.q and len(f.q) >= 3 and not set(f.q) & set("%_\\") and t.has_text_index(conn):
        # SQLite FTS5 trigrams: the same case-insensitive substring match, indexed.
        fts = sa.text("SELECT rowid FROM incidents_fts WHERE evidence LIKE :pat") \
            .bindparams(pat=f"%{f.q}%")
        indexed = [sa.literal_column("incidents.rowid").in_(fts)]
    page = max(1, f.page)
    newest = (i.c.created_at.desc(), i.c.id.desc())
    own = sa.select(i).where(i.c.project == project, *conds, *indexed)
    if conn.execute(_shared_ids(project).limit(1)).first() is None:
        q = own.order_by(*newest)  # the common case: the (project, created_at) index, in order
    else:
        # Its own and the shared, each in order and cut at the page's end, then merged: one
        # "own OR shared" condition would sort every visible incident before the first page.
        end = page * page_size + 1
        # The shared are few: matched by scanning them, not by the text index again.
        shared = sa.select(i).where(i.c.id.in_(_shared_ids(project)), i.c.project != project,
                                    *conds, *text)
        parts = [sa.select(x.order_by(*newest).limit(end).subquery()) for x in (own, shared)]
        both = sa.union_all(*parts).subquery()
        q = sa.select(both).order_by(both.c.created_at.desc(), both.c.id.desc())
    q = q.offset((page - 1) * page_size).limit(page_size + 1)
    rows = [incident_row(r) for r in conn.execute(q).mappings()]
    return rows[:page_size], len(rows) > page_size


def get_incident(conn: Connection, incident_id: str, project: str) -> dict[str, Any] | None:
    """The incident, if the project may see it: its own (``owned``, with ``shared_with``) or
    shared with it."""
    row = conn.execute(sa.select(t.incidents).where(t.incidents.c.id == incident_id,
                                                    visible(conn, project))) \
        .mappings().first()
    if row is None:
        return None
    d = incident_row(row)
    d["owned"] = row["project"] == project
    d["shared_with"] = sorted(conn.execute(sa.select(t.shares.c.project).where(
        t.shares.c.incident_id == incident_id)).scalars()) if d["owned"] else []
    d["uploads_list"] = [
        {"sha256": u.sha256, "name": u.name, "kind": u.kind, "size": u.size,
         "host": u.host, "created_at": u.created_at, "raw": f"/api/v1/uploads/{u.sha256}/raw"}
        for u in conn.execute(sa.select(t.uploads).where(t.uploads.c.incident_id == incident_id,
                                                         t.uploads.c.project == row["project"])
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


def upload_row(conn: Connection, sha: str, project: str) -> Any:
    """The upload with this SHA-256 in an incident the project may see (None when none)."""
    u, i = t.uploads, t.incidents
    return conn.execute(
        sa.select(u).join(i, sa.and_(i.c.id == u.c.incident_id, i.c.project == u.c.project))
        .where(u.c.sha256 == sha, visible(conn, project))
        .order_by((u.c.project != project).asc()).limit(1)).first()


GROUP_FIELDS = ("id", "version", "cause", "rule", "template", "created_at")


def list_groups(conn: Connection, project: str, cause: str | None = None, page: int = 1,
                page_size: int = PAGE_SIZE) -> tuple[list[dict[str, Any]], bool]:
    """The groups of the incidents the project sees, most recently seen first: the project's
    counters (db.refresh_group_stats) plus its shared incidents, counted here (few)."""
    g, st, i, notes = t.groups, t.group_stats, t.incidents, t.group_notes
    parts: list[sa.Select[Any]] = [
        sa.select(st.c.group_id.label("gid"), st.c.n.label("n"),
                  st.c.first_seen.label("first"), st.c.last_seen.label("last"))
        .where(st.c.project == project, st.c.n > 0)]
    if conn.execute(_shared_ids(project).limit(1)).first() is not None:
        parts.append(sa.select(i.c.group_id, sa.literal(1), i.c.created_at, i.c.created_at)
                     .where(i.c.id.in_(_shared_ids(project)), i.c.project != project,
                            i.c.group_id.is_not(None)))
    both = sa.union_all(*parts).subquery() if len(parts) > 1 else parts[0].subquery()
    seen = sa.select(both.c.gid, sa.func.sum(both.c.n).label("n"),
                     sa.func.min(both.c.first).label("first_seen"),
                     sa.func.max(both.c.last).label("last_seen")).group_by(both.c.gid).subquery()
    q = (sa.select(*(g.c[k] for k in GROUP_FIELDS), seen.c.n, seen.c.first_seen,
                   seen.c.last_seen, notes.c.note)
         .join(seen, seen.c.gid == g.c.id)
         .join(notes, sa.and_(notes.c.group_id == g.c.id, notes.c.project == project),
               isouter=True))
    if cause:
        q = q.where(g.c.cause == cause)
    q = q.order_by(seen.c.last_seen.desc(), g.c.id).offset((max(1, page) - 1) * page_size) \
        .limit(page_size + 1)
    rows = [dict(r) for r in conn.execute(q).mappings()]
    for r in rows:
        r["count"] = int(r.pop("n"))
        r["permalink"] = f"/groups/{r['id']}"
    return rows[:page_size], len(rows) > page_size


def get_group(conn: Connection, group_id: str, project: str) -> dict[str, Any] | None:
    """The group as the project sees it (its incidents, its note); None when it sees none."""
    g = conn.execute(sa.select(*(t.groups.c[k] for k in GROUP_FIELDS))
                     .where(t.groups.c.id == group_id)).mappings().first()
    if g is None:
        return None
    i, a = t.incidents, t.analyses
    mine = sa.and_(i.c.group_id == group_id, visible(conn, project))
    members = conn.execute(
        sa.select(i.c.id, i.c.created_at, i.c.job_name, i.c.hosts, i.c.culprit_ranks,
                  i.c.summary, a.c.fp_raw)
        .join(a, a.c.id == i.c.analysis_id, isouter=True)
        .where(mine).order_by(i.c.created_at.desc()).limit(500)).mappings()
    incidents = [{"id": m["id"], "created_at": m["created_at"], "job_name": m["job_name"],
                  "hosts": [h for h in (m["hosts"] or "").split(",") if h],
                  "culprit_ranks": [int(r) for r in (m["culprit_ranks"] or "").split(",") if r],
                  "summary": m["summary"], "matched": m["fp_raw"],
                  "permalink": f"/i/{m['id']}"} for m in members]
    stats = conn.execute(sa.select(sa.func.count(), sa.func.min(i.c.created_at),
                                   sa.func.max(i.c.created_at)).where(mine)).one()
    if not stats[0]:
        return None
    note = conn.execute(sa.select(t.group_notes.c.note).where(
        t.group_notes.c.group_id == group_id, t.group_notes.c.project == project)).scalar()
    hosts = sorted({h for m in incidents for h in m["hosts"]})
    return {**dict(g), "note": note, "count": stats[0],
            "first_seen": stats[1], "last_seen": stats[2], "hosts": hosts,
            "incidents": incidents, "permalink": f"/groups/{group_id}"}
