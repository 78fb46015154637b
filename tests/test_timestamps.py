"""Time stamps: every format the logs use, normalised to one datetime and a clock."""

from __future__ import annotations

import io
from datetime import datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from ddp_autopsy.analyzer import timestamps as T
from ddp_autopsy.analyzer.events import FileContext, scan_text
from ddp_autopsy.analyzer.lines import parse_line
from ddp_autopsy.analyzer.timestamps import Reference


def test_c10_month_day_is_not_zero_padded_and_its_fraction_is_monotonic() -> None:
    ref = Reference(2025)
    assert T.glog("515", "18:36:47", "343377708", ref) == T.Stamp(
        datetime(2025, 5, 15, 18, 36, 47), T.LOCAL_NOYEAR)
    assert T.glog("101", "00:00:01", None, ref).ts == datetime(2025, 1, 1, 0, 0, 1)
    assert T.glog("1218", "20:27:21", "426415540", ref).ts.microsecond == 0


def test_glog_microseconds_are_real() -> None:
    assert T.glog("1026", "03:51:31", "222000", Reference(2024)).ts.microsecond == 222000


def test_year_comes_from_the_reference_and_rolls_back_over_new_year() -> None:
    ref = Reference.at(datetime(2026, 1, 2, 9, 0))
    assert T.glog("101", "08:00:00", None, ref).ts.year == 2026
    assert T.glog("1231", "23:59:59", None, ref).ts.year == 2025
    assert T.glog("1231", "23:59:59", None, Reference(2026)).ts.year == 2026


def test_python_logging_iso_and_zones() -> None:
    assert T.iso("2024-04-10", "16:02:56", "193") == T.Stamp(
        datetime(2024, 4, 10, 16, 2, 56, 193000), T.LOCAL)
    assert T.iso("2024-04-10", "16:02:56", None, "Z").clock == T.UTC
    assert T.iso("2024-04-10", "16:02:56", "5", "-05:30").ts == datetime(2024, 4, 10, 21, 32, 56,
                                                                         500000)


def test_elastic_summary_time() -> None:
    assert T.elastic("2026-01-15_05:44:28") == T.Stamp(datetime(2026, 1, 15, 5, 44, 28), T.LOCAL)


def test_impossible_dates_are_none() -> None:
    ref = Reference(2025)
    assert T.glog("230", "10:00:00", None, ref) is None  # February 30
    assert T.glog("1301", "10:00:00", None, ref) is None
    assert T.iso("2024-13-01", "10:00:00") is None
    assert T.iso("2024-01-01", "25:00:00") is None
    assert T.elastic("garbage") is None


def test_comparable_clocks() -> None:
    assert T.comparable(T.LOCAL, T.LOCAL_NOYEAR)
    assert T.comparable(T.UTC, T.UTC)
    assert not T.comparable(T.LOCAL, T.UTC)
    assert not T.comparable(None, T.LOCAL)


def test_stamps_read_from_lines() -> None:
    nccl = parse_line("[2025-05-01 10:11:12] gpu3:811:902 [1] misc/socket.cc:286 NCCL WARN "
                      "socketProgress: Connection closed by remote peer node1<57557>", 2025)
    assert (nccl.ts, nccl.clock, nccl.host, nccl.pid) == (datetime(2025, 5, 1, 10, 11, 12),
                                                          T.LOCAL, "gpu3", 811)
    nccl_frac = parse_line("[2025-05-01 10:11:12.250] gpu3:811:902 [1] NCCL INFO x", 2025)
    assert nccl_frac.ts.microsecond == 250000
    pylog = parse_line("[2024-04-10 16:02:56,193] torch.distributed.elastic.multiprocessing.api: "
                       "[WARNING] Sending process 4797 closing signal SIGINT", 2024)
    assert (pylog.ts, pylog.body) == (datetime(2024, 4, 10, 16, 2, 56, 193000),
                                      "Sending process 4797 closing signal SIGINT")
    iso = parse_line("2024-05-01T10:11:12.5Z | INFO | training started", 2024)
    assert (iso.clock, iso.level, iso.body) == (T.UTC, "I", "training started")


def test_year_of_a_scanned_file_comes_from_its_modification_time() -> None:
    line = ("[rank0]:[E1231 23:59:50.123456789 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, Timeout(ms)=600000) "
            "ran for 600081 milliseconds before timing out.\n")
    ctx = FileContext("train.log", 2026, ref_time=datetime(2026, 1, 1, 0, 5))
    row, last = scan_text(io.BytesIO(line.encode()), ctx, [])
    assert (row["kind"], last["kind"], last["ts"]) == ("watchdog_timeout", "last_line", row["ts"])
    assert (row["ts"], row["clock"]) == (datetime(2025, 12, 31, 23, 59, 50), T.LOCAL_NOYEAR)


@settings(max_examples=300, deadline=None)
@given(st.text("0123456789", max_size=5), st.text("0123456789:", max_size=9),
       st.text("0123456789", max_size=10), st.sampled_from([None, "Z", "+02:00", "-0530", "+9"]))
def test_normalisers_never_raise(mmdd: str, hms: str, frac: str, zone: str | None) -> None:
    T.glog(mmdd, hms, frac, Reference(2025))
    T.iso("2025-02-28", hms, frac, zone)
