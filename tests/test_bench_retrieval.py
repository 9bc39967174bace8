"""bench.retrieval measures the store as it was stored: its own questions leave no trace in it."""

import io
import json

from rich.console import Console

from bench import retrieval
from memory.models import RecallDocument, RecallEvent
from memory.recall.events import recall_log


def conversations(tmp_path):
    data = {
        "conversations": [
            {
                "id": "c1",
                "turns": [
                    {"id": "t1", "speaker": "Ada", "text": "I adopted a grey cat named Pixel.", "session": "1"},
                    {"id": "t2", "speaker": "Bo", "text": "Lovely! I went hiking in the Alps.", "session": "1"},
                    {"id": "t3", "speaker": "Ada", "text": "My cat Pixel sleeps all day.", "session": "2"},
                ],
                "questions": [
                    {"question": "What is the name of Ada's cat?", "evidence": ["t1"]},
                    {"question": "Where did Bo go hiking?", "evidence": ["t2"]},
                ],
            }
        ]
    }
    path = tmp_path / "dialogs.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return retrieval.load_generic(path)


def test_the_benchmarks_questions_are_not_counted_as_uses_of_the_memories(db, tmp_path):
    """Were its hits counted as references, each recall's boost would depend on the questions asked
    before it (and a hybrid run on the keyword run of the same question just before it)."""
    convs = conversations(tmp_path)
    with retrieval._progress(Console(file=io.StringIO())) as progress:
        turn_of, _ = retrieval.store(convs, progress)
        first, skipped, _ = retrieval.ask(convs, turn_of, ("keyword",), progress)
        again, _, _ = retrieval.ask(convs, turn_of, ("keyword",), progress)
    recall_log.flush()
    assert skipped == 0
    assert [e.ranked["keyword"][0] for e in first] == ["t1", "t2"]
    assert [e.ranked for e in again] == [e.ranked for e in first]
    assert not RecallEvent.objects.exists()
    assert set(RecallDocument.objects.values_list("reference_count", flat=True)) == {0}
