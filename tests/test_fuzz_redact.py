"""Property tests of the redactor (hypothesis): on any text it never raises, is idempotent, grows
a line by no more than its masks, streams to the same result however the text is cut, and a
planted secret inside random text is masked. A few seconds in CI."""

from __future__ import annotations

import importlib.util
import itertools
import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddp_autopsy.redact import MASK, StreamRedactor, redact_argv, redact_obj, redact_text

_SPEC = importlib.util.spec_from_file_location(
    "redaction_score", Path(__file__).resolve().parent.parent / "scripts" / "redaction_score.py")
assert _SPEC is not None and _SPEC.loader is not None
score = importlib.util.module_from_spec(_SPEC)
sys.modules.setdefault("redaction_score", score)
_SPEC.loader.exec_module(score)
SECRETS = score.load_secrets()
HARMLESS = [line for _, line in score.load_harmless()]

# Text made of the pieces detectors react to, glued at random, plus any characters at all.
PIECES = ["token", "TOKEN", "password", "pass", "key", "KEY", "auth", "Authorization", "Bearer",
          "Basic", "cookie", "Cookie:", "session", "secret", "api_key", "HF_TOKEN", "dsn", "=",
          ":", " ", "  ", "\t", "\n", "\r\n", "'", '"', ",", ";", "&", "?", "@", "/", "//", "://",
          "\\n", "\\", "-", "--", "-p", "_", ".", "*", MASK, "https://", "redis://:", "u:p@h",
          "mysql", "curl -u ", "docker login", "wandb login ", "-----BEGIN RSA PRIVATE KEY-----",
          "-----END RSA PRIVATE KEY-----", "-----BEGIN", "ghp_", "hf_", "sk-", "AKIA", "eyJ",
          "xoxb-", "glpat-", "AccountKey", "sig", "abcdefghijklmnopqrstuvwxyz0123456789",
          "ABCDEFGHIJKLMNOP", "0123456789", "é", "\x00", "\udcff", "\x0c", "\u212a", "\u0130",
          "[rank0]: ", ".py:12", "Bearer ", "Authorization: ", "Cookie: a="]
text_st = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=6)), max_size=40).map(
    "".join)
# REDACT_FUZZ_EXAMPLES=20000 for a longer hunt than CI's few seconds
FAST = settings(max_examples=int(os.environ.get("REDACT_FUZZ_EXAMPLES", "200")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(text_st)
def test_never_raises_idempotent_and_bounded(text: str) -> None:
    out = redact_text(text)
    assert redact_text(out) == out
    assert len(out) - len(text) <= out.count(MASK) * len(MASK)


@FAST
@given(text_st, st.lists(st.integers(min_value=0, max_value=400), max_size=6))
def test_streaming_equals_redacting_the_whole_text(text: str, cuts: list[int]) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c < len(text))})
    redact = StreamRedactor()
    out = "".join(redact(text[a:b]) for a, b in itertools.pairwise(bounds)) + redact.flush()
    assert out == redact_text(text)


@FAST
@given(st.sampled_from(SECRETS), text_st, text_st, st.sampled_from([" ", "\n", " | ", "\t"]))
def test_a_planted_secret_inside_random_text_is_masked(case: score.SecretCase, before: str,
                                                       after: str, sep: str) -> None:
    text = before + sep + case.text + sep + after
    out = redact_text(text)
    for secret in case.secrets:
        for part in secret.split("\n"):
            if part.strip():
                # the part may also occur in the random text itself: count, do not search
                assert out.count(part) <= (before + sep + sep + after).count(part), (part, out)


@FAST
@given(st.sampled_from(HARMLESS))
def test_harmless_lines_inside_a_stream_stay_unchanged(line: str) -> None:
    redact = StreamRedactor()
    assert redact(line + "\n") + redact.flush() == line + "\n"


@FAST
@given(st.lists(text_st, max_size=8),
       st.recursive(st.one_of(st.none(), st.integers(), text_st),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.sampled_from(PIECES), inner, max_size=4), max_leaves=12))
def test_argv_and_json_never_raise(argv: list[str], obj: object) -> None:
    assert len(redact_argv(argv)) == len(argv)
    redact_obj(obj)
