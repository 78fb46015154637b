"""A rank died first, and took the job down with it.

## What it detects
The first rank to fail: torchelastic's "Root Cause (first observed failure)" entry (exit code or
signal), a rank's own Python exception (not one that only reports a dead peer), a
`torch.multiprocessing.spawn` child that raised or was killed, a rank whose CUDA context died of a
sticky error (an illegal memory access, a device-side assert, even when only its watchdog thread
re-raised it, or only NCCL's "Cuda failure 700 'an illegal memory access was encountered'" names
its host and pid, with no other failure before it in that file), a process an uncaught C++
exception aborted ("terminate called after throwing an instance of 'c10::CUDAError'"; not the
watchdog's DistBackendError, Gloo's enforce failures, nor one whose what() is an NCCL error), a
node whose Open MPI daemon the launcher lost ("ORTE has lost communication with a remote daemon",
"Remote daemon: [[43015,0],20] on node worker-19": named by host), a
process a fatal signal ended
(a shell's "Aborted (core dumped)", Open MPI's "[host:pid] Signal: Segmentation fault (11)"), or, at
low confidence, a rank whose traceback a paste cut before its exception line while no rank
reported anything else (lower, a process of unknown rank when nothing else failed, its innermost
frame not torchelastic's own), a backward pass that raised as autograd's anomaly mode reports it
("Error detected in AddmmBackward0. Traceback of forward call that caused the error:", its
exception cut off; unranked, the one rank its peers lost at a monitored barrier), and, lower
still, the process at the other end of a connection that
closed when nothing else failed (Gloo's "Connection closed by peer" alone). Exceptions that merely report another rank's death ("Connection closed by peer",
"Failed to recv, got 0 bytes", ncclRemoteError, watchdog timeouts, agents' SIGTERMs) are not
counted as first failures, nor is a wait that gave up (a TimeoutError, filelock's Timeout:
for a file, a queue, a peer's answer) when another rank raised something else, nor is the SIGABRT (-6) with which torch's watchdog ends its own
process after a timeout (torchelastic's exit code or mp.spawn's signal), nor an exception raised
while torch built its communication backend (init_process_group's process-group helper,
init_rpc's backend: the environment cannot run it, on every rank alike; the best-effort verdict
quotes it when no other rule knows it), nor a known error of the environment every process
raises alike while setting up (CRASH004's list). The workers' argparse usage error ("train.py: error:
unrecognized arguments: --local-rank=4", exit code 2, no traceback) is their failure when the job
ran no further (no timeouts, no lost peers); a launcher's own ("torchrun: error: ...") is not a
rank's.

## Why it hangs or kills the job
When one rank dies, the others block in their next collective until the peer connection drops
or the timeout fires, and then fail too; the launcher tears the rest down. Only the first
failure says why.

## Evidence
The exception line with its traceback's last frame, the failure summary entry with exit code
and signal; a SIGKILL (-9) with no traceback suggests the host's out-of-memory killer.

## Remedy
Fix the first failure: its exception and frame are quoted. For SIGKILL without a traceback,
check the node's kernel log for the OOM killer (`dmesg | grep -i oom`) and lower host memory use
(DataLoader workers, pinned memory, dataset caching); for SIGSEGV/SIGBUS, check native
extensions and /dev/shm.

## Example
```
[rank2]: Traceback (most recent call last):
[rank2]:   File "/work/train.py", line 25, in train_step
[rank2]:     raise ValueError("bad batch 17")
[rank2]: ValueError: bad batch 17
[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:45067
```
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from typing import Any

import polars as pl

from ddp_autopsy.analyzer.attribution import declared_nodes
from ddp_autopsy.analyzer.job import Job
from ddp_autopsy.analyzer.lines import nccl_device
from ddp_autopsy.analyzer.patterns import kinds_tagged
from ddp_autopsy.rules.base import (
    Finding,
    Rule,
    earliest_first,
    evidence_of,
    excerpt,
    first_ts,
    rank_phrase,
    subject,
)

#: Exceptions that report somebody else's failure (or the launcher's reaction to it).
CONSEQUENCE = re.compile(
    r"Connection closed by (?:remote )?peer|Connection reset by peer|Failed to recv|got 0 bytes"
    r"|Broken pipe|ncclRemoteError|remote process exited|Timed out waiting \d+ms"
    r"|(?:Read|Write) timeout \[|Application timeout caused pair closure"
    r"|Watchdog caught|caught collective operation timeout|ChildFailedError|ProcessExitedException|ProcessRaisedException"
    r"|SignalException|KeyboardInterrupt|SystemExit|Socket Timeout|DistStoreError"
    r"|wait timeout after|Resource temporarily unavailable|detected by watchdog|Terminating the process|NCCL communicator was aborted"
    r"|ncclInvalidUsage|ncclSystemError|ncclInternalError|ncclUnhandledCudaError"
    r"|Detected mismatch between collectives|disagreement between rank0 and rank"
    r"|DDP expects same model across all ranks|appears not to match (?:sizes|strides) of the same"
    # a store barrier or the store's server waiting for ranks that did not come
    r"|Timed out initializing process group in store based barrier|waiting for clients"
    r"|Is there a distributed collective mismatch|invalid device ordinal|failed to pass monitoredBarrier|Address already in use"
    r"|successfully reached monitoredBarrier"
    r"|cannot be retrieved|while trying to connect to|failed to connect to any network address"
    # Ray's driver reporting that an actor's process is gone
    r"|ActorDiedError|The actor died unexpectedly"
    # torch.multiprocessing's parent about a child (<= 1.x raised a bare Exception with it),
    # PyTorch's test runner about a test process ("test_c10d failed! Received signal: SIGIOT")
    r"|process \d+ terminated with (?:signal|exit code)|failed! Received signal: SIG"
    # vLLM's front end when its engine process failed to start (v1/engine/utils.py)
    r"|See root cause above"
    # Horovod's every other rank after one failed (common/operations.cc SHUT_DOWN_ERROR)
    r"|Horovod has been shut down"
    # a parent's report of a child command that failed (torch.distributed.launch's and
    # DeepSpeed's launchers about a worker, DeepSpeed's ssh check about a host): not a rank's own
    r"|CalledProcessError",
    re.I,
)


#: Exception types of a wait that gave up (builtins, socket, asyncio, concurrent.futures,
#: filelock, requests/httpx): the rank waited for something, another rank's failure is first.
WAITED_TYPE = re.compile(r"(?:^|\.)(?:\w*Timeout(?:Error)?|timeout)$")

#: Frames of network I/O: a timeout there is the rank's own failure (a download, a request).
IO_FRAME = re.compile(r"(?:^|/)(?:ssl|socket|socketserver)\.py$|/(?:http|urllib|urllib3|requests"
                      r"|httpx|httpcore|aiohttp|huggingface_hub|botocore|boto3|s3fs|fsspec|gcsfs"
                      r"|grpc)/")


def gave_up_waiting(data: dict[str, Any]) -> bool:
    """Whether an exception is a wait that gave up (a TimeoutError, filelock's Timeout) on
    something another process owed it, not the rank's own network I/O timing out."""
    if not WAITED_TYPE.search(str(data.get("type") or "")):
        return False
    frame = data.get("frame") or {}
    return not IO_FRAME.search(str(frame.get("file") or "").replace("\\", "/")) \
        and "read operation timed out" not in str(data.get("msg") or "")


#: Launchers whose own argparse error is theirs, not a worker's ("torchrun: error: ...").
LAUNCHER_PROGS = frozenset({"torchrun", "deepspeed", "accelerate", "launch.py", "run.py",
                            "torch.distributed.run", "torch.distributed.launch", "horovodrun",
                            "lightning"})
#: An argparse error about the launcher's local-rank argument.
LOCAL_RANK_ARG = re.compile(r"--local[-_]rank")


def signal_name(code: int | None) -> str | None:
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _describe(exc: dict[str, Any]) -> str:
    d = exc["data"]
    text = f"{d.get('type')}: {d.get('msg', '')}".rstrip(": ")
    if len(text) > 160:
        text = text[:159] + "…"
    frame = d.get("frame")
    if frame:
        text += f" (in {frame['func']}, {frame['file'].rsplit('/', 1)[-1]}:{frame['line']})"
    return text


class RankCrashed(Rule):
    code = "CRASH001"
    slug = "rank-crashed"
    cause = "rank_crashed"
    severity = "critical"
    optional = ("crashes",)  # exceptions that did not end their process

    def check(self, job: Job) -> Iterator[Finding]:
        # The consequence check runs in polars: a log can hold 100,000s of exception lines.
        frame = job.of_kind("exception").with_columns(
            pl.col("text").str.contains(f"(?i){CONSEQUENCE.pattern}").alias("consequence"))
        all_exceptions = job.decoded_rows(frame)
        # NCCL's own errors ("NCCL error in: ..., unhandled system error") are the NCCL rules'
        # (or the fallback's) to explain: the rank did not crash by itself.
        # (an error of the environment every process raises alike: the best-effort verdict's)
        setup = [r for r in all_exceptions if setup_error(r["text"])]
        exceptions = [r for r in all_exceptions
                      if not r["consequence"] and not launcher_side(r["data"].get("frame"))
                      and not (backend_setup(r["data"]) and not NETWORK.search(r["text"]))
                      and r not in setup
                      and not NCCL_ERROR.search(r["text"]) and not garbled_object(r)
                      and not job.crashes.survived_row(r)]
        failures = job.rows("elastic_failure")
        spawns = job.rows("spawn_failed")
        # Exceptions attributed to a rank, earliest first where clocks say so.
        ranked = [r for r in exceptions if r["rank"] is not None]
        # A rank that gave up waiting (a TimeoutError of its own wait: for a file, a queue, a
        # peer's answer) waited for something another rank's failure withheld.
        raised = [r for r in ranked if not gave_up_waiting(r["data"])]
        if raised:
            ranked = raised
        primary = ranked or ([] if failures or spawns else exceptions)
        # (not a root whose SIGABRT is its own watchdog's: torch ends a process so after a
        # timeout, and torchelastic's "first observed failure" is then the first such abort)
        watchdog_aborted = {r["rank"] for r in job.rows(*WATCHDOG_ABORTS)} - {None}
        roots = [f for f in failures if f["data"].get("root") and not (
            f["data"].get("exitcode") == -6 and f["data"].get("rank") in watchdog_aborted)]
        if setup and not primary:
            return  # (the environment's error, every rank's: the best-effort verdict's to quote)
        if primary:
            primary = earliest_first(primary)
            first = primary[0]
            same = [r for r in primary if r["data"].get("type") == first["data"].get("type")
                    and r["data"].get("msg") == first["data"].get("msg")]
            ranks = {r["rank"] for r in same if r["rank"] is not None}
            if not ranks and STICKY_CUDA.search(first["text"]):
                # The unranked exception's CUDA error, re-raised by a ranked watchdog line
                ranks = {r["rank"] for r in job.rows("cuda_failure") if r["rank"] is not None
                         and (m := STICKY_CUDA.search(r["text"])) and m.group(0) in first["text"]}
            lone = None if ranks else _lone_failed_worker(job, first)
            if lone is not None:
                ranks = {lone["rank"]}
            entry = next((f for f in failures if f["data"].get("rank") in ranks), None) or lone
            code = entry["data"].get("exitcode") if entry else None
            who = subject(ranks, "A rank")
            summary = f"{who} crashed first: {_describe(first)}"
            if code is not None:
                summary += f"; exit code {code}"
            evidence = [evidence_of(first)] + ([evidence_of(entry)] if entry else [])
            yield self.finding(
                summary + ".", evidence=evidence, ranks=ranks,
                hosts=[r["host"] for r in same] + ([entry["data"].get("host")] if entry else []),
                confidence=0.85 if ranks else 0.6,
                ts=first_ts(same) or (entry["ts"] if entry else None),
                details={"exception": first["data"].get("type"), "message": first["data"].get("msg"),
                         "frame": first["data"].get("frame"), "exitcode": code},
            )
            return
        # An uncaught C++ exception aborted a process (std::terminate), other than the watchdog's
        # own report of a timeout or an NCCL error (c10::DistBackendError, WATCHDOG_ABORTS).
        # (nor one whose what() line, next, is an NCCL error: the NCCL rules' or the fallback's)
        nccl_what = {(r["source"], r["line"] - 1) for r in job.rows("nccl_error")}
        aborts = earliest_first(
            r for r in job.rows("cpp_terminate")
            if not CPP_CONSEQUENCE.search(str(r["data"].get("type") or ""))
            and (r["source"], r["line"]) not in nccl_what
            and not any(w["rank"] == r["rank"] and w["local_rank"] == r["local_rank"]
                        for w in job.rows(*WATCHDOG_ABORTS)))
        if aborts:
            first = aborts[0]
            ranks = {r["rank"] for r in aborts if r["rank"] is not None}
            lr = first["local_rank"]
            who = subject(ranks, f"Local rank {lr}" if lr is not None else "A process")
            yield self.from_rows(
                aborts, f"{who} aborted on an uncaught C++ exception "
                f"({first['data'].get('type')}; its what() line says why), with no Python "
                "traceback: a failure in native code (a CUDA or NCCL call, an extension).",
                shown=2, ranks=ranks, confidence=0.6,
                details={"exception": first["data"].get("type"), "local_rank": lr})
            return
        # Open MPI's runtime lost a node's daemon: the node (its pod) died with its ranks
        lost = job.rows("mpi_daemon_lost")
        if lost:
            nodes = sorted({r["data"]["node"] for r in lost if r["data"].get("node")})
            yield self.from_rows(
                lost, "Open MPI's launcher lost its daemon on "
                + (f"node {', '.join(nodes[:3])}" if nodes else "a node")
                + ": that node (or its pod) died, was killed or fell off the network, and its "
                "ranks with it; the others then stop.", shown=2, ranks=(),
                hosts=nodes, confidence=0.6, details={"nodes": nodes})
            return
        # autograd's anomaly mode reported a backward that raised, its exception cut off
        anomalies = earliest_first(job.rows("autograd_anomaly"))
        if anomalies:
            first = anomalies[0]
            ranks = {r["rank"] for r in anomalies if r["rank"] is not None}
            # (unranked: the one rank its peers say they lost at a monitored barrier)
            lost = {r["data"]["peer"] for r in job.rows("monitored_barrier_peer_error")}
            if not ranks and len(lost) == 1:
                ranks = lost
            yield self.from_rows(
                anomalies, f"{subject(ranks, 'A rank')} crashed first: its backward pass raised "
                f"in {first['data']['node']} (autograd's anomaly mode printed the forward call "
                "that made it; the exception itself is not in the inputs).", shown=2,
                ranks=ranks, confidence=0.6, details={"node": first["data"]["node"]})
            return
        # The interpreter could not even start the script: every process so started died at
        # once, before any traceback (the launcher's exit codes only echo it).
        started = earliest_first(job.rows("python_start_failed"))
        if started:
            first = started[0]
            ranks = {r["rank"] for r in started if r["rank"] is not None}
            if not ranks:  # the launcher's report of the first exit names it
                exits = earliest_first([*roots, *job.rows("worker_failed")])
                ranks = {r["rank"] for r in exits[:1] if r["rank"] is not None}
            yield self.from_rows(
                started, f"{subject(ranks, 'The workers')} could not start: "
                f"{excerpt(first['text'])} (the module or script is not where the interpreter "
                "looks: the package is not installed in this environment, the working directory "
                "or PYTHONPATH differs on this node, or the path is wrong).", shown=2,
                ranks=ranks, confidence=0.7, details={"module": first["data"].get("module"),
                                                      "path": first["data"].get("path")})
            return
        # The script refused its command line (argparse's usage error, exit status 2): every
        # process so started exits at once.
        # (not when the job ran on: collectives timing out, peers lost; that usage error was
        # some other tool's)
        # (nor the launcher's own: "torchrun: error: ...", no worker started, no rank crashed)
        usage = earliest_first([r for r in job.rows("usage_error")
                                if str(r["data"].get("prog") or "") not in LAUNCHER_PROGS])
        if usage and not job.rows(*kinds_tagged("hang"), *kinds_tagged("lost_peer")):
            first = usage[0]
            local = LOCAL_RANK_ARG.search(first["data"].get("msg", ""))
            remedy = ("Run the command line by hand on one node to see the whole usage message, "
                      "and make the arguments match what the launcher passes: torchrun passes "
                      "none of its own (the rank is in LOCAL_RANK/RANK), torch 2.x's "
                      "torch.distributed.launch passes --local-rank (declare both spellings, or "
                      "launch with torchrun).")
            ranks = {r["rank"] for r in usage if r["rank"] is not None}
            if not ranks:
                exits = earliest_first([*roots, *job.rows("worker_failed")])
                ranks = {r["rank"] for r in exits[:1] if r["rank"] is not None}
            yield self.from_rows(
                usage, f"{subject(ranks, 'The workers')} exited at once: the script refused its "
                f"command line ({excerpt(first['text'])}; argparse's usage error, exit code 2)"
                + (": torch.distributed.launch of torch 2.x passes --local-rank, and the script "
                   "declares --local_rank (accept both, or read the LOCAL_RANK environment "
                   "variable and launch with torchrun)" if local else "")
                + ".", shown=2, ranks=ranks, confidence=0.75, remedy=remedy,
                details={"message": first["data"].get("msg")})
            return
        # A sticky CUDA error kills its process's CUDA context: the rank it names is gone, even
        # when only its watchdog thread re-raised it ("Process group watchdog thread terminated
        # with exception: CUDA error: an illegal memory access was encountered").
        # (so does any CUDA error the watchdog thread itself raised: "NCCL watchdog thread
        # terminated with exception: CUDA error: operation not permitted when stream is
        # capturing" takes its process down)
        sticky = [r for r in job.rows("cuda_failure") if STICKY_CUDA.search(r["text"])
                  or WATCHDOG_CUDA.search(r["text"])]
        # (an NCCL_DEBUG line names its host and pid, not always its rank)
        # (nor its host: a process's, when nothing else failed before it in its file and no
        # rank is named failing)
        ranked_failure = any(f["rank"] is not None for f in job.rows(*kinds_tagged("failure")))
        fatal = earliest_first(
            [r for r in sticky if r["rank"] is not None]
            or [r for r in sticky if r["host"] and not _after_failure(job, r)]
            or [r for r in sticky if not ranked_failure and not _after_failure(job, r)])
        if fatal:
            ranks = {r["rank"] for r in fatal} - {None}
            first = fatal[0]
            pids = sorted({r["pid"] for r in fatal if r.get("pid")})
            hosts = sorted({r["host"] for r in fatal if r["host"]})
            # NCCL's "host:pid:tid [dev]" names the process's GPU: on one node with one process
            # per GPU (and nothing else naming ranks), GPU N is local rank N, the rank
            devs = {d for r in fatal if (d := nccl_device(r["text"])) is not None}
            by_gpu = not ranks and len(devs) == 1 and len(pids) == 1 and len(hosts) <= 1 \
                and not job.ranks.height and declared_nodes(job.events) <= 1
            if by_gpu:
                ranks = devs
            who = subject(ranks, f"A process{' on ' + ', '.join(hosts) if hosts else ''}"
                          + (f" (pid {', '.join(map(str, pids))})" if pids else ""))
            if by_gpu:
                who += f" (its GPU {next(iter(devs))}, one process per GPU)"
            sticky_err = STICKY_CUDA.search(first["text"])
            err = first["data"].get("err") or (sticky_err.group(0) if sticky_err else "?")
            why = ("(a bad kernel or memory access: in its own code, an extension, or the "
                   "NCCL/CUDA build for this GPU)" if sticky_err else
                   "(raised in its NCCL watchdog thread, which takes the process down with it)")
            yield self.finding(
                f"{who} failed first: CUDA error: {err}, which ends its process {why}.",
                evidence=[evidence_of(r) for r in fatal[:2]], ranks=ranks,
                hosts=[r["host"] for r in fatal], confidence=0.7, ts=first["ts"],
                details={"cuda_error": first["data"].get("err")})
            return
        if roots:
            roots = earliest_first(roots)
            root = roots[0]
            d = root["data"]
            sig = signal_name(d.get("exitcode"))
            summary = f"Rank {d.get('rank')} failed first (exit code {d.get('exitcode')}"
            summary += f", {sig})" if sig else ")"
            if sig == "SIGKILL":
                summary += ": killed with no traceback, which suggests the host's OOM killer"
            elif sig in RESOURCE_LIMITS:
                summary += f": {RESOURCE_LIMITS[sig]}"
            elif d.get("traceback") and not d["traceback"].startswith("To enable traceback"):
                summary += f": {d['traceback'][:160]}"
            # The rank's own error only reported another failure (a dead peer, a mismatch...):
            # then its exit is a consequence, not the first failure.
            own = [r for r in all_exceptions if r["rank"] == d.get("rank")]
            explained = bool(own) and sig is None
            yield self.finding(
                summary + ".", evidence=[evidence_of(root), *map(evidence_of, own[:1])],
                ranks=[d.get("rank")], hosts=[d.get("host")],
                confidence=0.75 if sig not in ("SIGTERM", "SIGABRT") else 0.5,
                ts=root["ts"], details={"exitcode": d.get("exitcode"), "signal": sig},
                role="symptom" if explained else None,
            )
            return
        killed = [s for s in spawns if s["data"].get("signal") or s["data"].get("exitcode")]
        aborts = job.rows(*WATCHDOG_ABORTS)
        if aborts:
            # (a SIGABRT of a process whose watchdog timed out or aborted is the watchdog's own:
            # torch ends the process so, it did not fail by itself; with no rank on the
            # watchdog's lines, any process's may be)
            aborted = {r["rank"] for r in aborts} - {None}
            killed = [s for s in killed if (s["data"].get("signal") != "SIGABRT"
                                            and s["data"].get("exitcode") != -6)
                      or (aborted and s["data"].get("index") not in aborted)]
        if killed:
            s = killed[0]
            idx = s["data"].get("index")
            what = s["data"].get("signal") or f"exit code {s['data'].get('exitcode')}"
            yield self.finding(
                f"mp.spawn process {idx} died first ({what}).",
                evidence=[evidence_of(s)], ranks=[int(idx)] if idx is not None else [],
                confidence=0.6, ts=s["ts"], details={"spawn_index": idx},
            )
            return
        exits = list(self._launcher_exits(job)) or list(self._engine_worker_died(job)) \
            or list(self._proxy_peer_gone(job)) \
            or list(self._store_root_gone(job)) or list(self._cut_traceback(job))
        yield from exits or list(self._peer_went_away(job)) or self._teardown_only(job)

    def _engine_worker_died(self, job: Job) -> Iterator[Finding]:
        """An inference engine's executor saw a worker process die ("Worker proc VllmWorker-1
        died unexpectedly, shutting down executor."): that worker failed first, the others were
        then shut down ("Parent process exited, terminating worker")."""
        rows = earliest_first(job.rows("engine_worker_died"))
        if not rows:
            return
        first = rows[0]
        d = first["data"]
        rank = d.get("rank")
        who = f"Worker rank {rank}" if rank is not None else \
            f"A worker (pid {d['pid']})" if d.get("pid") else "A worker"
        code = d.get("exitcode")
        said = first["text"][max(first["text"].find("Worker"), 0):]
        sig = signal_name(code) if isinstance(code, int) and code < 0 else None
        how = (f", killed by {sig}: {NATIVE_SIGNALS[sig]}" if sig in NATIVE_SIGNALS else
               f", exit code {code}" if code is not None else "")
        yield self.finding(
            f"{who} died first, by its engine's report (\"{excerpt(said, 90)}\"){how}; the "
            "other workers were shut down after it. Its own error, if it printed one, is above "
            "in its output.", evidence=[evidence_of(first)],
            ranks=[rank] if rank is not None else [], hosts=[first["host"]], confidence=0.6,
            ts=first["ts"], details={"exitcode": code, "pid": d.get("pid")})

    def _teardown_only(self, job: Job) -> Iterator[Finding]:
        """torchelastic's agent sent SIGTERM to its workers ("Sending process N closing signal
        SIGTERM") and nothing else in the inputs failed or stopped the job: the agent tears its
        workers down after one of them failed, and that one is the worker it did not signal.
        Started one after another, a node's workers usually hold consecutive pids: one missing
        from a run of them is named as the likely one."""
        # (DeepSpeed's launcher: "Killing subprocess N", SIGTERM to each worker's tree)
        rows = [r for r in job.rows("closing_signal") if r["data"].get("signal") == "SIGTERM"
                or "Killing subprocess" in r["text"]]
        if not rows or job.rows(*kinds_tagged("failure"), "agent_signal", "external_signal"):
            return
        deepspeed = all("Killing subprocess" in r["text"] for r in rows)
        pids = sorted({r["data"]["pid"] for r in rows if r["data"].get("pid") is not None})
        gaps = [p for p in range(pids[0], pids[-1] + 1) if p not in pids] if pids else []
        hint = (f"; pid {gaps[0]}, missing from the run of pids it stopped "
                f"({pids[0]}-{pids[-1]}), is most likely that worker" if len(gaps) == 1 else "")
        if deepspeed:  # (it signals the failed worker too: no gap to read)
            sent, hint = "DeepSpeed's launcher killed its workers", ""
        else:
            sent = "torchelastic's agent sent SIGTERM to the other workers"
        yield self.from_rows(
            rows, f"A worker failed first: {sent} "
            f"(pids {', '.join(map(str, pids[:8]))}), which it does after one of them fails, and "
            f"that worker's own error is not in the inputs{hint}.", shown=2, ranks=[],
            confidence=0.3, details={"signalled": pids, "missing_pid": gaps[0] if len(gaps) == 1
                                     else None})

    def _peer_went_away(self, job: Job) -> Iterator[Finding]:
        """Ranks lost their peer's connection ("Connection closed by peer", "Connection reset
        by peer"), none timed out and nothing else failed: the process at the other end went
        away first, and its own output is not in the inputs."""
        lost = job.rows("peer_closed")
        others = set(kinds_tagged("failure")) - {"peer_closed", "exception", "traceback_fragment"}
        if not lost or job.rows(*others) or any(
                not CONSEQUENCE.search(r["text"]) for r in job.rows("exception")):
            return
        reporters = sorted({r["rank"] for r in lost if r["rank"] is not None})
        who = rank_phrase(reporters) if reporters else "a rank"
        yield self.from_rows(
            lost, f"The process at the other end of {who}'s connection went away first (it "
            "crashed or exited; its connection closed), and its own output is not in the "
            "inputs: look at the logs of the rank it talked to.", shown=2, ranks=(),
            confidence=0.3, details={"reporters": reporters})

    def _store_root_gone(self, job: Job) -> Iterator[Finding]:
        """Ranks fetching the ncclUniqueId their root publishes lost the store connection ("...
        retrieving ncclUniqueId from [0] via c10d key-value store ..., but store->get('0') got
        error: Connection reset by peer"): the store's host went away, and with it, most likely,
        the root rank (torchrun's agent closes its store when a worker of its node fails)."""
        rows = [r for r in job.rows("store_wait_timeout")
                if r["data"].get("root") is not None
                and LOST_STORE.search(r["data"].get("err") or "")]
        roots = {r["data"]["root"] for r in rows}
        if len(roots) != 1:
            return
        root = next(iter(roots))
        waiting = sorted({r["data"]["rank"] for r in rows if r["data"].get("rank") is not None})
        yield self.from_rows(
            rows, f"Rank {root} most likely went away first: "
            f"{rank_phrase(waiting) if waiting else 'the other ranks'} lost the connection to the "
            f"c10d store while fetching the NCCL id rank {root} publishes "
            f"({rows[0]['data']['err'].strip()}), and nothing else in the inputs failed.",
            shown=2, ranks=[root], confidence=0.45, details={"root": root, "waiting": waiting})

    def _cut_traceback(self, job: Job) -> Iterator[Finding]:
        """A rank's traceback cut before its exception line (a paste that stops inside it),
        and nothing else that rank reported failing: it raised, though what is not shown."""
        fragments = job.rows("traceback_fragment")
        failures = [r for r in job.rows(*kinds_tagged("failure"))
                    if r["kind"] != "traceback_fragment"]
        # (a process's, its rank unknown, when it is the only failure the inputs show)
        # (not one inside torchelastic's own code: its agent failing, no worker)
        # (frames without their header that the same writer's output goes on after: a stack it
        # printed while running, not one it died with)
        ends = {(r["source"], r["rank"]): r["line"] for r in job.rows("last_line")}
        fragments = [r for r in fragments if not r["data"].get("headless")
                     or ends.get((r["source"], r["rank"]), 0) <= r["line"] + 1]
        cut = earliest_first(r for r in fragments if r["rank"] is not None) or (
            [] if failures else earliest_first(
                r for r in fragments
                if not ELASTIC_CODE.search(str((r["data"].get("frame") or {}).get("file", "")))))
        if not cut:
            return
        first = cut[0]
        rank = first["rank"]
        # (under torch.multiprocessing's "-- Process N terminated with the following error:"
        # the parent reports the first child that failed: its own error, whatever came after)
        spawned = first.get("cue") == "mp.spawn process index"
        if any(r["rank"] is not None for r in failures) and not spawned:
            return  # its traceback may be the report of a failure a rank saw (a timeout, a peer)
        if job.rows("nccl_warn") or any(r["data"].get("code")
                                        for r in job.rows("nccl_error_trace")):
            return  # NCCL said what failed (a WARN, its return chain): the cut traceback is that
        frame = first["data"].get("frame") or {}
        where = f"{frame.get('func')} ({frame.get('file')}:{frame.get('line')})" if frame \
            else "an unknown frame"
        # an unranked error just before it in the same file (a CUDA kernel assert glued to a
        # progress bar, say) is most likely what it raised
        before = [] if spawned else [
            r for r in job.rows("cuda_failure", "exception")
            if r["rank"] is None and r["source"] == first["source"] and r["line"] <= first["line"]]
        cause = f"; just before it: {before[-1]['text'][:200].strip()}" if before else ""
        yield self.finding(
            f"{'A process' if rank is None else f'Rank {rank}'} raised an exception: its "
            f"traceback is cut before the exception line (innermost frame shown: {where}){cause}.",
            evidence=[evidence_of(r) for r in [*before[-1:], first]],
            ranks=[] if rank is None else [rank], hosts=[first["host"]],
            confidence=0.6 if spawned else 0.4 if rank is not None else 0.3, ts=first["ts"],
            details={"frame": frame, "cut": True})

    def _proxy_peer_gone(self, job: Job) -> Iterator[Finding]:
        """Every other local rank's NCCL proxy saw one peer's connection close, and only that
        one (a normal destroy closes them all): that process went away first."""
        rows = job.rows("nccl_proxy_peer_closed")
        peers = {r["data"]["peer_local"] for r in rows}
        writers = {(r["host"], r["pid"]) for r in rows}
        if len(peers) != 1 or len(writers) < 2:
            return
        peer = next(iter(peers))
        hosts = {r["host"] for r in rows if r["host"]}
        one_node = len(hosts) <= 1 and declared_nodes(job.events) <= 1
        who = f"Rank {peer}" if one_node else \
            f"Local rank {peer}{' on ' + next(iter(hosts)) if len(hosts) == 1 else ''}"
        yield self.from_rows(
            rows, f"{who}'s process went away first: the NCCL proxies of {len(writers)} other "
            f"local ranks saw its connection close, and no other's.", shown=2,
            ranks=[peer] if one_node else [], confidence=0.45,
            details={"local_rank": peer, "reporters": len(writers)})

    def _launcher_exits(self, job: Job) -> Iterator[Finding]:
        # The launcher's own line is all there is: "failed (exitcode: 2) local_rank: 0 (pid: N)"
        # (torchelastic, no failure summary) or DeepSpeed's "... exits with return code = 1".
        # torch's watchdog ends its process with an uncaught C++ exception (SIGABRT) after a
        # timeout or an NCCL error: that abort is the watchdog's report, not a crash of its own.
        aborted = {r["rank"] for r in job.rows(*WATCHDOG_ABORTS)}
        signals = job.rows("native_signal")
        named = {(r["host"], r["data"].get("pid")) for r in signals if "signum" in r["data"]}
        # A fatal-signal handler's header whose next line (the signal's name) is not in the
        # inputs: a native crash, signal unknown.
        unnamed = [r for r in signals if "signum" not in r["data"]
                   and (r["host"], r["data"].get("pid")) not in named]
        # Open MPI's "The first process to do so was: Process name: [[J,N],R]" (non-zero exit)
        def watchdogs(r: dict[str, Any]) -> bool:
            # (an abort no rank is named on, beside a watchdog's abort, is taken for it)
            return _exit_code(r["data"]) == -6 and bool(aborted) and (
                r["rank"] in aborted or None in aborted or r["rank"] is None)

        first_out = [r for r in job.rows("mpi_process_exit")
                     if "signum" not in r["data"] and not watchdogs(r)]
        exits = earliest_first([*unnamed, *first_out, *(
            r for r in job.rows("worker_failed", "worker_signal", "native_signal",
                                "mpi_process_exit")
            if _crash_exit(_exit_code(r["data"])) and not watchdogs(r))])
        if exits and exits[0] not in first_out and _exit_code(exits[0]["data"]) is not None \
                and _exit_code(exits[0]["data"]) > 0 and any(
                    r["rank"] is None and r["source"] == exits[0]["source"]
                    and r["line"] < exits[0]["line"] for r in job.rows("nccl_error")):
            return  # its NCCL error, printed unranked just above: no crash of its own code
        if exits:
            d, rank = exits[0]["data"], exits[0]["rank"]
            raw = d.get("exitcode")
            d = {**d, "exitcode": _exit_code(d)}
            # how the inputs said it: a launcher's code (negative: the signal), a shell's 128 + N,
            # or a handler's line naming the signal (no exit code printed)
            said = (f"exit code {raw}, 128 + {raw - 128}" if isinstance(raw, int) and raw > 128
                    else None if "signum" in exits[0]["data"] and raw is None
                    else f"exit code {d['exitcode']}")
            lagged = ""
            if rank is None and exits[0]["kind"] == "native_signal" \
                    and (laggard := laggard_native_crash(job)) is not None:
                # (a native crash no rank is named on, and one rank the others' counters say
                # stopped short of their collective: that rank's crash)
                rank = laggard
                lagged = " (the one rank the others' collective counters say stopped short)"
            who = f"rank {rank}" if rank is not None else \
                f"local rank {d['local_rank']}" if d.get("local_rank") is not None else "a worker"
            host = exits[0]["host"] or d.get("host")
            pid = (f" (pid {d['pid']}{' on ' + host if host and rank is None else ''})"
                   if d.get("pid") else "")
            sig = signal_name(d["exitcode"]) if isinstance(d["exitcode"], int) \
                and d["exitcode"] < 0 else None
            how = ("was the first process to exit with a non-zero status, by the MPI launcher's "
                   "report (its own error is not in the inputs: look at its output above the "
                   "report)"
                   if exits[0] in first_out else
                   "received a fatal signal (its handler's report is cut before the signal's "
                   "name): a crash in native code (a CUDA or NCCL call, an extension), with no "
                   "Python traceback the inputs show" if d["exitcode"] is None else
                   f"was killed by {sig}{f' ({said})' if said else ''}: {NATIVE_SIGNALS[sig]}"
                   + ("; the Python stack CPython's faulthandler printed below the line shows "
                      "where" if "Fatal Python error" in exits[0]["text"] else
                      ", with no Python traceback the inputs show") if sig else
                   f"exited first with code {d['exitcode']}, printing no Python traceback the "
                   "inputs show (an error before Python ran the script, or output sent "
                   "elsewhere)")
            yield self.finding(
                f"{who[0].upper()}{who[1:]}{pid}{lagged} {how}.",
                evidence=[evidence_of(exits[0])], ranks=[rank],
                hosts=[host], confidence=0.5, ts=exits[0]["ts"],
                details={"exitcode": d["exitcode"], "local_rank": d.get("local_rank")})


def _lone_failed_worker(job: Job, exc: dict[str, Any]) -> dict[str, Any] | None:
    """The launcher's report of the one worker that exited with an error status after the
    unranked exception ``exc``, in the same file ("failed (exitcode: 1) local_rank: 0 (pid:
    N)"): the exception is that worker's. None when more than one rank exited with an error
    (then the exception may be any of theirs) or the report names no rank."""
    exits = [r for r in job.rows("worker_failed")
             if isinstance(code := _exit_code(r["data"]), int) and code > 0]
    if len({r["rank"] for r in exits}) != 1 or exits[0]["rank"] is None:
        return None
    after = [r for r in exits if r["source"] == exc["source"] and r["line"] > exc["line"]]
    return after[0] if after else None


def lone_laggard(job: Job) -> int | None:
    """The one rank the collective report says never joined the stuck collective (without
    Flight Recorder dumps: the watchdog's counters, the desync report), if exactly one."""
    lagging = {r for g in job.collective_report.groups if not g.fr for r in g.not_joined}
    return next(iter(lagging)) if len(lagging) == 1 else None


def before_timeouts(job: Job, row: dict[str, Any]) -> bool:
    """Whether ``row`` came before every collective timeout of its file (by line), or of the
    job (by the clock): a crash then, not a timeout's fallout."""
    timeouts = job.rows("watchdog_timeout", "watchdog_summary")
    return all((t["source"] != row["source"] or t["line"] > row["line"])
               and (t["ts"] is None or row["ts"] is None or t["ts"] >= row["ts"])
               for t in timeouts)


def laggard_native_crash(job: Job) -> int | None:
    """The lone laggard's rank when a process died of a fatal signal (its handler's report)
    before the collective timeouts, and no rank is named on it or on any other crash: that
    crash is the laggard's (CRASH001 names it; COLL009 leaves it)."""
    if job.crashes.ranks:
        return None
    native = [r for r in job.rows("native_signal") if r["rank"] is None]
    if not native or not before_timeouts(job, native[0]):
        return None
    return lone_laggard(job)


#: Signals a process raises on itself when native code fails, and what they usually mean.
NATIVE_SIGNALS = {
    "SIGSEGV": "a crash in native code (a CUDA or NCCL call, an extension) or a bad memory access",
    "SIGBUS": "a bad memory access, often a full /dev/shm or a truncated memory-mapped file",
    "SIGABRT": "an abort in native code (a C++ exception or a failed assertion)",
    "SIGILL": "an instruction this CPU lacks (a build for another machine)",
    "SIGFPE": "an arithmetic fault in native code",
}


#: Signals the kernel sends a process over one of its resource limits (setrlimit).
RESOURCE_LIMITS = {
    "SIGXCPU": "the process went over its CPU-time limit (`ulimit -t`, RLIMIT_CPU: a shell's, "
               "a container's or a scheduler's limit on CPU seconds)",
    "SIGXFSZ": "the process wrote past its file-size limit (`ulimit -f`, RLIMIT_FSIZE)",
}


def garbled_object(row: dict[str, Any]) -> bool:
    """An object collective (broadcast_object_list, all_gather_object...) that handed back bytes
    that do not unpickle ("EOFError: Ran out of input" in _tensor_to_object): what a rank gets
    when the collective failed or was aborted under it, a consequence, not its own crash."""
    frame = row["data"].get("frame") or {}
    kind = str(row["data"].get("type") or "").rsplit(".", 1)[-1]
    return frame.get("func") == "_tensor_to_object" and kind in ("EOFError", "UnpicklingError")


#: The watchdog thread ended by a CUDA error of its own (not a timeout's report).
WATCHDOG_CUDA = re.compile(r"watchdog thread terminated with exception: CUDA error: ")


def _after_failure(job: Job, row: dict[str, Any]) -> bool:
    """Whether another kind of failure came before ``row`` in its own file (an InfiniBand
    completion error, then the illegal access its fallout caused)."""
    return job.of_kind(*kinds_tagged("failure")).filter(
        (pl.col("source") == row["source"]) & (pl.col("line") < row["line"])
        & (pl.col("kind") != row["kind"])).height > 0


def _exit_code(d: dict[str, Any]) -> object:
    """A launcher's exit code, or the signal it reported as one (-11 for "Signal 11 (SIGSEGV)
    received by PID ..."); a shell's or MPI launcher's 128 + N is signal N's (134: SIGABRT)."""
    if isinstance(d.get("signum"), int):
        return -d["signum"]
    code = d.get("exitcode")
    if isinstance(code, int) and 128 < code < 160:
        return 128 - code
    return code


def _crash_exit(code: object) -> bool:
    """A launcher-reported exit that is the worker's own failure: a non-zero status, or a
    signal native code raises (not the SIGKILL/SIGTERM of an OOM killer, launcher or scheduler)."""
    return isinstance(code, int) and (code > 0 or signal_name(code) in NATIVE_SIGNALS)


#: A store read that failed because the store's server went away (reset, closed, refused,
#: end of file): not a timeout.
LOST_STORE = re.compile(r"reset|closed|refused|broken pipe|EOF|end of file", re.I)
# (torch's "NCCL error in: ...", pynccl's "NCCL error: ...", cupy's "NcclError: NCCL_ERROR_...",
# torch_npu's "HCCL error in: ..." and "HCCL function error: ...")
NCCL_ERROR = re.compile(r"[NH]CCL error(?: in| \d+)?:|NcclError: NCCL_ERROR_|HCCL function error:",
                        re.IGNORECASE)
#: CUDA errors that leave the context unusable (cudaErrorIllegalAddress, ...LaunchFailure,
#: ...Assert, ...MisalignedAddress, ...IllegalInstruction, ...HardwareStackError,
#: ...ECCUncorrectable).
_STICKY_WORDS = (r"(?:an illegal memory access was encountered|unspecified launch failure"
                 r"|device-side assert triggered|misaligned address"
                 r"|an illegal instruction was encountered|hardware stack error"
                 r"|uncorrectable ECC error encountered)")
STICKY_CUDA = re.compile(
    r"CUDA error: " + _STICKY_WORDS
    # NCCL's CUDACHECK (src/include/checks.h): "Cuda failure 700 'an illegal memory access was
    # encountered'" (2.x), "Cuda failure 'an illegal ...'" (newer, no number)
    + r"|Cuda failure (?:\d+ )?'" + _STICKY_WORDS + "'"
    # the kernel's own report of a device-side assert (printed before the Python error)
    r"|block: \[\d+,\d+,\d+\], thread: \[\d+,\d+,\d+\] Assertion .+ failed")
#: C++ exceptions that report another failure (the watchdog's timeout or NCCL error).
# (and Gloo's enforce failures, which report what a peer sent: NCCL007's sizes, a dead peer)
CPP_CONSEQUENCE = re.compile(r"DistBackendError|DistNetworkError|DistStoreError|gloo::")
#: What torch's watchdog prints before it takes its process down.
WATCHDOG_ABORTS = ("watchdog_timeout", "watchdog_abort", "nccl_teardown")

#: torchelastic's own modules (its agent, rendezvous, metrics wrappers).
ELASTIC_CODE = re.compile(r"torch[/\\]distributed[/\\]elastic[/\\]")
#: Where the launcher's own code raises: torchelastic's agent and rendezvous, torchrun itself.
LAUNCHER_CODE = re.compile(
    r"torch[/\\]distributed[/\\](?:elastic[/\\](?:agent|rendezvous)[/\\]|run\.py$|launch\.py$)"
    # the launchers of DeepSpeed (its runner: hostfile, ssh pre-check) and accelerate
    r"|deepspeed[/\\]launcher[/\\]runner\.py$|accelerate[/\\]commands[/\\]launch\.py$")


def backend_setup(data: dict[str, Any]) -> bool:
    """Whether an exception was raised while torch set up its communication backend
    (init_process_group's process-group helper, init_rpc's backend): the environment could not
    run it (a build without the transport, a device it cannot use), on every rank alike, and no
    rank crashed before the others. The known ones are other rules' (ENV003, NCCL...); the rest
    are the best-effort verdict's."""
    frames = {str((data.get("frame") or {}).get("func", "")), *map(str, data.get("callers") or [])}
    return bool(frames & BACKEND_SETUP)


#: A backend's set-up that failed on the network (a peer refused, timed out): the rank's own
#: failure to report, as a symptom of what the network rules find.
NETWORK = re.compile(r"(?i)connect|refused|timed out|unreachable|no route|reset by peer")
#: torch's functions that build a process group's or an RPC agent's backend.
BACKEND_SETUP = frozenset({"_new_process_group_helper", "_init_rpc_backend"})


def launcher_side(frame: object) -> bool:
    """Whether an exception's innermost frame is the launcher's (its agent failing at
    rendezvous, say): no rank crashed, the launch did."""
    return isinstance(frame, dict) and bool(LAUNCHER_CODE.search(str(frame.get("file", ""))))


def setup_error(text: str) -> str | None:
    """What fixes the known error of the environment ``text`` holds (SETUP_ERRORS), if any."""
    return next((fix for needle, fix in SETUP_ERRORS if needle in text), None)


#: Errors of the environment that every process raises alike while setting up, none of the
#: catalog's classes: the message's words (from their sources) and what is known to fix them.
SETUP_ERRORS: tuple[tuple[str, str], ...] = (
    # torch/csrc/distributed/c10d/TCPStore.cpp (2.4+ defaults to the libuv store; the Windows
    # and some other wheels are built without it)
    ("use_libuv was requested but PyTorch was build without libuv support",
     "This torch build has no libuv TCPStore, which the launcher asks for by default (torch "
     "2.4+): set USE_LIBUV=0 in the environment (or add ?use_libuv=0 to the init method / "
     "rendezvous endpoint)."),
    # torch/csrc/distributed/c10d/ProcessGroupGloo.cpp makeDeviceForHostname (Windows builds)
    ("makeDeviceForHostname(): unsupported gloo device",
     "This torch build's Gloo has no transport for this host's interface (a Windows build): set "
     "GLOO_SOCKET_IFNAME to the interface to use, or use another torch build (Linux, WSL2)."),
    # accelerate's state.py check of consumer GPUs (RTX 3090/4000) without P2P or InfiniBand
    ("doesn't support faster communication broadband via P2P or IB",
     "These GPUs have no peer-to-peer or InfiniBand path NCCL could use: set "
     "NCCL_P2P_DISABLE=1 and NCCL_IB_DISABLE=1 (or launch with `accelerate launch`, which sets "
     "them)."),
)
