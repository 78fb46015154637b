"""Symptoms: what every rank reports when another rank failed."""
