"""How the memory learns from what happened: consolidation (episodes into facts), observation (a turn
into facts, reconciled with what is stored), promotion (what recall keeps returning into durable facts),
procedure learning (procedures from repeated runs) and compaction (old episodes into summaries).
Reached through MemoryService (memory/operations/lifecycle.py)."""
