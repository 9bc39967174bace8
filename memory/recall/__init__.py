"""Recall, a search engine over the memory: ranking (keyword and vector candidates fused), the recall
index's upkeep (indexer, vectors), the memory graph (relations) and the log of what recall returned (events).
"""
