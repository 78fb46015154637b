"""Benchmark the post-mortem service (run on demand, not in CI; results in docs/server.md).

    python benchmarks/bench_server.py                        # SQLite + blob directory
    python benchmarks/bench_server.py --pg                   # also PostgreSQL (initdb/pg_ctl)
    python benchmarks/bench_server.py --size 256M --incidents 100000

Measures, against a real ``ddp-autopsy serve`` subprocess on loopback:

- ``upload_to_verdict``: a 64-rank torchrun ``--log-dir`` tree from ``generate.py`` (``logdir``
  layout, one OOM culprit), uploaded with ``ddp-autopsy upload``'s client (tarred on the fly)
  until the incident's verdict is in, and whether it names the culprit;
- ``concurrent``: 20 distinct logs uploaded at once from 20 threads: time until all are
  accepted, and until all are analysed;
- ``list`` / ``search``: with ``--incidents`` rows inserted directly into the index (plus the
  ones above), the median latency of the list page 1 and page 200, and of filters by rank, host,
  cause and full text, over HTTP (JSON API and HTML list), as the project ``default`` (90 % of
  the incidents) and as ``beta`` (the other 10 %, plus 50 of default's shared with it: reads
  through the visibility filter with shares).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

import server_helpers as sh  # noqa: E402
from generate import generate, parse_size  # noqa: E402

from ddp_autopsy.server import db as t  # noqa: E402
from ddp_autopsy.server.client import upload  # noqa: E402
from ddp_autopsy.server.db import Database  # noqa: E402

CAUSES = ["rank_crashed", "rank_stuck_outside_collective", "collective_mismatch",
          "port_in_use", "job_terminated", "nccl_network_error", "missing_ranks"]
WORDS = ["watchdog", "timeout", "ALLREDUCE", "OutOfMemoryError", "Connection closed by peer",
         "ncclRemoteError", "EADDRINUSE", "barrier", "evaluate", "__getitem__"]


def wait_done(url: str, incident: str, timeout: float = 1800) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        inc = httpx.get(f"{url}/api/v1/incidents/{incident}", timeout=30,
                        headers=sh.auth(sh.TOKEN)).json()
        if inc["status"] in ("done", "error") and not inc.get("pending"):
            return inc
        time.sleep(0.05)
    raise TimeoutError(incident)


def bench_upload(server: sh.Server, size: int, work: Path) -> dict[str, Any]:
    tree = generate("logdir", 64, size, seed=1, out=work / "logdir-64")
    expected = json.loads((tree / "expected.json").read_text())
    (tree / "expected.json").unlink()
    nbytes = sum(f.stat().st_size for f in tree.rglob("*") if f.is_file())
    t0 = time.perf_counter()
    answer = upload(tree, server.url, sh.TOKEN)
    t_up = time.perf_counter() - t0
    inc = wait_done(server.url, answer["incident"])
    total = time.perf_counter() - t0
    return {"ranks": 64, "bytes": nbytes, "upload_s": round(t_up, 2),
            "upload_to_verdict_s": round(total, 2), "status": inc["status"],
            "cause": inc["cause"], "culprit_ranks": inc["culprit_ranks"],
            "right": inc["culprit_ranks"] == [expected["culprit_rank"]]}


def bench_concurrent(server: sh.Server, n: int = 20) -> dict[str, Any]:
    corpus = sorted((HERE.parent / "tests" / "corpus").glob("*/train.log"))[:n]
    bodies = [p.read_bytes() + f"\n# bench {time.time()} {i}\n".encode()
              for i, p in enumerate(corpus)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        answers = list(pool.map(lambda b: server.upload(b, "train.log"), bodies))
    t_accept = time.perf_counter() - t0
    ids = [a.json()["incident"] for a in answers]
    statuses = {a.status_code for a in answers}
    for iid in ids:
        wait_done(server.url, iid)
    return {"uploads": len(ids), "http": sorted(statuses), "all_accepted_s": round(t_accept, 2),
            "all_analysed_s": round(time.perf_counter() - t0, 2)}


def fill(db_url: str, n: int, seed: int = 0) -> float:
    """Insert ``n`` incidents (with groups) straight into the index; returns seconds."""
    rng = random.Random(seed)
    database = Database(db_url)
    database.migrate()
    now = time.time()
    t0 = time.perf_counter()
    groups = [{"id": f"bench{g:04d}", "version": 1, "cause": CAUSES[g % len(CAUSES)],
               "rule": f"R{g % 40:03d}", "template": f"frame: f{g}", "created_at": now}
              for g in range(500)]
    with database.write() as conn:
        conn.execute(t.groups.insert(), groups)
    batch: list[dict[str, Any]] = []
    for i in range(n):
        g = groups[rng.randrange(len(groups))]
        ranks = sorted(rng.sample(range(512), rng.choice([1, 1, 2, 4])))
        hosts = sorted({f"node{rng.randrange(256):03d}" for _ in range(rng.choice([1, 2, 8]))})
        words = " ".join(rng.sample(WORDS, 3))
        batch.append({
            "id": f"{i:020x}", "project": sh.PROJECT_B if i % 10 == 9 else "default",
            "created_at": now - rng.uniform(0, 90 * 86400), "updated_at": now,
            "status": "done", "job_key": f"key:torchrun-{i}", "job_name": f"train_{i % 97}.py",
            "cause": g["cause"], "rule": g["rule"], "group_id": g["id"], "uploads": 1,
            "summary": f"Rank {ranks[0]} {words}",
            "culprit_ranks": "," + ",".join(map(str, ranks)) + ",",
            "hosts": "," + ",".join(hosts) + ",",
            "evidence": "\n".join(f"[rank{r}]: {words} at step {rng.randrange(10**6)}"
                                  for r in ranks) * 4})
        if len(batch) == 5000:
            with database.write() as conn:
                conn.execute(t.incidents.insert(), batch)
            batch = []
    with database.write() as conn:
        if batch:
            conn.execute(t.incidents.insert(), batch)
        shared = [i for i in range(0, min(n, 1000), 7) if i % 10 != 9][:50]  # default's
        if shared:
            conn.execute(t.shares.insert(), [{"incident_id": f"{i:020x}",
                                              "project": sh.PROJECT_B, "created_at": now}
                                             for i in shared])
        t.refresh_groups(conn)
        t.refresh_group_stats(conn)
    database.dispose()
    return time.perf_counter() - t0


def latency(url: str, path: str, params: dict[str, Any], token: str = sh.TOKEN,
            runs: int = 7) -> float:
    times = []
    with httpx.Client(base_url=url, timeout=120, headers=sh.auth(token)) as c:
        c.get(path, params=params).raise_for_status()  # warm
        for _ in range(runs):
            t0 = time.perf_counter()
            c.get(path, params=params).raise_for_status()
            times.append(time.perf_counter() - t0)
    return round(statistics.median(times) * 1000, 1)


A, B = sh.TOKEN, sh.TOKEN_B
QUERIES: list[tuple[str, str, dict[str, Any], str]] = [
    ("list, page 1", "/api/v1/incidents", {}, A),
    ("list, page 200", "/api/v1/incidents", {"page": 200}, A),
    ("list page (HTML)", "/", {}, A),
    ("rank = 37", "/api/v1/incidents", {"rank": 37}, A),
    ("host = node042", "/api/v1/incidents", {"host": "node042"}, A),
    ("cause + rule", "/api/v1/incidents", {"cause": "rank_crashed", "rule": "R007"}, A),
    ("text 'OutOfMemoryError'", "/api/v1/incidents", {"q": "OutOfMemoryError"}, A),
    ("text, no match", "/api/v1/incidents", {"q": "no-such-words-anywhere"}, A),
    ("groups, page 1", "/api/v1/groups", {}, A),
    ("beta: list, page 1", "/api/v1/incidents", {}, B),
    ("beta: list, page 20", "/api/v1/incidents", {"page": 20}, B),
    ("beta: rank = 37", "/api/v1/incidents", {"rank": 37}, B),
    ("beta: text 'OutOfMemoryError'", "/api/v1/incidents", {"q": "OutOfMemoryError"}, B),
    ("beta: groups, page 1", "/api/v1/groups", {}, B),
]


def bench_search(server: sh.Server) -> dict[str, float]:
    return {name: latency(server.url, path, params, token)
            for name, path, params, token in QUERIES}


def run_backend(name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    pg = None
    db_url = None
    if name == "postgresql":
        pg = sh.Postgres().start()
        db_url = pg.create_db("bench")
    data = work / f"data-{name}"
    server = sh.Server(data, db=db_url, args=["--workers", str(args.workers)])
    try:
        server.start()
        out: dict[str, Any] = {"backend": name}
        if not args.skip_upload:
            out["upload_to_verdict"] = bench_upload(server, args.size, work)
            out["concurrent"] = bench_concurrent(server)
        db = db_url or f"sqlite:///{data / 'index.sqlite3'}"
        out["fill_s"] = round(fill(db, args.incidents), 1)
        out["incidents"] = args.incidents
        out["latency_ms"] = bench_search(server)
        return out
    finally:
        server.stop()
        if pg:
            pg.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=parse_size, default=parse_size("64M"),
                    help="size of the 64-rank log tree (default 64M)")
    ap.add_argument("--incidents", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--pg", action="store_true", help="also PostgreSQL")
    ap.add_argument("--skip-upload", action="store_true")
    args = ap.parse_args()
    results = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                          f"Python {platform.python_version()}"}
    with tempfile.TemporaryDirectory(prefix="ddpa-bench-") as tmp:
        backends = ["sqlite"] + (["postgresql"] if args.pg else [])
        results["runs"] = [run_backend(b, args, Path(tmp)) for b in backends]
    print(json.dumps(results, indent=2))
    out = HERE / "out"
    out.mkdir(exist_ok=True)
    with (out / "server-results.jsonl").open("a") as f:
        f.write(json.dumps(results) + "\n")


if __name__ == "__main__":
    main()
