"""The ASGI app: JSON API under ``/api/v1`` (OpenAPI at ``/docs``), server-rendered pages.

Every error is JSON: ``{"error": {"status": 413, "message": "..."}}``.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import tempfile
import threading
import time
from collections import defaultdict, deque
from collections.abc import AsyncIterator
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, urlencode

import sqlalchemy as sa
from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ddp_autopsy import __version__
from ddp_autopsy.server import db as t
from ddp_autopsy.server import queries, safety, service
from ddp_autopsy.server.config import Settings
from ddp_autopsy.server.db import Database
from ddp_autopsy.server.storage import Store, open_store

log = logging.getLogger("ddp_autopsy.server")

PAGE_CSP = ("default-src 'none'; style-src 'self'; img-src 'self' data:; frame-src 'self'; "
            "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
#: Added to the report's own CSP (a meta tag in it): scripts run, in an opaque origin.
REPORT_CSP = "sandbox allow-scripts allow-popups; frame-ancestors 'self'"
FORM_MAX = 64 << 10
NOTE_MAX = 10_000
OptStr = Annotated[str | None, Query(max_length=300)]


def _env() -> Environment:
    env = Environment(loader=PackageLoader("ddp_autopsy.server", "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True),
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["when"] = lambda ts: datetime.fromtimestamp(ts, timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S UTC") if ts else ""
    env.filters["qs"] = lambda d: urlencode(d)
    return env


class RateLimiter:
    """Writes per client per minute, in this process (a sliding window)."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._hits: dict[str, deque[float]] = defaultdict(deque)
        self._lock = threading.Lock()

    def allow(self, client: str) -> bool:
        now = time.monotonic()
        with self._lock:
            hits = self._hits[client]
            while hits and hits[0] < now - 60:
                hits.popleft()
            if len(hits) >= self.per_minute:
                return False
            hits.append(now)
            return True


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"status": status, "message": message}}, status_code=status,
                        headers=headers)


def create_app(settings: Settings) -> FastAPI:
    database = Database(settings.db_url)
    store: Store = open_store_for(settings)
    workers = service.Workers(settings, database, store)
    limiter = RateLimiter(settings.limits.writes_per_minute)
    env = _env()

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        for d in (settings.data, settings.tmp, settings.work):
            d.mkdir(parents=True, exist_ok=True)
        await run_in_threadpool(database.migrate)
        workers.start()
        yield
        workers.stop()
        database.dispose()

    # No Swagger UI (it loads assets from a CDN): the schema is at /openapi.json.
    app = FastAPI(title="ddp-autopsy", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None,
                  description="Hang post-mortems: upload bundles and logs, read incidents, "
                              "groups and analyses.")
    app.state.settings, app.state.db, app.state.store = settings, database, store

    @app.middleware("http")
    async def headers(request: Request, call_next: Any) -> Response:
        response = await call_next(request)
        response.headers.setdefault("Content-Security-Policy", PAGE_CSP)
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        return response

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors())
        return _error(422, f"bad request: {problems}")

    @app.exception_handler(Exception)
    async def crash(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("request failed")
        return _error(500, f"internal error: {type(exc).__name__}")

    # --- access ----------------------------------------------------------------------------

    def _client(request: Request) -> str:
        return request.client.host if request.client else "unknown"

    def _token_ok(token: str | None) -> bool:
        if not token:
            return False
        if any(hmac.compare_digest(token.encode(), k.encode()) for k in settings.tokens):
            return True
        digest = hashlib.sha256(token.encode()).hexdigest()
        with database.read() as conn:
            return conn.execute(sa.select(t.tokens.c.name).where(
                t.tokens.c.sha256 == digest)).first() is not None

    def _authorize(request: Request, token: str | None = None) -> None:
        if token is None:
            auth = request.headers.get("authorization", "")
            token = auth[7:].strip() if auth.lower().startswith("bearer ") else \
                request.headers.get("x-ddp-autopsy-token")
        if not token:
            raise HTTPException(401, "a token is required to write (Authorization: Bearer T)",
                                headers={"WWW-Authenticate": "Bearer"})
        if not _token_ok(token):
            raise HTTPException(403, "the token is not valid")
        if not limiter.allow(_client(request)):
            raise HTTPException(429, f"more than {settings.limits.writes_per_minute} writes a "
                                     "minute from this client; retry later",
                                headers={"Retry-After": "60"})

    async def _form(request: Request) -> dict[str, str]:
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > FORM_MAX:
                raise HTTPException(413, f"form larger than {FORM_MAX} bytes")
        return {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}

    # --- upload ----------------------------------------------------------------------------

    @app.post("/api/v1/uploads", status_code=201, tags=["uploads"])
    async def upload(request: Request, name: str = Query("upload", max_length=500)
                     ) -> JSONResponse:
        """Upload one bundle tarball, archive or log as the raw request body (streamed).

        The same content twice is one upload and one incident (200 instead of 201)."""
        _authorize(request)
        limit = settings.limits.upload_bytes
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > limit:
            raise HTTPException(413, f"upload of {length} bytes exceeds the limit of {limit}")
        fd, tmp_name = tempfile.mkstemp(dir=settings.tmp, suffix=".upload")
        tmp = Path(tmp_name)
        try:
            digest = hashlib.sha256()
            size = 0
            with os.fdopen(fd, "wb") as out:
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise HTTPException(413, f"upload exceeds the limit of {limit} bytes")
                    digest.update(chunk)
                    out.write(chunk)
            if size == 0:
                raise HTTPException(400, "empty upload")
            sha = digest.hexdigest()
            try:
                info = await run_in_threadpool(safety.inspect, tmp, settings.limits)
            except safety.Rejected as err:
                raise HTTPException(err.status, err.message) from err
            done = await run_in_threadpool(service.ingest, database, store, tmp, sha, name,
                                           info, _client(request))
        finally:
            tmp.unlink(missing_ok=True)
        workers.wake()
        body = {"incident": done.incident_id, "permalink": f"/i/{done.incident_id}",
                "api": f"/api/v1/incidents/{done.incident_id}", "sha256": sha,
                "duplicate": done.duplicate, "joined": done.joined, "kind": info.kind}
        return JSONResponse(body, status_code=200 if done.duplicate else 201)

    @app.get("/api/v1/uploads/{sha}/raw", tags=["uploads"])
    def upload_raw(sha: str) -> StreamingResponse:
        """The upload exactly as it was sent."""
        with database.read() as conn:
            row = conn.execute(sa.select(t.uploads).where(t.uploads.c.sha256 == sha)).first()
        if row is None:
            raise HTTPException(404, f"no upload {sha}")
        fname = f"{service.safe_name(row.name).split('.', 1)[0]}-{sha[:8]}.{row.kind}"
        return StreamingResponse(store.iter_bytes(row.blob_key),
                                 media_type="application/octet-stream",
                                 headers={"Content-Disposition": f'attachment; filename="{fname}"'})

    # --- incidents -------------------------------------------------------------------------

    def _filters(cause: str | None, rule: str | None, host: str | None, rank: str | None,
                 job: str | None, user: str | None, since: str | None, until: str | None,
                 q: str | None, group: str | None, page: int) -> queries.Filters:
        def day(v: str | None, what: str) -> date | None:
            if not v:
                return None
            try:
                return date.fromisoformat(v)
            except ValueError:
                raise HTTPException(422, f"{what}: not a date (YYYY-MM-DD): {v!r}") from None

        rank_n: int | None = None
        if rank not in (None, ""):
            if not rank.lstrip("-").isdigit():
                raise HTTPException(422, f"rank: not an integer: {rank!r}")
            rank_n = int(rank)
        return queries.Filters(cause=cause or None, rule=rule or None, host=host or None,
                               rank=rank_n, job=job or None, user=user or None,
                               since=day(since, "since"), until=day(until, "until"),
                               q=q or None, group=group or None, page=max(1, page))

    @app.get("/api/v1/incidents", tags=["incidents"])
    def api_incidents(cause: OptStr = None, rule: OptStr = None, host: OptStr = None,
                      rank: OptStr = None, job: OptStr = None, user: OptStr = None,
                      since: OptStr = None, until: OptStr = None, q: OptStr = None,
                      group: OptStr = None, page: int = Query(1, ge=1, le=100_000)
                      ) -> dict[str, Any]:
        """Incidents, newest first, filtered; ``q`` searches evidence lines and summaries."""
        f = _filters(cause, rule, host, rank, job, user, since, until, q, group, page)
        with database.read() as conn:
            rows, more = queries.list_incidents(conn, f)
        return {"incidents": rows, "page": f.page, "next_page": f.page + 1 if more else None}

    def _incident(incident_id: str) -> dict[str, Any]:
        with database.read() as conn:
            inc = queries.get_incident(conn, incident_id)
        if inc is None:
            raise HTTPException(404, f"no incident {incident_id}")
        return inc

    @app.get("/api/v1/incidents/{incident_id}", tags=["incidents"])
    def api_incident(incident_id: str) -> dict[str, Any]:
        """An incident: metadata, uploads, every analysis (newest first)."""
        return _incident(incident_id)

    def _analysis(incident_id: str, analysis_id: int | None) -> Any:
        with database.read() as conn:
            q = sa.select(t.analyses).where(t.analyses.c.incident_id == incident_id,
                                            t.analyses.c.status == "done")
            if analysis_id is not None:
                q = q.where(t.analyses.c.id == analysis_id)
            else:
                inc = conn.execute(sa.select(t.incidents.c.analysis_id).where(
                    t.incidents.c.id == incident_id)).scalar()
                q = q.where(t.analyses.c.id == inc)
            row = conn.execute(q).first()
        if row is None:
            raise HTTPException(404, f"incident {incident_id} has no finished analysis"
                                     + (f" {analysis_id}" if analysis_id is not None else ""))
        return row

    @app.get("/api/v1/incidents/{incident_id}/analysis", tags=["incidents"])
    def api_analysis(incident_id: str, analysis: int | None = None) -> Response:
        """The analysis as ``ddp-autopsy analyze --format json`` prints it (docs/json.md)."""
        row = _analysis(incident_id, analysis)
        return Response(store.get_bytes(row.json_key), media_type="application/json")

    @app.post("/api/v1/incidents/{incident_id}/reanalyze", status_code=202, tags=["incidents"])
    def api_reanalyze(incident_id: str, request: Request) -> dict[str, Any]:
        """Queue a new analysis with this server's rules; earlier analyses are kept."""
        _authorize(request)
        _incident(incident_id)
        service.reanalyze(database, [incident_id])
        workers.wake()
        return {"incident": incident_id, "queued": True}

    # --- groups ----------------------------------------------------------------------------

    @app.get("/api/v1/groups", tags=["groups"])
    def api_groups(cause: OptStr = None, page: int = Query(1, ge=1, le=100_000)
                   ) -> dict[str, Any]:
        """Groups of incidents with one fingerprint: count, first and last seen."""
        with database.read() as conn:
            rows, more = queries.list_groups(conn, cause, page)
        return {"groups": rows, "page": page, "next_page": page + 1 if more else None}

    def _group(group_id: str) -> dict[str, Any]:
        with database.read() as conn:
            g = queries.get_group(conn, group_id)
        if g is None:
            raise HTTPException(404, f"no group {group_id}")
        return g

    @app.get("/api/v1/groups/{group_id}", tags=["groups"])
    def api_group(group_id: str) -> dict[str, Any]:
        """A group: its fingerprint, note, hosts, and each incident with the text it matched."""
        return _group(group_id)

    def _set_note(group_id: str, note: str) -> None:
        if len(note) > NOTE_MAX:
            raise HTTPException(413, f"note longer than {NOTE_MAX} characters")
        with database.write() as conn:
            res = conn.execute(t.groups.update().where(t.groups.c.id == group_id)
                               .values(note=note))
        if res.rowcount == 0:
            raise HTTPException(404, f"no group {group_id}")

    @app.put("/api/v1/groups/{group_id}/note", tags=["groups"])
    async def api_note(group_id: str, request: Request) -> dict[str, Any]:
        """Set the group's note (``{"note": "fixed by ..."}``)."""
        _authorize(request)
        try:
            body = await request.json()
        except ValueError:
            raise HTTPException(400, 'body must be JSON: {"note": "..."}') from None
        if not isinstance(body, dict) or not isinstance(body.get("note"), str):
            raise HTTPException(422, 'body must be {"note": "<text>"}')
        await run_in_threadpool(_set_note, group_id, body["note"])
        return {"group": group_id, "note": body["note"]}

    @app.get("/healthz", tags=["server"])
    def healthz() -> dict[str, Any]:
        with database.read() as conn:
            version = conn.execute(sa.select(sa.func.max(t.migrations_t.c.version))).scalar()
            waiting = conn.execute(sa.select(sa.func.count()).where(
                t.jobs.c.state.in_(["queued", "running"]))).scalar()
        return {"ok": True, "version": __version__, "schema": version, "jobs_pending": waiting,
                "store": store.describe()}

    # --- pages -----------------------------------------------------------------------------

    def _page(name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        return HTMLResponse(env.get_template(name).render(version=__version__, **ctx),
                            status_code=status)

    @app.get("/static/server.css", include_in_schema=False)
    def css() -> Response:
        text = (Path(__file__).parent / "templates" / "server.css").read_text()
        return Response(text, media_type="text/css",
                        headers={"Cache-Control": "public, max-age=3600"})

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page_incidents(cause: OptStr = None, rule: OptStr = None, host: OptStr = None,
                       rank: OptStr = None, job: OptStr = None, user: OptStr = None,
                       since: OptStr = None, until: OptStr = None, q: OptStr = None,
                       group: OptStr = None, page: int = Query(1, ge=1, le=100_000)
                       ) -> HTMLResponse:
        f = _filters(cause, rule, host, rank, job, user, since, until, q, group, page)
        with database.read() as conn:
            rows, more = queries.list_incidents(conn, f)
            causes = sorted(c for c in conn.execute(
                sa.select(t.groups.c.cause).distinct()).scalars() if c)
        return _page("incidents.html.j2", incidents=rows, f=f, more=more, causes=causes,
                     params=f.params())

    @app.get("/i/{incident_id}", response_class=HTMLResponse, include_in_schema=False)
    def page_incident(incident_id: str) -> HTMLResponse:
        inc = _incident(incident_id)
        return _page("incident.html.j2", inc=inc)

    @app.get("/i/{incident_id}/report", response_class=HTMLResponse, include_in_schema=False)
    def page_report(incident_id: str, analysis: int | None = None) -> Response:
        row = _analysis(incident_id, analysis)
        return HTMLResponse(store.get_bytes(row.html_key).decode(),
                            headers={"Content-Security-Policy": REPORT_CSP})

    @app.post("/i/{incident_id}/reanalyze", include_in_schema=False)
    async def page_reanalyze(incident_id: str, request: Request) -> Response:
        form = await _form(request)
        _authorize(request, form.get("token", ""))
        await run_in_threadpool(_incident, incident_id)
        await run_in_threadpool(service.reanalyze, database, [incident_id])
        workers.wake()
        return RedirectResponse(f"/i/{incident_id}", status_code=303)

    @app.get("/groups", response_class=HTMLResponse, include_in_schema=False)
    def page_groups(cause: OptStr = None, page: int = Query(1, ge=1, le=100_000)
                    ) -> HTMLResponse:
        with database.read() as conn:
            rows, more = queries.list_groups(conn, cause, page)
        return _page("groups.html.j2", groups=rows, page=page, more=more, cause=cause or "")

    @app.get("/groups/{group_id}", response_class=HTMLResponse, include_in_schema=False)
    def page_group(group_id: str) -> HTMLResponse:
        return _page("group.html.j2", g=_group(group_id))

    @app.post("/groups/{group_id}/note", include_in_schema=False)
    async def page_note(group_id: str, request: Request) -> Response:
        form = await _form(request)
        _authorize(request, form.get("token", ""))
        await run_in_threadpool(_set_note, group_id, form.get("note", ""))
        return RedirectResponse(f"/groups/{group_id}", status_code=303)

    return app


def open_store_for(settings: Settings) -> Store:
    return open_store(settings.store_url or None, settings.data, settings.s3_endpoint)
