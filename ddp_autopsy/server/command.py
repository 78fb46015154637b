"""``ddp-autopsy serve`` and ``ddp-autopsy upload`` (registered in ``ddp_autopsy/cli.py``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

MISSING_EXTRA = ("ddp-autopsy: the server needs its extra dependencies: "
                 "pip install 'ddp-autopsy[server]'")


def _need_server_deps() -> None:
    try:
        import fastapi  # noqa: F401
        import sqlalchemy  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as err:
        click.echo(f"{MISSING_EXTRA} ({err.name} is missing)", err=True)
        sys.exit(2)


@click.command("serve")
@click.option("--data", type=click.Path(path_type=Path, file_okay=False),
              default=Path("ddp-autopsy-data"), show_default=True,
              help="Directory for the SQLite index, blobs (unless --store) and scratch files.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8750, show_default=True, type=click.IntRange(0, 65535))
@click.option("--db", "db_url", envvar="DDP_AUTOPSY_DB", default=None,
              help="Index database URL (postgresql+psycopg://user@host/db); default SQLite "
                   "in --data.")
@click.option("--store", "store_url", envvar="DDP_AUTOPSY_STORE", default=None,
              help="Blob store: a directory or s3://bucket/prefix; default --data/blobs.")
@click.option("--s3-endpoint", envvar="DDP_AUTOPSY_S3_ENDPOINT", default=None,
              help="Endpoint of an S3-compatible store (MinIO, Ceph, ...).")
@click.option("--token", "tokens", multiple=True, metavar="[PROJECT:]TOKEN",
              help="A token and its project (repeat; also DDP_AUTOPSY_TOKEN, comma-separated). "
                   "A token reads and writes its project's incidents; a bare token belongs to "
                   "the project 'default'.")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 64),
              help="Analyses run at once by this process.")
@click.option("--max-upload-mb", default=2048, show_default=True, type=click.IntRange(1))
@click.option("--max-expanded-mb", default=16384, show_default=True, type=click.IntRange(1),
              help="Bytes an upload may decompress to (zip bombs).")
@click.option("--max-files", default=100_000, show_default=True, type=click.IntRange(1))
@click.option("--writes-per-minute", default=120, show_default=True, type=click.IntRange(1),
              help="Uploads and other writes per client address per minute (per process).")
@click.option("--lease", "lease_s", default=60.0, show_default=True, type=click.FloatRange(1),
              help="Seconds before a killed server's running analysis is taken up again.")
@click.option("--webhook", envvar="DDP_AUTOPSY_WEBHOOK", default=None,
              help="URL POSTed a JSON summary whenever a new group of failures appears.")
@click.option("--public-url", envvar="DDP_AUTOPSY_PUBLIC_URL", default=None,
              help="This server's address as users reach it (links in webhooks).")
@click.option("--new-token", "new_token", metavar="NAME", default=None,
              help="Make a token named NAME for --project in the index (only its hash is "
                   "kept), print it and exit.")
@click.option("--project", default="default", show_default=True,
              help="The project of the token --new-token makes.")
@click.option("--reanalyze", is_flag=True,
              help="Queue a new analysis of every incident (old ones are kept), then serve.")
@click.option("--log-level", default="warning", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
def serve_command(data: Path, host: str, port: int, db_url: str | None, store_url: str | None,
                  s3_endpoint: str | None, tokens: tuple[str, ...], workers: int,
                  max_upload_mb: int, max_expanded_mb: int, max_files: int,
                  writes_per_minute: int, lease_s: float, webhook: str | None,
                  public_url: str | None, new_token: str | None, project: str,
                  reanalyze: bool, log_level: str) -> None:
    """Run the post-mortem service: upload bundles and logs, browse incidents and groups.

    One command for a local server (SQLite and a blob directory under --data); PostgreSQL
    (--db) and an S3-compatible store (--store) for a team. Several processes may serve one
    database.
    """
    _need_server_deps()
    import os

    import uvicorn

    from ddp_autopsy.server.app import create_app
    from ddp_autopsy.server.config import (
        MB,
        PROJECT_RE,
        Limits,
        Settings,
        default_db_url,
        tokens_from,
    )
    from ddp_autopsy.server.db import Database

    try:
        data.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise click.UsageError(f"--data {data}: {err.strerror or err}") from err
    try:
        found = tokens_from(tokens)
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    if not PROJECT_RE.match(project):
        raise click.UsageError(f"--project {project!r}: letters, digits, '.', '_' and '-', "
                               "at most 64")
    if not found and new_token is None:
        click.echo("ddp-autopsy serve: no --token (or DDP_AUTOPSY_TOKEN): every request but "
                   "/healthz will be refused until a token is set (--new-token makes one)",
                   err=True)
    settings = Settings(
        data=data.resolve(), db_url=db_url or default_db_url(data),
        store_url=store_url or "", tokens=found, s3_endpoint=s3_endpoint, workers=workers,
        lease_s=lease_s,
        limits=Limits(upload_bytes=max_upload_mb * MB, expanded_bytes=max_expanded_mb * MB,
                      files=max_files, writes_per_minute=writes_per_minute),
        hold_s=float(os.environ.get("DDP_AUTOPSY_SERVE_TEST_HOLD_S", "0") or 0),
        webhook=webhook, public_url=(public_url or f"http://{host}:{port}").rstrip("/"))
    if new_token is not None:
        _make_token(settings.db_url, new_token, project)
        return
    if reanalyze:
        from ddp_autopsy.server.service import reanalyze as queue_all

        database = Database(settings.db_url)
        try:
            database.migrate()
            n = queue_all(database)
        except Exception as err:
            raise click.ClickException(f"--reanalyze: {err}") from err
        finally:
            database.dispose()
        click.echo(f"ddp-autopsy serve: queued {n} incident(s) for re-analysis", err=True)
    try:
        app = create_app(settings)
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    click.echo(f"ddp-autopsy serve: http://{host}:{port}/ (index {settings.db_url.split('@')[-1]},"
               f" blobs {app.state.store.describe()})", err=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)


def _make_token(db_url: str, name: str, project: str) -> None:
    import hashlib
    import secrets
    import time

    from ddp_autopsy.server import db as t

    if not name.strip() or len(name) > 100:
        raise click.UsageError("--new-token NAME: a name of 1 to 100 characters")
    token = secrets.token_urlsafe(24)
    database = t.Database(db_url)
    try:
        database.migrate()
        with database.write() as conn:
            conn.execute(t.tokens.insert().values(
                sha256=hashlib.sha256(token.encode()).hexdigest(), name=name.strip(),
                project=project, created_at=time.time()))
    except Exception as err:
        raise click.ClickException(f"--new-token: {err}") from err
    finally:
        database.dispose()
    click.echo(token)


@click.command("upload")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--server", "url", envvar="DDP_AUTOPSY_SERVER", required=True,
              help="The server's base URL, e.g. http://autopsy.internal:8750")
@click.option("--token", envvar="DDP_AUTOPSY_TOKEN", default=None,
              help="Upload token (also DDP_AUTOPSY_TOKEN).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True)
def upload_command(paths: tuple[Path, ...], url: str, token: str | None, fmt: str) -> None:
    """Upload bundles (directories are tarred on the fly), tarballs or logs to a server.

    Prints each incident's permalink; the same content uploaded twice is one incident.
    Exit 1 when any upload failed.
    """
    try:
        import httpx  # noqa: F401
    except ImportError:
        click.echo(MISSING_EXTRA, err=True)
        sys.exit(2)
    from ddp_autopsy.server.client import UploadError, upload

    failed = 0
    answers = []
    for path in paths:
        try:
            answer = upload(path, url, token)
        except UploadError as err:
            click.echo(f"ddp-autopsy upload: {err}", err=True)
            failed += 1
            continue
        answers.append({"path": str(path), **answer})
        if fmt == "text":
            how = "already uploaded" if answer.get("duplicate") else \
                ("joined its job's incident" if answer.get("joined") else "new incident")
            click.echo(f"{path}: {answer['url']}  ({how})")
    if fmt == "json":
        click.echo(json.dumps(answers, indent=2))
    sys.exit(1 if failed else 0)
