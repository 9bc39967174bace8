"""Engram's workflows: LangGraph graphs over the memory.

The public API: `workflows.langgraph` (nodes, tools and checkpointer for a graph of your own),
`workflows.middleware` (the agent middleware), `workflows.store` (LangGraph's BaseStore).
Inside: `language` (what a definition is), `graph` (running one), `conversations` (what lasts
between runs), `channels` (Telegram and reminder delivery) and `builder` (the builder's HTTP API).
"""
