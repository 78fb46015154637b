"""The post-mortem service, end to end: the real ``ddp-autopsy serve`` (uvicorn on a free
loopback port, in a subprocess) driven over HTTP and through ``ddp-autopsy upload``.

Three bundles of real hung jobs from the scenario library (two runs of ``stuck_in_eval``, one of
``stuck_in_dataloader``: two failures of one kind and another) give stable permalinks, two
groups with the right counts, and search by rank and host. Hostile uploads (no token, path
traversal, links out, gzip and zip bombs) get clear JSON errors and write nothing outside the
data directory; a server SIGKILLed mid-analysis loses nothing once restarted.

Every test runs twice: the embedded default (SQLite + a blob directory), and PostgreSQL
(Debian's binaries, a cluster started in a temporary directory) with moto's S3 server — skipped,
with the reason, when those are not installed.
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import ddp_autopsy

httpx = pytest.importorskip("httpx", reason="the server extra is not installed "
                                             "(pip install -e '.[server]')")
pytest.importorskip("fastapi", reason="the server extra is not installed")
pytest.importorskip("sqlalchemy", reason="the server extra is not installed")

import server_helpers as sh  # noqa: E402

TESTS = Path(__file__).resolve().parent
CORPUS = TESTS / "corpus"
HOST = socket.gethostname()
PROBE = '<script>alert("ddpa")</script><img src=x onerror=alert(2)>'

#: Tests that use the hung jobs' bundles (the session queues these scenarios early).
HUNG = pytest.mark.scenario("stuck_in_eval", "stuck_in_dataloader")


# --- real hung jobs ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hung(scenario_run: Callable[[str], Any], tmp_path_factory: pytest.TempPathFactory
         ) -> dict[str, Path]:
    """Bundle directories of three real hung jobs: two runs of one failure, and another."""
    from scenarios.runner import run_scenario

    # The second run of stuck_in_eval starts with the library's two (hung jobs mostly sleep).
    with ThreadPoolExecutor(1) as pool:
        second = pool.submit(run_scenario, "stuck_in_eval", tmp_path_factory.mktemp("again"))
        eval_a = scenario_run("stuck_in_eval")
        loader = scenario_run("stuck_in_dataloader")
        eval_b = second.result()
    for run in (eval_a, loader, eval_b):
        assert run.bundle is not None and run.bundle.is_dir(), run.error
    return {"eval_a": eval_a.bundle, "eval_b": eval_b.bundle, "loader": loader.bundle}


# --- backends ------------------------------------------------------------------------------


class Backend:
    """How to start servers of one kind: a database URL maker and a store."""

    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self.root = root
        self.pg: sh.Postgres | None = None
        self.moto: sh.Moto | None = None
        self._n = 0

    def server(self, args: list[str] | None = None, env: dict[str, str] | None = None
               ) -> sh.Server:
        """A new server with its own data directory, database and bucket prefix."""
        self._n += 1
        data = self.root / f"data{self._n}"
        db = store = None
        env = dict(env or {})
        if self.pg is not None:
            db = self.pg.create_db(f"ddpa{self._n}")
        if self.moto is not None:
            store = f"s3://ddpa-test/run{self._n}"
            env |= {**sh.S3_ENV, "DDP_AUTOPSY_S3_ENDPOINT": self.moto.url}
        return sh.Server(data, db=db, store=store, env=env, args=args)

    def again(self, old: sh.Server, env: dict[str, str] | None = None) -> sh.Server:
        """A second server process on the same database and store as ``old``."""
        return sh.Server(old.data, db=old.db, store=old.store, env={**old.env, **(env or {})},
                         args=old.args)


@pytest.fixture(scope="module", params=["sqlite-dir", "postgres-s3"])
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Backend]:
    b = Backend(request.param, tmp_path_factory.mktemp(request.param))
    if request.param == "postgres-s3":
        if sh.pg_bin() is None:
            pytest.skip("PostgreSQL binaries (initdb, pg_ctl) not installed: "
                        "apt-get install postgresql")
        pytest.importorskip("psycopg", reason="psycopg not installed (the server extra)")
        pytest.importorskip("moto.server", reason="moto[server] not installed (the test extra)")
        pytest.importorskip("boto3", reason="boto3 not installed (the server extra)")
        b.pg = sh.Postgres().start()
        b.moto = sh.Moto(b.root).start()
        b.moto.bucket("ddpa-test")
    try:
        yield b
    finally:
        if b.pg:
            b.pg.stop()
        if b.moto:
            b.moto.stop()


class Hooks:
    """A webhook receiver on loopback: every POSTed JSON body, by path."""

    def __init__(self) -> None:
        import http.server
        import threading

        self.received: list[tuple[str, dict[str, Any]]] = []
        hooks = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hooks.received.append((self.path, json.loads(body)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def posts(self, path: str) -> list[dict[str, Any]]:
        return [body for p, body in self.received if p == path]


@pytest.fixture(scope="module")
def hooks() -> Iterator[Hooks]:
    h = Hooks()
    yield h
    h.httpd.shutdown()


@pytest.fixture(scope="module")
def server(backend: Backend, hooks: Hooks) -> Iterator[sh.Server]:
    """One server per backend, with small limits so that bombs are cheap to build."""
    s = backend.server(args=["--max-expanded-mb", "48", "--max-files", "500", "--webhook",
                             f"http://127.0.0.1:{hooks.port}/hook/{backend.name}"])
    s.start()
    yield s
    s.stop()


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddp_autopsy", *args], capture_output=True,
                          text=True, timeout=180, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def uploaded(server: sh.Server, hung: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """The three bundles, uploaded through the real CLI and analysed."""
    r = cli("upload", str(hung["eval_a"]), str(hung["loader"]), str(hung["eval_b"]),
            "--server", server.url, "--token", sh.TOKEN, "--format", "json")
    assert r.returncode == 0, r.stderr
    answers = json.loads(r.stdout)
    jsonschema.validate(answers, json.loads(
        (Path(ddp_autopsy.__file__).parent / "schemas" / "upload.schema.json").read_text()))
    out = {}
    for key, answer in zip(["eval_a", "loader", "eval_b"], answers, strict=True):
        out[key] = {**answer, "incident_json": server.wait_analysed(answer["incident"])}
    return out


# --- uploads, permalinks, groups, search ---------------------------------------------------


@HUNG
def test_three_hung_jobs_get_stable_permalinks(server: sh.Server, hung: dict[str, Path],
                                               uploaded: dict[str, dict[str, Any]]) -> None:
    ids = {k: v["incident"] for k, v in uploaded.items()}
    assert len(set(ids.values())) == 3
    for key, answer in uploaded.items():
        assert answer["permalink"] == f"/i/{answer['incident']}"
        assert answer["sha256"].startswith(answer["incident"])  # derived from the content
        inc = answer["incident_json"]
        assert inc["status"] == "done", inc
        assert inc["cause"] == "rank_stuck_outside_collective"
        assert inc["culprit_ranks"] == ([2] if key == "loader" else [0])
        assert inc["job_name"] == ("stuck_in_dataloader.py" if key == "loader"
                                   else "stuck_in_eval.py")
    # The same bundle again (re-tarred on the fly, same bytes): the same incident, not a new one.
    r = cli("upload", str(hung["eval_a"]), "--server", server.url, "--token", sh.TOKEN,
            "--format", "json")
    assert r.returncode == 0, r.stderr
    again = json.loads(r.stdout)[0]
    assert again["incident"] == ids["eval_a"] and again["duplicate"] is True
    listed = server.get("/api/v1/incidents").json()["incidents"]
    assert sorted(i["id"] for i in listed) == sorted(ids.values())
    # The permalink serves the incident page and the post-mortem; the raw bundle downloads.
    page = server.get(uploaded["eval_a"]["permalink"])
    assert page.status_code == 200 and "evaluate" in page.text
    report = server.get(f"/i/{ids['eval_a']}/report")
    assert report.status_code == 200 and "never reached the collective" in report.text
    assert "sandbox" in report.headers["content-security-policy"]
    analysis = server.get(f"/api/v1/incidents/{ids['eval_a']}/analysis").json()
    assert analysis["schema"] == "ddp-autopsy/analysis/1"
    assert analysis["verdict"]["details"]["frame"] == "evaluate"
    sha = uploaded["eval_a"]["sha256"]
    raw = server.get(f"/api/v1/uploads/{sha}/raw")
    with tarfile.open(fileobj=io.BytesIO(raw.content)) as tar:
        assert any(n.endswith("/manifest.json") for n in tar.getnames())


@HUNG
def test_groups_count_repeats_of_one_failure(server: sh.Server,
                                             uploaded: dict[str, dict[str, Any]]) -> None:
    groups = server.get("/api/v1/groups").json()["groups"]
    assert sorted(g["count"] for g in groups) == [1, 2]
    two = next(g for g in groups if g["count"] == 2)
    assert two["cause"] == "rank_stuck_outside_collective" and two["rule"] == "COLL002"
    assert "evaluate" in two["template"]
    detail = server.get(f"/api/v1/groups/{two['id']}").json()
    assert {i["id"] for i in detail["incidents"]} == {uploaded["eval_a"]["incident"],
                                                      uploaded["eval_b"]["incident"]}
    assert all("evaluate" in i["matched"] for i in detail["incidents"])  # why they were grouped
    assert detail["hosts"] == [HOST]
    assert detail["first_seen"] <= detail["last_seen"]
    one = next(g for g in groups if g["count"] == 1)
    assert "__getitem__" in one["template"]
    # A note, set with a token; refused without one.
    note = {"note": "fixed by moving evaluation out of the training loop"}
    assert httpx.put(f"{server.url}/api/v1/groups/{two['id']}/note", json=note).status_code == 401
    r = httpx.put(f"{server.url}/api/v1/groups/{two['id']}/note", json=note,
                  headers={"Authorization": f"Bearer {sh.TOKEN}"})
    assert r.status_code == 200
    page = server.get(f"/groups/{two['id']}").text
    assert "fixed by moving evaluation" in page and uploaded["eval_b"]["incident"] in page


@HUNG
def test_new_groups_call_the_webhook(backend: Backend, server: sh.Server, hooks: Hooks,
                                     uploaded: dict[str, dict[str, Any]]) -> None:
    groups = {g["id"] for g in server.get("/api/v1/groups").json()["groups"]}
    deadline = time.monotonic() + 15  # the hook is called after the analysis is recorded
    while not groups <= {p["group"] for p in hooks.posts(f"/hook/{backend.name}")}:
        assert time.monotonic() < deadline, (groups, hooks.received)
        time.sleep(0.1)
    posted = [p["group"] for p in hooks.posts(f"/hook/{backend.name}")]
    assert sorted(posted) == sorted(set(posted))  # once per group, not once per incident
    assert groups <= set(posted)
    hook = next(p for p in hooks.posts(f"/hook/{backend.name}")
                if p["group"] == uploaded["loader"]["incident_json"]["group_id"])
    assert hook["event"] == "new_group" and hook["cause"] == "rank_stuck_outside_collective"
    assert hook["incident_url"].endswith(f"/i/{uploaded['loader']['incident']}")


def _ids(server: sh.Server, **params: Any) -> set[str]:
    r = server.get("/api/v1/incidents", params=params)
    assert r.status_code == 200, r.text
    return {i["id"] for i in r.json()["incidents"]}


@HUNG
def test_search_by_rank_host_text_and_filters(server: sh.Server,
                                              uploaded: dict[str, dict[str, Any]]) -> None:
    ea, eb, ld = (uploaded[k]["incident"] for k in ("eval_a", "eval_b", "loader"))
    assert _ids(server, rank=0) == {ea, eb}
    assert _ids(server, rank=2) == {ld}
    assert _ids(server, rank=1) == set()
    assert _ids(server, host=HOST) == {ea, eb, ld}
    assert _ids(server, host=HOST[:-1]) == set()  # hosts match exactly, not by prefix
    assert _ids(server, q="ShardDataset") == {ld}
    assert _ids(server, q="EVALUATE") == {ea, eb}  # case-insensitive
    assert _ids(server, job="dataloader") == {ld}
    assert _ids(server, cause="rank_stuck_outside_collective", rule="coll002") == {ea, eb, ld}
    assert _ids(server, cause="port_in_use") == set()
    today = time.strftime("%Y-%m-%d", time.gmtime())
    assert _ids(server, since=today) == {ea, eb, ld}
    assert _ids(server, until="2000-01-01") == set()
    listed = server.get("/api/v1/incidents").json()["incidents"]
    assert [i["created_at"] for i in listed] == sorted((i["created_at"] for i in listed),
                                                       reverse=True)  # newest first
    bad = server.get("/api/v1/incidents", params={"rank": "x"})
    assert bad.status_code == 422 and "rank" in bad.json()["error"]["message"]
    # The list page applies the same filters.
    page = server.get("/", params={"rank": 2}).text
    assert ld in page and ea not in page


@HUNG
def test_reanalysis_keeps_the_old_result(server: sh.Server,
                                         uploaded: dict[str, dict[str, Any]]) -> None:
    iid = uploaded["loader"]["incident"]
    before = server.get(f"/api/v1/incidents/{iid}").json()
    assert httpx.post(f"{server.url}/api/v1/incidents/{iid}/reanalyze").status_code == 401
    r = httpx.post(f"{server.url}/api/v1/incidents/{iid}/reanalyze",
                   headers={"Authorization": f"Bearer {sh.TOKEN}"})
    assert r.status_code == 202
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        after = server.wait_analysed(iid)
        if len([a for a in after["analyses"] if a["status"] == "done"]) == \
                len(before["analyses"]) + 1:
            break
        time.sleep(0.2)
    assert after["analysis_id"] != before["analysis_id"]
    old = server.get(f"/api/v1/incidents/{iid}/analysis",
                    params={"analysis": before["analysis_id"]})
    assert old.status_code == 200 and old.json()["verdict"]["ranks"] == [2]
    assert after["group_id"] == before["group_id"]


# --- access and hostile input --------------------------------------------------------------


def test_upload_needs_a_valid_token(server: sh.Server) -> None:
    log = CORPUS / "pt-001" / "train.log"
    r = server.upload(log, "train.log", token=None)
    assert r.status_code == 401
    assert "token" in r.json()["error"]["message"]
    r = server.upload(log, "train.log", token="wrong")
    assert r.status_code == 403 and r.json()["error"]["status"] == 403
    r = cli("upload", str(log), "--server", server.url)
    assert r.returncode == 1 and "401" in r.stderr and "Traceback" not in r.stderr


def test_tokens_from_the_index(backend: Backend, server: sh.Server) -> None:
    """``serve --new-token NAME`` prints a token that the running server accepts."""
    args = ["serve", "--data", str(server.data), "--new-token", "ci-bot"]
    if server.db:
        args += ["--db", server.db]
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    assert len(token) >= 24
    log = CORPUS / "eco-003" / "worker-0.log"
    resp = server.upload(log, "worker-0.log", token=token)
    assert resp.status_code == 201, resp.text
    server.wait_analysed(resp.json()["incident"])  # nothing left running for the next tests


def _files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("kind", ["traversal", "symlink", "gzip_bomb", "zip_bomb", "empty",
                                  "device"])
def test_hostile_uploads_are_refused_cleanly(server: sh.Server, kind: str) -> None:
    if kind == "traversal":
        body, status, words = sh.traversal_tar(), 400, "escape"
    elif kind == "symlink":
        body, status, words = sh.symlink_tar(), 400, "links outside"
    elif kind == "gzip_bomb":
        body, status, words = sh.gzip_bomb_tar(200 << 20), 413, "bomb"
    elif kind == "zip_bomb":
        body, status, words = sh.zip_bomb(200 << 20), 413, "bomb"
    elif kind == "device":
        dev = tarfile.TarInfo("logs/null")
        dev.type = tarfile.CHRTYPE
        body, status, words = sh.tar_bytes([(dev, None)]), 400, "device"
    else:
        body, status, words = b"", 400, "empty"
    assert len(body) < 2 << 20  # what is sent stays small; the limit is on what it expands to
    deadline = time.monotonic() + 60  # earlier tests' analyses write their results first
    while server.get("/healthz").json()["jobs_pending"]:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    before = _files_under(server.data)
    n_before = len(server.get("/api/v1/incidents").json()["incidents"])
    r = server.upload(body, f"{kind}.tar.gz")
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["status"] == status and words in err["message"]
    # Nothing kept: no new blob, no scratch file, no incident; nothing escaped anywhere.
    new = {p for p in _files_under(server.data) - before
           if not p.name.startswith("index.sqlite3")}
    assert new == set()
    assert len(server.get("/api/v1/incidents").json()["incidents"]) == n_before
    for d in (server.data, server.data.parent, server.data.parent.parent, Path.cwd(),
              Path("/tmp")):
        assert not (d / "escaped-by-ddpa-test.txt").exists()
    assert server.get("/healthz").status_code == 200


def test_too_many_files_are_refused(server: sh.Server) -> None:
    members = [(sh.file_info(f"logs/r{i}.log", 3), b"ok\n") for i in range(501)]
    r = server.upload(sh.tar_bytes(members), "many.tar.gz")
    assert r.status_code == 413 and "500 files" in r.json()["error"]["message"]


@pytest.fixture(scope="module")
def probe(server: sh.Server) -> dict[str, Any]:
    """A bundle whose host, job name and log lines carry markup, uploaded and analysed."""
    manifest = {"schema": "ddp-autopsy/bundle/1", "host": f"node{PROBE}",
                "job": {"key": f"torchrun-1{PROBE}", "run_id": "none", "world_size": 2,
                        "cmdline": ["python", f"train{PROBE}.py"]},
                "processes": [], "logs": [{"source": "/x/console.log",
                                           "path": "logs/console.log", "kinds": ["console"]}]}
    log = (CORPUS / "pt-001" / "train.log").read_text(errors="replace")
    log += f"\n[rank1]: RuntimeError: {PROBE}\n"
    data = json.dumps(manifest).encode()
    body = sh.tar_bytes([(sh.file_info("b/manifest.json", len(data)), data),
                         (sh.file_info("b/logs/console.log", len(log.encode())), log.encode())])
    r = server.upload(body, f"probe{PROBE}.tar.gz")
    assert r.status_code == 201, r.text
    return server.wait_analysed(r.json()["incident"])


def test_planted_markup_stays_inert(server: sh.Server, probe: dict[str, Any]) -> None:
    iid = probe["id"]
    assert "onerror=alert(2)" in probe["job_name"]  # the job name really carries markup
    for url in ("/", f"/i/{iid}", "/groups", f"/groups/{probe['group_id']}",
                f"/?job={PROBE}"):
        page = server.get(url)
        assert page.status_code == 200
        assert PROBE not in page.text and "<script>alert" not in page.text
        assert "script-src" not in page.headers["content-security-policy"]  # no script at all
    page = server.get(f"/i/{iid}").text
    assert "&lt;script&gt;alert(" in page  # shown, as text


CHROMIUM = os.environ.get("DDP_AUTOPSY_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def browser_api(backend: Backend) -> Any:
    """Playwright's sync API for a page test, which runs once (on sqlite-dir): skipped, and
    said why, on the other backends and without Playwright or Chromium."""
    if backend.name != "sqlite-dir":
        pytest.skip("the pages are the same on every backend: tested once, on sqlite-dir")
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="playwright is not installed (pip install playwright)")
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set "
                    "DDP_AUTOPSY_CHROMIUM)")
    return sync_api


@HUNG
def test_pages_in_chromium(backend: Backend, server: sh.Server,
                           uploaded: dict[str, dict[str, Any]], probe: dict[str, Any]) -> None:
    """List, filters, an incident (its post-mortem in the frame), a group; markup stays text."""
    sync_api = browser_api(backend)
    ea, eb, ld = (uploaded[k]["incident"] for k in ("eval_a", "eval_b", "loader"))
    dialogs: list[str] = []
    requests: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(server.url + "/")  # the login form first: reads need a token
            assert page.url.startswith(server.url + "/login")
            page.fill("input[name=token]", sh.TOKEN)
            page.click("#login button[type=submit]")
            page.wait_for_url(server.url + "/")
            assert page.locator("tr.incident").count() >= 4
            ids = [page.locator("tr.incident").nth(i).get_attribute("data-id")
                   for i in range(page.locator("tr.incident").count())]
            assert ids[0] == probe["id"]  # newest first
            # Filters through the form: a rank, then a cause.
            page.fill("input[name=rank]", "2")
            page.click("#filters button[type=submit]")
            page.wait_for_url("**/?*rank=2*")
            assert [page.locator("tr.incident").nth(i).get_attribute("data-id")
                    for i in range(page.locator("tr.incident").count())] == [ld]
            page.goto(server.url + "/")
            page.select_option("select[name=cause]", "rank_stuck_outside_collective")
            page.click("#filters button[type=submit]")
            page.wait_for_url("**/?*cause=rank_stuck_outside_collective*")
            shown = {page.locator("tr.incident").nth(i).get_attribute("data-id")
                     for i in range(page.locator("tr.incident").count())}
            assert shown == {ea, eb, ld}
            # An incident: metadata, and the HTML post-mortem in its sandboxed frame.
            page.goto(server.url + f"/i/{ea}")
            assert page.locator("dd.ranks").inner_text() == "0"
            page.frame_locator("#report").get_by_text("never reached the collective").first \
                .wait_for(timeout=20_000)
            # A group: its count and the incidents it holds.
            page.goto(server.url + f"/groups/{uploaded['eval_a']['incident_json']['group_id']}")
            assert page.locator("#count").inner_text() == "2"
            assert page.locator("#members tbody tr").count() == 2
            # Markup in the host, job name and log lines: text on every page, never run.
            for url in ("/", f"/i/{probe['id']}", f"/groups/{probe['group_id']}"):
                page.goto(server.url + url)
                assert "onerror=alert(2)" in page.locator("body").inner_text()
                assert page.locator("main script, main img").count() == 0
            page.goto(server.url + f"/i/{probe['id']}/report")
            page.wait_for_load_state("load")
            assert page.locator("body img[src=x]").count() == 0
        finally:
            browser.close()
    assert dialogs == []
    assert all(u.startswith(server.url) or u.startswith(("data:", "about:")) for u in requests)


# --- durability ----------------------------------------------------------------------------


def test_killed_mid_analysis_loses_nothing(backend: Backend) -> None:
    """SIGKILL while an analysis runs; the restarted server takes the job up again."""
    hold = {"DDP_AUTOPSY_SERVE_TEST_HOLD_S": "2"}
    first = backend.server(args=["--lease", "2"], env=hold).start()
    try:
        r = first.upload(CORPUS / "pt-001" / "train.log", "train.log")
        assert r.status_code == 201, r.text
        iid = r.json()["incident"]
        deadline = time.monotonic() + 30
        while first.get(f"/api/v1/incidents/{iid}").json()["status"] != "running":
            assert time.monotonic() < deadline, "the analysis never started"
            time.sleep(0.05)
    finally:
        first.kill()
    second = backend.again(first, env={"DDP_AUTOPSY_SERVE_TEST_HOLD_S": "0"}).start()
    try:
        inc = second.wait_analysed(iid, timeout=60)
        assert inc["status"] == "done" and inc["cause"] == "job_terminated"
        assert len(inc["uploads_list"]) == 1
        raw = second.get(inc["uploads_list"][0]["raw"]).content
        assert raw == (CORPUS / "pt-001" / "train.log").read_bytes()
    finally:
        second.stop()


def test_two_processes_share_one_database(backend: Backend, server: sh.Server) -> None:
    """Two servers on one index: an upload to one is read from the other, once, analysed once."""
    a = server
    b = backend.again(a).start("--writes-per-minute", "3")
    try:
        logs = [CORPUS / "pt-001" / "train.log", CORPUS / "eco-001" / "train.log",
                CORPUS / "eco-002" / "train.log"]
        ids = [(a if i % 2 else b).upload(p, p.name).json()["incident"]
               for i, p in enumerate(logs)]
        dup = a.upload(logs[0], "again.log")
        assert dup.status_code == 200 and dup.json()["incident"] == ids[0]
        for iid in ids:
            inc = b.wait_analysed(iid)
            assert inc["status"] == "done"
            assert len(inc["analyses"]) == 1  # claimed by exactly one worker
        assert {i["id"] for i in a.get("/api/v1/incidents").json()["incidents"]} \
            >= set(ids)
        # b took two writes; its limit is three a minute per client.
        assert b.upload(logs[1], "again.log").status_code == 200
        limited = b.upload(logs[1], "again.log")
        assert limited.status_code == 429 and limited.headers["retry-after"] == "60"
        assert "writes a minute" in limited.json()["error"]["message"]
        assert a.upload(logs[1], "again.log").status_code == 200  # a limit per process
    finally:
        b.stop()


def test_nodes_of_one_job_join_one_incident(server: sh.Server) -> None:
    """Two nodes' bundles with one rendezvous id: one incident with both uploads."""
    def node_bundle(host: str, rank: int) -> bytes:
        manifest = {"schema": "ddp-autopsy/bundle/1", "host": host,
                    "job": {"key": f"torchrun-{rank}", "run_id": "job-4242", "world_size": 2},
                    "processes": [], "logs": []}
        data = json.dumps(manifest).encode()
        log = f"[rank{rank}]: still training step {rank}\n".encode()
        return sh.tar_bytes([(sh.file_info(f"{host}/manifest.json", len(data)), data),
                             (sh.file_info(f"{host}/logs/train.log", len(log)), log)])

    r1 = server.upload(node_bundle("nodeA", 0), "nodeA.tar.gz")
    r2 = server.upload(node_bundle("nodeB", 1), "nodeB.tar.gz")
    assert r1.status_code == r2.status_code == 201
    assert r2.json()["joined"] is True and r1.json()["incident"] == r2.json()["incident"]
    inc = server.wait_analysed(r1.json()["incident"])
    assert sorted(u["host"] for u in inc["uploads_list"]) == ["nodeA", "nodeB"]
    assert {"nodeA", "nodeB"} <= set(inc["hosts"])


def test_migrations_are_versioned(server: sh.Server) -> None:
    from ddp_autopsy.server.db import SCHEMA_VERSION

    health = server.get("/healthz").json()
    assert health["schema"] == SCHEMA_VERSION == 3 and health["ok"] is True


def test_errors_are_json(server: sh.Server) -> None:
    for method, url in [("GET", "/i/nope"), ("GET", "/api/v1/incidents/nope"),
                        ("GET", "/groups/nope"), ("GET", "/api/v1/uploads/abc/raw"),
                        ("GET", "/api/v1/incidents?page=0"), ("GET", "/?since=yesterday")]:
        r = httpx.request(method, server.url + url, headers=sh.auth(sh.TOKEN))
        assert r.status_code in (404, 422), (url, r.status_code)
        assert r.json()["error"]["status"] == r.status_code


def test_upload_cli_reports_a_missing_path(server: sh.Server, tmp_path: Path) -> None:
    r = cli("upload", str(tmp_path / "nope"), "--server", server.url, "--token", sh.TOKEN)
    assert r.returncode == 1 and "no such file" in r.stderr


def test_openapi_documents_the_api(server: sh.Server) -> None:
    spec = server.get("/openapi.json").json()
    for path in ("/api/v1/uploads", "/api/v1/incidents", "/api/v1/incidents/{incident_id}",
                 "/api/v1/incidents/{incident_id}/shares", "/api/v1/groups",
                 "/api/v1/groups/{group_id}/note"):
        assert path in spec["paths"]
        assert all(op["security"] == [{"token": []}] for op in spec["paths"][path].values())
    assert spec["components"]["securitySchemes"]["token"]["scheme"] == "bearer"
    assert "security" not in spec["paths"]["/healthz"]["get"]


def test_readme_two_command_start(tmp_path: Path) -> None:
    """The README's local server and upload, verbatim but for the port (8750 may be taken on a
    test machine) and the bundle path: the permalink it prints opens once logged in."""
    import re
    import shutil

    readme = (TESTS.parent / "README.md").read_text()
    block = readme.split("**5. Keep them", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    serve, upload = block.strip().splitlines()
    install, serve = serve.split(" && ", 1)
    assert install == "pip install 'ddp-autopsy[server]'"
    assert re.search(r"^server = \[", (TESTS.parent / "pyproject.toml").read_text(), re.M)
    assert serve.startswith("ddp-autopsy serve ") and upload.startswith("ddp-autopsy upload ")
    node = tmp_path / "autopsy" / "node0"
    node.mkdir(parents=True)
    shutil.copy(CORPUS / "pt-001" / "train.log", node / "train.log")
    port = sh.free_port()
    env = {**os.environ, "TOKEN": "readme-token-42",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(["bash", "-c", f"exec {serve} --port {port}"], cwd=tmp_path,
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        sh.wait_http(f"{url}/healthz", proc, what="the README's serve", log=log)
        cmd = upload.replace("/shared/autopsy/", f"{tmp_path}/autopsy/") \
            .replace("http://127.0.0.1:8750", url)
        r = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=180)
        assert r.returncode == 0, r.stderr
        link = re.search(r"http://\S+/i/[0-9a-f]{20}", r.stdout)
        assert link and "new incident" in r.stdout, r.stdout
        assert (tmp_path / "autopsy-data" / "index.sqlite3").is_file()
        assert httpx.get(link.group(0)).status_code == 303  # the login form first
        with httpx.Client() as c:
            c.post(f"{url}/login", data={"token": "readme-token-42", "next": "/"})
            assert c.get(link.group(0)).status_code == 200
    finally:
        proc.terminate()
        proc.wait(15)
