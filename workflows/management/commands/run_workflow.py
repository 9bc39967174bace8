"""Run a workflow once from the command line, as a manual trigger."""

import json

from django.core.management.base import BaseCommand, CommandError

from workflows.exceptions import InvalidTrigger
from workflows.graph.runtime import WorkflowNotFound, get_workflow, run_workflow


class Command(BaseCommand):
    help = "Run a workflow for a user and a message, and print the reply (--json: the whole result)."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument(
            "--user",
            required=True,
            help="who speaks: CHANNEL:ID (e.g. telegram:42, chat:ada), an email address, or a plain name (channel 'manual')",
        )
        parser.add_argument("--message", required=True)
        parser.add_argument("--name", default="", help="display name for a new user")
        parser.add_argument("--conversation", default="", help="conversation id (default: direct)")
        parser.add_argument("--json", action="store_true", dest="as_json", help="print the run's result as JSON")

    def handle(self, *args, slug, user, message, name, conversation, as_json, **options):
        try:
            workflow = get_workflow(slug)
        except WorkflowNotFound as exc:
            raise CommandError(str(exc)) from None
        payload = {"message": message, "display_name": name}
        if conversation:
            payload["conversation_id"] = conversation
        if "@" in user and ":" not in user:
            payload["email"] = user
        elif ":" in user:
            channel, _, external = user.partition(":")
            payload.update(channel=channel, user_id=external)
        else:
            payload["user_name"] = user
        try:
            result = run_workflow(workflow, {"type": "manual", "payload": payload})
        except InvalidTrigger as exc:
            raise CommandError(f"--user/--message: {exc}") from None
        if as_json:
            self.stdout.write(_dumps(result.as_dict()))
        else:
            self.stdout.write(result.reply)
            for error in result.memory_errors:
                self.stderr.write(f"memory error in {error['node']}: {error['operation']}: {error['error']}")
        if result.memory_errors:
            raise CommandError(f"{len(result.memory_errors)} memory operation(s) failed")


def _dumps(data):
    return json.dumps(data, indent=2, ensure_ascii=False, default=str)
