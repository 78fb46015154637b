"""The index: SQLAlchemy Core tables, versioned migrations and the analysis job queue.

Nothing that matters lives in a server process: uploads, incidents, analyses, groups and the
job queue are rows, so several processes can serve one database. A worker claims a job with
``SELECT ... FOR UPDATE SKIP LOCKED`` (PostgreSQL) or one atomic ``UPDATE`` (SQLite) and holds
it by a lease it renews; a job whose lease ran out (its server was killed) is claimed again.
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

meta = sa.MetaData()


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

uploads = sa.Table(
    "uploads", meta,
    sa.Column("sha256", sa.String(64), primary_key=True),
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
)

job_keys = sa.Table(
    "job_keys", meta,
    sa.Column("join_key", sa.String(300), primary_key=True),
    sa.Column("incident_id", sa.String(32), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)

incidents = sa.Table(
    "incidents", meta,
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
)

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

tokens = sa.Table(
    "tokens", meta,
    sa.Column("sha256", sa.String(64), primary_key=True),  # of the token, never the token
    sa.Column("name", sa.String(100), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)

#: Attempts before a job that keeps killing its server (or failing) is given up.
MAX_ATTEMPTS = 3


#: The groups table as version 1 made it (v2 added the counters).
_groups_v1 = sa.Table("groups", sa.MetaData(), *_group_columns())


def _v1(conn: Connection) -> None:
    meta.create_all(conn, tables=[uploads, job_keys, incidents, analyses, jobs, tokens])
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


def refresh_groups(conn: Connection, ids: list[str] | None = None) -> None:
    """Recompute the counters of the given groups (all when None) from their incidents."""
    i, g = incidents, groups
    mine = i.c.group_id == g.c.id
    q = g.update().values(
        n=sa.select(sa.func.count()).where(mine).scalar_subquery(),
        first_seen=sa.select(sa.func.min(i.c.created_at)).where(mine).scalar_subquery(),
        last_seen=sa.select(sa.func.max(i.c.created_at)).where(mine).scalar_subquery())
    if ids is not None:
        q = q.where(g.c.id.in_([x for x in ids if x]))
    conn.execute(q)


def has_text_index(conn: Connection) -> bool:
    if conn.dialect.name == "sqlite":
        return conn.exec_driver_sql(
            "SELECT 1 FROM sqlite_master WHERE name = 'incidents_fts'").first() is not None
    return False  # PostgreSQL's trigram index serves the plain LIKE


#: (version, migration): applied in order, each in the transaction that records it.
MIGRATIONS: list[tuple[int, Callable[[Connection], None]]] = [(1, _v1), (2, _v2)]
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
