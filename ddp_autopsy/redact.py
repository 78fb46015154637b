"""Redaction of secrets: one engine for bundles, reports and (on request) the terminal.

The engine finds *spans* of secret text in a line and replaces each with ``********``; names,
keys, flags, URL hosts and everything around a secret stay, so redacted logs remain evidence.
Detectors, each gated by a cheap substring test (docs/redaction.md has the full policy):

* **names** — ``NAME=value``, ``"name": "value"``, ``--flag value``, ``['--flag', 'value']``,
  ``password 'value'``: the value goes when the name is secret (:func:`is_secret_name`: whole
  segments such as TOKEN, PASSWORD, SECRET, API_KEY, AUTH — not ``TOKENIZERS_PARALLELISM``,
  ``num_tokens``, ``SSH_AUTH_SOCK`` or ``tokenization_utils_base.py:2345``);
* **URLs** — ``scheme://user:pass@host`` (empty user, ``/`` or ``@`` in the password),
  ``https://TOKEN@host`` (a long user part), secret query parameters (``?token=``, ``&sig=``);
* **headers** — ``Authorization: <scheme> X``, ``Bearer X``, ``Basic X``, ``Cookie: a=X; b=Y``;
* **token formats** of secret scanners — AWS key ids, GitHub, GitLab, Slack, Stripe, Hugging
  Face, OpenAI / Anthropic, Google, npm, PyPI, SendGrid, Databricks, DigitalOcean, JWTs;
* **commands** — ``mysql -pX`` (mysql family only), ``curl -u user:pw``, ``docker login -p X``,
  ``sshpass -p X``, ``wandb login KEY``;
* **private keys** — PEM blocks over many lines, or on one line (``repr()`` with literal ``\\n``,
  JSON ``"private_key": "-----BEGIN…"``).

>>> redact_text("HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123456789 url=https://bob:pw@h/x")
'HF_TOKEN=******** url=https://bob:********@h/x'
>>> redact_text("tokenization_utils_base.py:2345 tokens_per_sec=1234.5 TOKENIZERS_PARALLELISM=1")
'tokenization_utils_base.py:2345 tokens_per_sec=1234.5 TOKENIZERS_PARALLELISM=1'
>>> redact_env({"MY_SECRET_KEY": "v", "MASTER_ADDR": "10.0.0.1"})
{'MY_SECRET_KEY': '********', 'MASTER_ADDR': '10.0.0.1'}
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

MASK = "********"
Span = tuple[int, int]
T = TypeVar("T")

# --------------------------------------------------------------------------------------- names

# A name is cut into segments at separators and camelCase humps: WANDB_API_KEY -> WANDB API KEY,
# _authToken -> auth Token, AccountKey -> Account Key. Whole segments decide, never substrings.
_SEGMENT = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
# Any segment: the name is secret (AWS_SECRET_ACCESS_KEY, DB_PASSWORD_HASH, SENTRY_DSN).
_ALWAYS = frozenset({
    "SECRET", "SECRETS", "PASSWORD", "PASSWORDS", "PASSWD", "PASSPHRASE", "CREDENTIAL",
    "CREDENTIALS", "APIKEY", "APIKEYS", "PRIVATEKEY", "ACCESSKEY", "SECRETKEY", "ACCOUNTKEY",
    "AUTHTOKEN", "ACCESSTOKEN", "REFRESHTOKEN", "SESSIONID", "SESSIONTOKEN", "DSN", "CONNSTR",
    "CONNECTIONSTRING", "CLIENTSECRET"})
# One word with no separator ending so: GITHUBTOKEN, DBPASSWORD, MYSECRET.
_COMPOUND_ENDS = ("TOKEN", "PASSWORD", "PASSWD", "SECRET", "APIKEY")
# As the last segment: DB_PASS, X-Auth-Token, SESSION_COOKIE, NPM_AUTH, X-Amz-Signature.
_LAST = frozenset({"TOKEN", "PASS", "PWD", "COOKIE", "COOKIES", "SIGNATURE", "AUTH",
                   "AUTHORIZATION"})
# TOKEN after these names a vocabulary item, not a credential (pad_token, eos_token).
_TOKEN_KINDS = frozenset({
    "PAD", "BOS", "EOS", "UNK", "SEP", "CLS", "MASK", "START", "END", "SPECIAL", "NEXT", "PREV",
    "FIRST", "LAST", "NEW", "MAX", "MIN", "NUM", "IMAGE", "VIDEO", "AUDIO", "DECODER", "ENCODER",
    "EOT", "BOI", "EOI", "NEWLINE", "SYSTEM", "ADDITIONAL", "IGNORE", "GENERATION", "CHAT",
    "OUTPUT", "INPUT", "PROMPT", "TOOL", "THINK", "SPACE", "BLANK", "DEFAULT"})
# KEY is secret after these (API_KEY, ACCOUNT_KEY); in free text only after these, in an
# environment after anything but _KEY_HARMLESS (OPENAI_KEY is a secret, CACHE_KEY is not).
_KEY_KINDS = frozenset({
    "API", "ACCESS", "SECRET", "PRIVATE", "ACCOUNT", "ENCRYPTION", "SIGNING", "CLIENT", "AUTH",
    "LICENSE", "SERVICE", "SHARED", "SUBSCRIPTION", "STORAGE", "DEPLOY", "SSH", "APP", "ADMIN",
    "HMAC", "AES", "SESSION", "WEBHOOK", "INGESTION", "MASTER", "ROOT", "SIGNATURE"})
_KEY_HARMLESS = frozenset({
    "CACHE", "SORT", "PRIMARY", "FOREIGN", "PARTITION", "LOOKUP", "HASH", "DICT", "MAP", "GROUP",
    "RANK", "STORE", "INDEX", "SHARD", "SEED", "PUBLIC", "ROUTING", "UNIQUE", "JOIN", "METRIC",
    "DATASET", "CONFIG", "STATE", "RESUME", "CHECKPOINT", "MODEL", "PREFIX", "SPLIT", "COLUMN",
    "FIELD", "LABEL", "INPUT", "OUTPUT", "TEXT", "IMAGE", "BATCH", "DATA", "LOG", "HOT", "NO"})
# A last segment that makes the value a path, a switch or a size, not the secret itself:
# TOKEN_FILE, SSH_AUTH_SOCK, AUTH_TYPE, PASSWORD_FILE, pad_token_id, MAX_TOKENS_LEN.
_HARMLESS_LAST = frozenset({
    "FILE", "FILES", "PATH", "DIR", "SOCK", "SOCKET", "TYPE", "ID", "IDS", "COUNT", "LEN",
    "LENGTH", "SIZE", "NUM", "ENABLED", "ENABLE", "MODE", "NAME", "HOST", "PORT", "LIMIT",
    "FORMAT", "PARALLELISM", "LOCATION", "METHOD", "PROVIDER", "PLUGIN", "ENDPOINT", "REGION",
    "EXPIRY", "EXPIRES", "EXPIRATION", "TTL", "TIMEOUT", "LEVEL", "STRATEGY", "HEADER"})
_NOT_SECRET = frozenset({"PWD", "OLDPWD", "NCCL_IB_PKEY", "TORCHELASTIC_USE_AGENT_STORE"})
# Single words that are secret names on their own in free text (``token=…``); the others
# (``key:``, ``auth=``, ``pass``) need a compound name or a flag's dash.
_STRONG_WORDS = frozenset({"TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "APIKEY",
                           "CREDENTIALS", "CREDENTIAL", "PRIVATEKEY", "DSN", "AUTHTOKEN",
                           "ACCESSTOKEN", "CLIENTSECRET"})
# file.ext:NNN is a source location, however secret the file name sounds.
_FILE_EXTS = frozenset({
    "py", "pyx", "pyi", "pyc", "c", "cc", "cpp", "cxx", "h", "hpp", "cu", "cuh", "so", "rs", "go",
    "java", "js", "ts", "log", "txt", "json", "yaml", "yml", "toml", "cfg", "ini", "sh", "out",
    "err", "md", "csv", "pt", "pth", "bin", "ckpt", "safetensors", "pkl", "pem", "key", "crt"})


def _segments(name: str) -> list[str]:
    return [s.upper() for s in _SEGMENT.findall(name)]


@functools.lru_cache(maxsize=8192)
def is_secret_name(name: str, strict: bool = False) -> bool:
    """True for env/flag/config names whose value should never leave the host.

    ``strict`` (free text, JSON keys): ``X_KEY`` only for the key kinds (API, ACCESS, PRIVATE…);
    otherwise (environment variables) any ``X_KEY`` but CACHE_KEY, SORT_KEY….
    """
    bare = name.strip().strip("-\"'")
    if not bare or bare.upper() in _NOT_SECRET:
        return False
    segs = _segments(bare)
    if not segs:
        return False
    last, prev = segs[-1], (segs[-2] if len(segs) > 1 else "")
    if last in _HARMLESS_LAST:
        return prev == "SESSION" and last == "ID"
    if any(s in _ALWAYS or (s.endswith(_COMPOUND_ENDS) and s not in _LAST) for s in segs):
        return True
    if last == "TOKEN":
        return prev not in _TOKEN_KINDS
    if last in _LAST or (segs[0] == "AUTH" and len(segs) > 1):
        return True
    if segs[-2:] in (["CONNECTION", "STRING"], ["SESSION", "ID"]):
        return True
    if last in ("KEY", "KEYS") and prev:
        return prev in _KEY_KINDS if strict else prev not in _KEY_HARMLESS
    return False


@functools.lru_cache(maxsize=8192)  # log lines repeat the same few names
def _text_name_is_secret(name: str, flag: bool = False) -> bool:
    """A name met in free text: strict, a file name is not a name, and a lone weak word
    (``key``, ``auth``, ``pass``) counts only as a flag (``--pass``)."""
    bare = name.lstrip("-")
    if "." in bare and bare.rsplit(".", 1)[1].lower() in _FILE_EXTS:
        return False
    if not is_secret_name(bare, strict=True):
        return False
    segs = _segments(bare)
    return flag or len(segs) > 1 or segs[0] in _STRONG_WORDS


# ------------------------------------------------------------------------------ detectors

# Token formats, each led by a literal (scanned for first) and masked only when not glued to a
# word before it ("task-…" is not "sk-…").
_TOKENS: list[tuple[tuple[str, ...], re.Pattern[str]]] = [
    (lits, re.compile(rx)) for lits, rx in (
        (("hf_",), r"hf_[A-Za-z0-9]{30,}"),
        (("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), r"gh[pousr]_[A-Za-z0-9]{30,}"),
        (("github_pat_",), r"github_pat_[A-Za-z0-9_]{22,}"),
        (("gl",), r"gl(?:pat|dt|rt|ptt|cbt|soat|ft|imt|agent)-[A-Za-z0-9_\-]{20,}"),
        (("AKIA", "ASIA", "ABIA", "ACCA", "AGPA", "AIDA", "AROA", "AIPA", "ANPA", "ANVA",
          "APKA"), r"A(?:KIA|SIA|BIA|CCA|GPA|IDA|ROA|IPA|NPA|NVA|PKA)[0-9A-Z]{16}(?![0-9A-Za-z])"),
        (("sk_", "rk_"), r"[sr]k_(?:live|test)_[A-Za-z0-9]{16,}"),
        (("sk-",), r"sk-[A-Za-z0-9_\-]{20,}"),
        (("xox", "xapp-"), r"(?:xox[abposr]|xapp)-[A-Za-z0-9\-]{10,}"),
        (("AIza",), r"AIza[0-9A-Za-z_\-]{35}"),
        (("ya29.",), r"ya29\.[0-9A-Za-z_\-]{20,}"),
        (("eyJ",), r"eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),
        (("npm_",), r"npm_[A-Za-z0-9]{36,}"),
        (("pypi-",), r"pypi-AgE[A-Za-z0-9_\-]{50,}"),
        (("SG.",), r"SG\.[A-Za-z0-9_\-]{22}\.[A-Za-z0-9_\-]{43}"),
        (("dapi",), r"dapi[a-f0-9]{32}(?:-\d)?"),
        (("_v1_",), r"do[opr]_v1_[a-f0-9]{64}"),
        (("shp",), r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}"),
    )]

# scheme://[user]:password@host — the password may hold "/", ":" or "@" (the last "@" before
# the host ends it); "host:8080/path@x" is a port and a path, not a password.
_URL_CREDS = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://(?P<user>[^/\s:@'\"<>]*):"
                        r"(?P<pw>[^\s'\"<>]*)@(?=[A-Za-z0-9\[_])")
# scheme://TOKEN@host: a long user part with no password is a token (git remotes, Sentry DSNs).
_URL_TOKEN = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://(?P<tok>[A-Za-z0-9_.~%\-]{16,})@"
                        r"(?=[A-Za-z0-9\[])")
_URL_QUERY = re.compile(r"[?&](?P<name>[A-Za-z0-9_.\-]+)=(?P<value>[^&;\s\"'#<>]+)")
_QUERY_SECRETS = frozenset({"sig", "signature", "key", "code", "access_token", "token"})
_AUTH_HEADER = re.compile(
    r"(?i)\b(?:proxy-)?authori[sz]ation[\"']?[ \t]*[:=][ \t]*[\"']?"
    r"(?:(?:bearer|basic|token|negotiate|ntlm|sso-key|key|apikey|gitlab-token|splunk|otp)"
    r"[ \t]+)?(?P<value>(?:digest|aws4-hmac-sha256)[ \t][^\"'\r\n\\]*|[^\s\"',\\]+)")
_BEARER = re.compile(r"(?i)\bbearer[ \t]+(?P<value>[A-Za-z0-9._~+/\-]{8,}=*)")
_BASIC = re.compile(r"\b[Bb]asic[ \t]+(?P<value>[A-Za-z0-9+/]{8,}={0,2})(?![A-Za-z0-9+/=])")
_COOKIE = re.compile(r"(?i)\b(?:set-)?cookie[\"']?[ \t]*:[ \t]*[\"']?(?P<value>[^\"'\r\n]+)")
_COOKIE_PAIR = re.compile(r"(?P<name>[^=;,\s]+)=(?P<value>[^;,\s]*)")
_COOKIE_ATTRS = frozenset({"path", "domain", "expires", "max-age", "samesite", "priority"})
_PEM_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")
_PEM_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----")
# The rest of a line a PEM header shares (one-line PEM): up to END, a quote or the line's end.
_PEM_INLINE = re.compile(r"(?P<body>.*?)(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|"
                         r"(?=[\"'])|$)", re.M)
# Commands whose short flag carries a password.
_MYSQL = re.compile(r"\b(?:mysql|mysqldump|mysqladmin|mysqlimport|mysqlshow|mysqlcheck|mysqlpump|"
                    r"mysqlsh|mariadb|mariadb-dump|mariadb-admin)\b(?P<args>[^|;&\n]*)")
_MYSQL_P = re.compile(r"(?:^|(?<=[\s'\"]))-p(?P<value>[^\s'\"]+)")
_CURL = re.compile(r"\bcurl\b(?P<args>[^|;&\n]*)")
_CURL_USER = re.compile(r"(?:^|(?<=[\s'\"]))(?:-u|-U|--user|--proxy-user)(?:[ \t=]+|(?=\S))[\"']?"
                        r"[^\s:'\"]*:(?P<value>[^\s'\"]+)")
_P_CMDS = re.compile(r"\b(?:docker(?:[ \t]+\S+)?[ \t]+login|sshpass|podman[ \t]+login|"
                     r"helm[ \t]+registry[ \t]+login)\b(?P<args>[^|;&\n]*)")
_DASH_P = re.compile(r"(?:^|(?<=[\s'\"]))-p(?:[ \t]+|(?=[^\s-]))[\"']?(?P<value>[^\s'\"]+)")
_WANDB_LOGIN = re.compile(r"\bwandb[ \t]+login(?:[ \t]+--?[\w-]+)*[ \t]+[\"']?"
                          r"(?P<value>[A-Za-z0-9_\-]{20,})")

# Secret-named values. Scanning starts at a secret word in ASCII-lower-cased text (offsets
# unchanged); the name around it is then found and judged whole.
_SECRET_WORDS = ("token", "secret", "pass", "pwd", "credential", "auth", "key", "session",
                 "cookie", "signature", "dsn", "private")
_WORD = re.compile("|".join(_SECRET_WORDS))  # on lower-cased text
_NAME_TAIL = re.compile(r"[a-z0-9_.\-]*")
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_.-")
# The only characters beyond ASCII that lower-case into ASCII: the Kelvin sign and "İ" (into two
# characters, which would shift offsets); both ways of lower-casing agree on them.
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ\u212a\u0130",
                             "abcdefghijklmnopqrstuvwxyzki")


# After a name: =value, : value, "name": "value", --flag value, '--flag', 'value', name 'value'.
_AFTER_NAME = re.compile(
    r"""(?P<nq>["']?)[ \t]*(?:(?P<sep>:=|=>|[=:])|(?P<comma>,)|(?P<space>(?=[ \t])))[ \t]*"""
    r"""(?P<value>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|[^\s"',;&}\])]+)""")
# Prose: password 'x', the secret is "x", token "x" (a token only when it looks like one: not
# "unknown token '<pad>'").
_PROSE = re.compile(r"""(?i)(?<![\w-])(?P<word>password|passwd|passphrase|secret|token|"""
                    r"""api[ _-]?key)(?:[ \t]+(?:is|was|=|set[ \t]+to))?[ \t]+(?P<q>["'])"""
                    r"""(?P<value>(?:(?!(?P=q))[^\n\\]|\\.)+)(?P=q)""")


def _lower(text: str) -> str:
    """Lower-cased with offsets unchanged: str.lower (fast), or a table when "İ" occurs."""
    lower = text.lower()
    return lower if len(lower) == len(text) else text.translate(_ASCII_LOWER)


def _word_spans(text: str, lower: str) -> Iterator[Span]:
    """Values of secret-named assignments and flags (``lower``: ``text`` lower-cased)."""
    pos = 0
    for m in _WORD.finditer(lower):
        start = m.start()
        if start < pos:
            continue  # inside the name just judged
        while start > 0 and lower[start - 1] in _NAME_CHARS:
            start -= 1
        tail = _NAME_TAIL.match(lower, m.end())
        end = pos = tail.end() if tail else m.end()
        name = text[start:end].rstrip(".-") or text[start:end]
        if not _text_name_is_secret(name, True):
            continue  # not even as a flag (most names: tokens_per_sec, cache_key)
        end = start + len(name)
        after = _AFTER_NAME.match(text, end)
        if after is None:
            continue
        value_start, value_end = after.span("value")
        value = after["value"]
        if value[0] in "\"'":
            value_start, value_end = value_start + 1, value_end - 1
            value = value[1:-1]
        flag = name.startswith("-")
        quote = after["nq"]
        if quote and (start == 0 or text[start - 1] != quote):
            continue  # a closing quote with no opening one: not a quoted name
        if after["sep"]:
            if after["sep"] == ":" and value.isdigit() and "." in name:
                continue  # file.py:123
            if not _text_name_is_secret(name, flag):
                continue
        else:  # a comma or a space
            if flag:  # --password x, '--password', 'x'
                if value.startswith("-") or not _text_name_is_secret(name, True):
                    continue
            else:
                continue  # prose (password 'x') is _PROSE's
        yield value_start, value_end


def _token_spans(text: str) -> Iterator[Span]:
    for literals, pattern in _TOKENS:
        if any(lit in text for lit in literals):
            for m in pattern.finditer(text):
                before = text[m.start() - 1] if m.start() else " "
                if not (before.isalnum() or before in "_-"):
                    yield m.span()


def _url_spans(text: str) -> Iterator[Span]:
    if "@" in text:
        for m in _URL_CREDS.finditer(text):
            pw = m["pw"]
            if pw and not re.match(r"\d+/", pw):  # host:8080/path@x
                yield m.span("pw")
        for m in _URL_TOKEN.finditer(text):
            yield m.span("tok")
    if "=" in text and ("?" in text or "&" in text):
        for m in _URL_QUERY.finditer(text):
            name = m["name"]
            if name.lower() in _QUERY_SECRETS or _text_name_is_secret(name):
                yield m.span("value")


def _header_spans(text: str, lower: str) -> Iterator[Span]:
    if "asic" in text:
        for m in _BASIC.finditer(text):
            value = m["value"]
            # base64, not a word ("Basic configuration"): digits, padding, +/ or inner capitals
            if any(c.isdigit() or c in "+/=" for c in value) or not value[1:].islower():
                yield m.span("value")
    if "authori" not in lower and "bearer" not in lower and "cookie" not in lower:
        return
    for m in _AUTH_HEADER.finditer(text):
        yield m.start("value"), len(m["value"].rstrip()) + m.start("value")
    for m in _BEARER.finditer(text):  # a token, not a word ("Bearer authentication")
        value = m["value"]
        if len(value) >= 16 or not value.isalpha() or not value.islower():
            yield m.span("value")
    for m in _COOKIE.finditer(text):
        at = m.start("value")
        for pair in _COOKIE_PAIR.finditer(m["value"]):
            if pair["name"].lower() not in _COOKIE_ATTRS and pair["value"]:
                yield at + pair.start("value"), at + pair.end("value")


def _command_spans(text: str) -> Iterator[Span]:
    if "mysql" in text or "mariadb" in text:
        for m in _MYSQL.finditer(text):
            for p in _MYSQL_P.finditer(m["args"]):
                yield m.start("args") + p.start("value"), m.start("args") + p.end("value")
    if "curl" in text:
        for m in _CURL.finditer(text):
            for u in _CURL_USER.finditer(m["args"]):
                yield m.start("args") + u.start("value"), m.start("args") + u.end("value")
    if "login" in text or "sshpass" in text:
        for m in _P_CMDS.finditer(text):
            for p in _DASH_P.finditer(m["args"]):
                yield m.start("args") + p.start("value"), m.start("args") + p.end("value")
        for m in _WANDB_LOGIN.finditer(text):
            yield m.span("value")


def _pem_inline_spans(text: str) -> Iterator[Span]:
    for m in _PEM_BEGIN.finditer(text):
        body = _PEM_INLINE.match(text, m.end())
        if body is not None and any(c.isalnum() for c in body["body"].replace("\\n", "")):
            yield body.span("body")


def _find_spans(text: str) -> list[Span]:
    """Secret spans of one line (or several: no detector crosses a line end), merged."""
    spans: list[Span] = []
    lower = _lower(text)
    if "-----BEGIN" in text:
        spans += _pem_inline_spans(text)
    spans += _url_spans(text)
    spans += _token_spans(text)
    spans += _header_spans(text, lower)
    spans += _command_spans(text)
    if any(word in lower for word in _SECRET_WORDS):
        spans += _word_spans(text, lower)
        for m in _PROSE.finditer(text):
            value = m["value"]
            if m["word"].lower() != "token" or (len(value) >= 16 and " " not in value):
                spans.append(m.span("value"))
    merged: list[Span] = []
    for start, end in sorted(spans):
        if end <= start or not text[start:end].strip("* \t"):
            continue  # empty, or already masked: redaction is idempotent
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _apply(text: str, spans: Iterable[Span]) -> str:
    parts, pos = [], 0
    for start, end in spans:
        parts += [text[pos:start], MASK]
        pos = end
    if not parts:
        return text
    parts.append(text[pos:])
    return "".join(parts)


def _redact_flat(text: str) -> str:
    return _apply(text, _find_spans(text))


def _pem_lines(lines: Iterable[str], inside: bool) -> tuple[list[str], bool]:
    """Lines with PEM private-key bodies masked; ``inside`` carries over between chunks."""
    out: list[str] = []
    plain: list[str] = []  # lines away from any block, redacted together (much faster)
    for line in lines:
        if not inside and "-----BEGIN" not in line:
            plain.append(line)
            continue
        if plain:
            out.append(_redact_flat("".join(plain)))
            plain = []
        if inside and not _PEM_END.search(line):
            out.append(MASK + line[len(line.rstrip("\r\n")):])
            continue
        if inside:  # the END line: whatever precedes the marker is key material
            end = _PEM_END.search(line)
            assert end is not None
            head = line[:end.start()]
            out.append((MASK if head.strip(" \t*\"'") else head) + _redact_flat(line[end.start():]))
            inside = False
            continue
        out.append(_redact_flat(line))
        # a block starts when its header ends the line (one-line PEMs are masked in place)
        headers = list(_PEM_BEGIN.finditer(line))
        inside = bool(headers) and not line[headers[-1].end():].strip(" \t\r\n\"',\\")
    if plain:
        out.append(_redact_flat("".join(plain)))
    return out, inside


def _split_lines(text: str) -> list[str]:
    """Lines cut at newlines only, ends kept (str.splitlines also cuts at form feeds, U+2028…)."""
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


def redact_text(text: str) -> str:
    """Mask secrets in free text (one line or many). Idempotent."""
    if not text:
        return text
    if "-----BEGIN" not in text:
        return _redact_flat(text)
    return "".join(_pem_lines(_split_lines(text), inside=False)[0])


# ------------------------------------------------------------------------------ streaming


class StreamRedactor:
    """Redaction of a file read in chunks of any size: feed chunks, then :meth:`flush`.

    Complete lines are redacted and returned; the last, unfinished line waits for the next chunk,
    so no secret is cut by a chunk boundary and a PEM block may span any number of chunks. A line
    longer than ``max_line`` is let out in pieces: each piece is redacted with the ``context``
    characters before it, ``hold`` characters stay back for the next piece, and a secret value
    running into the next piece is masked on there to its end.

    ``maybe_inside``: reading starts mid-file, possibly inside a PEM block; if an END line comes
    before any BEGIN line, everything up to it is masked.
    """

    def __init__(self, *, maybe_inside: bool = False, max_line: int = 1 << 20,
                 hold: int = 64 << 10, context: int = 4096) -> None:
        self._in_pem = False
        self._unknown = maybe_inside
        self._pending = ""  # an unfinished line
        self._context = ""  # the raw text already let out of a long line
        self._open = False  # the last piece of a long line ended inside a secret
        self._max_line, self._hold, self._context_len = max_line, max(hold, 1), context

    def __call__(self, chunk: str) -> str:
        text = self._pending + chunk
        cut = text.rfind("\n") + 1
        out = self._lines(text[:cut]) if cut else ""
        self._pending = text[cut:]
        if len(self._pending) > self._max_line:
            out += self._piece(len(self._pending) - self._hold)
        return out

    def flush(self) -> str:
        """The unfinished last line, redacted (at the end of the input)."""
        return self._piece(len(self._pending)) if self._pending else ""

    def _lines(self, text: str) -> str:
        if self._context:  # the end of a long line let out in pieces
            first = text.index("\n") + 1
            self._pending = text[:first]
            head = self._piece(first)
            return head + self._lines(text[first:]) if text[first:] else head
        self._settle(text)
        if not self._in_pem and "-----BEGIN" not in text:
            return _redact_flat(text)
        lines, self._in_pem = _pem_lines(_split_lines(text), self._in_pem)
        return "".join(lines)

    def _settle(self, text: str) -> None:
        """Reading began mid-file: inside a PEM block when its END comes before any BEGIN."""
        if self._unknown:
            self._unknown = False
            end, begin = _PEM_END.search(text), _PEM_BEGIN.search(text)
            self._in_pem = bool(end and (not begin or end.start() < begin.start()))

    def _piece(self, cut: int) -> str:
        """Let out ``pending[:cut]`` of a long line, redacted with the context before it."""
        piece, self._pending = self._pending[:cut], self._pending[cut:]
        self._settle(piece)
        if self._in_pem:
            masked, self._in_pem = _pem_lines([piece], True)
            return "".join(masked)
        ctx = self._context
        text = ctx + piece + self._pending[:self._hold]  # what follows decides a value's end
        spans = []
        if self._open:  # a value cut at the previous piece goes on to its first delimiter
            run = re.match(r"[^\s\"'<>]*", text[len(ctx):])
            assert run is not None
            spans.append((len(ctx), len(ctx) + run.end()))
        spans += _find_spans(text)
        lo, hi = len(ctx), len(ctx) + len(piece)
        mine = [(max(s, lo) - lo, min(e, hi) - lo) for s, e in spans if e > lo and s < hi]
        self._open = any(e > hi for s, e in spans if s < hi)
        ends_line = piece.endswith("\n")
        self._context = "" if ends_line else (ctx + piece)[-self._context_len:]
        if ends_line:
            self._open = False
        merged: list[Span] = []
        for s, e in sorted(mine):
            if merged and s <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], e))
            elif e > s:
                merged.append((s, e))
        return _apply(piece, merged)


# --------------------------------------------------------------------- structured values


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Mask values of secret-named variables, then scrub the rest as text (URLs, tokens)."""
    return {k: MASK if is_secret_name(k) else redact_text(v) for k, v in env.items()}


_MYSQL_PROGS = re.compile(r"(?:mysql\w*|mariadb[\w-]*)")


def _mask_all(arg: str) -> str:
    return MASK


def _mask_password(arg: str) -> str:
    """``user:password`` -> ``user:********``."""
    return arg.split(":", 1)[0] + ":" + MASK if ":" in arg else arg


def redact_argv(argv: Iterable[str]) -> list[str]:
    """Mask secrets in a command line: ``--token VALUE`` over two arguments, ``-pVALUE`` of the
    mysql family, ``curl -u user:pw``, and every argument as text."""
    args = list(argv)
    prog = args[0].rsplit("/", 1)[-1] if args else ""
    mysql = bool(_MYSQL_PROGS.fullmatch(prog))
    curl = prog == "curl"
    login = prog == "sshpass" or (prog in ("docker", "podman") and "login" in args[1:3])
    out: list[str] = []
    mask_next: Callable[[str], str] | None = None
    for i, arg in enumerate(args):
        if mask_next is not None:
            out.append(mask_next(arg))
            mask_next = None
            continue
        if arg.startswith("-") and "=" not in arg and i and _text_name_is_secret(arg, True):
            mask_next = _mask_all
        elif curl and arg in ("-u", "--user", "-U", "--proxy-user"):
            mask_next = _mask_password
        elif login and arg == "-p":
            mask_next = _mask_all
        elif mysql and arg.startswith("-p") and len(arg) > 2:
            out.append("-p" + MASK)
            continue
        elif curl and arg.startswith(("-u", "-U")) and ":" in arg:
            out.append(arg[:2] + _mask_password(arg[2:]))
            continue
        out.append(redact_text(arg))
    return out


def redact_obj(obj: Any) -> Any:
    """Apply :func:`redact_text` to every string inside a JSON-able object, and mask the values of
    secret-named keys."""
    if isinstance(obj, str):
        return redact_text(obj)
    if isinstance(obj, Mapping):
        return {k: (MASK if isinstance(v, str) and isinstance(k, str) and v
                    and k not in _JSON_KEYS_KEPT and is_secret_name(k, strict=True)
                    else redact_obj(v))
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_obj(v) for v in obj]
    return obj


def redact_fields(obj: T) -> T:
    """A copy of a dataclass instance (a finding, its evidence…) with every string inside its
    fields redacted; other objects are returned as they are."""
    if isinstance(obj, str):
        return redact_text(obj)  # type: ignore[return-value]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: redact_fields(getattr(obj, f.name))
                   for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact_fields(v) for v in obj)  # type: ignore[return-value]
    if isinstance(obj, Mapping):
        return redact_obj(obj)  # type: ignore[no-any-return]
    return obj


# Keys of our own JSON documents that match the heuristics but hold no secret.
_JSON_KEYS_KEPT = frozenset({"key", "session", "pass"})


def redact_analysis(analysis: T) -> T:
    """A copy of an analysis (``rules.engine.Analysis``) whose findings and rule outcomes —
    summaries, evidence lines, details — are redacted; the job itself is shared, not copied."""
    return dataclasses.replace(  # type: ignore[type-var]
        analysis, findings=[redact_fields(f) for f in analysis.findings],  # type: ignore[attr-defined]
        outcomes=[redact_fields(o) for o in analysis.outcomes])  # type: ignore[attr-defined]
