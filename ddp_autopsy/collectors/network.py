"""Probing the rendezvous endpoint (MASTER_ADDR:MASTER_PORT) from this host.

For each distinct endpoint of the job: does the address resolve (all addresses); is the port
listening here and which process holds it (``/proc/net/tcp{,6}`` LISTEN sockets, socket inode →
pid through ``/proc/*/fd``); and a bounded TCP connect. Every step has its own timeout.

``/proc/net/tcp`` sample (addresses are little-endian hex per 32-bit word, state 0A = LISTEN)::

      sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
       0: 0100007F:7373 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 6811
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddp_autopsy.collectors import procs
from ddp_autopsy.collectors.bundle import run_bounded
from ddp_autopsy.redact import redact_argv

TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1",
              "05": "FIN_WAIT2", "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT",
              "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING"}
CONNECT_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class TcpSocket:
    local_addr: str
    local_port: int
    remote_addr: str
    remote_port: int
    state: str
    uid: int
    inode: int


def _decode_addr(hexaddr: str) -> str:
    """``0100007F`` → ``127.0.0.1``; 32 hex digits → IPv6 (four little-endian words)."""
    raw = bytes.fromhex(hexaddr)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = struct.unpack("<4I", raw)
    addr = ipaddress.IPv6Address(struct.pack(">4I", *words))
    return str(addr.ipv4_mapped or addr)


def parse_proc_net_tcp(text: str) -> list[TcpSocket]:
    """Sockets from the text of ``/proc/net/tcp`` or ``/proc/net/tcp6``."""
    out = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        local, remote = fields[1].split(":"), fields[2].split(":")
        try:
            out.append(TcpSocket(
                local_addr=_decode_addr(local[0]), local_port=int(local[1], 16),
                remote_addr=_decode_addr(remote[0]), remote_port=int(remote[1], 16),
                state=TCP_STATES.get(fields[3].upper(), fields[3]), uid=int(fields[7]),
                inode=int(fields[9])))
        except (ValueError, IndexError):
            continue
    return out


def tcp_sockets(proc_root: Path = Path("/proc")) -> list[TcpSocket]:
    sockets: list[TcpSocket] = []
    for name in ("tcp", "tcp6"):
        try:
            sockets += parse_proc_net_tcp((proc_root / "net" / name).read_text())
        except OSError:
            continue
    return sockets


def listeners(port: int) -> list[TcpSocket]:
    return [s for s in tcp_sockets() if s.state == "LISTEN" and s.local_port == port]


def socket_owners(inodes: set[int], first: Iterable[int] = ()) -> dict[int, int]:
    """``{inode: pid}`` for the given socket inodes; the ``first`` pids are searched before the
    rest of ``/proc`` (the job's own processes usually hold the port)."""
    wanted = {f"socket:[{i}]": i for i in inodes}
    found: dict[int, int] = {}
    first = list(first)
    for pid in first + [p for p in procs.list_pids() if p not in set(first)]:
        for target in procs.fd_targets(pid):
            if target in wanted and wanted[target] not in found:
                found[wanted[target]] = pid
        if len(found) == len(wanted):
            break
    return found


def resolve(host: str, timeout: float) -> dict[str, Any]:
    """``{"resolves": bool|None, "addresses": [...], "error": str|None}``; None = timed out."""
    outcome = run_bounded(lambda: socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP),
                          timeout, "getaddrinfo")
    if not outcome.done:
        return {"resolves": None, "addresses": [], "error": f"timed out after {timeout:.1f}s"}
    if outcome.error is not None:
        return {"resolves": False, "addresses": [], "error": str(outcome.error)}
    addrs = list(dict.fromkeys(str(info[4][0]) for info in outcome.value or []))
    return {"resolves": bool(addrs), "addresses": addrs, "error": None}


def connect(address: str, port: int, timeout: float = CONNECT_TIMEOUT_S) -> dict[str, Any]:
    """A TCP connect to a numeric ``address``, closed at once: ``{ok, error, ms, address}``."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    start = time.monotonic()
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect((address, port))
        ok, error = True, None
    except OSError as exc:
        ok, error = False, (f"timed out after {timeout:.1f}s" if isinstance(exc, TimeoutError)
                            else f"{type(exc).__name__}: {exc.strerror or exc}")
    return {"ok": ok, "error": error, "ms": round((time.monotonic() - start) * 1000, 2),
            "address": address}


def probe_endpoint(addr: str, port: int | None, job_pids: Iterable[int], *, timeout: float,
                   source: str = "env") -> dict[str, Any]:
    """One ``network/probe.json`` entry."""
    t_end = time.monotonic() + timeout
    entry: dict[str, Any] = {"master_addr": addr, "master_port": port, "source": source}
    entry.update(resolve(addr, max(0.1, t_end - time.monotonic())))
    entry.update({"listening_here": None, "listen_addresses": [], "holder_pid": None,
                  "holder_cmdline": None, "connect": None})
    if port is None:
        return entry
    socks = listeners(port)
    entry["listening_here"] = bool(socks)
    entry["listen_addresses"] = sorted({s.local_addr for s in socks})
    if socks:
        owners = socket_owners({s.inode for s in socks}, first=job_pids)
        holder = next((owners[s.inode] for s in socks if s.inode in owners), None)
        entry["holder_pid"] = holder
        if holder is not None:
            entry["holder_cmdline"] = redact_argv(procs.read_cmdline(holder) or ())
    if entry["addresses"]:
        left = max(0.1, min(CONNECT_TIMEOUT_S, t_end - time.monotonic()))
        entry["connect"] = connect(entry["addresses"][0], port, left)
    else:
        entry["connect"] = {"ok": False, "error": "address did not resolve", "ms": None,
                            "address": None}
    return entry


def endpoints(envs: Iterable[dict[str, str]], extra: Iterable[tuple[str, int | None, str]] = ()
              ) -> list[tuple[str, int | None, str]]:
    """Distinct ``(addr, port, source)`` from the job's environments plus launcher options."""
    seen: dict[tuple[str, int | None], str] = {}
    for env in envs:
        addr = env.get("MASTER_ADDR")
        if addr:
            port = env.get("MASTER_PORT", "")
            seen.setdefault((addr, int(port) if port.isdigit() else None), "env")
    for addr, port, source in extra:
        seen.setdefault((addr, port), source)
    return [(a, p, s) for (a, p), s in seen.items()]



def rdzv_endpoints(cmdline: Iterable[str]) -> list[tuple[str, int | None, str]]:
    """torchrun's ``--rdzv-endpoint HOST[:PORT]`` (IPv6 in brackets) from its command line."""
    args = list(cmdline)
    out: list[tuple[str, int | None, str]] = []
    for i, arg in enumerate(args):
        value = None
        if arg in ("--rdzv-endpoint", "--rdzv_endpoint") and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(("--rdzv-endpoint=", "--rdzv_endpoint=")):
            value = arg.split("=", 1)[1]
        if not value:
            continue
        host, sep, port = value.rpartition(":")
        if not sep or "]" in port or (host.count(":") and not host.startswith("[")):
            host, port = value, ""  # no port, or a bare IPv6 address
        out.append((host.strip("[]"), int(port) if port.isdigit() else None, "rdzv-endpoint"))
    return out
