"""Host facts: kernel messages and library versions (collectors/host.py, versions.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_autopsy.collectors import host as host_mod
from ddp_autopsy.collectors import (
    versions,
)

# dmesg lines as the kernel and the NVIDIA driver print them (pids and addresses changed)
OOM_LINES = [
    "[51123.781302] python invoked oom-killer: gfp_mask=0x140dca(GFP_HIGHUSER_MOVABLE|__GFP_COMP"
    "|__GFP_ZERO), order=0, oom_score_adj=0",
    "[51123.781389] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0-1"
    ",oom_memcg=/kubepods/burstable/pod5d1c,task_memcg=/kubepods/burstable/pod5d1c/1f2e,"
    "task=python,pid=48213,uid=1000",
    "[51123.781402] Memory cgroup out of memory: Killed process 48213 (python) "
    "total-vm:98813552kB, anon-rss:62915584kB, file-rss:262144kB, shmem-rss:8192kB, UID:1000 "
    "pgtables:125440kB oom_score_adj:0",
    "[51124.120871] oom_reaper: reaped process 48213 (python), now anon-rss:0kB, file-rss:0kB, "
    "shmem-rss:8192kB",
    "[60001.000002] Out of memory: Killed process 5120 (pt_main_thread) total-vm:12345678kB, "
    "anon-rss:9876543kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:20000kB oom_score_adj:0",
]
XID_LINES = [
    "[ 8245.114316] NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.",
    "[ 9100.551230] NVRM: Xid (PCI:0000:86:00): 31, pid=48213, name=python, Ch 00000008, intr "
    "10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f12_34560000. Fault is of "
    "type FAULT_PDE ACCESS_TYPE_READ",
    "[ 9305.000117] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An "
    "uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at "
    "partition 6, subpartition 0.",
]
NVRM_LINES = [
    "[ 8245.114401] NVRM: GPU at PCI:0000:3b:00: GPU-6a2f5b2e-7e9c-1d4a-0b3c-2f1e9d8c7b6a",
    "[ 8245.114405] NVRM: GPU Board Serial Number: 1323120012345",
]
SEGFAULT_LINES = [
    "[12001.334455] python[48213]: segfault at 0 ip 00007f3a1c2b3d4e sp 00007ffd5e6f7a80 "
    "error 4 in libc.so.6[7f3a1c200000+195000]",
]
QUIET_LINES = [  # near misses: mention memory, a GPU or a score, but are not events
    "[    0.000000] Memory: 65536K/1048576K available (12288K kernel code, 2048K rwdata)",
    "[    4.512000] nvidia: module license 'NVIDIA' taints kernel.",
    "[    5.100000] systemd[1]: Started Journal Service (oom_score_adj tuned).",
    "[    6.200000] nvidia-uvm: Loaded the UVM driver, major device number 509.",
]



def test_kernel_messages_sorts_oom_xid_nvrm_and_segfault_lines() -> None:
    text = "\n".join(QUIET_LINES[:2] + OOM_LINES[:2] + XID_LINES + NVRM_LINES + OOM_LINES[2:]
                     + SEGFAULT_LINES + QUIET_LINES[2:]) + "\n"
    found = host_mod.kernel_messages(text)
    assert found == {"oom": OOM_LINES, "xid": XID_LINES, "nvrm": NVRM_LINES,
                     "segfault": SEGFAULT_LINES}
    assert host_mod.kernel_messages("\n".join(QUIET_LINES)) == {
        "oom": [], "xid": [], "nvrm": [], "segfault": []}
    flood = "\n".join(f"[{i}.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the "
                      f"bus." for i in range(300))
    xid = host_mod.kernel_messages(flood)["xid"]
    assert len(xid) == host_mod.MAX_KERNEL_LINES and xid[-1].startswith("[299.0]")


def test_versions_from_maps(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    torch_dir = Path(torch.__file__).parent
    site = tmp_path / "site-packages"
    nccl = site / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    nccl.parent.mkdir(parents=True)
    (site / "nvidia_nccl_cu12-2.21.5.dist-info").mkdir()
    maps = [f"{torch_dir}/lib/libtorch_cpu.so", str(nccl),
            "/usr/lib/libcudart.so.12.4.127", "/usr/lib/libpython3.11.so.1.0"]
    v = versions.versions(maps, "/usr/bin/python3.11", None)
    assert v["torch"] == torch.__version__ and v["torch_cuda"] == torch.version.cuda
    assert v["nccl"] == "2.21.5" and v["cuda"] == "12.4.127" and v["python"] == "3.11"
    header = "Process 1: python x.py\nPython v3.12.4 (/usr/bin/python3.12)\n"
    assert versions.versions([], None, header)["python"] == "3.12.4"
