"""One process of the job: its ``/proc`` facts (``info.json``) and its stack dumps.

``info.json`` is written once per process, after the dumps, so that it can carry the stack status
and the Python version py-spy read from the process.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ddp_autopsy import bundle_layout as layout
from ddp_autopsy.collectors import procs, pyspy
from ddp_autopsy.collectors.bundle import ERROR, EXITED, OK, SKIPPED, TIMEOUT, Bundle
from ddp_autopsy.collectors.jobs import Member
from ddp_autopsy.collectors.versions import versions
from ddp_autopsy.redact import redact_argv, redact_env


@dataclass
class ProcessRecord:
    """What the collector learned about one process (raw env kept in memory only)."""

    member: Member
    info: dict[str, Any]
    env: dict[str, str] | None = None
    stack: pyspy.StackDump | None = None



def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.strip().lstrip("-").isdigit() else None


def read_facts(pid: int) -> tuple[dict[str, Any], dict[str, str] | None]:
    """``(info fields, raw environment)``; raises ProcessLookupError when ``pid`` is gone."""
    snap = procs.snapshot(pid)
    if snap is None:
        raise ProcessLookupError(f"process {pid} exited")
    if snap.zombie:
        raise ProcessLookupError(f"process {pid} exited (a zombie its parent has not reaped)")
    env = snap.environ or {}
    maps = procs.read_maps_paths(pid)
    fds = procs.fd_targets(pid)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    local_rank = _int(env.get("LOCAL_RANK"))
    devices = [d.strip() for d in visible.split(",")] if visible else []
    slurm = {k.removeprefix("SLURM_").lower(): env[k] for k in
             ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_JOB_ID") if k in env}
    info = {
        "comm": snap.comm, "exe": snap.exe, "cmdline": redact_argv(snap.cmdline),
        "cwd": procs.read_cwd(pid),
        "started": datetime.fromtimestamp(snap.start_time).astimezone().isoformat()
        if snap.start_time else None,
        "group_rank": _int(env.get("GROUP_RANK")),
        "local_world_size": _int(env.get("LOCAL_WORLD_SIZE")),
        "run_id": env.get("TORCHELASTIC_RUN_ID"),
        "master_addr": env.get("MASTER_ADDR"), "master_port": _int(env.get("MASTER_PORT")),
        "slurm": slurm or None,
        "env": redact_env(env) if snap.environ is not None else None,
        "env_error": snap.environ_error,
        "stdout": procs.fd_target(pid, 1), "stderr": procs.fd_target(pid, 2),
        "versions": versions(maps, snap.exe, None),
        "gpu": {"cuda_visible_devices": visible, "local_rank": local_rank,
                # torch.cuda.set_device(LOCAL_RANK) is the convention, not a certainty
                "assumed_device": devices[local_rank] if local_rank is not None
                and 0 <= local_rank < len(devices) else None,
                "opened_devices": sorted({t for t in fds if t.startswith("/dev/nvidia")
                                          and t[len("/dev/nvidia"):].isdigit()})},
    }
    return info, snap.environ


def collect_facts(bundle: Bundle, m: Member, step: float) -> ProcessRecord:
    """:func:`read_facts` as a bounded action; a process that is gone gets ``status: exited``."""
    base = {"pid": m.pid, "ppid": m.ppid, "role": m.role, "rank": m.rank,
            "rank_source": m.rank_source, "local_rank": m.local_rank,
            "world_size": m.world_size, "spawn_index": m.spawn_index, "worker_pid": m.worker_pid}
    outcome = bundle.probe("process info", lambda: read_facts(m.pid), target=f"pid {m.pid}",
                           step_timeout=step)
    if outcome is None or not outcome.done or outcome.error is not None or not outcome.value:
        status = SKIPPED if outcome is None else TIMEOUT if not outcome.done else \
            EXITED if isinstance(outcome.error, ProcessLookupError) else ERROR
        if outcome is not None and outcome.action is not None and status == EXITED:
            outcome.action.status = EXITED
        return ProcessRecord(m, {**base, "status": status, "cmdline": None, "env": None})
    info, env = outcome.value
    return ProcessRecord(m, {**base, "status": OK, **info}, env)


def collect_stacks(bundle: Bundle, pyspy_exe: str | None, proc: ProcessRecord, *,
                   native: bool, step: float) -> pyspy.StackDump:
    """py-spy dumps of one process, then its ``info.json`` (which names the Python version from
    the dump's header)."""
    pid = proc.member.pid
    # (its kernel state as the dump starts: T/t, stopped by a signal or a debugger, is a frozen
    # rank whose stack py-spy can still read)
    proc.info["proc_state"] = procs.read_state(pid)
    if proc.info.get("status") == EXITED:
        stack = pyspy.StackDump(EXITED, "process exited before the dump", None, None, None)
    else:
        stack = pyspy.dump_process(bundle, pyspy_exe, pid, native=native, step_timeout=step,
                                   env=proc.env)
    if proc.info.get("versions") and stack.text:
        proc.info["versions"]["python"] = (
            versions([], None, stack.text)["python"] or proc.info["versions"]["python"])
    proc.info["stack_status"] = stack.status
    proc.info["stack"] = stack.json_path
    proc.info["stack_source"] = stack.source if stack.json_path else None
    proc.info["stack_note"] = stack.note
    bundle.write_json(layout.process_info(pid), proc.info)
    return stack
