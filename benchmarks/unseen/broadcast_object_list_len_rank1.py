"""On resume, rank 0 (of 3) broadcasts the run's metadata with ``dist.broadcast_object_list``;
each receiving rank allocates its list as ``[None] * len(fields)``, where ``fields`` lists the
pieces of state the node has a local copy for. Rank 1's node has no sampler-state file, so rank
1 allocates 2 slots while ranks 0 and 2 use 3. ``broadcast_object_list`` first broadcasts the
per-object sizes (one int64 per slot), so rank 1 receives 24 bytes into a 16-byte buffer: Gloo
aborts rank 1 (``terminate called after throwing an instance of 'gloo::EnforceNotMet'`` ...
``Received data size doesn't match expected size. Is there a distributed collective mismatch in
your code?``, SIGABRT); rank 2 receives the metadata and goes on with rank 0 to the first
``all_reduce``, where both wait until torchrun stops them. Python ``logging`` in a custom format
on stdout (``12:00:01 INFO resume[r1]: ...``). torchrun ``--tee 3``.

Truth: collective mismatch on rank 1 (its ``broadcast_object_list`` had a different list
length from the others'). ``rank_crashed`` [1] is accepted too: rank 1 is the rank that died
(SIGABRT) first and the mismatch is named in its own abort message.
"""

LAUNCH = {"launcher": "torchrun", "nproc": 3, "tee": True, "log_dir": True, "timeout_s": 60}
EXPECT = {
    "cause": "collective_mismatch",
    "also": ["rank_crashed"],
    "ranks": [1],
    "frame": "sync_resume_meta",
    "notes": "rank 1 broadcast_object_list with 2 slots, ranks 0, 2 with 3; rank 1 SIGABRT",
}


def local_fields(rank: int) -> list[str]:
    fields = ["run_id", "resume_step"]
    if rank != 1:  # rank 1's node lost its sampler-state file (scratch was wiped)
        fields.append("sampler_state")
    return fields


def sync_resume_meta(rank: int, log: "object") -> list:
    import torch.distributed as dist

    fields = local_fields(rank)
    meta = (["run-7f3a", 1200, {"epoch": 3, "offset": 4096}] if rank == 0
            else [None] * len(fields))
    log.info("syncing resume metadata (%d fields)", len(meta))
    dist.broadcast_object_list(meta, src=0)
    log.info("resume metadata: %s", meta)
    return meta


def main() -> None:
    import logging
    import os
    import sys
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("UNSEEN_TIMEOUT", "10"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    logging.basicConfig(stream=sys.stdout, level=logging.INFO,
                        format=f"%(asctime)s %(levelname)s %(name)s[r{rank}]: %(message)s",
                        datefmt="%H:%M:%S")
    log = logging.getLogger("resume")
    meta = sync_resume_meta(rank, log)
    for step in range(meta[1], meta[1] + 5):
        t = torch.ones(4) * rank
        dist.all_reduce(t)
        log.info("step %d sum %.1f", step, t.sum().item())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
