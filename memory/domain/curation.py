"""What operators curate: pins on facts and procedures, and people's feedback on episodes. MemoryService delegates to it.

A pin makes a fact or procedure reach every prompt of those who see it, before anything recalled and
whatever the character budget (workflows/graph/memory_access.py). Feedback is a person's rating and
comment on one run, as the admin's episode form edits them.
"""

from django.db import transaction

from ..exceptions import InvalidMemoryArgument, MemoryNotFound
from ..models import Episode, Fact, Procedure
from ..rules.validation import check_bool, check_id_list, check_int, clean_text, make_viewer

PINNABLE = {"fact": Fact, "procedure": Procedure}
MIN_RATING, MAX_RATING = 1, 5
MAX_FEEDBACK_LENGTH = 10_000


class Curation:
    """Pins and feedback; MemoryService builds it and delegates."""

    def __init__(self, backend):
        self.backend = backend

    def pin_memories(self, kind, ids, *, pinned=True, max_ids=None):
        """Pin (or, `pinned` False, unpin) these facts or procedures; (ids changed, ids not found)."""
        model = PINNABLE.get(kind)
        if model is None:
            raise InvalidMemoryArgument("kind", f"must be one of {', '.join(PINNABLE)}; got {kind!r}")
        pinned = check_bool("pinned", pinned)
        ids = check_id_list(ids, max_ids)
        with transaction.atomic():
            found = set(model.objects.filter(pk__in=ids).values_list("pk", flat=True))
            self.backend.set_pinned(model, sorted(found), pinned)
        return sorted(found), [i for i in ids if i not in found]

    def pinned_memories(self, *, agent_id="", user_id=None, session_id=""):
        """(pinned facts the viewer sees, shadowed ones left out; the agent's active pinned procedures)."""
        viewer = make_viewer(agent_id, user_id, session_id)
        return self.backend.pinned_facts(viewer), self.backend.pinned_procedures(viewer.agent_id)

    def episode_feedback(self, episode_id, *, feedback=None, rating=None, clear_rating=False):
        """Set a person's feedback on one episode: `feedback` (text; None keeps it) and `rating`
        (MIN_RATING to MAX_RATING; None keeps it, `clear_rating` removes it). Returns the episode."""
        if feedback is not None:
            feedback = clean_text("feedback", feedback, required=False, max_length=MAX_FEEDBACK_LENGTH)
        if rating is not None:
            rating = check_int("rating", rating, minimum=MIN_RATING, maximum=MAX_RATING)
        if feedback is None and rating is None and not clear_rating:
            raise InvalidMemoryArgument("feedback", "give feedback, a rating, or both")
        with transaction.atomic():
            try:
                episode = Episode.objects.select_for_update().get(pk=episode_id)
            except (Episode.DoesNotExist, ValueError, TypeError):
                raise MemoryNotFound("episode", episode_id) from None
            fields = []
            if feedback is not None:
                episode.human_feedback = feedback
                fields.append("human_feedback")
            if rating is not None or clear_rating:
                episode.human_rating = rating
                fields.append("human_rating")
            episode.save(update_fields=fields)
        return episode
