"""Copying logs into the bundle and finding torchrun's log dir (collectors/logs.py)."""

from __future__ import annotations

import time
from pathlib import Path

from ddp_autopsy.collectors import (
    logs,
)
from ddp_autopsy.redact import (
    MASK,
)

try:
    from tests import collect_helpers as h
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    import collect_helpers as h  # type: ignore[no-redef]

HF_TOKEN, PEM_BODY, PLANTED = h.HF_TOKEN, h.PEM_BODY, h.PLANTED
SECRET_URL, SECRET_VALUE, URL_PASSWORD = h.SECRET_URL, h.SECRET_VALUE, h.URL_PASSWORD
frame_names, main_thread, wait_for = h.frame_names, h.main_thread, h.wait_for


def test_copy_log_caps_head_and_tail_and_redacts(tmp_path: Path) -> None:
    src = tmp_path / "big.log"
    lines = [f"line {i} HF_TOKEN={HF_TOKEN}\n" if i in (0, 9999) else f"line {i} filler text\n"
             for i in range(10000)]
    src.write_text("".join(lines))
    before = src.read_bytes()
    dest = tmp_path / "out.log"
    res = logs.copy_log(str(src), dest, limit=4096)
    text = dest.read_text()
    assert res.truncated and res.size == len(before)
    assert text.startswith("line 0 HF_TOKEN=" + MASK) and text.endswith(f"line 9999 HF_TOKEN={MASK}\n")
    assert "bytes omitted from the middle of this file]" in text and HF_TOKEN not in text
    assert len(text) < 4096 + 200
    assert src.read_bytes() == before  # the original is never touched
    small = tmp_path / "small.log"
    small.write_text(f"url={SECRET_URL}\n")
    assert not logs.copy_log(str(small), tmp_path / "small.out", limit=4096).truncated
    assert (tmp_path / "small.out").read_text() == f"url=https://alice:{MASK}@data.example.com/shards\n"


def test_copy_log_keeps_the_tail_and_masks_a_pem_block_cut_by_the_cap(tmp_path: Path) -> None:
    src = tmp_path / "pem.log"
    filler = "".join(f"filler line {i}\n" for i in range(400))
    src.write_text(filler + "-----BEGIN PRIVATE KEY-----\n" + f"{PEM_BODY}\n" * 200
                   + "-----END PRIVATE KEY-----\nlast line\n")
    size = src.stat().st_size
    res = logs.copy_log(str(src), tmp_path / "out", limit=size - 2000)  # cut inside the block
    text = (tmp_path / "out").read_text()
    assert res.truncated and PEM_BODY not in text and text.endswith("last line\n")
    late = logs.copy_log(str(src), tmp_path / "late", limit=1 << 20, stop_at=time.monotonic())
    assert late.stopped_early and late.truncated and late.copied == 0
    assert "ran out of time" in (tmp_path / "late").read_text()
    assert not list(tmp_path.glob(".*"))  # no temp files left behind


def test_log_dir_option_parsing() -> None:
    assert logs.log_dirs_from_cmdline(["torchrun", "--log-dir", "out", "x.py"], "/w") == \
        [Path("/w/out")]
    assert logs.log_dirs_from_cmdline(["torchrun", "--log_dir=/abs", "x.py"], None) == \
        [Path("/abs")]
    assert logs.bundle_path_for("/tmp/run/../0.log") == "logs/tmp/run/0.log"
