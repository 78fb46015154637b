"""The ASGI app: JSON API under ``/api/v1`` (OpenAPI at ``/openapi.json``), server-rendered
pages.

Every request but ``/healthz``, ``/login`` and the schema carries a token (``Authorization:
Bearer``, or the cookie ``/login`` sets for the pages); the token's project decides what the
request sees: its own incidents and those shared with it. Every error is JSON:
``{"error": {"status": 413, "message": "..."}}``; a page without a token leads to ``/login``.
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
from ddp_autopsy.server.config import PROJECT_RE, Settings
from ddp_autopsy.server.db import Database
from ddp_autopsy.server.storage import Store, open_store

log = logging.getLogger("ddp_autopsy.server")

PAGE_CSP = ("default-src 'none'; style-src 'self'; img-src 'self' data:; frame-src 'self'; "
            "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
#: Added to the report's own CSP (a meta tag in it): scripts run, in an opaque origin.
REPORT_CSP = "sandbox allow-scripts allow-popups; frame-ancestors 'self'"
FORM_MAX = 64 << 10
#: The pages' login cookie: the token itself, HttpOnly and SameSite=Strict.
COOKIE = "ddpa_token"
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


class LoginNeeded(Exception):
    """A page asked for without a valid token: the answer is the login form."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message


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

    def openapi() -> dict[str, Any]:
        """The framework's schema, saying which operations need a token (all but /healthz)."""
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            schema = get_openapi(title=app.title, version=app.version,
                                 description=app.description, routes=app.routes)
            schema.setdefault("components", {})["securitySchemes"] = {"token": {
                "type": "http", "scheme": "bearer",
                "description": "A project's token: it reads the project's incidents and those "
                               "shared with it, and writes the project's."}}
            for path, ops in schema["paths"].items():
                for op in ops.values():
                    if path != "/healthz":
                        op["security"] = [{"token": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.middleware("http")
    async def headers(request: Request, call_next: Any) -> Response:
        response = await call_next(request)
        response.headers.setdefault("Content-Security-Policy", PAGE_CSP)
        # What a page or an answer shows depends on the caller's project: never cached.
        response.headers.setdefault("Cache-Control", "private, no-store")
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

    @app.exception_handler(LoginNeeded)
    async def login_needed(request: Request, exc: LoginNeeded) -> Response:
        if exc.message:  # a wrong or outdated cookie: say so, and forget it
            response = _page("login.html.j2", status=403, next=request.url.path,
                             message=exc.message)
            response.delete_cookie(COOKIE, path="/")
            return response
        return RedirectResponse(f"/login?{urlencode({'next': _next_of(request)})}",
                                status_code=303)

    @app.exception_handler(Exception)
    async def crash(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("request failed")
        return _error(500, f"internal error: {type(exc).__name__}")

    # --- access ----------------------------------------------------------------------------

    def _client(request: Request) -> str:
        return request.client.host if request.client else "unknown"

    cli_tokens = {tok: project for tok, project in settings.tokens}

    def _project_of(token: str) -> str | None:
        """The project of a token given on the command line or kept (hashed) in the index."""
        for known, project in cli_tokens.items():
            if hmac.compare_digest(token.encode(), known.encode()):
                return project
        digest = hashlib.sha256(token.encode()).hexdigest()
        with database.read() as conn:
            return conn.execute(sa.select(t.tokens.c.project).where(
                t.tokens.c.sha256 == digest)).scalar()

    def _token_of(request: Request, cookie: bool) -> str | None:
        auth = request.headers.get("authorization", "")
        token = auth[7:].strip() if auth.lower().startswith("bearer ") else \
            request.headers.get("x-ddp-autopsy-token")
        if not token and cookie:
            token = request.cookies.get(COOKIE)
        return token or None

    def _limit(request: Request) -> None:
        if not limiter.allow(_client(request)):
            raise HTTPException(429, f"more than {settings.limits.writes_per_minute} writes a "
                                     "minute from this client; retry later",
                                headers={"Retry-After": "60"})

    def _caller(request: Request, *, write: bool = False, token: str | None = None,
                cookie: bool = False) -> str:
        """The caller's project. Reads and writes need a token: the form's, the header's, or
        (``cookie``: GETs and the pages' forms) the login cookie's. A wrong token counts
        against the client's write limit (no guessing at full speed)."""
        token = token or _token_of(request, cookie)
        if not token:
            raise HTTPException(401, "a token is required (Authorization: Bearer T)",
                                headers={"WWW-Authenticate": "Bearer"})
        project = _project_of(token)
        if project is None:
            _limit(request)
            raise HTTPException(403, "the token is not valid")
        if write:
            _limit(request)
        return project

    def _reader(request: Request) -> str:
        """The project of a GET (a header token, or the pages' login cookie)."""
        return _caller(request, cookie=True)

    def _page_reader(request: Request) -> str:
        """As ``_reader``, for a page: without a valid token, the login form."""
        try:
            return _reader(request)
        except HTTPException as err:
            if err.status_code == 401:
                raise LoginNeeded() from None
            if err.status_code == 403:
                raise LoginNeeded("That token is not valid (any more): log in again.") from None
            raise

    def _same_origin(request: Request) -> None:
        """A page's form posted with the login cookie must come from this server's pages."""
        origin = request.headers.get("origin")
        if origin and origin != "null" and \
                origin.split("://", 1)[-1] != request.headers.get("host", ""):
            raise HTTPException(403, "a form from another site")

    def _known_projects() -> set[str]:
        with database.read() as conn:
            found = set(conn.execute(sa.select(t.tokens.c.project).distinct()).scalars())
        return found | set(cli_tokens.values())

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
        """Upload one bundle tarball, archive or log as the raw request body (streamed), into
        the token's project.

        The same content twice in one project is one upload and one incident (200 instead of
        201); in another project it is that project's own incident."""
        project = await run_in_threadpool(_caller, request, write=True)
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
                                           info, _client(request), project)
        finally:
            tmp.unlink(missing_ok=True)
        workers.wake()
        body = {"incident": done.incident_id, "permalink": f"/i/{done.incident_id}",
                "api": f"/api/v1/incidents/{done.incident_id}", "sha256": sha,
                "duplicate": done.duplicate, "joined": done.joined, "kind": info.kind,
                "project": project}
        return JSONResponse(body, status_code=200 if done.duplicate else 201)

    @app.get("/api/v1/uploads/{sha}/raw", tags=["uploads"])
    def upload_raw(sha: str, request: Request) -> StreamingResponse:
        """The upload exactly as it was sent (of an incident the caller may see)."""
        project = _reader(request)
        with database.read() as conn:
            row = queries.upload_row(conn, sha, project)
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
    def api_incidents(request: Request, cause: OptStr = None, rule: OptStr = None,
                      host: OptStr = None, rank: OptStr = None, job: OptStr = None,
                      user: OptStr = None, since: OptStr = None, until: OptStr = None,
                      q: OptStr = None, group: OptStr = None,
                      page: int = Query(1, ge=1, le=100_000)) -> dict[str, Any]:
        """The caller's incidents (its project's, and those shared with it), newest first,
        filtered; ``q`` searches evidence lines and summaries."""
        project = _reader(request)
        f = _filters(cause, rule, host, rank, job, user, since, until, q, group, page)
        with database.read() as conn:
            rows, more = queries.list_incidents(conn, f, project)
        return {"incidents": rows, "page": f.page, "next_page": f.page + 1 if more else None}

    def _incident(incident_id: str, project: str) -> dict[str, Any]:
        with database.read() as conn:
            inc = queries.get_incident(conn, incident_id, project)
        if inc is None:  # another project's incident does not exist for this one
            raise HTTPException(404, f"no incident {incident_id}")
        return inc

    def _owned(incident_id: str, project: str) -> dict[str, Any]:
        inc = _incident(incident_id, project)
        if not inc["owned"]:
            raise HTTPException(403, f"incident {incident_id} is shared with project "
                                     f"{project}, not its own: only {inc['project']} may "
                                     "change it")
        return inc

    @app.get("/api/v1/incidents/{incident_id}", tags=["incidents"])
    def api_incident(incident_id: str, request: Request) -> dict[str, Any]:
        """An incident: metadata, uploads, every analysis (newest first), and, for its own
        project, who it is shared with."""
        return _incident(incident_id, _reader(request))

    def _analysis(incident_id: str, analysis_id: int | None, project: str) -> Any:
        _incident(incident_id, project)
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
    def api_analysis(incident_id: str, request: Request, analysis: int | None = None
                     ) -> Response:
        """The analysis as ``ddp-autopsy analyze --format json`` prints it (docs/json.md)."""
        row = _analysis(incident_id, analysis, _reader(request))
        return Response(store.get_bytes(row.json_key), media_type="application/json")

    @app.post("/api/v1/incidents/{incident_id}/reanalyze", status_code=202, tags=["incidents"])
    def api_reanalyze(incident_id: str, request: Request) -> dict[str, Any]:
        """Queue a new analysis with this server's rules; earlier analyses are kept. Only the
        incident's own project."""
        _owned(incident_id, _caller(request, write=True))
        service.reanalyze(database, [incident_id])
        workers.wake()
        return {"incident": incident_id, "queued": True}

    def _share(incident_id: str, project: str, target: str, share: bool) -> list[str]:
        inc = _owned(incident_id, project)
        if target != t.EVERY_PROJECT and not PROJECT_RE.match(target):
            raise HTTPException(422, f"project: not a project name (or '*' for every "
                                     f"project): {target[:80]!r}")
        if share and target == inc["project"]:
            raise HTTPException(422, f"incident {incident_id} is {target}'s own already")
        if share and target != t.EVERY_PROJECT and target not in _known_projects():
            raise HTTPException(422, f"no project named {target!r} (a project exists once "
                                     "a token is made for it)")
        s = t.shares
        with database.write() as conn:
            this = sa.and_(s.c.incident_id == incident_id, s.c.project == target)
            if not share:
                conn.execute(s.delete().where(this))
            elif conn.execute(sa.select(s.c.project).where(this)).first() is None:
                try:
                    with conn.begin_nested():
                        conn.execute(s.insert().values(incident_id=incident_id,
                                                       project=target, created_at=time.time()))
                except sa.exc.IntegrityError:
                    pass  # shared by another request a moment ago
            return sorted(conn.execute(sa.select(s.c.project).where(
                s.c.incident_id == incident_id)).scalars())

    async def _json_object(request: Request, key: str) -> str:
        try:
            body = await request.json()
        except ValueError:
            raise HTTPException(400, f'body must be JSON: {{"{key}": "..."}}') from None
        if not isinstance(body, dict) or not isinstance(body.get(key), str):
            raise HTTPException(422, f'body must be {{"{key}": "<text>"}}')
        return str(body[key])

    @app.post("/api/v1/incidents/{incident_id}/shares", tags=["incidents"])
    async def api_share(incident_id: str, request: Request) -> dict[str, Any]:
        """Share the incident with another project (``{"project": "NAME"}``, ``"*"`` for every
        project): it sees the incident, its analyses, uploads and group. Only the incident's
        own project may share it."""
        project = await run_in_threadpool(_caller, request, write=True)
        target = await _json_object(request, "project")
        shared = await run_in_threadpool(_share, incident_id, project, target, True)
        return {"incident": incident_id, "shared_with": shared}

    @app.delete("/api/v1/incidents/{incident_id}/shares/{target}", tags=["incidents"])
    def api_unshare(incident_id: str, target: str, request: Request) -> dict[str, Any]:
        """Stop sharing the incident with a project (``*``: the share with every project)."""
        project = _caller(request, write=True)
        return {"incident": incident_id,
                "shared_with": _share(incident_id, project, target, False)}

    # --- groups ----------------------------------------------------------------------------

    @app.get("/api/v1/groups", tags=["groups"])
    def api_groups(request: Request, cause: OptStr = None,
                   page: int = Query(1, ge=1, le=100_000)) -> dict[str, Any]:
        """Groups of the caller's incidents with one fingerprint: count, first and last seen
        (of the incidents the caller sees)."""
        project = _reader(request)
        with database.read() as conn:
            rows, more = queries.list_groups(conn, project, cause, page)
        return {"groups": rows, "page": page, "next_page": page + 1 if more else None}

    def _group(group_id: str, project: str) -> dict[str, Any]:
        with database.read() as conn:
            g = queries.get_group(conn, group_id, project)
        if g is None:
            raise HTTPException(404, f"no group {group_id}")
        return g

    @app.get("/api/v1/groups/{group_id}", tags=["groups"])
    def api_group(group_id: str, request: Request) -> dict[str, Any]:
        """A group: its fingerprint, the caller's note, hosts, and each incident the caller
        sees with the text it matched."""
        return _group(group_id, _reader(request))

    def _set_note(group_id: str, project: str, note: str) -> None:
        if len(note) > NOTE_MAX:
            raise HTTPException(413, f"note longer than {NOTE_MAX} characters")
        _group(group_id, project)
        with database.write() as conn:
            t.upsert(conn, t.group_notes, {"group_id": group_id, "project": project},
                     {"note": note, "updated_at": time.time()})

    @app.put("/api/v1/groups/{group_id}/note", tags=["groups"])
    async def api_note(group_id: str, request: Request) -> dict[str, Any]:
        """Set the caller's project's note on the group (``{"note": "fixed by ..."}``)."""
        project = await run_in_threadpool(_caller, request, write=True)
        note = await _json_object(request, "note")
        await run_in_threadpool(_set_note, group_id, project, note)
        return {"group": group_id, "note": note}

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
        ctx.setdefault("project", None)
        return HTMLResponse(env.get_template(name).render(version=__version__, **ctx),
                            status_code=status)

    @app.get("/static/server.css", include_in_schema=False)
    def css() -> Response:
        text = (Path(__file__).parent / "templates" / "server.css").read_text()
        return Response(text, media_type="text/css",
                        headers={"Cache-Control": "public, max-age=3600"})

    @app.get("/login", response_class=HTMLResponse, include_in_schema=False)
    def page_login(next: str = Query("/", max_length=2000)) -> HTMLResponse:
        return _page("login.html.j2", next=_safe_next(next), message="")

    @app.post("/login", include_in_schema=False)
    async def page_login_post(request: Request) -> Response:
        form = await _form(request)
        target = _safe_next(form.get("next", "/"))
        token = form.get("token", "").strip()
        _limit(request)  # every attempt counts: no guessing tokens at full speed
        project = await run_in_threadpool(_project_of, token) if token else None
        if project is None:
            return _page("login.html.j2", status=403, next=target,
                         message="That token is not valid." if token else "Enter a token.")
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/",
                            secure=request.url.scheme == "https")
        return response

    @app.post("/logout", include_in_schema=False)
    def page_logout() -> Response:
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page_incidents(request: Request, cause: OptStr = None, rule: OptStr = None,
                       host: OptStr = None, rank: OptStr = None, job: OptStr = None,
                       user: OptStr = None, since: OptStr = None, until: OptStr = None,
                       q: OptStr = None, group: OptStr = None,
                       page: int = Query(1, ge=1, le=100_000)) -> HTMLResponse:
        project = _page_reader(request)
        f = _filters(cause, rule, host, rank, job, user, since, until, q, group, page)
        with database.read() as conn:
            rows, more = queries.list_incidents(conn, f, project)
            causes = queries.causes(conn, project)
        return _page("incidents.html.j2", incidents=rows, f=f, more=more, causes=causes,
                     params=f.params(), project=project)

    @app.get("/i/{incident_id}", response_class=HTMLResponse, include_in_schema=False)
    def page_incident(incident_id: str, request: Request) -> HTMLResponse:
        project = _page_reader(request)
        return _page("incident.html.j2", inc=_incident(incident_id, project), project=project)

    @app.get("/i/{incident_id}/report", response_class=HTMLResponse, include_in_schema=False)
    def page_report(incident_id: str, request: Request, analysis: int | None = None
                    ) -> Response:
        row = _analysis(incident_id, analysis, _page_reader(request))
        return HTMLResponse(store.get_bytes(row.html_key).decode(),
                            headers={"Content-Security-Policy": REPORT_CSP})

    async def _form_caller(request: Request) -> tuple[dict[str, str], str]:
        """A page's form: its fields and the project of its token (typed, or the cookie)."""
        _same_origin(request)
        form = await _form(request)
        project = await run_in_threadpool(
            lambda: _caller(request, write=True, token=form.get("token") or None, cookie=True))
        return form, project

    @app.post("/i/{incident_id}/reanalyze", include_in_schema=False)
    async def page_reanalyze(incident_id: str, request: Request) -> Response:
        _form_fields, project = await _form_caller(request)
        await run_in_threadpool(_owned, incident_id, project)
        await run_in_threadpool(service.reanalyze, database, [incident_id])
        workers.wake()
        return RedirectResponse(f"/i/{incident_id}", status_code=303)

    @app.post("/i/{incident_id}/share", include_in_schema=False)
    async def page_share(incident_id: str, request: Request) -> Response:
        form, project = await _form_caller(request)
        await run_in_threadpool(_share, incident_id, project, form.get("project", "").strip(),
                                form.get("action", "share") != "unshare")
        return RedirectResponse(f"/i/{incident_id}", status_code=303)

    @app.get("/groups", response_class=HTMLResponse, include_in_schema=False)
    def page_groups(request: Request, cause: OptStr = None,
                    page: int = Query(1, ge=1, le=100_000)) -> HTMLResponse:
        project = _page_reader(request)
        with database.read() as conn:
            rows, more = queries.list_groups(conn, project, cause, page)
        return _page("groups.html.j2", groups=rows, page=page, more=more, cause=cause or "",
                     project=project)

    @app.get("/groups/{group_id}", response_class=HTMLResponse, include_in_schema=False)
    def page_group(group_id: str, request: Request) -> HTMLResponse:
        project = _page_reader(request)
        return _page("group.html.j2", g=_group(group_id, project), project=project)

    @app.post("/groups/{group_id}/note", include_in_schema=False)
    async def page_note(group_id: str, request: Request) -> Response:
        form, project = await _form_caller(request)
        await run_in_threadpool(_set_note, group_id, project, form.get("note", ""))
        return RedirectResponse(f"/groups/{group_id}", status_code=303)

    return app


def _safe_next(target: str) -> str:
    """Where to go after logging in: a path on this server, never another site."""
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _next_of(request: Request) -> str:
    return request.url.path + (f"?{request.url.query}" if request.url.query else "")


def open_store_for(settings: Settings) -> Store:
    return open_store(settings.store_url or None, settings.data, settings.s3_endpoint)
