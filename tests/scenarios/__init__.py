"""Scenario library: real failing PyTorch distributed jobs on CPU (Gloo). See README.md."""
