"""Conversations across runs: threads, turns, the checkpointer and its checkpoints, reminders, upkeep."""
