"""Engram's memory: facts, episodes, procedures and memory users, answered for by MemoryService."""
