"""Redaction basics as collect applies them (ddp_autopsy/redact.py); the full corpus is test_redact.py."""

from __future__ import annotations

import json

import pytest

from ddp_autopsy.redact import (
    MASK,
    StreamRedactor,
    is_secret_name,
    redact_argv,
    redact_env,
    redact_obj,
    redact_text,
)

try:
    from tests import collect_helpers as h
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    import collect_helpers as h  # type: ignore[no-redef]

HF_TOKEN, PEM_BODY, PLANTED = h.HF_TOKEN, h.PEM_BODY, h.PLANTED
SECRET_URL, SECRET_VALUE, URL_PASSWORD = h.SECRET_URL, h.SECRET_VALUE, h.URL_PASSWORD
frame_names, main_thread, wait_for = h.frame_names, h.main_thread, h.wait_for


def test_redact_env_masks_secret_names_and_url_credentials() -> None:
    env = {"HF_TOKEN": HF_TOKEN, "MY_SECRET_KEY": SECRET_VALUE, "WANDB_API_KEY": "0123abcd",
           "AWS_SECRET_ACCESS_KEY": "x/y+z", "DB_PASSWORD": "pw", "DATA_URL": SECRET_URL,
           "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29500", "PWD": "/home/u",
           "NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_PKEY": "0"}
    out = redact_env(env)
    for name in ("HF_TOKEN", "MY_SECRET_KEY", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY",
                 "DB_PASSWORD"):
        assert out[name] == MASK, name
    assert out["DATA_URL"] == f"https://alice:{MASK}@data.example.com/shards"
    for kept in ("MASTER_ADDR", "MASTER_PORT", "PWD", "NCCL_SOCKET_IFNAME", "NCCL_IB_PKEY"):
        assert out[kept] == env[kept]


@pytest.mark.parametrize("name,secret", [
    ("HF_TOKEN", True), ("GITHUB_TOKEN", True), ("x-auth-token", True), ("api_key", True),
    ("SESSION_ID", True), ("MASTER_PORT", False), ("RANK", False), ("LOCAL_WORLD_SIZE", False),
    ("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", False), ("PWD", False),
])
def test_secret_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_redact_text_known_token_formats_and_assignments() -> None:
    text = (f"token={HF_TOKEN} gh=ghp_{'a' * 36} aws=AKIAABCDEFGHIJKLMNOP "
            f"openai=sk-proj-{'b' * 30} jwt=eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0.c2lnbmF0dXJlMTIz "
            f"Authorization: Bearer abcdefghijklmnop url={SECRET_URL} MY_SECRET_KEY={SECRET_VALUE}"
            f" --hf-token {HF_TOKEN}")
    out = redact_text(text)
    for leaked in (HF_TOKEN, "ghp_", "AKIA", "sk-proj", "eyJ", "abcdefghijklmnop", URL_PASSWORD,
                   SECRET_VALUE):
        assert leaked not in out, leaked
    assert out.count(MASK) >= 9
    assert redact_text(out) == out  # idempotent


def test_redact_text_leaves_ordinary_log_lines_alone() -> None:
    lines = [
        "[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] Watchdog caught collective",
        "W0409 07:28:49.531000 1359 torch/distributed/elastic/multiprocessing/api.py:897] Sending",
        "MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 RANK=3", "Timed out waiting for key rank_3",
        "  File \"/home/u/task-abcdefghijklmnopqrstuvwxyz/train.py\", line 3, in <module>",
    ]
    for line in lines:
        assert redact_text(line) == line


def test_redact_argv_masks_split_flag_values() -> None:
    argv = ["python", "train.py", "--hf-token", "plainvalue", "--password=pw", "--lr", "0.1",
            "--data", SECRET_URL]
    out = redact_argv(argv)
    assert out[3] == MASK and out[4] == f"--password={MASK}" and out[5:7] == ["--lr", "0.1"]
    assert URL_PASSWORD not in " ".join(out)


def test_redaction_keeps_json_valid() -> None:
    doc = {"cmd": f"run --token {HF_TOKEN}", "api_key": "zzz", "nested": [f"x={SECRET_URL}"]}
    text = json.dumps(doc)
    assert json.loads(redact_text(text))["cmd"] == f"run --token {MASK}"
    obj = redact_obj(doc)
    assert obj["api_key"] == MASK and URL_PASSWORD not in json.dumps(obj)


def test_stream_redactor_masks_pem_blocks_across_chunks() -> None:
    redact = StreamRedactor()
    first = "start\n-----BEGIN RSA PRIVATE KEY-----\n" + PEM_BODY + "\n"
    second = PEM_BODY + "\n-----END RSA PRIVATE KEY-----\nafter\n"
    out = redact(first) + redact(second)
    assert PEM_BODY not in out
    assert out.endswith("-----END RSA PRIVATE KEY-----\nafter\n") and "start\n" in out
