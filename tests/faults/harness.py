"""Nodes that are really separate: network namespaces on a private bridge, one torchrun each.

A :class:`Cluster` builds N "nodes" on this machine, each a network namespace
``ddpa<id>n<i>`` with one veth ``fab0`` (address ``10.213.<k>.<i+1>/24``) whose peer sits on a
bridge in a namespace of its own (``ddpa<id>sw``). Nothing is created in the root namespace
and the bridge has no uplink, so no packet can leave the machine. Each node has its own
``/etc/hosts`` and ``/etc/resolv.conf`` (``/etc/netns/<ns>/``, which ``ip netns exec``
bind-mounts over /etc) and runs under its own host name ``node-<i>`` (a UTS namespace).

One torchrun agent per node joins a real c10d rendezvous on node 0 (Gloo, ``GLOO_SOCKET_IFNAME``
the node's veth). Every process carries the runner's tag in its environment
(``DDP_AUTOPSY_SCENARIO_TAG``, as ``tests/scenarios/runner.py`` does), and agents run in
sessions of their own; teardown stops them the runner's way (SIGTERM, then SIGKILL to the
groups and to every tagged process), deletes the namespaces (their links go with them) and the
``/etc/netns`` files, and :func:`leftovers` says whether anything survived.

:func:`run_cell` runs one cell of the fault matrix (``tests/faults/train.py``) and judges the
verdict of ``ddp-autopsy analyze`` against :data:`EXPECTED`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

TESTS_DIR = Path(__file__).resolve().parent.parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

from scenarios.runner import SCRUBBED_ENV, TAG_ENV, _tagged_pids, stop_job  # noqa: E402

TRAIN = Path(__file__).resolve().parent / "train.py"
PREFIX = "ddpa"  # every namespace, link and /etc/netns entry the harness makes starts so
IFNAME = "fab0"
NETNS_ETC = Path("/etc/netns")
RDZV_PORT = 29400  # inside the namespaces: no other listener can exist there

# What "cause right" means (ddp_autopsy/rules/base.py CAUSES).
EXPECTED: dict[str, tuple[str, ...]] = {
    "exception": ("rank_crashed",),
    "exit": ("rank_crashed",),
    "sigkill": ("rank_crashed", "out_of_memory"),
    "sigsegv": ("rank_crashed",),
    "sigstop": ("rank_stuck_outside_collective",),
    "gil": ("rank_stuck_outside_collective",),
    "busy_loop": ("rank_stuck_outside_collective",),
    "dataloader_block": ("rank_stuck_outside_collective",),
    "lone_barrier": ("rank_stuck_outside_collective", "collective_mismatch"),
    "lone_barrier_detail": ("collective_mismatch",),
    "skip_collective": ("collective_mismatch",),
    "wrong_shape": ("collective_mismatch",),
    "straggler": ("straggler", "rank_stuck_outside_collective"),
    "link_drop": ("network_error_runtime", "nccl_connection_failure"),
    "port_blocked": ("port_in_use", "master_unreachable"),
    "unresolved_host": ("unresolved_host",),
    "world_size": ("config_mismatch", "missing_ranks"),
}
CRASH = ("exception", "exit", "sigkill", "sigsegv")
HANG = ("sigstop", "gil", "busy_loop", "dataloader_block", "lone_barrier", "lone_barrier_detail",
        "skip_collective", "wrong_shape", "straggler", "link_drop")
NODE_FAULTS = ("link_drop", "port_blocked", "unresolved_host", "world_size")
STARTUP = ("port_blocked", "unresolved_host", "world_size")
DETAIL = ("lone_barrier_detail", "skip_collective", "wrong_shape")  # TORCH_DISTRIBUTED_DEBUG
FROZEN = ("sigstop", "gil")  # must never be called crashed
MODES = ("live", "logs", "fr")
TOPOLOGIES = {"1x4": (1, 4), "2x2": (2, 2), "4x2": (4, 2)}
POSITIONS = ("rank0", "rank1", "middle", "last", "node2")


def _sh(*argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({res.returncode}): {res.stderr.strip()}")
    return res


def can_run() -> str | None:
    """None when this machine can build clusters, else why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth, a bridge)"
    for tool in ("ip", "unshare", "iptables"):
        if shutil.which(tool) is None:
            return f"needs `{tool}` (apt-get install -y iproute2 iptables util-linux)"
    probe = f"{PREFIX}probe{os.getpid() % 10000}"
    try:
        _sh("ip", "netns", "add", probe)
        try:
            _sh("ip", "netns", "exec", probe, "iptables", "-L", "-n")
            _sh("ip", "netns", "exec", probe, "unshare", "--uts", "hostname", "x")
        finally:
            _sh("ip", "netns", "del", probe, check=False)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot create a network namespace with iptables and a UTS namespace: {exc}"
    return None


def leftovers(prefix: str = PREFIX, tag: str | None = None) -> list[str]:
    """Namespaces, root-namespace links, /etc/netns entries and tagged processes still there."""
    found: list[str] = []
    netns = _sh("ip", "netns", "list", check=False).stdout.split()
    found += [f"netns {n}" for n in netns if n.startswith(prefix)]
    links = _sh("ip", "-o", "link", "show", check=False).stdout
    found += [f"link {m}" for m in re.findall(r"^\d+: ([^:@]+)", links, re.M)
              if m.startswith(prefix)]
    if NETNS_ETC.is_dir():
        found += [f"{NETNS_ETC}/{p.name}" for p in NETNS_ETC.iterdir()
                  if p.name.startswith(prefix)]
    if tag is not None:
        found += [f"pid {p}" for p in _tagged_pids(tag)]
    return found


@dataclass
class Cluster:
    """N nodes (network + UTS namespaces) on a private bridge; use as a context manager."""

    nodes: int
    workdir: Path
    tag: str = field(default_factory=lambda: f"faults-{uuid.uuid4().hex[:10]}")
    unresolvable_on: int | None = None  # this node's /etc/hosts lacks the other nodes
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.id = uuid.uuid4().hex[:6]
        self.subnet = 1 + int(self.id, 16) % 250

    # names ---------------------------------------------------------------------------
    def ns(self, node: int) -> str:
        return f"{PREFIX}{self.id}n{node}"

    @property
    def switch(self) -> str:
        return f"{PREFIX}{self.id}sw"

    def host(self, node: int) -> str:
        return f"node-{node}"

    def addr(self, node: int) -> str:
        return f"10.213.{self.subnet}.{node + 1}"

    # lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> Cluster:
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> None:
        _sh("ip", "netns", "add", self.switch)
        _sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        for i in range(self.nodes):
            ns = self.ns(i)
            _sh("ip", "netns", "add", ns)
            _sh("ip", "link", "add", "name", IFNAME, "netns", ns, "type", "veth",
                "peer", "name", f"p{i}", "netns", self.switch)
            _sh("ip", "-n", self.switch, "link", "set", f"p{i}", "master", "br0", "up")
            _sh("ip", "-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", IFNAME)
            _sh("ip", "-n", ns, "link", "set", IFNAME, "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            etc = NETNS_ETC / ns
            etc.mkdir(parents=True, exist_ok=True)
            others = [j for j in range(self.nodes) if j == i or self.unresolvable_on != i]
            (etc / "hosts").write_text(
                "127.0.0.1 localhost\n"
                + "".join(f"{self.addr(j)} {self.host(j)}\n" for j in others))
            # no name server reachable: lookups fail here, nothing is asked outside
            (etc / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")

    def down(self) -> None:
        try:
            with contextlib.suppress(RuntimeError):
                stop_job(self.procs, self.tag, grace_s=5)
        finally:  # interrupted (SIGTERM to the matrix run) or not, nothing stays behind
            kill_tagged(self.tag)
            self._delete()

    def _delete(self) -> None:
        for ns in [*(self.ns(i) for i in range(self.nodes)), self.switch]:
            _sh("ip", "netns", "del", ns, check=False)
            shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
        with contextlib.suppress(OSError):
            NETNS_ETC.rmdir()  # only when empty: it may be someone else's

    # running -------------------------------------------------------------------------
    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
        env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", GLOO_SOCKET_IFNAME=IFNAME,
                   **{TAG_ENV: self.tag})
        env.update(extra or {})
        return env

    def wrap(self, node: int, argv: list[str]) -> list[str]:
        """``argv`` inside node ``node``: its network namespace and its own host name."""
        return ["ip", "netns", "exec", self.ns(node), "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', self.host(node), *argv]

    def start(self, node: int, argv: list[str], log: Path,
              env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            proc = subprocess.Popen(self.wrap(node, argv), stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, env=self.env(env),
                                    cwd=log.parent, start_new_session=True)
        self.procs.append(proc)
        return proc

    def run(self, node: int, argv: list[str], timeout: float = 120,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """A short command inside a node (collect, iptables), tagged like the job."""
        return subprocess.run(self.wrap(node, argv), capture_output=True, text=True,
                              timeout=timeout, env=self.env(env), check=False)

    def firewall(self, node: int, *rule: str) -> None:
        """An iptables rule in that node's namespace only (gone with the namespace)."""
        _sh("ip", "netns", "exec", self.ns(node), "iptables", *rule)


def torchrun_argv(nnodes: int, nproc: int, endpoint: str, rdzv_timeout_s: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
            "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d", "--rdzv-endpoint",
            endpoint, "--rdzv-id", "faults", "--rdzv-conf",
            f"join_timeout={rdzv_timeout_s},read_timeout={rdzv_timeout_s}",
            "--max-restarts", "0", "--tee", "3", str(TRAIN)]


# --------------------------------------------------------------------------- the matrix


def culprit_rank(position: str, nnodes: int, nproc: int) -> int | None:
    """The global rank a position names (ranks are contiguous per node), None when n/a."""
    world = nnodes * nproc
    if position == "node2":
        return nproc if nnodes > 1 else None
    return {"rank0": 0, "rank1": 1, "middle": world // 2, "last": world - 1}[position]


def applicable(fault: str, position: str, mode: str, topology: str) -> str | None:
    """None when the cell can be run, else why it is not applicable."""
    nnodes, nproc = TOPOLOGIES[topology]
    if culprit_rank(position, nnodes, nproc) is None:
        return "one node: there is no second node"
    if fault in NODE_FAULTS and nnodes == 1:
        return "a node-level fault needs two nodes"
    if fault in NODE_FAULTS and position in ("rank1", "middle") and nproc > 1:
        node = culprit_rank(position, nnodes, nproc) // nproc
        if node == 0 and position != "rank0":
            return "a node-level fault: this position is on node 0, same cell as rank0"
    if fault == "port_blocked" and position != "rank0":
        return "the master port lives on node 0 (the rank0 cell)"
    if fault == "unresolved_host" and position == "rank0":
        return "node 0 hosts the endpoint: it needs no lookup"
    if mode in ("live", "fr") and fault in CRASH + STARTUP:
        return "the job ends by itself: nothing live to collect (logs mode)"
    if mode in ("live", "fr") and fault in DETAIL:
        return "DETAIL turns the mismatch into an error on every rank: the job ends by itself"
    return None


@dataclass
class CellResult:
    fault: str
    position: str
    mode: str
    topology: str
    culprit: int | None = None  # global rank, or None for node-level faults
    culprit_host: str | None = None
    cause: str | None = None
    ranks: list[int] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    rule: str | None = None
    summary: str = ""
    cause_ok: bool = False
    culprit_ok: bool = False
    culprit_state: str | None = None  # ranks.table state of the culprit
    seconds: float | None = None  # fault injected -> verdict printed
    evidence: str = ""  # what the inputs held (stacks, FR dumps, lines)
    error: str | None = None  # harness-side problem
    skipped: str | None = None  # not applicable / cannot run here
    rank_hosts: dict[int, str] = field(default_factory=dict)
    run_dir: str = ""
    inputs: list[str] = field(default_factory=list)  # what analyze read (kept on disk)
    node_ranks: list[int] = field(default_factory=list)  # the culprit node's ranks
    cluster: str = ""  # name prefix of its namespaces (for leftovers())
    tag: str = ""  # the tag its processes carried

    @property
    def right(self) -> bool:
        return self.cause_ok and self.culprit_ok


def _markers(logs: list[Path], pattern: str) -> list[re.Match[str]]:
    rx = re.compile(pattern)
    out: list[re.Match[str]] = []
    for log in logs:
        with contextlib.suppress(OSError):
            out += list(rx.finditer(log.read_text(errors="replace")))
    return out


def _wait(cond: Any, timeout: float, procs: list[subprocess.Popen[bytes]]) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        if procs and all(p.poll() is not None for p in procs):
            return bool(cond())
        time.sleep(0.3)
    return False


def _wait_quiet(agents: list[subprocess.Popen[bytes]], logs: list[Path], t0: float,
                least: float, most: float) -> bool:
    """Wait until every launcher exited (True), or, ``least`` seconds after ``t0``, until the
    logs, once not empty, stopped growing for 10 s; give up ``most`` seconds after ``t0`` (False)."""
    last_size, last_change = -1, time.monotonic()
    while time.monotonic() - t0 < most:
        if all(a.poll() is not None for a in agents):
            return True
        size = sum(p.stat().st_size for p in logs if p.exists())
        if size != last_size:
            last_size, last_change = size, time.monotonic()
        elif size and time.monotonic() - t0 > least and time.monotonic() - last_change > 10:
            return False  # quiet only counts once the job printed something (a slow start)
        time.sleep(0.5)
    return False


def _analyze(inputs: list[Path]) -> dict[str, Any]:
    res = subprocess.run([sys.executable, "-m", "ddp_autopsy", "analyze", *map(str, inputs),
                          "--format", "json"], capture_output=True, text=True, timeout=300,
                         check=False)
    try:
        return json.loads(res.stdout)
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"analyze crashed (exit {res.returncode}): "
                           f"{res.stderr.strip()[-800:]}") from exc


def judge(result: CellResult, report: dict[str, Any], node_ranks: list[int]) -> None:
    """Fill in the verdict and whether cause and culprit are right."""
    verdict = report.get("verdict") or {}
    result.cause = verdict.get("cause")
    result.ranks = list(verdict.get("ranks") or [])
    result.hosts = list(verdict.get("hosts") or [])
    result.rule = verdict.get("rule")
    result.summary = verdict.get("summary", "") or "(no verdict)"
    result.cause_ok = result.cause in EXPECTED[result.fault]
    table = (report.get("ranks") or {}).get("table") or []
    if result.culprit is not None:
        row = next((r for r in table if r.get("rank") == result.culprit), None)
        result.culprit_state = row.get("state") if row else None
        result.culprit_ok = result.ranks == [result.culprit]
        if result.fault in FROZEN and result.culprit_state == "crashed":
            result.culprit_ok = False  # a frozen rank must never be called crashed
    elif result.fault == "port_blocked":
        result.culprit_ok = result.cause_ok  # the culprit is the master's port, not a rank
    else:
        by_rank = bool(result.ranks) and set(result.ranks) <= set(node_ranks)
        result.culprit_ok = by_rank or result.hosts == [result.culprit_host]
    kinds: dict[str, int] = {}
    for item in report.get("inputs") or []:
        kinds[item.get("kind", "?")] = kinds.get(item.get("kind", "?"), 0) + 1
    states = ", ".join(f"{r.get('rank')}:{r.get('state')}" for r in table)
    result.evidence = (f"{result.evidence + '; ' if result.evidence else ''}inputs {dict(sorted(kinds.items()))}; ranks {states or 'none'}; "
                       f"findings {[f.get('rule') for f in report.get('findings') or []]}")


def run_cell(fault: str, position: str, mode: str, topology: str, workdir: Path,
             timeout_s: int = 20) -> CellResult:
    """Run one cell: build the nodes, launch, inject, gather evidence, analyze, tear down."""
    nnodes, nproc = TOPOLOGIES[topology]
    result = CellResult(fault, position, mode, topology)
    why = applicable(fault, position, mode, topology)
    if why:
        result.skipped = why
        return result
    rank = culprit_rank(position, nnodes, nproc)
    assert rank is not None
    node = rank // nproc
    node_level = fault in NODE_FAULTS
    result.culprit = None if node_level else rank
    result.culprit_host = f"node-{node}"
    run_dir = workdir / f"{fault}-{position}-{mode}-{topology}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    result.run_dir = str(run_dir)
    live = mode in ("live", "fr")
    env = {"FAULT": fault, "FAULT_RANK": str(rank), "FAULT_NODE": str(node), "FAULT_STEP": "3",
           "FAULT_TIMEOUT_S": str(300 if live else timeout_s)}
    consoles = [run_dir / f"node-{i}" / "console.log" for i in range(nnodes)]
    started = time.monotonic()
    cluster = Cluster(nnodes, run_dir, unresolvable_on=node if fault == "unresolved_host" else None)
    result.cluster, result.tag = PREFIX + cluster.id, cluster.tag
    with cluster:
        endpoint_host = "node-0" if fault == "unresolved_host" else cluster.addr(0)
        if fault == "port_blocked":  # a firewall on the master drops its port from the start
            cluster.firewall(0, "-A", "INPUT", "-p", "tcp", "--dport", str(RDZV_PORT),
                             "!", "-s", cluster.addr(0), "-j", "DROP")
        argv = torchrun_argv(nnodes, nproc, f"{endpoint_host}:{RDZV_PORT}", timeout_s)
        agents = []
        for i in range(nnodes):
            node_env = dict(env)
            if mode == "fr":
                node_env.update(TORCH_FR_BUFFER_SIZE="2000",
                                TORCH_FR_DUMP_TEMP_FILE=str(run_dir / f"node-{i}" / "fr" /
                                                            "nccl_trace_rank_"))
            agents.append(cluster.start(i, argv, consoles[i], node_env))
        t0 = started
        if fault == "link_drop":
            def all_past() -> bool:
                steps: dict[str, int] = {}
                for m in _markers(consoles, r"FAULT_STEP rank=(\d+) step=(\d+)"):
                    steps[m[1]] = max(steps.get(m[1], -1), int(m[2]))
                return len(steps) == nnodes * nproc and min(steps.values()) >= 3
            if _wait(all_past, 180, agents):
                for chain in ("INPUT", "OUTPUT"):
                    cluster.firewall(node, "-A", chain, "-i" if chain == "INPUT" else "-o",
                                     IFNAME, "-j", "DROP")
                t0 = time.monotonic()
            else:
                result.error = "the job never reached step 3"
        elif fault not in STARTUP:
            if _wait(lambda: _markers(consoles, r"FAULT_INJECT"), 180, agents):
                t0 = time.monotonic()
            else:
                result.error = "the fault was never injected"
        inputs: list[Path] = []
        if live and result.error is None:
            settle = 8.0 if mode == "fr" else 4.0  # let the others block (and dump)
            time.sleep(settle)
            collects = []
            for i, agent in enumerate(agents):
                out = run_dir / f"bundle-node-{i}"
                collects.append(subprocess.Popen(
                    cluster.wrap(i, [sys.executable, "-m", "ddp_autopsy", "collect", "--pid",
                                     str(agent.pid), "--out", str(out), "--logs",
                                     str(consoles[i]), "--deadline", "90", "--format", "json"]),
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cluster.env()))
                inputs.append(out)
            for i, proc in enumerate(collects):
                try:
                    _, err = proc.communicate(timeout=150)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.communicate()
                    err = b"timed out"
                if proc.returncode != 0:
                    result.error = f"collect on node-{i} exit {proc.returncode}: " \
                                   f"{err.decode(errors='replace').strip()[-300:]}"
            if result.error and all(a.poll() is not None for a in agents):
                result.error += "; the job had ended: its logs analyzed instead"
                inputs = consoles
        else:
            # logs only: wait for the timeouts to fire and the launchers to give up. A
            # launcher that cannot reach the rendezvous store may never give up: then the
            # logs are read as they are (a copy), before the harness stops the job, so its
            # own SIGTERMs are not in them.
            deadline = 3 * timeout_s + 30.0
            # A start-up fault's own timeouts come later: a TCPStore connect is tried twice
            # (timeout, a delay, timeout) before the agent gives up.
            least = 2 * timeout_s + 20.0 if fault in STARTUP else timeout_s + 5.0
            if not _wait_quiet(agents, consoles, t0, least, deadline):
                result.evidence = "launchers still running, logs quiet for 10 s: read as " \
                    "they were"
            inputs = []
            for i, console in enumerate(consoles):
                copy = run_dir / "logs" / f"node-{i}" / "console.log"
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(console, copy)
                inputs.append(copy)
    # the cluster is gone; the evidence stays on disk
    hosts: dict[int, str] = {}
    for m in _markers(consoles, r"FAULT_START rank=(\d+) world=\d+ host=(\S+)"):
        hosts[int(m[1])] = m[2]
    result.rank_hosts = dict(sorted(hosts.items()))
    node_ranks = [r for r, h in hosts.items() if h == f"node-{node}"] or \
        list(range(node * nproc, (node + 1) * nproc))
    if result.culprit is not None and hosts and hosts.get(rank) != f"node-{node}":
        result.error = (result.error or "") + f" rank {rank} ran on {hosts.get(rank)}, " \
            f"not node-{node}"
    inputs = [p for p in inputs if p.exists()]
    result.inputs, result.node_ranks = [str(p) for p in inputs], node_ranks
    if not inputs:
        result.error = f"{result.error + '; ' if result.error else ''}no evidence to analyze"
        return result
    try:
        report = _analyze(inputs)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        result.error = f"{result.error + '; ' if result.error else ''}{exc}"
        return result
    result.seconds = round(time.monotonic() - t0, 1)
    (run_dir / "analysis.json").write_text(json.dumps(report, indent=1))
    judge(result, report, node_ranks)
    (run_dir / "cell.json").write_text(json.dumps(asdict(result), indent=1))
    return result


def kill_tagged(tag: str) -> None:
    for pid in _tagged_pids(tag):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def rejudge(old: dict[str, Any]) -> CellResult | None:
    """A cell's kept evidence analyzed again by today's code (None when it is gone): the
    verdict changes, the run and its seconds stay."""
    run_dir = Path(old.get("run_dir") or "/nonexistent")
    inputs = [Path(p) for p in old.get("inputs") or []] or sorted(
        run_dir.glob("logs/node-*/console.log") if old["mode"] == "logs"
        else run_dir.glob("bundle-node-*"))
    if not inputs or not all(p.exists() for p in inputs):
        return None
    known = set(CellResult.__dataclass_fields__)
    result = CellResult(**{k: v for k, v in old.items() if k in known})
    result.rank_hosts = {int(k): v for k, v in result.rank_hosts.items()}
    result.inputs = [str(p) for p in inputs]
    if not result.node_ranks:
        nproc = TOPOLOGIES[result.topology][1]
        node = int(result.culprit_host.rsplit("-", 1)[1]) if result.culprit_host else 0
        result.node_ranks = [r for r, h in result.rank_hosts.items()
                             if h == result.culprit_host] or \
            list(range(node * nproc, (node + 1) * nproc))
    report = _analyze(inputs)
    if result.error and "analyze crashed" in result.error:
        result.error = result.error.split("analyze crashed")[0].rstrip("; ") or None
    result.evidence = result.evidence.split("inputs {")[0].rstrip("; ")
    judge(result, report, result.node_ranks)
    (Path(result.run_dir) / "analysis.json").write_text(json.dumps(report, indent=1))
    return result
