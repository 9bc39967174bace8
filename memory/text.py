"""Text normalisation shared by indexing and search: one place decides what "matches" means."""
import json
import re

_SEPARATORS = re.compile(r"[\s_\-]+")


def normalize(text):
    """Lower-case, with runs of spaces, underscores and hyphens read as one space."""
    return _SEPARATORS.sub(" ", str(text).lower()).strip()


def value_text(value):
    """A fact value as plain text: strings as they are, anything else as canonical JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def fact_search_text(key, value):
    return normalize(f"{key} {value_text(value)}")


def search_tokens(query):
    """The words a search must find, in the normalised form stored in `search_text`."""
    return normalize(query).split()
