"""Benchmarks of Engram: each `python -m bench.<name>` prints a table, or one JSON object with --json."""
