"""`python manage.py memory <subcommand>`: list, stats, export, import, clear, consolidate, prune, history, health.

Tables (rich) for people; `--json` prints exactly one JSON object for programs. Each subcommand
is one class with `add_arguments(parser)` and `handle(command, options)`, listed in SUBCOMMANDS:
another app's subcommand (recall's `reindex`) joins by adding its class there.
"""

import json
import shutil

from django.core.management.base import BaseCommand, CommandError
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from memory.exceptions import MemoryServiceError
from memory.models import Workspace, in_workspace
from memory.service import MemoryService

from ..subcommands.base import Subcommand  # noqa: F401  (other apps subclass it from here)
from ..subcommands.maintenance import (
    ClearSubcommand,
    CompactSubcommand,
    ConsolidateSubcommand,
    ExportSubcommand,
    ImportSubcommand,
    McpSubcommand,
    PromoteSubcommand,
    PruneSubcommand,
    ReindexSubcommand,
)
from ..subcommands.reporting import (
    ExportPersonSubcommand,
    HealthSubcommand,
    HistorySubcommand,
    ListSubcommand,
    StatsSubcommand,
    VerifyErasureSubcommand,
)

SUBCOMMANDS = [
    ListSubcommand(),
    StatsSubcommand(),
    ExportSubcommand(),
    ImportSubcommand(),
    ClearSubcommand(),
    ConsolidateSubcommand(),
    CompactSubcommand(),
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
        parser.add_argument(
            "--workspace",
            metavar="SLUG",
            help="work in this workspace only (before the subcommand); default: every workspace's rows",
        )
        subparsers = parser.add_subparsers(dest="subcommand", required=True, metavar="subcommand")
        for sub in SUBCOMMANDS:
            sub.add_arguments(subparsers.add_parser(sub.name, help=sub.help, description=sub.help))

    def handle(self, *args, subcommand, workspace=None, **options):
        self.service = MemoryService()
        self.console = Console(file=self.stdout, soft_wrap=False, width=shutil.get_terminal_size((140, 24)).columns)
        self.err_console = Console(file=self.stderr)
        workspace_id = None
        if workspace is not None:
            workspace_id = Workspace.objects.filter(slug=workspace).values_list("pk", flat=True).first()
            if workspace_id is None:
                raise CommandError(f"--workspace: no workspace has the slug {workspace!r}")
        try:
            with in_workspace(workspace_id):
                next(s for s in SUBCOMMANDS if s.name == subcommand).handle(self, options)
        except MemoryServiceError as exc:  # a bad filter or argument: say which, change nothing
            raise CommandError(str(exc)) from None

    def print_json(self, data):
        self.stdout.write(json.dumps(data, ensure_ascii=False, default=str))

    def progress(self):
        columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
        return Progress(*columns, console=self.err_console, transient=True)
