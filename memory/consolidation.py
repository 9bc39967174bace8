"""Public path of the consolidation extractors: `MEMORY["CONSOLIDATION"]["EXTRACTOR"]` names
`memory.consolidation.RuleExtractor` or `memory.consolidation.LLMExtractor`, and projects import them
from here. The code lives in memory.learning.consolidation.
"""

from .learning.consolidation import BaseExtractor, ExtractedFact, LLMExtractor, RuleExtractor, consolidate_after_run

__all__ = ["BaseExtractor", "ExtractedFact", "LLMExtractor", "RuleExtractor", "consolidate_after_run"]
