"""Multi-node: one collect per node, bundles merged at analysis time.

Two torchrun agents on this host form a real 2-node job (``--nnodes 2``, static rendezvous on
127.0.0.1); each "node" is collected separately by the CLI, as `srun --ntasks-per-node=1
ddp-autopsy collect` would (node 1 as a tarball, as the kubectl recipe makes), and the two
bundles are analyzed together. Where UTS namespaces are allowed (root), each node's agent and
its collect run under their own host name, so the nodes really look like two machines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from collect_helpers import free_port, wait_for

from ddp_autopsy.analyzer.job import load
from ddp_autopsy.demo import stop_job
from ddp_autopsy.rules.engine import run

SCRIPT = Path(__file__).parent / "multinode" / "two_node_hang.py"


HOSTS = ("node-a", "node-b")


def _own_hostname_works() -> bool:
    try:
        out = subprocess.run(["unshare", "--uts", "sh", "-c", "hostname node-x && hostname"],
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and out.stdout.strip() == "node-x"


def _as_host(host: str | None, argv: list[str]) -> list[str]:
    """``argv`` run under its own host name (a UTS namespace) when ``host`` is given."""
    if host is None:
        return argv
    return ["unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$@"', "sh", *argv]


@pytest.mark.scenario
def test_two_bundles_merge_into_one_job(tmp_path: Path) -> None:
    port = free_port()
    agents, consoles = [], []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    hosts: tuple[str | None, ...] = HOSTS if _own_hostname_works() else (None, None)
    try:
        for node in (0, 1):
            console = tmp_path / f"node{node}.log"
            consoles.append(console)
            with console.open("wb") as out:
                agents.append(subprocess.Popen(
                    _as_host(hosts[node], [
                        sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                        "--nproc-per-node=2", f"--node-rank={node}", "--master-addr=127.0.0.1",
                        f"--master-port={port}", str(SCRIPT)]),
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                    start_new_session=True))

        def ready() -> bool:
            text = "".join(c.read_text(errors="replace") for c in consoles)
            return all(f"READY rank={r}" in text for r in range(4))

        assert wait_for(ready, timeout=90), "".join(c.read_text() for c in consoles)[-3000:]
        time.sleep(1.0)  # READY is printed just before the call that blocks: let them get there
        bundles = []
        for node, agent in enumerate(agents):
            out_dir = tmp_path / f"bundle-node{node}"
            cmd = [sys.executable, "-m", "ddp_autopsy", "collect", "--pid", str(agent.pid),
                   "--out", str(out_dir), "--logs", str(consoles[node]), "--deadline", "60",
                   "--format", "json", *(["--tar"] if node == 1 else [])]
            res = subprocess.run(_as_host(hosts[node], cmd), capture_output=True, text=True,
                                 timeout=120, check=False)
            assert res.returncode == 0, res.stderr
            bundles.append(Path(json.loads(res.stdout)["tarball"] if node == 1 else out_dir))
    finally:
        for agent in agents:
            stop_job(agent, grace_s=10)

    assert bundles[1].name.endswith(".tar.gz")
    job = load(bundles)
    assert sorted(job.ranks["rank"].to_list()) == [0, 1, 2, 3]
    assert job.ranks["has_stack"].all()
    assert job.world_size == 4
    verdict = run(job).verdict
    assert verdict is not None and verdict.cause == "rank_stuck_outside_collective"
    assert verdict.ranks == [3] and "save_checkpoint" in verdict.summary
    if hosts[0] is not None:
        by_rank = {r["rank"]: r["hosts"] for r in job.ranks.iter_rows(named=True)}
        assert by_rank == {0: ["node-a"], 1: ["node-a"], 2: ["node-b"], 3: ["node-b"]}
        assert verdict.hosts == ["node-b"]
    # The bundles side by side in one directory (a bundle dir and a tarball): the same job.
    together = tmp_path / "autopsy"
    together.mkdir()
    for b in bundles:
        b.rename(together / b.name)
    job2 = load([together])
    assert len(job2.bundles) == 2 and sorted(job2.ranks["rank"].to_list()) == [0, 1, 2, 3]
    verdict2 = run(job2).verdict
    assert verdict2 is not None and verdict2.ranks == [3] and verdict2.cause == verdict.cause
    bundles = [together / b.name for b in bundles]
    # Each bundle alone sees only its node: node 0 cannot name the culprit from stacks.
    alone = run(load([bundles[0]])).verdict
    assert alone is None or alone.ranks != [3]
