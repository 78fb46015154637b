"""NCCL ranks cannot connect to each other.

## What it detects
NCCL's rank-to-rank socket connections failing: "socketStartConnect: exceeded retries (20000)"
(refused, 2.16–2.23), "connect to 10.0.0.2<45763> returned No route to host, exceeded error
retry count after 35 attempts" (2.24+), "Connect to ... failed : Software caused connection
abort", a handshake with the wrong magic (a stray client or a peer with another uniqueId),
failed proxy calls, and a log that ends in NCCL's connect retries ("Call to connect returned
Connection refused, retrying", 2.4–2.15: the last attempt is never announced), and a connection
that failed or closed while the communicators were set up (NCCL's return chain through
bootstrap.cc / init.cc, a traceback through DDP's first collectives, a refused connection; when
the call that failed is an ibverbs call on the process's own device, "Call to ibv_create_cq
failed", the process that printed it is named: no peer was in it). With
none of these, and NCCL's WARN lines not in the inputs, a bare
"NCCL error ...: unhandled system error" (a system call failed) of a job the inputs show on
more than one host, or only its return chain through NCCL's socket or bootstrap code ("NCCL
INFO bootstrap.cc:270 -> 2"), is reported as the likely connection failure at a low confidence:
between hosts, sockets are where it fails most often (on one host, /dev/shm: NCCL003); not when
the return chain starts in NCCL's topology detection (graph/xml.cc, graph/topo.cc,
misc/nvmlwrap.cc: a VM, WSL or container hiding the PCI tree or a GPU), which is no connection.

## Why it hangs or kills the job
Communicator setup (or a later connection) cannot reach the peer: refused means nothing listens
there (the peer died, or advertised the wrong interface); timed out / no route means a firewall,
a wrong subnet or a host that is down. The rank fails and the others wait.

## Evidence
The failing connection lines with the peer address and error.

## Remedy
Check that every node can reach the others on the interface NCCL picked (see the `Bootstrap :
Using` / `NET/Socket : Using` lines), pin the right one with NCCL_SOCKET_IFNAME, open the
firewall between nodes for NCCL's ephemeral ports; if a peer crashed first, fix that.

## Example
```
gpu7:1234:1290 [3] misc/socket.cc:483 NCCL WARN socketStartConnect: exceeded retries (20000)
```
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import polars as pl

from ddp_autopsy.analyzer.attribution import declared_nodes
from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.analyzer.ranksets import subject
from ddp_autopsy.rules.base import Finding, Rule, ending


class NcclConnectionFailure(Rule):
    code = "NCCL005"
    slug = "nccl-connection-failure"
    cause = "nccl_connection_failure"
    severity = "critical"

    def check(self, job: Job) -> Iterator[Finding]:
        # (the proxy's "Failed to execute operation Connect" names no peer: its transport
        # setup, which a CUDA failure of the same process just before it makes fail too)
        cuda = job.rows("cuda_failure")
        rows = [r for r in job.rows("nccl_connect_failure")
                if r["data"].get("addr") or not r["data"].get("op") or not any(
                    c["source"] == r["source"] and c["line"] <= r["line"]
                    and (None in (c["pid"], r["pid"]) or c["pid"] == r["pid"]) for c in cuda)]
        if not rows:
            found = list(self._retries_to_the_end(job)) or list(self._lost_at_setup(job)) \
                or list(self._mpi_unreachable(job))
            yield from found or self._system_error(job)
            return
        peers = sorted({r["data"]["addr"] for r in rows if r["data"].get("addr")})
        errors = sorted({r["data"]["err"] for r in rows if r["data"].get("err")} | {"connection refused (retries exhausted)" for r in rows
                                  if "exceeded retries" in r["text"]}
                        | {f"wrong {r['data']['what']} in the handshake" for r in rows
                           if r["data"].get("what")})
        summary = "NCCL ranks could not connect to each other"
        if peers:
            summary += f" (to {', '.join(peers[:4])})"
        if errors:
            summary += f": {'; '.join(errors[:3])}"
        yield self.from_rows(rows, summary + ".", confidence=0.8,
                             details={"peers": peers, "errors": errors})

    def _mpi_unreachable(self, job: Job) -> Iterator[Finding]:
        """Open MPI's help text: a process "was unable to complete a TCP connection to another
        process" (its remote host on a line of its own): the hosts cannot open connections to
        each other on the ports MPI picked, most often a firewall on the remote host."""
        heads = job.rows("mpi_tcp_unreachable")
        if not heads:
            return
        # (the help text's own "Remote host:" lines: the ones after its head, in its file)
        hosts = [r for r in job.rows("mpi_remote_host") if any(
            h["source"] == r["source"] and 0 < r["line"] - h["line"] <= 4 for h in heads)]
        remote = sorted({str(r["data"]["remote"]) for r in hosts})
        yield self.from_rows(
            heads[:1] + hosts[:1],
            "Open MPI's processes could not open TCP connections to "
            f"{', '.join(remote) if remote else 'another host'}: a firewall on that host, or "
            "its ports closed to the job's other hosts (open them, or pin the ports and "
            "interfaces: btl_tcp_port_min_v4, oob_tcp_static_ipv4_ports, btl_tcp_if_include).",
            shown=2, ranks=(), hosts=remote, confidence=0.7, details={"remote": remote})

    def _retries_to_the_end(self, job: Job) -> Iterator[Finding]:
        """NCCL's connect retries (INFO, "Call to connect returned Connection refused,
        retrying") that are the last thing their process printed: it never connected."""
        retries = job.rows("nccl_connect_retry")
        last = ending(job, retries)
        if not last:
            return
        errors = sorted({r["data"]["err"] for r in retries if r["data"].get("err")})
        yield self.from_rows(
            [*retries[:1], *last[:1]], "NCCL ranks kept retrying to connect to each other and "
            f"the log ends there: {'; '.join(errors[:3]) or 'no connection'}.", shown=2,
            confidence=0.5, details={"errors": errors, "retries": len(retries)})

    def _lost_at_setup(self, job: Job) -> Iterator[Finding]:
        """A connection between ranks that failed or closed while NCCL set its communicators up
        (see :func:`at_setup`): the ranks never connected, nothing broke under a running job."""
        rows = job.rows("network_error") + [r for r in job.rows("peer_closed")
                                            if "NCCL" in r["text"]]
        if not rows or not at_setup(job) or job.crashes.ranks - _reporters(rows):
            return  # (a rank that crashed by itself closed its connections: CRASH001's)
        errors = sorted({str(r["data"]["err"]).strip() for r in rows if r["data"].get("err")})
        verbs = sorted({str(r["data"].get("verb")) for r in rows})
        if set(verbs) <= LOCAL_VERBS:
            # (a call on the process's own device, no peer in it: the reporter is where)
            ranks = _reporters(rows)
            text = " ".join(r["text"] for r in rows)
            why = ("a GPU buffer it could not register for GPUDirect RDMA (Bad address: the "
                   "nvidia-peermem module not loaded, or no dma-buf support; NCCL_NET_GDR_LEVEL=LOC "
                   "turns GPUDirect off)" if "Bad address" in text else
                   "most often the locked-memory limit, `ulimit -l`, in the container or job, or "
                   "the device's queue and memory-region limits")
            yield self.from_rows(
                rows, f"{subject(ranks, 'A process')} could not create "
                f"{'its' if len(ranks) <= 1 else 'their'} "
                f"InfiniBand resources ({', '.join(verbs)} failed) while NCCL connected the "
                f"communicators: a call on the local device, no peer in it ({why}).", shown=2,
                ranks=ranks, confidence=0.6,
                details={"errors": errors, "verbs": verbs, "at_setup": True})
            return
        yield self.from_rows(
            rows, "NCCL ranks could not connect to each other while setting up their "
            f"communicators{': ' + '; '.join(errors[:3]) if errors else ''}.", shown=2,
            ranks=(), confidence=0.6, details={"errors": errors, "at_setup": True})

    def _system_error(self, job: Job) -> Iterator[Finding]:
        """A bare ncclSystemError, NCCL's own account of it not in the inputs, where the
        inputs show the job on more than one host or NCCL's sockets failing (on one host
        it is NCCL003's: /dev/shm, most often)."""
        rows, sockets = bare_system_error(job)
        if not rows or not (sockets or across_hosts(job)):
            return
        yield self.from_rows(
            rows, "NCCL failed a system call (unhandled system error) and printed nothing else "
            "the inputs show: most often a connection between ranks that cannot be made (the "
            "wrong network interface, a firewall, containers on separate networks). Run with "
            "NCCL_DEBUG=INFO (and NCCL_DEBUG_SUBSYS=INIT,NET) to see which call failed.",
            shown=2, confidence=0.35, details={"estr": rows[0]["data"].get("estr")})


def bare_system_error(job: Job) -> tuple[list[dict], bool]:
    """The rows of an ncclSystemError that NCCL's own lines in the inputs do not explain
    (no WARN, no shared-memory, network or CUDA error; its return chain not from the topology
    detection), and whether its return chain runs through NCCL's socket or bootstrap code."""
    # Raised by a call (setting up, or the first collectives); the watchdog's asynchronous
    # report of one during training is another story (a link or peer lost: NCCL004's).
    errors = [r for r in job.rows("nccl_error")
              if "system error" in str(r["data"].get("estr", "")) and "watchdog" not in r["text"]]
    # (or only its return chain: a system error (2) in NCCL's socket or bootstrap code)
    trail = [r for r in job.rows("nccl_error_trace") if r["data"].get("code") == 2]
    sockets = [r for r in trail
               if any(k in str(r["data"].get("file", "")) for k in ("socket", "bootstrap"))]
    rows = errors or sockets
    if not rows or job.rows("shm_error", "network_error", "nccl_warn", "cuda_failure"):
        return [], False
    if any(str(r["data"].get("file", "")).startswith(NOT_SOCKETS) for r in trail):
        return [], False  # NCCL's return chain says where: its topology detection, not a socket
    return rows, bool(sockets)


def across_hosts(job: Job) -> bool:
    """Whether the inputs show the job on more than one host (hosts named, nodes asked for,
    NCCL channels over the network)."""
    hosts = set(job.events["host"].drop_nulls().unique().to_list()) if job.events.height \
        else set()
    if job.ranks.height:
        hosts |= {h for hs in job.ranks["hosts"].to_list() for h in hs}
    return len(hosts) >= 2 or declared_nodes(job.events) >= 2 \
        or bool(job.rows("nccl_net_channel"))  # (NCCL connected a peer over the network)


#: NCCL's sources whose system calls are no connection: the topology detection (sysfs, NVML).
NOT_SOCKETS = ("graph/", "misc/nvmlwrap")
#: NCCL's sources of communicator set-up, as its return-code chain names them.
SETUP_FILES = ("bootstrap.cc", "init.cc")
#: The first collectives of a job, where NCCL creates its communicators lazily: DDP's
#: construction-time checks and broadcasts, init_process_group's own barrier.
SETUP_CALLS = frozenset({"_verify_param_shape_across_processes", "_verify_params_across_processes",
                         "_sync_module_states", "_sync_params_and_buffers", "init_process_group",
                         "new_group", "_store_based_barrier"})


def at_setup(job: Job) -> bool:
    """Whether the failure came while NCCL set its communicators up: its return chain runs
    through bootstrap or init, a traceback through the first collectives DDP makes, a peer
    refused the connection (nothing listened there yet), an IB queue pair could not be
    brought up, or the process that failed was connecting its channels and never completed its
    communicator's init."""
    if any(str(r["data"].get("file", "")).endswith(SETUP_FILES)
           for r in job.rows("nccl_error_trace")):
        return True
    if any(SETUP_CALLS & {(r["data"].get("frame") or {}).get("func"),
                          *(r["data"].get("callers") or [])} for r in job.rows("exception")):
        return True
    # (an InfiniBand queue pair is created and moved INIT -> RTR -> RTS only while a
    # connection is being made: ibvwrap's "Call to ibv_modify_qp failed ..., curr state INIT,
    # next state RTR")
    if any("Connection refused" in str(r["data"].get("err", ""))
           or r["data"].get("verb") in QP_SETUP_VERBS for r in job.rows("network_error")):
        return True
    # (the thread that was setting up a process's channels, "host:pid:tid [0] NCCL INFO Channel
    # 00 : 1[8a000] -> 0[89000] [receive] via NET/IB/0", failed, and the process never said its
    # communicator's "Init COMPLETE": a running job's network errors come from its proxy thread)
    # (only the failing processes' lines are looked at: a large job has 100,000s of channel
    # lines)
    failed = {(r["host"], r["pid"], _tid(r["text"])) for r in job.rows("network_error")
              if r["pid"] is not None}
    if not failed:
        return False
    mine = job.active_events.filter(pl.col("pid").is_in(list({k[1] for k in failed})))
    done = {(h, p) for h, p in mine.filter(
        (pl.col("kind") == "nccl_comm_init")
        & (pl.col("data").str.json_path_match("$.phase") == "COMPLETE"))
        .select("host", "pid").iter_rows()}
    channels = mine.filter(pl.col("kind").is_in(["nccl_channel", "nccl_net_channel"]))
    return any((h, p) not in done and (h, p, _tid(text)) in failed
               for h, p, text in channels.select("host", "pid", "text").iter_rows())


#: NCCL's line head "host:pid:tid [dev]": the thread that printed it.
_NCCL_TID = re.compile(r":\d+:(\d+) \[\d+\]")


def _tid(text: str) -> int | None:
    m = _NCCL_TID.search(text)
    return int(m.group(1)) if m else None


#: ibverbs calls NCCL's IB transport makes only while connecting two ranks.
QP_SETUP_VERBS = frozenset({"ibv_create_qp", "ibv_modify_qp", "ibv_create_cq", "ibv_alloc_pd"})
#: ibverbs calls on the process's own device alone (no peer's address or queue pair in them).
LOCAL_VERBS = frozenset({"ibv_create_cq", "ibv_alloc_pd", "ibv_create_qp", "ibv_reg_mr",
                         "ibv_reg_mr_iova2", "ibv_reg_dmabuf_mr"})


def _reporters(rows: list[dict]) -> set[int]:
    return {r["rank"] for r in rows if r["rank"] is not None}
