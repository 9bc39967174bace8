"""Signals of the memory app, and the receivers that keep buffered state written."""
from django.core.signals import request_finished
from django.dispatch import Signal, receiver

from .access import access_counter

# Sent inside the merge transaction with `source_id` and `target_id`, so apps that keep their own
# per-user rows (conversation threads) can move them to the surviving user.
users_merged = Signal()


@receiver(request_finished, dispatch_uid="memory_flush_access_counts")
def flush_access_counts(**kwargs):
    access_counter.flush()


# ---- recall: buffered recall events and reference counts are written with the access counts.
from .recall_events import recall_log  # noqa: E402


@receiver(request_finished, dispatch_uid="memory_flush_recall_log")
def flush_recall_log(**kwargs):
    recall_log.flush()
