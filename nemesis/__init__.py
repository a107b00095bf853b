"""Fault injection and the harness CLI (`python -m nemesis ...`)."""
