"""The rank-state grid: one cell per rank, coloured by the per-rank table's state."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import polars as pl

from ddp_autopsy.analyzer.stacktree import short_ranks
from ddp_autopsy.reports.html.common import GRID_FOLD_ABOVE, clean
from ddp_autopsy.rules.engine import Analysis

#: Grid states, most telling first: the verdict's culprits and the ranks the launcher stopped
#: are the analysis' marks; every other state is the job's per-rank table (analyzer/rankstate.py).
STATES: tuple[tuple[str, str, str], ...] = (
    ("culprit", "culprit", "named by the verdict"),
    ("crashed", "crashed", "raised, exited with an error or ran out of memory"),
    ("frozen", "frozen", "cannot run: stopped, holding the GIL in native code, or no stack in "
     "time"),
    ("elsewhere", "outside collective", "its stack is outside any collective"),
    ("failed", "timed out / lost peer", "failed waiting for the others"),
    ("waiting", "waiting in collective", "its stack waits in a torch.distributed call"),
    ("terminated", "terminated", "stopped by the launcher after another failure"),
    ("exited", "exited", "its process was gone when collected"),
    ("seen", "seen, no failure", "in the logs or stacks, nothing wrong"),
    ("nodata", "no data", "within the world size, but absent from every input"),
)
#: The per-rank table's state → the grid's (CSS class) name.
GRID_STATE = {"busy": "elsewhere", "missing": "nodata"}


@dataclass
class Cell:
    rank: int
    state: str
    title: str


@dataclass
class GridRow:
    label: str
    cells: list[Cell]
    #: Huge jobs: several full rows of one state folded into one bar (``cells`` is then empty).
    band: Cell | None = None


@dataclass
class LegendItem:
    state: str
    label: str
    meaning: str
    count: int
    ranks: str


@dataclass
class GridView:
    rows: list[GridRow]
    legend: list[LegendItem]
    size: str  # "l" | "m" | "s": cell size class
    total: int
    note: str


#: Symptom rules whose ranks failed waiting for the others (a timeout, a peer gone).
LOST_PEER_RULES = ("SYM001", "SYM002")


def lost_peer_only(analysis: Analysis) -> dict[int, str]:
    """Ranks the table calls crashed whose failure the analysis explains as a symptom (a
    timeout, a lost peer: "Connection closed by peer" raised after another rank died) and no
    crash finding names: rank → the symptom finding."""
    crash_named = {r for f in analysis.findings if f.rule.startswith("CRASH") for r in f.ranks}
    out: dict[int, str] = {}
    for f in analysis.findings:
        if f.rule in LOST_PEER_RULES and f.role == "symptom":
            for r in f.ranks:
                if r not in crash_named:
                    out.setdefault(r, f"{f.id} {f.rule} {f.slug}")
    crashed = set(analysis.job.rank_state.filter(pl.col("state") == "crashed")["rank"]
                  .to_list()) if analysis.job.rank_state.height else set()
    return {r: why for r, why in out.items() if r in crashed}


def rank_states(analysis: Analysis) -> dict[int, tuple[str, str]]:
    """Rank → (grid state, why) for every rank the inputs name or the world size implies."""
    out: dict[int, tuple[str, str]] = {}
    for r, state, why in analysis.job.rank_state.select("rank", "state", "why").iter_rows():
        out[r] = (GRID_STATE.get(state, state), why or "")
    for r, why in lost_peer_only(analysis).items():
        out[r] = ("failed", f"{why} (its error follows another rank's failure)")
    terminated = {r: f"{f.id} {f.rule} {f.slug}" for f in analysis.findings
                  if f.slug == "workers-terminated" for r in f.ranks}
    for r, why in terminated.items():
        if out.get(r, ("seen", ""))[0] in ("seen", "failed", "nodata"):
            out[r] = ("terminated", why)
    verdict = analysis.verdict
    if verdict is not None:
        for r in verdict.ranks:
            out[r] = ("culprit", f"{verdict.id} {verdict.rule} {verdict.slug}")
    return out


def grid_view(analysis: Analysis) -> GridView | None:
    states = rank_states(analysis)
    if not states:
        return None
    host_of: dict[int, str] = {}
    if analysis.job.ranks.height:
        for r, hosts in analysis.job.ranks.select("rank", "hosts").iter_rows():
            if hosts:
                host_of[r] = clean(hosts[0], 60)
    n = len(states)
    cols = 16 if n <= 128 else 32 if n <= 1024 else 64
    size = "l" if n <= 256 else "m" if n <= 2048 else "s"
    ranks = sorted(states)
    rows: list[GridRow] = []
    for i in range(0, len(ranks), cols):
        chunk = ranks[i:i + cols]
        cells = []
        for r in chunk:
            state, why = states[r]
            host = f" · {host_of[r]}" if r in host_of else ""
            cells.append(Cell(r, state, f"rank {r}{host} · {_STATE_LABEL[state]}: {why}"))
        label = f"{chunk[0]}" if len(chunk) == 1 else f"{chunk[0]}–{chunk[-1]}"
        rows.append(GridRow(label, cells))
    folded = n > GRID_FOLD_ABOVE
    if folded:
        rows = _fold_rows(rows, cols)
    by_state: dict[str, list[int]] = defaultdict(list)
    for r, (s, _) in states.items():
        by_state[s].append(r)
    legend = [LegendItem(s, label, meaning, len(by_state[s]), short_ranks(by_state[s], 10))
              for s, label, meaning in STATES if by_state.get(s)]
    world = analysis.job.world_size
    note = (f"World size {world}." if world else
            "World size unknown: ranks 0 to the highest rank seen are shown.")
    if folded and any(r.band for r in rows):
        note += " Runs of full rows in one state are folded into one bar."
    return GridView(rows=rows, legend=legend, size=size, total=n, note=note)


_STATE_LABEL = {s: label for s, label, _ in STATES}


def _fold_rows(rows: list[GridRow], cols: int) -> list[GridRow]:
    """Fold runs of full, single-state rows into one bar each (bounded size past 8192 ranks)."""
    out: list[GridRow] = []
    run: list[GridRow] = []

    def flush() -> None:
        if len(run) >= 2:
            lo, hi = run[0].cells[0].rank, run[-1].cells[-1].rank
            state = run[0].cells[0].state
            out.append(GridRow(f"{lo}–{hi}", [], Cell(
                lo, state, f"ranks {lo}-{hi} · {_STATE_LABEL[state]} ({hi - lo + 1})")))
        else:
            out.extend(run)
        run.clear()

    for row in rows:
        states = {c.state for c in row.cells}
        uniform = len(row.cells) == cols and len(states) == 1
        if uniform and run and run[0].cells[0].state in states:
            run.append(row)
            continue
        flush()
        if uniform:
            run.append(row)
        else:
            out.append(row)
    flush()
    return out
