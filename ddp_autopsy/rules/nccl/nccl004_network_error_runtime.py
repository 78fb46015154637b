"""The network failed under a running job.

## What it detects
Connection resets and receive failures between ranks in NCCL's socket transport ("Call to recv
from 10.0.0.2<33759> failed : Connection reset by peer"), InfiniBand completion errors
("Got completion from peer ... with status=12", i.e. IBV_WC_RETRY_EXC_ERR) and fatal IB async
events. Reported as the root cause only when nothing else failed first: a peer that crashed
resets its connections too.

From `collect` bundles of a live job: a node whose connect to the master port times out while
the master's node shows that port listening. Packets between them are dropped (a refused connect
would mean nothing listens). The side is told by the nodes' packet filters (`host/firewall/` in
the bundle: `iptables-save`, `ip6tables-save`, `nft list ruleset`): a node whose DROP / REJECT
rule matches the job's interface, port or peers is the one named, with that rule. Without such a
rule, with three nodes or more, a master that no other node reaches is the node cut off; with
two nodes the side cannot be told, and the node that fails to connect is named.

From logs alone, with none of these lines: every rank of the job timed out in the same
collective (watchdog or Gloo timeouts from all of them, at one sequence number or in one
`torch.distributed` call) and none failed by itself. All reached it and no data moved, so the
link between them (or the transport) is reported, at a low confidence; a rank that did not time
out is COLL012's silent rank instead. A rank that lost its peers in that same call after the
others timed out (Gloo closes its pairs on a timeout) counts as having reached it, and so does a
rank the desync report lists as "joined but didn't finish collective #N". Not when the
inputs name one machine only: no network links those ranks (COLL001's suspicion instead).
The node is named when the launchers tell it, one log per node: a launcher whose own read of the
rendezvous store timed out (`waitForInput: socket ... timed out`) lost the master; before that
timeout ends, a launcher that never reported its workers' failures (torchelastic's `failed
(exitcode: ...)` or its summary) while every other node's did is waiting on the store it can
no longer reach. When every launcher but the master's is cut off from the store, the master's
node is the one cut off. With two nodes the side cannot be told from logs and the caveat is said.

## Why it hangs or kills the job
A collective in flight loses its connection; NCCL reports ncclRemoteError or ncclSystemError and
the watchdog takes the process down, and the others follow.

## Evidence
The transport error lines with the peer address and the decoded IB status; or each bundle's
network probe (`network/probe.json`: the connect that timed out, the port listening) and the
packet-filter rule that drops the job's traffic (`host/firewall/`).

## Remedy
Check the links between the named hosts (NIC and switch counters, `ibstat`, cabling, link
flaps), exclude flaky nodes, and for IB retry exhaustion consider `NCCL_IB_TIMEOUT`/
`NCCL_IB_RETRY_CNT`. If a rank crashed first, fix that instead. A connect that times out
between nodes: look for a firewall rule (`iptables -S`, security groups) or a link down on
either side (`ip link`, `ping` both ways).

## Example
```
torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, remote process exited or there was a network error, NCCL version 2.21.5
ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.
Last error:
socketProgressOpt: Call to recv from 172.16.0.4<33759> failed : Connection reset by peer
```
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import polars as pl

from ddp_autopsy.analyzer.attribution import one_host
from ddp_autopsy.analyzer.firewall import blocking_rules
from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.analyzer.patterns import kinds_tagged
from ddp_autopsy.analyzer.ranksets import parse_ranks
from ddp_autopsy.bundle_layout import FIREWALL, NETWORK_PROBES
from ddp_autopsy.rules.base import Evidence, Finding, Rule, rank_phrase
from ddp_autopsy.rules.coll.coll012_silent_ranks import backward_split, collective_frames
from ddp_autopsy.rules.crash.crash001_rank_crashed import CONSEQUENCE
from ddp_autopsy.rules.nccl.nccl005_nccl_connection_failure import at_setup

IB_STATUS = {4: "IBV_WC_LOC_PROT_ERR", 5: "IBV_WC_WR_FLUSH_ERR", 10: "IBV_WC_REM_ACCESS_ERR",
             12: "IBV_WC_RETRY_EXC_ERR (peer unreachable or link down)",
             13: "IBV_WC_RNR_RETRY_EXC_ERR"}


class NetworkErrorRuntime(Rule):
    code = "NCCL004"
    slug = "network-error-runtime"
    cause = "network_error_runtime"
    severity = "error"

    def check(self, job: Job) -> Iterator[Finding]:
        rows = job.rows("network_error")
        if not rows:
            found = [*self._cut_off(job), *self._store_silent(job)]
            found = found or list(self._launcher_silent(job))
            yield from found or self._all_stalled(job)
            return
        if at_setup(job):
            return  # the ranks never connected: NCCL005's connection failure at set-up
        peers = sorted({r["data"]["peer"] for r in rows if r["data"].get("peer")})
        statuses = sorted({r["data"]["status"] for r in rows
                           if r["data"].get("status") is not None})
        what = "; ".join(IB_STATUS.get(s, f"IB status {s}") for s in statuses) or "; ".join(
            sorted({str(e).strip().rstrip(".") for r in rows
                    if (e := r["data"].get("err") or r["data"].get("event"))})[:2])
        summary = "The network failed under the running job"
        if peers:
            summary += f": connections to {', '.join(peers[:4])} broke"
        if what:
            summary += f" ({what})"
        yield self.from_rows(rows, summary + ".", confidence=0.55,
                             details={"peers": peers, "ib_status": statuses})

    def _cut_off(self, job: Job) -> Iterator[Finding]:
        """Bundles of a live job: a node's connect to the master port times out while the
        master's own node shows that port listening, so packets between them are dropped (a
        firewall rule, a link or a switch port down). Refused would mean nothing listens."""
        listening: dict[int, str] = {}  # port -> the host listening on it
        tried: dict[str, dict[int, dict]] = {}  # host -> port -> its probe
        where: dict[str, str] = {}  # host -> its bundle's probe file
        for b in job.bundles:
            host = b.manifest.get("host")
            if host:
                where[host] = f"{b.display}/{NETWORK_PROBES}"
            for p in b.probes:
                port = p.get("master_port")
                if not host or not isinstance(port, int):
                    continue
                if p.get("listening_here"):
                    listening[port] = host
                else:
                    tried.setdefault(host, {})[port] = p
        probing = {h: {port: p for port, p in ports.items() if port in listening}
                   for h, ports in tried.items() if h not in listening.values()}
        probing = {h: ports for h, ports in probing.items() if ports}
        cut = sorted(h for h, ports in probing.items() if ports and all(
            not (p.get("connect") or {}).get("ok")
            and "timed out" in str((p.get("connect") or {}).get("error", ""))
            for p in ports.values()))
        if not cut:
            return
        master = sorted(set(listening.values()))
        blocked = blocking_rules(job)
        walls = sorted(h for h in blocked if h in cut or h in master)
        if walls:
            # the side is told by the node whose own packet filter drops the job's traffic
            culprits = walls
            rule = blocked[walls[0]][0]
            summary = (f"{', '.join(walls)} drops the job's packets: its firewall has "
                       f"`{rule.text}`"
                       + (f" and {sum(map(len, blocked.values())) - 1} more rule(s)"
                          if sum(map(len, blocked.values())) > 1 else "")
                       + f" matching the job's traffic, and {', '.join(cut)} "
                       f"time{'s' if len(cut) == 1 else ''} out connecting to the master port "
                       f"on {', '.join(master)}, which shows it listening")
        elif len(cut) >= 2 and len(cut) == len(probing):
            culprits = master  # no other node reaches the master: the master's node is cut off
            summary = (f"{', '.join(master)} is cut off from the network: the other nodes "
                       f"({', '.join(cut)}) time out connecting to its port, which it shows "
                       "listening (packets dropped: a firewall rule, a link or switch port down)")
        else:
            culprits = cut
            summary = (f"{', '.join(cut)} cannot reach {', '.join(master)} any more: connecting "
                       "to the master port times out while that node shows it listening "
                       "(packets dropped between them: a firewall rule, a link or switch port "
                       "down)")
        ports = sorted({port for h in cut for port in probing[h]})
        ranks = [] if not job.rank_state.height else sorted(
            job.rank_state.filter(pl.col("host").is_in(culprits))["rank"].to_list())
        dumps = {b.manifest.get("host"): b.display for b in job.bundles}
        evidence = [Evidence(path=f"{dumps.get(h)}/{FIREWALL[r.source]}", line=None, host=h,
                             text=f"{r.source} on {h}: {r.text}")
                    for h in walls for r in blocked[h][:3]]
        evidence += [Evidence(path=where[h], line=None, host=h,
                              text=f"connect {p.get('master_addr')}:{port} from {h}: "
                                   f"{(p.get('connect') or {}).get('error')}")
                     for h in cut[:3] for port, p in sorted(probing[h].items())[:1]]
        yield self.finding(
            summary + ".", evidence=evidence, ranks=ranks, hosts=culprits,
            confidence=0.65 if walls else 0.5,
            details={"master": master, "ports": ports, "timed_out_from": cut,
                     "firewall": {h: [r.text for r in blocked[h]] for h in walls}})

    def _store_silent(self, job: Job) -> Iterator[Finding]:
        """Logs: every rank timed out in the same collective, none crashed or lost a peer
        first, and a launcher's own read of the rendezvous store got no answer (``waitForInput:
        socket ... timed out``): the network between that node and the master stopped carrying
        packets mid-training. Its ranks are the ones its log holds."""
        silent = [r for r in job.rows("store_wait_timeout") if r["rank"] is None]
        if not silent:
            return
        stall = same_call_stall(job)
        if stall is None:
            return  # not every rank stalled in one collective: someone else is the story
        _, ranks, what = stall
        ops = [what]
        by_source = _ranks_by_source(job)
        sources = {r["source"] for r in silent}
        others = set(by_source) - sources
        near = set().union(*(by_source.get(s, set()) for s in sources))
        if len(sources) >= 2 and len(others) == 1:
            # Every other node's launcher lost the store: the master's node is the one cut off.
            mine = sorted(by_source[others.pop()])
            summary = (f"Every rank timed out in the same collective while the launchers of "
                       f"{len(sources)} nodes got no answer from the rendezvous store: the node "
                       f"of ranks {', '.join(map(str, mine))}, which hosts it, was cut off from "
                       "the network mid-training (a firewall rule, a link or switch port down).")
        else:
            mine = sorted(near) if near and near != ranks else []
            who = f"the node of ranks {', '.join(map(str, mine))}" if mine else "a node"
            summary = (f"Every rank timed out in the same collective while {who} got no answer "
                       "from the rendezvous store: the network between that node and the master "
                       "stopped carrying packets mid-training (a firewall rule, a link or switch "
                       "port down).")
        yield self.from_rows(
            silent, summary, shown=2, ranks=mine, confidence=0.45,
            details={"timed_out": sorted(ranks), "collective": sorted(ops)})

    def _launcher_silent(self, job: Job) -> Iterator[Finding]:
        """Logs, one file per node: every rank timed out in the same collective, and the
        launchers of the other nodes reported their workers' failures (torchelastic's
        "failed (exitcode: ...)" or its summary) while one node's launcher, whose workers
        failed alike, printed nothing after them. A launcher closes its rendezvous in the store
        before it reports; one that cannot reach the store waits there. Its node is the one
        the network cut off (before the launcher's own store timeout, `_store_silent`'s line,
        ends). With one node reporting and every other silent, the reporting node hosts the
        store and is the one cut off."""
        stall = same_call_stall(job)
        if stall is None or one_host(job):
            return
        _, ranks, what = stall
        by_source = _ranks_by_source(job)
        if len(by_source) < 2 or set().union(*by_source.values()) != ranks \
                or sum(map(len, by_source.values())) != len(ranks):
            return  # not one file per node holding the stalled ranks
        reports = job.rows("worker_failed", "elastic_failure")
        reported = {r["source"] for r in reports} & set(by_source)
        silent = set(by_source) - reported
        if not reported or not silent:
            return
        if len(silent) == 1:
            cut = silent.pop()
            how = (f"while the launcher of every other node reported its workers' failures, "
                   f"the node of {rank_phrase(by_source[cut])} said nothing: "
                   "its launcher waits on the rendezvous store it can no longer reach")
        elif len(reported) == 1:
            cut = reported.pop()
            how = (f"while only the launcher of the node of {rank_phrase(by_source[cut])}, "
                   "which hosts the rendezvous "
                   "store, reported its workers' failures: the other launchers wait on the "
                   "store they can no longer reach")
        else:
            return
        mine = sorted(by_source[cut])
        hosts = job.active_events.filter(pl.col("source") == cut)["host"].drop_nulls() \
            .unique().sort().to_list()
        evidence = [r for r in stall[0] if r["rank"] in mine][:2] + [
            r for r in reports if r["source"] in reported][:1]
        caveat = (" With two nodes the side cannot be told from logs: a cut on the other node "
                  "reads the same (collect's packet filters tell).") if len(by_source) == 2 else ""
        yield self.from_rows(
            evidence, f"Every rank timed out in {what} {how}. That node was likely cut off "
            f"from the network mid-training (a firewall rule, a link or switch port down).{caveat}",
            shown=3, ranks=mine, hosts=hosts, confidence=0.42,
            details={"timed_out": sorted(ranks), "collective": what})

    def _all_stalled(self, job: Job) -> Iterator[Finding]:
        """Every rank of the job timed out in the same collective, none failed by itself: they
        all reached it and no data moved between them. With no other line to tell, the link
        between them (or the transport) is the likely story, at a low confidence."""
        stall = same_call_stall(job)
        if stall is None or one_host(job):
            return  # on one machine no network links them: COLL001's arguments-differ suspicion
        hang, ranks, what = stall
        hosts = sorted({r["host"] for r in hang if r.get("host")})
        yield self.from_rows(
            hang, f"Every rank ({rank_phrase(sorted(ranks))}) reached {what} and none could "
            "complete it before the timeout (their timeouts, or the desync report's \"joined but "
            "didn't finish\"), so no data moved between them. With no "
            "rank failing or missing, the likely cause is the network between them (a link or "
            "switch port down, a firewall rule) or the transport stalling.", shown=3, ranks=(),
            hosts=hosts, confidence=0.4, details={"ranks": sorted(ranks), "collective": what})


def _ranks_by_source(job: Job) -> dict[str, set[int]]:
    """Each input file's ranks (one file per node: the ranks of that node)."""
    by_source: dict[str, set[int]] = {}
    ranked = job.active_events.filter(pl.col("rank").is_not_null())
    for source, rank in ranked.select("source", "rank").iter_rows():
        by_source.setdefault(source, set()).add(rank)
    return by_source


def same_call_stall(job: Job) -> tuple[list[dict[str, Any]], set[int], str] | None:
    """(timeout rows, ranks, collective) when every rank of the job timed out in the same
    collective, or lost its peers there after others had (Gloo closes its pairs on a timeout),
    and none failed by itself; else None."""
    hang = job.rows(*kinds_tagged("hang"))
    if not hang:
        return None
    frames = collective_frames(job)
    ranks = {r["rank"] for r in hang if r["rank"] is not None} | set(frames)
    # the desync report's "[0, 1, ..., 15] joined but didn't finish collective #730": those
    # ranks reached the collective that timed out, whether or not their own lines are here
    seqs = {r["data"].get("seq") for r in hang if r["kind"] == "watchdog_timeout"}
    for r in job.rows("desync_not_finished"):
        if r["data"].get("seq") in seqs:
            ranks |= parse_ranks(r["data"].get("ranks"))
    if job.rows("desync_not_joined"):
        return None  # the report names ranks that never joined: no stall of them all
    seen = job.events["rank"].drop_nulls() if job.events.height else []
    world = job.world_size or (max([*ranks, *seen]) + 1 if ranks else 0)
    if world < 2 or ranks != set(range(world)) or job.rows("oom"):
        return None
    if any(not CONSEQUENCE.search(r["text"]) for r in job.rows("exception")):
        return None  # a rank's own error is the story
    if backward_split(job)[0]:
        return None  # ranks in DDP's gradient all-reduce, in backward: COLL004's to compare
    where = {(r["data"].get("op"), r["data"].get("seq"), r["data"].get("nin")) for r in hang
             if r["kind"] == "watchdog_timeout"}
    funcs = {r["data"]["frame"]["func"] for r in frames.values()}
    if len(where) > 1 or len(funcs) > 1:
        return None  # not the same collective: a mismatch, not a stall
    what = next(iter(funcs), None) or next((op for op, _, _ in where if op),
                                           "the same collective")
    return hang, ranks, what
