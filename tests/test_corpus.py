"""The verdict on real users' logs (tests/corpus, scored by scripts/corpus_score.py) must not
regress: the figures below are floors just under what the tool measures today (stated in the
closing notes and docs/development.md); raise them as it improves."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("corpus_score", ROOT / "scripts" / "corpus_score.py")
assert spec is not None and spec.loader is not None
corpus_score = importlib.util.module_from_spec(spec)
sys.modules["corpus_score"] = corpus_score  # its dataclasses look their module up
spec.loader.exec_module(corpus_score)

#: measured 1052/1210 = 0.869 (after session 13's blind batches s63-s67, 47 cases, 23 right
#: after its fixes; 1029/1163 = 0.885 after session 12's s53-s62, 71 cases; 966/1092 =
#: 0.885 after session 11's blind batches s43-s52, 154 cases kept;
#: 829/938 = 0.884 after session 10's s33-s42; s28's 17 are vendor stacks, HCCL/oneCCL/XLA/
#: Neuron, outside the NCCL/Gloo catalog: without them 956/1075 = 0.889)
CAUSE_FLOOR = 0.865
#: Of the cases whose truth names culprit ranks: measured 269/322 = 0.835 (262/312 = 0.840
#: before s63-s67, 249/299 = 0.833
#: before s53-s62, 220/264 = 0.833 before s43-s52; 122/138 = 0.884 before s18-s20, whose
#: collectors sought culprit cases).
CULPRIT_FLOOR = 0.83
#: Cases with no verdict, each because its log holds no failure line: the failure is only in the
#: thread's prose (s7-032: slurmd's configuration noise), or the log is progress bars and printouts
#: of uneven data (s6-012, s9-020, s9-029), or NCCL's start-up lines whose only WARN is the benign
#: "Failed to open libibverbs.so" before the paste stops (s11-007, s11-009, s11-021), or a hang
#: shown only by stack dumps of one process (s14-018, s14-020), NCCL's per-collective INFO lines
#: (s14-017, s48-001: two ranks' "AllReduce: opCount" lines against "AllGather"), or a gdb backtrace
#: of a process blocked in a store read (s15-005), or NCCL INFO lines up to a hang in set-up
#: (s15-013), or the reporter's own prose about a freeze between a rank's debug prints (s19-009),
#: the issue title's words lower-cased and cut (s21-012), iteration times that only grow (s21-014),
#: NCCL's list of socket interfaces (s22-004), the reporter's prose about host memory growing
#: (s29-004). Stack dumps the readers do not take yet: a gdb backtrace (s22-009), one py-spy dump
#: beside a per-node digest of top frames (s22-014), oneCCL's condensed arrow backtrace (s28-014).
#: Other runtimes' own log formats, outside the NCCL/Gloo catalog: TensorFlow/XLA's "E file:line]"
#: lines of torch_xla on TPUs (s28-010), the Neuron runtime's "ERROR NRT:" lines (s28-013). NCCL's
#: start-up lines whose only return trail is its plugin probing, which it goes on past (s31-011: the
#: failure is in the thread's other excerpt), a launch command whose --master_addr is a file's name
#: before anything ran (s32-015). A hang with no failure line yet: rank 0 compiling a C++ extension
#: during evaluation (s33-013), NCCL INFO lines and a progress bar one step short of its end
#: (s34-012); torchelastic 0.2's etcd keep-alive INFO lines (s35-009); Ray marking a node dead that
#: the reporter shut down on purpose (s41-016: Ray's node-death lines, not read yet); Ray workers'
#: per-step counters where one worker is an epoch ahead (s43-014); a user's prose naming which
#: tensor-parallel rank each pasted block of frames belongs to (s51-015); a worker pod's log that
#: ends right after its store connection succeeded, an Istio sidecar dropping the peers'
#: connections with no line of its own (s62-006). A vLLM start-up whose
#: log ends after each worker's process-group line (s64-002); a log viewer's table export that
#: holds the traceback's frames but not its exception line (s64-004); Ascend HCCL's link table
#: (s65-010). One rank's py-spy dump in an all_reduce, the others' not given (s67-001); NCCL
#: TRACE lines up to a first Broadcast that never completes (s67-003); a P2P bandwidth test's
#: matrix (s67-004); SGLang's scheduler debug dump with the diverging rank's line cut (s67-007);
#: vLLM's function-trace files (s67-008); DeepSpeed's init line and nothing after (s67-009); some
#: ranks' validation markers before a silent hang (s67-011); half the ranks' "Reaches end of
#: dataloader." and nothing after, the other half absent from the paste (s70-005).
SILENT_ALLOWED = {"s6-012", "s7-032", "s9-020", "s9-029", "s11-007", "s11-009", "s11-021",
                  "s14-017", "s14-018", "s14-020", "s15-005", "s15-013", "s19-009",
                  "s21-012", "s21-014", "s22-004", "s22-009", "s22-014", "s28-010", "s28-013",
                  "s28-014", "s29-004", "s31-011",
                  "s32-015", "s33-013", "s34-012", "s35-009", "s41-016", "s43-014", "s48-001",
                  "s51-015", "s62-006", "s64-002", "s64-004", "s65-010",
                  "s67-001", "s67-003", "s67-004", "s67-007", "s67-008", "s67-009", "s67-011",
                  "s70-005"}


def test_the_corpus_verdicts_do_not_regress() -> None:
    cases = [corpus_score.score_case(c) for c in corpus_score.cases_in([ROOT / "tests" / "corpus"])]
    assert len(cases) >= 100
    errored = [f"{c.name}: {', '.join(c.errored)}" for c in cases if c.errored]
    assert not errored, errored  # a rule that raises on a real log is a defect whatever the score
    right = sum(c.cause_ok for c in cases) / len(cases)
    misses = [f"{c.name}: {c.truth} -> {c.verdict}" for c in cases if not c.cause_ok]
    assert right >= CAUSE_FLOOR, f"{right:.3f}\n" + "\n".join(misses)
    silent = {c.name for c in cases if c.verdict is None}
    assert silent <= SILENT_ALLOWED, sorted(silent - SILENT_ALLOWED)
    named = [c for c in cases if c.culprits]
    culprit = sum(c.cause_ok and c.ranks_ok for c in named) / len(named)
    assert culprit >= CULPRIT_FLOOR, f"{culprit:.3f}: " + ", ".join(
        f"{c.name} {c.culprits} -> {c.ranks}" for c in named if not (c.cause_ok and c.ranks_ok))
