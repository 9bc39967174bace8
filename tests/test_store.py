"""EngramStore: LangGraph's BaseStore contract on Engram's memory, its owners, and langmem on top of it."""

import asyncio
import time
import zlib

import numpy as np
import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings
from langchain.agents import create_agent
from langchain_core.embeddings import Embeddings
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langgraph.store.base import GetOp, InvalidNamespaceError, ListNamespacesOp, PutOp, SearchOp
from langgraph.store.memory import InMemoryStore

from memory.backends import reset_backend
from memory.embedding.embedder import get_embedder
from memory.exceptions import InvalidMemoryArgument
from memory.models import Scope, StoreItem
from workflows.store import EngramStore


class LetterEmbeddings(Embeddings):
    """Deterministic: a text's vector counts its letters, so texts sharing letters are close."""

    def _one(self, text):
        return [text.lower().count(chr(c)) + 0.01 for c in range(ord("a"), ord("z") + 1)]

    def embed_documents(self, texts):
        return [self._one(t) for t in texts]

    def embed_query(self, text):
        return self._one(text)


@pytest.fixture
def store(db):
    return EngramStore()


def test_put_get_update_delete(store):
    store.put(("docs",), "a", {"text": "hello"})
    first = store.get(("docs",), "a")
    assert (first.namespace, first.key, first.value) == (("docs",), "a", {"text": "hello"})
    store.put(("docs",), "a", {"text": "again"})
    second = store.get(("docs",), "a")
    assert second.value == {"text": "again"} and second.created_at == first.created_at
    assert second.updated_at >= first.updated_at
    store.delete(("docs",), "a")
    assert store.get(("docs",), "a") is None
    assert store.get(("nowhere",), "a") is None


def test_a_batch_answers_every_op_in_order(store):
    store.put(("a",), "1", {"n": 1})
    results = store.batch(
        [GetOp(("a",), "1"), PutOp(("a",), "2", {"n": 2}), SearchOp(("a",)), ListNamespacesOp(), GetOp(("a",), "9")]
    )
    assert results[0].value == {"n": 1} and results[1] is None and results[4] is None
    assert [i.key for i in results[2]] == ["1"]  # the put of the same batch is applied after its reads
    assert results[3] == [("a",)]
    assert store.get(("a",), "2").value == {"n": 2}


def test_search_filters_with_langgraphs_operators_and_pages(store):
    store.put(("docs", "z"), "spelled", {"tag": '{"colour":"red"}'})  # a string that looks like JSON
    for n in range(6):
        store.put(("docs", "x" if n % 2 else "y"), f"k{n}", {"n": n, "tag": {"colour": "red" if n < 3 else "blue"}})
    assert {i.key for i in store.search(("docs",), filter={"n": {"$gte": 4}})} == {"k4", "k5"}
    assert {i.key for i in store.search(("docs",), filter={"n": {"$ne": 0, "$lt": 2}})} == {"k1"}
    assert {i.key for i in store.search(("docs",), filter={"tag": {"colour": "red"}})} == {"k0", "k1", "k2"}
    assert {i.key for i in store.search(("docs",), filter={"tag.colour": "blue"})} == {"k3", "k4", "k5"}  # dotted
    assert {i.key for i in store.search(("docs", "x"))} == {"k1", "k3", "k5"}
    everything = [i.key for i in store.search(("docs",), limit=100)]
    assert len(everything) == 7 and all(i.score is None for i in store.search(("docs",)))
    assert [i.key for i in store.search(("docs",), limit=2, offset=2)] == everything[2:4]
    assert store.search(("doc",)) == []  # a prefix is whole labels
    # Equality is the value's, not its JSON text's: a nested object never equals a string spelling it.
    # ...and a page of such a filter is made after that check (the newest SQL match is a false one).
    assert [i.key for i in store.search(("docs",), filter={"tag": '{"colour":"red"}'}, limit=1)] == ["spelled"]
    assert {i.key for i in store.search(("docs",), filter={"n": 2.0})} == {"k2"}


def test_a_filter_value_is_data_never_sql_nul_and_quotes_included(store):
    store.put(("docs",), "public", {"access": "public", "title": "O'Brien's"})
    store.put(("docs",), "secret", {"access": "secret"})
    for hostile in ("public' OR '1'='1", "public'; --", "public\x00' OR '1'='1", "''''", {"a": "x\x00"}):
        assert store.search(("docs",), filter={"access": hostile}) == []
    # A NUL no item can hold (PostgreSQL's jsonb refuses it) matches nothing; the rest still filters.
    assert store.search(("docs",), filter={"access": "public\x00"}) == []
    assert [i.key for i in store.search(("docs",), filter={"title": "O'Brien's"})] == ["public"]


def test_on_sqlite_a_filtered_search_reads_the_namespace_index_not_the_table(store):
    """Graphs search their store on every step: items under a namespace come from one covering index
    (migration 0028), not a table row each (a row holding a vector fills half a page)."""
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL filters by jsonb containment on the table")
    for n in range(30):
        store.put(("bench", f"ns{n % 3}", "memories"), f"k{n}", {"tag": "tea" if n % 2 else "chess", "n": n})
    raw, statements = connection.connection, []
    raw.set_trace_callback(statements.append)
    try:
        found = store.search(("bench", "ns1"), filter={"tag": "tea"}, limit=3)
    finally:
        raw.set_trace_callback(None)
    assert [i.key for i in found] == ["k25", "k19", "k13"]  # newest first, ordered by updated_at
    (search,) = [sql for sql in statements if "json_extract" in sql]
    plan = [row[-1] for row in raw.execute("EXPLAIN QUERY PLAN " + search).fetchall()]
    reads = [step for step in plan if step.startswith(("SCAN", "SEARCH"))]
    assert reads and all("COVERING INDEX memory_store_item_under" in step for step in reads), plan


def test_query_search_ranks_by_meaning_with_an_index(db):
    store = EngramStore(index={"dims": 26, "embed": LetterEmbeddings(), "fields": ["text"]})
    store.put(("docs",), "zoo", {"text": "zebra zone"})
    store.put(("docs",), "tea", {"text": "tea time"})
    store.put(("docs",), "hidden", {"text": "tea tea"}, index=False)
    found = store.search(("docs",), query="a cup of tea")
    assert found[0].key == "tea" and found[0].score > found[1].score
    assert found[-1].key == "hidden" and found[-1].score is None  # not indexed: last, unscored


def _cosine(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_a_query_searchs_score_is_langgraphs_cosine_and_orders_the_results(db):
    """The score InMemoryStore gives for the same items and query: the cosine, the best of an item's vectors."""
    embeddings = LetterEmbeddings()
    index = {"dims": 26, "embed": embeddings, "fields": ["title", "body"]}
    engram, langgraphs = EngramStore(index=index), InMemoryStore(index=index)
    items = {
        "tea": {"title": "tea time", "body": "a pot of oolong"},
        "zoo": {"title": "zebra zone", "body": "quiet keepers"},
        "mix": {"title": "xylophone", "body": "a cup of tea"},  # its body is what matches
        "bare": {"other": "nothing indexed"},
    }
    for key, value in items.items():
        engram.put(("docs",), key, value)
        langgraphs.put(("docs",), key, value)
    query = "a cup of tea"
    found = engram.search(("docs",), query=query)
    expected = langgraphs.search(("docs",), query=query)
    assert [i.key for i in found] == [i.key for i in expected]
    assert [i.score for i in found] == pytest.approx([i.score for i in expected])
    assert found[0].key == "mix" and found[0].score == pytest.approx(1.0)  # "a cup of tea" itself
    best_of_tea = max(_cosine(embeddings.embed_query(query), embeddings.embed_query(t)) for t in items["tea"].values())
    assert next(i.score for i in found if i.key == "tea") == pytest.approx(best_of_tea)
    assert found[-1].key == "bare" and found[-1].score is None  # nothing indexed: last, unscored
    assert [i.score for i in found[:-1]] == sorted((i.score for i in found[:-1]), reverse=True)
    assert all(i.score is None for i in engram.search(("docs",)))  # no query, no score


class ScatteredEmbeddings(Embeddings):
    """Deterministic vectors of a model's width, spread like a model's: a text's own seeded random vector."""

    def _one(self, text):
        return np.random.default_rng(zlib.crc32(text.encode())).standard_normal(384).tolist()

    def embed_documents(self, texts):
        return [self._one(t) for t in texts]

    def embed_query(self, text):
        return self._one(text)


def test_an_items_score_does_not_depend_on_what_else_the_search_found(db):
    """The same item, query and vectors give the same score to the last bit (so equal items tie, and
    pages of one ranking agree) whether the search scored it alone or among many, one vector or two."""
    index = {"dims": 384, "embed": ScatteredEmbeddings(), "fields": ["title", "body"]}
    store = EngramStore(index=index)
    for n in range(40):
        value = {"title": f"title {n % 13}", "body": f"body {n % 7}", "n": n}
        store.put(("docs",), f"k{n}", value, index=["title"] if n % 3 == 0 else None)
    query = "body 3"
    together = {i.key: i.score for i in store.search(("docs",), query=query, limit=40)}
    assert len(together) == 40 and all(score is not None for score in together.values())
    for n in range(40):
        (alone,) = store.search(("docs",), query=query, filter={"n": n})
        assert alone.score == together[f"k{n}"]
    assert together["k10"] == together["k17"] == pytest.approx(1.0)  # both hold the query's text as their body


def test_on_engrams_embedder_words_help_order_but_score_stays_the_cosine(db, settings):
    """Hybrid ranking may order the results; the score is still the cosine LangGraph documents."""
    settings.MEMORY = {**settings.MEMORY, "EMBEDDINGS": "tests.test_store.LetterEmbeddings"}
    reset_backend()
    store = EngramStore()  # Engram's embedder: the letters embedder above, embedded on write (tests: inline)
    store.put(("docs",), "words", {"text": "tea garden"})  # shares the query's words
    store.put(("docs",), "letters", {"text": "a tag tea"})
    query = "tea garden?"
    found = {i.key: i.score for i in store.search(("docs",), query=query)}
    letters = LetterEmbeddings()
    for key, text in (("words", '{"text": "tea garden"}'), ("letters", '{"text": "a tag tea"}')):
        assert found[key] == pytest.approx(_cosine(letters.embed_query(query), letters.embed_query(text)), abs=1e-6)
    reset_backend()


def test_without_an_embedder_a_query_search_finds_by_words_and_scores_none(store, settings):
    if get_embedder() is not None:
        settings.MEMORY = {**settings.MEMORY, "EMBEDDINGS": None}
        reset_backend()
    store.put(("docs",), "tea", {"text": "green tea"})
    store.put(("docs",), "sun", {"text": "sunny days"})
    found = store.search(("docs",), query="tea please")
    assert found[0].key == "tea" and all(i.score is None for i in found)
    reset_backend()


def test_list_namespaces_prefix_suffix_wildcards_depth_and_pages(store):
    spaces = [("a", "b", "c"), ("a", "b", "d", "e"), ("a", "b", "f"), ("a", "c", "f"), ("b", "a", "f"), ("x",)]
    for i, ns in enumerate(spaces):
        store.put(ns, f"k{i}", {"i": i})
    assert store.list_namespaces(prefix=("a", "b")) == [("a", "b", "c"), ("a", "b", "d", "e"), ("a", "b", "f")]
    assert store.list_namespaces(suffix=("f",)) == [("a", "b", "f"), ("a", "c", "f"), ("b", "a", "f")]
    assert store.list_namespaces(prefix=("a", "*", "f")) == [("a", "b", "f"), ("a", "c", "f")]
    assert store.list_namespaces(prefix=("a", "b"), max_depth=3) == [("a", "b", "c"), ("a", "b", "d"), ("a", "b", "f")]
    assert store.list_namespaces(prefix=("a",), limit=2, offset=1) == [("a", "b", "d", "e"), ("a", "b", "f")]
    assert store.list_namespaces(max_depth=1) == [("a",), ("b",), ("x",)]


def test_items_expire_after_their_ttl_and_reads_refresh_it(db):
    get_embedder()  # with hybrid recall, load the model first: loading it takes longer than the TTL
    store = EngramStore(ttl={"default_ttl": 0.01, "refresh_on_read": True})  # 0.6 s
    store.put(("t",), "short", {"v": 1})
    store.put(("t",), "forever", {"v": 2}, ttl=None)
    assert store.get(("t",), "short") is not None
    time.sleep(0.8)
    assert store.get(("t",), "short") is None and store.get(("t",), "forever") is not None
    assert [i.key for i in store.search(("t",))] == ["forever"]
    assert store.list_namespaces() == [("t",)]
    store.put(("gone",), "k", {"v": 3}, ttl=0.005)
    time.sleep(0.5)
    assert store.list_namespaces() == [("t",)]  # a namespace whose items all expired is not listed
    assert store.sweep_ttl() == 2 and StoreItem.objects.count() == 1


@pytest.mark.django_db(transaction=True)  # the sweeper's thread sees committed rows only
def test_the_ttl_sweeper_runs_every_sweep_interval_minutes_and_stops():
    store = EngramStore(ttl={"default_ttl": 0.001, "sweep_interval_minutes": 0.005})  # 0.06 s, 0.3 s
    assert store.start_ttl_sweeper().done() is False
    store.put(("t",), "short", {"v": 1})
    store.put(("t",), "kept", {"v": 2}, ttl=None)
    deadline = time.monotonic() + 10
    while StoreItem.objects.filter(key="short").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(StoreItem.objects.values_list("key", flat=True)) == ["kept"]  # deleted, not only hidden
    assert store.stop_ttl_sweeper(timeout=5) is True
    assert store.stop_ttl_sweeper() is True  # stopping a stopped sweeper is fine


@pytest.mark.django_db(transaction=True)
def test_the_ttl_sweepers_interval_comes_from_its_argument_then_the_config():
    store = EngramStore(ttl={"default_ttl": 0.001, "sweep_interval_minutes": 60})
    store.start_ttl_sweeper(sweep_interval_minutes=0.005)  # the argument wins: 0.3 s, not an hour
    store.put(("t",), "short", {"v": 1})
    deadline = time.monotonic() + 10
    while StoreItem.objects.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not StoreItem.objects.exists()
    future = store.start_ttl_sweeper()  # already running: another handle; cancelling it stops the thread
    assert future.cancel() and store.stop_ttl_sweeper(timeout=5)
    assert EngramStore().start_ttl_sweeper().done()  # no TTL config: nothing to sweep, nothing started


@pytest.mark.parametrize(
    "namespace, value, error",
    [
        ((), {"v": 1}, InvalidNamespaceError),
        (("the", "thing.about"), {"v": 1}, InvalidNamespaceError),
        (("some", ""), {"v": 1}, InvalidNamespaceError),
        (("langgraph", "x"), {"v": 1}, InvalidNamespaceError),
        (("docs",), ["not", "a", "dict"], InvalidMemoryArgument),
        (("users", "x" * 300), {"v": 1}, InvalidMemoryArgument),  # no user id is that long
        (("docs",), {"v": "\x00"}, InvalidMemoryArgument),
    ],
)
def test_bad_input_is_refused_and_writes_nothing(store, namespace, value, error):
    with pytest.raises(error):
        store.put(namespace, "k", value)
    if namespace[:1] != ("langgraph",):  # batch() may write under "langgraph", as LangGraph's stores let it
        with pytest.raises(error):  # in a batch with a good write, neither is written
            store.batch([PutOp(("docs",), "fine", {"v": 0}), PutOp(namespace, "k", value)])
    assert not StoreItem.objects.exists()


def test_namespaces_map_to_owners_and_forgetting_a_person_takes_theirs(store, service, user_factory):
    ada, bob = user_factory("ada"), user_factory("bob")
    store.put(("engram", "users", str(ada.pk), "memories"), "m1", {"text": "Ada likes tea"})
    store.put(("engram", "users", str(bob.pk), "memories"), "m1", {"text": "Bob likes coffee"})
    store.put(("agents", "helper", "notes"), "n1", {"text": "be brief"})
    store.put(("shared",), "s1", {"text": "office opens at nine"})
    owners = {(i.namespace, i.scope, i.user_id, i.agent_id) for i in StoreItem.objects.all()}
    assert owners == {
        (f"engram.users.{ada.pk}.memories", Scope.USER, ada.pk, ""),
        (f"engram.users.{bob.pk}.memories", Scope.USER, bob.pk, ""),
        ("agents.helper.notes", Scope.AGENT, None, "helper"),
        ("shared", Scope.GLOBAL, None, ""),
    }
    assert [i.value["text"] for i in store.search(("engram", "users", str(ada.pk)))] == ["Ada likes tea"]
    footprint = service.user_footprint([ada.pk])
    assert footprint["store_items"] == 1
    service.delete_users([ada.pk], cascade=True)
    assert not StoreItem.objects.filter(user_id=ada.pk).exists()
    assert store.get(("engram", "users", str(bob.pk), "memories"), "m1").value == {"text": "Bob likes coffee"}


@pytest.mark.parametrize(
    "namespace, error",
    [
        (("engram", "users", "999999"), "no memory user has id 999999"),
        (("engram", "users", "ada"), "reserved"),
        (("engram", "notes"), "reserved"),
        (("engram",), "reserved"),
    ],
)
def test_the_reserved_engram_namespace_names_only_existing_memory_users(store, namespace, error):
    with pytest.raises(InvalidMemoryArgument, match=error) as raised:
        store.put(namespace, "k", {"v": 1})
    assert raised.value.field == "namespace" and not StoreItem.objects.exists()


def test_an_apps_numeric_user_id_never_lands_on_the_memory_user_with_that_id(store, service, user_factory):
    """("users", "<n>") is the application's user n (identity langgraph:n), not Engram's memory user n."""
    ada = user_factory("ada")
    store.put(("users", str(ada.pk)), "m1", {"text": "an app user whose id is Ada's memory user id"})
    item = StoreItem.objects.get()
    assert item.user_id != ada.pk
    assert item.user_id == service.get_or_create_user("langgraph", str(ada.pk))[0].pk
    service.delete_users([ada.pk], cascade=True)  # forgetting Ada leaves the app user's item alone
    assert store.get(("users", str(ada.pk)), "m1") is not None


def test_an_apps_own_user_ids_name_people_too(store, service, user_factory):
    """("users", "<the app's user id>") as LangGraph apps write it: a person from the first write."""
    store.put(("users", "u-42", "memories"), "m1", {"text": "likes jazz"})
    store.put(("users", "123"), "m1", {"text": "the app's user 123"})
    store.put(("users", "u-42", "memories"), "m2", {"text": "lives in Oslo"})
    u42 = service.get_or_create_user("langgraph", "u-42")[0]
    assert set(StoreItem.objects.filter(user_id=u42.pk).values_list("key", flat=True)) == {"m1", "m2"}
    numbered = StoreItem.objects.get(namespace="users.123").user
    assert service.get_or_create_user("langgraph", "123")[0].pk == numbered.pk
    while user_factory().pk <= 123:  # a memory user with id 123 appears later: the label keeps its person
        pass
    store.put(("users", "123"), "m2", {"text": "still theirs"})
    assert set(StoreItem.objects.filter(user_id=numbered.pk).values_list("key", flat=True)) == {"m1", "m2"}
    service.delete_users([u42.pk], cascade=True)
    assert store.search(("users", "u-42")) == [] and len(store.search(("users", "123"))) == 2


def test_langmems_memories_namespace_is_the_persons_and_forgetting_them_deletes_it(store, service, user_factory):
    """langmem's usual ("memories", "<app user id>") resolves through Engram's identities: linked to a
    person's channel (MEMORY["STORE_NAMESPACES"]), it is their data and forget-a-person deletes it."""
    ada = user_factory("ada", channel="app")  # how the app identifies Ada everywhere else
    bob = user_factory("bob", channel="app")
    with override_settings(MEMORY={**settings.MEMORY, "STORE_NAMESPACES": {"memories": "app"}}):
        store.put(("memories", "ada"), "m1", {"content": "likes green tea"})
        store.put(("memories", "ada", "profile"), "p", {"content": "lives in Lyon"})
        store.put(("memories", "bob"), "m1", {"content": "likes coffee"})
        assert set(StoreItem.objects.filter(user=ada).values_list("key", flat=True)) == {"m1", "p"}
        assert service.delete_users([ada.pk], cascade=True).deleted == 1  # forget this person
    assert store.search(("memories", "ada")) == [] and not StoreItem.objects.filter(
        namespace__startswith="memories.ada"
    )
    assert [i.value for i in store.search(("memories", "bob"))] == [{"content": "likes coffee"}]
    assert StoreItem.objects.get(namespace="memories.bob").user_id == bob.pk


def test_by_default_langmems_namespace_belongs_to_the_apps_user(store, service):
    store.put(("memories", "u-7"), "m1", {"content": "likes tea"})
    person = service.get_or_create_user("langgraph", "u-7")[0]
    assert StoreItem.objects.get().user_id == person.pk
    with override_settings(MEMORY={**settings.MEMORY, "STORE_NAMESPACES": {"memories": None}}):
        store.put(("memories", "u-8"), "m1", {"content": "nobody's"})
    assert StoreItem.objects.get(namespace="memories.u-8").scope == Scope.GLOBAL


def test_a_merged_users_items_land_on_the_survivor(store, service, user_factory):
    ada, ann = user_factory("ada"), user_factory("ann")
    service.merge_users(ann.pk, ada.pk)
    store.put(("engram", "users", str(ann.pk)), "k", {"v": 1})
    assert StoreItem.objects.get().user_id == ada.pk


@pytest.mark.django_db(transaction=True)
def test_the_sync_api_works_when_called_from_a_coroutine():
    """As with LangGraph's stores, a coroutine may call put/get/search/list (Django alone would refuse)."""
    store = EngramStore()

    async def main():
        store.put(("notes",), "k", {"text": "sync inside async"})
        assert store.get(("notes",), "k").value == {"text": "sync inside async"}
        assert [i.key for i in store.search(("notes",), query="sync")] == ["k"]
        assert store.list_namespaces() == [("notes",)]
        store.delete(("notes",), "k")
        return store.get(("notes",), "k")

    assert asyncio.run(main()) is None


@pytest.mark.django_db(transaction=True)
def test_abatch_keeps_the_event_loop_free():
    store = EngramStore()

    async def main():
        ticks = []

        async def ticker():
            # Yields to the loop at every turn: it ticks whenever the loop is free.
            while True:
                ticks.append(time.perf_counter())
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        for n in range(30):
            await store.aput(("async",), f"k{n}", {"n": n})
        found = await store.asearch(("async",), filter={"n": {"$lt": 3}})
        task.cancel()
        return found, ticks

    found, ticks = asyncio.run(main())
    assert {i.key for i in found} == {"k0", "k1", "k2"}
    # A call that ran on the loop's own thread would never let the ticker in;
    # each of the 31 calls awaiting a worker thread lets it tick at least once.
    assert len(ticks) >= 31


class ToolCallingFake(GenericFakeChatModel):
    def bind_tools(self, tools, **kwargs):
        return self


@pytest.mark.django_db(transaction=True)  # LangGraph runs tools in worker threads
def test_langmem_tools_manage_and_search_memories_on_engram(user_factory, staff_client):
    from langmem import create_manage_memory_tool, create_search_memory_tool

    ada = user_factory("ada", channel="langgraph")  # the app's user "ada", as langmem names them
    store = EngramStore()
    namespace = ("memories", "{langgraph_user_id}")  # langmem's usual namespace: Ada's by default

    def created_id():
        return StoreItem.objects.get(user=ada).key

    def turns():
        yield AIMessage("", tool_calls=[{"name": "manage_memory", "args": {"content": "likes green tea"}, "id": "1"}])
        yield AIMessage(
            "",
            tool_calls=[
                {
                    "name": "manage_memory",
                    "args": {"action": "update", "id": created_id(), "content": "likes oolong"},
                    "id": "2",
                }
            ],
        )
        yield AIMessage("", tool_calls=[{"name": "search_memory", "args": {"query": "tea"}, "id": "3"}])
        yield AIMessage(
            "", tool_calls=[{"name": "manage_memory", "args": {"action": "delete", "id": created_id()}, "id": "4"}]
        )
        yield AIMessage("Done.")

    agent = create_agent(
        ToolCallingFake(messages=turns()),
        [create_manage_memory_tool(namespace), create_search_memory_tool(namespace)],
        store=store,
    )
    out = agent.invoke({"messages": [("user", "remember I like tea")]}, {"configurable": {"langgraph_user_id": "ada"}})
    tool_replies = [m.content for m in out["messages"] if m.type == "tool"]
    assert tool_replies[0].startswith("created memory")
    assert tool_replies[1].startswith("updated memory")
    assert "likes oolong" in tool_replies[2]
    assert tool_replies[3].lower().startswith("deleted memory")
    assert not StoreItem.objects.exists()
    # While it existed it was Ada's, and the admin lists store items under their owner.
    store.put(("engram", "users", str(ada.pk), "memories"), "again", {"content": "likes oolong"})
    page = staff_client.get("/memories/memory/storeitem/", {"user__id__exact": ada.pk})
    assert page.status_code == 200 and "likes oolong" in page.content.decode()


def test_writes_inside_a_callers_transaction_roll_back_with_it(store):
    with pytest.raises(RuntimeError), transaction.atomic():
        store.put(("docs",), "a", {"v": 1})
        raise RuntimeError("undo")
    assert store.get(("docs",), "a") is None


def test_operators_list_filter_and_batch_delete_store_items_over_rest(api, store, user_factory):
    ada = user_factory("ada")
    store.put(("engram", "users", str(ada.pk), "memories"), "m1", {"text": "tea"})
    store.put(("shared", "faq"), "hours", {"text": "nine to five"})
    body = api.get("/api/v1/store-items/", {"user": ada.pk}).json()
    assert body["count"] == 1 and body["results"][0]["namespace"] == ["engram", "users", str(ada.pk), "memories"]
    assert api.get("/api/v1/store-items/", {"namespace": "shared"}).json()["count"] == 1
    ids = [row["id"] for row in api.get("/api/v1/store-items/").json()["results"]]
    assert api.get("/api/v1/store-items/", {"namespace": "x" * 501}).status_code == 400
    response = api.post("/api/v1/store-items/batch-delete/", {"ids": [*ids, 999999]}, format="json")
    assert response.json() == {"deleted": 2, "not_found": [999999]}
    assert not StoreItem.objects.exists()


def test_store_items_travel_with_export_and_import(store, service, user_factory):
    import io

    ada = user_factory("ada")
    store.put(("engram", "users", str(ada.pk), "memories"), "m1", {"text": "likes tea", "n": 1}, ttl=None)
    store.put(("agents", "helper"), "style", {"text": "be brief"})
    out = io.StringIO()
    assert service.export_memories(out)["store_item"] == 2
    StoreItem.objects.all().delete()
    report = service.import_memories(io.StringIO(out.getvalue()))
    assert report.added["store_item"] == 2
    assert store.get(("engram", "users", str(ada.pk), "memories"), "m1").value == {"text": "likes tea", "n": 1}
    assert StoreItem.objects.get(key="style").agent_id == "helper"
    assert [i.key for i in store.search(("engram", "users"), query="tea")] == ["m1"]  # found by its words


def test_a_persons_export_holds_their_store_items(store, service, user_factory):
    import io
    import json

    ada = user_factory("ada")
    store.put(("engram", "users", str(ada.pk), "memories"), "m1", {"text": "likes tea"})
    out = io.StringIO()
    service.export_person(ada.pk, out)
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["value"] for r in rows if r["kind"] == "store_item"] == [{"text": "likes tea"}]
