"""Finding distributed jobs on this host and the role of each of their processes.

A job is a process tree rooted at its launcher:

* **torchrun** — the elastic agent (``torchrun`` / ``python -m torch.distributed.run|launch``);
  its children carry ``RANK``/``LOCAL_RANK``.
* **mp.spawn** — a Python parent whose children run ``multiprocessing.spawn.spawn_main``; they have
  no ``RANK`` in their environment, so their rank is left unknown and ``spawn_index`` (pid order)
  is recorded instead.
* **srun** (or a shell loop) — sibling workers with ``RANK``/``SLURM_PROCID`` under a non-Python
  parent; the job is the group of siblings that share a rendezvous identity.

Roles: ``agent`` (torchrun), ``worker`` (a rank), ``dataloader`` (any process below a worker:
DataLoader workers inherit the worker's ``RANK`` env), ``other`` (launcher of an mp.spawn job,
multiprocessing helpers, …).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ddp_autopsy.collectors import procs
from ddp_autopsy.collectors.procs import ProcSnapshot
from ddp_autopsy.redact import redact_argv

AGENT_MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch"})
# Processes below a worker that are not DataLoader workers.
HELPER_MARKERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver",
                  "torch._inductor.compile_worker", "torch/_inductor/compile_worker")
RANK_VARS = ("RANK", "LOCAL_RANK")


class CollectError(Exception):
    """A usage problem the CLI reports as-is (exit code 2): no job, ambiguous job, bad pid."""


@dataclass(frozen=True)
class Member:
    """One process of a job, as discovery saw it."""

    pid: int
    ppid: int
    role: str  # agent | worker | dataloader | other
    rank: int | None = None
    rank_source: str | None = None  # "RANK" | "SLURM_PROCID" | None
    local_rank: int | None = None
    world_size: int | None = None
    spawn_index: int | None = None  # mp.spawn children only: their process index, not a rank
    spawn_index_source: str | None = None  # "pid order" (discovery) | "py-spy locals" (collect)
    worker_pid: int | None = None  # dataloader: the worker it belongs to


@dataclass(frozen=True)
class JobCandidate:
    """A distributed job on this host. ``key`` is what ``collect --job`` accepts."""

    key: str
    launcher_pid: int
    pids: tuple[int, ...]
    world_size: int | None
    run_id: str | None
    cmdline: tuple[str, ...]  # the launcher's, redacted
    launcher: str = "unknown"  # torchrun | mp.spawn | srun | unknown
    master_addr: str | None = None
    master_port: int | None = None
    started: float | None = None  # launcher start, seconds since the epoch
    members: tuple[Member, ...] = field(default=(), repr=False)

    def describe(self) -> str:
        ranks = sorted(m.rank for m in self.members if m.role == "worker" and m.rank is not None)
        workers = sum(m.role == "worker" for m in self.members)
        return (f"{self.key}: {self.launcher} pid {self.launcher_pid}, {workers} worker(s)"
                + (f" ranks {ranks}" if ranks else "")
                + (f", world size {self.world_size}" if self.world_size else "")
                + (f", run id {self.run_id}" if self.run_id else "")
                + f" — {' '.join(self.cmdline)[:120]}")


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _env(snap: ProcSnapshot) -> dict[str, str]:
    return snap.environ or {}


def is_agent(cmdline: tuple[str, ...] | list[str]) -> bool:
    """torchrun / ``python -m torch.distributed.run`` / ``torch.distributed.launch``."""
    if not cmdline:
        return False
    if os.path.basename(cmdline[0]) == "torchrun":
        return True
    args = iter(cmdline[1:])
    for arg in args:
        if arg == "-m":
            return next(args, "") in AGENT_MODULES
        if arg == "-c":
            return False
        if arg.startswith("-"):
            continue
        return os.path.basename(arg) == "torchrun" or arg.endswith("torch/distributed/run.py")
    return False


def is_spawn_child(cmdline: tuple[str, ...] | list[str]) -> bool:
    return any("spawn_main" in a or "multiprocessing.spawn" in a for a in cmdline) and \
        "--multiprocessing-fork" in cmdline


def is_helper(cmdline: tuple[str, ...] | list[str]) -> bool:
    return any(marker in arg for arg in cmdline for marker in HELPER_MARKERS)


def has_rank_env(snap: ProcSnapshot) -> bool:
    env = _env(snap)
    return any(v in env for v in RANK_VARS)


def _is_slurm_task(snap: ProcSnapshot, table: dict[int, ProcSnapshot]) -> bool:
    parent = table.get(snap.ppid)
    return "SLURM_PROCID" in _env(snap) and parent is not None and parent.comm == "slurmstepd"


def _is_rank_process(snap: ProcSnapshot, table: dict[int, ProcSnapshot]) -> bool:
    return has_rank_env(snap) or _is_slurm_task(snap, table)


def _torch_loaded(pid: int) -> bool:
    return any("/torch/lib/libtorch" in p for p in procs.read_maps_paths(pid))


def job_root(table: dict[int, ProcSnapshot], pid: int) -> int:
    """Walk up from ``pid`` while the parent is still part of the job: an agent, a rank (we are
    below it), an mp.spawn child, or a Python launcher with rank / spawn children. Stops at the
    first parent that is none of these (a shell, srun's slurmstepd, pytest …), and at a torchrun
    agent (the top of its job, even when a Python program that launches ranks started it)."""
    children = procs.children_map(table)
    cur = pid
    seen = {cur}
    while True:
        if cur in table and is_agent(table[cur].cmdline):
            return cur  # torchrun is the top of its job, whatever started it (a script, pytest)
        parent = table.get(table[cur].ppid) if cur in table else None
        if parent is None or parent.pid <= 1 or parent.pid in seen or not parent.is_python:
            return cur
        launches_ranks = any(
            _is_rank_process(table[c], table) or is_spawn_child(table[c].cmdline)
            for c in children.get(parent.pid, []) if c in table)
        if not (is_agent(parent.cmdline) or _is_rank_process(parent, table)
                or is_spawn_child(parent.cmdline) or launches_ranks):
            return cur
        cur = parent.pid
        seen.add(cur)


def _classify(table: dict[int, ProcSnapshot], children: dict[int, list[int]],
              roots: list[int]) -> list[Member]:
    """Members of the trees under ``roots`` (sibling roots for srun-style jobs)."""
    members: list[Member] = []
    # (pid, worker pid above it or None, role of its parent inside the job or None)
    stack: list[tuple[int, int | None, str | None]] = [(r, None, None) for r in reversed(roots)]
    spawn_index: dict[int, int] = {}
    for root in roots:
        kids = [c for c in children.get(root, []) if is_spawn_child(table[c].cmdline)
                and not has_rank_env(table[c])]
        if not _is_rank_process(table[root], table):
            spawn_index.update({pid: i for i, pid in enumerate(sorted(kids))})
    while stack:
        pid, worker_above, parent_role = stack.pop()
        snap = table[pid]
        env = _env(snap)
        rank, rank_source = _int(env.get("RANK")), "RANK" if "RANK" in env else None
        if worker_above is not None:
            role = "other" if is_helper(snap.cmdline) else "dataloader"
        elif is_agent(snap.cmdline):
            role = "agent"
        elif _is_rank_process(snap, table) or pid in spawn_index or (
                parent_role == "agent" and snap.environ is None and not is_helper(snap.cmdline)):
            # (a child of torchrun whose env we may not read, or a zombie, is still one of its
            # workers)
            role = "worker"
            if rank is None and _is_slurm_task(snap, table):
                rank, rank_source = _int(env.get("SLURM_PROCID")), "SLURM_PROCID"
        else:
            role = "other"
        members.append(Member(
            pid=pid, ppid=snap.ppid, role=role, rank=rank, rank_source=rank_source,
            local_rank=_int(env.get("LOCAL_RANK")), world_size=_int(env.get("WORLD_SIZE")),
            spawn_index=spawn_index.get(pid) if role == "worker" else None,
            spawn_index_source="pid order" if role == "worker" and pid in spawn_index else None,
            worker_pid=worker_above))
        below = pid if role == "worker" else worker_above
        # A launcher of ranks (a script calling mp.spawn, pytest) may also have started a
        # torchrun: that agent's tree is a job of its own.
        stack.extend((c, below, role) for c in reversed(children.get(pid, [])) if c in table
                     and (role in ("agent", "worker") or worker_above is not None
                          or not is_agent(table[c].cmdline)))
    return members


def _cmdline_option(cmdline: tuple[str, ...], *names: str) -> str | None:
    for i, arg in enumerate(cmdline):
        for name in names:
            if arg == name and i + 1 < len(cmdline):
                return cmdline[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def _build(table: dict[int, ProcSnapshot], children: dict[int, list[int]], roots: list[int],
           launcher_pid: int) -> JobCandidate:
    members = _classify(table, children, roots)
    workers = [table[m.pid] for m in members if m.role == "worker"]
    envs = [_env(w) for w in workers]
    launcher_snap = table.get(launcher_pid)
    launcher_cmd = launcher_snap.cmdline if launcher_snap else ()

    def first(var: str) -> str | None:
        return next((e[var] for e in envs if e.get(var)), None)

    if any(m.role == "agent" and m.pid == launcher_pid for m in members):
        launcher = "torchrun"
    elif any(m.spawn_index is not None for m in members):
        launcher = "mp.spawn"
    elif first("SLURM_JOB_ID") or (launcher_snap and launcher_snap.comm == "slurmstepd"):
        launcher = "srun"
    else:
        launcher = "unknown"
    world_size = _int(first("WORLD_SIZE"))
    master_addr, master_port = first("MASTER_ADDR"), _int(first("MASTER_PORT"))
    run_id = first("TORCHELASTIC_RUN_ID") or first("SLURM_JOB_ID")
    if launcher == "torchrun":
        # An agent still in rendezvous has no workers yet: read its command line.
        nnodes = _int(_cmdline_option(launcher_cmd, "--nnodes") or "1")  # "1:4" (elastic): None
        nproc = _int(_cmdline_option(launcher_cmd, "--nproc-per-node", "--nproc_per_node"))
        if world_size is None and nnodes and nproc:
            world_size = nnodes * nproc
        run_id = run_id or _cmdline_option(launcher_cmd, "--rdzv-id", "--rdzv_id")
        master_addr = master_addr or _cmdline_option(launcher_cmd, "--master-addr",
                                                     "--master_addr")
        master_port = master_port or _int(_cmdline_option(launcher_cmd, "--master-port",
                                                          "--master_port"))
        static = not any(a.startswith(("--rdzv-endpoint", "--rdzv_endpoint", "--standalone"))
                         for a in launcher_cmd)
        if static:  # torchrun's defaults for the static rendezvous
            master_addr, master_port = master_addr or "127.0.0.1", master_port or 29500
    pids = tuple(m.pid for m in members)
    return JobCandidate(
        key=f"{launcher}-{launcher_pid}", launcher_pid=launcher_pid, pids=pids,
        world_size=world_size, run_id=run_id, cmdline=tuple(redact_argv(launcher_cmd)),
        launcher=launcher, master_addr=master_addr, master_port=master_port,
        started=launcher_snap.start_time if launcher_snap else None, members=tuple(members))


def _identity(snap: ProcSnapshot) -> tuple[str | None, ...]:
    env = _env(snap)
    return (env.get("MASTER_ADDR"), env.get("MASTER_PORT"), env.get("TORCHELASTIC_RUN_ID"),
            env.get("SLURM_JOB_ID"), env.get("SLURM_STEP_ID"))


def _sibling_roots(table: dict[int, ProcSnapshot], children: dict[int, list[int]],
                   root: int) -> list[int] | None:
    """For a worker whose parent is not Python (srun, a shell loop): its siblings of the same
    rendezvous. ``None`` when ``root`` is not such a worker."""
    snap = table[root]
    parent = table.get(snap.ppid)
    if parent is None or parent.pid <= 1 or parent.is_python or not _is_rank_process(snap, table):
        return None
    ident = _identity(snap)
    return [c for c in children.get(parent.pid, []) if c in table and table[c].is_python
            and _is_rank_process(table[c], table) and _identity(table[c]) == ident]


def job_for_pid(pid: int, table: dict[int, ProcSnapshot] | None = None) -> JobCandidate:
    """The job ``pid`` belongs to (``pid`` may be the launcher, a rank or a DataLoader worker)."""
    table = table if table is not None else procs.scan()
    if pid not in table:
        snap = procs.snapshot(pid)
        if snap is None:
            raise CollectError(f"no process with pid {pid} on this host")
        table[pid] = snap
    children = procs.children_map(table)
    root = job_root(table, pid)
    siblings = _sibling_roots(table, children, root)
    if siblings and len(siblings) > 1:
        return _build(table, children, siblings, table[root].ppid)
    return _build(table, children, [root], root)


def require_member(job: JobCandidate, pid: int) -> JobCandidate:
    """``job`` if ``pid`` is one of its agent, rank or DataLoader processes or the launcher of
    its ranks; else a :class:`CollectError` that says so (``--pid 1``, a plain ``sleep`` …:
    collecting their process tree would dump every process below them)."""
    me = next((m for m in job.members if m.pid == pid), None)
    launches = any(m.ppid == pid and m.role in ("agent", "worker") for m in job.members)
    # init (pid 1) may have adopted orphaned ranks: its tree is every process on the host
    if (launches and pid != 1) or (me is not None and me.role in ("agent", "worker",
                                                                   "dataloader")):
        return job
    snap = procs.snapshot(pid)
    what = f"pid {pid}" + (f" ({snap.comm})" if snap else "")
    raise CollectError(
        f"{what} is not part of a distributed job: it is no torchrun agent, no rank (RANK, "
        "LOCAL_RANK or an srun task's SLURM_PROCID in its environment), no process below a rank "
        "and no launcher of ranks. Give the pid of the launcher (torchrun) or of a rank, or run "
        "without --pid to find the job.")


def find_jobs(table: dict[int, ProcSnapshot] | None = None) -> list[JobCandidate]:
    """Every distributed training job on this host, ordered by launcher pid."""
    table = table if table is not None else procs.scan()
    me = os.getpid()
    seeds = [s.pid for s in table.values() if s.pid != me and s.is_python and (
        is_agent(s.cmdline) or _is_rank_process(s, table)
        or (is_spawn_child(s.cmdline) and _torch_loaded(s.pid)))]
    jobs: dict[int, JobCandidate] = {}
    covered: set[int] = set()
    for seed in seeds:
        if seed in covered:
            continue
        job = job_for_pid(seed, table)
        if job.launcher_pid in jobs:
            continue
        jobs[job.launcher_pid] = job
        covered.update(job.pids)
    # A job found from a deep seed may sit inside another one found later: keep the outer one.
    nested = {lp for lp, job in jobs.items()
              for other in jobs.values() if other is not job and lp in other.pids}
    return [jobs[lp] for lp in sorted(jobs) if lp not in nested]


def select_job(jobs: list[JobCandidate], wanted: str | None) -> JobCandidate:
    """Pick the job ``wanted`` names (key, launcher pid or run id), or the only one."""
    if wanted is not None:
        matches = [j for j in jobs if wanted in (j.key, str(j.launcher_pid), j.run_id)]
        if len(matches) == 1:
            return matches[0]
        listing = "\n".join("  " + j.describe() for j in jobs) or "  (none)"
        raise CollectError(f"{'no' if not matches else 'more than one'} job matches "
                           f"{wanted!r}; jobs on this host:\n{listing}")
    if not jobs:
        raise CollectError("no distributed training processes found on this host")
    if len(jobs) > 1:
        listing = "\n".join("  " + j.describe() for j in jobs)
        raise CollectError(f"{len(jobs)} distributed jobs on this host; choose one with --job KEY "
                           f"or --pid PID:\n{listing}")
    return jobs[0]
