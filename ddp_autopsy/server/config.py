"""Server settings: one frozen dataclass built from the command line and the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

MB = 1 << 20
GB = 1 << 30


@dataclass(frozen=True)
class Limits:
    """What one upload may cost the server."""

    #: Bytes of one upload as sent (compressed).
    upload_bytes: int = 2 * GB
    #: Bytes of everything inside one upload once decompressed (zip bombs).
    expanded_bytes: int = 16 * GB
    #: Members of one archive.
    files: int = 100_000
    #: Uploads (and other writes) per client address per minute, per server process.
    writes_per_minute: int = 120


@dataclass(frozen=True)
class Settings:
    data: Path
    db_url: str
    store_url: str
    tokens: frozenset[str]
    s3_endpoint: str | None = None
    workers: int = 2
    #: Seconds a claimed analysis job stays ours without a heartbeat (a killed server's jobs
    #: are claimed again after this).
    lease_s: float = 60.0
    poll_s: float = 0.5
    limits: Limits = field(default_factory=Limits)
    #: Testing only: seconds an analysis pauses after reading its inputs (to kill a server
    #: mid-analysis).
    hold_s: float = 0.0
    #: POSTed a JSON summary when an analysis makes a new group (chat bots, CI).
    webhook: str | None = None
    #: The server's address as users reach it (for absolute links in webhooks).
    public_url: str = ""

    @property
    def tmp(self) -> Path:
        return self.data / "tmp"

    @property
    def work(self) -> Path:
        return self.data / "work"


def default_db_url(data: Path) -> str:
    return f"sqlite:///{(data / 'index.sqlite3').resolve()}"


def tokens_from(values: tuple[str, ...] | list[str]) -> frozenset[str]:
    """Tokens from ``--token`` options and ``DDP_AUTOPSY_TOKEN`` (comma-separated)."""
    found = [t.strip() for v in values for t in v.split(",")]
    found += [t.strip() for t in os.environ.get("DDP_AUTOPSY_TOKEN", "").split(",")]
    return frozenset(t for t in found if t)
