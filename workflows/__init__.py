"""Engram's workflows: LangGraph nodes, tools, checkpointer, runtime and triggers over the memory."""
