"""`python manage.py memory <subcommand>`: operators' memory tasks. Subcommands: reindex.

Each subcommand is one method `handle_<name>` with its arguments added in `add_<name>_arguments`;
add one by adding that pair and listing it in SUBCOMMANDS.
"""
from django.core.management.base import BaseCommand, CommandError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from memory.embeddings import EmbeddingModelChanged
from memory.recall_service import NoEmbedder
from memory.service import MemoryService

SUBCOMMANDS = {
    "reindex": "Embed every recall document with the configured embedder and record it as the vectors' model.",
}


class Command(BaseCommand):
    help = "Memory tasks: " + "; ".join(f"{name}: {text}" for name, text in SUBCOMMANDS.items())

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="subcommand", title="subcommands", required=True)
        for name, text in SUBCOMMANDS.items():
            sub_parser = sub.add_parser(name, help=text, description=text)
            getattr(self, f"add_{name}_arguments")(sub_parser)

    def handle(self, *args, subcommand, **options):
        return getattr(self, f"handle_{subcommand}")(**options)

    # ---- reindex

    def add_reindex_arguments(self, parser):
        parser.add_argument(
            "--missing", action="store_true", help="only documents without a vector (the model must be unchanged)"
        )
        parser.add_argument("--batch-size", type=int, default=256, help="documents per transaction (default 256)")

    def handle_reindex(self, *, missing, batch_size, verbosity=1, **_):
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1")
        console = Console(file=self.stderr._out, force_terminal=False) if verbosity else None
        service = MemoryService()
        progress = Progress(
            TextColumn("embedding recall documents"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
            console=console, disable=not verbosity,
        )
        task = progress.add_task("reindex", total=None)

        def advance(done, total):
            progress.update(task, completed=done, total=total)

        try:
            with progress:
                count = service.reindex_recall(missing_only=missing, batch_size=batch_size, progress=advance)
        except (NoEmbedder, EmbeddingModelChanged) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"embedded {count} recall documents")
