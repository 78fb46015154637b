"""The ``collect`` half of ddp-autopsy: snapshot a hung job on this host into a bundle.

>>> from ddp_autopsy.collectors import collect, CollectOptions
>>> result = collect(CollectOptions(pid=4242))          # doctest: +SKIP
>>> result.bundle, result.warnings                       # doctest: +SKIP

The bundle layout is a contract with the analyzer; see ``docs/bundle.md``.
"""

from ddp_autopsy.collectors.collect import CollectOptions, CollectResult, collect, collect_job
from ddp_autopsy.collectors.jobs import CollectError, JobCandidate, Member, find_jobs, job_for_pid

__all__ = [
    "CollectError",
    "CollectOptions",
    "CollectResult",
    "JobCandidate",
    "Member",
    "collect",
    "collect_job",
    "find_jobs",
    "job_for_pid",
]
