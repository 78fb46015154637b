"""The rendezvous port is already taken by another process.

## What it detects
The process that hosts the TCPStore (torchrun's agent, or rank 0) could not bind MASTER_PORT:
PyTorch's "failed to bind to ...:PORT (errno: 98 - Address already in use)" (on Windows "(system
error: 10048 - ...)", Winsock's code with its text in the system's language), the libuv store's
EADDRINUSE, a plain `RuntimeError: Address already in use`, or NCCL's "Call to bind failed"; at a
lower confidence, the store's "failed to listen on any local network address" whose reason the
inputs cut off (the line ends at its code: a paste's cut). A
ZeroMQ socket's (`zmq.error.ZMQError: Address already in use (addr='tcp://...')`: a serving
framework's own queues, vLLM's or SGLang's) is told apart, with its own remedy. And, with no
bind error shown, a single-node torchrun --standalone job (its rendezvous id a UUID) that lost
its store after the rendezvous completed: older releases' --standalone used the fixed endpoint
localhost:29400, so a second job on the host shared the first one's store and lost it when that
job ended.

## Why it hangs or kills the job
Without the store no rank can rendezvous: the store host dies at start-up and the other ranks
wait for a master that never comes up, then time out.

## Evidence
Log lines with the bind failure and the port; when `collect` ran on the master host, the process
that holds the port (from /proc/net/tcp and socket inodes).

## Remedy
Free the port (an earlier run of the same job is often still alive: find it with
`ss -ltnp 'sport = :PORT'`), or give each job its own port: `torchrun --master-port PORT`, or
`--rdzv-endpoint host:0` / `--standalone` so torchrun picks a free one.

## Example
```
[W socket.cpp:426] [c10d] The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use).
RuntimeError: The server socket has failed to listen on any local network address. The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use).
```
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import polars as pl

from ddp_autopsy.analyzer.attribution import declared_nodes
from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.rules.base import Finding, Rule, evidence_of, first_ts, ranks_of
from ddp_autopsy.rules.rdzv.rdzv003_master_unreachable import AFTER_RENDEZVOUS

#: pyzmq's exception for a socket whose bind failed: "zmq.error.ZMQError: Address already in use
#: (addr='tcp://10.0.0.58:40043')".
ZMQ = re.compile(r"ZMQError|\(addr='(?:tcp|ipc)://")
ZMQ_ADDR = re.compile(r"addr='([^']+)'")
#: Innermost frames of a worker's own rendezvous (init_process_group → its TCPStore, which
#: only rank 0 binds); the scanner keeps an exception's innermost frame in its data.
WORKER_RENDEZVOUS = re.compile(r"init_process_group|_tcp_rendezvous_handler|_env_rendezvous_handler"
                               r"|_create_c10d_store|rendezvous_iterator")


class PortInUse(Rule):
    code = "RDZV001"
    slug = "port-in-use"
    cause = "port_in_use"
    severity = "critical"

    def check(self, job: Job) -> Iterator[Finding]:
        rows = job.rows("port_in_use")
        if not rows:
            yield from self._listen_failed_reason_cut(job)
            yield from self._standalone_store_lost(job)
            return
        ports = sorted({r["data"]["port"] for r in rows if r["data"].get("port") is not None})
        holders = [
            p for b in job.bundles for p in b.probes
            if p.get("listening_here") and (not ports or p.get("master_port") in ports)
        ]
        where = f"port {', '.join(map(str, ports))}" if ports else "the rendezvous port"
        summary = f"The rendezvous store could not bind {where}: address already in use"
        remedy = self.remedy()
        zmq = all(ZMQ.search(r["text"]) for r in rows)
        if zmq:
            # ZeroMQ's own socket (vLLM's and SGLang's engine, worker and API-server queues), not
            # torch's store: its port comes from the serving framework, not MASTER_PORT
            addr = ZMQ_ADDR.search(rows[0]["text"])
            summary = ("A ZeroMQ socket could not bind " + (addr.group(1) if addr else where)
                       + ": address already in use (the serving framework's own queues, vLLM's "
                       "or SGLang's, not torch's rendezvous store)")
            remedy = ("Another engine or an earlier one still running on this host holds the "
                      "port: stop it (`ss -ltnp` names it), or start one engine at a time; "
                      "vLLM takes its ports from VLLM_PORT (and picks free ones when unset), "
                      "SGLang from --port / --nccl-port.")
        if holders and holders[0].get("holder_pid"):
            h = holders[0]
            cmd = " ".join(h.get("holder_cmdline") or [])[:120]
            summary += f"; it is held by pid {h['holder_pid']} ({cmd})"
        # Only the store host binds the port: rank 0's process (init_process_group's TCPStore),
        # or node 0's torchrun agent. A worker's traceback through init_process_group says which;
        # with nothing to tell, no rank is named (the agent may have failed before any worker).
        in_worker = any(WORKER_RENDEZVOUS.search(str((r["data"].get("frame") or {}).get("func", "")))
                        for r in job.rows("exception"))
        ranks = ranks_of(rows) or ({0} if in_worker or job.ranks.height else set())
        if len(ports) == 1 and not zmq:
            remedy = remedy.replace("sport = :PORT", f"sport = :{ports[0]}").replace(
                "--master-port PORT", f"--master-port <a free port, not {ports[0]}>")
        yield self.finding(
            summary + ".",
            evidence=[evidence_of(r) for r in rows[:3]],
            ranks=ranks,
            remedy=remedy,
            hosts=[r["host"] for r in rows],
            confidence=0.95,
            ts=first_ts(rows),
            details={"ports": ports},
        )

    def _listen_failed_reason_cut(self, job: Job) -> Iterator[Finding]:
        """The store's "failed to listen on any local network address" with its reason cut
        from the inputs (a paste ending at "code: -9"): a used port, most often."""
        # (cut: no code at all, or "-9" at the line's end, the start of "-98" EADDRINUSE)
        rows = [r for r in job.rows("listen_failed") if "to listen on any local" in r["text"]
                and (r["data"].get("errno") is None
                     or (r["data"].get("errno") == 9 and CODE_AT_END.search(r["text"])))]
        if not rows:
            return
        ports = sorted({int(m.group(1)) for r in rows if (m := LISTEN_PORT.search(r["text"]))})
        where = f"port {', '.join(map(str, ports))}" if ports else "its port"
        yield self.from_rows(
            rows, f"The rendezvous store could not listen on {where}, and the reason is cut from "
            "the inputs: most often the port is already in use (an earlier run, or another job "
            "on this host).", confidence=0.5, details={"ports": ports, "reason_cut": True})

    def _standalone_store_lost(self, job: Job) -> Iterator[Finding]:
        """A single-node job whose rendezvous id is a UUID (torchrun --standalone's) lost the
        rendezvous store after the rendezvous completed (a keep-alive or the shutdown failed,
        RendezvousConnectionError): --standalone of older torch releases used the fixed endpoint
        localhost:29400 (newer ones take a free port, localhost:0), and a second job whose store
        could not bind it became a client of the first job's store, which went away when that
        job ended."""
        rows = [r for r in job.rows("rdzv_connection_error")
                if any(w in r["text"] for w in AFTER_RENDEZVOUS) and UUID_RDZV.search(r["text"])]
        hosts = job.events["host"].drop_nulls().unique() if job.events.height else []
        if not rows or len(hosts) > 1 or declared_nodes(job.events) > 1 \
                or job.rows("worker_group_succeeded"):
            return
        # (a rank that is not its local rank is on a second node: no standalone job)
        ev = job.events
        if ev.filter(pl.col("rank").is_not_null() & pl.col("local_rank").is_not_null()
                     & (pl.col("rank") != pl.col("local_rank"))).height:
            return
        yield self.from_rows(
            rows, "A torchrun --standalone job lost its rendezvous store after the rendezvous "
            "had completed: its store was another job's. --standalone of older torch releases "
            "used the fixed endpoint localhost:29400; a second standalone job on the host, "
            "finding the port taken, joined the first job's store, which went away when that "
            "job ended. Give each job its own --rdzv-endpoint port, or update torch (newer "
            "releases' --standalone takes a free port).", shown=1, confidence=0.5,
            details={"ports": [29400], "shared_store": True})


#: dynamic_rendezvous's rendezvous ids made by torchrun --standalone (uuid4).
UUID_RDZV = re.compile(r"rendezvous '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}'")
#: The libuv store's listen error cut after its code, before the code's name ("code: -9").
CODE_AT_END = re.compile(r"code: -?\d+\s*$")
LISTEN_PORT = re.compile(r"port: (\d+)")
