"""Settings of the workflows app: the WORKFLOWS dict in Django settings, read with defaults."""

import warnings

from django.conf import settings
from django.core.signals import setting_changed

DEFAULTS = {
    # Conversation memory. "sqlite" (a file at CHECKPOINT_PATH) or "postgres" (the Django database);
    # None picks PostgreSQL when the default database is PostgreSQL, else SQLite.
    "CHECKPOINTER": None,
    # Path of the SQLite checkpoint file; None: checkpoints.db in the site's data folder.
    "CHECKPOINT_PATH": None,
    # When an agent's conversation is checkpointed (LangGraph durability): "exit" saves it once per
    # turn, when the agent is done; "async"/"sync" save after every step (tool calls included).
    "CHECKPOINT_DURABILITY": "exit",
    # Threads kept per workflow (the most recently active); None keeps all.
    "MAX_THREADS_PER_WORKFLOW": None,
    # Checkpoints kept per thread (the newest; the thread still resumes); None keeps all. Enforced
    # after each run that crosses it and by `manage.py memory prune`.
    "MAX_CHECKPOINTS_PER_THREAD": None,
    # Bytes of checkpoints one person's threads may hold (as the saver's serializer encodes them).
    # Reached, a turn is refused its conversation memory: the agent answers without it and says so
    # in memory_errors; conversation() raises LimitReached. None: no cap.
    "MAX_CHECKPOINT_BYTES_PER_USER": 20 * 1024 * 1024,
    # Active procedures matching a run that recall puts in the agent's system prompt ("Learned
    # Procedures and Policies"); each one's use and the run's outcome are recorded after the run.
    "PROMPT_PROCEDURES": 5,
    # Messages of a conversation an agent keeps (and sends to its model) by default.
    "HISTORY_LIMIT": 20,
    # Characters a conversation's running summary (its turns past the history limit) aims at: the
    # summarizing model is asked to stay within it; the offline, extractive summary keeps its newest
    # lines within it.
    "SUMMARY_MAX_CHARS": 4000,
    # The in-session memory nudge: after this many turns of a conversation in which the
    # agent wrote nothing to memory, its next turn's system prompt reminds it to store what is worth
    # keeping. Only for agents with a memory-writing tool; None or 0 turns it off.
    "NUDGE_AFTER_TURNS": 6,
    # The chat model of agent nodes. None: the offline responder. Either
    # {"class": "dotted.path.ChatModel", "kwargs": {...}} for any LangChain chat model, or
    # {"base_url": ..., "api_key": ..., "model": ...} for an OpenAI-compatible server (extra "openai").
    "CHAT_MODEL": None,
    # How many recursion steps one agent turn may take (model calls + tool calls).
    "AGENT_RECURSION_LIMIT": 12,
    # How many of the person's and the session's own facts a recall reads to top up its answer when
    # the query matched fewer facts than the recall's limit (the most confident of them fill the rest).
    # Not MEMORY["RECALL_CANDIDATES"], which is how deep each leg of the search itself looks.
    "TOP_UP_FACTS": 200,
    # Character budget of the memory lines a recall node puts in the prompt (its `max_memory_chars`
    # overrides it); None: no budget. Pinned memory always goes in; the rest by score while it fits.
    "MAX_MEMORY_CHARS": None,
    # Telegram Bot API: base URL (tests point it at a local server), bot token, webhook secret token.
    "TELEGRAM_API_BASE": "https://api.telegram.org",
    "TELEGRAM_BOT_TOKEN": "",
    "TELEGRAM_WEBHOOK_SECRET": "",
    # Seconds to wait for the Bot API (sendMessage); getUpdates adds its long-poll timeout.
    "TELEGRAM_TIMEOUT": 10.0,
    "TELEGRAM_POLL_TIMEOUT": 25,
    # Telegram messages whose sender is not one person (anonymous group admins, channel posts, messages
    # sent on behalf of a chat, forwards): "chat" runs them as the chat (memory user telegram_chat:<chat
    # id>, shared by that chat only); "ignore" acknowledges them without a run. Never as the sender.
    "TELEGRAM_SHARED_SENDERS": "chat",
    # Seen update_ids are kept this long (Telegram gives up redelivering after 24 hours); the
    # older ones are deleted every 1,000th update.
    "TELEGRAM_UPDATE_RETENTION_HOURS": 48,
    # Seconds a server process holds a Telegram update it is running; it renews the claim while alive,
    # so the lease only runs out when the process died mid-run, and then the update's next delivery
    # (Telegram's retry) runs it again. Also how long a sender holds a reply it is sending.
    "TELEGRAM_RUN_LEASE_SECONDS": 30,
    # Replies (the outbox): a failed sendMessage is tried again after
    # TELEGRAM_REPLY_BACKOFF_SECONDS * 2 ** (n - 1), at most TELEGRAM_REPLY_BACKOFF_MAX_SECONDS, by the
    # delivery worker or the update's next delivery; after TELEGRAM_REPLY_MAX_ATTEMPTS, or at once when
    # the Bot API refuses it for good (400, 403), it is marked failed. After a failed send a process
    # leaves its new replies to those retries for TELEGRAM_REPLY_BACKOFF_SECONDS.
    "TELEGRAM_REPLY_MAX_ATTEMPTS": 12,
    "TELEGRAM_REPLY_BACKOFF_SECONDS": 2,
    "TELEGRAM_REPLY_BACKOFF_MAX_SECONDS": 300,
    # Reminders (the `remind` tool, delivered by `manage.py memory reminders`).
    # Seconds a worker holds the reminders it claimed; a crashed worker's claims are taken again after
    # it. Must be well above TELEGRAM_TIMEOUT: a worker sends nothing once less than that remains.
    "REMINDER_LEASE_SECONDS": 120,
    # Reminders POSTed to a workflow's triggers.webhook.reminder_url: seconds to wait for an answer (the
    # lease must exceed it too), and a secret that signs each body (X-Engram-Signature: sha256=<HMAC
    # of the body>, hex) so the receiver can tell Engram sent it; "" sends unsigned.
    "REMINDER_WEBHOOK_TIMEOUT": 10.0,
    "REMINDER_WEBHOOK_SECRET": "",
    # Reminders one claim takes (each is sent and recorded on its own).
    "REMINDER_BATCH_SIZE": 20,
    # Attempts before a reminder is marked failed; the wait after the n-th failure is
    # REMINDER_BACKOFF_SECONDS * 2 ** (n - 1), at most REMINDER_BACKOFF_MAX_SECONDS.
    "REMINDER_MAX_ATTEMPTS": 5,
    "REMINDER_BACKOFF_SECONDS": 30,
    "REMINDER_BACKOFF_MAX_SECONDS": 3600,
    # PostgreSQL: wait for the WAL flush when recording each outcome. Off (the default), a database
    # crash can forget the last fraction of a second of deliveries, which are then sent again.
    "REMINDER_SYNCHRONOUS_COMMIT": False,
    # Seconds the worker loop sleeps when nothing is due.
    "REMINDER_POLL_SECONDS": 5,
    # How far ahead a reminder may be set, and how many pending reminders one person may have.
    "REMINDER_MAX_DAYS_AHEAD": 366,
    "REMINDER_MAX_PENDING_PER_USER": 100,
    # `memory prune` deletes delivered, failed and cancelled reminders due more than this many days
    # ago; None keeps them all.
    "REMINDER_RETENTION_DAYS": None,
    # `memory prune` deletes workflow runs (the builder's run records) started more than this many days
    # ago; None keeps them all.
    "RUN_RETENTION_DAYS": 30,
    # Languages the `remind` tool reads natural times in ("in 2 hours", "tomorrow at 9am"); dateparser codes.
    "REMINDER_LANGUAGES": ["en"],
}


# Keys renamed, new name -> old name: the old one is still read, with a DeprecationWarning, for one release.
RENAMED = {"TOP_UP_FACTS": "RECALL_CANDIDATES"}


class WorkflowSettings:
    """Attribute access to WORKFLOWS settings with defaults, like DRF's api_settings."""

    def __init__(self, defaults):
        self._defaults = defaults
        self._cache = {}

    def __getattr__(self, name):
        if name.startswith("_") or name not in self._defaults:
            raise AttributeError(f"Unknown WORKFLOWS setting: {name!r}")
        if name not in self._cache:
            user = getattr(settings, "WORKFLOWS", {}) or {}
            old = RENAMED.get(name)
            if name not in user and old in user:
                warnings.warn(
                    f"WORKFLOWS[{old!r}] is deprecated: it is WORKFLOWS[{name!r}] now (the old name is read until the next release)",
                    DeprecationWarning,
                    stacklevel=2,
                )
                self._cache[name] = user[old]
            else:
                self._cache[name] = user.get(name, self._defaults[name])
        return self._cache[name]

    def reload(self):
        self._cache.clear()


workflow_settings = WorkflowSettings(DEFAULTS)


def on_workflow_settings_changed(reset):
    """Connect `reset()` to run whenever the WORKFLOWS setting changes (tests' override_settings).

    Each module that caches something derived from WORKFLOWS connects its own reset; this module
    imports none of them.
    """

    def receiver(*, setting, **kwargs):
        if setting == "WORKFLOWS":
            reset()

    setting_changed.connect(receiver, weak=False)
    return receiver


on_workflow_settings_changed(workflow_settings.reload)
