"""Generate large, realistic inputs for the analyzer benchmark (run on demand, never in CI).

    python benchmarks/generate.py slurm      --ranks 64   --size 2G    # one srun --label file
    python benchmarks/generate.py nccl-files --ranks 4096 --size 4G    # NCCL_DEBUG_FILE per process
    python benchmarks/generate.py logdir     --ranks 64   --size 1G    # torchrun --log-dir per node

Everything goes under ``benchmarks/out/<layout>-<ranks>/`` (gitignored). Lines follow the
documented formats (shared/research/nccl-messages.md, pytorch-messages.md): NCCL INFO init lines
(bootstrap, NET/IB, ``ncclCommInitRank ... Init START/COMPLETE``, channels), then COLL-subsystem
lines (``AllReduce: opCount ... [nranks=N] stream ...``) with a training-progress line now and
then. Each layout plants one failure whose culprit the analyzer must find and attribute:

- ``slurm``: one ``slurm-<job>.out``, every line ``srun --label``-prefixed (``  17: ...``);
  rank CULPRIT runs out of CUDA memory (a ``[rankN]:`` traceback), the others time out in the
  NCCL watchdog;
- ``nccl-files``: ``<host>.<pid>`` files (NCCL_DEBUG_FILE=%h.%p); the culprit's file ends with an
  InfiniBand completion error, attributed through its communicator-init line;
- ``logdir``: ``<host>/<run_id>/attempt_0/<local_rank>/stderr.log`` trees; the culprit's
  traceback carries ``[rankN]:``, the other lines only the directory's local rank.

``expected.json`` in the output directory says what the analyzer should report.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"
GPUS_PER_HOST = 8
OPS = ("AllReduce", "AllReduce", "AllReduce", "ReduceScatter", "AllGather", "Broadcast")
#: One training-progress line per this many COLL lines (rank 0 only).
PROGRESS_EVERY = 5000


@dataclass(frozen=True)
class Proc:
    rank: int
    world: int

    @property
    def host(self) -> str:
        return f"gpu-node{self.rank // GPUS_PER_HOST:04d}"

    @property
    def dev(self) -> int:
        return self.rank % GPUS_PER_HOST

    @property
    def pid(self) -> int:
        return 200_000 + self.rank * 7

    @property
    def prefix(self) -> str:
        return f"{self.host}:{self.pid}:{self.pid}"


def init_lines(p: Proc) -> list[str]:
    """NCCL INFO lines of one process bringing up the world communicator (NCCL 2.21 format)."""
    h, d, tid = p.host, p.dev, p.pid + 41
    ip = f"10.1.{p.rank // 250}.{p.rank % 250 + 1}"
    me, init = f"{p.prefix} [{d}]", f"{h}:{p.pid}:{tid} [{d}]"
    comm = f"0x{0x55d0a8e0c000 + p.rank * 0x1000:x}"
    bus = f"{0x18 + d * 0x11:x}000"
    nxt = (p.rank + 1) % p.world
    lines = [
        f"{me} NCCL INFO Bootstrap : Using eth0:{ip}<0>",
        f"{me} NCCL INFO cudaDriverVersion 12040",
        f"{me} NCCL INFO NCCL version 2.21.5+cuda12.4",
        f"{init} NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB eth0:{ip}<0>",
        f"{init} NCCL INFO Using non-device net plugin version 0",
        f"{init} NCCL INFO Using network IB",
        f"{init} NCCL INFO ncclCommInitRank comm {comm} rank {p.rank} nranks {p.world} "
        f"cudaDev {d} nvmlDev {d} busId {bus} commId 0x5f3a9c21d0e4b7a8 - Init START",
        f"{init} NCCL INFO Setting affinity for GPU {d} to ffff,ffffffff",
        f"{init} NCCL INFO comm {comm} rank {p.rank} nRanks {p.world} nNodes "
        f"{max(1, p.world // GPUS_PER_HOST)} localRanks {GPUS_PER_HOST} localRank {d} MNNVL 0",
    ]
    for ch in range(4):
        lines.append(f"{init} NCCL INFO Channel {ch:02d}/0 : {p.rank}[{d}] -> "
                     f"{nxt}[{nxt % GPUS_PER_HOST}] via P2P/IPC/read")
    lines += [
        f"{init} NCCL INFO Connected all rings",
        f"{init} NCCL INFO Connected all trees",
        f"{init} NCCL INFO threadThresholds 8/8/64 | 512/8/64 | 512 | 512",
        f"{init} NCCL INFO 24 coll channels, 24 collnet channels, 0 nvls channels, "
        f"32 p2p channels, 32 p2p channels per peer",
        f"{init} NCCL INFO ncclCommInitRank comm {comm} rank {p.rank} nranks {p.world} "
        f"cudaDev {d} nvmlDev {d} busId {bus} commId 0x5f3a9c21d0e4b7a8 - Init COMPLETE",
    ]
    return [x + "\n" for x in lines]


def coll_lines(p: Proc, start: int, count: int, rng: random.Random) -> str:
    """``count`` COLL-subsystem lines of one process from opCount ``start``."""
    me = f"{p.prefix} [{p.dev}] NCCL INFO "
    comm = f"0x{0x55d0a8e0c000 + p.rank * 0x1000:x}"
    tail = f" datatype 7 op 0 root 0 comm {comm} [nranks={p.world}] stream 0x7f3c2c00{p.dev:04x}\n"
    out = []
    for op in range(start, start + count):
        buf = f"0x7f3a{(op * 4099) % 0xFFFFFF:06x}00"
        out.append(f"{me}{OPS[op % len(OPS)]}: opCount {op:x} sendbuff {buf} recvbuff {buf} "
                   f"count {rng.randrange(1, 1 << 24)}{tail}")
        if p.rank == 0 and op % PROGRESS_EVERY == 0:
            out.append(f"step {op // 10} | loss {2.5 - op * 1e-7:.4f} | lr 3.00e-04 | grad_norm "
                       f"{0.5 + rng.random():.3f} | tokens/s {rng.randrange(140000, 160000)}\n")
    return "".join(out)


def watchdog(p: Proc, seq: int) -> str:
    return (f"[rank{p.rank}]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:616] [Rank {p.rank}] "
            f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, "
            f"OpType=ALLREDUCE, NumelIn=7020002, NumelOut=7020002, Timeout(ms)=600000) ran for "
            f"600081 milliseconds before timing out.\n")


def oom(p: Proc) -> list[str]:
    return [f"[rank{p.rank}]: {x}\n" for x in (
        "Traceback (most recent call last):",
        '  File "/workspace/train.py", line 212, in <module>',
        "    loss = model(batch).loss",
        '  File "/workspace/model.py", line 88, in forward',
        "    attn = torch.softmax(scores, dim=-1)",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.35 GiB. GPU 5 has a "
        "total capacity of 79.11 GiB of which 1.70 GiB is free.",
    )]


def ib_error(p: Proc) -> str:
    return (f"\n{p.prefix} [{p.dev}] transport/net_ib.cc:1696 NCCL WARN NET/IB: Got completion "
            f"from peer 10.1.0.9<46213> with status=12 opcode=0 len=0 vendor err 129 (Send) "
            f"hca mlx5_0\n")


def _lines_per_proc(size: int, ranks: int) -> int:
    return max(100, size // ranks // 215)


def gen_slurm(out: Path, ranks: int, size: int, culprit: int, rng: random.Random) -> dict:
    """One srun --label file, every rank's lines interleaved in rounds."""
    procs = [Proc(r, ranks) for r in range(ranks)]
    width = len(str(ranks - 1))
    label = [f"{r:>{width}}: " for r in range(ranks)]
    per = _lines_per_proc(size, ranks)
    path = out / "slurm-4242.out"
    with path.open("w") as fh:
        for p in procs:
            fh.writelines(label[p.rank] + x for x in init_lines(p))
        step = 200
        for start in range(0, per, step):
            for p in procs:
                block = coll_lines(p, start, min(step, per - start), rng)
                fh.write(re.sub("^", label[p.rank], block, flags=re.M)[: -len(label[p.rank])])
        for p in procs:
            lines = oom(p) if p.rank == culprit else [watchdog(p, per)]
            fh.writelines(label[p.rank] + x for x in lines)
    return {"culprit_rank": culprit, "events": {"oom": 1, "watchdog_timeout": ranks - 1}}


def gen_nccl_files(out: Path, ranks: int, size: int, culprit: int, rng: random.Random) -> dict:
    """NCCL_DEBUG_FILE=%h.%p: one file per process, nothing but NCCL lines."""
    per = _lines_per_proc(size, ranks)
    template = coll_lines(Proc(1, ranks), 0, per, rng)  # reused: generation stays fast
    for r in range(ranks):
        p = Proc(r, ranks)
        d = out / "nccl" / p.host
        d.mkdir(parents=True, exist_ok=True)
        with (d / f"{p.host}.{p.pid}").open("w") as fh:
            fh.writelines(init_lines(p))
            fh.write(template.replace(Proc(1, ranks).prefix + " [1]", f"{p.prefix} [{p.dev}]"))
            if r == culprit:
                fh.write(ib_error(p))
    return {"culprit_rank": culprit, "events": {"network_error": 1, "nccl_comm_init": 2 * ranks}}


def gen_logdir(out: Path, ranks: int, size: int, culprit: int, rng: random.Random) -> dict:
    """torchrun --log-dir trees, one per host: <host>/<run_id>/attempt_0/<local_rank>/stderr.log."""
    per = _lines_per_proc(size, ranks)
    for r in range(ranks):
        p = Proc(r, ranks)
        d = out / p.host / "c2f1e0a7-1" / "attempt_0" / str(p.dev)
        d.mkdir(parents=True, exist_ok=True)
        with (d / "stderr.log").open("w") as fh:
            fh.writelines(init_lines(p))
            fh.write(coll_lines(p, 0, per, rng))
            fh.writelines(oom(p) if r == culprit else [watchdog(p, per)])
    return {"culprit_rank": culprit, "events": {"oom": 1, "watchdog_timeout": ranks - 1}}


LAYOUTS = {"slurm": gen_slurm, "nccl-files": gen_nccl_files, "logdir": gen_logdir}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMG]?)B?", text.strip().upper())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}")
    return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)])


def generate(layout: str, ranks: int, size: int, seed: int = 0, out: Path | None = None) -> Path:
    target = out or OUT / f"{layout}-{ranks}"
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    rng = random.Random(seed)
    culprit = rng.randrange(ranks)
    expected = LAYOUTS[layout](target, ranks, size, culprit, rng)
    expected["bytes"] = sum(f.stat().st_size for f in _files(target))
    (target / "expected.json").write_text(json.dumps({"layout": layout, "ranks": ranks, **expected},
                                                     indent=2))
    return target


def _files(root: Path) -> Iterator[Path]:
    return (f for f in root.rglob("*") if f.is_file() and f.name != "expected.json")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("layout", choices=sorted(LAYOUTS))
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--size", type=parse_size, default=parse_size("1G"),
                    help="approximate total size (e.g. 500M, 4G)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help=f"directory (default {OUT}/<layout>-<ranks>)")
    args = ap.parse_args()
    target = generate(args.layout, args.ranks, args.size, args.seed, args.out)
    meta = json.loads((target / "expected.json").read_text())
    print(f"{target}: {meta['bytes'] / 1e9:.2f} GB, culprit rank {meta['culprit_rank']}")


if __name__ == "__main__":
    main()
