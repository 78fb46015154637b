"""The redaction engine as a library: the two corpora (tests/redaction/), the name policy, command
lines, structured values, and streaming through real file copies cut into chunks."""

from __future__ import annotations

import importlib.util
import itertools
import json
import sys
from pathlib import Path

import pytest

from ddp_autopsy.collectors import logs
from ddp_autopsy.redact import (
    MASK,
    StreamRedactor,
    is_secret_name,
    redact_argv,
    redact_env,
    redact_obj,
    redact_text,
)

_SPEC = importlib.util.spec_from_file_location(
    "redaction_score", Path(__file__).resolve().parent.parent / "scripts" / "redaction_score.py")
assert _SPEC is not None and _SPEC.loader is not None
score = importlib.util.module_from_spec(_SPEC)
sys.modules["redaction_score"] = score  # dataclasses look their module up
_SPEC.loader.exec_module(score)

SECRETS = score.load_secrets()
HARMLESS = score.load_harmless()


# -- the corpora ---------------------------------------------------------------------------------


@pytest.mark.parametrize("case", SECRETS, ids=[f"secrets.txt:{c.lineno}" for c in SECRETS])
def test_every_planted_secret_is_masked(case: score.SecretCase) -> None:
    out = redact_text(case.text)
    assert not score.leaks(redact_text, case), out
    assert MASK in out
    assert redact_text(out) == out  # idempotent


def test_every_harmless_line_comes_through_unchanged() -> None:
    # No allowed list: every line of harmless.txt must be left alone.
    altered = [(n, line, redact_text(line)) for n, line in HARMLESS if redact_text(line) != line]
    assert not altered, "\n".join(f"harmless.txt:{n}: {a!r} -> {b!r}" for n, a, b in altered)


def test_corpora_are_big_enough_to_mean_something() -> None:
    assert len(SECRETS) >= 80 and len(HARMLESS) >= 300
    real = sum(1 for line in (Path(score.CORPUS) / "harmless.txt").read_text().split("\n")
               if line.startswith("## tests/corpus/"))
    assert real >= 50  # groups of lines copied from real logs


def test_the_score_script_meets_its_targets(capsys: pytest.CaptureFixture[str]) -> None:
    assert score.main([]) == 0
    out = capsys.readouterr().out
    assert f"{len(SECRETS)}/{len(SECRETS)} (100.0 %" in out
    assert f"{len(HARMLESS)}/{len(HARMLESS)} (100.0 %" in out


def test_the_score_script_catches_a_leaky_engine(tmp_path: Path) -> None:
    leaky = tmp_path / "leaky.py"
    leaky.write_text("def redact_text(text):\n    return text.replace('hunter2pw', 'x')\n")
    assert score.main(["--engine", str(leaky)]) == 1


# -- names -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,secret", [
    ("HF_TOKEN", True), ("GITHUB_TOKEN", True), ("x-auth-token", True), ("api_key", True),
    ("WANDB_API_KEY", True), ("AWS_SECRET_ACCESS_KEY", True), ("DB_PASSWORD", True),
    ("DB_PASS", True), ("SENTRY_DSN", True), ("NPM_AUTH", True), ("AUTH_HEADER_VALUE", True),
    ("GITHUBTOKEN", True), ("AccountKey", True), ("_authToken", True), ("SESSION_ID", True),
    ("AZURE_STORAGE_CONNECTION_STRING", True), ("OPENAI_KEY", True), ("Cookie", True),
    ("TOKENIZERS_PARALLELISM", False), ("MAX_TOKENS", False), ("SSH_AUTH_SOCK", False),
    ("num_tokens", False), ("tokens_per_sec", False), ("cache_key", False), ("pad_token", False),
    ("eos_token_id", False), ("HF_TOKEN_PATH", False), ("PASSWORD_FILE", False),
    ("AUTH_TYPE", False), ("MASTER_PORT", False), ("RANK", False), ("PWD", False),
    ("NCCL_IB_PKEY", False), ("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", False), ("KEY", False),
    ("author", False), ("BYPASS", False), ("passes", False),
])
def test_secret_names_are_whole_segments(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_strict_names_for_free_text_and_json() -> None:
    # An environment's OPENAI_KEY is a secret; a log's or JSON's model_key / dataset_key is not.
    assert is_secret_name("OPENAI_KEY") and not is_secret_name("OPENAI_KEY", strict=True)
    assert redact_text("model_key=resnet dataset_key=train") == "model_key=resnet dataset_key=train"
    assert redact_text("API_KEY=abc123") == f"API_KEY={MASK}"


# -- structured values -----------------------------------------------------------------------------


def test_redact_env_by_name_and_by_value() -> None:
    env = {"HF_TOKEN": "x", "OPENAI_KEY": "y", "TOKENIZERS_PARALLELISM": "false",
           "MAX_TOKENS": "4096", "SSH_AUTH_SOCK": "/tmp/ssh-a/agent.1",
           "DATA_URL": "s3://k:SeCrEt/x@bucket/p", "NOTES": "see ghp_" + "a" * 36}
    out = redact_env(env)
    assert out["HF_TOKEN"] == out["OPENAI_KEY"] == MASK
    for kept in ("TOKENIZERS_PARALLELISM", "MAX_TOKENS", "SSH_AUTH_SOCK"):
        assert out[kept] == env[kept]
    assert out["DATA_URL"] == f"s3://k:{MASK}@bucket/p" and out["NOTES"] == f"see {MASK}"


def test_redact_argv_flags_lists_and_commands() -> None:
    assert redact_argv(["python", "train.py", "--pass", "pw", "--auth", "a", "--tokenizer",
                        "gpt2", "--max-tokens", "9"]) == [
        "python", "train.py", "--pass", MASK, "--auth", MASK, "--tokenizer", "gpt2",
        "--max-tokens", "9"]
    assert redact_argv(["mysql", "-u", "root", "-pHunter2", "-p"]) == [
        "mysql", "-u", "root", "-p" + MASK, "-p"]
    assert redact_argv(["ssh", "-p2222", "node"]) == ["ssh", "-p2222", "node"]  # not mysql
    assert redact_argv(["curl", "-u", "bob:pw", "https://x"]) == ["curl", "-u", f"bob:{MASK}",
                                                                  "https://x"]
    assert redact_argv(["/usr/bin/curl", "-ubob:pw"]) == ["/usr/bin/curl", f"-ubob:{MASK}"]
    assert redact_argv(["docker", "login", "-u", "ci", "-p", "pw", "reg"]) == [
        "docker", "login", "-u", "ci", "-p", MASK, "reg"]
    assert redact_argv(["torchrun", "--master-port", "29500", "-p", "x"])[1:3] == [
        "--master-port", "29500"]


def test_redact_obj_masks_secret_keys_and_scrubs_strings() -> None:
    sa = {"type": "service_account", "private_key_id": "abc",
          "private_key": "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADAN\n-----END PRIVATE KEY-----\n",
          "client_email": "sa@p.iam.gserviceaccount.com",
          "nested": [{"Authorization": "Bearer abcdefgh12345678"}, "token=abc123"],
          "key": "rank_3", "cache_key": "abc", "num_tokens": 7}
    out = redact_obj(sa)
    assert out["private_key"] == MASK and "MIIEvQIBADAN" not in json.dumps(out)
    assert out["nested"] == [{"Authorization": MASK}, f"token={MASK}"]
    assert (out["key"], out["cache_key"], out["num_tokens"]) == ("rank_3", "abc", 7)
    assert out["client_email"] == sa["client_email"]


def test_json_stays_valid_after_redacting_its_text() -> None:
    doc = {"cmd": "run --password 'a b' --token x1", "env": "AccountKey=abc/def==;x=1",
           "pem": "-----BEGIN RSA PRIVATE KEY-----\nQUJD\n-----END RSA PRIVATE KEY-----"}
    back = json.loads(redact_text(json.dumps(doc)))
    assert back["cmd"] == f"run --password '{MASK}' --token {MASK}"
    assert back["env"] == f"AccountKey={MASK};x=1" and "QUJD" not in back["pem"]


def test_evidence_keeps_its_shape() -> None:
    # Only the secret goes: the name, the host, the rest of the line stay readable evidence.
    line = ("[rank3]: RuntimeError: connect to redis://:pw1@cache.internal:6379 failed "
            "(HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz012345 set)")
    assert redact_text(line) == ("[rank3]: RuntimeError: connect to "
                                 f"redis://:{MASK}@cache.internal:6379 failed (HF_TOKEN={MASK} set)")


# -- streaming -------------------------------------------------------------------------------------


def _stream(text: str, cuts: list[int], **kw: int) -> str:
    redact = StreamRedactor(**kw)
    bounds = [0, *cuts, len(text)]
    return "".join(redact(text[a:b]) for a, b in itertools.pairwise(bounds)) + redact.flush()


@pytest.mark.parametrize("case", SECRETS[::4], ids=[f"secrets.txt:{c.lineno}"
                                                     for c in SECRETS[::4]])
def test_stream_equals_whole_text_at_every_cut(case: score.SecretCase) -> None:
    text = "before\n" + case.text + "\nafter\n"
    whole = redact_text(text)
    for cut in range(1, len(text)):
        assert _stream(text, [cut]) == whole, cut


def test_a_line_longer_than_max_line_is_let_out_in_pieces_without_leaking() -> None:
    secret = "hf_abcdefghijklmnopqrstuvwxyz0123456789"
    for offset in range(0, 120, 7):
        text = "x " * 200 + " " * offset + f"HF_TOKEN={secret} " + "y " * 200 + "\n"
        for cut in (50, 97, 256, 401):
            out = _stream(text, [cut, cut + 50], max_line=100, hold=40, context=64)
            assert secret[3:20] not in out and out.endswith("y \n"), (offset, cut)
    # a value much longer than hold + context: masked on, piece after piece, to its end
    text = "password=" + "A" * 5000 + " tail\n"
    out = _stream(text, list(range(100, 5000, 100)), max_line=100, hold=10, context=50)
    assert "A" not in out and out.endswith(" tail\n")


def test_pem_block_split_over_many_chunks(tmp_path: Path) -> None:
    body = [f"MIIEpAIBAAKCAQEAline{i:02d}abcdefghijklmnopqrstuvwxyz" for i in range(30)]
    text = ("step 1\n-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(body)
            + "\n-----END RSA PRIVATE KEY-----\nstep 2\n")
    for size in (1, 5, 64, 333):
        out = _stream(text, list(range(size, len(text), size)))
        assert not any(b in out for b in body) and out.startswith("step 1\n-----BEGIN")
        assert out.endswith("-----END RSA PRIVATE KEY-----\nstep 2\n")


def test_copy_log_with_tiny_chunks_leaks_nothing(tmp_path: Path) -> None:
    """A real file copy whose chunks cut every secret of the corpus, and its PEM blocks."""
    text = "".join(f"step {i} loss 1.0\n{case.text}\n" for i, case in enumerate(SECRETS))
    src = tmp_path / "train.log"
    src.write_text(text, encoding="utf-8")
    for chunk in (7, 64, 4096):
        dest = tmp_path / f"copy{chunk}.log"
        res = logs.copy_log(str(src), dest, limit=1 << 20, chunk_size=chunk)
        out = dest.read_text(encoding="utf-8")
        assert not res.truncated and res.copied == len(text.encode())
        assert out == redact_text(text), chunk
        for case in SECRETS:
            assert not [p for s in case.secrets for p in s.split("\n") if p.strip() and p in out]


def test_copy_log_secret_across_the_1mib_chunk_boundary(tmp_path: Path) -> None:
    """The issue's leak: a secret on a line longer than the copy chunk, cut by the boundary."""
    secret = "ghp_" + "Q" * 36
    for before in (logs.CHUNK - 20, logs.CHUNK - 3, 2 * logs.CHUNK - (64 << 10) - 10):
        src = tmp_path / "long.log"
        src.write_text("start\n" + "a" * (before - 6) + f" GITHUB_TOKEN={secret} "
                       + "b" * (logs.CHUNK // 2) + "\nend\n")
        dest = tmp_path / "long.out"
        logs.copy_log(str(src), dest, limit=8 << 20)
        out = dest.read_text()
        assert "QQQQ" not in out and out.startswith("start\n") and out.endswith("b\nend\n")


def test_copy_log_of_non_utf8_bytes_keeps_them(tmp_path: Path) -> None:
    data = "café token=abc123 ".encode("latin-1") + b"\xff\xfe\n" + "é".encode() * 10 + b"\n"
    src = tmp_path / "bin.log"
    src.write_bytes(data)
    dest = tmp_path / "bin.out"
    logs.copy_log(str(src), dest, limit=1 << 20, chunk_size=3)
    assert dest.read_bytes() == data.replace(b"abc123", MASK.encode())


# -- the policy through the CLI (docs/redaction.md) ------------------------------------------------

CRASH_LOG = ("[rank1]: Traceback (most recent call last):\n"
             '[rank1]:   File "train.py", line 3, in <module>\n'
             "[rank1]: RuntimeError: could not connect to redis://:Sup3rPw@cache:6379 "
             "(HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz012345)\n")
PLANTED = ("Sup3rPw", "hf_abcdefghijklmnopqrstuvwxyz012345")


def test_analyze_shows_the_users_own_lines_raw_unless_asked(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from ddp_autopsy.cli import main

    log = tmp_path / "train.log"
    log.write_text(CRASH_LOG)
    html = tmp_path / "r.html"
    raw = CliRunner().invoke(main, ["analyze", str(log), "--no-color", "--html", str(html)])
    assert raw.exit_code == 0, raw.output
    assert all(s in raw.output for s in PLANTED)  # terminal: the user's own logs, unchanged
    page = html.read_text()
    assert not any(s in page for s in PLANTED) and MASK in page  # HTML: always redacted
    for fmt in ("text", "json"):
        red = CliRunner().invoke(main, ["analyze", str(log), "--redact", "--format", fmt])
        assert red.exit_code == 0, red.output
        assert not any(s in red.output for s in PLANTED) and MASK in red.output
        assert "redis://:" + MASK + "@cache:6379" in red.output  # the evidence stays readable
        if fmt == "json":  # still the published contract
            import jsonschema

            schema = Path(__file__).parents[1] / "ddp_autopsy" / "schemas" / "analysis.schema.json"
            doc = json.loads(red.output)
            jsonschema.validate(doc, json.loads(schema.read_text()))
            assert doc["verdict"]["rule"] == "CRASH001"
    report = CliRunner().invoke(main, ["report", str(log), "-o", str(tmp_path / "p.html")])
    assert report.exit_code == 0 and not any(s in (tmp_path / "p.html").read_text()
                                             for s in PLANTED)


def test_grep_redacts_on_request(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from ddp_autopsy.cli import main

    (tmp_path / "train.log").write_text(CRASH_LOG)
    raw = CliRunner().invoke(main, ["grep", "redis", str(tmp_path)])
    assert raw.exit_code == 0 and all(s in raw.output for s in PLANTED)
    for fmt in ("text", "json"):
        red = CliRunner().invoke(main, ["grep", "redis", str(tmp_path), "--redact",
                                        "--format", fmt])
        assert red.exit_code == 0, red.output
        assert not any(s in red.output for s in PLANTED) and MASK in red.output
