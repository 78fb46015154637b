"""Redaction of secrets at collection time: everything the bundle holds passes through here.

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


def is_secret_name(name: str) -> bool:
    """True for env/flag/config names whose value should never leave the host."""
    upper = name.strip("-").upper()
    if not upper or upper in _NOT_SECRET:
        return False
    if any(s in upper for s in _SECRET_SUBSTRINGS):
        return True
    return any(part in _SECRET_PARTS or part.endswith("KEY")
               for part in _NAME_SPLIT.split(upper) if part)


# Token formats, each bounded on the left so that e.g. "task-…" is not read as "sk-…".
_B = r"(?<![A-Za-z0-9_\-])"
_TOKEN_PATTERNS = [
    _B + r"hf_[A-Za-z0-9]{30,}",
    _B + r"gh[pousr]_[A-Za-z0-9]{30,}",
    _B + r"github_pat_[A-Za-z0-9_]{22,}",
    _B + r"(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Z])",
    _B + r"sk-[A-Za-z0-9_\-]{20,}",
    _B + r"xox[abposr]-[A-Za-z0-9\-]{10,}",
    _B + r"AIza[0-9A-Za-z_\-]{35}",
    _B + r"glpat-[A-Za-z0-9_\-]{20,}",
    _B + r"eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
]
_TOKENS = re.compile("|".join(_TOKEN_PATTERNS))
_BEARER = re.compile(r"(?i)(\b(?:bearer|basic)\s+)([A-Za-z0-9._~+/\-]{8,}=*)")
_URL_CREDS = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@'\"]+:)([^@\s/'\"]+)(@)")
# name=value / name: value / "name": "value"; the name check is done in _sub_assignment.
_ASSIGNMENT = re.compile(
    r"""(?P<q1>["']?)(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)(?P=q1)(?P<sep>[ \t]*(?:=|:)[ \t]*)"""
    r"""(?P<q2>["']?)(?P<value>[^\s"',;&}\]]+)"""
)
# --hf-token VALUE (value separated by a space: the "=" form is handled by _ASSIGNMENT)
_FLAG_VALUE = re.compile(
    r"""(?P<flag>(?<![\w-])--?[A-Za-z][A-Za-z0-9_\-]*)(?P<sep> +)(?P<value>[^\s\-"'][^\s"']*)""")
_PEM_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----")
_PEM_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----")
# Words that are secret-looking names on their own; other names need a separator (my_key, x-auth)
# so that plain prose ("key: rank_0", "session: 3") in logs is left alone.
_STRONG_WORDS = frozenset({"TOKEN", "SECRET", "PASSWORD", "PASSWD", "APIKEY", "CREDENTIALS",
                           "CREDENTIAL", "PRIVATEKEY"})


def _text_name_is_secret(name: str) -> bool:
    bare = name.strip("-")
    if not is_secret_name(bare):
        return False
    return bare.upper() in _STRONG_WORDS or bool(re.search(r"[_.\-]", bare))


def _sub_assignment(m: re.Match[str]) -> str:
    if not _text_name_is_secret(m["name"]) or m["value"] == MASK:
        return m[0]
    return f"{m['q1']}{m['name']}{m['q1']}{m['sep']}{m['q2']}{MASK}"


def _sub_flag(m: re.Match[str]) -> str:
    if not _text_name_is_secret(m["flag"]):
        return m[0]
    return f"{m['flag']}{m['sep']}{MASK}"


def redact_text(text: str) -> str:
    """Mask secrets in free text (one line or many). Idempotent."""
    if not text:
        return text
    if _PEM_BEGIN.search(text):
        text, _ = _redact_pem(text, inside=False)
    return _redact_flat(text)


def _redact_flat(text: str) -> str:
    text = _URL_CREDS.sub(lambda m: m[1] + MASK + m[3], text)
    text = _TOKENS.sub(MASK, text)
    text = _BEARER.sub(lambda m: m[1] + MASK, text)
    text = _ASSIGNMENT.sub(_sub_assignment, text)
    return _FLAG_VALUE.sub(_sub_flag, text)


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
    """Redaction of a file read in chunks of whole lines (a PEM block may span chunks)."""

    def __init__(self) -> None:
        self._in_pem = False

    def __call__(self, chunk: str) -> str:
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
