"""`python manage.py memory <subcommand>`: list, stats, export, import, clear, consolidate, prune, history, health.

Tables (rich) for people; `--json` prints exactly one JSON object for programs. Each subcommand
is one class with `add_arguments(parser)` and `handle(command, options)`, listed in SUBCOMMANDS:
another app's subcommand (recall's `reindex`) joins by adding its class there.
"""

import json
import shutil
import sys
import tempfile

from django.core.management.base import BaseCommand, CommandError
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from memory.exceptions import ImportRejected, MemoryServiceError
from memory.service import MemoryService
from memory.text import clip

BAND_STYLE = {"green": "green", "yellow": "yellow", "red": "red", "unknown": "dim"}


def _short(value, width=60):
    return clip(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False), width)


def _when(value):
    return value.strftime("%Y-%m-%d %H:%M") if value else ""


class Subcommand:
    """One `memory` subcommand."""

    name = ""
    help = ""

    def add_arguments(self, parser):
        pass

    def handle(self, command, options):
        raise NotImplementedError("Subcommand classes must provide handle(command, options)")


def _json_flag(parser):
    parser.add_argument("--json", action="store_true", help="print exactly one JSON object")


class ListSubcommand(Subcommand):
    name = "list"
    help = "List facts, episodes, procedures or users, newest first."

    def add_arguments(self, parser):
        parser.add_argument("--type", dest="kind", choices=MemoryService.LIST_KINDS, default="facts")
        parser.add_argument("--scope", help="facts only: session, user, agent or global")
        parser.add_argument("--agent", dest="agent_id")
        parser.add_argument("--user", dest="user_id", type=int, help="memory user id")
        parser.add_argument("--category", help="fact type, episode trigger type, procedure type or user channel")
        parser.add_argument("--limit", type=int, default=20)
        _json_flag(parser)

    COLUMNS = {
        "facts": ["id", "key", "value", "scope", "owner", "fact_type", "confidence", "confirmed", "updated_at"],
        "episodes": ["id", "agent_id", "user_id", "trigger_type", "success", "processed", "summary", "started_at"],
        "procedures": ["id", "name", "agent_id", "procedure_type", "active", "used", "success_rate", "updated_at"],
        "users": ["id", "display_name", "canonical_id", "identities", "conversations", "last_seen"],
    }

    @staticmethod
    def row(kind, obj):
        if kind == "facts":
            return {
                "id": obj.pk,
                "key": obj.key,
                "value": obj.value,
                "scope": obj.scope,
                "owner": obj.scope_key,
                "fact_type": obj.fact_type,
                "confidence": round(obj.confidence, 3),
                "confirmed": obj.times_confirmed,
                "updated_at": obj.updated_at,
            }
        if kind == "episodes":
            return {
                "id": obj.pk,
                "agent_id": obj.agent_id,
                "user_id": obj.user_id,
                "trigger_type": obj.trigger_type,
                "success": obj.success,
                "processed": obj.processed_for_facts,
                "summary": obj.summary,
                "started_at": obj.started_at,
            }
        if kind == "procedures":
            return {
                "id": obj.pk,
                "name": obj.name,
                "agent_id": obj.agent_id,
                "procedure_type": obj.procedure_type,
                "active": obj.is_active,
                "used": obj.times_used,
                "success_rate": round(obj.success_rate, 3),
                "updated_at": obj.updated_at,
            }
        return {
            "id": obj.pk,
            "display_name": obj.display_name,
            "canonical_id": obj.canonical_id,
            "identities": [f"{i.channel}:{i.external_id}" for i in obj.identities.all()],
            "conversations": obj.total_conversations,
            "last_seen": obj.last_seen,
        }

    def handle(self, command, options):
        kind = options["kind"]
        found = command.service.list_memories(
            kind,
            scope=options["scope"],
            agent_id=options["agent_id"],
            user_id=options["user_id"],
            category=options["category"],
            limit=options["limit"],
        )
        if kind == "users":
            from django.db.models import prefetch_related_objects

            prefetch_related_objects(found, "identities")
        rows = [self.row(kind, obj) for obj in found]
        if options["json"]:
            for row in rows:
                for k, v in row.items():
                    if hasattr(v, "isoformat"):
                        row[k] = v.isoformat()
            return command.print_json({"type": kind, "count": len(rows), "items": rows})
        table = Table(title=f"{kind} ({len(rows)} shown, newest first)")
        for column in self.COLUMNS[kind]:
            table.add_column(column, overflow="fold")
        for row in rows:
            cells = []
            for column in self.COLUMNS[kind]:
                value = row[column]
                if hasattr(value, "strftime"):
                    value = _when(value)
                elif isinstance(value, list):
                    value = ", ".join(value)
                cells.append(
                    "" if value is None else _short(value) if not isinstance(value, (int, float, bool)) else str(value)
                )
            table.add_row(*cells)
        command.console.print(table)


class StatsSubcommand(Subcommand):
    name = "stats"
    help = "Counts per kind and scope, episodes waiting for consolidation, the last consolidation."

    def add_arguments(self, parser):
        _json_flag(parser)

    def handle(self, command, options):
        counts = command.service.memory_counts()
        run = command.service.last_consolidation()
        last = (
            None
            if run is None
            else {
                "finished_at": run.finished_at.isoformat(),
                "ok": run.ok,
                "episodes_processed": run.episodes_processed,
                "facts_created": run.facts_created,
                "facts_confirmed": run.facts_confirmed,
            }
        )
        if options["json"]:
            return command.print_json({**counts, "last_consolidation": last})
        table = Table(title="Memory")
        table.add_column("what")
        table.add_column("rows", justify="right")
        table.add_row("facts", f"{counts['facts']:,}")
        for scope, n in counts["facts_by_scope"].items():
            table.add_row(f"  {scope} facts", f"{n:,}")
        table.add_row("episodes", f"{counts['episodes']:,}")
        table.add_row("  waiting for consolidation", f"{counts['episodes_unconsolidated']:,}")
        table.add_row("procedures", f"{counts['procedures']:,}")
        table.add_row("  active", f"{counts['procedures_active']:,}")
        table.add_row("users", f"{counts['users']:,}")
        table.add_row("  merged into others", f"{counts['users_merged']:,}")
        table.add_row("channel identities", f"{counts['identities']:,}")
        command.console.print(table)
        if last:
            state = "[green]ok[/green]" if last["ok"] else "[red]with failures[/red]"
            command.console.print(
                f"Last consolidation {last['finished_at']}: {state}, {last['episodes_processed']} episodes, "
                f"{last['facts_created']} facts created, {last['facts_confirmed']} confirmed."
            )
        else:
            command.console.print("No consolidation has run yet.")


class ExportSubcommand(Subcommand):
    name = "export"
    help = "Write every memory (users, identities, episodes, procedures, facts) as JSON Lines."

    def add_arguments(self, parser):
        parser.add_argument("-o", "--output", default="-", help="file to write; '-' (default) for standard output")

    def handle(self, command, options):
        path = options["output"]
        with command.progress() as progress:
            task = progress.add_task("exporting", total=None)
            done = {}

            def advance(kind, count, total):
                done[kind] = (count, total)
                progress.update(task, completed=sum(c for c, _ in done.values()))

            if path == "-":
                counts = command.service.export_memories(command.stdout, on_progress=advance)
            else:
                with open(path, "w", encoding="utf-8") as out:
                    counts = command.service.export_memories(out, on_progress=advance)
        summary = ", ".join(f"{n:,} {kind}" for kind, n in counts.items())
        command.err_console.print(f"exported {summary}" + ("" if path == "-" else f" to {path}"))


class ImportSubcommand(Subcommand):
    name = "import"
    help = "Validate an export, then add its new rows in one transaction (rows already present are kept)."

    def add_arguments(self, parser):
        parser.add_argument("path", help="an export file; '-' for standard input")
        parser.add_argument("--dry-run", action="store_true", help="validate and count, write nothing")
        parser.add_argument(
            "--allow-forgotten",
            action="store_true",
            help="bring back people who were forgotten since the export (refused by default)",
        )
        _json_flag(parser)

    def handle(self, command, options):
        path = options["path"]
        with tempfile.TemporaryFile("w+", encoding="utf-8") if path == "-" else open(path, encoding="utf-8") as stream:
            if path == "-":  # import reads the file twice: keep standard input in a temporary file
                shutil.copyfileobj(sys.stdin, stream)
                stream.seek(0)
            with command.progress() as progress:
                task = progress.add_task("validating, importing", total=None)
                done = {}

                def advance(kind, count):
                    done[kind] = count
                    progress.update(task, completed=sum(done.values()))

                try:
                    report = command.service.import_memories(
                        stream,
                        dry_run=options["dry_run"],
                        on_progress=advance,
                        allow_forgotten=options["allow_forgotten"],
                    )
                except ImportRejected as exc:
                    lines = "\n".join(f"  line {line}: {field}: {message}" for line, field, message in exc.errors)
                    raise CommandError(f"import refused, nothing was written:\n{lines}") from None
        if options["json"]:
            return command.print_json(report.as_dict())
        table = Table(title="Import" + (" (dry run: nothing written)" if report.dry_run else ""))
        table.add_column("kind")
        table.add_column("added" if not report.dry_run else "would add", justify="right")
        table.add_column("already present", justify="right")
        for kind, n in report.added.items():
            table.add_row(kind, f"{n:,}", f"{report.present.get(kind, 0):,}")
        command.console.print(table)


class ClearSubcommand(Subcommand):
    name = "clear"
    help = "Delete memory by type, scope, agent or user (asks for confirmation unless --force)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--type",
            dest="kinds",
            action="append",
            choices=["facts", "episodes", "procedures", "users"],
            help="repeat for several; default: every type the filters apply to",
        )
        parser.add_argument("--scope", help="facts of this scope only")
        parser.add_argument("--agent", dest="agent_id")
        parser.add_argument("--user", dest="user_id", type=int, help="memory user id")
        parser.add_argument("--force", action="store_true", help="do not ask for confirmation")
        _json_flag(parser)

    def handle(self, command, options):
        filters = {k: options[k] for k in ("scope", "agent_id", "user_id") if options[k] is not None}
        what = ", ".join(options["kinds"] or ["every memory type"])
        where = " and ".join(f"{k} = {v}" for k, v in filters.items()) or "everything"
        if not options["force"]:
            if not sys.stdin.isatty():
                raise CommandError("clear asks for confirmation; on a non-interactive run pass --force")
            answer = input(f"Delete {what} matching {where}? This cannot be undone. Type 'yes' to continue: ")
            if answer.strip().lower() != "yes":
                raise CommandError("nothing deleted")
        deleted = command.service.clear_memories(options["kinds"], **filters)
        if options["json"]:
            return command.print_json({"deleted": deleted})
        command.console.print("deleted " + (", ".join(f"{n:,} {k}" for k, n in deleted.items()) or "nothing"))


class ConsolidateSubcommand(Subcommand):
    name = "consolidate"
    help = "Distil unprocessed episodes into facts (exit status 1 when any episode failed)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--limit", type=int, help="episodes to take (default CONSOLIDATION['MAX_EPISODES_PER_RUN'])"
        )
        parser.add_argument("--agent", dest="agent_id")
        _json_flag(parser)

    def handle(self, command, options):
        report = command.service.consolidate(limit=options["limit"], agent_id=options["agent_id"])
        data = report.as_dict()
        if options["json"]:
            command.print_json(data)
        else:
            facts = ", ".join(f"{n} {action}" for action, n in data["facts"].items())
            command.console.print(
                f"consolidation ({report.extractor}): {data['episodes_processed']} of {data['episodes_seen']} episodes "
                f"processed; facts: {facts}"
            )
            for pk, error in report.failed.items():
                command.console.print(f"[red]episode {pk}[/red]: {error}")
            for error in report.errors:
                command.console.print(f"[red]{error}[/red]")
        if not report.ok:
            raise CommandError("consolidation finished with failures", returncode=1)


class PromoteSubcommand(Subcommand):
    name = "promote"
    help = "Promote memories recall keeps returning into durable facts, each once (exit status 1 on failures)."

    def add_arguments(self, parser):
        parser.add_argument("--min-recalls", type=int, help="default PROMOTION['MIN_RECALLS']")
        parser.add_argument("--min-sessions", type=int, help="episodes only; default PROMOTION['MIN_SESSIONS']")
        parser.add_argument("--dry-run", action="store_true", help="show what would be promoted, write nothing")
        _json_flag(parser)

    def handle(self, command, options):
        report = command.service.promote(
            min_recalls=options["min_recalls"], min_sessions=options["min_sessions"], dry_run=options["dry_run"]
        )
        if options["json"]:
            command.print_json(report.as_dict())
        else:
            table = Table(title="Promotion" + (" (dry run: nothing written)" if report.dry_run else ""))
            for column in ("source", "rule", "user", "recalls", "sessions", "facts"):
                table.add_column(column)
            for entry in report.promoted:
                facts = ", ".join(f"{f['key']} ({f['scope']})" for f in entry["facts"]) or "none extracted"
                user = str(entry["user_id"] or "–")
                table.add_row(
                    entry["source"], entry["rule"], user, str(entry["recalls"]), str(entry["sessions"]), facts
                )
            command.console.print(table)
            command.console.print(f"{report.events_deleted:,} recall events past their retention deleted")
            for source, error in report.failed.items():
                command.console.print(f"[red]{source}[/red]: {error}")
        if not report.ok:
            raise CommandError("promotion finished with failures", returncode=1)


class PruneSubcommand(Subcommand):
    name = "prune"
    help = "Bring memory within MEMORY['LIMITS'] and let other apps prune; reclaim SQLite space."

    def add_arguments(self, parser):
        parser.add_argument("--agent", dest="agent_id")
        parser.add_argument("--dry-run", action="store_true", help="count what would go, delete nothing")
        _json_flag(parser)

    def handle(self, command, options):
        report = command.service.prune(agent_id=options["agent_id"], dry_run=options["dry_run"])
        if options["json"]:
            return command.print_json(report.as_dict())
        table = Table(title="Prune" + (" (dry run: nothing deleted)" if report.dry_run else ""))
        table.add_column("kind")
        table.add_column("would delete" if report.dry_run else "deleted", justify="right")
        for kind, n in report.deleted.items():
            table.add_row(kind, f"{n:,}")
        command.console.print(table)
        if report.reclaimed_pages:
            command.console.print(f"{report.reclaimed_pages:,} free pages given back to the file system")


class HistorySubcommand(Subcommand):
    name = "history"
    help = "A fact's versions, oldest first: by fact id, or by --key and its owner (deleted facts' too)."

    def add_arguments(self, parser):
        parser.add_argument("fact_id", nargs="?", type=int, help="the fact's id (a deleted fact's works too)")
        parser.add_argument("--key", help="instead of an id: the key, with its owner below (default global)")
        parser.add_argument("--scope", choices=["session", "user", "agent", "global"])
        parser.add_argument("--agent", dest="agent_id", default="")
        parser.add_argument("--user", dest="user_id", type=int, help="memory user id (merges followed)")
        parser.add_argument("--session", dest="session_id", default="")
        parser.add_argument("--limit", type=int, help="only the latest N versions")
        _json_flag(parser)

    COLUMNS = ["valid_from", "action", "fact_id", "owner", "value", "confidence", "fact_type", "provenance", "episode"]

    def handle(self, command, options):
        scope = options["scope"]
        if scope is None and options["key"] is not None:  # the owner option given says which scope
            given = [("user", options["user_id"]), ("agent", options["agent_id"]), ("session", options["session_id"])]
            scope = next((name for name, value in given if value not in (None, "")), "global")
        versions = command.service.fact_history(
            options["fact_id"],
            key=options["key"],
            scope=scope,
            agent_id=options["agent_id"],
            user_id=options["user_id"],
            session_id=options["session_id"],
            limit=options["limit"],
        )
        rows = [
            {
                "id": v.pk,
                "valid_from": v.valid_from.isoformat(),
                "action": v.action,
                "fact_id": v.fact_id,
                "key": v.key,
                "owner": v.scope_key,
                "value": v.value,
                "confidence": round(v.confidence, 3),
                "fact_type": v.fact_type,
                "provenance": v.provenance,
                "episode": v.source_episode_id,
                "current": v.current,
            }
            for v in versions
        ]
        if options["json"]:
            return command.print_json({"count": len(rows), "versions": rows})
        what = f"fact {options['fact_id']}" if options["fact_id"] is not None else f"{options['key']!r}"
        table = Table(title=f"History of {what} ({len(rows)} versions, oldest first)")
        for column in self.COLUMNS:
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(
                *(
                    ""
                    if row[c] is None
                    else row[c][:19].replace("T", " ")
                    if c == "valid_from"
                    else str(row[c])
                    if isinstance(row[c], (int, float))
                    else _short(row[c])
                    for c in self.COLUMNS
                )
            )
        command.console.print(table)


class HealthSubcommand(Subcommand):
    name = "health"
    help = "Seed 001's five health metrics, the weighted score and its colour band."

    def add_arguments(self, parser):
        parser.add_argument("--agent", dest="agent_id")
        _json_flag(parser)

    def handle(self, command, options):
        report = command.service.memory_health(agent_id=options["agent_id"])
        data = report.as_dict()
        if options["json"]:
            return command.print_json(data)
        style = BAND_STYLE[report.band]
        table = Table(
            title=f"Memory health: [{style}]{report.band}[/{style}]"
            + ("" if report.score is None else f" ({report.score:.1f})")
        )
        table.add_column("metric")
        table.add_column("weight", justify="right")
        table.add_column("score", justify="right")
        for name, weight in data["weights"].items():
            value = data["metrics"][name]
            table.add_row(name, f"{weight}%", "n/a" if value is None else f"{value:.1f}")
        command.console.print(table)


class ReindexSubcommand(Subcommand):
    name = "reindex"
    help = "Embed every recall document with the configured embedder and record it as the vectors' model."

    def add_arguments(self, parser):
        parser.add_argument(
            "--missing", action="store_true", help="only documents without a vector (the model must be unchanged)"
        )
        parser.add_argument("--batch-size", type=int, default=256, help="documents per transaction (default 256)")

    def handle(self, command, options):
        from memory.embeddings import EmbeddingModelChanged
        from memory.recall_service import NoEmbedder

        if options["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1")
        with command.progress() as progress:
            task = progress.add_task("embedding recall documents", total=None)
            try:
                count = command.service.reindex_recall(
                    missing_only=options["missing"],
                    batch_size=options["batch_size"],
                    progress=lambda done, total: progress.update(task, completed=done, total=total),
                )
            except (NoEmbedder, EmbeddingModelChanged) as exc:
                raise CommandError(str(exc)) from exc
        command.stdout.write(f"embedded {count} recall documents")


class VerifyErasureSubcommand(Subcommand):
    name = "verify-erasure"
    help = (
        "After forgetting a person: scan every table, owner column and (SQLite) the database files and "
        "their WAL for what identified them; exit 1 listing each trace, 0 when none is left."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "identifiers",
            nargs="*",
            help="what identified the person: display name, canonical id (telegram:42), external ids, e-mail",
        )
        parser.add_argument(
            "--user-id",
            dest="user_ids",
            type=int,
            action="append",
            default=[],
            help="their memory user id (and of users merged into them); repeatable",
        )
        parser.add_argument(
            "--text",
            dest="texts",
            action="append",
            default=[],
            help="anything else they said that must be gone (a secret, a phrase); repeatable",
        )

    def handle(self, command, options):
        from memory.erasure import find_traces

        needles = [*options["identifiers"], *options["texts"]]
        for ident in options["identifiers"]:  # a canonical id also names its external id
            if ":" in ident:
                needles.append(ident.split(":", 1)[1])
        if not needles and not options["user_ids"]:
            raise CommandError("name what to look for: identifiers, --user-id or --text")
        with command.progress() as progress:
            progress.add_task("scanning tables and files", total=None)
            traces = find_traces(needles, options["user_ids"])
        if not traces:
            command.stdout.write(f"0 traces of {len(needles)} identifier(s) and {len(options['user_ids'])} user id(s)")
            return
        for where, what in traces:
            command.stdout.write(f"{where}: {what}")
        raise CommandError(f"{len(traces)} trace(s) left", returncode=1)


class ExportPersonSubcommand(Subcommand):
    name = "export-person"
    help = "Everything held about one person (a subject access request), as JSON Lines."

    def add_arguments(self, parser):
        parser.add_argument("user", help="memory user id, or a canonical id such as telegram:42")
        parser.add_argument("--output", "-o", help="file to write (default: standard output)")

    def handle(self, command, options):
        user_id = _person_id(command.service, options["user"])
        if options["output"]:
            with open(options["output"], "w", encoding="utf-8") as out:
                lines = command.service.export_person(user_id, out)
            command.stderr.write(f"wrote {lines} lines to {options['output']}")
        else:
            command.service.export_person(user_id, command.stdout)


class McpSubcommand(Subcommand):
    name = "mcp"
    help = "Serve recall, remember and forget over MCP: stdio for one agent (and user), or HTTP with tokens."

    def add_arguments(self, parser):
        parser.add_argument("--agent", help="stdio: the agent the tools act for (required without --http)")
        parser.add_argument("--user", help="stdio: the memory user (id, or a canonical id such as telegram:42)")
        parser.add_argument("--http", action="store_true", help="streamable HTTP at /mcp, MEMORY['MCP_TOKENS'] auth")
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8765)

    def handle(self, command, options):
        from django.core.exceptions import ImproperlyConfigured

        from memory.mcp_server import Caller, build_server, configured_callers, token_caller

        if options["http"]:
            if options["agent"] or options["user"]:
                raise CommandError("--agent and --user are for stdio; over HTTP each token names its caller")
            try:
                callers = configured_callers()
            except ImproperlyConfigured as exc:
                raise CommandError(str(exc)) from None
            if not callers:
                raise CommandError("set MEMORY['MCP_TOKENS'] = {token: {'agent': ..., 'user': ...}} first")
            for position, caller in enumerate(callers.values(), 1):
                if caller.user_id is not None:
                    _existing_person(command.service, caller.user_id, f"MEMORY['MCP_TOKENS'] entry {position}")
            import uvicorn

            url = f"http://{options['host']}:{options['port']}"
            app = build_server(token_caller, http_url=url).streamable_http_app(host=options["host"])
            uvicorn.run(app, host=options["host"], port=options["port"], log_level="warning")
            return
        if options["agent"] is None or not options["agent"].strip():
            raise CommandError("--agent is required (the agent the tools act for)")
        if len(options["agent"].strip()) > 128:
            raise CommandError("--agent: must be at most 128 characters")
        user_id = None
        if options["user"]:
            user_id = _existing_person(command.service, _person_id(command.service, options["user"]), "--user")
        caller = Caller(agent_id=options["agent"].strip(), user_id=user_id)
        build_server(lambda: caller).run("stdio")


def _existing_person(service, user_id, where):
    """The surviving memory user of `user_id` (following merges), or a CommandError naming `where`."""
    try:
        return service.resolve_user(user_id).pk
    except MemoryServiceError as exc:
        raise CommandError(f"{where}: {exc}") from None


def _person_id(service, given):
    """A memory user id from an id or a canonical id (channel:external id)."""
    if given.isascii() and given.isdigit():
        return int(given)
    channel, sep, external = given.partition(":")
    if not sep:
        raise CommandError(f"{given!r} is neither a memory user id nor a canonical id (channel:external id)")
    found = service.memory_user_list().filter(identities__channel=channel, identities__external_id=external).first()
    if found is None:
        raise CommandError(f"no memory user has the identity {given}")
    return found.pk


SUBCOMMANDS = [
    ListSubcommand(),
    StatsSubcommand(),
    ExportSubcommand(),
    ImportSubcommand(),
    ClearSubcommand(),
    ConsolidateSubcommand(),
    PromoteSubcommand(),
    PruneSubcommand(),
    HistorySubcommand(),
    HealthSubcommand(),
    ReindexSubcommand(),
    VerifyErasureSubcommand(),
    ExportPersonSubcommand(),
    McpSubcommand(),
]


class Command(BaseCommand):
    help = (
        "Operate the memory: list, stats, export, import, clear, consolidate, promote, prune, history, health, "
        "reindex, "
        "verify-erasure, export-person, mcp."
    )

    def add_arguments(self, parser):
        subparsers = parser.add_subparsers(dest="subcommand", required=True, metavar="subcommand")
        for sub in SUBCOMMANDS:
            sub.add_arguments(subparsers.add_parser(sub.name, help=sub.help, description=sub.help))

    def handle(self, *args, subcommand, **options):
        self.service = MemoryService()
        self.console = Console(file=self.stdout, soft_wrap=False, width=shutil.get_terminal_size((140, 24)).columns)
        self.err_console = Console(file=self.stderr)
        try:
            next(s for s in SUBCOMMANDS if s.name == subcommand).handle(self, options)
        except MemoryServiceError as exc:  # a bad filter or argument: say which, change nothing
            raise CommandError(str(exc)) from None

    def print_json(self, data):
        self.stdout.write(json.dumps(data, ensure_ascii=False, default=str))

    def progress(self):
        columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
        return Progress(*columns, console=self.err_console, transient=True)
