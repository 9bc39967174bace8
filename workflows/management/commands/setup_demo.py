"""Create (or restore) the demo workflow: identify_user -> recall -> agent -> remember."""

from django.core.management.base import BaseCommand

from workflows.demo import ensure_demo_workflow


class Command(BaseCommand):
    help = "Create the demo workflow (slug 'demo') if it is missing; --reset restores its definition."

    def add_arguments(self, parser):
        parser.add_argument("--reset", action="store_true", help="restore the demo's definition if it was edited")

    def handle(self, *args, reset, **options):
        workflow, created = ensure_demo_workflow(reset=reset)
        state = "created" if created else ("restored" if reset else "kept the existing")
        self.stdout.write(f"{state} workflow {workflow.slug!r}")
        self.stdout.write(
            f"  run it:      python manage.py run_workflow {workflow.slug} --user chat:ada --message 'my name is Ada'"
        )
        self.stdout.write(f"  API:         POST /api/v1/workflows/{workflow.slug}/run/")
        self.stdout.write(
            f"  Telegram:    POST /telegram/{workflow.slug}/webhook/  or  python manage.py telegram_poll {workflow.slug}"
        )
