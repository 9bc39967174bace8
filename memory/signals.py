"""Signals of the memory app: what other apps hear of and answer for (merges, deletions, exports, pruning).

The receivers that keep buffered state written are connected in MemoryConfig.ready (memory/apps.py)."""

from django.dispatch import Signal

# Sent inside the merge transaction with `source_id` and `target_id`, so apps that keep their own
# per-user rows (conversation threads) can move them to the surviving user.
users_merged = Signal()

# Sent inside the delete transaction, before memory users are deleted with `cascade=True`, with
# `user_ids` (the users asked for and every user merged into them). Apps that keep per-user data
# outside the memory tables (conversation threads and their checkpoints) delete it here; a receiver
# that raises aborts the delete, and nothing is deleted.
users_deleting = Signal()

# Sent by MemoryService.user_footprint with `user_ids`: receivers return {what: count} of what they
# keep for those users (workflows: threads, checkpoints), so a deletion's confirmation and answer
# count everything that goes.
users_footprint = Signal()

# Sent by MemoryService.export_person with `user_ids` (the person and users merged into them):
# receivers return a list of JSON-ready dicts (each with a "kind") of what they keep for them.
person_exporting = Signal()


# Sent by MemoryService.prune() (the `memory prune` command) with `agent_id` (None: every agent) and
# `dry_run`, after the memory tables are pruned, so apps that keep their own growing rows
# (conversation threads and checkpoints, recall events) prune them with the same command.
# A receiver returns {what: rows deleted (or that would be, on a dry run)}; the counts join the report.
prune_requested = Signal()
