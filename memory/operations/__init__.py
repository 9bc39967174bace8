"""Memory over time and for operators: listing and deleting (operators), forgetting a person (erasure,
erasure_scan, tombstones), clearing, limits and pruning, consolidation, promotion, export and import
(transfer), and health.
"""
