"""The builder's HTTP API: workflows, node types, validation, runs and their streams, the builder page."""
