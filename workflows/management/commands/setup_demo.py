"""Create (or restore) the demo workflow: identify_user -> recall -> agent -> remember."""
from django.core.management.base import BaseCommand

from workflows.demo import ensure_demo_workflow


class Command(BaseCommand):
    help = "Create or restore the demo workflow (slug 'demo')."

    def handle(self, *args, **options):
        workflow, created = ensure_demo_workflow()
        self.stdout.write(f"{'created' if created else 'updated'} workflow {workflow.slug!r}")
        self.stdout.write(f"  run it:      python manage.py run_workflow {workflow.slug} --user chat:ada --message 'my name is Ada'")
        self.stdout.write(f"  API:         POST /api/v1/workflows/{workflow.slug}/run/")
        self.stdout.write(f"  Telegram:    POST /telegram/{workflow.slug}/webhook/  or  python manage.py telegram_poll {workflow.slug}")
