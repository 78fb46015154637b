"""Redaction of secrets: everything a bundle holds, and every report, passes through here.

Three layers, applied to environments, command lines, py-spy output and copied logs:

* **by name** — an env var / ``key=value`` / ``--flag value`` whose name looks secret (TOKEN, KEY,
  SECRET, PASSWORD, CREDENTIAL, AUTH, SESSION, COOKIE, PRIVATE …) keeps its name, loses its value;
* **credentials in URLs** — ``scheme://user:pass@host`` → ``scheme://user:********@host``;
* **known token formats anywhere** — Hugging Face, GitHub, AWS access key ids, OpenAI/Anthropic
  style ``sk-`` keys, Slack, Google API keys, JWTs, bearer tokens, PEM private-key blocks.

>>> redact_text("HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123456789 url=https://bob:pw@h/x")
'HF_TOKEN=******** url=https://bob:********@h/x'
>>> redact_env({"MY_SECRET_KEY": "v", "MASTER_ADDR": "10.0.0.1"})
{'MY_SECRET_KEY': '********', 'MASTER_ADDR': '10.0.0.1'}
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "********"

# A name part equal to (or ending in) one of these marks the name secret: HF_TOKEN, WANDB_API_KEY,
# AWS_SECRET_ACCESS_KEY, DB_PASSWD, MY_APIKEY, X-Auth-Token, SESSION_ID …
_SECRET_PARTS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "PASS", "PWD", "CREDENTIAL",
                 "CREDENTIALS", "AUTH", "PRIVATE", "SESSION", "COOKIE", "APIKEY", "SIGNATURE")
# Substrings that mark a name secret even inside one word (MYSECRETVALUE, GITHUBTOKEN).
_SECRET_SUBSTRINGS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "APIKEY", "PRIVATEKEY")
# Names that match the heuristics but carry configuration the analyzer needs, not secrets.
_NOT_SECRET = frozenset({"PWD", "OLDPWD", "NCCL_IB_PKEY", "TORCHELASTIC_USE_AGENT_STORE"})

_NAME_SPLIT = re.compile(r"[^A-Za-z0-9]+")


@functools.lru_cache(maxsize=4096)
def is_secret_name(name: str) -> bool:
    """True for env/flag/config names whose value should never leave the host."""
    upper = name.strip("-").upper()
    if not upper or upper in _NOT_SECRET:
        return False
    if any(s in upper for s in _SECRET_SUBSTRINGS):
        return True
    return any(part in _SECRET_PARTS or part.endswith("KEY")
               for part in _NAME_SPLIT.split(upper) if part)


# Token formats, each led by a literal (fast to scan for) and run only when that literal occurs;
# a match preceded by a word character or "-" is left alone ("task-…" is not "sk-…").
_TOKENS = [(lit, re.compile(re.escape(lit) + rest)) for lit, rest in (
    ("hf_", r"[A-Za-z0-9]{30,}"),
    ("gh", r"[pousr]_[A-Za-z0-9]{30,}"),
    ("github_pat_", r"[A-Za-z0-9_]{22,}"),
    ("AKIA", r"[0-9A-Z]{16}(?![0-9A-Z])"),
    ("ASIA", r"[0-9A-Z]{16}(?![0-9A-Z])"),
    ("sk-", r"[A-Za-z0-9_\-]{20,}"),
    ("xox", r"[abposr]-[A-Za-z0-9\-]{10,}"),
    ("AIza", r"[0-9A-Za-z_\-]{35}"),
    ("glpat-", r"[A-Za-z0-9_\-]{20,}"),
    ("eyJ", r"[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),
)]
_BEARER = re.compile(r"(?i)(\b(?:bearer|basic)[ \t]+)([A-Za-z0-9._~+/\-]{8,}=*)")
_URL_CREDS = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@'\"]+:)([^@\s/'\"]+)(@)")
_PEM_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----")
_PEM_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----")

# Secret-named assignments in text. Both patterns start at a secret word, scanned for in
# ASCII-lower-cased text (fast; offsets unchanged), and reach to the end of the value; the start
# of the name is then found by looking left (_name_start), and the name judged as a whole.
_SECRET_WORDS = ("token", "secret", "pass", "pwd", "credential", "auth", "private", "session",
                 "cookie", "key", "signature")
_WORDS_RE = "(?:" + "|".join(_SECRET_WORDS) + ")"
#   name=value, name: value, "name": "value", --name=value
_ASSIGNMENT = re.compile(_WORDS_RE + r"""[a-z0-9_.\-]*(?P<q1>["']?)[ \t]*[=:][ \t]*["']?"""
                         r"""(?P<value>[^\s"',;&}\]]+)""")
#   --name value
_FLAG_VALUE = re.compile(_WORDS_RE + r"""[a-z0-9_\-]* +(?P<value>[^\s\-"'][^\s"']*)""")
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_.-")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
# Words that are secret-looking names on their own; other names need a separator (my_key, x-auth)
# so that plain prose ("key: rank_0", "session: 3") in logs is left alone.
_STRONG_WORDS = frozenset({"TOKEN", "SECRET", "PASSWORD", "PASSWD", "APIKEY", "CREDENTIALS",
                           "CREDENTIAL", "PRIVATEKEY"})


@functools.lru_cache(maxsize=4096)  # log lines repeat the same few names
def _text_name_is_secret(name: str) -> bool:
    bare = name.strip("-")
    if not is_secret_name(bare):
        return False
    return bare.upper() in _STRONG_WORDS or any(c in bare for c in "_.-")


def redact_text(text: str) -> str:
    """Mask secrets in free text (one line or many). Idempotent."""
    if not text:
        return text
    if _PEM_BEGIN.search(text):
        text, _ = _redact_pem(text, inside=False)
    return _redact_flat(text)


def _redact_flat(text: str) -> str:
    if "://" in text and "@" in text:
        text = _URL_CREDS.sub(lambda m: m[1] + MASK + m[3], text)
    for literal, pattern in _TOKENS:
        if literal in text:
            text = pattern.sub(_sub_token, text)
    lower = text.translate(_ASCII_LOWER)
    if "bearer" in lower or "basic" in lower:
        text = _BEARER.sub(lambda m: m[1] + MASK, text)
        lower = text.translate(_ASCII_LOWER)
    spans = _secret_values(lower)
    if not spans:
        return text
    parts, pos = [], 0
    for start, end in spans:
        parts += [text[pos:start], MASK]
        pos = end
    parts.append(text[pos:])
    return "".join(parts)


def _sub_token(m: re.Match[str]) -> str:
    before = m.string[m.start() - 1] if m.start() else " "
    return m[0] if before.isalnum() or before in "_-" else MASK


def _name_start(lower: str, i: int) -> int:
    while i > 0 and lower[i - 1] in _NAME_CHARS:
        i -= 1
    return i


def _secret_values(lower: str) -> list[tuple[int, int]]:
    """``(start, end)`` of the values of secret-named assignments and ``--flag value`` pairs."""
    if not any(word in lower for word in _SECRET_WORDS):
        return []
    spans = []
    for m in _ASSIGNMENT.finditer(lower):
        start = _name_start(lower, m.start())
        quote = m["q1"]
        if quote and (start == 0 or lower[start - 1] != quote):
            continue  # a closing quote without its opening one: not a quoted name
        if m["value"] != MASK and _text_name_is_secret(lower[start:m.start("q1")]):
            spans.append((m.start("value"), m.end("value")))
    for m in _FLAG_VALUE.finditer(lower):
        start = _name_start(lower, m.start())
        flag = lower[start:m.start("value")].rstrip(" ")
        if flag.startswith("-") and _text_name_is_secret(flag):
            spans.append((m.start("value"), m.end("value")))
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):  # an assignment and a flag may claim the same value
        if not merged or start >= merged[-1][1]:
            merged.append((start, end))
    return merged


def _redact_pem(text: str, inside: bool) -> tuple[str, bool]:
    """Mask the lines inside PEM private-key blocks; ``inside`` carries over between chunks."""
    out: list[str] = []
    for line in text.splitlines(keepends=True):
        if inside and _PEM_END.search(line):
            inside = False
            out.append(line)
        elif inside:
            out.append(MASK + ("\n" if line.endswith("\n") else ""))
        else:
            out.append(line)
            inside = bool(_PEM_BEGIN.search(line)) and not _PEM_END.search(line)
    return "".join(out), inside


class StreamRedactor:
    """Redaction of a file read in chunks of whole lines (a PEM block may span chunks).

    ``maybe_inside``: reading starts mid-file, possibly inside a PEM block; if an END line comes
    before any BEGIN line, everything up to it is masked.
    """

    def __init__(self, *, maybe_inside: bool = False) -> None:
        self._in_pem = False
        self._unknown = maybe_inside

    def __call__(self, chunk: str) -> str:
        if self._unknown:
            self._unknown = False
            end, begin = _PEM_END.search(chunk), _PEM_BEGIN.search(chunk)
            self._in_pem = bool(end and (not begin or end.start() < begin.start()))
        if self._in_pem or _PEM_BEGIN.search(chunk):
            chunk, self._in_pem = _redact_pem(chunk, self._in_pem)
        return _redact_flat(chunk)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Mask values of secret-named variables, then scrub the rest as text (URLs, tokens)."""
    return {k: MASK if is_secret_name(k) else redact_text(v) for k, v in env.items()}


def redact_argv(argv: Iterable[str]) -> list[str]:
    """Mask secrets in a command line, including ``--token VALUE`` split over two arguments."""
    out: list[str] = []
    mask_next = False
    for arg in argv:
        if mask_next:
            out.append(MASK)
            mask_next = False
            continue
        if arg.startswith("-") and "=" not in arg and _text_name_is_secret(arg):
            mask_next = True
            out.append(arg)
            continue
        out.append(redact_text(arg))
    return out


def redact_obj(obj: Any) -> Any:
    """Apply :func:`redact_text` to every string inside a JSON-able object, and mask the values of
    secret-named keys."""
    if isinstance(obj, str):
        return redact_text(obj)
    if isinstance(obj, Mapping):
        return {k: (MASK if isinstance(v, str) and isinstance(k, str) and is_secret_name(k)
                    and k not in _JSON_KEYS_KEPT else redact_obj(v))
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_obj(v) for v in obj]
    return obj


# Keys of our own JSON documents that match the heuristics but hold no secret.
_JSON_KEYS_KEPT = frozenset({"key", "session", "pass"})
