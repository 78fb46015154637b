"""The merged stack tree as nested views (analyzer/stacktree.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ddp_autopsy.analyzer import stacktree
from ddp_autopsy.analyzer.stacktree import Node, StackTree
from ddp_autopsy.reports.html.common import (
    MAX_CHILDREN,
    MAX_CLASSES,
    MAX_TREE_NODES,
    RUN_HEAD,
    RUN_TAIL,
    clean,
)


@dataclass
class FrameView:
    func: str
    loc: str
    library: bool
    collective: bool


@dataclass
class NodeView:
    anchor: str | None  # id of the class ending here
    label: str
    count: int
    share: str  # percent of the tree's processes
    outlier: bool
    thread: str | None
    head: list[FrameView]
    folded: list[FrameView]
    tail: list[FrameView]
    here: int
    here_idle: int
    here_what: str
    children: list[NodeView] = field(default_factory=list)
    more: str | None = None  # "… 12 more branches (ranks …)"


@dataclass
class ClassView:
    id: str
    anchor: str | None  # None when its branch is cut from the rendered tree
    label: str
    size: int
    where: str
    place: str | None
    collective: str | None
    outlier: bool
    diverges_at: str | None
    threads: str


@dataclass
class TreeView:
    title: str
    summary: str
    processes: int
    root: list[NodeView]
    classes: list[ClassView]
    more_classes: int
    truncated: bool
    icicle: IcicleView | None = None


@dataclass
class IcicleRect:
    x: float
    y: float
    w: float
    cls: str  # "lib" | "coll" | "user", plus " outlier"
    title: str
    label: str  # the function name, cut to fit ("" when too narrow)


@dataclass
class IcicleView:
    """The merged tree as an icicle: the outermost frame on top, one row per frame depth,
    each frame as wide as its share of processes; the same data as the tree."""

    width: int
    height: int
    rects: list[IcicleRect]
    cut: bool  # rows below ICICLE_MAX_ROWS, or rects under ICICLE_MIN_PX, not drawn


ICICLE_WIDTH, ICICLE_ROW, ICICLE_MAX_ROWS, ICICLE_MIN_PX, ICICLE_MAX_RECTS = 1000, 16, 80, .6, 4000


def icicle_view(tree: StackTree) -> IcicleView | None:
    total = len(tree.procs)
    if total == 0 or not tree.root.children:
        return None
    rects: list[IcicleRect] = []
    cut = False
    depth_max = 0

    def place(node: Node, x: float, depth: int) -> None:
        nonlocal cut, depth_max
        w = ICICLE_WIDTH * node.count / total
        if w < ICICLE_MIN_PX or len(rects) >= ICICLE_MAX_RECTS:
            cut = True
            return
        for i, f in enumerate(node.frames):
            d = depth + i
            if d >= ICICLE_MAX_ROWS:
                cut = True
                return
            kind = "coll" if stacktree.is_collective(f) else \
                "lib" if stacktree.is_library(f) else "user"
            chars = int((w - 6) / 6.6)
            func = clean(f.func, 200)
            rects.append(IcicleRect(
                round(x, 2), d * ICICLE_ROW, round(w, 2),
                kind + (" outlier" if node.outlier else ""),
                f"{clean(str(f), 300)} · {node.label} ({node.count}, "
                f"{_percent(node.count, total)})",
                func if len(func) <= chars else (func[: chars - 1] + "…" if chars >= 4 else "")))
            depth_max = max(depth_max, d + 1)
        child_x = x
        for child in node.children:
            place(child, child_x, depth + len(node.frames))
            child_x += ICICLE_WIDTH * child.count / total

    x = 0.0
    for child in tree.root.children:
        place(child, x, 0)
        x += ICICLE_WIDTH * child.count / total
    return IcicleView(ICICLE_WIDTH, depth_max * ICICLE_ROW, rects, cut)


def _frame_text(f: stacktree.Frame | None) -> str:
    return clean(str(f), 300) if f is not None else ""


def _frame_view(f: stacktree.Frame) -> FrameView:
    loc = f"{f.file}:{f.line}" if f.line is not None else (f.file or "")
    return FrameView(clean(f.func, 200), clean(loc, 300), stacktree.is_library(f),
                     stacktree.is_collective(f))


def tree_view(tree: StackTree, prefix: str, title: str, unit: str = "process") -> TreeView:
    total = max(1, len(tree.procs))
    budget = [MAX_TREE_NODES]
    truncated = False
    rendered: set[str] = set()  # classes whose end node is shown (their table links work)

    def view(node: Node) -> NodeView:
        nonlocal truncated
        budget[0] -= 1
        frames = [_frame_view(f) for f in node.frames]
        if len(frames) > RUN_HEAD + RUN_TAIL + 2:
            head, folded, tail = frames[:RUN_HEAD], frames[RUN_HEAD:-RUN_TAIL], frames[-RUN_TAIL:]
        else:
            head, folded, tail = frames, [], []
        ends = [tree.procs[m] for m in node.ends]
        ending = [tree.classes[c] for c in node.ending]
        what = ""
        if ending:
            c = ending[0]
            what = f"waiting in {c.collective.func}" if c.collective else (c.place or "")
            rendered.add(c.id)
        v = NodeView(
            anchor=f"{prefix}{ending[0].id}" if ending else None, label=node.label,
            count=node.count, share=_percent(node.count, total), outlier=node.outlier,
            thread=clean(node.thread, 120) if node.thread else None,
            head=head, folded=folded, tail=tail, here=len(ends),
            here_idle=sum(p.idle for p in ends), here_what=what,
        )
        shown = node.children[:MAX_CHILDREN]
        for child in shown:
            if budget[0] <= 0:
                truncated = True
                break
            v.children.append(view(child))
        hidden = node.children[len(v.children):]
        if hidden:
            members = [tree.procs[m] for c in hidden for m in c.members]
            v.more = (f"{len(hidden)} more branch{'es' if len(hidden) > 1 else ''} "
                      f"({stacktree.who(members)})")
        return v

    roots = [view(c) for c in tree.root.children[:MAX_CHILDREN]]
    classes = [
        ClassView(
            id=c.id, anchor=f"{prefix}{c.id}" if c.id in rendered else None, label=c.label,
            size=c.size, where=_frame_text(c.user_frame), place=c.place,
            collective=c.collective.func if c.collective else None, outlier=c.outlier,
            diverges_at=_frame_text(c.diverges_at) or None,
            threads=", ".join(clean(t, 80) for t in c.threads),
        )
        for c in tree.classes[:MAX_CLASSES]
    ]
    return TreeView(title=title, summary=_tree_summary(tree, unit),
                    processes=len(tree.procs), root=roots, classes=classes,
                    more_classes=max(0, len(tree.classes) - MAX_CLASSES),
                    truncated=truncated or len(tree.root.children) > MAX_CHILDREN,
                    icicle=icicle_view(tree))


def _percent(n: int, total: int) -> str:
    """``"<1%"`` and ``">99%"`` rather than a rounded 0 or 100 that hides the odd one out."""
    pct = 100 * n / max(total, 1)
    if 0 < pct < 1:
        return "<1%"
    if 99 < pct < 100:
        return ">99%"
    return f"{round(pct)}%"


def _tree_summary(tree: StackTree, unit: str = "process") -> str:
    n, k = len(tree.procs), len(tree.classes)
    if n == 0:
        return "No stacks."
    units = unit + ("es" if unit.endswith("s") else "s")
    text = f"{n} {unit if n == 1 else units} in {k} distinct stack{'s' if k != 1 else ''}."
    big = tree.majority
    if big is not None and k > 1:
        where = (f"waits in {big.collective.func}" if big.collective
                 else f"is in {clean(str(big.user_frame), 200)}" if big.user_frame else "agrees")
        text += f" The largest group, {big.label} ({big.size}), {where}."
    outs = tree.outliers
    if outs:
        parts = []
        for c in outs[:4]:
            at = f"in {c.collective.func}" if c.collective else \
                f"in {clean(str(c.user_frame), 200)}" if c.user_frame else "elsewhere"
            parts.append(f"{c.label} {at}" + (f" ({c.place})" if c.place else ""))
        more = f" and {len(outs) - 4} more" if len(outs) > 4 else ""
        text += f" Outlier{'s' if len(outs) > 1 else ''}: {'; '.join(parts)}{more}."
    return text
