"""Subcommands that report: list, stats, history, health, verify-erasure, export-person."""

from django.core.management.base import CommandError
from rich.table import Table

from ...service import MemoryService
from .base import BAND_STYLE, Subcommand, json_flag, person_id, short, when


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
        json_flag(parser)

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
                    value = when(value)
                elif isinstance(value, list):
                    value = ", ".join(value)
                cells.append(
                    "" if value is None else short(value) if not isinstance(value, (int, float, bool)) else str(value)
                )
            table.add_row(*cells)
        command.console.print(table)


class StatsSubcommand(Subcommand):
    name = "stats"
    help = "Counts per kind and scope, episodes waiting for consolidation, the last consolidation."

    def add_arguments(self, parser):
        json_flag(parser)

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


class HistorySubcommand(Subcommand):
    name = "history"
    help = "A fact's versions, oldest first: by fact id, or by --key and its owner (deleted facts' too)."

    def add_arguments(self, parser):
        parser.add_argument("fact_id", nargs="?", type=int, help="the fact's id (a deleted fact's works too)")
        parser.add_argument("--key", help="instead of an id: the key, with its owner below (default global)")
        parser.add_argument("--scope", choices=["session", "user", "agent", "team", "global"])
        parser.add_argument("--agent", dest="agent_id", default="")
        parser.add_argument("--team", help="a team's name (a team fact's owner)")
        parser.add_argument("--user", dest="user_id", type=int, help="memory user id (merges followed)")
        parser.add_argument("--session", dest="session_id", default="")
        parser.add_argument("--limit", type=int, help="only the latest N versions")
        json_flag(parser)

    COLUMNS = ["valid_from", "action", "fact_id", "owner", "value", "confidence", "fact_type", "provenance", "episode"]

    def handle(self, command, options):
        scope = options["scope"]
        if scope is None and options["key"] is not None:  # the owner option given says which scope
            given = [
                ("user", options["user_id"]),
                ("agent", options["agent_id"]),
                ("session", options["session_id"]),
                ("team", options["team"]),
            ]
            scope = next((name for name, value in given if value not in (None, "")), "global")
        versions = command.service.fact_history(
            options["fact_id"],
            key=options["key"],
            scope=scope,
            agent_id=options["agent_id"],
            user_id=options["user_id"],
            session_id=options["session_id"],
            team=options["team"],
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
                    else short(row[c])
                    for c in self.COLUMNS
                )
            )
        command.console.print(table)


class HealthSubcommand(Subcommand):
    name = "health"
    help = "The five health metrics, the weighted score and its colour band."

    def add_arguments(self, parser):
        parser.add_argument("--agent", dest="agent_id")
        parser.add_argument(
            "--snapshot",
            action="store_true",
            help="store today's snapshot of the whole memory and of each agent (run daily), and list them",
        )
        json_flag(parser)

    def handle(self, command, options):
        if options["snapshot"]:
            if options["agent_id"] is not None:
                raise CommandError("--snapshot takes every agent at once; leave out --agent")
            return self._snapshot(command, options)
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

    def _snapshot(self, command, options):
        taken = command.service.snapshot_health()
        rows = [{"agent_id": s.agent_id, "day": s.day.isoformat(), "score": s.score, "band": s.band} for s in taken]
        if options["json"]:
            return command.print_json({"snapshots": rows})
        table = Table(title=f"Health snapshots of {taken[0].day}")
        for column in ("agent", "band", "score"):
            table.add_column(column)
        for row in rows:
            score = "n/a" if row["score"] is None else f"{row['score']:.1f}"
            table.add_row(row["agent_id"] or "(all agents)", row["band"], score)
        command.console.print(table)


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
        from memory.operations.erasure import find_traces

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
        user_id = person_id(command.service, options["user"])
        if options["output"]:
            with open(options["output"], "w", encoding="utf-8") as out:
                lines = command.service.export_person(user_id, out)
            command.stderr.write(f"wrote {lines} lines to {options['output']}")
        else:
            command.service.export_person(user_id, command.stdout)
