"""The post-mortem service: ``ddp-autopsy serve`` and ``ddp-autopsy upload`` (docs/server.md).

An ASGI app (FastAPI on uvicorn) over an SQLAlchemy index (SQLite by default, PostgreSQL by URL)
and a blob store (a local directory or an S3-compatible bucket). Uploads are stored by content
hash, analysed off the request path by a bounded worker pool that claims jobs from the database
(so several server processes can share one database), and grouped by a versioned fingerprint.
"""
