"""The graph runtime: running a definition, its built-in nodes, the agent and its tools, triggers and run records."""
