"""The index: SQLAlchemy Core tables, versioned migrations and the analysis job queue.

Nothing that matters lives in a server process: uploads, incidents, analyses, groups and the
job queue are rows, so several processes can serve one database. A worker claims a job with
``SELECT ... FOR UPDATE SKIP LOCKED`` (PostgreSQL) or one atomic ``UPDATE`` (SQLite) and holds
it by a lease it renews; a job whose lease ran out (its server was killed) is claimed again.

Every upload, incident and token belongs to a project (schema v3); an incident is seen by its
project and by the projects it is shared with (``shares``). A group (a fingerprint) is global,
but its counters (``group_stats``) and notes (``group_notes``) are kept per project.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from ddp_autopsy.server import config

meta = sa.MetaData()
#: Version 1's tables, as it made them (its migration must keep making exactly these).
_meta_v1 = sa.MetaData()

#: The project of every row made before projects existed, and of a bare ``--token``.
DEFAULT_PROJECT = config.DEFAULT_PROJECT
#: A share with this project name shares an incident with every project.
EVERY_PROJECT = "*"


def _group_columns() -> list[sa.Column[Any]]:
    return [sa.Column("id", sa.String(32), primary_key=True),  # the fingerprint
            sa.Column("version", sa.Integer, nullable=False),
            sa.Column("cause", sa.String(64), nullable=False),
            sa.Column("rule", sa.String(16), nullable=False),
            sa.Column("template", sa.Text, nullable=False),
            sa.Column("note", sa.Text),
            sa.Column("created_at", sa.Float, nullable=False)]


migrations_t = sa.Table(
    "schema_migrations", meta,
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("applied_at", sa.Float, nullable=False),
)

def _project(v1: bool) -> list[sa.Column[Any]]:
    if v1:
        return []
    return [sa.Column("project", sa.String(64), nullable=False,
                      server_default=DEFAULT_PROJECT)]


def _uploads(m: sa.MetaData, v1: bool) -> sa.Table:
    # v3: the same bytes uploaded by two projects are two uploads (and two incidents).
    return sa.Table(
        "uploads", m,
        *_project(v1),
        sa.Column("sha256", sa.String(64), primary_key=v1),
        sa.Column("incident_id", sa.String(32), nullable=False, index=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),  # tar.gz, zip, log, log.gz, ...
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("expanded", sa.BigInteger, nullable=False),
        sa.Column("files", sa.Integer, nullable=False),
        sa.Column("blob_key", sa.String(300), nullable=False),
        sa.Column("job_key", sa.String(300)),
        sa.Column("host", sa.String(300)),
        sa.Column("client", sa.String(100)),
        sa.Column("created_at", sa.Float, nullable=False),
        *([] if v1 else [sa.PrimaryKeyConstraint("project", "sha256")]),
    )


def _job_keys(m: sa.MetaData, v1: bool) -> sa.Table:
    return sa.Table(
        "job_keys", m,
        *_project(v1),
        sa.Column("join_key", sa.String(300), primary_key=v1),
        sa.Column("incident_id", sa.String(32), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        *([] if v1 else [sa.PrimaryKeyConstraint("project", "join_key")]),
    )


def _incidents(m: sa.MetaData, v1: bool) -> sa.Table:
    return sa.Table(
        "incidents", m,
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("created_at", sa.Float, nullable=False, index=True),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),  # queued running done error
        sa.Column("error", sa.Text),
        sa.Column("job_key", sa.String(300), index=True),
        sa.Column("job_name", sa.String(300), index=True),
        sa.Column("user_name", sa.String(100)),
        sa.Column("cause", sa.String(64), index=True),
        sa.Column("rule", sa.String(16), index=True),
        sa.Column("summary", sa.Text),
        #: ",0,3," — culprit ranks, and every host, delimited for exact LIKE matches.
        sa.Column("culprit_ranks", sa.String(2000)),
        sa.Column("hosts", sa.Text),
        sa.Column("evidence", sa.Text),
        sa.Column("group_id", sa.String(32), index=True),
        sa.Column("analysis_id", sa.Integer),
        sa.Column("uploads", sa.Integer, nullable=False, default=1),
        *_project(v1),  # v3: added last (ALTER TABLE ... ADD COLUMN)
        *([] if v1 else [sa.Index("ix_incidents_project_created", "project", "created_at")]),
    )


def _tokens(m: sa.MetaData, v1: bool) -> sa.Table:
    return sa.Table(
        "tokens", m,
        sa.Column("sha256", sa.String(64), primary_key=True),  # of the token, never the token
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        *_project(v1),
    )


uploads = _uploads(meta, v1=False)
job_keys = _job_keys(meta, v1=False)
incidents = _incidents(meta, v1=False)

analyses = sa.Table(
    "analyses", meta,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("incident_id", sa.String(32), nullable=False, index=True),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("finished_at", sa.Float),
    sa.Column("status", sa.String(16), nullable=False),  # done error
    sa.Column("error", sa.Text),
    sa.Column("tool_version", sa.String(32), nullable=False),
    sa.Column("uploads", sa.Text, nullable=False),  # the sha256s analysed, comma-separated
    sa.Column("cause", sa.String(64)),
    sa.Column("rule", sa.String(16)),
    sa.Column("summary", sa.Text),
    sa.Column("fingerprint", sa.String(32)),
    sa.Column("fp_template", sa.Text),
    sa.Column("fp_raw", sa.Text),
    sa.Column("json_key", sa.String(300)),
    sa.Column("html_key", sa.String(300)),
    sa.Column("seconds", sa.Float),
)

groups = sa.Table(
    "groups", meta,
    *_group_columns(),
    # v2: kept by refresh_groups() whenever an incident joins or leaves the group.
    sa.Column("n", sa.Integer, nullable=False, default=0),
    sa.Column("first_seen", sa.Float),
    sa.Column("last_seen", sa.Float),
)

jobs = sa.Table(
    "jobs", meta,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("incident_id", sa.String(32), nullable=False, index=True),
    sa.Column("state", sa.String(16), nullable=False),  # queued running done failed
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("owner", sa.String(64)),
    sa.Column("lease_until", sa.Float),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("finished_at", sa.Float),
    sa.Column("error", sa.Text),
    sa.Index("ix_jobs_state_id", "state", "id"),
)

tokens = _tokens(meta, v1=False)

shares = sa.Table(
    "shares", meta,
    sa.Column("incident_id", sa.String(32), primary_key=True),
    sa.Column("project", sa.String(64), primary_key=True),  # or EVERY_PROJECT
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Index("ix_shares_project", "project"),
)

group_stats = sa.Table(
    "group_stats", meta,
    sa.Column("group_id", sa.String(32), primary_key=True),
    sa.Column("project", sa.String(64), primary_key=True),
    sa.Column("n", sa.Integer, nullable=False, default=0),
    sa.Column("first_seen", sa.Float),
    sa.Column("last_seen", sa.Float),
    sa.Index("ix_group_stats_project_last", "project", "last_seen"),
)

group_notes = sa.Table(
    "group_notes", meta,
    sa.Column("group_id", sa.String(32), primary_key=True),
    sa.Column("project", sa.String(64), primary_key=True),
    sa.Column("note", sa.Text, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
)

#: Attempts before a job that keeps killing its server (or failing) is given up.
MAX_ATTEMPTS = 3


#: The groups table as version 1 made it (v2 added the counters).
_groups_v1 = sa.Table("groups", sa.MetaData(), *_group_columns())


_v1_tables = [_uploads(_meta_v1, v1=True), _job_keys(_meta_v1, v1=True),
               _incidents(_meta_v1, v1=True), analyses.to_metadata(_meta_v1),
               jobs.to_metadata(_meta_v1), _tokens(_meta_v1, v1=True)]


def _v1(conn: Connection) -> None:
    _meta_v1.create_all(conn, tables=_v1_tables)
    _groups_v1.create(conn)


def _v2(conn: Connection) -> None:
    """Counters on the group row (the group list no longer aggregates every incident) and an
    index for text search: SQLite FTS5 trigrams, PostgreSQL pg_trgm (when available)."""
    have = {c["name"] for c in sa.inspect(conn).get_columns("groups")}
    for col, ddl in (("n", "INTEGER NOT NULL DEFAULT 0"), ("first_seen", "FLOAT"),
                     ("last_seen", "FLOAT")):
        if col not in have:
            conn.exec_driver_sql(f'ALTER TABLE "groups" ADD COLUMN {col} {ddl}')
    conn.exec_driver_sql('CREATE INDEX IF NOT EXISTS ix_groups_last_seen ON "groups" (last_seen)')
    refresh_groups(conn)
    if conn.dialect.name == "sqlite":
        try:
            with conn.begin_nested():
                for stmt in SQLITE_FTS:
                    conn.exec_driver_sql(stmt)
        except sa.exc.OperationalError:
            pass  # an SQLite without FTS5 trigrams: text search scans
    else:
        try:
            with conn.begin_nested():
                conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pg_trgm")
                conn.exec_driver_sql(
                    "CREATE INDEX IF NOT EXISTS ix_incidents_evidence_trgm ON incidents "
                    "USING gin (lower(evidence) gin_trgm_ops)")
        except sa.exc.DBAPIError:
            pass  # no pg_trgm (postgresql-contrib): text search scans


SQLITE_FTS = [
    "CREATE VIRTUAL TABLE incidents_fts USING fts5(evidence, content='incidents', "
    "content_rowid='rowid', tokenize='trigram')",
    "CREATE TRIGGER incidents_fts_ai AFTER INSERT ON incidents BEGIN "
    "INSERT INTO incidents_fts(rowid, evidence) VALUES (new.rowid, new.evidence); END",
    "CREATE TRIGGER incidents_fts_ad AFTER DELETE ON incidents BEGIN "
    "INSERT INTO incidents_fts(incidents_fts, rowid, evidence) "
    "VALUES ('delete', old.rowid, old.evidence); END",
    "CREATE TRIGGER incidents_fts_au AFTER UPDATE OF evidence ON incidents BEGIN "
    "INSERT INTO incidents_fts(incidents_fts, rowid, evidence) "
    "VALUES ('delete', old.rowid, old.evidence); "
    "INSERT INTO incidents_fts(rowid, evidence) VALUES (new.rowid, new.evidence); END",
    "INSERT INTO incidents_fts(incidents_fts) VALUES ('rebuild')",
]


def refresh_groups(conn: Connection, ids: list[str | None] | None = None) -> None:
    """Recompute the counters of the given groups (all when None) from their incidents."""
    i, g = incidents, groups
    mine = i.c.group_id == g.c.id
    q = g.update().values(
        n=sa.select(sa.func.count()).where(mine).scalar_subquery(),
        first_seen=sa.select(sa.func.min(i.c.created_at)).where(mine).scalar_subquery(),
        last_seen=sa.select(sa.func.max(i.c.created_at)).where(mine).scalar_subquery())
    if ids is not None:
        ids = sorted({x for x in ids if x})
        q = q.where(g.c.id.in_(ids))
        lock_groups(conn, ids)
    conn.execute(q)


def lock_groups(conn: Connection, ids: list[str | None]) -> None:
    """Lock the groups' rows until the transaction ends, in id order: two workers refreshing
    one group's counters take turns, the second counting after the first committed (SQLite's
    writers take turns already)."""
    if conn.dialect.name != "sqlite":
        conn.execute(sa.select(groups.c.id).where(groups.c.id.in_(sorted({x for x in ids if x})))
                     .order_by(groups.c.id).with_for_update())


def _v3(conn: Connection) -> None:
    """Projects: every upload, incident and token belongs to one (the rows made before belong
    to ``default``); incidents are shared by rows in ``shares``; group counters and notes are
    kept per project."""
    def columns(name: str) -> set[str]:
        return {c["name"] for c in sa.inspect(conn).get_columns(name)}

    add = f"VARCHAR(64) NOT NULL DEFAULT '{DEFAULT_PROJECT}'"
    for name in ("incidents", "tokens"):
        if "project" not in columns(name):
            conn.exec_driver_sql(f"ALTER TABLE {name} ADD COLUMN project {add}")
    conn.exec_driver_sql("CREATE INDEX IF NOT EXISTS ix_incidents_project_created "
                         "ON incidents (project, created_at)")
    for table, key in ((uploads, "sha256"), (job_keys, "join_key")):
        if "project" in columns(table.name):
            continue  # made by this version already
        # The primary key gains the project: one content, one job id per project.
        if conn.dialect.name == "sqlite":
            _sqlite_rebuild(conn, table)
        else:
            conn.exec_driver_sql(f"ALTER TABLE {table.name} ADD COLUMN project {add}")
            conn.exec_driver_sql(f"ALTER TABLE {table.name} DROP CONSTRAINT {table.name}_pkey")
            conn.exec_driver_sql(f"ALTER TABLE {table.name} ADD PRIMARY KEY (project, {key})")
    meta.create_all(conn, tables=[shares, group_stats, group_notes])
    have_notes = conn.execute(sa.select(sa.func.count()).select_from(group_notes)).scalar()
    if not have_notes:
        g = groups
        conn.execute(group_notes.insert().from_select(
            ["group_id", "project", "note", "updated_at"],
            sa.select(g.c.id, sa.literal(DEFAULT_PROJECT), g.c.note, g.c.created_at)
            .where(g.c.note.is_not(None), g.c.note != "")))
    refresh_group_stats(conn)


def _sqlite_rebuild(conn: Connection, table: sa.Table) -> None:
    """SQLite cannot change a primary key: the table is made again and its rows copied."""
    old = [c["name"] for c in sa.inspect(conn).get_columns(table.name)]
    for index in table.indexes:
        conn.exec_driver_sql(f"DROP INDEX IF EXISTS {index.name}")
    conn.exec_driver_sql(f"ALTER TABLE {table.name} RENAME TO {table.name}_old")
    table.create(conn)
    cols = ", ".join(old)
    conn.exec_driver_sql(f"INSERT INTO {table.name} ({cols}) SELECT {cols} FROM {table.name}_old")
    conn.exec_driver_sql(f"DROP TABLE {table.name}_old")


def upsert(conn: Connection, table: sa.Table, keys: dict[str, Any],
           values: dict[str, Any]) -> None:
    """Insert the row, or update ``values`` where the ``keys`` exist (SQLite and PostgreSQL)."""
    if conn.dialect.name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:
        from sqlalchemy.dialects.postgresql import insert  # type: ignore[assignment]
    stmt = insert(table).values(**keys, **values)
    conn.execute(stmt.on_conflict_do_update(index_elements=list(keys), set_=values))


def refresh_group_stats(conn: Connection, project: str | None = None,
                        ids: list[str | None] | None = None) -> None:
    """Recompute one project's counters of the given groups; every group of every project
    when ``project`` is None. Each counts the project's own incidents (shares are added when
    read: they are few)."""
    i, s = incidents, group_stats
    if project is None:
        conn.execute(s.delete())
        conn.execute(s.insert().from_select(
            ["group_id", "project", "n", "first_seen", "last_seen"],
            sa.select(i.c.group_id, i.c.project, sa.func.count(), sa.func.min(i.c.created_at),
                      sa.func.max(i.c.created_at))
            .where(i.c.group_id.is_not(None)).group_by(i.c.group_id, i.c.project)))
        return
    for gid in sorted({x for x in ids or [] if x}):
        n, first, last = conn.execute(
            sa.select(sa.func.count(), sa.func.min(i.c.created_at), sa.func.max(i.c.created_at))
            .where(i.c.group_id == gid, i.c.project == project)).one()
        upsert(conn, s, {"group_id": gid, "project": project},
               {"n": n, "first_seen": first, "last_seen": last})


def has_text_index(conn: Connection) -> bool:
    if conn.dialect.name == "sqlite":
        return conn.exec_driver_sql(
            "SELECT 1 FROM sqlite_master WHERE name = 'incidents_fts'").first() is not None
    return False  # PostgreSQL's trigram index serves the plain LIKE


#: (version, migration): applied in order, each in the transaction that records it.
MIGRATIONS: list[tuple[int, Callable[[Connection], None]]] = [(1, _v1), (2, _v2), (3, _v3)]
SCHEMA_VERSION = MIGRATIONS[-1][0]


class Database:
    """Engines for one database URL: ``read()`` and ``write()`` transactions."""

    def __init__(self, url: str) -> None:
        if url.startswith("postgresql://"):
            url = "postgresql+psycopg://" + url[len("postgresql://"):]
        self.url = url
        self.sqlite = url.startswith("sqlite")
        if self.sqlite:
            self.engine = self._sqlite_engine(url, immediate=False)
            self.wengine = self._sqlite_engine(url, immediate=True)
        else:
            self.engine = sa.create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10)
            self.wengine = self.engine

    @staticmethod
    def _sqlite_engine(url: str, *, immediate: bool) -> Engine:
        engine = sa.create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # transactions are begun below, not by pysqlite
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        # A write transaction takes the write lock when it begins, so two processes never
        # deadlock upgrading read locks (SQLITE_BUSY without waiting).
        @event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        return engine

    @contextlib.contextmanager
    def read(self) -> Iterator[Connection]:
        with self.engine.begin() as conn:
            yield conn

    @contextlib.contextmanager
    def write(self) -> Iterator[Connection]:
        with self.wengine.begin() as conn:
            yield conn

    def migrate(self) -> int:
        """Apply pending migrations (concurrent servers: one applies, the others wait)."""
        with self.write() as conn:
            if not self.sqlite:
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(7130713)"))
            migrations_t.create(conn, checkfirst=True)
            done = set(conn.execute(sa.select(migrations_t.c.version)).scalars())
            for version, step in MIGRATIONS:
                if version not in done:
                    step(conn)
                    conn.execute(migrations_t.insert().values(version=version,
                                                              applied_at=time.time()))
            return SCHEMA_VERSION

    def dispose(self) -> None:
        self.engine.dispose()
        if self.wengine is not self.engine:
            self.wengine.dispose()

    # --- the job queue -------------------------------------------------------------------

    def enqueue(self, conn: Connection, incident_id: str) -> None:
        """Queue an analysis of the incident unless one is already waiting."""
        waiting = conn.execute(sa.select(jobs.c.id).where(
            jobs.c.incident_id == incident_id, jobs.c.state == "queued")).first()
        if waiting is None:
            conn.execute(jobs.insert().values(incident_id=incident_id, state="queued",
                                              attempts=0, created_at=time.time()))

    def claim(self, lease_s: float) -> dict[str, Any] | None:
        """Claim the oldest runnable job (queued, or running with an expired lease)."""
        now = time.time()
        owner = uuid.uuid4().hex
        runnable = sa.or_(jobs.c.state == "queued",
                          sa.and_(jobs.c.state == "running", jobs.c.lease_until < now))
        with self.write() as conn:
            if self.sqlite:
                # One UPDATE with a subquery: atomic, the write lock is held (BEGIN IMMEDIATE).
                pick = sa.select(jobs.c.id).where(runnable).order_by(jobs.c.id).limit(1)
                conn.execute(jobs.update().where(jobs.c.id == pick.scalar_subquery()).values(
                    state="running", owner=owner, lease_until=now + lease_s,
                    attempts=jobs.c.attempts + 1))
            else:
                pick = (sa.select(jobs.c.id).where(runnable).order_by(jobs.c.id).limit(1)
                        .with_for_update(skip_locked=True))
                row = conn.execute(pick).first()
                if row is None:
                    return None
                conn.execute(jobs.update().where(jobs.c.id == row.id).values(
                    state="running", owner=owner, lease_until=now + lease_s,
                    attempts=jobs.c.attempts + 1))
            row = conn.execute(sa.select(jobs).where(jobs.c.owner == owner)).mappings().first()
            if row is None:
                return None
            job = dict(row)
            if job["attempts"] > MAX_ATTEMPTS:
                self._finish(conn, job["id"], owner, "failed",
                             f"gave up after {MAX_ATTEMPTS} attempts (the analysis kept "
                             "stopping its server)")
                conn.execute(incidents.update().where(incidents.c.id == job["incident_id"])
                             .values(status="error", updated_at=now,
                                     error=f"analysis abandoned after {MAX_ATTEMPTS} attempts"))
                return None
            conn.execute(incidents.update().where(incidents.c.id == job["incident_id"],
                                                  incidents.c.status == "queued")
                         .values(status="running", updated_at=now))
            return job

    def renew(self, job_id: int, owner: str, lease_s: float) -> bool:
        with self.write() as conn:
            res = conn.execute(jobs.update().where(jobs.c.id == job_id, jobs.c.owner == owner,
                                                   jobs.c.state == "running")
                               .values(lease_until=time.time() + lease_s))
            return res.rowcount == 1

    def finish(self, job_id: int, owner: str, state: str, error: str | None = None) -> None:
        with self.write() as conn:
            self._finish(conn, job_id, owner, state, error)

    @staticmethod
    def _finish(conn: Connection, job_id: int, owner: str, state: str,
                error: str | None) -> None:
        conn.execute(jobs.update().where(jobs.c.id == job_id, jobs.c.owner == owner)
                     .values(state=state, finished_at=time.time(), error=error))
