"""What workflows adds to `python manage.py memory`: the `reminders` delivery worker.

The `memory` command lives in the memory app, which never imports workflows; WorkflowsConfig.ready()
adds these subcommands to its SUBCOMMANDS list, the way that command is extended.
"""

import signal
import threading

from django.core.management.base import CommandError

from memory.management.commands.memory import Subcommand

from ..channels.delivery import run_worker


class RemindersSubcommand(Subcommand):
    name = "reminders"
    help = (
        "Deliver due reminders and Telegram replies waiting in the outbox: a worker loop (Ctrl-C or SIGTERM "
        "stops it), or --once for cron."
    )

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="deliver what is due now, then exit (for cron)")
        parser.add_argument("--batch", type=int, default=None, help="reminders per claim (REMINDER_BATCH_SIZE)")
        parser.add_argument("--lease", type=float, default=None, help="seconds a claim holds (REMINDER_LEASE_SECONDS)")
        parser.add_argument(
            "--poll", type=float, default=None, help="seconds between looks when nothing is due (REMINDER_POLL_SECONDS)"
        )
        parser.add_argument("--json", action="store_true", help="print exactly one JSON object")

    def handle(self, command, options):
        for name in ("batch", "lease", "poll"):
            value = options[name]
            if value is not None and value <= 0:
                raise CommandError(f"--{name}: must be positive")
        stop = threading.Event()
        if not options["once"] and threading.current_thread() is threading.main_thread():
            # Finish the reminder being sent, give back the rest of the claim, then exit.
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda *_: stop.set())
            command.err_console.print("delivering reminders (Ctrl-C stops)")

        def on_round(report, total):
            if report.claimed and not options["json"]:
                command.err_console.print(
                    f"claimed {report.claimed}: {report.delivered} delivered, {report.retried} to retry, "
                    f"{report.failed} failed (so far {total.delivered} delivered)"
                )
            if report.replies_claimed and not options["json"]:
                command.err_console.print(
                    f"Telegram replies: {report.replies_sent} sent, {report.replies_retried} to retry, "
                    f"{report.replies_failed} failed (so far {total.replies_sent} sent)"
                )

        try:
            total = run_worker(
                once=options["once"],
                batch=options["batch"],
                lease=options["lease"],
                poll=options["poll"],
                stop=stop,
                on_round=on_round,
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if options["json"]:
            command.print_json({**total.as_dict(), "errors": total.errors})
        else:
            command.console.print(
                f"{total.delivered} delivered, {total.retried} to retry, {total.failed} failed"
                + (f", {total.lost} taken by another worker" if total.lost else "")
                + (f"; Telegram replies: {total.replies_sent} sent" if total.replies_claimed else "")
            )
            for error in total.errors:
                command.console.print(f"[red]error:[/] {error}")


def register():
    """Add workflows' subcommands to `manage.py memory` (once, whatever calls ready())."""
    from memory.management.commands import memory

    known = {sub.name for sub in memory.SUBCOMMANDS}
    memory.SUBCOMMANDS.extend(sub for sub in (RemindersSubcommand(),) if sub.name not in known)
