"""Engram on several machines: `python -m bench.cluster` (trials.py) and the trials it runs."""
