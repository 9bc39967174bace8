"""Retrieval quality: recall@k of evidence turns for keyword-only, vector-only and hybrid recall.

    python -m bench.retrieval --dataset locomo PATH [--json] [--database-url URL] [--set KEY=JSON ...]
    python -m bench.retrieval --dataset generic PATH [--json]

Every dialog turn of a conversation becomes one episode of one agent (one agent per conversation),
written through MemoryService into a scratch database (start_episode with the speaker, turn id and
session date in trigger_input and the session in session_id; add_message(speaker, text)). Every
question is then asked through MemoryService.recall(types=["episodes"], limit=50) in each mode, and
recall@k is LoCoMo's: the share of a question's gold evidence turn ids among the top k, averaged
over questions. Evidence ids that name no turn of the conversation are skipped; a question left with
none is not counted.
"""

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from .scratch import scratch_django

KS = (5, 10, 25, 50)
MODES = ("keyword", "vector", "hybrid")
LOCOMO_CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}


@dataclass
class Turn:
    id: str
    speaker: str
    text: str
    time: str = ""
    session: str = ""


@dataclass
class Question:
    question: str
    evidence: list
    category: str = ""


@dataclass
class Conversation:
    id: str
    turns: list = field(default_factory=list)
    questions: list = field(default_factory=list)


def load_locomo(path):
    """LoCoMo's locomo10.json: samples with conversation sessions (session_<n>, session_<n>_date_time) and qa."""
    with open(path, encoding="utf-8") as fh:
        samples = json.load(fh)
    conversations = []
    for index, sample in enumerate(samples):
        conv = sample["conversation"]
        sessions = sorted(
            (int(m.group(1)), key)
            for key in conv
            if (m := re.fullmatch(r"session_(\d+)", key)) and isinstance(conv[key], list)
        )
        turns = []
        for number, key in sessions:
            when = conv.get(f"{key}_date_time", "")
            for turn in conv[key]:
                turns.append(Turn(turn["dia_id"], turn["speaker"], turn["text"], when, str(number)))
        questions = [
            Question(
                q["question"],
                [e for e in q.get("evidence", []) if isinstance(e, str)],
                f"{q.get('category')} ({LOCOMO_CATEGORIES.get(q.get('category'), '?')})",
            )
            for q in sample.get("qa", [])
        ]
        conversations.append(Conversation(str(sample.get("sample_id", index)), turns, questions))
    return conversations


def load_generic(path):
    """{"conversations": [{"id", "turns": [{"id", "speaker", "text", "time"}], "questions": [...]}]}."""
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    conversations = []
    for index, conv in enumerate(data["conversations"]):
        turns = [
            Turn(
                str(t["id"]),
                str(t.get("speaker", "")),
                str(t["text"]),
                str(t.get("time", "")),
                str(t.get("session", "")),
            )
            for t in conv["turns"]
        ]
        questions = [
            Question(q["question"], [str(e) for e in q.get("evidence", [])], str(q.get("category", "")))
            for q in conv.get("questions", [])
        ]
        conversations.append(Conversation(str(conv.get("id", index)), turns, questions))
    return conversations


LOADERS = {"locomo": load_locomo, "generic": load_generic}


def _progress(console):
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=console
    )


def run(conversations, modes, progress):
    from memory.service import MemoryService

    service = MemoryService()
    turn_of = {}
    total_turns = sum(len(c.turns) for c in conversations)
    task = progress.add_task("storing turns as episodes", total=total_turns)
    started = time.perf_counter()
    for conv in conversations:
        agent = f"bench-{conv.id}"
        for turn in conv.turns:
            episode = service.start_episode(
                agent_id=agent,
                session_id=f"{conv.id}:{turn.session}" if turn.session else "",
                trigger_type="dialog",
                trigger_input={"turn_id": turn.id, "speaker": turn.speaker, "time": turn.time},
            )
            service.add_message(episode.pk, turn.speaker, turn.text)
            turn_of[episode.pk] = turn.id
            progress.advance(task)
    store_s = time.perf_counter() - started
    # The embedding worker embeds committed turns in the background: wait for it, as a caller that
    # wants vector recall to see what it just wrote does (the direct path), showing the backlog.
    backlog = service.pending_vectors()
    task = progress.add_task("embedding turns (worker)", total=backlog)
    while not service.wait_for_vectors(timeout=0.5):
        progress.update(task, completed=backlog - service.pending_vectors())
    progress.update(task, completed=backlog)
    service.optimize_recall_index()

    scores = {m: defaultdict(list) for m in modes}  # mode -> (category, k) -> [recall]
    skipped = 0
    asked = 0
    total_questions = sum(len(c.questions) for c in conversations)
    task = progress.add_task("asking questions", total=total_questions)
    latency = {m: [] for m in modes}
    for conv in conversations:
        agent = f"bench-{conv.id}"
        known = {t.id for t in conv.turns}
        for q in conv.questions:
            progress.advance(task)
            gold = {e for e in q.evidence if e in known}
            if not gold:
                skipped += 1
                continue
            asked += 1
            for mode in modes:
                t0 = time.perf_counter()
                result = service.recall(q.question, agent_id=agent, types=["episodes"], limit=max(KS), mode=mode)
                latency[mode].append((time.perf_counter() - t0) * 1000.0 - result.embed_ms)
                ranked = [turn_of.get(h.id) for h in result]
                for k in KS:
                    got = len(gold & set(ranked[:k])) / len(gold)
                    scores[mode][("all", k)].append(got)
                    scores[mode][(q.category, k)].append(got)
    service.flush_recall_log()
    return scores, asked, skipped, store_s, latency


def summarise(scores, modes):
    def pct(values):
        return round(100.0 * sum(values) / len(values), 2) if values else 0.0

    overall = {m: {f"recall@{k}": pct(scores[m][("all", k)]) for k in KS} for m in modes}
    categories = sorted({c for m in modes for c, _ in scores[m] if c != "all"})
    per_category = {c: {m: {f"recall@{k}": pct(scores[m][(c, k)]) for k in KS} for m in modes} for c in categories}
    counts = {c: len(scores[modes[0]][(c, KS[0])]) for c in categories}
    return overall, per_category, counts


def apply_overrides(pairs):
    from django.conf import settings

    from memory.conf import memory_settings

    memory = dict(getattr(settings, "MEMORY", {}) or {})
    for pair in pairs:
        key, _, raw = pair.partition("=")
        try:
            memory[key] = json.loads(raw)
        except json.JSONDecodeError:
            memory[key] = raw
    settings.MEMORY = memory
    memory_settings.reload()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=sorted(LOADERS), required=True)
    parser.add_argument("path", help="the dataset file")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--database-url", help="a PostgreSQL server (postgres://user@host:port/any); default SQLite")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of keyword,vector,hybrid")
    parser.add_argument("--conversations", type=int, help="only the first N conversations")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON", help="override a MEMORY setting")
    args = parser.parse_args(argv)
    modes = tuple(m for m in args.modes.split(",") if m)
    if not set(modes) <= set(MODES):
        parser.error(f"--modes: use {', '.join(MODES)}")
    conversations = LOADERS[args.dataset](args.path)[: args.conversations]
    console = Console(stderr=True)
    with scratch_django(args.database_url):
        apply_overrides(args.set)
        from memory.service import MemoryService

        if MemoryService().recall_mode() != "hybrid" and set(modes) - {"keyword"}:
            console.print("[red]no embedder: install the embeddings extra, or run with --modes keyword[/red]")
            return 2
        with _progress(console) as progress:
            scores, asked, skipped, store_s, latency = run(conversations, modes, progress)
    overall, per_category, counts = summarise(scores, modes)
    p50 = {m: round(sorted(v)[len(v) // 2], 2) if v else None for m, v in latency.items()}
    if args.json:
        out = {m: overall[m] for m in modes}
        out.update(
            {
                "questions": asked,
                "skipped_questions": skipped,
                "categories": per_category,
                "category_questions": counts,
                "store_seconds": round(store_s, 1),
                "recall_p50_ms": p50,
                "settings": args.set,
            }
        )
        print(json.dumps(out))
        return 0
    out = Console()
    table = Table(title=f"recall@k of evidence turns, {asked} questions ({skipped} without valid evidence skipped)")
    table.add_column("category")
    table.add_column("questions", justify="right")
    table.add_column("mode")
    for k in KS:
        table.add_column(f"@{k}", justify="right")
    for mode in modes:
        table.add_row("all", str(asked), mode, *[f"{overall[mode][f'recall@{k}']:.1f}" for k in KS])
    for category, by_mode in per_category.items():
        table.add_section()
        for mode in modes:
            table.add_row(category, str(counts[category]), mode, *[f"{by_mode[mode][f'recall@{k}']:.1f}" for k in KS])
    out.print(table)
    out.print(
        f"stored {sum(len(c.turns) for c in conversations)} turns in {store_s:.1f} s; recall p50 (ms, without the query's embedding): {p50}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
