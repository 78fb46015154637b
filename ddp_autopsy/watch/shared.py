"""Watchers of one job on several nodes meet through a shared directory (never the job's store).

Layout of ``--shared-dir DIR``::

    DIR/nodes/<node>.json          each watcher's heartbeat: node, pid, job key, last_seen
    DIR/triggers/<id>.json         one file per trigger: id, node, reason, created
    DIR/<id>/<node>/               the bundle each node collected for trigger <id>

A watcher that declares a hang creates a trigger file (``O_EXCL``); every watcher polls
``triggers/`` at each tick and collects into ``DIR/<id>/<its node>/`` for each trigger it has
not handled yet. Triggers made before a watcher started are not its business. The node that
triggered waits (bounded) for the bundles of the nodes that were alive, then analyzes them all.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

HEARTBEAT_S = 5.0
ALIVE_S = 30.0  # a node whose heartbeat is older is not waited for


class Meeting:
    def __init__(self, root: Path, node: str, job_key: str | None) -> None:
        self.root, self.node, self.job_key = root, node, job_key
        self.started = time.time()
        self.handled: set[str] = set()
        self._beat = 0.0
        for sub in ("nodes", "triggers"):
            (root / sub).mkdir(parents=True, exist_ok=True)

    def heartbeat(self, now: float | None = None, force: bool = False) -> None:
        now = now if now is not None else time.time()
        if not force and now - self._beat < HEARTBEAT_S:
            return
        self._beat = now
        _write_json(self.root / "nodes" / f"{_safe(self.node)}.json",
                    {"node": self.node, "pid": os.getpid(), "job": self.job_key,
                     "last_seen": now})

    def trigger(self, reason: str) -> str:
        """Create a trigger; returns its id (handled by this node already)."""
        created = time.time()
        base = time.strftime("%Y%m%d-%H%M%S", time.gmtime(created)) + f"-{_safe(self.node)}"
        tid, n = base, 1
        while True:
            try:
                fd = os.open(self.root / "triggers" / f"{tid}.json",
                             os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                break
            except FileExistsError:
                tid, n = f"{base}-{n}", n + 1
        with os.fdopen(fd, "w") as fh:
            json.dump({"id": tid, "node": self.node, "reason": reason, "created": created,
                       "job": self.job_key}, fh)
        self.handled.add(tid)
        return tid

    def pending(self) -> list[dict[str, Any]]:
        """Triggers made since this watcher started that it has not handled, oldest first."""
        out = []
        try:
            names = sorted(os.listdir(self.root / "triggers"))
        except OSError:
            return []
        for name in names:
            tid = name.removesuffix(".json")
            if not name.endswith(".json") or tid in self.handled:
                continue
            try:
                data = json.loads((self.root / "triggers" / name).read_text())
            except (OSError, ValueError):
                continue  # being written: next tick
            self.handled.add(tid)
            if isinstance(data, dict) and float(data.get("created", 0)) >= self.started - 1:
                out.append(data)
        return out

    def recent(self, within: float) -> str | None:
        """A trigger handled here in the last ``within`` seconds (the hang is already collected)."""
        now = time.time()
        for tid in sorted(self.handled, reverse=True):
            try:
                data = json.loads((self.root / "triggers" / f"{tid}.json").read_text())
            except (OSError, ValueError):
                continue
            if now - float(data.get("created", 0)) <= within:
                return tid
        return None

    def bundle_dir(self, tid: str) -> Path:
        return self.root / tid / _safe(self.node)

    def live_nodes(self) -> list[str]:
        now, out = time.time(), []
        for path in (self.root / "nodes").glob("*.json"):
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(path.read_text())
                if now - float(data.get("last_seen", 0)) <= ALIVE_S:
                    out.append(str(data.get("node")))
        return sorted(out)

    def wait_for_bundles(self, tid: str, timeout: float) -> list[Path]:
        """The complete bundles of trigger ``tid`` once every live node wrote one (or at the
        timeout: whatever is there)."""
        end = time.monotonic() + timeout
        expected = set(map(_safe, self.live_nodes())) | {_safe(self.node)}
        while True:
            done = {p.name for p in (self.root / tid).glob("*") if _complete(p)}
            if expected <= done or time.monotonic() >= end:
                return sorted(p for p in (self.root / tid).glob("*")
                              if (p / "manifest.json").is_file())
            time.sleep(0.5)


def _complete(bundle: Path) -> bool:
    try:
        man = json.loads((bundle / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(man.get("complete")) or bool(man.get("watch"))


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "node"


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
