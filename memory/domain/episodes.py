"""Episodes (episodic memory): what started a run, what was said and done, how it ended. MemoryService delegates to it."""

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from ..conf import memory_settings
from ..exceptions import InvalidMemoryArgument, MemoryNotFound
from ..models import Episode, RecallKind
from ..rules.validation import (
    check_json,
    check_limit,
    check_user_id,
    check_user_in_workspace,
    check_utc_range,
    clean_text,
)
from ..text import episode_concepts
from . import limits

# duration_ms is a positive integer column (at most 2**31 - 1 on PostgreSQL, about 24.8 days): a run
# recorded long after it started (a conversation imported with its own dates) keeps that ceiling
# rather than failing to be written.
MAX_DURATION_MS = 2**31 - 1


def duration_ms(started_at, ended_at):
    return min(MAX_DURATION_MS, max(0, int((ended_at - started_at).total_seconds() * 1000)))


class Episodes:
    """Episodes: started and appended to as a run goes, or recorded whole when it ends; MemoryService builds it and delegates."""

    def __init__(self, backend, users, recall_index):
        self.backend = backend
        self.users = users
        self.recall_index = recall_index

    def start_episode(
        self, *, agent_id="", user_id=None, session_id="", workflow="", trigger_type="", trigger_input=None
    ):
        user_id = check_user_id("user_id", user_id, required=False)
        with transaction.atomic():
            if user_id is not None:
                self.backend.hold_user(user_id)
                user_id = self.users.resolve_user(user_id).pk
            episode = Episode.objects.create(
                agent_id=clean_text("agent_id", agent_id, required=False, max_length=128),
                user_id=user_id,
                session_id=clean_text("session_id", session_id, required=False, max_length=128),
                workflow=clean_text("workflow", workflow, required=False, max_length=128),
                trigger_type=clean_text("trigger_type", trigger_type, required=False, max_length=50),
                trigger_input=check_json("trigger_input", {} if trigger_input is None else trigger_input),
            )
            limits.enforce_after_create(limits.EPISODES, episode)
        return episode

    def _append_to_episode(self, episode_id, field_name, item):
        with transaction.atomic():
            episode = self._locked_episode(episode_id)
            getattr(episode, field_name).append(item)
            Episode.objects.filter(pk=episode.pk).update(**{field_name: getattr(episode, field_name)})
            if field_name == "conversation":
                self.recall_index.embed_for_recall(RecallKind.EPISODE, [episode.pk])
        return episode

    def _locked_episode(self, episode_id):
        try:
            return Episode.objects.select_for_update().get(pk=episode_id)
        except (Episode.DoesNotExist, ValueError, TypeError):
            raise MemoryNotFound("episode", episode_id) from None

    def add_message(self, episode_id, role, content):
        """Append one message ({"role", "content"}) to an episode's conversation."""
        role = clean_text("role", role, max_length=50)
        check_json("content", content)
        return self._append_to_episode(episode_id, "conversation", {"role": role, "content": content})

    def add_action(self, episode_id, action):
        """Append one action (a tool call and its result, as a JSON object) to an episode."""
        if not isinstance(action, dict):
            raise InvalidMemoryArgument("action", "must be a JSON object")
        check_json("action", action)
        return self._append_to_episode(episode_id, "actions", action)

    def complete_episode(self, episode_id, *, success, final_output=None, error="", summary=""):
        """Close an episode: outcome, end time and duration (computed from its start)."""
        if not isinstance(success, bool):
            raise InvalidMemoryArgument("success", "must be true or false")
        check_json("final_output", final_output)
        with transaction.atomic():
            episode = self._locked_episode(episode_id)
            episode.ended_at = timezone.now()
            episode.duration_ms = duration_ms(episode.started_at, episode.ended_at)
            episode.success = success
            episode.final_output = final_output
            episode.error = clean_text("error", error, required=False)
            episode.summary = clean_text("summary", summary, required=False)
            episode.concepts = episode_concepts(episode.summary, episode.conversation)
            episode.save(
                update_fields=["ended_at", "duration_ms", "success", "final_output", "error", "summary", "concepts"]
            )
            self.recall_index.embed_for_recall(RecallKind.EPISODE, [episode.pk])
        return episode

    def get_episode(self, episode_id):
        try:
            return Episode.objects.get(pk=episode_id)
        except (Episode.DoesNotExist, ValueError, TypeError):
            raise MemoryNotFound("episode", episode_id) from None

    def recent_episodes(self, *, agent_id=None, user_id=None, limit=None):
        """The latest episodes of an agent and/or a user (following merges), newest first."""
        limit = check_limit(limit, memory_settings.RECENT_EPISODES)
        if agent_id is not None:
            agent_id = clean_text("agent_id", agent_id, max_length=128)
        if user_id is not None:
            user_id = check_user_id("user_id", user_id, required=True)
        return self.backend.recent_episodes(agent_id, user_id, limit)

    def record_episode(
        self,
        *,
        started_at,
        agent_id="",
        user_id=None,
        session_id="",
        workflow="",
        trigger_type="",
        trigger_input=None,
        conversation=None,
        actions=None,
        final_output=None,
        success,
        error="",
        summary="",
        replaces_summary="",
    ):
        """Record a finished run as one episode, in one statement (under the surviving user of a merge).

        `replaces_summary`: a conversation's running summary that `summary` supersedes. Earlier episodes of
        the same user and session holding exactly that text lose it, so one episode of a conversation (its
        latest) carries the running summary, instead of every turn's episode repeating it in recall.
        """
        if not isinstance(started_at, datetime):
            raise InvalidMemoryArgument("started_at", "must be a datetime")
        check_utc_range("started_at", started_at)
        if not isinstance(success, bool):
            raise InvalidMemoryArgument("success", "must be true or false")
        for name, value in (("conversation", conversation), ("actions", actions)):
            if value is not None and not isinstance(value, list):
                raise InvalidMemoryArgument(name, "must be a JSON array")
        user_id = check_user_id("user_id", user_id, required=False)
        episode = Episode(
            agent_id=clean_text("agent_id", agent_id, required=False, max_length=128),
            session_id=clean_text("session_id", session_id, required=False, max_length=128),
            workflow=clean_text("workflow", workflow, required=False, max_length=128),
            trigger_type=clean_text("trigger_type", trigger_type, required=False, max_length=50),
            trigger_input=check_json("trigger_input", {} if trigger_input is None else trigger_input),
            conversation=check_json("conversation", conversation or []),
            actions=check_json("actions", actions or []),
            final_output=check_json("final_output", final_output),
            success=success,
            error=clean_text("error", error, required=False),
            summary=clean_text("summary", summary, required=False),
            started_at=started_at,
        )
        episode.concepts = episode_concepts(episode.summary, episode.conversation)
        replaced = clean_text("replaces_summary", replaces_summary, required=False)
        ended_at = timezone.now()
        episode.ended_at = ended_at
        episode.duration_ms = duration_ms(started_at, ended_at)
        episode.user_id = user_id
        with transaction.atomic():
            if user_id is not None:
                check_user_in_workspace("user_id", user_id)
                self.backend.hold_user(user_id)
            self.backend.insert_episode(episode)
            if user_id is not None and episode.user_id is None:  # an unknown user: undo the insert
                raise InvalidMemoryArgument("user_id", f"no memory user with id {user_id}")
            self.recall_index.embed_for_recall(RecallKind.EPISODE, [episode.pk, *self._drop_summary(episode, replaced)])
        return episode

    def _drop_summary(self, episode, replaced):
        """Clear `replaced` from the earlier episodes of `episode`'s user and session; their ids."""
        if not replaced or not episode.session_id or episode.user_id is None:
            return []
        earlier = Episode.objects.filter(
            user_id=episode.user_id, session_id=episode.session_id, summary=replaced
        ).exclude(pk=episode.pk)
        ids = list(earlier.values_list("pk", flat=True))
        if ids:
            # The recall document follows the row (database triggers); the vectors are redone after the commit.
            Episode.objects.filter(pk__in=ids).update(summary="")
        return ids

    def mark_episode_failed(self, episode_id, error):
        """Set an episode's outcome to failed with `error` (a write after the run went wrong)."""
        if not Episode.objects.filter(pk=episode_id).update(success=False, error=clean_text("error", error)):
            raise MemoryNotFound("episode", episode_id)
