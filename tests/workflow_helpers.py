"""Helpers of the workflow tests: run the demo as a chat user, read a thread's checkpoints from the saver."""

from workflows.conversations.checkpointer import get_checkpointer
from workflows.graph.runtime import run_workflow


def talk(workflow, user, text="hello", **payload):
    """One chat run of `workflow` by `user` (a chat user id) saying `text`; extra payload keys as given."""
    return run_workflow(workflow, {"type": "chat", "payload": {"user_id": user, "message": text, **payload}})


def saved(thread_id):
    """A thread's root checkpoints, newest first, through the saver's public `list`."""
    return list(get_checkpointer().list({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}))
