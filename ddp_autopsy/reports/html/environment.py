"""Versions and environment: only what differs between processes."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import polars as pl

from ddp_autopsy.analyzer.stacktree import short_ranks
from ddp_autopsy.redact import MASK, is_secret_name
from ddp_autopsy.reports.html.common import MAX_ENV_VALUES, clean

#: Variables that identify the process and so differ by design.
IDENTITY = re.compile(
    r"^(?:RANK|LOCAL_RANK|GROUP_RANK|ROLE_RANK|GLOBAL_RANK|HOSTNAME|HOST|"
    r"TORCHELASTIC_ERROR_FILE|OMPI_COMM_WORLD_(?:LOCAL_)?RANK|PMI_RANK|PMIX_RANK|"
    r"SLURM_(?:PROCID|LOCALID|NODEID|TASK_PID|TOPOLOGY_ADDR|STEP_NODELIST)|SLURMD_NODENAME|"
    r"_|OLDPWD|SHLVL|SSH_\w+|TERM_SESSION_ID|INVOCATION_ID|JOURNAL_STREAM)$"
)


@dataclass
class EnvValue:
    value: str
    who: str
    count: int


@dataclass
class EnvKey:
    key: str
    version: bool
    values: list[EnvValue]
    more: int


@dataclass
class EnvView:
    processes: int
    left_out: int  # processes with no rank (launcher agents...) when ranked ones exist
    differing: list[EnvKey]
    same_versions: list[tuple[str, str]]
    same_env: int  # variables identical everywhere: counted, not listed (a report is shared)
    identity: list[str]


def _env_value(key: str, value: str | None) -> str:
    if value is None:
        return "(unset)"
    if is_secret_name(key.removeprefix("version.")) and value != MASK:
        return MASK
    return clean(value, 300)


def env_view(env: pl.DataFrame) -> EnvView | None:
    if env.height == 0:
        return None
    left_out = 0
    ranked = env.filter(pl.col("rank").is_not_null())
    if ranked.height:  # compare ranks with ranks; the launcher agent has another environment
        left_out = env.filter(pl.col("rank").is_null()).select("host", "pid").n_unique() \
            if ranked.height < env.height else 0
        env = ranked
    env = env.with_columns(
        pl.format("{}\x1f{}", pl.col("host").fill_null("?"), pl.col("pid").fill_null(-1))
        .alias("_proc"))
    procs = env.select("_proc", "rank", "pid").unique("_proc")
    n = procs.height
    label_of = {p: (r, pid) for p, r, pid in procs.iter_rows()}
    per_key = env.group_by("key").agg(pl.col("value").n_unique().alias("nv"),
                                      pl.col("_proc").n_unique().alias("np"))
    same = per_key.filter((pl.col("nv") == 1) & (pl.col("np") == n))["key"].to_list()
    diff_keys = per_key.filter((pl.col("nv") > 1) | (pl.col("np") < n))["key"].to_list()
    first = env.unique("key", keep="first").select("key", "value")
    same_vals = dict(first.filter(pl.col("key").is_in(same)).iter_rows())
    identity = sorted(k for k in diff_keys if IDENTITY.match(k))
    differing: list[EnvKey] = []
    rows = (env.filter(pl.col("key").is_in([k for k in diff_keys if k not in identity]))
            .group_by("key", "value").agg(pl.col("_proc").unique()))
    by_key: dict[str, list[tuple[str | None, list[str]]]] = defaultdict(list)
    for key, value, plist in rows.iter_rows():
        by_key[key].append((value, plist))
    for key in sorted(by_key, key=lambda k: (not k.startswith("version."), k)):
        entries = by_key[key]
        covered = {p for _, pl_ in entries for p in pl_}
        missing = [p for p in label_of if p not in covered]
        if missing:
            entries.append((None, missing))
        entries.sort(key=lambda e: -len(e[1]))
        values = []
        for value, plist in entries[:MAX_ENV_VALUES]:
            values.append(EnvValue(_env_value(key, value), _procs_label(plist, label_of),
                                   len(plist)))
        differing.append(EnvKey(clean(key, 120), key.startswith("version."), values,
                                max(0, len(entries) - MAX_ENV_VALUES)))
    same_versions = sorted((clean(k, 120), _env_value(k, v)) for k, v in same_vals.items()
                           if k.startswith("version."))
    same_env = sum(not k.startswith("version.") for k in same_vals)
    return EnvView(processes=n, left_out=left_out, differing=differing, same_versions=same_versions,
                   same_env=same_env, identity=[clean(k, 80) for k in identity])


def _procs_label(plist: Iterable[str], label_of: dict[str, tuple[int | None, int | None]]) -> str:
    ranks, pids = [], []
    for p in plist:
        r, pid = label_of.get(p, (None, None))
        if r is not None:
            ranks.append(r)
        elif pid is not None:
            pids.append(pid)
    parts = []
    if ranks:
        parts.append(f"rank{'s' if len(set(ranks)) > 1 else ''} {short_ranks(ranks, 8)}")
    if pids:
        parts.append(f"pid{'s' if len(pids) > 1 else ''} {','.join(map(str, sorted(pids)[:6]))}"
                     + ("…" if len(pids) > 6 else ""))
    return ", ".join(parts) or "?"
