"""bench.extraction: what observe stores from LoCoMo's first conversation, and what it costs a turn.

    python -m bench.extraction [--locomo path/to/locomo10.json] [--runs 3] [--mode keyword|hybrid]
                               [--database-url postgres://...] [--json]

Each of the conversation's 419 turns is one turn of a memory-backed agent with a scripted chat
model: `recall` of the turn (facts, episodes and procedures, limit 10, as the recall node does), the
reply (the conversation's next turn, from LangChain's generic fake chat model, given the recalled
memories) and the turn's episode recorded with both (as the remember node does). With extraction on, the turn is then
observed: `MemoryService.observe` with a scripted chat model (LangChain's generic fake answering with
tool calls), whose proposals and decisions come from script.json (see make_script.py). Runs with
extraction off and on alternate, each as a new memory user in one scratch database (forgotten after
its run, untimed, so every run meets the same store), `--runs` of each, each paying for its own
embeddings (the process's caches of query and document vectors are emptied before it); a run's time
ends when the embedding worker has caught up with its writes. Prints the median
turns/s of each and the cost of extraction (1 - on/off of the medians, and of each pair of runs;
target at most 0.20), and the same cost in the process's CPU seconds (1 - off/on), the facts the last
run stored, its decisions by kind, and how many of LoCoMo's questions have their evidence turns
holding a stored, current fact (one linked to that turn's episode).
"""

import argparse
import functools
import json
import re
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..embedder import DEFAULT_TEXTS
from ..retrieval import load_locomo
from ..support.scratch import add_mode_argument, add_scratch_arguments, machine_reference, scratch_django

SCRIPT = Path(__file__).with_name("script.json")
TARGET_COST = 0.20
TURN_ID = re.compile(r"D\d+:\d+")


@functools.cache
def scripted_model_class():
    """LangChain's generic fake chat model, answering with the tool calls structured output reads."""
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

    class ScriptedModel(GenericFakeChatModel):
        def bind_tools(self, tools, **kwargs):
            return self

    return ScriptedModel


def scripted_model(answers):
    return scripted_model_class()(messages=iter(answers))


def turn_answers(entry, observations, text):
    """The scripted model's two answers for one turn (one, when it proposes nothing)."""
    from langchain_core.messages import AIMessage

    def call(name, args):
        return AIMessage(content="", tool_calls=[{"name": name, "id": name, "args": args}])

    if entry is None:
        return [call("ProposedFacts", {"facts": []})]
    proposals = []
    for item in entry["proposals"]:
        session, speaker, index = item["observation"]
        proposals.append(
            {
                "key": item["key"],
                "value": observations[session][speaker][index][0],
                "fact_type": item["fact_type"],
                "scope": item["scope"],
                "words": text[:300],
                "message": 0,
            }
        )
    return [call("ProposedFacts", {"facts": proposals}), call("Decisions", {"decisions": entry["decisions"]})]


def feed(service, conversation, script, observations, run, extract):
    """One run over every turn; returns (seconds, the observe reports, the user, {episode id: turn id})."""
    from django.utils import timezone
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

    from memory.embedding.embedder import clear_piece_cache, clear_query_cache

    user, _ = service.get_or_create_user("bench", f"locomo-{run}-{'on' if extract else 'off'}")
    session = f"locomo-{run}-{extract}"
    reports, episodes = [], {}
    turns = conversation.turns
    # The reply of each turn: the conversation's next turn, scripted like the extraction.
    replier = scripted_model([AIMessage(t.text) for t in [*turns[1:], turns[0]]])
    # Every run feeds the same conversation: without this, every run after the first would find its
    # turns' and proposals' embeddings cached, where a user's new message pays for its own (hybrid).
    clear_query_cache()
    clear_piece_cache()
    start, cpu = time.perf_counter(), time.process_time()
    for turn in turns:
        text = turn.text  # what the speaker wrote, as a chat user would send it (no name in front)
        recalled = service.recall(text, agent_id="bench", user_id=user.pk, session_id=session, limit=10)
        memory = "\n".join(hit.text for hit in recalled)
        reply = replier.invoke([SystemMessage(f"Memory:\n{memory}"), HumanMessage(text)]).text
        episode = service.record_episode(
            started_at=timezone.now(),
            agent_id="bench",
            user_id=user.pk,
            session_id=session,
            conversation=[{"role": "user", "content": text}, {"role": "assistant", "content": reply}],
            success=True,
        )
        episodes[episode.pk] = turn.id
        if extract:
            model = scripted_model(turn_answers(script["turns"].get(turn.id), observations, text))
            reports.append(
                service.observe(
                    [{"role": "user", "content": text, "id": turn.id}],
                    user_id=user.pk,
                    agent_id="bench",
                    session_id=session,
                    chat_model=model,
                    episode_id=episode.pk,
                )
            )
    service.wait_for_vectors(600)
    return (time.perf_counter() - start, time.process_time() - cpu), reports, user, episodes


def evidence_coverage(service, conversation, user, episodes):
    """Questions with evidence: how many have every / some evidence turn holding a current fact of it."""
    holding = {episodes.get(f.source_episode_id) for f in service.user_facts(user.pk)} - {None}
    asked = [set(TURN_ID.findall(" ".join(q.evidence))) for q in conversation.questions]
    asked = [turns for turns in asked if turns]
    return {
        "questions_with_evidence": len(asked),
        "all_evidence_turns_hold_a_fact": sum(turns <= holding for turns in asked),
        "some_evidence_turn_holds_a_fact": sum(bool(turns & holding) for turns in asked),
    }


def run(args):
    from django.db import connection

    from memory.service import MemoryService

    conversation = load_locomo(args.locomo)[0]
    samples = json.loads(Path(args.locomo).read_text(encoding="utf-8"))
    observations = samples[0]["observation"]
    script = json.loads(SCRIPT.read_text(encoding="utf-8"))
    if script["conversation"] != conversation.id:
        raise SystemExit(
            f"script.json is for {script['conversation']}, the file's first conversation is {conversation.id}"
        )
    service = MemoryService()
    # Untimed: the first recall loads the embedding model (hybrid) and fills the caches either run would.
    warm, _ = service.get_or_create_user("bench", "warm-up")
    service.recall(conversation.turns[0].text, agent_id="bench", user_id=warm.pk, limit=10)
    speed, cpu = {"off": [], "on": []}, {"off": [], "on": []}
    for run_number in range(args.runs):
        for extract in (False, True):  # interleaved: what else loads the machine weighs on both alike
            (seconds, cpu_seconds), reports, user, episodes = feed(
                service, conversation, script, observations, run_number, extract
            )
            speed["on" if extract else "off"].append(len(conversation.turns) / seconds)
            cpu["on" if extract else "off"].append(cpu_seconds)
            print(f"run {run_number + 1} extraction {'on' if extract else 'off'}: {seconds:.1f} s", file=sys.stderr)
            if extract:
                facts_stored = len(service.user_facts(user.pk))
                qa = evidence_coverage(service, conversation, user, episodes)
            # Untimed: the run's user is forgotten, so that every run meets the same store. Left in,
            # each run's keyword search would read the words of every run before it: an "on" run,
            # always second of its pair, met one more conversation than its "off" run.
            service.delete_users([user.pk], cascade=True, tombstone=False)
    decisions = {"add": 0, "update": 0, "delete": 0, "none": 0}
    for report in reports:
        for action, n in report.counts().items():
            decisions[action] += n
    off, on = statistics.median(speed["off"]), statistics.median(speed["on"])
    return {
        "benchmark": "extraction",
        "mode": service.recall_mode() if args.mode != "keyword" else "keyword-only",
        "database": connection.vendor,
        "conversation": conversation.id,
        "turns": len(conversation.turns),
        "turns_with_proposals": len(script["turns"]),
        "facts_stored": facts_stored,
        "decisions": decisions,
        "errors": sum(len(r.errors) + sum(1 for d in r.decisions if d.get("error")) for r in reports),
        "model_calls": sum(r.model_calls for r in reports),
        "turns_per_s": {"off": round(off, 1), "on": round(on, 1)},
        "runs_per_s": {k: [round(v, 1) for v in vs] for k, vs in speed.items()},
        "extraction_cost": round(1 - on / off, 3),
        "extraction_cost_per_pair": [round(1 - b / a, 3) for a, b in zip(speed["off"], speed["on"])],
        "target_cost": TARGET_COST,
        # The process's CPU seconds per run (its threads: the embedding worker, and SQLite, included;
        # not a PostgreSQL server's): steadier than wall-clock on a machine shared with other work.
        "cpu_s": {k: [round(v, 2) for v in vs] for k, vs in cpu.items()},
        "extraction_cost_cpu": round(1 - statistics.median(cpu["off"]) / statistics.median(cpu["on"]), 3),
        "qa": qa,
        "machine_reference": machine_reference(),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--locomo", type=Path, default=DEFAULT_TEXTS, help="LoCoMo's locomo10.json")
    parser.add_argument("--runs", type=int, default=3, help="runs with extraction off and on each (interleaved)")
    add_scratch_arguments(parser, seed=False)
    add_mode_argument(parser)
    args = parser.parse_args(argv)
    with scratch_django(args.database_url, args.mode):
        result = run(args)
    if args.json:
        print(json.dumps(result))
        return
    table = Table(title=f"bench.extraction: {result['conversation']}, {result['mode']}, {result['database']}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for name in ("turns", "turns_with_proposals", "facts_stored", "errors", "model_calls"):
        table.add_row(name.replace("_", " "), str(result[name]))
    for action, n in result["decisions"].items():
        table.add_row(f"decisions: {action}", str(n))
    table.add_row("turns/s, extraction off (median)", str(result["turns_per_s"]["off"]))
    table.add_row("turns/s, extraction on (median)", str(result["turns_per_s"]["on"]))
    table.add_row(f"cost of extraction (target ≤ {TARGET_COST:.0%})", f"{result['extraction_cost']:.1%}")
    table.add_row("cost of extraction in CPU seconds", f"{result['extraction_cost_cpu']:.1%}")
    for name, n in result["qa"].items():
        table.add_row(f"questions: {name.replace('_', ' ')}", str(n))
    console = Console()
    console.print(table)
    console.print(result["machine_reference"])


if __name__ == "__main__":
    main()
