"""The memory itself: facts, episodes, users, procedures, LangGraph store items and fact history.

Each concern is a class built with the collaborators it names; MemoryService (memory.service) builds
them and is the one object callers use. The rules they share: owner keys (owners), input checks
(validation), the per-person lock (persons), buffered access counts (access).
"""
