"""Facts through MemoryService: scopes, search, write accounting, access counts, validation, constraints."""

import itertools
import math

import pytest
from django.db import IntegrityError, connection, transaction

from memory.conf import memory_settings
from memory.exceptions import InvalidMemoryArgument
from memory.models import ChannelIdentity, Fact, FactType, MemoryUser, Scope

pytestmark = pytest.mark.django_db

AGENT, OTHER_AGENT = "agent-a", "agent-b"
SESSION, OTHER_SESSION = "session-s", "session-t"
SCOPES = ["session", "user", "agent", "global"]  # most specific first
SUBSETS = [c for n in range(1, 5) for c in itertools.combinations(SCOPES, n)]
assert len(SUBSETS) == 15


def write_in(service, scope, key, value, user, **kwargs):
    owner = {
        "session": {"session_id": SESSION},
        "user": {"user_id": user.pk},
        "agent": {"agent_id": AGENT},
        "global": {},
    }[scope]
    return service.set_fact(key, value, scope=scope, **owner, **kwargs)


def viewer(user):
    return {"agent_id": AGENT, "user_id": user.pk, "session_id": SESSION}


def rows_for(facts, key):
    return [f for f in facts if f.key == key]


# ------------------------------------------------------------------ scope resolution


@pytest.mark.parametrize("subset", SUBSETS, ids=["+".join(s) for s in SUBSETS])
def test_most_specific_scope_wins_on_get_search_and_list(service, user_factory, subset):
    user = user_factory()
    for scope in subset:
        write_in(service, scope, "favourite_colour", f"{scope} colour", user)
    expected = f"{subset[0]} colour"  # SUBSETS keep SCOPES order: first = most specific

    got = service.get_fact("favourite_colour", **viewer(user))
    assert got is not None and got.value == expected and got.scope == subset[0]

    found = rows_for(service.search_facts("favourite colour", **viewer(user)), "favourite_colour")
    assert [f.value for f in found] == [expected]

    listed = rows_for(service.list_facts(**viewer(user)), "favourite_colour")
    assert [f.value for f in listed] == [expected]


def test_shadowing_ignores_confidence(service, user_factory):
    user = user_factory()
    service.set_fact("tone", "formal", confidence=1.0)
    service.set_fact("tone", "casual", scope="user", user_id=user.pk, confidence=0.1)
    assert service.get_fact("tone", user_id=user.pk).value == "casual"
    assert [f.value for f in service.search_facts("tone", user_id=user.pk)] == ["casual"]
    assert [f.value for f in service.list_facts(user_id=user.pk)] == ["casual"]


# ------------------------------------------------------------------ isolation


def test_agents_do_not_see_each_others_facts(service):
    service.set_fact("agent_motto", "alpha motto", scope="agent", agent_id=AGENT)
    service.set_fact("agent_motto", "beta motto", scope="agent", agent_id=OTHER_AGENT)
    service.set_fact("only_b_secret", "beta secret", scope="agent", agent_id=OTHER_AGENT)

    assert service.get_fact("agent_motto", agent_id=AGENT).value == "alpha motto"
    assert service.get_fact("only_b_secret", agent_id=AGENT) is None
    assert service.get_fact("agent_motto") is None  # no agent: only global facts
    assert [f.value for f in service.search_facts("motto", agent_id=AGENT)] == ["alpha motto"]
    assert service.search_facts("beta", agent_id=AGENT) == []
    assert [f.value for f in service.list_facts(agent_id=AGENT)] == ["alpha motto"]
    assert sorted(f.value for f in service.list_facts(agent_id=OTHER_AGENT)) == ["beta motto", "beta secret"]


def test_users_do_not_see_each_others_facts(service, user_factory):
    u, v = user_factory(), user_factory()
    service.set_fact("home_city", "Lisbon", scope="user", user_id=u.pk)
    service.set_fact("home_city", "Oslo", scope="user", user_id=v.pk)
    service.set_fact("v_pet", "a cat named Oslo", scope="user", user_id=v.pk)

    assert service.get_fact("home_city", user_id=u.pk).value == "Lisbon"
    assert service.get_fact("v_pet", user_id=u.pk) is None
    assert service.get_fact("home_city") is None
    assert service.search_facts("oslo", user_id=u.pk) == []
    assert [f.value for f in service.search_facts("city", user_id=u.pk)] == ["Lisbon"]
    assert [f.value for f in service.list_facts(user_id=u.pk)] == ["Lisbon"]
    assert sorted(f.key for f in service.list_facts(user_id=v.pk)) == ["home_city", "v_pet"]
    assert [f.value for f in service.user_facts(u.pk)] == ["Lisbon"]


def test_sessions_do_not_see_each_others_facts(service):
    service.set_fact("draft_topic", "taxes", scope="session", session_id=SESSION)
    service.set_fact("draft_topic", "holidays", scope="session", session_id=OTHER_SESSION)
    service.set_fact("t_note", "holidays in june", scope="session", session_id=OTHER_SESSION)

    assert service.get_fact("draft_topic", session_id=SESSION).value == "taxes"
    assert service.get_fact("t_note", session_id=SESSION) is None
    assert service.search_facts("holidays", session_id=SESSION) == []
    assert [f.value for f in service.search_facts("topic", session_id=SESSION)] == ["taxes"]
    assert [f.value for f in service.list_facts(session_id=SESSION)] == ["taxes"]


def test_a_viewer_sees_global_facts_and_its_own_owners_only(service, user_factory):
    u, v = user_factory(), user_factory()
    service.set_fact("k_global", "g")
    service.set_fact("k_agent", "a", scope="agent", agent_id=AGENT)
    service.set_fact("k_other_agent", "b", scope="agent", agent_id=OTHER_AGENT)
    service.set_fact("k_user", "u", scope="user", user_id=u.pk)
    service.set_fact("k_other_user", "v", scope="user", user_id=v.pk)
    service.set_fact("k_session", "s", scope="session", session_id=SESSION)
    service.set_fact("k_other_session", "t", scope="session", session_id=OTHER_SESSION)

    listed = service.list_facts(**viewer(u))
    assert [f.key for f in listed] == ["k_agent", "k_global", "k_session", "k_user"]
    searched = service.search_facts("k", **viewer(u), limit=50)
    assert sorted(f.key for f in searched) == ["k_agent", "k_global", "k_session", "k_user"]


# ------------------------------------------------------------------ shadowing in search


def test_user_fact_shadows_global_fact_in_search(service, user_factory):
    u, other = user_factory(), user_factory()
    service.set_fact("color", "red")
    service.set_fact("color", "blue", scope="user", user_id=u.pk)

    assert service.search_facts("red", user_id=u.pk) == []
    assert [f.value for f in service.search_facts("blue", user_id=u.pk)] == ["blue"]
    found = service.search_facts("red", user_id=other.pk)
    assert [(f.value, f.scope) for f in found] == [("red", "global")]
    assert service.search_facts("blue", user_id=other.pk) == []


# ------------------------------------------------------------------ search semantics


@pytest.mark.parametrize(
    "query",
    [
        "local time",
        "local-time",
        "local_time",
        "LOCAL TIME",
        "time local",
        "  local   time ",
        "lesson_local_time_command",
    ],
)
def test_search_treats_spaces_underscores_and_hyphens_alike(service, query):
    service.set_fact("lesson_local_time_command", "run `date` to print the clock")
    service.set_fact("lesson_remote_shell", "use ssh")
    found = service.search_facts(query)
    assert [f.key for f in found] == ["lesson_local_time_command"]


def test_search_words_must_all_match(service):
    service.set_fact("lesson_local_time_command", "date")
    assert service.search_facts("local weather") == []


def test_search_percent_is_literal(service):
    service.set_fact("score_a", "100% sure")
    service.set_fact("score_b", "1000 points")
    service.set_fact("score_c", "10 percent")
    assert [f.key for f in service.search_facts("100%")] == ["score_a"]
    assert [f.key for f in service.search_facts("%")] == ["score_a"]
    assert sorted(f.key for f in service.search_facts("100")) == ["score_a", "score_b"]


def test_search_underscore_is_a_word_separator_not_a_wildcard(service):
    service.set_fact("snake_case_name", "x")
    service.set_fact("kebab-case-name", "y")
    service.set_fact("snakecase", "z")
    # "_" and "-" separate words: "snake_case" is the words "snake" and "case".
    assert sorted(f.key for f in service.search_facts("snake_case")) == ["snake_case_name", "snakecase"]
    assert [f.key for f in service.search_facts("kebab_case")] == ["kebab-case-name"]
    # As a LIKE wildcard "_" would match any one character; here a query of separators holds no word.
    with pytest.raises(InvalidMemoryArgument) as exc:
        service.search_facts("_")
    assert exc.value.field == "query"
    with pytest.raises(InvalidMemoryArgument):
        service.search_facts(" -_ ")


def test_search_backslash_is_literal(service):
    service.set_fact("home_dir", "C:\\Users\\ann")
    service.set_fact("plain", "Cusers")
    assert [f.key for f in service.search_facts("c:\\users")] == ["home_dir"]
    assert [f.key for f in service.search_facts("\\")] == ["home_dir"]


def test_search_min_confidence(service):
    service.set_fact("alpha_low", "x", confidence=0.3)
    service.set_fact("alpha_mid", "x", confidence=0.6)
    service.set_fact("alpha_high", "x", confidence=0.9)
    assert [f.key for f in service.search_facts("alpha", min_confidence=0.6)] == ["alpha_high", "alpha_mid"]
    assert [f.key for f in service.search_facts("alpha", min_confidence=0.95)] == []
    assert len(service.search_facts("alpha", min_confidence=0.0)) == 3


def test_search_orders_by_confidence_and_respects_limit(service):
    for i, conf in enumerate([0.5, 0.9, 0.1, 0.7, 0.3]):
        service.set_fact(f"item_{i}", "gadget", confidence=conf)
    found = service.search_facts("gadget", limit=2)
    assert [f.confidence for f in found] == [0.9, 0.7]
    assert len(service.search_facts("gadget")) == 5
    assert len(service.search_facts("gadget", limit=1)) == 1


def test_search_default_limit_is_the_setting(service):
    for i in range(memory_settings.SEARCH_LIMIT + 3):
        service.set_fact(f"bulk_{i}", "widget")
    assert len(service.search_facts("widget")) == memory_settings.SEARCH_LIMIT


def test_search_matches_values_not_only_keys(service):
    service.set_fact("pet", "a ginger cat called Marmalade")
    service.set_fact("profile", {"languages": ["Portuguese", "English"], "age": 41})
    assert [f.key for f in service.search_facts("marmalade")] == ["pet"]
    assert [f.key for f in service.search_facts("ginger cat")] == ["pet"]
    assert [f.key for f in service.search_facts("portuguese")] == ["profile"]
    assert [f.key for f in service.search_facts("pet marmalade")] == ["pet"]  # key word + value word


def test_search_short_tokens(service):
    service.set_fact("tz", "UTC+1")
    service.set_fact("ui_lang", "pt")
    service.set_fact("editor", "vim")
    assert [f.key for f in service.search_facts("tz")] == ["tz"]
    assert [f.key for f in service.search_facts("pt")] == ["ui_lang"]
    assert [f.key for f in service.search_facts("ui lang")] == ["ui_lang"]
    assert [f.key for f in service.search_facts("vi")] == ["editor"]
    assert [f.key for f in service.search_facts("tz utc")] == ["tz"]  # a short and an indexable word


def test_search_fact_type_filter(service):
    service.set_fact("drink", "coffee black", fact_type=FactType.USER_PREFERENCE)
    service.set_fact("coffee_origin", "Ethiopia", fact_type=FactType.WORLD_KNOWLEDGE)
    assert [f.key for f in service.search_facts("coffee", fact_type="user_preference")] == ["drink"]
    assert [f.key for f in service.search_facts("coffee", fact_type="world_knowledge")] == ["coffee_origin"]
    assert len(service.search_facts("coffee")) == 2
    with pytest.raises(InvalidMemoryArgument) as exc:
        service.search_facts("coffee", fact_type="opinion")
    assert exc.value.field == "fact_type"


def test_search_a_long_query(service):
    """A whole paragraph as the query (an agent searching with a user's message) still works.

    200 distinct words hold well over 500 distinct trigrams.
    """
    words = [f"w{i:03d}{chr(97 + i % 26)}{chr(97 + (i * 7) % 26)}" for i in range(200)]
    paragraph = " ".join(words)
    service.set_fact("transcript", paragraph)
    service.set_fact("other", "unrelated")
    assert [f.key for f in service.search_facts(paragraph)] == ["transcript"]
    assert service.search_facts(paragraph + " missingword") == []


@pytest.mark.parametrize(
    "query, key",
    [
        ('"hi"', "quote"),
        ("c++", "lang"),
        ("node.js", "runtime"),
        ("a*b", "glob"),
        ("(draft)", "paren"),
        ("NOT disturb", "word_not"),
        ("x AND y", "word_and"),
        ("CRÈME brûlée", "dessert"),
        ("naïve", "dessert_tip"),
    ],
)
def test_search_takes_any_text_literally(service, query, key):
    """Quotes, operators and punctuation in a query are text to find, not search syntax."""
    service.set_fact("quote", 'she said "hi" twice')
    service.set_fact("lang", "C++ and Rust")
    service.set_fact("runtime", "Node.js 20")
    service.set_fact("glob", "pattern a*b matches")
    service.set_fact("paren", "report (draft) v2")
    service.set_fact("word_not", "do NOT disturb")
    service.set_fact("word_and", "X and Y")
    service.set_fact("dessert", "Crème Brûlée")
    service.set_fact("dessert_tip", "a naïve recipe")
    service.set_fact("decoy", "hi there, cpp, nodejs, ab, draft, nothing, xy, creme brulee, naive")
    assert [f.key for f in service.search_facts(query)] == [key]


def test_shadowing_in_search_ignores_the_filters(service, user_factory):
    """A more specific fact hides the global one even when it is itself filtered out."""
    u = user_factory()
    service.set_fact("color", "red", confidence=0.9)
    service.set_fact("color", "blue", scope="user", user_id=u.pk, confidence=0.1)
    assert service.search_facts("color", user_id=u.pk, min_confidence=0.5) == []
    assert service.list_facts(user_id=u.pk, min_confidence=0.5) == []
    assert [f.value for f in service.search_facts("color", min_confidence=0.5)] == ["red"]


LARGE = 2100  # above the SQLite backend's thresholds for a broad word and a large visible set


def fill_large_store(user):
    from memory.text import fact_search_text

    rows = [
        Fact(
            key=f"item_{i:04d}",
            value=f"common thing {i}",
            scope="global",
            confidence=i / LARGE,
            search_text=fact_search_text(f"item_{i:04d}", f"common thing {i}"),
        )
        for i in range(LARGE)
    ]
    Fact.objects.bulk_create(rows, batch_size=500)


def test_search_on_a_large_store(service, user_factory):
    """Broad words over thousands of facts: best first, limited, shadowing kept, owners kept."""
    u, v = user_factory(), user_factory()
    fill_large_store(u)
    # item_2099 is the most confident global item; u holds its own item_2099.
    service.set_fact("item_2099", "common but mine", scope="user", user_id=u.pk, confidence=0.05)
    service.set_fact("item_secret", "common secret of v", scope="user", user_id=v.pk, confidence=1.0)

    found = service.search_facts("common", user_id=u.pk, limit=3)
    assert [(f.key, f.scope) for f in found] == [
        ("item_2098", "global"),
        ("item_2097", "global"),
        ("item_2096", "global"),
    ]
    found = service.search_facts("common", user_id=v.pk, limit=2)
    assert [f.key for f in found] == ["item_secret", "item_2099"]
    found = service.search_facts("common", user_id=u.pk, limit=LARGE + 10)
    assert len(found) == LARGE
    assert [f.value for f in found if f.key == "item_2099"] == ["common but mine"]
    # A short word cannot use the trigram index.
    found = service.search_facts("co", user_id=u.pk, limit=2)
    assert [f.key for f in found] == ["item_2098", "item_2097"]
    # A rare word among broad ones.
    assert [f.key for f in service.search_facts("common 1234", user_id=u.pk)] == ["item_1234"]
    assert [f.key for f in service.search_facts("common mine", user_id=u.pk)] == ["item_2099"]
    assert service.search_facts("common mine", user_id=v.pk) == []


def test_broad_search_returns_exactly_the_best_visible_facts(service, user_factory):
    """A broad word over a large store, owners of every scope, tied confidences, shadowing and
    filters: each search returns exactly what sorting every visible fact would give."""
    import random

    from memory.models import SCOPE_RANK

    rng = random.Random(3)
    u, v = user_factory(), user_factory()
    fill_large_store(u)
    owners = [
        {"scope": "session", "session_id": "s1"},
        {"scope": "session", "session_id": "s2"},
        {"scope": "user", "user_id": u.pk},
        {"scope": "user", "user_id": v.pk},
        {"scope": "agent", "agent_id": "a1"},
        {"scope": "agent", "agent_id": "a2"},
        {"scope": "global"},
    ]
    for i in range(300):
        # Keys overlap the global items, so specific facts shadow some of the most confident ones.
        key = f"item_{rng.choice([rng.randrange(2000, LARGE), rng.randrange(LARGE)])}" if i % 2 else f"own_{i}"
        service.set_fact(
            key,
            f"common {i}",
            **rng.choice(owners),
            confidence=rng.choice([0.2, 0.5, 0.9, 0.95, 1.0]),
            fact_type=rng.choice(["world_knowledge", "user_preference"]),
        )

    def best(viewer, limit, min_confidence, fact_type):
        seen = {"global", f"agent:{viewer['agent_id']}", f"user:{viewer['user_id']}", f"session:{viewer['session_id']}"}
        visible = [f for f in Fact.objects.all() if f.scope_key in seen]
        winner = {}
        for f in visible:
            if f.key not in winner or SCOPE_RANK[f.scope] < SCOPE_RANK[winner[f.key].scope]:
                winner[f.key] = f
        kept = [
            f
            for f in visible
            if winner[f.key] is f and f.confidence >= min_confidence and fact_type in (None, f.fact_type)
        ]
        kept.sort(key=lambda f: (-f.confidence, SCOPE_RANK[f.scope], -f.updated_at.timestamp(), f.id))
        return [f.id for f in kept[:limit]]

    for viewer in [
        {"agent_id": "a1", "user_id": u.pk, "session_id": "s1"},
        {"agent_id": "a2", "user_id": v.pk, "session_id": ""},
        {"agent_id": "", "user_id": None, "session_id": "s2"},
    ]:
        for limit, min_confidence, fact_type in [
            (1, 0.0, None),
            (7, 0.0, None),
            (25, 0.5, None),
            (12, 0.0, "user_preference"),
        ]:
            found = service.search_facts(
                "common", **viewer, limit=limit, min_confidence=min_confidence, fact_type=fact_type
            )
            assert [f.id for f in found] == best(viewer, limit, min_confidence, fact_type), (viewer, limit)


def test_search_bad_queries(service):
    for query, field in [("", "query"), ("   ", "query"), (None, "query"), (42, "query")]:
        with pytest.raises(InvalidMemoryArgument) as exc:
            service.search_facts(query)
        assert exc.value.field == field
    with pytest.raises(InvalidMemoryArgument) as exc:
        service.search_facts("x", limit=0)
    assert exc.value.field == "limit"
    with pytest.raises(InvalidMemoryArgument) as exc:
        service.search_facts("x", min_confidence=2)
    assert exc.value.field == "min_confidence"


def test_list_facts_orders_by_key_and_filters(service):
    service.set_fact("b_key", 1, confidence=0.2)
    service.set_fact("a_key", 2, confidence=0.9, fact_type="user_preference")
    service.set_fact("c_key", 3, confidence=0.5)
    assert [f.key for f in service.list_facts()] == ["a_key", "b_key", "c_key"]
    assert [f.key for f in service.list_facts(min_confidence=0.5)] == ["a_key", "c_key"]
    assert [f.key for f in service.list_facts(fact_type="user_preference")] == ["a_key"]
    assert [f.key for f in service.list_facts(limit=2)] == ["a_key", "b_key"]


# ------------------------------------------------------------------ confirm / contradict accounting


def test_first_write_creates(service):
    write = service.set_fact("city", "Porto", provenance="told by user")
    assert write.action == "created" and write.written
    fact = Fact.objects.get(pk=write.fact.pk)
    assert (fact.value, fact.scope, fact.scope_key, fact.confidence) == ("Porto", "global", "global", 0.8)
    assert (fact.times_confirmed, fact.times_contradicted, fact.provenance) == (0, 0, "told by user")


def test_same_value_confirms(service):
    created = service.set_fact("city", "Porto")
    write = service.set_fact("city", "Porto")
    assert write.action == "confirmed" and write.written
    assert write.fact.pk == created.fact.pk
    fact = Fact.objects.get(pk=created.fact.pk)
    assert fact.times_confirmed == 1 and fact.times_contradicted == 0
    assert fact.confidence == pytest.approx(0.84)  # 0.8 + (1 - 0.8) * 0.2
    assert write.fact.confidence == pytest.approx(0.84)
    service.set_fact("city", "Porto")
    fact.refresh_from_db()
    assert fact.times_confirmed == 2
    assert fact.confidence == pytest.approx(0.872)  # 0.84 + 0.16 * 0.2
    assert Fact.objects.filter(key="city").count() == 1


def test_same_json_value_in_another_key_order_confirms(service):
    service.set_fact("profile", {"a": 1, "b": [1, 2]})
    assert service.set_fact("profile", {"b": [1, 2], "a": 1}).action == "confirmed"


def test_different_value_with_overwrite_updates(service):
    created = service.set_fact("city", "Porto")
    write = service.set_fact("city", "Lisbon", confidence=0.6, fact_type="correction", provenance="corrected")
    assert write.action == "updated" and write.written
    fact = Fact.objects.get(pk=created.fact.pk)
    assert fact.value == "Lisbon"
    assert fact.times_contradicted == 1 and fact.times_confirmed == 0
    assert fact.confidence == pytest.approx(0.6)
    assert (fact.fact_type, fact.provenance) == ("correction", "corrected")
    assert fact.updated_at >= created.fact.updated_at
    assert Fact.objects.filter(key="city").count() == 1


def test_different_value_without_overwrite_is_skipped(service):
    created = service.set_fact("city", "Porto")
    write = service.set_fact("city", "Lisbon", overwrite=False)
    assert write.action == "skipped" and not write.written
    fact = Fact.objects.get(pk=created.fact.pk)
    assert fact.value == "Porto"
    assert fact.times_contradicted == 1 and fact.times_confirmed == 0
    assert fact.confidence == pytest.approx(0.64)  # 0.8 * (1 - 0.2)
    assert service.search_facts("lisbon") == []


def test_writes_to_different_owners_do_not_interact(service, user_factory):
    u = user_factory()
    service.set_fact("city", "Porto")
    write = service.set_fact("city", "Lisbon", scope="user", user_id=u.pk)
    assert write.action == "created"
    assert Fact.objects.get(scope="global", key="city").times_contradicted == 0


# ------------------------------------------------------------------ access counting


def test_reads_count_accesses_only_when_flushed(service, user_factory):
    u = user_factory()
    fact = service.set_fact("city", "Porto", scope="user", user_id=u.pk).fact
    other = service.set_fact("country", "Portugal").fact

    service.get_fact("city", user_id=u.pk)
    service.get_fact("city", user_id=u.pk)
    service.search_facts("porto", user_id=u.pk)
    service.list_facts(user_id=u.pk)  # listing is not an access
    fact.refresh_from_db()
    assert (fact.access_count, fact.last_accessed) == (0, None)

    assert service.flush_access_counts() == 1
    fact.refresh_from_db()
    assert fact.access_count == 3
    assert fact.last_accessed is not None
    other.refresh_from_db()
    assert (other.access_count, other.last_accessed) == (0, None)
    assert service.flush_access_counts() == 0


def test_access_counts_are_written_when_enough_are_pending(service, settings):
    settings.MEMORY = {**settings.MEMORY, "ACCESS_FLUSH_PENDING": 2}
    a = service.set_fact("a_key", "x").fact
    b = service.set_fact("b_key", "x").fact
    service.get_fact("a_key")
    a.refresh_from_db()
    assert a.access_count == 0
    service.get_fact("b_key")  # the second pending fact: the buffer is written
    a.refresh_from_db()
    b.refresh_from_db()
    assert (a.access_count, b.access_count) == (1, 1)


def test_access_counts_are_written_when_a_request_finishes(service, client):
    fact = service.set_fact("a_key", "x").fact
    service.get_fact("a_key")
    service.search_facts("a key")
    client.get("/")
    fact.refresh_from_db()
    assert fact.access_count == 2 and fact.last_accessed is not None


def test_confirm_and_contradict_weights_come_from_settings(service, settings):
    settings.MEMORY = {**settings.MEMORY, "CONFIRM_WEIGHT": 0.5, "CONTRADICT_WEIGHT": 0.5, "DEFAULT_CONFIDENCE": 0.6}
    fact = service.set_fact("city", "Porto").fact
    assert Fact.objects.get(pk=fact.pk).confidence == pytest.approx(0.6)
    service.set_fact("city", "Porto")
    assert Fact.objects.get(pk=fact.pk).confidence == pytest.approx(0.8)
    service.set_fact("city", "Lisbon", overwrite=False)
    assert Fact.objects.get(pk=fact.pk).confidence == pytest.approx(0.4)


def test_a_miss_counts_nothing(service):
    assert service.get_fact("nothing") is None
    assert service.flush_access_counts() == 0


@pytest.mark.parametrize("as_user", [False, True], ids=["global-viewer", "user-viewer"])
def test_get_fact_is_one_query(service, user_factory, django_assert_num_queries, as_user):
    u = user_factory()
    service.set_fact("city", "Porto", scope="user", user_id=u.pk)
    service.set_fact("city", "Lisbon")
    kwargs = {"user_id": u.pk, "agent_id": AGENT, "session_id": SESSION} if as_user else {}
    with django_assert_num_queries(1):
        fact = service.get_fact("city", **kwargs)
    assert fact.value == ("Porto" if as_user else "Lisbon")


# ------------------------------------------------------------------ query counts of writes


def test_set_fact_create_is_two_statements(service, user_factory, capture_data_queries, keyword_only):
    """Lookup and insert, no history row (the fact's row is its current version); a person's fact adds
    the COUNT of their facts (MAX_FACTS_PER_USER), and on PostgreSQL first holds the user against a
    concurrent merge."""
    service.set_fact("city", "Porto", scope="agent", agent_id=AGENT)  # warm up: the first write reads settings
    with capture_data_queries() as q:
        assert service.set_fact("town", "Porto", scope="agent", agent_id=AGENT).action == "created"
    assert len(q.data) == 2, q.data
    u = user_factory()
    with capture_data_queries() as q:
        assert service.set_fact("city", "Porto", scope="user", user_id=u.pk).action == "created"
    assert len(q.data) == (4 if connection.vendor == "postgresql" else 3), q.data
    assert "COUNT" in q.data[-1].upper()
    assert not any("memory_fact_version" in sql for sql in q.data)
    assert service.fact_history(scope="user", user_id=u.pk, key="city")[0].action == "created"


@pytest.mark.parametrize(
    "second, action",
    [(("Porto", True), "confirmed"), (("Lisbon", True), "updated"), (("Lisbon", False), "skipped")],
)
def test_set_fact_second_write_is_three_statements(service, capture_data_queries, second, action, keyword_only):
    """Lookup, the replaced state kept as a version, and the update (one statement on PostgreSQL)."""
    service.set_fact("city", "Porto", scope="agent", agent_id=AGENT)
    value, overwrite = second
    with capture_data_queries() as q:
        assert service.set_fact("city", value, scope="agent", agent_id=AGENT, overwrite=overwrite).action == action
    assert len(q.data) == (2 if connection.vendor == "postgresql" else 3), q.data
    latest = service.fact_history(scope="agent", agent_id=AGENT, key="city")[-1]
    assert (latest.action, latest.value) == (action, "Porto" if action != "updated" else "Lisbon")


# ------------------------------------------------------------------ bad arguments


class NotJson:
    pass


BAD_SET_FACT = [
    ({"scope": "crew"}, "scope"),
    ({"scope": "team"}, "team"),
    ({"scope": "team", "team": "nobody"}, "team"),
    ({"scope": "session"}, "session_id"),
    ({"scope": "session", "session_id": "   "}, "session_id"),
    ({"scope": "user"}, "user_id"),
    ({"scope": "user", "user_id": "7"}, "user_id"),
    ({"scope": "user", "user_id": 0}, "user_id"),
    ({"scope": "agent"}, "agent_id"),
    ({"scope": "agent", "agent_id": ""}, "agent_id"),
    ({"key": ""}, "key"),
    ({"key": "   "}, "key"),
    ({"key": None}, "key"),
    ({"key": "k" * 256}, "key"),
    ({"confidence": -0.1}, "confidence"),
    ({"confidence": 1.5}, "confidence"),
    ({"confidence": math.nan}, "confidence"),
    ({"confidence": math.inf}, "confidence"),
    ({"confidence": True}, "confidence"),
    ({"confidence": "0.5"}, "confidence"),
    ({"value": {1, 2}}, "value"),
    ({"value": NotJson()}, "value"),
    ({"value": math.nan}, "value"),
    ({"value": {"nested": [math.inf]}}, "value"),
    ({"fact_type": "opinion"}, "fact_type"),
]


@pytest.mark.parametrize("overrides, field", BAD_SET_FACT, ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD_SET_FACT)])
def test_bad_arguments_raise_and_write_nothing(service, overrides, field):
    service.set_fact("existing", "kept")
    before = list(Fact.objects.values_list("id", "key", "value", "times_confirmed", "times_contradicted"))
    kwargs = {"key": "existing", "value": "v", "scope": "global", **overrides}
    key, value = kwargs.pop("key"), kwargs.pop("value")
    with pytest.raises(InvalidMemoryArgument) as exc:
        service.set_fact(key, value, **kwargs)
    assert exc.value.field == field
    assert list(Fact.objects.values_list("id", "key", "value", "times_confirmed", "times_contradicted")) == before


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("field", ["user_id", "source_episode_id"])
def test_dangling_ids_raise_and_write_nothing(service, user_factory, field):
    user = user_factory()
    kwargs = {"scope": "user", "user_id": user.pk}
    kwargs[field] = 987654321
    before = Fact.objects.count()
    with pytest.raises(InvalidMemoryArgument) as exc:
        service.set_fact("city", "Porto", **kwargs)
    assert exc.value.field == field
    assert Fact.objects.count() == before


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("field", ["user_id", "source_episode_id"])
def test_dangling_ids_raise_inside_a_callers_transaction(service, user_factory, field):
    """A caller that wraps its work in transaction.atomic() gets the same answer, and nothing written."""
    user = user_factory()
    kwargs = {"scope": "user", "user_id": user.pk}
    kwargs[field] = 987654321
    before = Fact.objects.count()
    with pytest.raises(InvalidMemoryArgument) as exc, transaction.atomic():
        service.set_fact("city", "Porto", **kwargs)
    assert exc.value.field == field
    assert Fact.objects.count() == before


def test_bad_viewer_arguments(service):
    for kwargs, field in [
        ({"user_id": "1"}, "user_id"),
        ({"user_id": True}, "user_id"),
        ({"user_id": -3}, "user_id"),
        ({"agent_id": 5}, "agent_id"),
        ({"session_id": "s" * 129}, "session_id"),
    ]:
        with pytest.raises(InvalidMemoryArgument) as exc:
            service.get_fact("k", **kwargs)
        assert exc.value.field == field
    with pytest.raises(InvalidMemoryArgument) as exc:
        service.get_fact("  ")
    assert exc.value.field == "key"


# ------------------------------------------------------------------ database constraints


def make_fact(**kwargs):
    fields = {"key": "k", "value": "v", "scope": "global", **kwargs}
    return Fact.objects.create(**fields)


def test_db_one_fact_per_owner_and_key(user_factory):
    u = user_factory()
    make_fact(key="city")
    make_fact(key="city", scope="user", user=u)
    make_fact(key="city", scope="agent", agent_id=AGENT)
    with pytest.raises(IntegrityError), transaction.atomic():
        make_fact(key="city")
    with pytest.raises(IntegrityError), transaction.atomic():
        make_fact(key="city", scope="user", user=u)
    with pytest.raises(IntegrityError), transaction.atomic():
        make_fact(key="city", scope="agent", agent_id=AGENT)
    assert Fact.objects.filter(key="city").count() == 3


@pytest.mark.parametrize(
    "fields",
    [
        {"scope": "user"},  # no user
        {"scope": "session"},  # no session id
        {"scope": "agent"},  # no agent id
        {"scope": "global", "agent_id": AGENT},  # global with an owner
        {"scope": "session", "session_id": SESSION, "agent_id": AGENT},  # two owners
        {"scope": "team"},  # unknown scope
        {"scope": "team", "agent_id": AGENT},
        {"confidence": 1.5},
        {"confidence": -0.01},
        {"key": ""},
    ],
    ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()),
)
def test_db_rejects_malformed_facts(fields):
    with pytest.raises(IntegrityError), transaction.atomic():
        make_fact(**fields)
    assert Fact.objects.count() == 0


def test_db_user_fact_needs_a_user():
    with pytest.raises(IntegrityError), transaction.atomic():
        Fact.objects.create(key="k", value="v", scope=Scope.USER, user=None)


def test_db_one_user_per_channel_identity():
    a = MemoryUser.objects.create(canonical_id="a")
    b = MemoryUser.objects.create(canonical_id="b")
    ChannelIdentity.objects.create(user=a, channel="telegram", external_id="42")
    with pytest.raises(IntegrityError), transaction.atomic():
        ChannelIdentity.objects.create(user=b, channel="telegram", external_id="42")
    ChannelIdentity.objects.create(user=b, channel="email", external_id="42")
    assert ChannelIdentity.objects.count() == 2


# ------------------------------------------------------------------ search index upkeep


def test_updating_a_value_updates_search(service, user_factory):
    u = user_factory()
    service.set_fact("drink", "green tea", scope="user", user_id=u.pk)
    assert [f.value for f in service.search_facts("green tea", user_id=u.pk)] == ["green tea"]
    service.set_fact("drink", "espresso", scope="user", user_id=u.pk)
    assert service.search_facts("green tea", user_id=u.pk) == []
    assert service.search_facts("tea", user_id=u.pk) == []
    assert [f.value for f in service.search_facts("espresso", user_id=u.pk)] == ["espresso"]
    assert [f.value for f in service.search_facts("drink", user_id=u.pk)] == ["espresso"]


def test_deleting_a_fact_removes_it_from_search(service):
    fact = service.set_fact("drink", "green tea").fact
    keep = service.set_fact("food", "green curry").fact
    assert len(service.search_facts("green")) == 2
    assert service.delete_fact(fact.pk) is True
    assert [f.pk for f in service.search_facts("green")] == [keep.pk]
    assert service.search_facts("tea") == []
    assert service.get_fact("drink") is None
    assert service.delete_fact(fact.pk) is False


def test_a_deleted_key_can_be_written_again_and_found(service):
    fact = service.set_fact("drink", "green tea").fact
    service.delete_fact(fact.pk)
    assert service.set_fact("drink", "black tea").action == "created"
    assert [f.value for f in service.search_facts("tea")] == ["black tea"]


# ------------------------------------------------------------------ concurrency

WRITERS, WRITES_EACH = 8, 5


@pytest.fixture(params=["agent", "user"])
def owner(request, service, user_factory):
    """Who the writers write for; a user is addressed by its own id and by the id merged into it."""
    if request.param == "agent":
        return lambda n: {"scope": "agent", "agent_id": AGENT}
    old, survivor = user_factory(), user_factory()
    service.merge_users(old.pk, survivor.pk)
    return lambda n: {"scope": "user", "user_id": (old.pk, survivor.pk)[n % 2]}


def concurrent_writes(service, run_in_threads, owner, values_for):
    """WRITERS threads, each on its own connection, write WRITES_EACH times after a common start."""

    def writer(n):
        return [service.set_fact("shared_key", values_for(n, i), **owner(n)).action for i in range(WRITES_EACH)]

    return [action for actions in run_in_threads(writer, WRITERS) for action in actions]


def check_same_value_writers(service, run_in_threads, owner):
    actions = concurrent_writes(service, run_in_threads, owner, lambda n, i: "same value")
    total = WRITERS * WRITES_EACH
    rows = list(Fact.objects.filter(key="shared_key"))
    assert len(rows) == 1
    assert actions.count("created") == 1 and actions.count("confirmed") == total - 1
    assert rows[0].times_confirmed == total - 1 == 39
    assert rows[0].times_contradicted == 0
    expected = 0.8
    for _ in range(total - 1):
        expected += (1.0 - expected) * 0.2
    assert rows[0].confidence == pytest.approx(expected)


def check_alternating_value_writers(service, run_in_threads, owner):
    actions = concurrent_writes(service, run_in_threads, owner, lambda n, i: f"value {(n + i) % 2}")
    total = WRITERS * WRITES_EACH
    rows = list(Fact.objects.filter(key="shared_key"))
    assert len(rows) == 1
    fact = rows[0]
    assert fact.times_confirmed + fact.times_contradicted == total - 1
    assert actions.count("created") == 1
    assert actions.count("confirmed") == fact.times_confirmed
    assert actions.count("updated") == fact.times_contradicted
    assert fact.value in ("value 0", "value 1")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_same_value_writers_postgres(service, run_in_threads, owner):
    check_same_value_writers(service, run_in_threads, owner)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_alternating_writers_postgres(service, run_in_threads, owner):
    check_alternating_value_writers(service, run_in_threads, owner)


@pytest.mark.django_db(transaction=True)
def test_concurrent_same_value_writers(service, run_in_threads, owner):
    """Runs on whichever database the suite uses (SQLite: a WAL file with a busy timeout)."""
    check_same_value_writers(service, run_in_threads, owner)


@pytest.mark.django_db(transaction=True)
def test_concurrent_alternating_writers(service, run_in_threads, owner):
    check_alternating_value_writers(service, run_in_threads, owner)


def test_hand_written_reads_return_the_values_the_orm_does(service, user_factory):
    """get and search skip queryset compiling; their rows must still be what the ORM would build."""
    user = user_factory()
    write = service.set_fact("pet", {"kind": "cat", "age": 3}, scope="user", user_id=user.pk, confidence=0.7)
    service.get_fact("pet", user_id=user.pk)
    service.flush_access_counts()  # last_accessed set, so every datetime column holds a value
    orm = Fact.objects.get(pk=write.fact.pk)
    for fact in (service.get_fact("pet", user_id=user.pk), service.search_facts("cat", user_id=user.pk)[0]):
        for field in Fact._meta.concrete_fields:
            assert getattr(fact, field.attname) == getattr(orm, field.attname), field.name
        assert fact.created_at.tzinfo is not None and fact.last_accessed.tzinfo is not None
        # ... and behave as loaded instances: saved, on this database, with working relations.
        assert (fact._state.adding, fact._state.db) == (False, "default")
        assert fact.user == user
        fact.provenance = "edited"
        fact.save(update_fields=["provenance"])
        assert Fact.objects.get(pk=fact.pk).provenance == "edited"


def test_hand_written_reads_send_init_signals_when_someone_listens(service):
    """A post_init receiver (an ImageField's, a project's own) sees instances built by get and search."""
    from django.db.models.signals import post_init

    service.set_fact("colour", "green")
    seen = []

    def receiver(sender, instance, **kwargs):
        seen.append(instance.key)

    post_init.connect(receiver, sender=Fact)
    try:
        service.get_fact("colour")
        service.search_facts("green")
    finally:
        post_init.disconnect(receiver, sender=Fact)
    assert seen == ["colour", "colour"]


@pytest.mark.parametrize("query", ["a\x00b", "a\ud800b"])
def test_searches_refuse_text_no_database_can_search(service, query):
    """NUL reached SQLite as an OperationalError and PostgreSQL as a DataError; a lone surrogate
    cannot even be encoded. Both are the caller's mistake, named."""
    for search in (service.search_facts, service.recall):
        with pytest.raises(InvalidMemoryArgument) as exc:
            search(query)
        assert exc.value.field == "query"


def test_a_search_of_too_many_words_is_refused_by_name(service):
    """A paragraph is fine (200 words, above); 1,300 words made SQLite refuse the expression (a 500)."""
    with pytest.raises(InvalidMemoryArgument) as exc:
        service.search_facts(" ".join(["ab"] * 1300))
    assert exc.value.field == "query" and "at most 256" in exc.value.message
    with pytest.raises(InvalidMemoryArgument):
        service.search_facts("-".join(["abc"] * 999))  # one "word" to str.split, 999 to the search
