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


# What a person's "my <attribute> is ..." says, by the attribute's words (one rule for every extractor).
RELATION_WORDS = frozenset({
    "wife", "husband", "partner", "spouse", "fiance", "fiancee", "girlfriend", "boyfriend", "brother", "sister",
    "sibling", "mother", "mum", "mom", "father", "dad", "parent", "son", "daughter", "child", "kid", "baby",
    "grandmother", "grandma", "grandfather", "grandpa", "grandson", "granddaughter", "cousin", "uncle", "aunt",
    "niece", "nephew", "boss", "manager", "friend", "colleague", "coworker", "roommate", "flatmate", "neighbour",
    "neighbor", "doctor", "dentist", "therapist", "teacher", "landlord", "pet", "dog", "cat",
})
PREFERENCE_WORDS = ("favourite", "favorite", "preferred", "preference")


def attribute_fact_type(attribute):
    """The fact type of "my <attribute> is ...", or None when its words say neither.

    "relationship" when the attribute names someone (or a pet) the person is related to ("my sister",
    "my best friend", "my older brother's name"); "user_preference" when it says what they prefer.
    """
    words = normalize(attribute).replace("'s", "").split()
    if any(p in w for w in words for p in PREFERENCE_WORDS):  # "my favourite dog breed": a preference
        return "user_preference"
    if any(w in RELATION_WORDS or w.rstrip("s") in RELATION_WORDS for w in words):
        return "relationship"
    return None
