"""Incidents are private to their project unless shared, against the real server.

Two projects (``default``, token ``sh.TOKEN``; ``beta``, ``sh.TOKEN_B``) and a third made in the
index (``serve --new-token ... --project gamma``) upload to one ``ddp-autopsy serve``: each
sees, searches, groups and downloads only its own incidents and those shared with it, through
the JSON API and the pages (Chromium); the same bytes in two projects are two incidents; a
share opens one incident to one project (or ``*``: every project) and is taken back. Every test
runs on SQLite + a directory and on PostgreSQL + moto's S3, like ``test_server.py`` (whose
fixtures these are), and the schema change is a migration tested on both.
"""

# The backend and webhook fixtures are test_server.py's, imported: their parameters "redefine"
# the imported names, as fixtures do.
# ruff: noqa: F811

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

httpx = pytest.importorskip("httpx", reason="the server extra is not installed "
                                             "(pip install -e '.[server]')")
pytest.importorskip("fastapi", reason="the server extra is not installed")
pytest.importorskip("sqlalchemy", reason="the server extra is not installed")

import server_helpers as sh  # noqa: E402
from test_server import (  # noqa: E402,F401
    CHROMIUM,
    CHROMIUM_ARGS,
    Backend,
    Hooks,
    backend,
    browser_api,
    cli,
    hooks,
)

CORPUS = Path(__file__).resolve().parent / "corpus"
SAME = CORPUS / "pt-001" / "train.log"  # uploaded by both projects
A_ONLY = CORPUS / "eco-001" / "train.log"
B_ONLY = CORPUS / "eco-002" / "train.log"
A, B = sh.TOKEN, sh.TOKEN_B


@pytest.fixture(scope="module")
def server(backend: Backend, hooks: Hooks) -> Iterator[sh.Server]:
    s = backend.server(args=["--webhook", f"http://127.0.0.1:{hooks.port}/p/{backend.name}"])
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def up(server: sh.Server) -> dict[str, dict[str, Any]]:
    """The same log uploaded by both projects, and one log each that only it has; analysed."""
    out = {}
    for key, path, token in (("a", SAME, A), ("b", SAME, B), ("a_only", A_ONLY, A),
                             ("b_only", B_ONLY, B)):
        r = server.upload(path, path.name, token=token)
        assert r.status_code == 201, r.text
        out[key] = {**r.json(), "inc": server.wait_analysed(r.json()["incident"], token=token)}
        assert out[key]["inc"]["status"] == "done", out[key]["inc"]
    return out


def ids(server: sh.Server, token: str, **params: Any) -> set[str]:
    r = server.get("/api/v1/incidents", token=token, params=params)
    assert r.status_code == 200, r.text
    return {i["id"] for i in r.json()["incidents"]}


def test_one_content_in_two_projects_is_two_incidents(server: sh.Server,
                                                      up: dict[str, dict[str, Any]]) -> None:
    a, b = up["a"], up["b"]
    assert a["sha256"] == b["sha256"] and a["incident"] != b["incident"]
    assert (a["project"], b["project"]) == ("default", sh.PROJECT_B)
    assert a["incident"] == a["sha256"][:20]  # the default project's ids predate projects
    assert b["incident"] == hashlib.sha256(f"beta\n{b['sha256']}".encode()).hexdigest()[:20]
    again = server.upload(SAME, "again.log", token=B)  # idempotent within the project
    assert again.status_code == 200 and again.json()["incident"] == b["incident"]
    # Each project's incident is analysed on its own, with the same verdict.
    assert a["inc"]["cause"] == b["inc"]["cause"] == "job_terminated"
    assert a["inc"]["group_id"] == b["inc"]["group_id"]


def test_a_project_sees_only_its_own_incidents(server: sh.Server,
                                               up: dict[str, dict[str, Any]]) -> None:
    mine = {up["b"]["incident"], up["b_only"]["incident"]}
    theirs = {up["a"]["incident"], up["a_only"]["incident"]}
    assert ids(server, B) == mine
    assert theirs <= ids(server, A) and not mine & ids(server, A)
    # Every way to one of default's incidents is a 404 for beta, as if it did not exist.
    iid, sha = up["a_only"]["incident"], up["a_only"]["sha256"]
    for path in (f"/api/v1/incidents/{iid}", f"/api/v1/incidents/{iid}/analysis",
                 f"/i/{iid}", f"/i/{iid}/report", f"/api/v1/uploads/{sha}/raw"):
        assert server.get(path, token=A).status_code == 200, path
        r = server.get(path, token=B)
        assert r.status_code == 404 and r.json()["error"]["status"] == 404, path
    assert iid not in server.get("/", token=B).text
    # Search and filters: only within the project.
    word = up["a"]["inc"]["summary"][:24]  # the verdict's summary is searchable text
    found_a, found_b = ids(server, A, q=word), ids(server, B, q=word)
    assert up["a"]["incident"] in found_a and not found_a & mine
    assert up["b"]["incident"] in found_b and found_b <= mine
    cause = up["a_only"]["inc"]["cause"]
    assert iid in ids(server, A, cause=cause) and iid not in ids(server, B, cause=cause)
    assert ids(server, B, job="train") <= mine


def test_groups_count_only_what_a_project_sees(server: sh.Server,
                                               up: dict[str, dict[str, Any]]) -> None:
    beta = server.get("/api/v1/groups", token=B).json()["groups"]
    assert {g["id"]: g["count"] for g in beta} == dict(Counter(
        up[k]["inc"]["group_id"] for k in ("b", "b_only")))
    shared_fp = up["a"]["inc"]["group_id"]  # the same log: one fingerprint, two projects
    g_b = server.get(f"/api/v1/groups/{shared_fp}", token=B).json()
    assert [i["id"] for i in g_b["incidents"]] == [up["b"]["incident"]] and g_b["count"] == 1
    g_a = server.get(f"/api/v1/groups/{shared_fp}", token=A).json()
    assert up["a"]["incident"] in {i["id"] for i in g_a["incidents"]}
    assert up["b"]["incident"] not in {i["id"] for i in g_a["incidents"]}
    other = up["a_only"]["inc"]["group_id"]
    if other not in {g["id"] for g in beta}:  # a failure only default had
        assert server.get(f"/api/v1/groups/{other}", token=B).status_code == 404
        assert server.get(f"/groups/{other}", token=B).status_code == 404
    # Notes are the project's own.
    r = httpx.put(f"{server.url}/api/v1/groups/{shared_fp}/note", json={"note": "beta's fix"},
                  headers=sh.auth(B))
    assert r.status_code == 200, r.text
    assert server.get(f"/api/v1/groups/{shared_fp}", token=B).json()["note"] == "beta's fix"
    assert server.get(f"/api/v1/groups/{shared_fp}", token=A).json()["note"] != "beta's fix"
    assert "beta&#39;s fix" not in server.get(f"/groups/{shared_fp}", token=A).text


def test_reads_need_a_token(server: sh.Server, up: dict[str, dict[str, Any]]) -> None:
    iid = up["a"]["incident"]
    for path in ("/api/v1/incidents", f"/api/v1/incidents/{iid}", "/api/v1/groups",
                 f"/api/v1/uploads/{up['a']['sha256']}/raw"):
        r = server.get(path, token=None)
        assert r.status_code == 401 and "token" in r.json()["error"]["message"], path
        assert server.get(path, token="wrong").status_code == 403, path
    # A page without a token is the login form, then the page asked for.
    r = server.get(f"/i/{iid}", token=None, params={"x": "1"})
    assert r.status_code == 303
    login = urlsplit(r.headers["location"])
    assert login.path == "/login" and parse_qs(login.query)["next"] == [f"/i/{iid}?x=1"]
    assert server.get("/healthz", token=None).status_code == 200
    assert server.get("/openapi.json", token=None).status_code == 200


def test_login_sets_a_strict_cookie(server: sh.Server, up: dict[str, dict[str, Any]]) -> None:
    with httpx.Client(base_url=server.url) as c:
        bad = c.post("/login", data={"token": "wrong", "next": "/"})
        assert bad.status_code == 403 and "not valid" in bad.text and "set-cookie" not in bad.headers
        r = c.post("/login", data={"token": B, "next": "//evil.example/x"})
        assert r.status_code == 303 and r.headers["location"] == "/"  # never off-site
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/" in cookie
        page = c.get("/")
        assert page.status_code == 200 and up["b"]["incident"] in page.text
        assert up["a"]["incident"] not in page.text
        assert "private, no-store" in page.headers["cache-control"]
        # The cookie reads the API too (links from the pages), but an API write needs the
        # header, and a form posted from another site is refused.
        assert c.get(f"/api/v1/incidents/{up['b']['incident']}").status_code == 200
        assert c.post(f"/api/v1/incidents/{up['b']['incident']}/reanalyze").status_code == 401
        forged = c.post(f"/i/{up['b']['incident']}/share", data={"project": "default"},
                        headers={"Origin": "http://evil.example"})
        assert forged.status_code == 403 and "another site" in forged.json()["error"]["message"]
        assert c.post("/logout").status_code == 303
        assert c.get("/").status_code == 303  # logged out: the login form again
        # A cookie whose token is no longer valid: told so on the login form.
        c.cookies.set("ddpa_token", "revoked")
        gone = c.get("/groups")
        assert gone.status_code == 403 and "log in again" in gone.text


def _share(server: sh.Server, iid: str, project: str, token: str = A) -> httpx.Response:
    return httpx.post(f"{server.url}/api/v1/incidents/{iid}/shares", json={"project": project},
                      headers=sh.auth(token))


def test_share_opens_one_incident_to_one_project(server: sh.Server,
                                                 up: dict[str, dict[str, Any]]) -> None:
    iid, sha = up["a_only"]["incident"], up["a_only"]["sha256"]
    fp = up["a_only"]["inc"]["group_id"]
    assert _share(server, iid, "nope").status_code == 422  # no such project
    assert _share(server, iid, "default").status_code == 422  # its own already
    assert _share(server, iid, "bad name!").status_code == 422
    assert _share(server, iid, "beta", token=B).status_code == 404  # beta cannot see it
    r = _share(server, iid, "beta")
    assert r.status_code == 200 and r.json()["shared_with"] == ["beta"]
    assert _share(server, iid, "beta").json()["shared_with"] == ["beta"]  # idempotent
    # beta sees it everywhere: list, search, incident, analysis, report, raw, group.
    assert iid in ids(server, B) and iid in ids(server, B, cause=up["a_only"]["inc"]["cause"])
    word = up["a_only"]["inc"]["summary"][:24]  # text search reaches the shared too
    assert iid in ids(server, B, q=word) and iid in ids(server, B, q=word.upper())
    inc = server.get(f"/api/v1/incidents/{iid}", token=B).json()
    assert inc["owned"] is False and inc["project"] == "default" and inc["shared_with"] == []
    for path in (f"/api/v1/incidents/{iid}/analysis", f"/i/{iid}/report",
                 f"/api/v1/uploads/{sha}/raw", f"/groups/{fp}"):
        assert server.get(path, token=B).status_code == 200, path
    assert server.get(f"/api/v1/uploads/{sha}/raw", token=B).content == A_ONLY.read_bytes()
    counts = {g["id"]: g["count"] for g in server.get("/api/v1/groups", token=B).json()["groups"]}
    assert counts[fp] == Counter(up[k]["inc"]["group_id"] for k in ("b", "b_only"))[fp] + 1
    assert iid in {i["id"] for i in server.get(f"/api/v1/groups/{fp}", token=B).json()[
        "incidents"]}
    # Shared is read-only: beta may not re-analyse it, nor share it on.
    for resp in (httpx.post(f"{server.url}/api/v1/incidents/{iid}/reanalyze",
                            headers=sh.auth(B)), _share(server, iid, "*", token=B)):
        assert resp.status_code == 403 and "only default" in resp.json()["error"]["message"]
    # Taken back: a 404 again.
    r = httpx.delete(f"{server.url}/api/v1/incidents/{iid}/shares/beta", headers=sh.auth(A))
    assert r.status_code == 200 and r.json()["shared_with"] == []
    assert server.get(f"/api/v1/incidents/{iid}", token=B).status_code == 404
    assert iid not in ids(server, B)
    assert fp not in {g["id"] for g in server.get("/api/v1/groups", token=B).json()["groups"]} \
        or Counter(up[k]["inc"]["group_id"] for k in ("b", "b_only"))[fp]


def test_share_with_every_project_and_tokens_from_the_index(backend: Backend,
                                                            server: sh.Server,
                                                            up: dict[str, dict[str, Any]]
                                                            ) -> None:
    args = ["serve", "--data", str(server.data), "--new-token", "gamma-bot",
            "--project", "gamma"] + (["--db", server.db] if server.db else [])
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    gamma = r.stdout.strip()
    assert ids(server, gamma) == set()  # a new project sees nothing
    iid = up["a"]["incident"]
    assert _share(server, iid, "*").json()["shared_with"] == ["*"]
    assert ids(server, gamma) == {iid} and iid in ids(server, B)
    assert _share(server, iid, "gamma").status_code == 200  # gamma is known (from the index)
    r = httpx.delete(f"{server.url}/api/v1/incidents/{iid}/shares/*", headers=sh.auth(A))
    assert r.json()["shared_with"] == ["gamma"]
    assert ids(server, gamma) == {iid} and iid not in ids(server, B)
    bad = cli("serve", "--data", str(server.data), "--new-token", "x", "--project", "a b")
    assert bad.returncode == 2 and "--project" in bad.stderr and "Traceback" not in bad.stderr
    bad = cli("serve", "--data", str(server.data), "--token", "bad project:tok")
    assert bad.returncode == 2 and "PROJECT:TOKEN" in bad.stderr


def test_new_group_webhook_per_project(backend: Backend, server: sh.Server, hooks: Hooks,
                                       up: dict[str, dict[str, Any]]) -> None:
    import time

    fp = up["a"]["inc"]["group_id"]
    deadline = time.monotonic() + 15
    while True:
        posts = [(p["project"], p["group"]) for p in hooks.posts(f"/p/{backend.name}")]
        if {("default", fp), ("beta", fp)} <= set(posts) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert {("default", fp), ("beta", fp)} <= set(posts)  # new to each project
    assert len(posts) == len(set(posts))  # once per project and group


def test_pages_of_two_projects_in_chromium(backend: Backend, server: sh.Server,
                                           up: dict[str, dict[str, Any]]) -> None:
    """Log in through the form; each project's list, incident and group pages show its own
    incidents; the owner shares through the incident page and the other project sees it."""
    sync_api = browser_api(backend)
    iid = up["b_only"]["incident"]  # beta's, shared with default in the browser
    requests: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            def login(token: str) -> Any:
                page = browser.new_context().new_page()  # a context each: its own cookies
                page.on("request", lambda r: requests.append(r.url))
                page.goto(server.url + f"/i/{iid}")
                assert urlsplit(page.url).path == "/login"
                page.fill("input[name=token]", token)
                page.click("#login button[type=submit]")
                page.wait_for_load_state("load")
                return page

            owner, other = login(B), login(A)
            # beta lands on its incident; default is refused it (a JSON 404).
            assert owner.url == server.url + f"/i/{iid}"
            assert owner.locator("#project").inner_text() == "beta"
            assert "Private to project beta." in owner.locator("#sharing").inner_text()
            assert '"status":404' in other.locator("body").inner_text().replace(" ", "")
            other.goto(server.url + "/")
            listed = {other.locator("tr.incident").nth(i).get_attribute("data-id")
                      for i in range(other.locator("tr.incident").count())}
            assert up["a"]["incident"] in listed and iid not in listed
            assert not listed & {up["b"]["incident"], iid}
            # The owner shares it with default through the form.
            owner.fill("#share input[name=project]", "default")
            owner.click("#share button[value=share]")
            owner.wait_for_load_state("load")
            assert "shared with default" in owner.locator("#sharing").inner_text()
            other.goto(server.url + "/")
            row = other.locator(f"tr.incident[data-id='{iid}']")
            assert row.count() == 1 and "shared by beta" in row.inner_text()
            other.goto(server.url + f"/i/{iid}")
            assert "Shared with your project by project beta" in \
                other.locator("#sharing").inner_text()
            assert other.locator("#share").count() == 0  # no share or re-analyse form
            assert other.locator("form[action$=reanalyze]").count() == 0
            other.frame_locator("#report").locator("body").wait_for(timeout=20_000)
            # Its group, as default sees it, holds it; then beta takes the share back.
            other.goto(server.url + f"/groups/{up['b_only']['inc']['group_id']}")
            assert iid in other.locator("#members").inner_html()
            owner.fill("#share input[name=project]", "default")
            owner.click("#share button[value=unshare]")
            owner.wait_for_load_state("load")
            assert "Private to project beta." in owner.locator("#sharing").inner_text()
            other.goto(server.url + "/")
            assert other.locator(f"tr.incident[data-id='{iid}']").count() == 0
            # Logging out leads back to the login form.
            other.click("header form.who button")
            other.wait_for_load_state("load")
            assert urlsplit(other.url).path == "/login"
        finally:
            browser.close()
    assert all(u.startswith(server.url) or u.startswith(("data:", "about:")) for u in requests)


def test_a_version_1_index_is_migrated(backend: Backend, tmp_path: Path) -> None:
    """An index made by schema v1 (before group counters and projects) is migrated to the
    current version on SQLite and PostgreSQL: its rows belong to ``default``, an upload's key
    is (project, sha256), counters and notes are backfilled, and text search is indexed."""
    import sqlalchemy as sa

    from ddp_autopsy.server import db, queries

    url = backend.pg.create_db("migrate_v1") if backend.pg else \
        f"sqlite:///{tmp_path / 'old.sqlite3'}"
    database = db.Database(url)
    v1 = {tb.name: tb for tb in db._v1_tables}
    with database.write() as conn:  # what a version-1 server left behind
        db.migrations_t.create(conn)
        db.MIGRATIONS[0][1](conn)
        conn.execute(db.migrations_t.insert().values(version=1, applied_at=0))
        conn.execute(db._groups_v1.insert().values(id="g1", version=1, cause="rank_crashed",
                                                   rule="CRASH001", template="t",
                                                   note="fixed by v1", created_at=0))
        conn.execute(v1["incidents"].insert(), [
            {"id": f"i{k}", "created_at": 100 + k, "updated_at": 0, "status": "done",
             "group_id": "g1", "uploads": 1, "evidence": f"[rank{k}]: OutOfMemoryError"}
            for k in range(3)])
        conn.execute(v1["uploads"].insert().values(
            sha256="ab" * 32, incident_id="i0", name="x.log", kind="log", size=1, expanded=1,
            files=1, blob_key="uploads/ab/x.log", created_at=100))
        conn.execute(v1["job_keys"].insert().values(join_key="job-1", incident_id="i0",
                                                    created_at=100))
        conn.execute(v1["tokens"].insert().values(sha256="cd" * 32, name="bot", created_at=0))
    assert database.migrate() == db.SCHEMA_VERSION == 3
    with database.write() as conn:
        g = conn.execute(sa.select(db.groups)).mappings().one()
        assert (g["n"], g["first_seen"], g["last_seen"]) == (3, 100, 102)
        stats = conn.execute(sa.select(db.group_stats)).mappings().one()
        assert (stats["project"], stats["n"]) == ("default", 3)
        assert conn.execute(sa.select(db.group_notes.c.project, db.group_notes.c.note)) \
            .one() == ("default", "fixed by v1")
        for table in (db.incidents, db.uploads, db.job_keys, db.tokens):
            assert set(conn.execute(sa.select(table.c.project)).scalars()) == {"default"}
        # The same content and job id in another project: new keys, not conflicts.
        conn.execute(db.uploads.insert().values(
            project="beta", sha256="ab" * 32, incident_id="j0", name="x.log", kind="log",
            size=1, expanded=1, files=1, blob_key="uploads/ab/x.log", created_at=200))
        conn.execute(db.job_keys.insert().values(project="beta", join_key="job-1",
                                                 incident_id="j0", created_at=200))
        with pytest.raises(sa.exc.IntegrityError), conn.begin_nested():
            conn.execute(db.uploads.insert().values(
                project="beta", sha256="ab" * 32, incident_id="j1", name="x.log", kind="log",
                size=1, expanded=1, files=1, blob_key="uploads/ab/x.log", created_at=300))
        rows, _ = queries.list_incidents(conn, queries.Filters(q="outofmemory"), "default")
        assert len(rows) == 3
        assert db.has_text_index(conn) == (not backend.pg)
        rows, _ = queries.list_incidents(conn, queries.Filters(q="rank1]"), "default")
        assert [r["id"] for r in rows] == ["i1"]
        assert queries.list_incidents(conn, queries.Filters(), "beta")[0] == []
    assert database.migrate() == 3  # idempotent
    database.dispose()


def test_wrong_tokens_are_rate_limited(backend: Backend) -> None:
    """Guessing tokens costs writes: a wrong token counts against the client's limit (per
    process, as uploads do), a valid token's reads do not."""
    if backend.name != "sqlite-dir":
        pytest.skip("the limiter lives in the server process: the same on every backend")
    s = backend.server(args=["--writes-per-minute", "3"]).start()
    try:
        for _ in range(3):
            assert s.get("/api/v1/incidents", token="guess").status_code == 403
        r = s.get("/api/v1/incidents", token="guess")
        assert r.status_code == 429 and r.headers["retry-after"] == "60"
        with httpx.Client(base_url=s.url) as c:
            assert c.post("/login", data={"token": "guess"}).status_code == 429
        for _ in range(5):
            assert s.get("/api/v1/incidents", token=B).status_code == 200
    finally:
        s.stop()
