"""The site's Celery app: background work on workers, when a broker is configured (ENGRAM_TASK_BROKER).

    celery --workdir platform -A config worker --pool solo   # any number, on any machine that reaches the database
    celery --workdir platform -A config beat                 # the schedule (two are safe: each job runs once per period)

A worker runs the embedding model in its own process (memory/tasks.py); with prefork, Celery's
default pool, each child would load its own: `--pool solo` or `--pool threads` keep one per worker.

The tasks are memory/tasks.py and workflows/tasks.py (autodiscovered). Without a broker nothing here
runs: every process embeds its own writes on a worker thread (the embedded default).
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Celery's Django fixup runs the system checks when a worker or beat imports the tasks, and discards
# what they find (nothing is logged, nothing stops); their URL checks import the URLconf, every view
# and the API stack, about 19 MB a worker then holds for good while serving no HTTP. `manage.py check`,
# `migrate` and every server still run them. Set CELERY_SKIP_CHECKS to "" to run them in workers too.
os.environ.setdefault("CELERY_SKIP_CHECKS", "1")

app = Celery("engram")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# The beat's jobs: task name -> the key of MEMORY["TASK_PERIODS"] that gives its period in seconds.
PERIODIC = {
    "memory.periodic_embed_pending": "embed_pending",
    "memory.consolidate": "consolidate",
    "memory.promote": "promote",
    "memory.prune": "prune",
    "workflows.deliver_reminders": "deliver_reminders",
}


@app.on_after_finalize.connect
def schedule_periodic_work(sender, **kwargs):
    from memory.conf import memory_settings

    periods = memory_settings.TASK_PERIODS
    for task, key in PERIODIC.items():
        seconds = periods.get(key)
        if seconds:
            # The period travels with the task: its once-per-period guard counts the same periods.
            sender.add_periodic_task(float(seconds), sender.signature(task, args=(seconds,)), name=key)
