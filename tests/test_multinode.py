"""Multi-node: one collect per node, bundles merged at analysis time.

Two torchrun agents on this host form a real 2-node job (``--nnodes 2``, static rendezvous on
127.0.0.1); each "node" is collected separately, as `srun --ntasks-per-node=1 ddp-autopsy
collect` would, and the two bundles are analyzed together."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from collect_helpers import free_port, wait_for

from ddp_autopsy.analyzer.job import load
from ddp_autopsy.collectors import CollectOptions, collect
from ddp_autopsy.demo import stop_job
from ddp_autopsy.rules.engine import run

SCRIPT = Path(__file__).parent / "multinode" / "two_node_hang.py"


@pytest.mark.scenario
def test_two_bundles_merge_into_one_job(tmp_path: Path) -> None:
    port = free_port()
    agents, consoles = [], []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        for node in (0, 1):
            console = tmp_path / f"node{node}.log"
            consoles.append(console)
            with console.open("wb") as out:
                agents.append(subprocess.Popen(
                    [sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                     "--nproc-per-node=2", f"--node-rank={node}", "--master-addr=127.0.0.1",
                     f"--master-port={port}", str(SCRIPT)],
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                    start_new_session=True))

        def ready() -> bool:
            text = "".join(c.read_text(errors="replace") for c in consoles)
            return all(f"READY rank={r}" in text for r in range(4))

        assert wait_for(ready, timeout=90), "".join(c.read_text() for c in consoles)[-3000:]
        time.sleep(1.0)  # READY is printed just before the call that blocks: let them get there
        bundles = []
        for node, agent in enumerate(agents):
            res = collect(CollectOptions(pid=agent.pid, out=tmp_path / f"bundle-node{node}",
                                         logs=[consoles[node]], deadline_s=60))
            bundles.append(res.bundle)
    finally:
        for agent in agents:
            stop_job(agent, grace_s=10)

    job = load(bundles)
    assert sorted(job.ranks["rank"].to_list()) == [0, 1, 2, 3]
    assert job.ranks["has_stack"].all()
    assert job.world_size == 4
    verdict = run(job).verdict
    assert verdict is not None and verdict.cause == "rank_stuck_outside_collective"
    assert verdict.ranks == [3] and "save_checkpoint" in verdict.summary
    # Each bundle alone sees only its node: node 0 cannot name the culprit from stacks.
    alone = run(load([bundles[0]])).verdict
    assert alone is None or alone.ranks != [3]
