"""ddp-autopsy: which rank hung or killed a PyTorch distributed job, what it was doing, and why."""

__version__ = "0.1.0"
