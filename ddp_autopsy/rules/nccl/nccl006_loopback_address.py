"""A multi-host job whose ranks advertise a loopback, container-bridge or link-local address.

## What it detects
In a job spanning several hosts, NCCL ranks that bootstrap or connect over 127.x (lo), a Docker
bridge (docker0, 172.17.x) or a libvirt bridge (virbr0, 192.168.122.x): the "Bootstrap : Using
lo:127.0.0.1<0>" / "NET/Socket : Using [0]docker0:172.17.0.1<0>" lines, or Gloo failing to
connect to such an address; a MASTER_ADDR that `collect` found resolving to 127.0.1.1 (a host
name mapped to loopback in /etc/hosts); and, on any number of hosts, Gloo failing to connect to
127.0.1.1 — the Debian/Ubuntu /etc/hosts alias of the machine's own name, which Gloo advertises
when the host name resolves to it; and Gloo's own warning that it fell back to loopback ("Unable
to resolve hostname to a (local) address. Using the loopback address as fallback.") followed by
its full-mesh connect failing (on one host, loopback would have connected). Likewise NCCL bound to
127.x, a bridge or a link-local address whose connections then failed with no rank crashing, even
when the inputs name one host, and NCCL failing to connect to a link-local (169.254/16, fe80::/10:
a BMC, host-only or SR-IOV VF interface) or bridge address another rank advertised. And NCCL
finding no interface in the subnet of NCCL_COMM_ID's address ("Net : No interface found in the
same subnet as remote address ..."): this host is not on the root's network. And Open MPI's TCP
transport, or UCX under its pml ucx, failing to connect to such an address a peer published.

## Why it hangs or kills the job
Other hosts cannot reach a loopback or bridge address: they connect to themselves, to nothing,
or to another node's container, and the connection is refused or times out.

## Evidence
The interface lines with the address each host advertises.

## Remedy
Set NCCL_SOCKET_IFNAME (and GLOO_SOCKET_IFNAME) to the interface that connects the nodes (e.g.
`eth0` or `ib0`, or `^lo,docker,virbr` to exclude), and make MASTER_ADDR an address the other
nodes can reach (remove the `127.0.1.1 hostname` line from /etc/hosts or use the IP).

## Example
```
node1:4242:4242 [0] NCCL INFO Bootstrap : Using lo:127.0.0.1<0>
node2:5151:5151 [0] NCCL INFO Bootstrap : Using eth0:10.1.2.4<0>
```
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterator
from typing import Any

from ddp_autopsy.analyzer.attribution import declared_nodes
from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.analyzer.patterns import kinds_tagged
from ddp_autopsy.rules.base import Evidence, Finding, Rule, came_before, evidence_of

BRIDGES = (ipaddress.ip_network("172.17.0.0/16"), ipaddress.ip_network("192.168.122.0/24"))
#: The IPv4 prefixes of the loopback, bridge and link-local networks above (a string test
#: first: ipaddress is slow to ask a thousand ranks' addresses).
IPV4_UNREACHABLE = ("127.", "172.17.", "192.168.122.", "169.254.")


@functools.lru_cache(maxsize=4096)  # (asked per rank: a 1024-rank job has a few addresses)
def unreachable_kind(addr: str, ifname: str = "") -> str | None:
    """'loopback' / 'container bridge' for addresses other hosts cannot reach, else None."""
    if not ifname.startswith(("lo", "docker", "virbr")) and "." in addr and ":" not in addr \
            and not addr.startswith(IPV4_UNREACHABLE):
        return None  # (the common case, decided without parsing: a routable IPv4 address)
    try:
        ip = ipaddress.ip_address(addr.split("%")[0])
    except ValueError:
        return None
    if ip.is_loopback or ifname == "lo":
        return "loopback"
    if any(ip in net for net in BRIDGES) or ifname.startswith(("docker", "virbr")):
        return "container bridge"
    if ip.is_link_local:  # 169.254/16, fe80::/10: a BMC, host-only or VF-only interface
        return "link-local"
    return None


#: One "[N]ifname:addr<port>" entry of NCCL's interface list.
IFACE_ENTRY = re.compile(r"\[\d+\](?P<ifname>[^:\s]+):(?P<addr>[^\s<]+)<\d+>")

def _entries(row: dict[str, Any]) -> list[tuple[str, str]]:
    """(interface, address) of each entry an ``nccl_interface`` line lists: NCCL >= 2.5's
    "Using [0]eno1:10.0.0.5<0> [1]..." on one line, or the one interface of older lines."""
    if "Using [" in row["text"]:
        return [(m["ifname"], m["addr"]) for m in IFACE_ENTRY.finditer(row["text"])]
    return [(str(row["data"]["ifname"]), str(row["data"]["addr"]))]


#: A failure line that is Gloo's own connect failure (the exception that carries it).
GLOO_CONNECT_TEXT = ("connectFullMesh", "] connect [", "timed out connecting")


def _failed_before(job: Job, first: dict) -> bool:
    """Whether a rank crashed, or failed otherwise, before the Gloo failure ``first``: in its
    file on an earlier line, or elsewhere at an earlier time (or at an unknown one)."""
    return any(came_before(row, first) for row in job.crashes.events.iter_rows(named=True)
               if not any(t in row["text"] for t in GLOO_CONNECT_TEXT))


def _host_of(addr: str) -> str:
    """The address of NCCL's "169.254.20.10<43369>" / "fe80::1%eth1<51577>"."""
    return addr.split("<", 1)[0]


class LoopbackAddress(Rule):
    code = "NCCL006"
    slug = "loopback-address"
    cause = "loopback_address"
    severity = "critical"

    def check(self, job: Job) -> Iterator[Finding]:
        found = list(self._unreachable(job)) or list(self._no_subnet_match(job)) \
            or list(self._socket_device(job)) or list(self._mpi_tcp(job))
        found = found or list(self._gloo_unanswered(job))
        yield from found or self._loopback_listed(job)

    def _mpi_tcp(self, job: Job) -> Iterator[Finding]:
        """Open MPI's TCP transport (Horovod, mpirun-launched jobs, before NCCL starts), or UCX
        under its pml ucx ("connect(fd=.., dest_addr=169.254.4.6:52595) failed"), failed
        to connect to a bridge, link-local or loopback address a peer published, or reached
        another process than the one it dialled: the hosts share an address (every host's
        docker0 or virbr0 has the same one), so Open MPI takes that interface for the job."""
        rows = job.rows("mpi_tcp_failure")
        if not rows or _failed_before(job, rows[0]):
            return
        wrong = [r for r in rows if r["data"].get("wrong_peer")]
        bad = [(r, kind) for r in rows
               if (kind := unreachable_kind(str(r["data"].get("addr", ""))))]
        if not wrong and not bad:
            return
        parts = [f"connect() to {r['data']['addr']} ({kind}) failed" for r, kind in bad[:2]]
        if wrong:
            parts.append("a connection reached another process than the one dialled (an "
                         "address every host has)")
        ucx = bool(bad) and all("UCX" in r["text"] for r, _ in bad)
        transport, exclude = (
            ("UCX (Open MPI's pml ucx)", "Pin UCX to the interface the hosts share "
             "(`UCX_NET_DEVICES=<that interface>`, or `UCX_TLS` without the unreachable one)")
            if ucx else ("Open MPI's TCP transport", "Exclude it (`--mca btl_tcp_if_exclude "
                         "lo,docker0,virbr0` or `btl_tcp_if_include <the hosts' network>`)"))
        yield self.finding(
            f"{transport} used an interface the hosts cannot reach each other "
            f"over: {'; '.join(parts)}. {exclude}, and set NCCL_SOCKET_IFNAME the same "
            "way for NCCL.", evidence=[evidence_of(r) for r, _ in bad[:2]]
            + [evidence_of(r) for r in wrong[:1]],
            ranks=(), hosts=[r["host"] for r in rows if r["host"]], confidence=0.75,
            details={"mpi": [str(r["data"].get("addr") or "wrong peer") for r in rows[:4]]})

    def _socket_device(self, job: Job) -> Iterator[Finding]:
        """A channel over NCCL's socket transport ("via NET/Socket/1") uses the interface of
        that index in the process's "NET/Socket : Using [0]... [1]..." list; when that one is a
        loopback, bridge or link-local interface and the process's connections then failed or
        kept retrying, the peer was on another host (within one host NCCL uses P2P or SHM)."""
        lists = {(r["host"], r["pid"]): (r, _entries(r)) for r in job.rows("nccl_interface")
                 if "NET/Socket" in r["text"]}
        if not lists:
            return
        trouble = {(r["host"], r["pid"]) for r in job.rows(
            "nccl_connect_failure", "nccl_connect_retry", "network_error", "nccl_bind_failed")}
        for r in job.rows("nccl_net_channel"):
            d = r["data"]
            listed, entries = lists.get((r["host"], r["pid"]), (None, []))
            if d.get("net") != "Socket" or d.get("dev") is None or not entries \
                    or (r["host"], r["pid"]) not in trouble or d["dev"] >= len(entries):
                continue
            ifname, addr = entries[d["dev"]]
            if kind := unreachable_kind(addr, ifname):
                yield self.finding(
                    f"NCCL's socket transport connected a channel over interface {d['dev']} of "
                    f"its list, {ifname}:{addr} ({kind}), and its connections then failed: the "
                    "peer is on another host, which cannot reach that address.",
                    evidence=[evidence_of(listed), evidence_of(r)],
                    ranks=(), hosts=[r["host"]], confidence=0.75,
                    details={"interface": ifname, "address": addr, "device": d["dev"]})
                return

    def _loopback_listed(self, job: Job) -> Iterator[Finding]:
        """NCCL's socket transport took lo beside a routable interface ("NET/Socket : Using
        [0]lo:127.0.0.1<0> [1]eth0:10.0.0.5<0>", or NCCL 2.3's one "NET : Using interface" line
        each): NCCL spreads its connections over every interface it took, and in a multi-node
        job one over lo cannot reach the other host. NCCL leaves lo out by default, so the
        launch's NCCL_SOCKET_IFNAME let it in. Nothing else failing, a suspicion: the likely
        cause of a hang in such a job."""
        if job.crashes.ranks or job.rows(*kinds_tagged("failure")):
            return
        taken: dict[tuple[Any, Any], dict[str, tuple[str, dict]]] = {}
        for r in job.rows("nccl_interface"):
            if "NET/Socket" not in r["text"] and "NET : Using interface" not in r["text"]:
                continue
            for ifname, addr in _entries(r):
                taken.setdefault((r["host"], r["pid"]), {})[addr] = (ifname, r)
        for (host, _), found in taken.items():
            # (a bridge or link-local device listed, not used, is common and harmless:
            # _socket_device reads one a channel was made over)
            bad = [(f"{ifname}:{addr}", kind, row) for addr, (ifname, row) in found.items()
                   if (kind := unreachable_kind(addr, ifname)) == "loopback"]
            if bad and len(found) > len(bad):
                what, kind, row = bad[0]
                why = ("NCCL leaves lo out by default, so the launch's NCCL_SOCKET_IFNAME let it "
                       "in (a value such as '^docker0' replaces the default and no longer "
                       "excludes lo)" if kind == "loopback" else
                       "NCCL_SOCKET_IFNAME does not exclude it")
                yield self.finding(
                    f"NCCL's socket transport on {host or 'a host'} took {what} ({kind}) beside "
                    f"its routable interfaces: {why}, and in a multi-node job a connection over "
                    "it cannot reach the other host: the likely reason the job stops.",
                    evidence=[evidence_of(row)], ranks=(), hosts=[host], confidence=0.4,
                    details={"interfaces": sorted(found)})
                return

    def _gloo_unanswered(self, job: Job) -> Iterator[Finding]:
        """Gloo's full-mesh connect failed and no rank had failed before it: the address a peer
        advertised is not one this rank can reach. Refused at a loopback address, or bound to
        loopback itself (``local=[127.x]``), the advertising peer is on another host (on this
        one, loopback would have answered); with no address at all ("pair.cc:144] no error",
        "timed out connecting") the likeliest reason is the same, an address picked from the
        host name or the wrong interface (GLOO_SOCKET_IFNAME), at lower confidence."""
        rows = job.rows("gloo_connect_failure")
        if not rows or _failed_before(job, rows[0]):
            return
        looped = [r for r in rows if str(r["data"].get("local", "")).startswith("127.")
                  or (str(r["data"].get("addr", "")).startswith("127.")
                      and "refused" in str(r["data"].get("why", "")).lower())]
        if looped:
            d = looped[0]["data"]
            what = (f"this rank is bound to loopback ({d['local']})" if str(
                d.get("local", "")).startswith("127.") else
                f"a peer advertised the loopback address {d['addr']}, which refused the "
                "connection: that peer listens on another host's loopback")
            yield self.from_rows(
                looped, f"Gloo could not connect its full mesh: {what}. Gloo binds to the address "
                "the host name resolves to, and here that is loopback.", shown=2,
                confidence=0.65, details={"gloo": "loopback"})
            return
        if any(r["data"].get("addr") for r in rows):
            return  # (a routable address that failed: a network fault, not the interface)
        yield self.from_rows(
            rows, "Gloo could not connect its full mesh and names no address: no rank failed "
            "before it, so the address a peer advertised is likely one this rank cannot reach "
            "(the host name resolving to a loopback or container address, or the wrong of "
            "several interfaces). Set GLOO_SOCKET_IFNAME to the interface the hosts share; if it "
            "already is, a firewall or security group between the hosts blocks the ephemeral "
            "ports Gloo's pairs connect on (MASTER_PORT alone open is not enough).",
            shown=2, confidence=0.45, details={"gloo": "unaddressed"})

    def _no_subnet_match(self, job: Job) -> Iterator[Finding]:
        """NCCL_COMM_ID names an address in no subnet of the rank's host: NCCL has no interface
        to reach the root from (the root in a container's bridge network, or the rank in one)."""
        rows = job.rows("nccl_subnet_mismatch")
        if not rows:
            return
        addrs = sorted({str(r["data"]["addr"]) for r in rows})
        where = ", ".join(sorted({r["host"] for r in rows if r["host"]})) or "a rank's host"
        yield self.from_rows(
            rows, f"NCCL_COMM_ID's address {', '.join(addrs[:3])} is in no subnet of {where}: "
            "NCCL has no interface there to reach the root over (the root or this rank is in a "
            "container's own bridge network, or NCCL_COMM_ID names the wrong address).",
            confidence=0.7, details={"addresses": addrs})

    def _unreachable(self, job: Job) -> Iterator[Finding]:
        rows = job.rows("nccl_interface")
        hosts = {r["host"] for r in rows if r["host"]} | {
            b.manifest.get("host") for b in job.bundles if b.manifest.get("host")}
        if job.ranks.height:
            hosts |= {h for hs in job.ranks["hosts"].to_list() for h in hs}
        gloo = [r for r in job.rows("gloo_connect_failure") if r["data"].get("addr")]
        alias = [r for r in gloo if r["data"]["addr"].startswith("127.0.1.")]
        nodes = max(len(hosts), declared_nodes(job.events))
        # Gloo bound to loopback itself, then could not connect: the peers are elsewhere.
        fallback = job.rows("gloo_loopback_fallback") if job.rows("gloo_connect_failure") else []
        # NCCL bound to loopback and its connections then failed, no rank crashing: on one host
        # loopback works, so the peers were elsewhere though the inputs name one host
        # (the same for a bridge or link-local address; NCCL's socket error trail counts)
        failed = bool(job.rows("nccl_connect_failure", "network_error", "nccl_bind_failed")) or any(
            "socket" in str(r["data"].get("file", "")) for r in job.rows("nccl_error_trace"))
        stranded = failed and not job.crashes.ranks and any(
            unreachable_kind(str(r["data"].get("addr", "")), r["data"].get("ifname") or "")
            for r in rows)
        # NCCL failing to connect to a link-local or bridge address: no peer can be reached there
        targets = [(r, kind) for r in job.rows("nccl_connect_failure")
                   if (kind := unreachable_kind(_host_of(str(r["data"].get("addr", "")))))
                   and (kind != "loopback" or nodes >= 2)]
        if nodes < 2 and not alias and not fallback and not stranded and not targets:
            return  # on one host, loopback is fine
        bad = [(r, kind) for r in rows
               if (kind := unreachable_kind(r["data"]["addr"], r["data"]["ifname"]))]
        bad += [(r, "loopback: the host name's /etc/hosts alias" if r in alias else kind)
                for r in gloo if (kind := unreachable_kind(r["data"]["addr"]))
                and (r in alias or nodes >= 2)]
        bad += [(r, "Gloo fell back to loopback: the host name resolves to no local address")
                for r in fallback[:1]]
        bad += targets[:2]
        probes = [(b, p) for b in job.bundles for p in b.probes
                  if any(str(a).startswith("127.") for a in p.get("addresses") or [])]
        if not bad and not probes:
            return
        evidence = [evidence_of(r) for r, _ in bad[:3]]
        parts = sorted({f"{r['host'] or 'a rank'} uses {r['data']['ifname']}:{r['data']['addr']}"
                        f" ({kind})" if r["kind"] == "nccl_interface" else
                        f"{r['host'] or 'a rank'}: {kind}" if r["kind"] == "gloo_loopback_fallback"
                        else f"NCCL connects to {_host_of(r['data']['addr'])} ({kind})"
                        if r["kind"] == "nccl_connect_failure"
                        else f"Gloo connects to {r['data']['addr']} ({kind})" for r, kind in bad})
        for b, p in probes[:2]:
            parts.append(f"MASTER_ADDR {p.get('master_addr')} resolves to "
                         f"{', '.join(map(str, p.get('addresses')))} on {b.manifest.get('host')}")
            evidence.append(Evidence(path=f"{b.display}/network/probe.json", line=None,
                                     text=f"{p.get('master_addr')} -> {p.get('addresses')}",
                                     host=b.manifest.get("host")))
        where = f"A {len(hosts)}-host job" if len(hosts) >= 2 else \
            f"A {nodes}-node job" if nodes >= 2 else "The job"
        yield self.finding(
            f"{where} communicates over addresses the other hosts cannot reach: "
            f"{'; '.join(parts[:4])}.",
            evidence=evidence, ranks=[r["rank"] for r, _ in bad],
            hosts=[r["host"] for r, _ in bad], confidence=0.85,
            details={"hosts": sorted(hosts)},
        )
