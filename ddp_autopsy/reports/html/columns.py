"""A compact, lossless columnar form for the big per-rank lists of the embedded analysis.

At 4096 ranks ``ranks.table`` is most of the report's weight as rows of JSON objects (every key
repeated, the same state, frame and file 4096 times). In the report's embedded copy it and
``ranks.known`` are stored by column instead, each column in the shortest of three encodings:

- ``{"runs": [[value, count], ...]}``: each value repeated ``count`` times;
- ``{"seq": [[start, step, count], ...]}``: integers ``start, start + step, ...``;
- ``{"diff": [[head, tail, middle] | null, ...]}``: strings, each as its difference from the
  previous string of the column (``""`` after a null): the first ``head`` and the last ``tail``
  characters of the previous string around ``middle``.

>>> rows = [{"rank": r, "state": "failed", "line": f"[rank{r}] timeout"} for r in range(3)]
>>> table = encode(rows)
>>> table["columns"]["rank"], table["columns"]["state"]
({'seq': [[0, 1, 3]]}, {'runs': [['failed', 3]]})
>>> table["columns"]["line"]
{'diff': [[0, 0, '[rank0] timeout'], [5, 9, '1'], [5, 9, '2']]}
>>> decode(table) == rows
True
"""

from __future__ import annotations

import json
from typing import Any

ENCODING = "columns/1"


def _runs(values: list[Any]) -> list[list[Any]]:
    out: list[list[Any]] = []
    for v in values:
        if out and out[-1][0] == v and type(out[-1][0]) is type(v):
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return out


def _seq(values: list[Any]) -> list[list[int]] | None:
    if not all(type(v) is int for v in values):
        return None
    out: list[list[int]] = []
    for v in values:
        if out and out[-1][2] == 1:
            out[-1][1] = v - out[-1][0]
            out[-1][2] = 2
        elif out and out[-1][0] + out[-1][1] * out[-1][2] == v:
            out[-1][2] += 1
        else:
            out.append([v, 0, 1])
    return out


def _diff(values: list[Any]) -> list[list[Any] | None] | None:
    if not all(v is None or isinstance(v, str) for v in values):
        return None
    out: list[list[Any] | None] = []
    prev = ""
    for v in values:
        if v is None:
            out.append(None)
            prev = ""
            continue
        head = 0
        limit = min(len(prev), len(v))
        while head < limit and prev[head] == v[head]:
            head += 1
        tail = 0
        while tail < limit - head and prev[-1 - tail] == v[-1 - tail]:
            tail += 1
        out.append([head, tail, v[head:len(v) - tail]])
        prev = v
    return out


def _size(obj: Any) -> int:
    return len(json.dumps(obj, ensure_ascii=False, default=str))


def encode(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Rows of one shape (the keys of the first) as columns, each in its shortest encoding."""
    names = list(rows[0]) if rows else []
    columns: dict[str, Any] = {}
    for name in names:
        values = [r.get(name) for r in rows]
        options: list[dict[str, Any]] = [{"runs": _runs(values)}]
        seq = _seq(values)
        if seq is not None:
            options.append({"seq": seq})
        diff = _diff(values)
        if diff is not None:
            options.append({"diff": diff})
        columns[name] = min(options, key=_size)
    return {"encoding": ENCODING, "length": len(rows), "columns": columns}


def _expand(column: dict[str, Any]) -> list[Any]:
    if "runs" in column:
        return [v for v, n in column["runs"] for _ in range(n)]
    if "seq" in column:
        return [start + step * i for start, step, n in column["seq"] for i in range(n)]
    out: list[Any] = []
    prev = ""
    for d in column["diff"]:
        if d is None:
            out.append(None)
            prev = ""
            continue
        head, tail, middle = d
        prev = prev[:head] + middle + (prev[len(prev) - tail:] if tail else "")
        out.append(prev)
    return out


def decode(table: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows back, keys in their original order."""
    if table.get("encoding") != ENCODING:
        raise ValueError(f"not a {ENCODING} table: {table.get('encoding')!r}")
    cols = {name: _expand(c) for name, c in table["columns"].items()}
    n = table["length"]
    if any(len(v) != n for v in cols.values()):
        raise ValueError("a column's length differs from the table's")
    return [{name: cols[name][i] for name in cols} for i in range(n)]


#: The lists of the analysis (``ddp-autopsy/analysis/1``) stored by column in the report.
COLUMNAR = (("ranks", "table"), ("ranks", "known"))


def compact(data: dict[str, Any]) -> dict[str, Any]:
    """The analysis with its per-rank lists stored by column (a shallow copy)."""
    return _each_columnar(data, list, encode)


def expand(data: dict[str, Any]) -> dict[str, Any]:
    """The report's embedded analysis back in the ``ddp-autopsy/analysis/1`` form."""
    return _each_columnar(data, dict, decode)


def _each_columnar(data: dict[str, Any], form: type, convert: Any) -> dict[str, Any]:
    """A shallow copy of ``data`` with ``convert`` applied to each COLUMNAR part in ``form``."""
    out = dict(data)
    for outer, inner in COLUMNAR:
        part = out.get(outer)
        if isinstance(part, dict) and isinstance(part.get(inner), form):
            out[outer] = {**part, inner: convert(part[inner])}
    return out
