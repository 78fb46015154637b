"""collectors."""
