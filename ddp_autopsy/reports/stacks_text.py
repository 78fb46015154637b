"""The merged stack tree in the terminal (rich): where every rank is, at a glance.

Same structure as the HTML report's tree (:mod:`ddp_autopsy.analyzer.stacktree`): one branch per
group of processes that share a run of frames, outermost frame first, labelled with rank ranges;
outlier branches are marked. Frame, file, thread and host names are printed as plain text, never as
markup, with control characters escaped (:func:`termsafe`).

>>> import io
>>> from rich.console import Console
>>> from ddp_autopsy.analyzer.stacktree import build
>>> import polars as pl
>>> from ddp_autopsy.analyzer.stacks import STACK_SCHEMA
>>> rows = [dict(source=f"r{r}", host="n1", pid=r, rank=r, local_rank=r, thread_id=r,
...              thread_name="MainThread", idle=True, owns_gil=False, depth=d, func=f,
...              file="train.py", line=ln)
...         for r in range(3)
...         for d, (f, ln) in enumerate([("evaluate" if r == 2 else "step", 9), ("main", 5)])]
>>> out = io.StringIO()
>>> tree = build(pl.DataFrame(rows, schema=STACK_SCHEMA))
>>> render(Console(file=out, width=80, color_system=None), tree)
>>> print(out.getvalue().rstrip())
Where the ranks are: 3 processes in 2 distinct stacks
Outlier: rank 2 in evaluate (train.py:9)
ranks 0-2  3
    main  train.py:5
├── ranks 0-1  2
│       step  train.py:9
│       ● 2 here (2 idle)
└── rank 2  1  OUTLIER
        evaluate  train.py:9
        ● 1 here, evaluation (1 idle)
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text
from rich.tree import Tree

from ddp_autopsy.analyzer.stacktree import (
    Frame,
    Node,
    StackTree,
    is_collective,
    is_library,
    who,
)
from ddp_autopsy.reports.termsafe import termsafe

MAX_CHILDREN = 8
RUN_HEAD, RUN_TAIL = 2, 4
MAX_NATIVE = 6  # native frames shown beneath a node's innermost Python frame
WIDE = 4096  # piped output: the width the tree is laid out in (lines are not padded to it)


def _frame_line(f: Frame) -> Text:
    style = "bold cyan" if is_collective(f) else "dim" if is_library(f) else "bold"
    line = Text(termsafe(f.func), style=style)
    loc = f"{f.file}:{f.line}" if f.line is not None else (f.file or "")
    line.append(termsafe(f"  {loc}" + ("  [native]" if f.native else "")), style="dim")
    return line


def _label(tree: StackTree, node: Node, wrap: bool = True) -> Text:
    # Piped (wrap False): a label's lines are never broken, whatever the width, so that a
    # frame stays one line for grep and for people reading a CI log.
    head = Text(no_wrap=not wrap, overflow="ignore" if not wrap else None)
    if node.thread:
        head.append(termsafe(f'thread "{node.thread}" · '), style="italic")
    head.append(termsafe(node.label), style="bold red" if node.outlier else "bold")
    head.append(f"  {node.count}", style="dim")
    if node.outlier:
        head.append("  OUTLIER", style="bold red")
    frames = list(node.frames)
    # Native frames below the node's innermost Python frame are shown beneath it, whatever
    # the run's length, so that a long run never hides the Python frame behind libc.
    py = [i for i, f in enumerate(frames) if not f.native]
    cut = py[-1] + 1 if py else 0
    frames, beneath = frames[:cut], frames[cut:]
    lines: list[Text] = []
    if len(frames) > RUN_HEAD + RUN_TAIL + 1:
        lines += [_frame_line(f) for f in frames[:RUN_HEAD]]
        lines.append(Text(f"… {len(frames) - RUN_HEAD - RUN_TAIL} more frames …", style="dim"))
        lines += [_frame_line(f) for f in frames[-RUN_TAIL:]]
    else:
        lines += [_frame_line(f) for f in frames]
    if len(beneath) > MAX_NATIVE + 1:
        hidden = len(beneath) - MAX_NATIVE
        beneath = beneath[:MAX_NATIVE]
        lines += [_frame_line(f) for f in beneath]
        lines.append(Text(f"… {hidden} more native frames …", style="dim"))
    else:
        lines += [_frame_line(f) for f in beneath]
    if node.ends:
        procs = [tree.procs[m] for m in node.ends]
        ending = [tree.classes[c] for c in node.ending]
        what = ""
        if ending:
            c = ending[0]
            what = f", waiting in {c.collective.func}" if c.collective else \
                f", {c.place}" if c.place else ""
        idle = sum(p.idle for p in procs)
        here = f"● {len(procs)} here{what}" + (f" ({idle} idle)" if idle else "")
        lines.append(Text(termsafe(here), style="red" if node.outlier else "blue"))
    out = head
    for line in lines:
        out.append("\n    ")
        out.append_text(line)
    return out


def _add(tree: StackTree, parent: Tree, node: Node, max_children: int, wrap: bool) -> None:
    branch = parent.add(_label(tree, node, wrap))
    for child in node.children[:max_children]:
        _add(tree, branch, child, max_children, wrap)
    hidden = node.children[max_children:]
    if hidden:
        members = [tree.procs[m] for c in hidden for m in c.members]
        branch.add(Text(termsafe(f"… {len(hidden)} more branches ({who(members)})"), style="dim"))


def renderable(tree: StackTree, max_children: int = MAX_CHILDREN, wrap: bool = True) -> Tree:
    """The tree as a rich renderable (its root line is the summary); ``wrap`` False keeps each
    line whole, however wide (print it with ``crop=False``)."""
    n, k = len(tree.procs), len(tree.classes)
    unit = "process" if n == 1 else "processes"
    top = Tree(Text(f"{n} {unit} in {k} distinct stack{'s' if k != 1 else ''}"),
               hide_root=True, guide_style="dim")
    for child in tree.root.children[:max_children]:
        _add(tree, top, child, max_children, wrap)
    return top


def render(console: Console, tree: StackTree, *, title: str = "Where the ranks are",
           max_children: int = MAX_CHILDREN) -> None:
    """Print the summary, the outliers and the tree (nothing when there are no stacks)."""
    if not tree.procs:
        return
    n, k = len(tree.procs), len(tree.classes)
    unit = "process" if n == 1 else "processes"
    console.print(Text(f"{title}: {n} {unit} in {k} distinct stack{'s' if k != 1 else ''}",
                       style="bold"), soft_wrap=True)
    for c in tree.outliers[:4]:
        where = f"in {c.collective.func}" if c.collective else \
            f"in {c.user_frame}" if c.user_frame else "elsewhere"
        console.print(Text(termsafe(f"Outlier: {c.label} {where}"), style="red"), soft_wrap=True)
    if len(tree.outliers) > 4:
        console.print(Text(f"… and {len(tree.outliers) - 4} more outlier stacks", style="red"))
    wrap = console.is_terminal  # piped: no line of the tree is broken mid-frame
    width = console.width
    if not wrap:  # rich lays a tree out within the console's width: widen it meanwhile
        console.width = WIDE
    try:
        console.print(renderable(tree, max_children, wrap), crop=wrap)
        if tree.threads is not None and tree.threads.procs:
            console.print(Text("Other threads that run or hold the GIL", style="bold"))
            console.print(renderable(tree.threads, max_children, wrap), crop=wrap)
    finally:
        console.width = width
    for role, side in tree.side.items():
        console.print(Text(termsafe(f"{role.capitalize()} processes: {side.label}, "
                                    f"{len(side.classes)} distinct stack(s)"), style="dim"),
                      soft_wrap=True)
