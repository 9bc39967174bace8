"""The operators' REST API of the memory: facts, episodes, procedures and memory users under /api/v1/."""
