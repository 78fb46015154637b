"""Ranks that died: exceptions, signals, exit codes, out-of-memory."""
