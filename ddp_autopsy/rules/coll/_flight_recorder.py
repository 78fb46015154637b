"""What the Flight Recorder rules share: their input and how their Example becomes dumps."""

from __future__ import annotations

from ddp_autopsy.analyzer.flight_recorder import example_dumps
from ddp_autopsy.rules.base import Rule


class FlightRecorderRule(Rule):
    """Base of the rules over the ``collectives`` frame; not a rule itself."""

    requires = ("collectives",)

    @classmethod
    def example_files(cls) -> dict[str, bytes]:
        """The Example describes dumps one line per rank (``flight_recorder.example_dumps``)."""
        return example_dumps(cls.example())
