"""bench.extraction: LoCoMo's first conversation fed turn by turn through `MemoryService.observe`.

    python -m bench.extraction [--mode keyword|hybrid] [--database-url URL] [--json]   the benchmark (__main__.py)
    python -m bench.extraction.make_script [LOCOMO_JSON]                               writes script.json

The chat model is scripted (LangChain's generic fake answering with tool calls): its proposals and
decisions are read from `script.json`, made once by `make_script` from LoCoMo's session
observations, each observation proposed at the turn its `dia_id` evidence cites. So the pipeline
(recall of candidates, checks, the service's writes) is measured, not a model.
"""
