"""Training: collectives and where ranks are."""
