"""Server settings: one frozen dataclass built from the command line and the environment."""

from __future__ import annotations

import os
import re
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
    #: (token, project) pairs from the command line; tokens in the index carry their own.
    tokens: frozenset[tuple[str, str]]
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


DEFAULT_PROJECT = "default"
#: A project's name: what ``--token PROJECT:TOKEN``, ``--project`` and a share accept.
PROJECT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def project_token(value: str) -> tuple[str, str]:
    """``PROJECT:TOKEN`` -> (token, project); a bare token (no ``:``) is the default project's.

    A token that itself holds ``:`` is given with its project: ``default:a:b``."""
    project, sep, token = value.partition(":")
    if not sep:
        return value, DEFAULT_PROJECT
    if not PROJECT_RE.match(project) or not token:
        raise ValueError(f"--token {project}:...: not PROJECT:TOKEN (a project is letters, "
                         "digits, '.', '_' and '-', at most 64)")
    return token, project


def tokens_from(values: tuple[str, ...] | list[str]) -> frozenset[tuple[str, str]]:
    """(token, project) from ``--token`` options and ``DDP_AUTOPSY_TOKEN`` (comma-separated)."""
    found = [t.strip() for v in values for t in v.split(",")]
    found += [t.strip() for t in os.environ.get("DDP_AUTOPSY_TOKEN", "").split(",")]
    return frozenset(project_token(t) for t in found if t)
