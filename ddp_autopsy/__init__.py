"""ddp-autopsy: which rank hung or killed a PyTorch distributed job, what it was doing, and why.

The Python API (docs/api.md) is loaded on first use, so that ``import ddp_autopsy`` and
``ddp-autopsy --help`` stay light: ``ddp_autopsy.analyze``, ``ddp_autopsy.collect``,
``ddp_autopsy.Analysis``, ``ddp_autopsy.AnalysisError`` come from ``ddp_autopsy.api``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["Analysis", "AnalysisError", "__version__", "analyze", "collect"]

_API = ("Analysis", "AnalysisError", "analyze", "collect")

if TYPE_CHECKING:
    from ddp_autopsy.api import Analysis, AnalysisError, analyze, collect


def __getattr__(name: str) -> Any:
    if name in _API:
        from ddp_autopsy import api

        return getattr(api, name)
    raise AttributeError(f"module 'ddp_autopsy' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
