"""Subcommands that change or move the memory: export, import, clear, consolidate, promote, prune, reindex, mcp."""

import shutil
import sys
import tempfile

from django.core.management.base import CommandError
from rich.markup import escape
from rich.table import Table

from ...exceptions import ImportRejected
from .base import Subcommand, existing_person, json_flag, person_id


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
        json_flag(parser)

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


_CLEAR_DEST = {"type": "kinds", "scope": "scope", "agent": "agent_id", "user": "user_id"}


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
        parser.add_argument(
            "--sessions",
            action="store_true",
            help="session-scoped facts only (what conversations noted for themselves); alone",
        )
        parser.add_argument("--force", action="store_true", help="do not ask for confirmation")
        json_flag(parser)

    def handle(self, command, options):
        if options["sessions"]:
            # The seeds' --sessions-only: a session's facts, every other memory kept. Filters would
            # only narrow it to nothing (session facts have no agent or user), so they are refused.
            given = [f"--{n}" for n in ("type", "scope", "agent", "user") if options[_CLEAR_DEST[n]] is not None]
            if given:
                raise CommandError(f"--sessions clears every session's facts; leave out {', '.join(given)}")
            options = {**options, "kinds": ["facts"], "scope": "session"}
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
        json_flag(parser)

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
            if report.procedures is not None:
                for kind, found in (("proposed", report.procedures.proposed), ("evolved", report.procedures.evolved)):
                    for p in found:
                        steps = ", ".join(p["steps"]) or "steps kept"
                        command.console.print(
                            f"procedure {kind} (inactive until approved): {escape(p['name'])}: {escape(steps)}"
                        )
            for pk, error in report.failed.items():
                command.console.print(f"[red]episode {pk}[/red]: {error}")
            for error in report.errors:
                command.console.print(f"[red]{error}[/red]")
        if not report.ok:
            raise CommandError("consolidation finished with failures", returncode=1)


class CompactSubcommand(Subcommand):
    name = "compact"
    help = "Fold old episodes into summary episodes, archiving the originals (exit status 1 on failures)."

    def add_arguments(self, parser):
        parser.add_argument("--agent", dest="agent_id")
        parser.add_argument("--older-than-days", type=float, help="default COMPACTION['AFTER_DAYS']")
        parser.add_argument("--min-episodes", type=int, help="default COMPACTION['MIN_EPISODES']")
        parser.add_argument("--dry-run", action="store_true", help="show what would be compacted, write nothing")
        json_flag(parser)

    def handle(self, command, options):
        report = command.service.compact_episodes(
            agent_id=options["agent_id"],
            older_than_days=options["older_than_days"],
            min_episodes=options["min_episodes"],
            dry_run=options["dry_run"],
        )
        if options["json"]:
            command.print_json(report.as_dict())
        else:
            verb = "would fold" if report.dry_run else "folded"
            for group in report.groups:
                who = f"agent {group['agent_id'] or '–'}, user {group['user_id'] or '–'}"
                into = f" into episode {group['summary_id']}" if group["summary_id"] else ""
                command.console.print(f"{who}: {verb} {len(group['episodes'])} episodes{into}")
            command.console.print(f"{report.archived} episodes archived" + (" (dry run)" if report.dry_run else ""))
            for error in report.errors:
                command.console.print(f"[red]{escape(error)}[/red]")
        if not report.ok:
            raise CommandError("compaction finished with failures", returncode=1)


class PromoteSubcommand(Subcommand):
    name = "promote"
    help = "Promote memories recall keeps returning into durable facts, each once (exit status 1 on failures)."

    def add_arguments(self, parser):
        parser.add_argument("--min-recalls", type=int, help="default PROMOTION['MIN_RECALLS']")
        parser.add_argument("--min-sessions", type=int, help="episodes only; default PROMOTION['MIN_SESSIONS']")
        parser.add_argument("--dry-run", action="store_true", help="show what would be promoted, write nothing")
        json_flag(parser)

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
        json_flag(parser)

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


class ReindexSubcommand(Subcommand):
    name = "reindex"
    help = "Embed every recall document with the configured embedder and record it as the vectors' model."

    def add_arguments(self, parser):
        parser.add_argument(
            "--missing", action="store_true", help="only documents without a vector (the model must be unchanged)"
        )
        parser.add_argument("--batch-size", type=int, default=256, help="documents per transaction (default 256)")

    def handle(self, command, options):
        from memory.embedding.embedder import EmbeddingModelChanged
        from memory.recall.service import NoEmbedder

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
        from memory.models import DEFAULT_WORKSPACE_ID, in_workspace
        from memory.models.workspaces import current_workspace_id

        if options["http"]:
            if options["agent"] or options["user"] or current_workspace_id() is not None:
                raise CommandError(
                    "--agent, --user and --workspace are for stdio; over HTTP each token names its caller"
                )
            try:
                callers = configured_callers()
            except ImproperlyConfigured as exc:
                raise CommandError(str(exc)) from None
            if not callers:
                raise CommandError("set MEMORY['MCP_TOKENS'] = {token: {'agent': ..., 'user': ...}} first")
            for position, caller in enumerate(callers.values(), 1):
                if caller.user_id is not None:
                    with in_workspace(caller.workspace_id):  # the token's person is of the token's workspace
                        existing_person(command.service, caller.user_id, f"MEMORY['MCP_TOKENS'] entry {position}")
            import uvicorn

            url = f"http://{options['host']}:{options['port']}"
            app = build_server(token_caller, http_url=url).streamable_http_app(host=options["host"])
            uvicorn.run(app, host=options["host"], port=options["port"], log_level="warning")
            return
        if options["agent"] is None or not options["agent"].strip():
            raise CommandError("--agent is required (the agent the tools act for)")
        if len(options["agent"].strip()) > 128:
            raise CommandError("--agent: must be at most 128 characters")
        # `memory --workspace SLUG mcp ...`: the tools work in that workspace (its people only).
        workspace_id = current_workspace_id() or DEFAULT_WORKSPACE_ID
        user_id = None
        if options["user"]:
            with in_workspace(workspace_id):
                user_id = existing_person(command.service, person_id(command.service, options["user"]), "--user")
        caller = Caller(agent_id=options["agent"].strip(), user_id=user_id, workspace_id=workspace_id)
        build_server(lambda: caller).run("stdio")
