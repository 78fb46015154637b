"""Host facts for ``host/host.json``: names, interfaces, /dev/shm, limits, kernel messages.

The commands (``ip -j addr``, ``nvidia-smi -q``, ``dmesg``) run as timed actions
(:func:`run_command`); :func:`write_host_json` then assembles ``host.json`` from their output and
the pure readers below.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import socket
import struct
from pathlib import Path
from typing import Any

from ddp_autopsy import bundle_layout as layout
from ddp_autopsy.collectors import procs
from ddp_autopsy.collectors.bundle import (
    ABSENT,
    ERROR,
    PERMISSION_DENIED,
    SKIPPED,
    Action,
    Bundle,
    CommandResult,
    run_bounded,
)

IFF_UP, IFF_LOOPBACK = 0x1, 0x8
SYS_NET = Path("/sys/class/net")
# Kernel messages worth surfacing: the OOM killer, NVIDIA Xid errors, other NVRM/segfault lines.
_KERNEL_PATTERNS = {
    "oom": re.compile(r"Out of memory|oom-kill|invoked oom-killer|oom_reaper|Memory cgroup out of"),
    "xid": re.compile(r"NVRM: Xid"),
    "nvrm": re.compile(r"NVRM:(?! Xid)"),
    "segfault": re.compile(r"segfault at|general protection fault|traps:"),
}
MAX_KERNEL_LINES = 200
# key → (action name, argv, bundle path of its stdout or None)
COMMANDS: dict[str, tuple[str, list[str], str | None]] = {
    "ip": ("ip addr", ["ip", "-j", "addr"], None),
    "nvidia-smi": ("nvidia-smi", ["nvidia-smi", "-q"], layout.HOST_COMMANDS["nvidia-smi"]),
    "dmesg": ("dmesg", ["dmesg"], layout.HOST_COMMANDS["dmesg"]),
    # packet filters: a DROP rule on the job's interface or port explains a cut-off node
    "iptables-save": ("iptables-save", ["iptables-save"], layout.FIREWALL["iptables-save"]),
    "ip6tables-save": ("ip6tables-save", ["ip6tables-save"], layout.FIREWALL["ip6tables-save"]),
    "nft": ("nft list ruleset", ["nft", "list", "ruleset"], layout.FIREWALL["nft"]),
}
FIREWALL_COMMANDS = ("iptables-save", "ip6tables-save", "nft")
_NOT_PERMITTED = (b"not permitted", b"permission denied", b"must be root")


def names(timeout: float) -> dict[str, Any]:
    """``hostname`` and ``fqdn`` (the FQDN lookup may wait on DNS: bounded)."""
    hostname = socket.gethostname()
    fqdn = run_bounded(socket.getfqdn, timeout, "getfqdn")
    return {"hostname": hostname, "fqdn": fqdn.value if fqdn.done else None}


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def interfaces(ip_json: bytes | None) -> list[dict[str, Any]]:
    """Interfaces from ``/sys/class/net``; addresses from ``ip -j addr`` output when given, else
    from ``SIOCGIFADDR`` (IPv4) and ``/proc/net/if_inet6`` (IPv6)."""
    from_ip = _addresses_from_ip_json(ip_json) if ip_json else None
    addresses = from_ip if from_ip is not None else _addresses_fallback()
    out = []
    try:
        names_ = sorted(os.listdir(SYS_NET))
    except OSError:
        names_ = sorted(addresses)
    for name in names_:
        flags = int(_read(SYS_NET / name / "flags") or "0", 16)
        mtu = _read(SYS_NET / name / "mtu")
        out.append({"name": name, "addresses": addresses.get(name, []),
                    "up": bool(flags & IFF_UP), "loopback": bool(flags & IFF_LOOPBACK),
                    "operstate": _read(SYS_NET / name / "operstate"),
                    "mtu": int(mtu) if mtu and mtu.isdigit() else None})
    return out


def _addresses_from_ip_json(data: bytes) -> dict[str, list[str]] | None:
    try:
        entries = json.loads(data)
    except ValueError:
        return None
    out: dict[str, list[str]] = {}
    for entry in entries if isinstance(entries, list) else []:
        name = entry.get("ifname")
        if name:
            out[name] = [f"{a['local']}/{a.get('prefixlen')}" for a in entry.get("addr_info", [])
                         if "local" in a]
    return out


def _addresses_fallback() -> dict[str, list[str]]:
    import fcntl

    out: dict[str, list[str]] = {}
    try:
        ifnames = os.listdir(SYS_NET)
    except OSError:
        ifnames = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for name in ifnames:
            try:
                packed = fcntl.ioctl(sock.fileno(), 0x8915,  # SIOCGIFADDR
                                     struct.pack("256s", name.encode()[:15]))
                out.setdefault(name, []).append(socket.inet_ntoa(packed[20:24]))
            except OSError:
                continue
    # /proc/net/if_inet6: addr ifindex prefixlen scope flags name
    for line in (_read(Path("/proc/net/if_inet6")) or "").splitlines():
        fields = line.split()
        if len(fields) == 6:
            raw = fields[0]
            addr = ":".join(raw[i:i + 4] for i in range(0, 32, 4))
            out.setdefault(fields[5], []).append(
                f"{socket.inet_ntop(socket.AF_INET6, socket.inet_pton(socket.AF_INET6, addr))}"
                f"/{int(fields[2], 16)}")
    return out


def shm(path: str = "/dev/shm") -> dict[str, Any]:
    """Size and free bytes of ``/dev/shm`` (NCCL and DataLoader workers live on it)."""
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return {"path": path, "size": None, "free": None, "error": str(exc)}
    return {"path": path, "size": st.f_blocks * st.f_frsize, "free": st.f_bavail * st.f_frsize,
            "error": None}


def kernel() -> dict[str, Any]:
    uname = platform.uname()
    return {"release": uname.release, "version": uname.version, "machine": uname.machine,
            "ptrace_scope": _read(Path("/proc/sys/kernel/yama/ptrace_scope")),
            "overcommit_memory": _read(Path("/proc/sys/vm/overcommit_memory")),
            "cpu_count": os.cpu_count(), "meminfo": _meminfo()}


def _meminfo() -> dict[str, int]:
    out = {}
    for line in (_read(Path("/proc/meminfo")) or "").splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable", "SwapTotal", "SwapFree", "Shmem"):
            value = rest.split()
            if value and value[0].isdigit():
                out[key] = int(value[0]) * 1024
    return out


def kernel_messages(dmesg_text: str) -> dict[str, list[str]]:
    """OOM-killer, Xid, NVRM and segfault lines from ``dmesg`` output (last 200 of each)."""
    found: dict[str, list[str]] = {k: [] for k in _KERNEL_PATTERNS}
    for line in dmesg_text.splitlines():
        for kind, pattern in _KERNEL_PATTERNS.items():
            if pattern.search(line):
                found[kind].append(line.rstrip())
                break
    return {k: v[-MAX_KERNEL_LINES:] for k, v in found.items()}


# -- as collector actions ---------------------------------------------------------------------
def run_command(bundle: Bundle, key: str, step: float) -> CommandResult | Action | None:
    """Run one of :data:`COMMANDS`; a tool missing on this host is an ``absent`` action."""
    name, argv, path = COMMANDS[key]
    exe = shutil.which(argv[0])
    if exe is None:
        return bundle.record(Action(name=name, kind="command", target="host", command=argv,
                                    status=ABSENT,
                                    error=f"{argv[0]} not found on PATH"))
    return bundle.command(name, [exe, *argv[1:]], target="host", path=path, step_timeout=step)


def command_status(result: CommandResult | Action | None) -> str:
    if result is None:
        return SKIPPED
    action = result if isinstance(result, Action) else result.action
    return action.status if action else ERROR


def write_host_json(bundle: Bundle, results: dict[str, CommandResult | Action | None], *,
                    limits_pid: int | None, step: float) -> None:
    """``host/host.json`` from the command results, as one bounded probe."""
    ip_res = results.get("ip")
    ip_json = ip_res.stdout if isinstance(ip_res, CommandResult) and ip_res.exit_code == 0 \
        else None
    dmesg = results.get("dmesg")
    dmesg_status = command_status(dmesg)
    if isinstance(dmesg, CommandResult) and dmesg.action is not None and dmesg_status == ERROR \
            and b"not permitted" in dmesg.stderr.lower():
        dmesg.action.status = dmesg_status = PERMISSION_DENIED  # dmesg_restrict
    firewall = {}
    for key in FIREWALL_COMMANDS:  # not root (no CAP_NET_ADMIN): recorded, not an error
        res = results.get(key)
        if isinstance(res, CommandResult) and res.action is not None \
                and command_status(res) == ERROR \
                and any(s in res.stderr.lower() for s in _NOT_PERMITTED):
            res.action.status = PERMISSION_DENIED
        firewall[key] = command_status(res)

    def facts() -> dict[str, Any]:
        kern = kernel()
        kern["dmesg"] = dmesg_status
        kern["messages"] = kernel_messages(
            dmesg.stdout.decode(errors="replace") if isinstance(dmesg, CommandResult) else "")
        return {**names(min(step, 2.0)), "interfaces": interfaces(ip_json), "shm": shm(),
                "limits": {"pid": limits_pid,
                           "values": procs.read_limits(limits_pid) if limits_pid else {}},
                "kernel": kern, "nvidia_smi": command_status(results.get("nvidia-smi")),
                "firewall": firewall}

    bundle.probe("host facts", facts, target="host", step_timeout=step, path=layout.HOST_FACTS)
