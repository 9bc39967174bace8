"""The definition language of a workflow: its JSON schema and compilation, the node-type registry, the state."""
