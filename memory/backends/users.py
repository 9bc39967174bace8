"""The identify path's SQL, shared by the storage backends: a user by identity, the visit, the context.

Every workflow run starts here, so these are hand-written statements built once (compiling the
equivalent ORM querysets took longer than running them). Rows come back as small named tuples with
the attribute names UserContext.of reads.
"""

from collections import namedtuple
from functools import cache

from django.db import DEFAULT_DB_ALIAS, connections
from django.utils import timezone

from ..models import ChannelIdentity, Episode, Fact, MemoryUser, episode_gist
from ..models.workspaces import current_workspace_id
from .rows import Columns, execute, fetch_rows

ContextUser = namedtuple("ContextUser", "pk canonical_id display_name total_conversations")
ContextIdentity = namedtuple("ContextIdentity", "channel external_id")
ContextFact = namedtuple("ContextFact", "key value fact_type confidence")


class ContextEpisode(namedtuple("ContextEpisode", "pk summary success started_at trigger_type conversation")):
    @property
    def gist(self):
        return episode_gist(self.summary, self.conversation)


_USERS = MemoryUser._meta.db_table
_IDENTITIES = ChannelIdentity._meta.db_table
_FACTS = Fact._meta.db_table
_EPISODES = Episode._meta.db_table


def _fields(model, *names):
    return [model._meta.get_field(name) for name in names]


_USER_COLUMNS = Columns(
    _fields(MemoryUser, "id", "canonical_id", "display_name", "total_conversations")
    + _fields(ChannelIdentity, "channel", "external_id")
)
# The identities of the user behind (channel, external id), or of the user it was merged into.
_IDENTITIES_SQL = (
    f"SELECT u.id, u.canonical_id, u.display_name, u.total_conversations, i.channel, i.external_id "
    f"FROM {_IDENTITIES} i JOIN {_USERS} u ON u.id = i.user_id "
    f"WHERE i.user_id = (SELECT COALESCE(v.merged_into_id, v.id) FROM {_IDENTITIES} j "
    f"JOIN {_USERS} v ON v.id = j.user_id WHERE j.channel = %s AND j.external_id = %s{{workspace}}) "
    "ORDER BY i.channel, i.external_id"
)
# Inside a workspace, only its people (memory.models.workspaces): an identity is unique there.
# Unscoped, two workspaces may each know someone by it: the one known first.
_IDENTITIES_SQL_IN_WORKSPACE = _IDENTITIES_SQL.format(workspace=" AND j.workspace_id = %s")
_IDENTITIES_SQL = _IDENTITIES_SQL.format(workspace=" ORDER BY j.id LIMIT 1")
_FACT_COLUMNS = Columns(_fields(Fact, "key", "value", "fact_type", "confidence"))
# Each list carries its total (a window count over the user's rows), so no separate count.
# Only facts that hold now (valid time): a closed value is history, not what the person is now.
_FACTS_SQL = (
    f'SELECT "key", value, fact_type, confidence, COUNT(*) OVER () FROM {_FACTS} '
    "WHERE user_id = %s AND (valid_from IS NULL OR valid_from <= %s) AND (valid_to IS NULL OR valid_to > %s) "
    'ORDER BY confidence DESC, "key" LIMIT %s'
)
_VALID_TO = Fact._meta.get_field("valid_to")
_EPISODE_COLUMNS = Columns(_fields(Episode, "id", "summary", "success", "started_at", "trigger_type", "conversation"))
_EPISODES_SQL = (
    f"SELECT id, summary, success, started_at, trigger_type, conversation, COUNT(*) OVER () FROM {_EPISODES} "
    "WHERE user_id = %s ORDER BY started_at DESC, id DESC LIMIT %s"
)


@cache
def _visit_sql(renamed):
    name = ", display_name = %s" if renamed else ""
    return f"UPDATE {_USERS} SET total_conversations = total_conversations + 1, last_seen = %s{name} WHERE id = %s"


class UserSQL:
    """Mixed into MemoryBackend: the statements MemoryService.identify runs (four, one each)."""

    def identities_of(self, channel, external_id):
        """(ContextUser, [ContextIdentity]) of the surviving user behind an identity, or (None, [])."""
        workspace_id = current_workspace_id()
        if workspace_id is None:
            rows = fetch_rows(_IDENTITIES_SQL, [channel, external_id], _USER_COLUMNS)
        else:
            rows = fetch_rows(_IDENTITIES_SQL_IN_WORKSPACE, [channel, external_id, workspace_id], _USER_COLUMNS)
        if not rows:
            return None, []
        return ContextUser(*rows[0][:4]), [ContextIdentity(*row[4:]) for row in rows]

    def count_visit(self, user_id, when, display_name=None):
        """One more conversation, seen at `when`; `display_name` too when given."""
        conn = connections[DEFAULT_DB_ALIAS]
        params = [MemoryUser._meta.get_field("last_seen").get_db_prep_save(when, conn)]
        if display_name:
            params.append(display_name)
        with conn.cursor() as cursor:
            execute(cursor, _visit_sql(bool(display_name)), [*params, user_id])

    def context_facts(self, user_id, limit):
        """([ContextFact], total) of a user's own facts, most confident first."""
        now = _VALID_TO.get_db_prep_value(timezone.now(), connections[DEFAULT_DB_ALIAS])
        rows = fetch_rows(_FACTS_SQL, [user_id, now, now, limit], _FACT_COLUMNS)
        return [ContextFact(*row[:4]) for row in rows], rows[0][4] if rows else 0

    def context_episodes(self, user_id, limit):
        """([ContextEpisode], total) of a user's episodes, newest first."""
        rows = fetch_rows(_EPISODES_SQL, [user_id, limit], _EPISODE_COLUMNS)
        return [ContextEpisode(*row[:6]) for row in rows], rows[0][6] if rows else 0
