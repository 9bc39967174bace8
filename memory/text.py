"""Text rules shared by indexing, search and consolidation: one place decides what "matches" means.

Two rules, each defined once: the normal form of substring search (`normalize`: its pieces keep
their punctuation, so "o'brien" and "3.5" match as typed), and the word rule (`words`: runs of
letters and digits) that keyword recall, content words and fact keys are made of.
"""

import json
import re

from django.db.models import Q

_SEPARATORS = re.compile(r"[\s_\-]+")
# A word: a run of letters and digits; underscores and everything else separate words.
_WORD = r"[^\W_]+"
_WORDS = re.compile(_WORD)
_ASCII_WORDS = re.compile(_WORD, re.ASCII)


def normalize(text):
    """Lower-case, with runs of spaces, underscores and hyphens read as one space."""
    return _SEPARATORS.sub(" ", str(text).lower()).strip()


def words(text, *, ascii_only=False):
    """The words of `text`, lower-case, in order; `ascii_only`: of ASCII letters and digits alone (fact keys)."""
    if ascii_only:
        return _ASCII_WORDS.findall((text or "").lower())
    return [w.lower() for w in _WORDS.findall(text or "")]


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


# What a person's "my <attribute> is ..." says, by the attribute's words (one rule for every extractor).
RELATION_WORDS = frozenset(
    {
        "wife",
        "husband",
        "partner",
        "spouse",
        "fiance",
        "fiancee",
        "girlfriend",
        "boyfriend",
        "brother",
        "sister",
        "sibling",
        "mother",
        "mum",
        "mom",
        "father",
        "dad",
        "parent",
        "son",
        "daughter",
        "child",
        "kid",
        "baby",
        "grandmother",
        "grandma",
        "grandfather",
        "grandpa",
        "grandson",
        "granddaughter",
        "cousin",
        "uncle",
        "aunt",
        "niece",
        "nephew",
        "boss",
        "manager",
        "friend",
        "colleague",
        "coworker",
        "roommate",
        "flatmate",
        "neighbour",
        "neighbor",
        "doctor",
        "dentist",
        "therapist",
        "teacher",
        "landlord",
        "pet",
        "dog",
        "cat",
    }
)
PREFERENCE_WORDS = ("favourite", "favorite", "preferred", "preference")


def attribute_fact_type(attribute):
    """The fact type of "my <attribute> is ...", or None when its words say neither.

    "relationship" when the attribute names someone (or a pet) the person is related to ("my sister",
    "my best friend", "my older brother's name"); "user_preference" when it says what they prefer.
    """
    said = normalize(attribute).replace("'s", "").split()
    if any(p in w for w in said for p in PREFERENCE_WORDS):  # "my favourite dog breed": a preference
        return "user_preference"
    if any(w in RELATION_WORDS or w.rstrip("s") in RELATION_WORDS for w in said):
        return "relationship"
    return None


# Question and function words that would match almost every memory; dropped from keyword queries
# unless nothing else is left.
STOPWORDS = frozenset(
    """a about after again all also am an and any are as at be been before being but by can could did do does
    doing done for from had has have having he her here hers him his how i if in into is it its itself just me
    might more most my no nor not now of off on once only or other our ours out over own same she should so
    some such than that the their theirs them then there these they this those through to too under until up
    very was we were what when where which while who whom why will with would you your yours
    i'm tell know please""".split()
)


def content_words(text):
    """The words of `text` that say something (stop words dropped), lower-case, in order."""
    return [w for w in words(text) if w not in STOPWORDS]


def keyword_terms(query, limit=32):
    """The words of a query a keyword index should look for: lower-case, stop words dropped, unique."""
    found = words(query)
    kept = [w for w in found if w not in STOPWORDS] or found
    return list(dict.fromkeys(kept))[:limit]


def clip(text, size):
    """`text` cut to at most `size` characters, ending with "…" where it was cut."""
    return text if len(text) <= size else text[: size - 1] + "…"


MAX_CONCEPTS = 5
MAX_CONCEPT_LENGTH = 40
CONCEPT_TEXT_CHARS = 4000  # of each text: a long conversation's first part names its subject


def concept_tags(*texts, limit=MAX_CONCEPTS):
    """Concept tags of some texts, deterministic: their content words of at least three characters
    (not numbers), the most frequent first, ties in order of first use; at most `limit`."""
    counts, first = {}, {}
    for text in texts:
        for word in content_words(str(text or "")[:CONCEPT_TEXT_CHARS]):
            if len(word) < 3 or len(word) > MAX_CONCEPT_LENGTH or word.isdigit():
                continue
            counts[word] = counts.get(word, 0) + 1
            first.setdefault(word, len(first))
    return sorted(counts, key=lambda w: (-counts[w], first[w]))[:limit]


def fact_concepts(key, value):
    """A fact's concept tags, space-separated (its key's words count as much as its value's)."""
    return " ".join(concept_tags(" ".join(words(key)), value_text(value)))


def episode_concepts(summary, conversation):
    """An episode's concept tags, space-separated: from its summary and its messages."""
    messages = [m.get("content", "") if isinstance(m, dict) else m for m in conversation or []]
    return " ".join(concept_tags(summary or "", *(value_text(m) for m in messages)))


def concept_match(value, field="concepts"):
    """Rows whose space-separated concept tags hold the tag `value` (case-insensitive), as a Q."""
    tag = " ".join(str(value or "").lower().split())
    return (
        Q(**{field: tag})
        | Q(**{f"{field}__startswith": f"{tag} "})
        | Q(**{f"{field}__endswith": f" {tag}"})
        | Q(**{f"{field}__contains": f" {tag} "})
    )
