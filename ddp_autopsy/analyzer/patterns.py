"""The message catalog: which log lines become which typed events.

Each :class:`Pattern` names an event kind, the literal needles that must occur in a line for it
to be considered (used by the fast vectorised pre-filter), and the regex that extracts its fields.
Formats and versions are documented in ``shared/research`` (PyTorch c10d, TCPStore, torchelastic,
ProcessGroupNCCL, NCCL); the ``M..`` tags below refer to that catalog.
"""

from __future__ import annotations

import functools
import re
import signal
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Pattern:
    kind: str
    needles: tuple[str, ...]
    #: The regex's text: compiled on first use (``regex``), so that importing the catalog does
    #: not compile the ~200 patterns a short log never needs.
    source: str | re.Pattern[str]
    #: Converters for named groups (default: str).
    types: tuple[tuple[str, type], ...] = ()
    #: Groups that are another wording's copy of a field (``port2`` → ``port``): a regex cannot
    #: name two groups alike, so the copies are folded into the field here, not in the rules.
    aliases: tuple[tuple[str, str], ...] = ()

    @functools.cached_property
    def regex(self) -> re.Pattern[str]:
        return re.compile(self.source)  # (a compiled pattern is returned as it is)

    def match(self, body: str) -> dict[str, Any] | None:
        m = self.regex.search(body)
        if not m:
            return None
        fields: dict[str, Any] = {k: v for k, v in m.groupdict().items() if v is not None}
        for copy, name in self.aliases:
            if copy in fields:
                fields.setdefault(name, fields.pop(copy))
        for name, conv in self.types:
            if name in fields:
                try:
                    fields[name] = conv(fields[name])
                except ValueError:
                    fields.pop(name)
        return fields


_NUMBERED = re.compile(r"^(?P<base>[a-z_]+?)(?P<n>[2-9])$")
_GROUP_NAME = re.compile(r"\(\?P<(\w+)>")


def _signal_field(value: str) -> str:
    """A signal as its name: "9" and "SIGKILL" are both "SIGKILL" (unknown numbers kept)."""
    if value.isdigit():
        try:
            return signal.Signals(int(value)).name
        except ValueError:
            return value
    return value


def _p(kind: str, needles: str | tuple[str, ...], regex: str,
       alias: dict[str, str] | None = None, **types: type) -> Pattern:
    """A pattern; a group ``X2``/``X3``… is folded into ``X`` when the regex also has ``X``
    (another wording of the same field), plus the explicit ``alias`` map."""
    if isinstance(needles, str):
        needles = (needles,)
    names = set(_GROUP_NAME.findall(regex))
    aliases = dict(alias or {})
    for name in names:
        m = _NUMBERED.match(name)
        if m and m["base"] in names and name not in aliases:
            aliases[name] = m["base"]
    types = {aliases.get(k, k): v for k, v in types.items()}
    return Pattern(kind, needles, regex, tuple(types.items()), tuple(sorted(aliases.items())))


#: The words bash prints for the signals a process dies of by itself (or the OOM killer's).
_SHELL_SIGNUMS = {"Segmentation fault": 11, "Bus error": 7, "Aborted": 6,
                  "Illegal instruction": 4, "Floating point exception": 8, "Killed": 9}
_SHELL_SIGNALS = "|".join(_SHELL_SIGNUMS)


def _shell_signum(words: str) -> int:
    return _SHELL_SIGNUMS[words]


def _signum_of_name(name: str) -> int | str:
    """A signal's number from its name ("SIGSEGV": 11, or a handler's word for it: "Segfault");
    an unknown name kept."""
    try:
        return int(signal.Signals[SIGNAL_WORDS.get(name, name)])
    except KeyError:
        return name


#: Crash handlers' words for a signal.
SIGNAL_WORDS = {"Segfault": "SIGSEGV"}


PATTERNS: tuple[Pattern, ...] = (
    # --- rendezvous / TCPStore / sockets -----------------------------------------------------
    # M14, non-libuv: "...failed to bind to [::]:29500 (errno: 98 - Address already in use)."
    _p(
        "port_in_use",
        ("Address already in u", "EADDRINUSE", "address already in u",
         "another process is utilizing it", "system error: 10048",
         "port have been bound already", "Only one usage of each socket address",
         "WinError 10048"),
        # (on Windows the code is Winsock's, its text in the system's language: "(system error:
        # 10048 - 通常每个套接字地址...只允许使用一次。)", WSAEADDRINUSE)
        r"(?:bind to (?P<addr>\S+?):(?P<port>\d+) \((?:errno: 98|system error: 10048)"
        r"|port: (?P<port2>\d+),[^\n]*?EADDRINUSE"
        # (strerror's words; a paste may cut them at the line's end: "Address already in us")
        r"|EADDRINUSE|[Aa]ddress already in use|[Aa]ddress already in us?\s*$(?P<cut>)"
        # accelerate: "Tried to launch distributed communication on port `29500`, but another
        # process is utilizing it."
        r"|on port `(?P<port3>\d+)`, but another process is utilizing it"
        # Ascend's CANN (EJ0003): "Failed to bind the IP port. Reason: The IP address and port
        # have been bound already."
        r"|The IP address and port have been bound already"
        # Winsock's own text of WSAEADDRINUSE where no code precedes it (torch <= 1.10's store
        # raised strerror alone; Python's "OSError: [WinError 10048] ...")
        r"|Only one usage of each socket address|\[WinError 10048\])",
        port=int,
        port2=int,
        port3=int,
    ),
    # M14's terminal line when the bind failed for another reason than a used port (errno 99
    # EADDRNOTAVAIL: the master address is not this host's). Each per-address bind warning
    # before it is a retry (IPv6 off gives errno 97 on healthy hosts), so only this line counts.
    _p(
        "listen_failed",
        ("failed to listen on any local network address", "has failed to accept a connection",
         "The server socket has failed to bind. ", "Failed to accept socket. "),
        # libuv store (2.4+): "The server socket has failed to bind. useIpv6: 0, code: -99,
        # name: EADDRNOTAVAIL, message: address not available" (not its IPv6 attempt, logged
        # as "Failed to bind to ipv6 address, trying ipv4. Error: ...")
        r"^(?!.*trying ipv4)(?:.*?(?:failed to listen on any local network address"
        r"|The server socket has failed to bind\. )"
        r"(?!.*(?:errno: 98|system error: 10048|EADDRINUSE|[Aa]ddress already in use))"
        # the store's server socket broke later: "... has failed to accept a connection (errno:
        # 24 - Too many open files)", libuv: "Failed to accept socket. code: -24, name: EMFILE"
        r"|.*?(?:has failed to accept a connection|Failed to accept socket\. ))"
        r"(?:.*?(?:errno: |code: -)(?P<errno>\d+))?(?:.*?(?: - |message: )(?P<err>[^.)]+))?",
        errno=int,
    ),
    # M15: "The IPv6 network addresses of (host, 44685) cannot be retrieved (gai error: -2 - ...)"
    _p(
        "unresolved_host",
        "cannot be retrieved",
        r"The (?:(?P<family>IPv[46]) )?network addresses of \((?P<host>[^,]+), (?P<port>\d+)\) "
        r"cannot be retrieved \(gai error: (?P<gai>-?\d+) - (?P<msg>[^)]+)\)",
        port=int,
        gai=int,
    ),
    # Python-level resolution failures (tcp:// init methods, user code).
    _p(
        "unresolved_host",
        ("gaierror", "getting address info", "host not found: ", "Could not resolve hostname",
         "nslookup: can't resolve '", "failed to connect/validate to host"),
        r"(?:socket\.gaierror: \[Errno (?P<gai>-?\d+)\] (?P<msg>.+)"
        r"|error encountered when getting address info : (?P<msg2>.+)"
        # torch <= 1.8 (c10d Utils): "ValueError: host not found: Name or service not known"
        r"|\bhost not found: (?P<msg3>.+)"
        # ssh from DeepSpeed's / pdsh's launcher: "ssh: Could not resolve hostname node-0: ..."
        # (an Open MPI too old for "-H host:slots" hands "localhost:4" to ssh as the name)
        r"|ssh: Could not resolve hostname (?P<host>[^:\s]+(?::\d+)?): (?P<msg4>.+)"
        # entrypoint scripts probing the master (busybox): "nslookup: can't resolve
        # 'job-master-0': Name does not resolve" ('(null)': the variable was empty)
        r"|nslookup: can't resolve '(?P<host2>[^']+)'(?:: (?P<msg5>.+))?"
        # TCPStore's client (torch 2.4+ TCPStore.cpp TCPClient::connect): "TCP client failed to
        # connect/validate to host {}:{} - retrying (try={}, timeout={}ms, delay={}ms): {}" and
        # "... - timed out (try={}, timeout={}ms): {}", the socket's own error last. socket.cpp
        # retries a failed name lookup to its deadline (its own warning names the resolver's
        # error: "cannot be retrieved", above), so the error here is then its timeout; pastes
        # shorten it to "... to host H:P - Name or service not known", read here (a refused or
        # timed-out connect is the master's: RDZV003)
        r"|TCP client failed to connect/validate to host (?P<host3>\S+?):(?P<port>\d+) - "
        r"(?:(?:retrying|timed out) \([^)]*\): )?(?P<msg6>[^\n]*?(?:Name or service not known"
        r"|Temporary failure in name resolution|nodename nor servname provided"
        r"|No address associated with hostname|Name does not resolve)[^\n]*))",
        gai=int,
        port=int,
    ),
    # Markers of a (re)start: a later start with no failure after it supersedes earlier failures.
    _p(
        "run_start",
        ("Setting OMP_NUM_THREADS environment variable", "Starting elastic_operator",
         "initializing ddp: GLOBAL_RANK", "Initializing distributed: GLOBAL_RANK"),
        r"(?:Setting OMP_NUM_THREADS environment variable|Starting elastic_operator"
        r"|[Ii]nitializing (?:ddp|distributed): GLOBAL_RANK: (?P<rank>\d+), MEMBER: "
        r"(?P<member>\d+)/(?P<world>\d+))",
        rank=int,
        member=int,
        world=int,
    ),
    # A framework's own end of training (printed by rank 0): Lightning's fit loop ("`Trainer.fit`
    # stopped: `max_epochs=3` reached.", loops/fit_loop.py), transformers' Trainer ("Training
    # completed. Do not forget to share your model on huggingface.co/models =)"), TensorFlow's
    # Estimator.train() on return, on every worker ("Loss for final step: %s.", estimator.py).
    _p(
        "training_end",
        ("`Trainer.fit` stopped:", "Training completed. Do not forget to share your model",
         "Loss for final step: "),
        r"`Trainer\.fit` stopped: |Training completed\. Do not forget to share your model"
        r"|\bLoss for final step: ",
    ),
    # M13: "The client socket has timed out after 1800s while trying to connect to (h, 29500)."
    _p(
        "connect_timeout",
        ("while trying to connect to", "connect() timed out", "Error: Connection timed out"),
        r"(?:client socket has timed out after (?P<t>\d+)(?P<unit>ms|s) while trying to connect to "
        r"\((?P<host>[^,]+), (?P<port>\d+)\)"
        # torch <= 1.8 (c10d Utils): "connect() timed out. Original timeout was 60000 ms."
        r"|connect\(\) timed out\.(?: Original timeout was (?P<t2>\d+) (?P<unit2>ms))?"
        r"|^(?:\w+\.)*(?:RuntimeError|DistNetworkError): Connection timed out$)",
        t=int,
        t2=int,
        port=int,
    ),
    # M16: "failed to connect to any network address of (master-0, 23456). ... (errno: 113 - ...)"
    _p(
        "connect_failed",
        ("failed to connect to any network address", "Error: Connection refused",
         "Error: No route to host", "client socket has failed to connect to [",
         "has timed out, will retry"),
        r"(?:failed to connect to any network address of \((?P<host>[^,]+), (?P<port>\d+)\)"
        r"(?:.*?\(errno: (?P<errno>\d+) - (?P<err>[^)]+)\))?"
        # torch <= 1.x TCPStore client: "RuntimeError: Connection refused"
        r"|^(?:\w+\.)*(?:RuntimeError|DistNetworkError): (?P<err2>Connection refused"
        r"|No route to host)$"
        # One attempt (socket.cpp, retried) that took the OS connect timeout or found no route:
        # the master is unreachable, unlike errno 111/99 printed while it starts (connect_retry).
        r"|client socket has failed to connect to \[(?P<host2>[^\]]+)\]:(?P<port2>\d+) "
        r"\((?:errno|system error): (?P<errno2>101|110|113) - (?P<err3>[^)]+)\)"
        # 2.4+ words the same timed-out attempt as "The server socket on [master-0]:29500 has
        # timed out, will retry."
        r"|The server socket on \[?(?P<host3>[^\s\]]+?)\]?:(?P<port3>\d+) has timed out, will "
        r"retry)",
        port=int,
        errno=int,
        port2=int,
        port3=int,
        errno2=int,
    ),
    _p(
        "connect_retry",
        ("is listening yet", "client socket has failed to connect to ["),
        r"(?:No socket on \((?P<host>[^,]+), (?P<port>\d+)\) is listening yet"
        # One attempt of many (retried until the timeout; errno 99 on "localhost" is printed by
        # healthy jobs too): "The client socket has failed to connect to [node0]:29500 (errno:
        # 110 - Connection timed out)." The terminal error is M13 / M16.
        r"|client socket has failed to connect to \[(?P<host2>[^\]]+)\]:(?P<port2>\d+) "
        r"\((?:errno|system error): (?!(?:101|110|113) )(?P<errno>\d+) - (?P<err>[^)]+)\))",
        port=int,
        port2=int,
        errno=int,
    ),
    _p(
        "rdzv_connection_error",
        ("RendezvousConnectionError", "RendezvousTimeoutError"),
        r"(?P<error>Rendezvous(?:Connection|Timeout)Error)(?::\s*(?P<msg>.*))?",
    ),
    # M11: "Timed out after 601 seconds waiting for clients. 1/4 clients joined."
    _p(
        "store_clients_timeout",
        ("waiting for clients", "Timed out initializing process group in store based barrier"),
        r"(?:Timed out after (?P<s>\d+) seconds waiting for clients\. "
        r"(?P<joined>\d+)/(?P<world>\d+) clients joined"
        # distributed_c10d._store_based_barrier (1.8+): the same count, other words.
        r"|Timed out initializing process group in store based barrier on rank:? (?P<rank>\d+), "
        r"for key: (?P<key>\S+) \(world_size=(?P<world2>\d+), (?:worker_count|num_workers_joined)="
        r"(?P<joined2>\d+), timeout=(?P<timeout>[^)\s]+))",
        s=int,
        joined=int,
        world=int,
        rank=int,
    ),
    # The barrier's progress line, every 10 s (INFO, or WARNING in 1.8): who has not joined yet.
    # worker_count > world_size means another job (or a restart) counts on the same store key.
    _p(
        "store_barrier_wait",
        "Waiting in store based barrier to initialize process",
        r"Waiting in store based barrier to initialize process ?group for (?:[\d.]+ seconds)?"
        r"rank: (?P<rank>\d+), key: (?P<key>\S+) \(world_size=(?P<world>\d+), "
        r"(?:worker_count|num_workers_joined)=(?P<joined>\d+), timeout=(?P<timeout>[^)\s]+)",
        rank=int,
        world=int,
        joined=int,
    ),
    # distributed_c10d._store_based_barrier, once every worker arrived: "Rank 2: Completed
    # store-based barrier for key:store_based_barrier_key:2 with 4 nodes."
    _p(
        "store_barrier_done",
        "Completed store-based barrier for key",
        r"Rank (?P<rank>\d+): Completed store-based barrier for key:(?P<key>\S+) with "
        r"(?P<world>\d+) nodes",
        rank=int,
        world=int,
    ),
    # M12: "wait timeout after 600000ms, keys: /default_pg/0//cuda//0"
    _p(
        "store_wait_timeout",
        ("wait timeout after", "Socket Timeout", "waitForInput: socket",
         "retrieving ncclUniqueId from", "retreiving ncclUniqueId from",
         "may indicate a possible application crash on rank"),
        # 2.0+: a rank waiting for the NCCL id rank 0 publishes when it creates the communicator:
        # "[3] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d
        # key-value store by key '0', but store->get('0') got error: wait timeout after 600000ms"
        # (or Socket Timeout, Connection reset by peer: rank 0 or its store went away).
        # (torch 1.11-1.13 spelled it "retreiving", and pastes cut the "[N] is " before it)
        r"(?:(?:\[(?P<rank>\d+)\] is )?setting up NCCL communicator and "
        r"retr(?:ie|ei)ving ncclUniqueId from \[(?P<root>\d+)\] via c10d key-value store"
        r"(?: by key '(?P<keys2>[^']*)')?"
        r"(?:, but store->get\('[^']*'\) got error: (?P<err>.+?)(?:\. This may indicate|$))?"
        # (its tail alone, the head cut or wrapped away: ". This may indicate a possible
        # application crash on rank 0 or a network set up issue.")
        r"|^\W*This may indicate a possible application crash on rank (?P<root2>\d+) or a "
        r"network set up issue(?P<cut>)"
        r"|wait timeout after (?P<ms>\d+)ms(?:, keys: (?P<keys>.+?)\.?$)?"
        r"|DistStoreError: Socket Timeout"
        # 2.3+, a store read that got no answer (W level, before the exception if any):
        # "waitForInput: socket SocketImpl(fd=79, addr=[localhost]:41170, remote=[localhost]:
        # 29500) timed out after 1800000ms"
        r"|waitForInput: socket SocketImpl\(.*?remote=(?P<remote>[^)]*)\) timed out after "
        r"(?P<ms2>\d+)ms)",
        ms=int,
        ms2=int,
        rank=int,
        root=int,
    ),
    # A C++ CHECK that failed, the process then aborting: glog's and abseil's "F1102 08:11:52.3
    # file.cc:42] Check failed: x == y (1 vs. 2)", TurboMind's "[TM][FATAL] comm/device_comm.cc
    # (28): Check failed: 0 Unknown communication backend: nccl"
    _p("check_failed", "Check failed: ", r"\bCheck failed: (?P<what>.+?)\s*$"),
    # Open MPI's help text when its TCP transport could not reach another host (help-oob-tcp.txt,
    # help-mpi-btl-tcp.txt): "A process or daemon was unable to complete a TCP connection / to
    # another process: / Local host: h1 / Remote host: h2 / This is usually caused by a firewall
    # on the remote host."; the remote host is on its own line
    _p("mpi_tcp_unreachable", "unable to complete a TCP connection",
       r"(?P<head>unable to complete a TCP connection)"),
    _p("mpi_remote_host", "Remote host:", r"^\s*Remote host:\s+(?P<remote>[\w.-]+)\s*$"),
    # vLLM's executor seeing one of its worker processes gone (v1/executor/multiproc_executor.py
    # "Worker proc VllmWorker-1 died unexpectedly, shutting down executor.", the name carrying the
    # worker's rank; ray_executor_v2.py "RayWorkerProc rank=[3] died unexpectedly, ..."; V0's
    # "Worker VllmWorkerProcess pid 4321 died, exit code: -9")
    _p(
        "engine_worker_died",
        ("died unexpectedly, shutting down executor", "died, exit code: "),
        r"(?:Worker proc \w+?-(?P<rank>\d+) died unexpectedly"
        r"|RayWorkerProc rank=\[(?P<rank2>\d+)(?:, \d+)*\] died unexpectedly"
        r"|Worker \w+ pid (?P<pid>\d+) died, exit code: (?P<exitcode>-?\d+))",
        rank=int,
        pid=int,
        exitcode=int,
    ),
    # Gloo's check that both ends of a pair have one address family (gloo/transport/tcp/
    # device.cc or pair.cc, GLOO_ENFORCE_EQ): "[enforce fail at .../device.cc:276]
    # ss1.ss_family == ss2.ss_family. 2 vs 10" (AF_INET vs AF_INET6)
    _p("gloo_family_mismatch", "ss_family == ss2.ss_family",
       r"ss1\.ss_family == ss2\.ss_family\. (?P<family>\d+) vs (?P<other>\d+)",
       family=int, other=int),
    # fairseq's (and metaseq's, and their forks') all_gather_list when a worker's pickled payload
    # is garbage (distributed_utils.py / distributed/utils.py): "Unable to unpickle data from other
    # workers. all_gather_list requires all workers to enter the function together, so this error
    # usually indicates that the workers have fallen out of sync somehow. Workers can fall out of
    # sync if one of them runs out of memory, or if there are other conditions in your training
    # script that can cause one worker to finish an epoch while other workers are still
    # iterating over their portions of the data."
    _p("workers_out_of_sync", "all_gather_list requires all workers to enter the function",
       r"all_gather_list requires all workers to enter the function together"),
    # Horovod's error on every rank's next operation once it has shut down (SHUT_DOWN_ERROR in
    # horovod/common/operations.cc, raised by the torch, TensorFlow and MXNet ops): "Horovod has
    # been shut down. This was caused by an exception on one of the ranks or an attempt to
    # allreduce, allgather or broadcast a tensor after one of the ranks finished execution. ..."
    _p("horovod_shut_down", "Horovod has been shut down",
       r"Horovod has been shut down\. This was caused by an exception on one of the ranks or an "
       r"attempt to"),
    # Horovod's stall inspector (horovod/common/operations.cc, stall_inspector.cc): "One or more
    # tensors were submitted to be reduced, gathered or broadcasted by subset of ranks and are
    # waiting for remainder of ranks for more than 60 seconds. ..." then, up to 0.19, one
    # "<tensor> [missing ranks: 1]" or "<tensor> [ready ranks: 1, 7, 5]" per stalled tensor
    # (after "Stalled ops:"), from 0.20 "Missing ranks:" and one "<rank>: [<tensors>]" per rank.
    _p(
        "horovod_stall",
        ("waiting for remainder of ranks", "Missing ranks:", "Stalled ranks:"),
        r"(?:submitted to be reduced, gathered or broadcasted by subset of ranks and are waiting "
        r"for remainder of ranks for more than (?P<seconds>\d+) seconds"
        # the per-rank report's header (stall_inspector.cc; "Stalled ranks:" up to 0.19), which
        # is evidence of the stall when the warning above is wrapped or cut
        # (horovodrun prefixes each line with "[<rank>] ")
        r"|(?:^|\]\s)\s*(?:Missing|Stalled) ranks:\s*$)",
        seconds=int,
    ),
    # ... and its per-rank lines, "<rank>: [<tensor>, ... ...]" (a "!" after the rank: stalled
    # past HOROVOD_STALL_SHUTDOWN_TIME_SECONDS). Horovod names its tensors by their op, so a
    # line is taken only when a name says allreduce, allgather, broadcast, alltoall or
    # reducescatter.
    _p(
        "horovod_missing_rank",
        # (needles that NCCL's "Broadcast: opCount ..." INFO lines do not hold)
        ("Horovod", "horovod_", "broadcast.", "allreduce.", "allgather.", "alltoall.",
         "_Allreduce", "_Broadcast", "_Allgather", "_Alltoall"),
        r"(?:^|\]\s)\s*(?P<missing>\d+)(?P<shutdown>!)?: \[(?P<tensors>[^\]]*"
        r"(?i:allreduce|broadcast|allgather|alltoall|reducescatter)[^\]]*)",
        missing=int,
    ),
    _p(
        "horovod_stalled_tensor",
        ("[missing ranks: ", "[ready ranks: "),
        r"(?P<tensor>[^\s\[\],]+) \[(?P<which>missing|ready) ranks: (?P<ranks>\d+(?:, \d+)*)\]",
    ),
    # M10: "[Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 1800000 ms"
    _p(
        "monitored_barrier_failed",
        "monitoredBarrier",
        r"Ranks? (?P<ranks>\d+(?:, \d+)*) failed to pass monitoredBarrier in (?P<ms>\d+) ms",
        ms=int,
    ),
    # M10, newer wording: the ranks that arrived are named, the missing ones follow from the
    # world size: "Rank 0 timed out in monitoredBarrier after 2000 ms. Successfully processed
    # ranks: 1, 2".
    _p(
        "monitored_barrier_timeout",
        "timed out in monitoredBarrier",
        r"Rank (?P<by>\d+) timed out in monitoredBarrier after (?P<ms>\d+) ms\."
        r"(?: Successfully processed ranks: (?P<processed>\d+(?:, \d+)*))?",
        by=int,
        ms=int,
    ),
    # M10, the other ranks: "Rank 2 successfully reached monitoredBarrier, but received errors
    # while waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank."
    _p(
        "monitored_barrier_peer_error",
        "successfully reached monitoredBarrier",
        r"Rank (?P<by>\d+) successfully reached monitoredBarrier, but received errors while "
        r"waiting for send/recv from rank (?P<peer>\d+)",
        by=int,
        peer=int,
    ),
    # autograd's anomaly mode when a backward raised (torch/csrc/autograd/python_anomaly_mode.cpp,
    # PyAnomalyMetadata::print_stack): "UserWarning: Error detected in AddmmBackward0.
    # Traceback of forward call that caused the error:" (the exception follows the forward's
    # traceback, and a paste may cut it off): the rank that prints it failed
    _p(
        "autograd_anomaly",
        "Traceback of forward call that caused the error",
        r"Error detected in (?P<node>[\w:<>]+)\. Traceback of forward call that caused the error",
    ),
    # --- collectives --------------------------------------------------------------------------
    # M9 (TORCH_DISTRIBUTED_DEBUG=DETAIL)
    _p(
        "collective_fingerprint_mismatch",
        "Detected mismatch between collectives",
        # (torch 1.10-1.11: "Rank 0 is running inconsistent collective: ...", one rank only)
        r"Detected mismatch between collectives on ranks\. Rank (?P<r1>\d+) is running collective: "
        r"(?P<fp1>CollectiveFingerPrint\(.*?\)),? but Rank (?P<r2>\d+) is running collective: "
        # (its period may be cut off with what follows: the fingerprint then ends the text)
        r"(?P<fp2>CollectiveFingerPrint\(.*?\))(?:\.|\s*$)(?:Collectives differ in the "
        r"following aspects: (?P<aspects>.*))?"
        # cut before the second fingerprint (a truncated paste): the first one only (a cut
        # form: a hard-wrapped message is joined further when the next lines complete it)
        r"|Detected mismatch between collectives on ranks\. Rank (?P<r3>\d+) is running "
        r"(?:inconsistent )?collective: (?P<fp3>CollectiveFingerPrint\(.*)(?P<cut>)"
        # ... or wrapped right after its first sentence (the ranks' lines follow)
        r"|Detected mismatch between collectives on ranks\.\s*$(?P<cut2>)",
        r1=int,
        r2=int,
        r3=int,
        alias={"r3": "r1", "fp3": "fp1"},
    ),
    # M1
    _p(
        "watchdog_timeout",
        ("Watchdog caught collective operation timeout", "timed out in call to wait()",
         "timed out in blocking wait", "] Watchdog", "Caught collective operation timeout",
         "milliseconds before timing out", "Timeout(ms)="),
        # (the vendor process groups copy its text: torch_npu's WorkHCCL, torch-xpu's WorkXCCL)
        # (torch 1.10-1.13's blocking wait, WorkNCCL::synchronizeInternal, said "[Rank 1] Caught
        # collective operation timeout: WorkNCCL(...) ran for N milliseconds", no "Watchdog")
        r"(?:(?:\[Rank (?P<pgrank>\d+)\] )?(?:Watchdog c|C)aught collective operation timeout: "
        r"Work(?:NCCL|HCCL|XCCL)\((?:SeqNum=(?P<seq>\d+), )?OpType=(?P<op>\w+)"
        r"(?:, TensorShape=\[[^\]]*\])?"
        r"(?:, NumelIn=(?P<nin>\d+), NumelOut=(?P<nout>\d+))?, Timeout\(ms\)=(?P<timeout_ms>\d+)\) "
        r"ran for (?P<ran_ms>\d+) milliseconds"
        # NCCL_BLOCKING_WAIT=1: wait() raises "Work WorkNCCL(SeqNum=5, OpType=ALLREDUCE, ...,
        # Timeout(ms)=60000) timed out in call to wait()." (1.8-2.1), "... timed out in blocking
        # wait (NCCL_BLOCKING_WAIT=1)." (2.2+)
        r"|Work Work(?:NCCL|HCCL|XCCL)\((?:SeqNum=(?P<seq2>\d+), )?OpType=(?P<op2>\w+)[^)]*?"
        r"Timeout\(ms\)=(?P<timeout_ms2>\d+)\) timed out in (?:call to wait\(\)|blocking wait)"
        # the same, shortened by whoever pasted it ("WorkNCCL(..., OpType=ALLREDUCE, ...)"):
        # each field read where it is found (up to "ran for N milliseconds": a line cut
        # before it is joined with the next first)
        r"|(?:\[Rank (?P<pgrank3>\d+)\] )?(?:Watchdog c|C)aught collective operation timeout:? "
        r"Work(?:NCCL|HCCL|XCCL)\((?:[^)]*?SeqNum=(?P<seq3>\d+))?(?:[^)]*?OpType=(?P<op3>\w+))?"
        r"(?:[^)]*?NumelIn=(?P<nin3>\d+), ?NumelOut=(?P<nout3>\d+))?"
        r"(?:[^)]*?Timeout\(ms\)=(?P<timeout_ms3>\d+))?"
        # (a paste may split a word: "ran for 1800056 millis econds")
        r"[^)]*\)(?: ran for (?P<ran_ms3>\d+)(?= ?m)|\s*$)"
        # the same line cut inside WorkNCCL(...) (a paste's end, a truncated excerpt): its
        # sequence number and op, when shown, still place the rank in the collective
        r"|(?:\[Rank (?P<pgrank4>\d+)\] )?Watchdog caught collective operation timeout:? "
        r"Work(?:NCCL|HCCL|XCCL)\([^)]*?SeqNum=(?P<seq4>\d+)(?:, OpType=(?P<op4>\w+)(?=,))?"
        # (cut after its "Timeout(ms)=", whose ")" is not the WorkNCCL's own)
        r"[^)]*(?:Timeout\(ms\)[^)]*)?$(?P<cut>)"
        # ... or cut inside its first words ("[Rank 1] Watchdog c"): a timeout of that rank
        # (not after the whole word "caught": that line is wrapped, and joined with the next)
        r"|\[Rank (?P<pgrank5>\d+)\] Watchdog(?: (?:c(?:a(?:u(?:gh?)?)?)?)?)?\s*$(?P<cut2>)"
        # ... or wrapped right after its "timeout:" (the rest, WorkNCCL(...), on the next lines),
        # or cut there by whoever pasted it
        r"|(?:Watchdog c|C)aught collective operation timeout:?\s*$(?P<cut3>)"
        # ... or its head garbled (another process's output spliced into the words, as two
        # writers to one terminal do): the tail WorkNCCL::checkTimeout builds is its own
        r"|Work(?:NCCL|HCCL|XCCL)\((?:SeqNum=(?P<seq6>\d+), )?OpType=(?P<op6>\w+)"
        r"(?:[^)]*?NumelIn=(?P<nin6>\d+), ?NumelOut=(?P<nout6>\d+))?.*?\) ran for "
        r"(?P<ran_ms6>\d+) milliseconds before timing out"
        # ... and that tail alone, wrapped before "ran for" (a paste that starts at WorkNCCL):
        # cut, so the next line completes it
        r"|^Work(?:NCCL|HCCL|XCCL)\([^)]*OpType=\w+[^)]*Timeout\(ms\)=\d+\)\s*$(?P<cut4>))",
        pgrank4=int,
        pgrank5=int,
        seq4=int,
        pgrank=int,
        seq2=int,
        timeout_ms2=int,
        pgrank3=int,
        seq3=int,
        nin3=int,
        nout3=int,
        timeout_ms3=int,
        ran_ms3=int,
        seq=int,
        nin=int,
        nout=int,
        timeout_ms=int,
        ran_ms=int,
    ),
    # M5: the watchdog's abort, seen only as its C++ stack ("frame #1:
    # c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(...)", "Exception raised from
    # ncclCommWatchdog at .../ProcessGroupNCCL.cpp:1521") when the message itself is cut off;
    # since torch 2.7 the watchdog thread is ProcessGroupNCCL::Watchdog, whose run() rethrows:
    # "Exception raised from run at .../ProcessGroupNCCL.cpp:2061" (its frames alone, as in any
    # stack dump of a healthy process, are no abort)
    _p(
        "watchdog_abort",
        ("WorkNCCL::checkTimeout", "Exception raised from ncclCommWatchdog",
         "Exception raised from checkTimeout", "Exception raised from run at"),
        r"(?:ProcessGroupNCCL::WorkNCCL::checkTimeout\(|Exception raised from "
        r"(?P<where>ncclCommWatchdog|checkTimeout) at"
        r"|Exception raised from (?P<where2>run) at \S*ProcessGroupNCCL\.cpp)",
    ),
    # M4: the watchdog took the process down after a failed or timed-out NCCL op (printed after
    # M1/M18, but sometimes the only line a fragment keeps).
    _p(
        "nccl_teardown",
        "Some NCCL operations have failed or timed out",
        r"Some NCCL operations have failed or timed out",
    ),
    # M2
    _p(
        "watchdog_summary",
        ("detected by watchdog at work", "Timeout at NCCL work: "),
        # 2.2-2.3: "[PG 0 Rank 3] Timeout at NCCL work: 1580, last enqueued NCCL work: 1582, ..."
        r"(?:(?:failure|Exception \(either an error or timeout\)) detected by watchdog at work"
        r"(?: sequence id)?|Timeout at NCCL work): (?P<seq>\d+).*?last enqueued (?:NCCL )?work: "
        r"(?P<enqueued>-?\d+), last completed (?:NCCL )?work: (?P<completed>-?\d+)",
        seq=int,
        enqueued=int,
        completed=int,
    ),
    # M8 desync report lines
    _p(
        "desync_not_joined",
        "but didn't join collective",
        r"\[(?P<ranks>[\d, ]+)\] finished collective #(?P<done>\d+), but didn't join collective "
        r"#(?P<seq>\d+)",
        done=int,
        seq=int,
    ),
    _p(
        "desync_not_finished",
        "joined but didn't finish collective",
        r"\[(?P<ranks>[\d, ]+)\] joined but didn't finish collective #(?P<seq>\d+)",
        seq=int,
    ),
    # "- [0] Timeout at collective: ALLREDUCE, #315": the report's own rank and collective.
    _p(
        "desync_timeout_at",
        "Timeout at collective: ",
        r"\[(?P<by>\d+)\] Timeout at collective: (?P<op>\w+), #(?P<seq>\d+)",
        by=int,
        seq=int,
    ),
    # M7: the watchdog itself hung (a CUDA or NCCL call that never returned); the heartbeat
    # monitor kills the process: "Heartbeat monitor timed out!" (2.2-2.5), "ProcessGroupNCCL's
    # watchdog got stuck for 600 seconds without making progress ..." (all).
    _p(
        "watchdog_hang",
        ("Heartbeat monitor timed out", "watchdog got stuck for",
         "due to ProcessGroupNCCL watchdog hang", "NCCL monitor thread timeout",
         "detects no heartbeat", "No PGNCCL's watchdog heartbeat",
         "detected no heartbeat of its watchdog",
         "Monitor Thread is disabled, but would have killed"),
        # 2.2: "[Rank 1] NCCL monitor thread timeout. Basically, this could be due to CUDA or NCCL
        # calls being unexpectedly blocking, ...", "[Rank 1] monitoring thread detects no
        # heartbeat and will finally kill the process!", "No PGNCCL's watchdog heartbeat detected"
        r"(?:Heartbeat monitor timed out!|watchdog got stuck for (?P<seconds>\d+) seconds"
        r"|NCCL monitor thread timeout|monitoring thread detects no heartbeat"
        r"|No PGNCCL's watchdog heartbeat detected"
        # 2.4+: "First PG on this rank that detected no heartbeat of its watchdog.", and with
        # TORCH_NCCL_ENABLE_MONITORING=0 "PGNCCL Monitor Thread is disabled, but would have
        # killed this job:"
        r"|detected no heartbeat of its watchdog|Monitor Thread is disabled, but would have killed"
        r"|Terminating the process after attempting to dump debug info, due to ProcessGroupNCCL "
        r"watchdog hang)",
        seconds=int,
    ),
    # M6: a rank timed out and asked every rank to dump Flight Recorder traces: "Received a dump
    # signal due to a collective timeout from this local rank" / "from  rank 3" (2.5+), "Received
    # a global timeout from another rank and will start to dump the debug info." (2.2-2.4).
    _p(
        "dump_signal",
        ("Received a dump signal due to a collective timeout", "Received a global timeout from",
         "Received a global dump signal from"),
        r"(?:Received a dump signal due to a collective timeout from (?:(?P<local>this local rank)"
        r"| +rank (?P<src>-?\d+))|Received a global timeout from another rank"
        r"|Received a global dump signal from rank (?P<src2>-?\d+))"
        r"(?:.*?[Ll]ast enqueued NCCL work: (?P<enqueued>-?\d+), last completed NCCL work: "
        r"(?P<completed>-?\d+))?",
        src=int,
        src2=int,
        enqueued=int,
        completed=int,
    ),
    # A collective on a communicator that an earlier failure aborted (the watchdog's, or an
    # abort after another rank's): "NCCL communicator was aborted on rank 2.  Original reason
    # for failure was: ..." (the reason, when given, is classified on its own).
    _p(
        "nccl_comm_aborted",
        ("NCCL communicator was aborted on rank", "NCCL communicator encountered error set by"),
        r"(?:NCCL communicator was aborted on rank (?P<rank>\d+)"
        r"|NCCL communicator encountered error set by ProcessGroupNCCL: (?P<reason>.+))",
        rank=int,
    ),
    # The watchdog's periodic INFO (TORCH_CPP_LOG_LEVEL=INFO): how far this rank's PG got.
    _p(
        "watchdog_progress",
        "NCCL Work update periodically",
        r"NCCL Work update periodically: last enqueued NCCL work: (?P<enqueued>-?\d+), last "
        r"completed NCCL work: (?P<completed>-?\d+)",
        enqueued=int,
        completed=int,
    ),
    _p(
        "desync_never_joined",
        "They never joined any collectives",
        r"ranks \[(?P<ranks>[\d, ]*)\] are the lagging ranks that caused this timeout",
    ),
    # Gloo: the peer is alive but absent.
    _p(
        "gloo_timeout",
        ("operation to complete", "Application timeout caused pair closure", "Read timeout [",
         "Write timeout [", "RuntimeError: Resource temporarily unavailable"),
        r"(?:Timed out waiting (?P<ms>\d+)ms for (?P<op>recv|send) operation to complete"
        # torch <= 1.6: c10d's socket read timing out raised the bare strerror of EAGAIN (a
        # std::system_error), "RuntimeError: Resource temporarily unavailable"
        r"|^RuntimeError: Resource temporarily unavailable\s*$"
        # Gloo before 2019 (transport/tcp/buffer.cc, pair.cc): "Read timeout [127.0.0.1]:32444"
        r"|(?P<rw>Read|Write) timeout \[(?P<peer>[^\]]+)\]:\d+"
        # The pair is closed on timeout; later ops on it raise this.
        r"|Application timeout caused pair closure)",
        ms=int,
    ),
    # Gloo: the peer sent more (or fewer) bytes than this rank expects: the ranks run different
    # collectives or shapes. "[enforce fail at ../third_party/gloo/gloo/transport/tcp/pair.cc:446]
    # op.preamble.length <= op.nbytes. 8 vs 4"
    _p(
        "gloo_size_mismatch",
        "op.preamble.length <= op.nbytes",
        r"op\.preamble\.length <= op\.nbytes\. (?P<got>\d+) vs (?P<want>\d+)",
        got=int,
        want=int,
    ),
    # Gloo's full-mesh connect at init gave up (M21): "Gloo connectFullMesh failed with [...]
    # timed out connecting: SO_ERROR: Connection refused, remote=[127.0.0.1]:21926$1", and its
    # debug logger's last try "failed to connect, willRetry=0, ..." (willRetry=1 is transient).
    _p(
        "gloo_connect_failure",
        ("connectFullMesh failed", "failed to connect, willRetry=0", "] connect"),
        # Older Gloo: "[../third_party/gloo/gloo/transport/tcp/pair.cc:799] connect
        # [127.0.1.1]:27389: Connection refused" (often a hostname resolving to loopback).
        r"(?:Gloo connectFullMesh failed(?: with)?|failed to connect, willRetry=0"
        r"|pair\.cc:\d+\] connect \[(?P<addr2>[^\]]+)\]:(?P<port2>\d+): (?P<why2>.+))"
        r"(?:.*?(?P<why>Connection refused|Connect timeout|timed out connecting|No route to host"
        r"|Connection reset by peer))?(?:.*?remote=\[(?P<addr>[^\]]+)\]:(?P<port>\d+))?"
        # torch >= 2.2 names the rank's own bound address: "(rank=8, size=16, local=[127.0.0.1])"
        r"(?:.*?local=\[(?P<local>[^\]]+)\])?",
        port=int,
        port2=int,
    ),
    # ProcessGroupGloo's createDefaultDevice (torch 1.8+) when the host name resolves to no local
    # address: "Unable to resolve hostname to a (local) address. Using the loopback address as
    # fallback. Manually set the network interface to bind to with GLOO_SOCKET_IFNAME."
    _p(
        "gloo_loopback_fallback",
        "address. Using the loopback",
        # (a paste wrapped after "loopback" keeps it)
        r"Unable to resolve hostname to a \(local\) address\. Using the loopback",
    ),
    # An init method in a file (FileStore), as printed by scripts or their argument dumps:
    # "| distributed init (rank 1): file:///nfs/job/dist_init", "--dist-url file:///…".
    # Scripts that create the store file themselves say so when it is left from a run before
    # (epfml/powersgd: "File already exists: output.tmp/dist_init").
    _p("init_file_url", ("file://", "File already exists: "),
       r"(?:file://(?P<path>/[^\s'\",;)\]}]+)|^File already exists: (?P<path2>\S+)$)"),
    # Work one rank does on its own, naming itself: "Running predictions on sample x on rank=0",
    # "[rank 0] Saving checkpoint to ...", "Evaluating on rank 0". Only telling when it is the
    # last thing a log shows before a collective timeout (COLL010).
    _p(
        "rank_local_work",
        ("predict", "Predict", "evaluat", "Evaluat", "validat", "Validat", "checkpoint",
         "Checkpoint", "Saving", "saving", "plotting", "Plotting"),
        r"(?i)(?:\brank\s*[=:]?\s*(?P<rank>\d+)\b.{0,80}?\b(?P<what>predict\w*|evaluat\w*"
        r"|validat\w*|checkpoint\w*|saving|plotting)|\b(?P<what2>predict\w*|evaluat\w*|validat\w*"
        r"|checkpoint\w*|saving|plotting)\b.{0,120}?\brank\s*[=:]?\s*(?P<rank2>\d+)\b)",
        rank=int,
        rank2=int,
    ),
    # A checkpoint save that is itself a collective (every rank must call it), as the frameworks
    # log its start and end on the main process only. accelerate's save_state (accelerator.py,
    # checkpointing.py save_accelerator_state, 0.x-1.x): "Saving FSDP model" / "FSDP Model saved
    # to output dir …", "Saving FSDP Optimizer" / "FSDP Optimizer saved to …", "Saving DeepSpeed
    # Model and Optimizer" / "DeepSpeed Model and Optimizer saved to output dir …", "Saving
    # Megatron-LM Model, Optimizer and Scheduler" / "Megatron-LM Model , Optimizer and Scheduler
    # saved to …"; DeepSpeed's checkpoint engines (log_dist on rank 0): "[Torch] Checkpoint
    # global_step10 is about to be saved!" / "… is ready now!" (the end line until 0.14).
    _p(
        "distributed_save",
        ("Saving FSDP ", "Saving DeepSpeed Model", "Saving Megatron-LM Model",
         "is about to be saved!", "Model saved to", "Optimizer saved to", "Scheduler saved to",
         "is ready now!"),
        r"(?:\bSaving (?P<start>FSDP model|FSDP Optimizer|DeepSpeed Model and Optimizer"
        r"|Megatron-LM Model, Optimizer and Scheduler)\b(?! saved)"
        r"|\bCheckpoint (?P<start2>\S+) is about to be saved!"
        r"|\b(?P<done>FSDP Model|FSDP Optimizer|DeepSpeed Model and Optimizer"
        r"|Megatron-LM Model , Optimizer and Scheduler) saved to\b"
        r"|\bCheckpoint (?P<done2>\S+) is ready now!)",
    ),
    # A rank's own count of its data, as training loops print it to debug a hang: "Rank = 2,
    # Number of batches 8", "rank0  data.py:462  ... num_local_samples=2", "[rank 1] len(loader)
    # = 125" (a count of batches, steps, iterations or samples, not a step counter: "number
    # of", "num_", "len(" before it). COLL004 compares them across ranks.
    _p(
        "rank_data_count",
        ("umber of", "num_", "Num_", "len(", "NUM_"),
        r"(?i)\brank\s*[=:]?\s*(?P<rank>\d+)\b.{0,80}?\b(?P<what>(?:number of |num_|len\()"
        r"(?:\w*_)?(?:batch(?:es)?|steps?|iter(?:ation)?s?|samples?)\w*\)?)\s*[=:]?\s*"
        r"(?P<n>\d+)\b",
        rank=int,
        n=int,
    ),
    # A program's own print of the tensor it passes to a collective, as users print them to
    # debug a hang: "# Rank 0 tensor before allreduce: torch.Size([409600]) 1.0", "[rank3]:
    # all_gather input torch.Size([4, 512])". COLL001 compares the shapes across ranks (not
    # all_to_all's: its inputs may differ by design).
    _p(
        "rank_collective_shape",
        "torch.Size(",
        r"(?i)(?P<label>[^\r\n]{0,80}?\b(?:all_?reduce|all_?gather\w*|broadcast|reduce_?scatter"
        r"\w*|collective)\b[^\r\n]{0,60}?)torch\.Size\((?P<shape>\[[\d, ]*\])\)",
    ),
    # A peer went away: a consequence, reported as a symptom.
    _p(
        "peer_closed",
        (
            "Connection closed by peer",
            "Connection closed by remote peer",
            "Failed to recv, got 0 bytes",
            "failed to recv, got 0 bytes",  # (torch 2.3's Utils.hpp, lower case)
            "Connection reset by peer",
            "remote process exited or there was a network error",
            "sendBytes failed on",
            'Failed to check the "should dump" flag',
            "Error: Broken pipe",
            ": eof (this error originated at",
        ),
        r"(?:Connection closed by (?:remote )?peer\s*\[?(?P<peer>[^\]\s]*)\]?(?::(?P<port>\d+))?"
        r"|[Ff]ailed to recv, got 0 bytes|Connection reset by peer"
        r"|remote process exited or there was a network error"
        # The store's host (rank 0's agent or process) went away: writes fail, the dump check
        # fails ("maybe TCPStore server has shut down too early").
        r"|sendBytes failed on SocketImpl\(.*?remote=\[?(?P<peer2>[^\]\s)]*)"
        r"|Failed to check the \"should dump\" flag on TCPStore"
        r"|^(?:\w+\.)*(?:RuntimeError|DistNetworkError): Broken pipe$"
        # torch.distributed.rpc's TensorPipe agent (rpc/tensorpipe_agent.cc): "RPC agent for
        # parameter_server encountered error when sending response to request #4 to trainer_1:
        # eof (this error originated at tensorpipe/transport/shm/connection_impl.cc:259)" (not
        # the shutdown's own, which says "(this is expected to happen during shutdown)")
        r"|RPC agent for \S+ encountered error when \w+ .*? (?:to|from) (?P<peer3>\S+): eof "
        r"\(this error originated at)",
    ),
    # --- crashes ------------------------------------------------------------------------------
    # Python logging's stack_info=True and traceback.print_stack(): frames that report where a
    # healthy program is, not an error ("Stack (most recent call last):")
    _p("printed_stack", "Stack (most recent call last)", r"^\s*Stack \(most recent call last\):"),
    # (indented too: a progress bar's redraw erased by a paste leaves its spaces before it)
    _p("traceback", "Traceback (most recent call last)",
       r"^\s*Traceback \(most recent call last\):"),
    # torchelastic: "failed (exitcode: 1) local_rank: 0 (pid: 23273) of binary: /usr/bin/python3"
    _p(
        "worker_failed",
        "local_rank:",
        # (rich logging puts its "api.py:673" column after "(pid: N) of" and wraps "binary:")
        r"failed \(exitcode: (?P<exitcode>-?\d+)\) (?:local_rank: (?P<local_rank>\d+) "
        r"\(pid: (?P<pid>\d+)\)(?: of\b)?"
        # a vendor build's wording (PAI-DLC): "failed (exitcode: -9) for binary located at
        # /usr/bin/python3.10 with local_rank: 0 (process ID: 71)"
        r"|for binary located at \S+ with local_rank: (?P<local_rank2>\d+) "
        r"\(process ID: (?P<pid2>\d+)\))",
        exitcode=int,
        local_rank=int,
        pid=int,
    ),
    # torchelastic's failure summary field "traceback : Signal 11 (SIGSEGV) received by PID 6421",
    # read here when the summary's header is not in the inputs (a pasted fragment; inside a
    # whole summary the entry is read as elastic_failure instead)
    _p(
        "worker_signal",
        "received by PID",
        r"Signal (?P<signum>\d+) \((?P<signal>SIG\w+)\) received by PID (?P<pid>\d+)",
        signum=int,
        pid=int,
    ),
    # UCX's (and OpenMPI's UCX PML's) crash handler, in place of Python's traceback: "[node7:3039
    # :0:3095] Caught signal 7 (Bus error: nonexistent physical address)", "... Caught signal 11
    # (Segmentation fault: address not mapped to object at address 0x8)", then a backtrace.
    _p(
        "native_signal",
        "Caught signal ",
        r"\[(?P<host>[^:\s\]]+):(?P<pid>\d+) ?:\d+: ?\d+\] Caught signal (?P<signum>\d+) "
        r"\((?P<what>[^:)]+)",
        signum=int,
        pid=int,
    ),
    # Open MPI's signal handler (opal/util/stacktrace.c), in every process that loaded its
    # runtime (mpirun, Horovod, nccl-tests, torch built with MPI): "[host:pid] *** Process
    # received signal ***", then "[host:pid] Signal: Segmentation fault (11)" (macOS:
    # "Segmentation fault: 11 (11)"). It is installed for fatal signals only (SIGSEGV, SIGBUS,
    # SIGFPE, SIGILL, SIGABRT by default), so the header alone, a paste cut after it, is a
    # native crash of that process whose signal is not shown (no signum).
    _p(
        "native_signal",
        "] Signal: ",
        r"\[(?P<host>[^:\s\]]+):(?P<pid>\d+)\] Signal: (?P<what>.+?) \((?P<signum>\d+)\)\s*$",
        signum=int,
        pid=int,
    ),
    _p(
        "native_signal",
        "*** Process received signal ***",
        r"\[(?P<host>[^:\s\]]+):(?P<pid>\d+)\] \*\*\* Process received signal \*\*\*",
        pid=int,
    ),
    # abseil's failure signal handler (absl/debugging/failure_signal_handler.cc), which
    # TensorFlow, JAX/XLA, Ray's core worker and gRPC-linked launchers install: "*** SIGSEGV
    # received at time=1775734074 on cpu 19 ***", then "PC: @ 0x... fn()" frames
    _p(
        "native_signal",
        " received at time=",
        r"\*\*\* (?P<signame>SIG[A-Z]+) received at time=\d+(?: on cpu \d+)? \*\*\*",
        alias={"signame": "signum"},
        signum=_signum_of_name,
    ),
    # apache-tvm-ffi's fatal-signal handler (TVMFFISegFaultHandler, backtrace.cc), which loading
    # flashinfer or xgrammar installs in a process (vLLM's, SGLang's, an RL trainer's...), before
    # its native frames ('File "<unknown>", line 0, in fn'): "!!!!!!! Segfault encountered
    # !!!!!!!" (it then re-raises SIGSEGV)
    _p(
        "native_signal",
        "Segfault encountered",
        r"^!+ (?P<signame>Segfault) encountered !+$",
        alias={"signame": "signum"},
        signum=_signum_of_name,
    ),
    # CPython's faulthandler on a fatal signal (Modules/faulthandler.c, faulthandler_handlers:
    # SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGSEGV): "Fatal Python error: Segmentation fault", then
    # "Current thread 0x... (most recent call first):" and its Python frames
    _p(
        "native_signal",
        "Fatal Python error: ",
        r"Fatal Python error: (?P<signum>Segmentation fault|Bus error|Aborted|Illegal instruction"
        r"|Floating point exception)\s*$",
        signum=_shell_signum,
    ),
    # A shell's report of a child a signal ended (bash's strsignal words, jobs.c): a script's
    # "./run.sh: line 184: 2324239 Aborted (core dumped) python train.py", an interactive
    # shell's bare "Bus error (core dumped)" or job line "[1]+  Killed   python train.py".
    # Only the signals a process dies of by itself or by the OOM killer: Terminated / Hangup
    # come from outside and a bare "Terminated" is too common a word to read alone.
    _p(
        "native_signal",
        ("Segmentation fault", "Bus error", "Aborted", "Illegal instruction",
         "Floating point exception", "Killed"),
        r"^(?:(?P<script>\S+): line \d+: +(?P<pid>\d+) +(?P<signum>" + _SHELL_SIGNALS + r")"
        r"(?: \(core dumped\))?(?: .*)?"
        r"|(?:\[\d+\][+-]? +)?(?P<signum2>" + _SHELL_SIGNALS + r")(?: \(core dumped\))?"
        r"(?: {2,}\S.*)?)\s*$",
        signum=_shell_signum,
        pid=int,
    ),
    # SLURM's srun when a task ends badly (src/srun: "%s: task[s] %s: %s"): "srun: error:
    # nid001: task 3: Exited with exit code 1", "srun: error: gpu7: tasks 0-5,7: Killed",
    # "... task 0: Aborted (core dumped)"; the host and tasks are sometimes cut from a paste.
    # "Out Of Memory" is the oom kind below.
    _p(
        "srun_task_failed",
        "srun: error:",
        r"srun: error: (?:(?P<node>[^:\s]+): tasks? (?P<tasks>[\d,\-\[\]]+): |\.\.\. ?)"
        r"(?P<what>Exited with exit code (?P<exitcode>\d+)|(?!Out Of Memory)[A-Z][a-z]+(?: [a-z]+)*"
        r"(?: \(core dumped\))?)(?:\s*$|\s{2,})",
        exitcode=int,
    ),
    # DeepSpeed's launcher (deepspeed/launcher/launch.py sigkill_handler): "[launch.py:320:
    # sigkill_handler] ['/usr/bin/python', '-u', 'train.py', '--local_rank=1'] exits with return
    # code = -9" (the command is often wrapped over several lines, so only the tail is read).
    _p(
        "worker_failed",
        ("exits with return code", "'--local_rank="),
        r"(?:'--local_rank=(?P<local_rank>\d+)'.*)?exits with return code = (?P<exitcode>-?\d+)"
        # the same ERROR line cut before its tail (which worker, not how it ended); the logger's
        # "[launch.py:321:sigkill_handler]" is read as a prefix, so the command list starts it
        r"|^(?!.*exits with return code)(?:\[launch\.py:\d+:sigkill_handler\] )?\['[^']+', "
        r".*?'--local_rank=(?P<local_rank2>\d+)'",
        exitcode=int,
        local_rank=int,
    ),
    _p(
        "closing_signal",
        ("closing signal", "via signal", "forcefully exiting via", "Killing subprocess "),
        r"(?:Sending process (?P<pid>\d+) (?:the )?closing signal"
        r"|Closing process (?P<pid2>\d+) via signal"
        # torch.multiprocessing (spawn) tearing the other children down after one failed
        r"|Terminating process (?P<pid3>\d+) via signal) (?P<signal>SIG\w+)"
        # both, escalating: "Unable to shutdown process 5 via SIGTERM, forcefully exiting via
        # SIGKILL" (torchelastic prints the Signals enum: "via Signals.SIGTERM, ...", and under
        # Python 3.11+ its number: "via 15, forcefully exiting via 9")
        r"|Unable to shutdown process (?P<pid4>\d+) via \S+ ?, forcefully exiting via "
        r"(?:Signals\.)?(?P<signal2>SIG\w+|\d+)"
        # DeepSpeed's launcher (launcher/launch.py sigkill_handler) after a worker exited
        # non-zero, for each worker (the failed one too): "Killing subprocess 6293" (SIGTERM to
        # its process tree, then SIGKILL)
        r"|(?:sigkill_handler\] |^)Killing subprocess (?P<pid5>\d+)",
        pid=int,
        pid2=int,
        pid3=int,
        pid4=int,
        pid5=int,
        signal=_signal_field,
    ),
    # torchelastic restarting: "[default] Worker group FAILED. 3/3 attempts left; will restart
    # worker group" (the workers' own failures are reported elsewhere).
    _p(
        "worker_group_failed",
        "Worker group FAILED",
        r"(?:\[(?P<role>[^\]]+)\] )?Worker group FAILED\. (?P<left>\d+)/(?P<max>\d+) attempts "
        r"left",
        left=int,
        max=int,
    ),
    # torchelastic's agent got a signal (≤2.3: its number; newer: "Signals.SIGHUP").
    _p(
        "agent_signal",
        "death signal",
        r"Received (?:(?P<signum>\d+)|Signals\.(?P<signame>SIG\w+)) death signal, shutting down "
        r"workers",
        signum=int,
    ),
    # The job stopped from outside: Lightning's signal connector ("Received SIGTERM: 15"),
    # submitit ("Caught signal SIGUSR2 on node1: this job is preempted."), slurmstepd
    # ("*** STEP 5559.0 ON node3 CANCELLED AT 2025-01-10T15:27:25 DUE TO TIME LIMIT ***").
    _p(
        "external_signal",
        ("Received SIG", "this job is preempted", "CANCELLED AT", "*** STEP ", "*** JOB ",
         "graceful shutdown triggered, reason = ", ": job killed",
         "PBS: job killed: walltime", "PBS: job killed: cput", "job exceeded wallclock limit"),
        r"(?:Received (?P<signame>SIG[A-Z0-9]+): (?P<signum>\d+)"
        # Ray's raylet stopped from outside (src/ray/raylet/main.cc): "Raylet graceful shutdown
        # triggered, reason = EXPECTED_TERMINATION, reason message = received SIGTERM"
        r"|Raylet graceful shutdown triggered, reason = (?P<reason2>\w+), reason message = "
        r"received (?P<signame3>SIG[A-Z]+)"
        r"|Caught signal (?P<signame2>\w+) on (?P<host>\S+): this job is preempted"
        r"|\*\*\* (?P<what>JOB|STEP) (?P<id>\S+) ON (?P<node>\S+) CANCELLED AT (?P<at>\S+)"
        r"(?: DUE TO (?P<reason>[A-Z][A-Z ]*[A-Z]))?"
        # the same line cut after "ON" or its node (slurmstepd prints "*** JOB|STEP <id> ON"
        # only in this message)
        r"|\*\*\* (?P<what2>JOB|STEP) (?P<id2>\d[\w.+]*) ON(?: (?P<node2>\S+))?\s*$(?P<cut>)"
        # IBM LSF's job report, its termination reason ("TERM_RUNLIMIT: job killed after
        # reaching LSF run time limit.", TERM_OWNER for bkill, TERM_PREEMPT...; the memory
        # limits are the oom kind's)
        r"|^(?P<what3>TERM)_(?P<reason3>RUNLIMIT|CPULIMIT|OWNER|ADMIN|PREEMPT|REQUEUE_OWNER"
        r"|REQUEUE_ADMIN|FORCE_OWNER|FORCE_ADMIN|WINDOW|BUCKET_KILL|EXTERNAL_SIGNAL)"
        r": job killed"
        # PBS/Torque's: "=>> PBS: job killed: walltime 3630 exceeded limit 3600"
        r"|(?P<what4>PBS): job killed: (?P<reason4>walltime|cput) \d+ exceeded limit"
        # Moab's note in the PBS job report: "MOAB_INFO:  job exceeded wallclock limit"
        r"|(?P<what5>MOAB)_INFO:\s+job exceeded (?P<reason5>wallclock) limit)",
        signum=int,
    ),
    # A C++ exception nobody caught (the watchdog's, or any c10::Error): the process aborts
    # (SIGABRT, exit code -6); the ``what():`` line after it holds the message.
    _p(
        "cpp_terminate",
        "terminate called after throwing an instance of",
        r"terminate called after throwing an instance of '(?P<type>[^']+)'",
    ),
    # torch.multiprocessing.spawn
    _p(
        "spawn_failed",
        "terminated with",
        r"(?:-- Process (?P<index>\d+) terminated with the following error:"
        r"|process (?P<index2>\d+) terminated with (?:exit code (?P<exitcode>-?\d+)"
        r"|signal (?P<signal>SIG\w+)))",
        exitcode=int,
    ),
    _p(
        "oom",
        ("out of memory'", "CUDA out of memory", "OutOfMemoryError",
         "Out of memory: Killed process", "oom-kill", "oom_kill", "Out Of Memory",
         "CUDA error: out of memory", "DefaultCPUAllocator: ",
         "killed due to memory pressure (OOM)",
         "exceeds the memory usage threshold", "Memory on the node (IP: ", "MemoryError",
         "Unable to allocate ", "is killed by signal: Killed", "PU out of memory",
         "HIP out of memory", "MPS backend out of memory", "OUT_OF_DEVICE_MEMORY",
         "driver error:out of memory", "error=2 : out of memory", "OOMKilled",
         "The node was low on resource: memory", "TERM_MEMLIMIT", "TERM_SWAP",
         "PBS: job killed: mem", "PBS: job killed: vmem", "ran out-of-memory",
         "address the out of memory issue", "attempting to recover from OOM",
         "Failed to CUDA calloc", "Failed to CUDA malloc"),
        r"(?:(?P<cuda>CUDA out of memory)(?:\. Tried to allocate (?P<tried>[\d.]+ [KMGT]i?B))?"
        # the other backends' caching allocators say the same of their device ("HIP out of
        # memory. Tried to allocate", "XPU out of memory", torch_npu's "NPU out of memory", "MPS
        # backend out of memory"), as do Level Zero ("ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY",
        # oneCCL) and Ascend's runtime ("rtMalloc execute failed, reason=[driver error:out of
        # memory]")
        r"|(?P<cuda3>(?:HIP|XPU|NPU|MPS backend) out of memory)"
        r"(?:\. Tried to allocate (?P<tried2>[\d.]+ [KMGT]i?B))?"
        r"|(?P<cuda4>ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY|driver error:out of memory)"
        r"|(?P<host>Out of memory: Killed process (?P<pid>\d+))|OutOfMemoryError|'out of memory'"
        # the CUDA runtime's own wording (cudaErrorMemoryAllocation), and c10's host allocator:
        # "DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes" (or "not
        # enough memory: ...")
        r"|(?P<cuda2>CUDA error: out of memory)"
        # torch <= 1.10's THC check of the same error: "THCudaCheck FAIL file=... line=278
        # error=2 : out of memory"
        r"|THCudaCheck FAIL .*?error=2 : (?P<cuda5>out of memory)"
        r"|DefaultCPUAllocator: (?P<cpu>can't allocate memory|not enough memory)"
        # Python's own host-memory exception line ("MemoryError", "MemoryError: ..."), and
        # numpy's "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 7.45 GiB ..."
        r"|^(?:[\w.]+\.)?(?P<cpu2>_?(?:Array)?MemoryError)(?:: .*)?$"
        # a DataLoader worker the kernel's OOM killer took (torch/utils/data/_utils/
        # signal_handling.py): "DataLoader worker (pid 29668) is killed by signal: Killed."
        r"|DataLoader worker \(pid (?P<worker>\d+)\) is killed by signal: (?P<cpu3>Killed)"
        # Ray's memory monitor: "(raylet) 1 Workers (tasks / actors) killed due to memory
        # pressure (OOM), ..." / "Memory on the node (IP: 10.0.0.1, ...) ... was 28.50GB /
        # 30.00GB (0.95), which exceeds the memory usage threshold of 0.95."
        r"|(?P<ray>killed due to memory pressure \(OOM\))"
        r"|Memory on the node \(IP: (?P<ip>[^,)]+)[^)]*\) where the (?:task|actor)"
        r"(?: \([^)]*?\brank=(?P<victim>\d+))?"  # Ray Train's worker: "(..., name=head, rank=0,"
        r"|which exceeds the memory usage threshold"
        # SLURM: the step's cgroup OOM handler ("slurmstepd: error: Detected 1 oom-kill event(s)
        # in StepId=1234.0 ...", "Detected 2 oom_kill events in ...") and srun's task status
        # ("srun: error: nid001: task 3: Out Of Memory")
        r"|(?P<cgroup>Detected \d+ oom[-_]kill event)"
        r"|srun: error: (?P<node>[^:\s]+): tasks? (?P<tasks>[\d,\-\[\]]+): Out Of Memory"
        # Ray's memory monitor report, its advice paragraph (what survives a paste cut after the
        # head: raylet node_manager.cc): "Refer to the documentation on how to address the out
        # of memory issue: https://docs.ray.io/en/latest/ray-core/scheduling/ray-oom-...."
        r"|(?P<ray2>how to address the out of memory issue)"
        # a container's memory limit: Kubernetes' termination reason ("Reason: OOMKilled",
        # "reason: OOMKilled", kubectl's STATUS column), the kubelet's eviction for memory
        # pressure ("The node was low on resource: memory.", eviction/helpers.go)
        r"|\b(?P<cgroup2>OOMKilled)\b|(?P<cgroup3>The node was low on resource: memory)"
        # the batch schedulers' memory limits: LSF's job report ("TERM_MEMLIMIT: job killed after
        # reaching LSF memory usage limit.", "TERM_SWAP: ..."), PBS/Torque ("=>> PBS: job
        # killed: mem 33554432kb exceeded limit 16777216kb", "... vmem ...")
        r"|^(?P<cgroup4>TERM_(?:MEMLIMIT|SWAP)): job killed"
        r"|(?P<cgroup5>PBS: job killed: v?mem) \S+ exceeded limit"
        # Google's training service (ML Engine, Vertex AI custom jobs): "The replica master 0
        # ran out-of-memory and exited with a non-zero status of 9(SIGKILL)"
        r"|The replica (?P<replica>\w[\w-]*(?: \d+)?) ran out-of-memory"
        # fairseq's and metaseq's trainer catching a CUDA OOM to skip the batch (trainer.py):
        # "attempting to recover from OOM in forward/backward pass"
        r"|(?P<cuda6>attempting to recover from OOM)(?: in [\w/ ]+pass)?"
        # NCCL's device allocations (include/alloc.h, 2.14+): "Failed to CUDA calloc async 1920
        # bytes", "Failed to CUDA malloc 67108864 bytes" (its WARN, or torch's "Last error:"
        # under an ncclInternalError / ncclUnhandledCudaError)
        r"|Failed to (?P<cuda7>CUDA (?:calloc(?: async)?|malloc)) (?P<nbytes>\d+) bytes)",
    ),
    # kubectl describe pod's "Last State:     Terminated" (the container's previous run: the
    # "Reason: OOMKilled" under it is history)
    _p("k8s_last_state", "Last State:", r"^\s*Last State:\s+Terminated\b"),
    # Ray (python/ray/exceptions.py ActorDiedError) when an actor's worker process vanished:
    # "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR
    # Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of
    # file. There are some potential root causes. (1) The process is killed by SIGKILL by OOM
    # killer due to high memory usage. ..." (an exit Ray did not ask for, with no error of its own)
    _p(
        "ray_worker_died",
        ("because its worker process has died", "killed while executing a task by an "
         "unexpected system error"),
        # (an INTENDED_USER_EXIT / INTENDED_SYSTEM_EXIT is Ray or the user ending it: no failure)
        r"The actor is dead because its worker process has died\. Worker exit type: "
        r"(?!INTENDED_)(?P<exit_type>[A-Z_]+)(?: Worker exit detail: (?P<detail>[^.]+))?"
        # the raylet's own report of a task's worker (src/ray/raylet/node_manager.cc), its exit
        # type and detail often cut from a paste: "(raylet) A worker died or was killed while
        # executing a task by an unexpected system error. ... Worker exit type: SYSTEM_ERROR"
        r"|(?P<unexpected>A worker died or was killed while executing a task by an unexpected "
        r"system error)(?:.*?Worker exit type: (?P<exit_type2>[A-Z_]+))?"
        r"(?:.*?Worker exit detail: (?P<detail2>[^.]+))?",
    ),
    # torch's check of the GPU against the architectures it was built for (torch/cuda/__init__.py
    # _check_capability): "NVIDIA A100 with CUDA capability sm_80 is not compatible with the
    # current PyTorch installation." (its kernels will fail with "no kernel image is available")
    _p(
        "cuda_arch_unsupported",
        "is not compatible with the current PyTorch installation",
        r"with CUDA capability (?P<sm>sm_\d+) is not compatible with the current PyTorch "
        r"installation",
    ),
    # Python's threading.excepthook before a thread's uncaught traceback: "Exception in thread
    # prefetch:", "Exception in thread Thread-1 (worker):" (the thread died, not the process).
    _p(
        "thread_exception",
        "Exception in thread ",
        r"^Exception in thread (?P<thread>.+?):\s*$",
    ),
    # Ray Train when one of its training workers' actor died (train/_internal/utils.py
    # check_for_failure): "Worker 0 has failed." (the index in the worker group: its world rank).
    _p(
        "ray_train_worker_failed",
        " has failed.",
        r"^Worker (?P<rank>\d+) has failed\.\s*$",
        rank=int,
    ),
    # The NCCL a process loaded does not fit the torch or CUDA it runs with: an ncclConfig_t from
    # a newer NCCL's headers read by an older libnccl ("Invalid config blocking attribute value
    # -2147483648", init.cc, 2.14+), or NCCL's own check of the CUDA runtime and driver ("NCCL
    # cannot be captured in a graph if either it wasn't built with CUDA runtime >= 11.3 or if the
    # installed CUDA driver < R465.", enqueue.cc, 2.9+).
    _p(
        "nccl_build_incompatible",
        ("Invalid config blocking attribute value", "NCCL cannot be captured in a graph",
         "undefined symbol: nccl", "exceeds device/fn maxSharedMem"),
        r"(?P<config>Invalid config blocking attribute value -?\d+)"
        # The dynamic loader finding a libnccl without a function torch (or an extension) was
        # built against: "ImportError: .../torch/lib/libtorch_cuda.so: undefined symbol:
        # ncclMemFree", glibc's "symbol lookup error: ...: undefined symbol: ncclCommRegister"
        r"|(?:(?P<library>[\w.+-]+\.so(?:\.[\d.]+)?): )?undefined symbol: (?P<symbol>nccl\w+)"
        # NCCL's kernels asking more shared memory than the GPU's architecture gives (init.cc
        # WARN "cudaArch 1200 ncclMaxSharedMem 82240 exceeds device/fn maxSharedMem 79856"; 2.25's
        # INFO without the arch): an NCCL older than the GPU (2.25 on Blackwell, fixed in 2.26.2)
        # (2.29.7+: "cudaArch 1000 dynamic smem 82240 exceeds device/fn maxSharedMem 79856")
        r"|(?:ncclMaxSharedMem|dynamic smem) (?P<shmem>\d+) exceeds device/fn maxSharedMem "
        r"(?P<limit>\d+)"
        r"|(?P<graph>NCCL cannot be captured in a graph if either it wasn't built with CUDA "
        r"runtime >= [\d.]+ or if the installed CUDA driver < R\d+)",
    ),
    # Which network transport NCCL took (init): "NET/Plugin: Loaded net plugin IBext_v8 (v8)"
    # (2.19+), "NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin." (2.23+),
    # "NET/Plugin: Using internal network plugin." (2.21+), "NET/Plugin : No plugin found
    # (libnccl-net.so), using internal implementation" (2.7-2.18), HPC-X's plugin's own "Plugin
    # Path : /opt/hpcx/.../libnccl-net.so", and "Using network IB" (2.19+: the transport in use).
    _p(
        "nccl_net_choice",
        ("Loaded net plugin", "Using internal network plugin", "using internal implementation",
         "Plugin Path : ", "NCCL INFO Using network "),
        r"NET/Plugin ?: Loaded net plugin (?P<plugin>\S+)"
        r"|NET/Plugin ?: (?:No plugin found.*?using internal implementation"
        r"|(?:Could not find: ?\S+\. )?Using internal network plugin)(?P<internal>)"
        r"|Plugin Path : (?P<path>\S+)"
        r"|NCCL INFO Using network (?P<network>\S+)",
    ),
    # NCCL's RAS status report (ncclras, 2.24+; src/ras/client_support.cc) of a communicator
    # whose ranks launched different numbers of one collective: "Communicator ranks have
    # different AllGather operation counts", then per value, most frequent first, "30 ranks have
    # launched up to operation 640" (or "... have not launched any operations"), and the ranks
    # of the small groups: "Rank 12 -- GPU 4 managed by process 323032 on node 10.0.0.4", or for
    # one rank alone "Rank 5 has launched up to operation 639 -- GPU 5 managed by ...".
    # PyTorch's Flight Recorder analyzer (fr_trace; torch/distributed/flight_recorder/components
    # utils.py and types.py, earlier tools/flight_recorder), its report pasted as text: a block
    # per collective it could not match, headed "Not all ranks joining collective, sequence
    # number: 31117" (older: "...collective: sequence number: ..."), "Collective sequence number:
    # 39 has errors" (older: "Collective 39 at entry 38 errors") or "Input/output mismatch in the
    # collective sequence number: N", then "missing ranks: {3, 4, 5}" or "error msg: Culprit
    # rank 22; Error type: SIZE_OR_SYNTAX_MISMATCH, ..., Culprit rank 110; ...".
    _p(
        "fr_report",
        ("Not all ranks joining collective", " at entry ", "has errors",
         "Input/output mismatch in the collective sequence number", "missing ranks: {",
         "error msg: Culprit rank"),
        r"^(?:Not all ranks joining collective[,:] sequence number: (?P<missing_seq>\d+)"
        r"|Collective (?P<error_seq>\d+) at entry \d+ errors"
        r"|Collective sequence number: (?P<error_seq2>\d+) has errors"
        r"|Input/output mismatch in the collective sequence number: (?P<io_seq>\d+)"
        r"|missing ranks: \{(?P<missing>[\d, ]+)\}"
        r"|error msg: (?P<errors>Culprit rank \d+;.*))",
        missing_seq=int,
        error_seq=int,
        io_seq=int,
    ),
    _p(
        "ras_op_counts",
        ("different ", "ranks have launched up to operation", "ranks have not launched any",
         " managed by process ", "-- [process information not found]"),
        r"Communicator ranks have different (?P<op>\w+) operation counts"
        r"|^\s*(?P<count>\d+) ranks have (?:launched up to operation (?P<value>\d+)"
        r"|not launched any operations(?P<none>))"
        r"|^\s*Rank (?P<crank>\d+)(?: has launched up to operation (?P<value2>\d+)"
        r"| has not launched any operations(?P<none2>))? -- (?:GPU \S+ managed by process "
        r"(?P<cpid>\d+) on node (?P<node>\S+)|\[process information not found\])",
        count=int,
        value=int,
        crank=int,
        cpid=int,
    ),
    # Ray's check when a process joins a cluster (python/ray/_private/utils.py
    # check_version_info): "RuntimeError: Version mismatch: The cluster was started with:" then
    # "    Ray: 2.9.3" / "    Python: 3.10.13" / "This process on node 10.0.0.7 was started with:"
    _p(
        "ray_version_mismatch",
        "Version mismatch: The cluster was started with",
        r"Version mismatch: The cluster was started with",
    ),
    # --- DDP ----------------------------------------------------------------------------------
    # DDP's Join context with throw_on_early_termination=True (torch.distributed.algorithms.join,
    # nn.parallel.distributed): the rank out of data raises "Rank 1 exhausted all inputs.", the
    # others "Detected at least one rank that exhausted inputs. Throwing across all ranks."
    _p(
        "inputs_exhausted",
        ("exhausted all inputs", "rank that exhausted inputs", "Detected uneven workload",
         "completed its entire epoch"),
        r"Rank (?P<exhausted>\d+) exhausted all inputs"
        # AllenNLP's trainer when a worker's data ran out first (gradient_descent_trainer.py):
        # "Worker 0 completed its entire epoch (training)." (the others' next all_reduce waits)
        r"|Worker (?P<exhausted2>\d+) completed its entire epoch"
        r"|(?P<other>Detected at least one rank that exhausted inputs)"
        # a training loop's own join check (CosyVoice's executor: a monitored barrier per step
        # whose timeout means a rank ran out of data): "Detected uneven workload distribution: ..."
        r"|(?P<uneven>Detected uneven workload distribution)",
        exhausted=int,
    ),
    _p(
        "unused_parameters",
        ("Expected to have finished reduction", "did not receive grad for rank",
         "which did not receive grad: ",
         "parameters that were not used in producing the loss",
         "did not receive gradient on this rank"),
        r"(?:Expected to have finished reduction in the prior iteration"
        # the message's last sentence, when a paste keeps only the end of it
        r"|which particular parameters did not receive gradient on this rank"
        r"|Parameter(?:s| indices)? which did not receive grad(?: for rank (?P<rank>\d+))?: "
        r"(?P<params>.+)"
        # Lightning's rewording: "It looks like your LightningModule has parameters that were not
        # used in producing the loss returned by training_step."
        r"|has parameters that were not used in producing the loss)",
        rank=int,
    ),
    # The NVIDIA kernel driver's GPU error report (dmesg, journalctl, /var/log/kern.log):
    # "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.", "NVRM: Xid
    # (PCI:0000:18:00): 74, NVLink: ...", "NVRM: Xid (PCI:...): 137, RLW_RXPIPE interrupt ...":
    # a GPU, memory (ECC) or NVLink fault on that host, whatever the job printed.
    _p(
        "gpu_xid",
        "NVRM: Xid",
        r"NVRM: Xid \((?P<pci>[^)]*)\): (?P<xid>\d+),? ?(?P<msg>.*)",
        xid=int,
    ),
    # Open MPI's launcher (orterun/prterun errmgr help texts) when a rank's process died:
    # "mpirun noticed that process rank 2 with PID 4711 on node gpu3 exited on signal 9
    # (Killed).", "... exited on signal 11 (Segmentation fault)." (mpiexec, orterun, prterun
    # alike; pid and node may be anonymised in a paste), and its first-failure block, "The first
    # process to do so was:" / "  Process name: [[50371,1],0]" / "  Exit code: 1" (the rank is
    # the process name's last number). The rank is mpirun's, which is the job's global rank.
    # HPE Cray PALS (the mpiexec of Aurora, Polaris, Frontier's PBS systems) for each rank that
    # ended badly: "x1921c7s1b0n0: rank 12 died from signal 9", "nid0042: rank  3 exited with
    # code 1" (two spaces before a one-digit rank).
    _p(
        "mpi_process_exit",
        ("noticed that process rank", "Process name: [[", "died from signal",
         "exited with code"),
        r"(?:(?:mpirun|mpiexec|orterun|prterun|prte) noticed that process rank (?P<rank>\d+) with "
        r"PID (?P<pid>\S+) on node (?P<node>\S+) exited on signal (?P<signum>\d+)"
        r"(?: \((?P<signame>[^)]+)\))?"
        r"|^\s*Process name: \[\[\d+,\d+\],(?P<rank2>\d+)\]\s*$"
        # (the host part is often read as a pdsh-style "host: " prefix)
        r"|^(?:(?P<node2>[\w.-]+?)(?:\.\.\.)?: )?rank +(?P<rank3>\d+) (?:died from signal "
        r"(?P<signum2>\d+)|exited with code (?P<exitcode>\d+))\b)",
        rank=int,
        signum=int,
        exitcode=int,
    ),
    # A DataLoader worker's own fatal-signal handler (torch/csrc/DataLoader.cpp SIGNAL_HANDLER):
    # "ERROR: Unexpected segmentation fault encountered in worker.", "... floating-point
    # exception ..." (its bus-error twin names shared memory: shm_error's).
    _p(
        "dataloader_worker_signal",
        "encountered in worker",
        r"ERROR: Unexpected (?P<what>segmentation fault|floating-point exception) encountered "
        r"in worker",
    ),
    # PyTorch Lightning (strategies/ddp.py reconciliate_processes, 1.4-1.9) re-raising a rank's
    # exception as "DeadlockDetectedException: DeadLock detected from rank: 0 \n <its trace>":
    # the rank named is the one that failed.
    _p(
        "lightning_deadlock",
        "DeadLock detected from rank: ",
        r"DeadlockDetectedException: DeadLock detected from rank: (?P<rank>\d+)",
        rank=int,
    ),
    # SLURM's step daemon failing a task before it ran: pyxis/enroot's container ("slurmstepd:
    # error: pyxis: container start failed with error code: 1", "... pyxis: couldn't start
    # container"), a SPANK plugin ("spank: required plugin spank_pyxis.so: task_init() failed
    # with rc=-1"); under srun --label the task is the rank.
    _p(
        "task_start_failed",
        ("pyxis: container start failed", "pyxis: couldn't start container",
         "task_init() failed"),
        r"(?:pyxis: container start failed(?: with error code: (?P<code>\d+))?"
        r"|pyxis: couldn't start container"
        r"|spank: required plugin (?P<plugin>\S+): task_init\(\) failed)",
        code=int,
    ),
    # Horovod's background thread died (horovod/common/operations.cc, 0.20+): "[1]: Horovod
    # background loop uncaught exception: CUDA error: out of memory" (the bracket is the rank):
    # that rank's own failure, read as its exception
    _p(
        "exception",
        "Horovod background loop uncaught exception",
        r"(?:\[(?P<rank>\d+)\]: )?(?P<type>Horovod background loop uncaught exception): "
        r"(?P<msg>.*)",
        rank=int,
    ),
    # Lightning's / Fabric's device parser (utilities/device_parser.py _sanitize_gpu_ids):
    # "You requested GPUs: [0, 1]\n But your machine only has: [0]" (1.x "GPUs", 2.x "gpu"),
    # also inside an exception's repr with a literal "\n": the launch gave the process fewer
    # GPUs than the Trainer asks for
    _p(
        "gpus_requested_unavailable",
        ("You requested GPUs: [", "You requested gpu: [", "You requested gpus: [",
         "Each process is one gpu"),
        r"You requested (?:GPUs|gpus?): \[(?P<asked>[^\]]*)\]"
        r"(?:(?:\\n|\s)*But your machine only has: \[(?P<have>[^\]]*)\])?"
        # text-generation-inference's shard start (server/utils/dist.py): "assert world_size <=
        # torch.cuda.device_count(), 'Each process is one gpu'": more shards than visible GPUs
        r"|^AssertionError: (?P<shards>Each process is one gpu)$",
    ),
    # OpenSSH's client giving up, as a launcher's ssh prints it (mpirun's rsh agent, pdsh,
    # DeepSpeed's runner, mpi-operator): "root@worker-0.svc: Permission denied
    # (publickey,password).", "Host key verification failed.", "ssh: connect to host node3
    # port 22: Connection refused": nothing started on that host
    _p(
        "ssh_failed",
        ("Permission denied (", "Host key verification failed", "ssh: connect to host ",
         "was not reachable via ssh"),
        r"^(?:[\w.-]+@)?(?P<host>[\w.-]+): Permission denied \((?P<methods>[\w,-]+)\)"
        r"|^Host key verification failed\."
        r"|ssh: connect to host (?P<host2>\S+) port (?P<port>\d+): (?P<err>.+)"
        # DeepSpeed's runner checks each hostfile host first (launcher/runner.py): "Using
        # hostfile at /job/hostfile but host=node7 was not reachable via ssh."
        r"|but host=(?P<host3>\S+?) was not reachable via ssh",
    ),
    # Open MPI's runtime lost a node's daemon (ORTE help-errmgr-base.txt "node-died"; PRRTE
    # the same): "ORTE has lost communication with a remote daemon." then "  Remote daemon:
    # [[43015,0],20] on node worker-19": that node died, was killed or fell off the network
    _p(
        "mpi_daemon_lost",
        ("has lost communication with a remote daemon", "Remote daemon: [["),
        r"(?:ORTE|PRTE|PRRTE) has lost communication with a remote daemon"
        r"|Remote daemon: \[\[\d+,\d+\],\d+\] on node (?P<node>\S+)",
    ),
    # pdsh (DeepSpeed's default multi-node launcher, its ssh rcmd module) when the command it
    # ran on a host failed there: "pdsh@node0: node1: ssh exited with exit code 1".
    _p(
        "remote_command_failed",
        "ssh exited with exit code",
        r"(?:pdsh@[^:\s]+: )?(?P<node>[^:\s]+): ssh exited with exit code (?P<exitcode>\d+)",
        exitcode=int,
    ),
    # argparse's usage error (CPython Lib/argparse.py ArgumentParser.error: the usage, then
    # "%(prog)s: error: %(message)s", exit status 2, no traceback), with its messages:
    # "unrecognized arguments: --local-rank=4" (torch.distributed.launch of torch 2.x passes
    # --local-rank to a script that declares --local_rank), "the following arguments are
    # required: ...", "argument --x: invalid int value: 'a'", "... expected one argument",
    # "... invalid choice: ...", "... not allowed with argument ...", "ambiguous option: ..."
    _p(
        "usage_error",
        ("error: unrecognized arguments: ", "error: the following arguments are required",
         "error: argument ", "error: ambiguous option: "),
        r"^(?:(?P<prog>[\w.-]+): )?error: (?P<msg>unrecognized arguments: .+"
        r"|the following arguments are required: .+|argument \S+: (?:invalid .+|expected .+"
        r"|not allowed with .+|ignored explicit argument .+)|ambiguous option: .+)$",
    ),
    # CPython failing to start the script it was given, before any traceback (runpy's
    # _run_module_as_main, Modules/main.c): "/usr/bin/python: Error while finding module
    # specification for 'axolotl.cli.train' (ModuleNotFoundError: No module named 'axolotl')",
    # "python3: No module named train", "python: can't open file '/work/train.py': [Errno 2] No
    # such file or directory". Each process the launcher started dies at once.
    _p(
        "python_start_failed",
        ("Error while finding module specification", "can't open file '", ": No module named "),
        r"^(?P<exe>\S*python[\w.]*): (?:Error while finding module specification for "
        r"'(?P<module>[^']+)' \((?P<type>\w+): (?P<msg>.*?)\)?$"
        r"|can't open file '(?P<path>[^']+)': \[Errno (?P<errno>\d+)\] (?P<msg2>.+)"
        r"|No module named (?P<module2>\S+)$)",
        errno=int,
    ),
    # DDP's reducer (reducer.cpp Reducer::mark_variable_ready): one parameter's gradient hook
    # fired twice in one iteration (reentrant backward, e.g. gradient checkpointing with
    # use_reentrant=True; a parameter used outside forward or shared by modules run twice):
    # "Expected to mark a variable ready only once. ..." and "Parameter at index 440 [with name
    # X] has been marked as ready twice. ..."
    _p(
        "ddp_ready_twice",
        ("Expected to mark a variable ready only once", "has been marked as ready twice"),
        r"(?:Expected to mark a variable ready only once"
        r"|Parameter at index (?P<index>\d+)(?: with name (?P<param>\S+))? has been marked as "
        r"ready twice)",
        index=int,
    ),
    # DDP's construction check: the ranks built different models.
    _p(
        "ddp_model_mismatch",
        ("DDP expects same model across all ranks", "appears not to match sizes of the same param",
         "appears not to match strides of the same param"),
        # (reducer.cpp verify_params_across_processes: the parameter count, then each one's
        # sizes, then its strides: "params[127] in this process with sizes [256, 256, 1, 1]
        # appears not to match strides of the same param in process 0.")
        r"(?:DDP expects same model across all ranks, but Rank (?P<r1>\d+) has (?P<n1>\d+) params, "
        r"while rank (?P<r2>\d+) has inconsistent (?P<n2>\d+) params"
        r"|appears not to match (?P<what>sizes|strides) of the same param in process (?P<r3>\d+))",
        alias={"r3": "r2"},
        r1=int,
        r2=int,
        n1=int,
        n2=int,
        r3=int,
    ),
    # --- NCCL ---------------------------------------------------------------------------------
    # NCCL §2: identity. "NCCL version 2.21.5+cuda12.4" (INFO on every rank from 2.22).
    # M19: "ProcessGroupNCCL environments: NCCL version: 2.21.5, ..." (TORCH_CPP_LOG_LEVEL=INFO).
    _p(
        "nccl_version",
        ("NCCL version ", "environments: NCCL version: "),
        r"(?:ProcessGroupNCCL environments: NCCL version: |NCCL version (?=\d+\.\d+\.\d+\S*\+cuda))"
        r"(?P<version>\d+\.\d+\.\d+)(?:(?P<suffix>[^+\s,]*)\+cuda(?P<cuda>\d+\.\d+))?",
    ),
    # NCCL §3.4: "Mismatched NCCL version detected : rank 3 version 22304 rank 0 version 22703"
    _p(
        "nccl_version_mismatch",
        ("Mismatched NCCL version", "NCCL version mismatch", "NCCL library is",
         "NCCL library version is too old", "too old version of NCCL"),
        r"(?:Mismatched NCCL version detected : rank (?P<r1>\d+) version (?P<v1>\d+) rank "
        r"(?P<r2>\d+) version (?P<v2>\d+)|NCCL version mismatch with remote peer (?P<peer>\S+) "
        r"\(local: (?P<local>[^,]+), remote (?P<remote>[^)]+)\)"
        # 2.28+ device API: the application was built against another NCCL than it runs with.
        r"|NCCL library (?:is not backwards compatible|is too old|version is too old)"
        r"|compiled with too old version of NCCL)",
        r1=int,
        r2=int,
    ),
    # the CUDA driver older than the CUDA runtime a build needs: cudaErrorInsufficientDriver (35)
    # as CUDA words it (NCCL's CUDACHECK "Cuda failure 'CUDA driver version is insufficient for
    # CUDA runtime version'", torch's "CUDA error: ...", nccl-tests, every CUDA sample), and
    # torch's own check (c10/cuda): "The NVIDIA driver on your system is too old (found version
    # 10010)"
    _p(
        "cuda_driver_too_old",
        ("driver version is insufficient for CUDA runtime", "driver on your system is too old"),
        r"CUDA driver version is insufficient for CUDA runtime version"
        r"|The NVIDIA driver on your system is too old \(found version (?P<found>\d+)\)",
    ),
    # NCCL §2: the address a rank advertises ("Bootstrap : Using eth0:10.1.2.3<0>").
    _p(
        "nccl_interface",
        ("Bootstrap : Using", "Bootstrap: Using", "NET/Socket : Using", "; OOB ",
         "NET : Using interface"),
        # NCCL 2.3: "NET : Using interface lo:127.0.0.1<0>", one line per interface it found
        r"(?:Bootstrap ?: Using|NET/Socket : Using|; OOB|NET : Using interface) ?(?:\[\d+\])?"
        r"(?P<ifname>[^:\s]+(?::(?![0-9a-fA-F]*:)[A-Za-z][\w.-]*)?):(?P<addr>[^\s<]+)<(?P<port>\d+)>"
        # NCCL >= 2.5 lists every interface it took on the one line: "NET/Socket : Using
        # [0]eno1:172.18.40.41<0> [1]veth25f2e72:fe80::380d:bfff:fe5b:54d2%veth25f2e72<0>"
        r"(?P<more>(?: \[\d+\][^:\s]+:[^\s<]+<\d+>)+)?",
    ),
    # NCCL §3.1 / §3.3: rank-to-rank connections refused, timed out, wrong magic, proxy calls.
    _p(
        "nccl_connect_failure",
        ("exceeded retries", "exceeded error retry count", "exceeded timeouts", "failed : ",
         "wrong magic", "wrong type", "Proxy Call to rank", "Failed to execute operation",
         "PollConnect: Connect to ", "after sleep for", ", retrying (",
         "Call to connect timeout", "NET/OFI Unable to insert remote address",
         "Call to connect failed : ", "progressing operation=Connect"),
        r"(?:(?P<fn>\w+): (?:connect (?:to (?P<addr>\S+) )?returned (?P<err>.+?), "
        r"(?:exceeded error retry count|retrying \((?P<try>\d+)/(?P=try)\))"
        r"|exceeded (?:retries|timeouts) \((?P<n>\d+)\))"
        # 2.20-2.23, poll path: "socketPollConnect: Connect to 10.0.0.2<43211> returned
        # 113(No route to host) errno 115(Operation now in progress)"
        r"|(?P<fn3>\w+PollConnect): Connect to (?P<addr3>\S+) returned (?P<code>\d+)"
        r"\((?P<err3>[^)]*)\)"
        r"|(?:(?P<fn2>socket\w*Connect|ncclOsSocket\w*Connect): |Net : )?[Cc]onnect to "
        r"(?P<addr2>\S+) failed : (?P<err2>.+)"
        r"|socketFinalizeAccept(?: from \S+)?: wrong (?P<what>magic|type)"
        # the service's number is its own process's rank (proxyState->tpRank)
        r"|Proxy Call to rank (?P<prank>\d+) failed"
        r"|\[Proxy Service (?P<svc>\d+)\] Failed to execute operation (?P<op>\w+) from rank "
        r"(?P<frank>\d+)"
        # 2.17+ (proxy.cc): "[Service thread] Error encountered progressing operation=Connect,
        # res=3, closing connection" (a peer's proxy connection; also torch's "Last error:")
        r"|\[Service thread\] Error encountered progressing operation=(?P<op2>Connect), "
        r"res=(?P<res>\d+)"
        # 2.3 (include/socket.h): "Call to connect timeout : Connection refused"
        r"|Call to connect timeout : (?P<err4>.+)"
        # 2.2 (include/socket.h connectAddress): "Call to connect failed : Connection timed out"
        r"|Call to connect failed : (?P<err5>.+)"
        # the AWS OFI net plugin could not add a peer's endpoint (EFA: its security group):
        # "NET/OFI Unable to insert remote address into address vector for device 1. RC: 0"
        r"|NET/OFI (?P<ofi>Unable to insert remote address into address vector)[^.]*)",
        alias={"fn3": "fn", "addr3": "addr", "err3": "err"},
        code=int,
        res=int,
    ),
    # One connect attempt of many (INFO): transient unless the log ends there. The last attempt
    # ("retrying (34/34)") is nccl_connect_failure above. 2.4-2.15: "Call to connect returned
    # Connection refused, retrying"; 2.24+: "socketPollConnect: connect [to 10.0.0.2<43211>]
    # returned No route to host, retrying (3/34) after sleep for 300 msec".
    _p(
        "nccl_connect_retry",
        ("Call to connect returned", ", retrying ("),
        r"(?:Call to connect returned (?P<err>.+?), retrying"
        r"|(?P<fn>\w+): connect (?:to (?P<addr>\S+) )?returned (?P<err2>.+?), retrying "
        r"\((?P<try>\d+)/(?!(?P=try)\))(?P<max>\d+)\))",
        max=int,
    ),
    # Backend and tensor device disagree: NCCL with CPU tensors, Gloo with CUDA ones; or the
    # backend lacks the collective (c10d Backend.hpp's default body of each collective: "Backend
    # gloo does not support alltoall"; ProcessGroup.hpp before 2.0: "ProcessGroup gloo does not
    # support ..."; not "does not support monitoredBarrier", which says which backend does)
    _p(
        "backend_device_mismatch",
        ("No backend type associated with device type", "Tensors must be CUDA",
         "unsupported device type", "doesn't have NCCL built in", "Tensors must be CPU",
         "ProcessGroupNCCL is only supported with GPUs", "but NCCL support is not compiled",
         "not supported for the selected backend", "doesn't have CUDA-aware MPI support",
         "does not support ", "But we don't know which communication backend"),
        r"(?:No backend type associated with device type (?P<device>\w+)"
        # distributed_c10d.BackendConfig (torch 2.3+), init_process_group without a backend on
        # an accelerator torch has none for: "We detected accelerator mps on your machine. But
        # we don't know which communication backend to use for this accelerator. ..."
        r"|We detected accelerator (?P<device3>\w+) on your machine\. But we don't know which "
        r"communication backend"
        r"|(?:Backend|ProcessGroup) (?P<backend2>\w+) does not support (?P<op2>_?(?:all_?reduce"
        r"|all_?gather|all_?to_?all|reduce_scatter|broadcast|reduce|gather|scatter|send|recv"
        r"|barrier)\w*)\.?\s*$"
        # ProcessGroupMPI given a CUDA tensor (ProcessGroupMPI.cpp checkSingleTensor): "CUDA
        # tensor detected and the MPI used doesn't have CUDA-aware MPI support"
        r"|CUDA tensor detected and the MPI used doesn't have CUDA-aware MPI support"
        r"|Tensors must be (?P<need>CUDA|CPU) and dense"
        r"|(?P<pg>ProcessGroup\w+)::(?P<op>\w+): unsupported device type (?P<device2>\w+)"
        r"|Distributed package doesn't have NCCL built in"
        # torch 2.1+ (distributed_c10d._get_default_timeout), before that RuntimeError
        r"|Attempted to get default timeout for nccl backend, but NCCL support is not compiled"
        r"|ProcessGroupNCCL is only supported with GPUs, no GPUs found"
        # distributed_c10d.barrier() given NCCL's device_ids under another backend (torch 1.x:
        # "Function argument device_ids not supported for the selected backend gloo")
        r"|Function argument (?P<arg>\w+) not supported for the selected backend (?P<backend>\w+))",
    ),
    # NCCL §3.3 / Gloo: no usable socket interface (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME).
    _p(
        "no_socket_interface",
        ("no socket interface found", "no interface found", "No usable listening interface",
         "nor AF_INET6", "Unable to find address for", "Address family not supported",
         "interface or hostname can't be empty", "Unable to find interface for"),
        r"(?:Bootstrap ?: no socket interface found|NET/Socket : no interface found"
        # Gloo's device factory given neither (c10d/GlooDeviceFactory.cpp): "GlooDeviceFactory::
        # makeUVDevice(): interface or hostname can't be empty" (makeTCPDevice alike)
        r"|make(?:UV|TCP)Device\(\): interface or hostname can't be empty"
        r"|No usable listening interface found|neither AF_INET\(\d+\) nor AF_INET6\(\d+\)"
        # socket() refused the family of the interface NCCL picked (IPv6 disabled on the host)
        r"|Socket creation failed : Address family not supported by protocol"
        r"|Unable to find address for: (?P<ifname>\S+)"
        # Gloo with no GLOO_SOCKET_IFNAME: no interface holds the address the host name
        # resolved to (gloo/transport/tcp/device.cc: "ifa != nullptr. Unable to find interface
        # for: [0.0.8.34]")
        r"|Unable to find interface for: \[?(?P<addr>[^\]\s]+)\]?)",
    ),
    # NCCL_COMM_ID given, and no interface of this host in that address's subnet
    # (misc/socket.cc ncclFindInterfaceMatchSubnet, 2.4-2.26 WARN; "No usable listening
    # interface found" follows): the root is on a network this host is not on (a container's
    # bridge network, a wrong NCCL_COMM_ID)
    _p(
        "nccl_subnet_mismatch",
        "No interface found in the same subnet",
        r"No interface found in the same subnet as remote address (?P<addr>[^\s<]+)",
    ),
    # the LLaMA reference loader's own check (facebookresearch/llama generation.py Llama.build,
    # LLaMA 1's example.py load(); copied into codellama, llama3 and their forks): "Loading a
    # checkpoint for MP=2 but world size is 1" (MP=0: no checkpoint found at all)
    _p(
        "checkpoint_world_mismatch",
        "Loading a checkpoint for MP=",
        r"Loading a checkpoint for MP=(?P<mp>\d+) but world size is (?P<ws>\d+|None)",
        mp=int,
    ),
    # a channel NCCL connected over the network (transport/net.cc, INIT|NET): "Channel 00/0 :
    # 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA" (2.x), "Ring 00 : 1[18100000] -> 0[435e00000]
    # [receive] via NET/IB/0" (<= 2.6): its peer is on another host
    _p(
        "nccl_net_channel",
        "via NET/",
        r"(?:Channel|Ring) \d+(?:/\d+)? : (?P<src>\d+)\[[0-9a-fx]+\] -> (?P<dst>\d+)\[[0-9a-fx]+\] "
        r"(?:\[(?:send|receive)\] )?via NET/(?P<net>[^/\s]+)(?:/(?P<dev>\d+))?",
        src=int,
        dst=int,
        dev=int,
    ),
    # a framework's own check that the launched world fits its parallel layout: Megatron-Core's
    # initialize_model_parallel (parallel_state.py: "world_size (8) is not divisible by
    # tensor_model_parallel_size (4) x pipeline_model_parallel_size (4)", "... by 2", "... by
    # expert_tensor_model_pipeline_parallel size (16)"; NeMo, verl, slime, ms-swift...),
    # TensorRT-LLM's WorldConfig::mpi ("Assertion failed: mpiSize == tp * pp"), vLLM's Ray
    # executor ("The number of required GPUs exceeds the total number of available GPUs in the
    # placement group."), vLLM's "please set tensor_parallel_size (8) to less than max local gpu
    # count (4)", verl's "Total available GPUs 8.0 is less than total desired GPUs 16"
    _p(
        "parallel_layout_mismatch",
        ("is not divisible by", "mpiSize == tp", "required GPUs exceeds the total number",
         "to less than max local gpu count", "is less than total desired GPUs"),
        r"(?:decoder )?world_size \((?P<world>\d+)\) is not divisible by (?P<layout>.+)"
        r"|Assertion failed: (?P<layout2>mpiSize == tp \* pp(?: \* cp)?)"
        r"|The number of required GPUs exceeds the total number of available GPUs in the "
        r"(?:placement group|cluster)"
        r"|please set tensor_parallel_size \((?P<tp>\d+)\) to less than max local gpu count "
        r"\((?P<gpus>\d+)\)"
        r"|Total available GPUs (?P<gpus2>[\d.]+) is less than total desired GPUs (?P<want>\d+)",
        world=int,
    ),
    # ProcessGroupNCCL's destructor at interpreter exit (torch 2.4+): "WARNING:
    # destroy_process_group() was not called before program exit, which can leak resources."
    # Healthy jobs print it; a watchdog that reports itself stuck after it is the teardown's.
    _p(
        "pg_not_destroyed",
        ("destroy_process_group() was not called before program exit",
         "has NOT been destroyed before we destruct ProcessGroupNCCL"),
        # (2.4: "process group has NOT been destroyed before we destruct ProcessGroupNCCL")
        r"destroy_process_group\(\) was not called before program exit"
        r"|process group has NOT been destroyed before we destruct ProcessGroupNCCL",
    ),
    _p(
        "socket_ifname",
        ("SOCKET_IFNAME set",),
        r"(?P<var>NCCL_SOCKET_IFNAME|GLOO_SOCKET_IFNAME) set (?:by environment )?to (?P<value>\S+)",
    ),
    # Lightning's device report per process: "LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES: [0,1]"
    _p(
        "visible_devices",
        "CUDA_VISIBLE_DEVICES: [",
        r"LOCAL_RANK: (?P<local_rank>\d+) - CUDA_VISIBLE_DEVICES: \[(?P<devices>[^\]]*)\]",
        local_rank=int,
    ),
    # How many nodes the launch asked for, from a pasted command line or torchelastic's launch
    # configuration: "--nnodes=2", "--nnodes 1:4", "--nnode=2" (argparse takes the prefix),
    # "--node_rank=1", and the agent's "min_nodes : 2".
    # The agent's rendezvous result (agent/server/api.py): "  group_rank=1", "  group_world_size=2"
    # on lines of their own under "Rendezvous complete for workers. Result:".
    _p(
        "launch_nodes",
        ("--nnode", "--node_rank", "--node-rank", "min_nodes", "group_rank=",
         "group_world_size="),
        r"--nnodes?[= ](?P<n>\d+)(?::(?P<max>\d+))?|--node[_-]rank[= ](?P<node_rank>\d+)"
        r"|\bmin_nodes\s*:\s*(?P<n2>\d+)"
        r"|^\s*group_rank=(?P<node_rank2>\d+)\s*$|^\s*group_world_size=(?P<n3>\d+)\s*$",
        n=int,
        max=int,
        node_rank=int,
    ),
    # Intel oneCCL's own error lines (the torch-ccl / XPU "ccl" and "xccl" backends): its
    # logger writes "2024:01:15-03:36:29:(1980058) |CCL_ERROR| global.cpp:150
    # getenv_local_coord: condition ... failed" (|CCL_WARN| for warnings, not read)
    _p(
        "ccl_error",
        "|CCL_ERROR|",
        r"\|CCL_ERROR\|\s*(?:(?P<src>[\w./-]+:\d+)\s+)?(?P<msg>\S.*)$",
    ),
    # torchelastic's agent when its workers all finished (agent/server/api.py _invoke_run):
    # "[default] worker group successfully finished. Waiting 300 seconds for other agents to
    # finish." (torch 1.10+), "Local worker group finished (WorkerState.SUCCEEDED). Waiting 300
    # seconds for other agents to finish" (torch 1.9-2.x)
    _p(
        "worker_group_succeeded",
        ("worker group successfully finished", "worker group finished (WorkerState.SUCCEEDED)"),
        r"worker group (?:successfully finished|finished \(WorkerState\.SUCCEEDED\))",
    ),
    # SGLang's ModelRunner.load_model after its barrier of the tensor-parallel group timed out
    # (dist_barrier_after_load), on the ranks that finished: "TP rank 1 could finish the model
    # loading, but there are other ranks that didn't finish loading. It is likely due to ..."
    _p(
        "load_barrier_unfinished",
        "could finish the model loading, but there are other ranks",
        r"TP rank (?P<tp_rank>\d+) could finish the model loading, but there are other ranks",
        tp_rank=int,
    ),
    # SGLang's scheduler watchdog (managers/scheduler.py watchdog_thread; since 2025 its
    # Watchdog class, utils/watchdog.py): no forward batch completed for watchdog_timeout
    # seconds. "Watchdog timeout (self.watchdog_timeout=300)", "Scheduler watchdog timeout
    # (self.watchdog_timeout=300.0, self.soft=False)"; soft=True only warns, the process goes on.
    _p(
        "serving_watchdog",
        ("atchdog timeout (self.watchdog_timeout=",),
        r"(?:(?P<who>\w+) )?[Ww]atchdog timeout \(self\.watchdog_timeout=(?P<secs>[\d.]+)"
        r"(?:, self\.soft=(?P<soft>True|False))?",
    ),
    # torchelastic's launch_agent (launcher/api.py) when the launch gave an empty rendezvous id
    # ("--rdzv_id=$SLURM_JOB_ID" with the variable unset): "config has no run_id, generated a
    # random run_id: 174580650467654300307713793029077439978", each node its own
    _p(
        "random_run_id",
        "generated a random run_id",
        r"config has no run_id, generated a random run_id: (?P<run_id>\S+)",
    ),
    # NCCL §3.5
    _p(
        "duplicate_gpu",
        ("Duplicate GPU detected", "using the same GPU", "sharing GPU", "both on CUDA device"),
        # (the message's second half alone names the ranks too, as pastes keep it)
        r"(?:(?:Duplicate GPU detected : )?rank (?P<r1>\d+) and rank (?P<r2>\d+) both on CUDA "
        r"device(?: (?P<busid>[0-9a-fA-F]+))?"
        r"|Multiple [Rr]anks (?:detected using|are using) the same GPU"
        r"|Detected ranks (?P<r3>\d+) and (?P<r4>\d+) sharing GPU with bus (?P<bus2>[0-9a-fA-F]+))",
        alias={"r3": "r1", "r4": "r2", "bus2": "busid"},
        r1=int,
        r2=int,
        r3=int,
        r4=int,
    ),
    # NCCL §3.6 and the DataLoader's shared-memory errors.
    _p(
        "shm_error",
        ("shared memory segment", "failed to extend", "Could not map", "shared memory file",
         "insufficient shared memory", "unable to allocate shared memory", "/dev/shm",
         "posix_fallocate failed", "memory available in /dev/shm", "unlink shared memory"),
        # (Ray's plasma store, store_runner.cc: "System memory request exceeds memory available
        # in /dev/shm. The request is for N bytes, and the amount available is M bytes.")
        r"(?:System memory request exceeds memory available in /dev/shm"
        r"|Error: failed to extend (?P<path>\S+) to (?P<bytes>\d+) bytes(?:, error: (?P<err>.+?) "
        r"\((?P<errno>\d+)\))?"
        # (a line cut inside its size still names the segment: "(size 734038")
        r"|Error while (?P<op>[\w ]+?) shared memory segment (?P<path2>\S+) "
        r"\(size (?P<size>\d+)(?:\)(?:, error: (?P<err2>.+?) \((?P<errno2>\d+)\))?|$(?P<cut>))"
        r"|(?:Error: )?Could not map (?P<path3>\S+)|failed to create shared memory file"
        r"|insufficient shared memory|[Uu]nable to allocate shared memory"
        r"|unable to (?:write to|open shared memory object) .*?/dev/shm.*"
        r"|Call to posix_fallocate failed : (?P<err3>.+)"
        # the segment gone before NCCL unlinked it (misc/shmutils.cc): "unlink shared memory
        # /dev/shm/nccl-d5rTd0 failed, error: No such file or directory" (something else
        # removed it: systemd-logind's RemoveIPC at the user's logout, a cleanup job)
        r"|unlink shared memory (?P<path4>\S+) failed, error: (?P<err4>.+))",
        errno=int,
        errno2=int,
    ),
    # NCCL §3.2 / §3.8: the network failed under a running job.
    _p(
        "network_error",
        ("Call to recv from", "Call to send to", "Call to recv failed", "Call to send failed",
         "Call to write failed", "Call to read failed", "Got completion", "async fatal event",
         "Got async event", "Socket recv failed", "got completion with error", "Call to ibv_",
         "completed with error. RC: ", "Got async error event", "retry counter exceeded"),
        r"(?:Call to (?:recv from|send to) (?P<peer>\S+) failed : (?P<err>.+)"
        # (NCCL <= 2.5's include/socket.h also says "write" and "read")
        r"|Call to (?:recv|send|write|read) failed : (?P<err2>.+)"
        r"|Got completion (?:from peer (?P<peer2>\S+) )?with (?:error (?P<status>\d+)"
        r"|status=(?:(?P<stname>\w+)\()?(?P<status2>\d+))"
        r"|async (?:fatal )?event(?: on \w+[^:]*)? ?: (?P<event>.+)"
        r"|Got async event : (?P<event2>.+)"
        # 2.19+ (transport/net_ib.cc): "NET/IB : mlx5_32:1 Got async error event: port error"
        r"|Got async error event: (?P<event3>.+)"
        r"|Socket recv failed"
        # NCCL's ibverbs wrapper (misc/ibvwrap.cc): "Call to ibv_reg_mr_iova2 failed with error
        # Invalid argument", "Call to ibv_modify_qp failed with 110 Connection timed out"
        r"|Call to (?P<verb>ibv_\w+) failed(?: with(?: error)? (?P<err3>.+))?"
        # (the same cut after the verb's name by a paste: NCCL prints it only when it failed)
        r"|NCCL WARN Call to (?P<verb2>ibv_\w+)\s*$"
        # rdma-core's mlx5 provider before its CQE dump: "mlx5: host1: got completion with error:"
        # (a file of such lines reads "mlx5: host1: " as host prefixes)
        r"|(?:mlx5: (?P<ibhost>[^:\s]+): )?got completion with error:?$"
        # the AWS OFI net plugin's completion error (EFA): "NET/OFI Request 0x7f14cc5b60c0
        # completed with error. RC: 113. Error: 2 (UNDELIVERABLE). Completed length: 0"
        r"|NET/OFI Request \S+ completed with error\. RC: (?P<rc>\d+)\. Error: \d+ "
        r"\((?P<err4>[^)]+)\)"
        # ibverbs' own words for a failed work completion (ibv_wc_status_str), as TensorPipe's
        # ibv transport and other RDMA users print them: "... transport retry counter exceeded
        # (this error originated at tensorpipe/transport/ibv/connection_impl.cc:478)"
        r"|(?P<err5>(?:transport|RNR) retry counter exceeded))",
        status=int,
        status2=int,
    ),
    # Open MPI's TCP transport (opal/mca/btl/tcp/btl_tcp_endpoint.c) failing to reach a peer at
    # the address that peer published: "[host][[38971,1],2][btl_tcp_endpoint.c:796:
    # mca_btl_tcp_endpoint_complete_connect] connect() to 172.17.0.1 failed: Connection refused
    # (111)"; and reaching another process than the one it dialled, which happens when every
    # host has an interface with the same address (docker0, virbr0): "... received unexpected
    # process identifier [[39817,1],3]" (btl tcp and the runtime's oob tcp), or, verbose, "btl:
    # tcp: Match incoming connection from [[27443,1],1] 44.128.0.4 with locally known IP
    # 2.2.2.77 failed (iface 0/4)!" (btl_tcp_proc.c).
    # UCX under Open MPI's pml ucx the same (src/ucs/sys/sock.c: "connect(fd=168,
    # dest_addr=169.254.4.6:52595) failed: Connection refused").
    _p(
        "mpi_tcp_failure",
        ("mca_btl_tcp_endpoint_complete_connect", "received unexpected process identifier",
         "Match incoming connection from", ", dest_addr="),
        r"(?:mca_btl_tcp_endpoint_complete_connect\] connect\(\) to (?P<addr>[^\s]+) failed: "
        r"(?P<err>.+?)(?: \(\d+\))?$"
        r"|UCX +ERROR +connect\(fd=\d+, dest_addr=(?P<addr2>[^\s\[\]]+?|\[[^\]]+\]):\d+\) "
        r"failed: (?P<err2>.+?)$"
        r"|(?P<wrong_peer>received unexpected process identifier)"
        r"|Match incoming connection from \S+ (?P<from>\S+) with locally known IP \S+ "
        r"(?P<wrong_peer2>failed))",
    ),
    # NCCL could not bind its listening socket (misc/socket.cc ncclSocketListen; include/socket.h
    # before 2.12): "Call to bind failed : Cannot assign requested address" (the address it
    # picked is not this host's to bind: a link-local address without its scope, another
    # host's address) or "... : Address already in use" (a fixed port, NCCL_COMM_ID).
    _p("nccl_bind_failed", "Call to bind failed", r"Call to bind failed : (?P<err>.+?)\.?$"),
    # NCCL's proxy service thread (proxy.cc, 2.12+) when a local peer's connection ends:
    # "[Service thread] Connection closed by localRank 7" (INFO, also at a normal destroy; its
    # WARN twin "Could not receive type from localRank 7" stays a generic nccl_warn).
    _p(
        "nccl_proxy_peer_closed",
        "Connection closed by localRank",
        r"\[Service thread\] Connection closed by localRank (?P<peer_local>\d+)",
        peer_local=int,
    ),
    # NCCL §3.2: sizes that disagree between ranks (a collective mismatch, NCCL_PROTO/ALGO or
    # version differences): "NET/Socket : peer 10.0.0.2<4125> message truncated : receiving
    # 1048576 bytes instead of 65536."
    _p(
        "nccl_message_truncated",
        ("message truncated", "posted incorrect receive info", "collective mismatch error",
         "Message truncated : received"),
        r"(?:(?:peer (?P<peer>\S+) )?message truncated : receiving (?P<got>\d+) bytes instead of "
        r"(?P<want>\d+)|peer (?P<peer2>\S+) posted incorrect receive info: size (?P<size>\d+)"
        # NET/IB (2.3-2.19): "... collective mismatch error, local size 1048576 remote size 524288"
        r"|(?:peer (?P<peer3>\S+) )?collective mismatch error,? local size (?P<want2>\d+),? remote "
        r"(?:size )?(?P<got2>\d+)"
        # bootstrap (all versions): "Message truncated : received 4096 bytes instead of 2048"
        r"|(?P<bootstrap>Message truncated) : received (?P<got3>\d+)(?:,\d+)? bytes instead of "
        r"(?P<want3>\d+))",
        got=int,
        want=int,
        size=int,
        got2=int,
        want2=int,
        got3=int,
        want3=int,
    ),
    # NCCL 2.4-2.7's own hang hint: "Your program may be hanging, this may be caused by a
    # collective mismatch around rank 3. Please check your collective calls at and around ..."
    _p(
        "nccl_collective_mismatch",
        ("may be caused by a collective mismatch around rank", "Mismatched collective detected"),
        r"may be caused by a collective mismatch around rank (?P<around>\d+)"
        # NCCL 2.4-2.6's own check: "Mismatched collective detected, please check your collective
        # calls at and around rank 39."
        r"|Mismatched collective detected, please check your collective calls at and around rank "
        r"(?P<around2>\d+)",
        around=int,
    ),
    # DeepSpeed ZeRO-3's check that every rank fetched the same sub-modules' parameters in the
    # same order (runtime/utils.py assert_ints_same_as_other_ranks, from the partitioned-param
    # coordinator's trace): "disagreement between rank0 and rank6: rank0: [ids...], rank6: [...]".
    # Different traces mean different parameter all-gathers: the ranks ran different code.
    # TORCH_DISTRIBUTED_DEBUG=DETAIL's shape check (ProcessGroupWrapper.cpp): "Error when
    # verifying shape tensors for collective ALLREDUCE on rank 0. This likely indicates that
    # input shapes into the collective are mismatched across ranks. Got shapes:  10" (the rank
    # is the reporting one, the shapes its own); accelerate's debug-mode check
    # (utils/operations.py verify_operation): "Cannot apply desired operation due to shape
    # mismatches. All shapes across devices must be valid." (the per-process shapes follow)
    _p(
        "collective_shape_mismatch",
        ("Error when verifying shape tensors for collective",
         "Cannot apply desired operation due to shape mismatches"),
        r"Error when verifying shape tensors for collective (?P<op>\w+) on rank (?P<by>\d+)"
        r"(?:.*?Got shapes:\s*(?P<shape>[^\[]+?)\s*(?:\[|$))?"
        r"|Cannot apply desired operation due to shape mismatches",
        by=int,
    ),
    _p(
        "zero3_trace_mismatch",
        "disagreement between rank0 and rank",
        r"disagreement between rank0 and rank(?P<other>\d+)",
        other=int,
    ),
    # NCCL's error return chain (NCCLCHECK: INFO "%s:%d -> %d"): "NCCL INFO misc/socket.cc:567
    # -> 2", "bootstrap.cc:270 -> 2" — a call failed with that ncclResult_t (1 unhandled CUDA
    # error, 2 system error, 3 internal error, 4 invalid argument, 5 invalid usage, 6 remote
    # error; 7, in progress, is no failure). Often all a log holds when NCCL's WARN went elsewhere.
    _p(
        "nccl_error_trace",
        (".cc:", ".cu:"),
        # (NCCL 2.27+ adds the failing call after the code, "-> 6 socketWait(...)"; some
        # lines end in the thread's name, "-> 2 [Async thread]")
        r"NCCL INFO (?P<file>[\w/.-]+\.(?:cc|cu)):(?P<line>\d+) -> (?P<code>[1-6])(?:\s+\S.*)?\s*$",
        code=int,
    ),
    # NCCL init: "Invalid rank requested : 2/2" (a rank not below the communicator's size: the
    # RANK / WORLD_SIZE handed to the job disagree)
    _p(
        "nccl_invalid_rank",
        "Invalid rank requested",
        r"Invalid rank requested : (?P<asked>-?\d+)/(?P<nranks>\d+)",
        asked=int,
        nranks=int,
    ),
    # NCCL §3.3: ranks disagree about the communicator at bootstrap (world size, roots): every
    # rank then hangs in init. "Bootstrap Root : mismatch in rank count from procs 4 : 8".
    _p(
        "nccl_bootstrap_mismatch",
        ("Bootstrap Root : mismatch", "has already checked in"),
        r"Bootstrap Root : (?:mismatch in rank count from procs (?P<a>\d+) : (?P<b>\d+)"
        r"|mismatch in info from procs, nranks (?P<n1>\d+) vs (?P<n2>\d+)"
        r"|rank (?P<rank>\d+) of (?P<of>\d+) ranks has already checked in)",
        a=int,
        b=int,
        n1=int,
        n2=int,
        rank=int,
        of=int,
    ),
    # NCCL §3.7: "Cuda failure 700 'an illegal memory access was encountered'".
    _p(
        "cuda_failure",
        ("Cuda failure ", "Cuda error ", "CUDA IPC handle", "CUDA error: ", "], thread: [",
         "THCudaCheck FAIL"),
        # (nccl-tests' older CUDACHECK put its file:line first: "Cuda failure common.cu:891 '...'";
        # vLLM's custom all-reduce's CUDACHECK: "Failed: Cuda error csrc/custom_all_reduce.cuh:143
        # 'invalid resource handle'")
        r"(?:Cuda (?:failure|error) (?:(?P<code>\d+) |[\w./-]+:\d+ )?'(?P<err>[^']*)'"
        # torch <= 1.10's THC check (THCGeneral.cpp __THCudaCheck): "THCudaCheck FAIL
        # file=.../Module.cpp line=59 error=101 : invalid device ordinal"
        r"|THCudaCheck FAIL file=\S+ line=\d+ error=(?P<code3>\d+) : (?P<err5>.+)"
        # torch's C10_CUDA_CHECK: "CUDA error: an illegal memory access was encountered"
        r"|CUDA error: (?P<err3>[^.\n]+)"
        # P2P transport (2.3-2.7): "failed to open CUDA IPC handle : 217 peer access is not
        # supported between these two devices", "rank 1 failed to get CUDA IPC handle to ..."
        r"|failed to (?:open|get) CUDA IPC handle(?: to device \S+)? : (?P<code2>\d+) "
        r"(?P<err2>.+)"
        # a device-side assert in a kernel (CUDA's own printf, every ATen/extension assert):
        # ".../TensorCompare.cu:112: _assert_async_cuda_kernel: block: [0,0,0], thread: [0,0,0]
        # Assertion `probability tensor contains ...` failed." (the Python error comes later)
        r"|(?P<kernel>\S+\.cuh?):\d+: \S+: block: \[\d+,\d+,\d+\], thread: \[\d+,\d+,\d+\] "
        r"(?P<err4>Assertion .+ failed)\.)",
        code=int,
        code2=int,
        code3=int,
    ),
    _p(
        "nccl_error",
        ("NCCL error", "Test NCCL failure", "Test CUDA failure", "NcclError: NCCL_ERROR_",
         "HCCL error in: ", "HCCL function error: ", "Failed, NCCL error"),
        # torch before 1.6 printed no version: "NCCL error in: .../ProcessGroupNCCL.cpp:272,
        # unhandled system error"
        # (torch 1.7-1.8 wrote "NCCL error in ../torch/lib/c10d/ProcessGroupNCCL.cpp:825, ...",
        # no colon)
        r"NCCL error(?: in:? (?P<file>\S+):(?P<line>\d+),|:) (?P<estr>.+?), "
        r"NCCL version (?P<version>[\w.]+)"
        r"|NCCL error in:? (?P<file2>\S+):(?P<line2>\d+), (?P<estr2>[^,]+?)\s*$"
        # nccl-tests (src/common.h NCCLCHECK / CUDACHECK): "host: Test NCCL failure
        # common.cu:1005 'unhandled cuda error (run with NCCL_DEBUG=INFO for details) / '",
        # older releases without " / <last error>"
        r"|Test (?:NCCL|CUDA) failure (?P<file3>[\w./-]+):(?P<line3>\d+) "
        r"'(?P<estr3>[^'/]*?)\s*(?:/ (?P<last>[^']*))?'"
        # cupy's NCCL binding (cupy_backends/cuda/libs/nccl.pyx check_status, vLLM's older
        # paths): "NcclError: NCCL_ERROR_SYSTEM_ERROR: unhandled system error (run with ...)"
        r"|NcclError: NCCL_ERROR_\w+: (?P<estr4>.+?)(?: \(run with NCCL_DEBUG.*)?$"
        # torch_npu's ProcessGroupHCCL, the same role: "[ERROR] HCCL error in: torch_npu/csrc/
        # distributed/ProcessGroupHCCL.cpp:64", "HCCL function error: HcclGetRootInfo(&hcclID),
        # error code is 11" (CANN's E[A-Z]nnnn line after it says why)
        # the NCCLCHECK macro of NCCL's examples and of TransformerEngine's userbuffers:
        # "Failed, NCCL error .../userbuffers-host.cpp:223 'unhandled system error'"
        r"|Failed, NCCL error (?P<file5>\S+):(?P<line5>\d+) '(?P<estr6>[^']*)'"
        r"|HCCL error in: (?P<file4>\S+):(?P<line4>\d+)"
        r"|HCCL function error: (?P<estr5>\w+)\(.*?error code is \d+",
    ),
)

#: Kinds that only add context: a line they match is still an unread NCCL WARN.
_CONTEXT_KINDS = frozenset({"rank_local_work", "init_file_url", "run_start",
                            "rank_data_count"})


@dataclass(frozen=True)
class Fallback(Pattern):
    """Matches only where none of ``known`` does: one line is never two events."""

    known: tuple[Pattern, ...] = ()

    def match(self, body: str) -> dict[str, Any] | None:
        for p in self.known:
            if any(n in body for n in p.needles) and p.regex.search(body):
                return None
        return super().match(body)


#: NCCL WARNs that say NCCL degrades and goes on (an optional feature or library is missing, a
#: setting is ignored): printed by healthy jobs, so never a failure by themselves.
NCCL_ADVISORY = (r"falling back|as fallback|[Ii]gnoring|[Ss]kipping|disabling|is disabled|instead$"
                 r"|Could not find real path|Failed to open libibverbs|not supported on this system"
                 r"|not supported prior to CUDA")

# Any other NCCL WARN (NCCL has ~1000 WARN formats across 2.3-2.30: docs/messages.md): a failure
# NCCL reported that no specific pattern reads.
# (NCCL 2.2 wrote "include/socket.h:360 WARN ..." without "NCCL"; the AWS OFI plugin's own
# logger up to 0.9, "WARN: Function: create_nccl_ofi_component Line: 459: NET/OFI ...")
PATTERNS = (*PATTERNS, Fallback(
    "nccl_warn", ("NCCL WARN ", " WARN ", "WARN: Function: "),
    rf"(?:NCCL WARN |\] [\w/.-]+\.(?:h|cc|cu|c):\d+ WARN |^WARN: Function: \w+ Line: \d+: "
    rf"(?=NET/OFI ))(?!.*(?:{NCCL_ADVISORY}))(?P<msg>\S.*)",
    known=tuple(p for p in PATTERNS if p.kind not in _CONTEXT_KINDS)))

#: Literal needles of every pattern, for the vectorised pre-filter.
NEEDLES: tuple[str, ...] = tuple(sorted({n for p in PATTERNS for n in p.needles}))

# A Python exception line ending a traceback: "torch.OutOfMemoryError: CUDA out of memory..."
EXCEPTION_LINE = re.compile(
    # (Python's bare ``raise Exception(...)`` too: "Exception: ...", never a bare "Error:")
    # (glued to prose in another script the user wrote before pasting it, or after its colon:
    # "报错如下FileNotFoundError: ...", "错误：ValueError: ..."; not after a space, where prose
    # names a metric: "验证集 MeanAbsoluteError: 0.12"; the names are ASCII, so each try is short)
    # (after a path or a file name and a colon, a shell's "ptuning/train.sh: ", when the type is
    # a module path: "torch.distributed.elastic.multiprocessing.api.SignalException: ...")
    r"^\s*(?:.*?[^\x00-\x7F](?:[：:]\s*)?|[\w.-]*[/.][\w./-]*:\s+(?=(?:[A-Za-z_]\w*\.){2}))?"
    r"(?P<type>(?:[A-Za-z_][A-Za-z0-9_]*\.)*(?:[A-Za-z_][A-Za-z0-9_]*"
    r"(?:Error|Exception|Interrupt|Exit|Failure)|Exception))"
    r"(?::\s?(?P<msg>.*))?$"
)
EXCEPTION_NEEDLES: tuple[str, ...] = ("Error", "Exception", "Interrupt", "Exit", "Failure")

# torchelastic ChildFailedError summary (M20): key lines of each failure entry.
ELASTIC_ROOT = re.compile(r"^\s*Root Cause \(first observed failure\):")
ELASTIC_FAILURES = re.compile(r"^\s*Failures:")
ELASTIC_ENTRY = re.compile(r"^\s*\[(?P<idx>\d+)\]:\s*$")
ELASTIC_FIELD = re.compile(
    r"^\s*(?P<key>time|host|rank|exitcode|error_file|traceback)\s*: (?P<value>.*)$"
)
#: Regex alternatives added to the pre-filter (an entry header such as "[0]:").
EXTRA_FILTERS: tuple[str, ...] = (r"\[\d+\]:\s*$",)
ELASTIC_NEEDLES: tuple[str, ...] = (
    "Root Cause (first observed failure)",
    "Failures:",
    "time      :",
    "host      :",
    "rank      :",
    "exitcode  :",
    "error_file:",
    "traceback :",
    "FAILED",
    # an entry's rank field pasted without the summary's headers ("  rank : 0 (local_rank: 0)")
    "(local_rank: ",
)

# --- what each event kind means ------------------------------------------------------------
# The one definition every layer uses (the restart policy, the collective report, the crash
# set, the per-rank state, the reports): a kind carries tags, and code asks for a tag.
#
# failure     something failed: a later clean restart in the same file makes it history
# crash       a process died or raised (its own failure, or a consequence of another's)
# hang        collectives were failing to complete (the job was stuck, not just dumped mid-run)
# lost_peer   the rank failed waiting for, or talking to, the others
# mismatch    a collective-level disagreement between ranks
# terminated  the job or its launcher was stopped from outside (a signal, the scheduler)
# start       a run (re)started
# info        context only: never a failure by itself
TAGS: dict[str, frozenset[str]] = {kind: frozenset(tags) for kind, tags in {
    "port_in_use": {"failure"},
    "unresolved_host": {"failure"},
    "run_start": {"start", "info"},
    "connect_timeout": {"failure", "lost_peer"},
    "connect_failed": {"failure"},
    "connect_retry": {"info"},
    "rdzv_connection_error": {"failure"},
    "store_clients_timeout": {"failure"},
    "store_wait_timeout": {"failure", "lost_peer"},
    "watchdog_timeout": {"failure", "hang", "lost_peer"},
    "watchdog_summary": {"failure", "hang"},
    "watchdog_abort": {"failure"},
    "watchdog_hang": {"failure"},
    "gloo_timeout": {"failure", "hang", "lost_peer"},
    "desync_not_joined": {"failure", "hang"},
    "desync_never_joined": {"failure", "hang"},
    "desync_not_finished": {"failure"},
    "desync_timeout_at": {"failure"},
    "monitored_barrier_failed": {"failure", "hang", "lost_peer"},
    "horovod_stall": {"failure", "hang"},
    "horovod_stalled_tensor": {"failure"},
    "horovod_missing_rank": {"info"},  # read only after a stall header (COLL015)
    "monitored_barrier_timeout": {"failure"},
    "monitored_barrier_peer_error": {"failure"},
    "autograd_anomaly": {"failure", "crash"},
    "collective_fingerprint_mismatch": {"failure", "mismatch"},
    "nccl_error": {"failure", "lost_peer"},
    "peer_closed": {"failure", "lost_peer"},
    "exception": {"failure", "crash"},
    "elastic_failure": {"failure", "crash"},
    "worker_failed": {"failure", "crash"},
    "native_signal": {"failure", "crash"},
    "srun_task_failed": {"failure"},
    "worker_signal": {"failure"},
    "spawn_failed": {"failure", "crash"},
    "oom": {"failure", "crash"},
    "agent_signal": {"failure", "terminated"},
    "external_signal": {"failure", "terminated"},
    "closing_signal": {"info"},
    "rank_local_work": {"info"},
    "rank_data_count": {"info"},
    "distributed_save": {"info"},
    "rank_collective_shape": {"info"},
    "unused_parameters": {"failure"},
    "inputs_exhausted": {"failure"},
    "backend_device_mismatch": {"failure"},
    "no_socket_interface": {"failure"},
    "nccl_subnet_mismatch": {"failure"},
    "socket_ifname": {"info"},
    "pg_not_destroyed": {"info"},
    "parallel_layout_mismatch": {"failure"},
    "cuda_driver_too_old": {"failure"},
    "nccl_net_channel": {"info"},
    "checkpoint_world_mismatch": {"failure"},
    "launch_nodes": {"info"},
    "random_run_id": {"info"},
    "ccl_error": {"failure"},
    "worker_group_succeeded": {"info"},
    "usage_error": {"failure", "crash"},
    "load_barrier_unfinished": {"failure"},
    "serving_watchdog": {"failure"},
    "visible_devices": {"info"},
    "nccl_interface": {"info"},
    "nccl_version": {"info"},
    "nccl_version_mismatch": {"failure"},
    "nccl_connect_failure": {"failure"},
    "gloo_connect_failure": {"failure"},
    "horovod_shut_down": {"failure"},
    "workers_out_of_sync": {"failure"},
    "gloo_family_mismatch": {"failure"},
    "engine_worker_died": {"failure"},
    "check_failed": {"failure"},
    "mpi_tcp_unreachable": {"failure"},
    "mpi_remote_host": {"info"},
    "k8s_last_state": {"info"},
    "printed_stack": {"info"},
    "nccl_bind_failed": {"failure"},
    "mpi_tcp_failure": {"failure"},
    "gloo_loopback_fallback": {"warning"},
    "duplicate_gpu": {"failure"},
    "shm_error": {"failure"},
    "ddp_ready_twice": {"failure"},
    "gpu_xid": {"failure"},
    "python_start_failed": {"failure", "crash"},
    "mpi_process_exit": {"failure", "crash"},
    "remote_command_failed": {"failure"},
    "ssh_failed": {"failure"},
    "gpus_requested_unavailable": {"failure"},
    "mpi_daemon_lost": {"failure", "crash"},
    "task_start_failed": {"failure"},
    "lightning_deadlock": {"info"},
    "fr_report": {"failure"},
    "dataloader_worker_signal": {"failure"},
    "network_error": {"failure"},
    "nccl_proxy_peer_closed": {"info"},
    "ray_worker_died": {"failure", "crash"},
    "ray_train_worker_failed": {"failure"},
    "thread_exception": {"info"},
    "cuda_arch_unsupported": {"failure"},
    "training_end": {"info"},
    "ray_version_mismatch": {"failure"},
    "nccl_build_incompatible": {"failure"},
    "nccl_net_choice": {"info"},
    "ras_op_counts": {"failure"},
    "nccl_message_truncated": {"failure"},
    "nccl_bootstrap_mismatch": {"failure"},
    "nccl_invalid_rank": {"failure"},
    "nccl_error_trace": {"failure"},
    "cuda_failure": {"failure"},
    "listen_failed": {"failure"},
    "store_barrier_wait": {"info"},
    "store_barrier_done": {"info"},
    "dump_signal": {"failure"},
    "watchdog_progress": {"info"},
    "gloo_size_mismatch": {"failure"},
    "worker_group_failed": {"failure"},
    "ddp_model_mismatch": {"failure"},
    "nccl_connect_retry": {"info"},
    "nccl_collective_mismatch": {"failure"},
    "zero3_trace_mismatch": {"failure"},
    "collective_shape_mismatch": {"failure"},
    "nccl_warn": {"failure"},
    "nccl_teardown": {"failure"},
    "cpp_terminate": {"failure"},
    "nccl_comm_aborted": {"failure", "lost_peer"},
    "last_line": {"info"},
    "init_file_url": {"info"},
    "traceback": {"info"},
    "traceback_fragment": {"failure"},
}.items()}


def kinds_tagged(tag: str) -> tuple[str, ...]:
    """Every event kind carrying ``tag``, sorted (for ``pl.col("kind").is_in``)."""
    return tuple(sorted(k for k, tags in TAGS.items() if tag in tags))


def catalog_hash() -> str:
    """A short hash of the message catalog (patterns, needles, aliases, tags): pre-parsed
    summaries made under another catalog are stale."""
    import hashlib

    h = hashlib.sha256()
    for p in PATTERNS:
        h.update(repr((p.kind, p.needles, p.regex.pattern, p.types, p.aliases)).encode())
    for pattern in (EXCEPTION_LINE, ELASTIC_ROOT, ELASTIC_FAILURES, ELASTIC_ENTRY, ELASTIC_FIELD):
        h.update(pattern.pattern.encode())
    h.update(repr(sorted((k, sorted(v)) for k, v in TAGS.items())).encode())
    return h.hexdigest()[:16]
