"""Workspaces: tenants. Every memory user, fact, episode, procedure, store item, workflow and thread
belongs to one; a request, an admin page or a workflow run works inside one.

The current workspace is a context variable (set once per request by the API's authentication or
the admin, per run by the workflow runtime, or by `in_workspace` in code). Every model that belongs
to a workspace has `WorkspaceManager` as its default manager: while a workspace is current, its
querysets hold only that workspace's rows, and a new row takes the current workspace as its
default. With no current workspace (management commands, background workers, migrations) the
managers are unscoped: such code acts for every workspace, as it did before workspaces existed.

The scope is one more condition on the same query, read when the query runs (InCurrentWorkspace),
never a query of its own: resolving the workspace of a token is part of the token's lookup
(memory.api.workspaces).
"""

import contextlib
import contextvars

from django.conf import settings
from django.db import models

# Migration 0030 creates this row and moves every row that existed before workspaces into it.
DEFAULT_WORKSPACE_ID = 1

_current = contextvars.ContextVar("engram_workspace", default=None)


def current_workspace_id():
    """The id of the current workspace, or None when no workspace is current (unscoped)."""
    return _current.get()


def workspace_default():
    """A new row's workspace: the current one, else the default workspace (a field default: no query)."""
    current = _current.get()
    return DEFAULT_WORKSPACE_ID if current is None else current


def enter_workspace(workspace_id):
    """Make `workspace_id` (None: unscoped) current; returns the token `leave_workspace` takes."""
    return _current.set(workspace_id)


def leave_workspace(token):
    """Restore the workspace that was current before `enter_workspace` returned `token`."""
    _current.reset(token)


@contextlib.contextmanager
def in_workspace(workspace):
    """Run the block inside `workspace` (a Workspace, its id, or None for unscoped)."""
    token = enter_workspace(getattr(workspace, "pk", workspace))
    try:
        yield
    finally:
        leave_workspace(token)


class Workspace(models.Model):
    """A tenant: one customer's people, memories, workflows and operators, apart from every other's."""

    slug = models.SlugField(max_length=100, unique=True)
    name = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self):
        return self.name or self.slug


def ensure_default_workspace(using="default", apps=None, **kwargs):
    """Put the default workspace back if it is gone (a post_migrate receiver: `flush` empties every
    table, migration 0030's row included, and every new row defaults to it)."""
    from django.core.management.color import no_style
    from django.db import connections

    try:
        model = Workspace if apps is None else apps.get_model("memory", "Workspace")
    except LookupError:  # migrated back to before migration 0030
        return
    if model.objects.using(using).filter(pk=DEFAULT_WORKSPACE_ID).exists():
        return
    model.objects.using(using).create(pk=DEFAULT_WORKSPACE_ID, slug="default", name="Default workspace")
    statements = connections[using].ops.sequence_reset_sql(no_style(), [model])
    if statements:  # PostgreSQL: the next workspace takes an id after the one written here
        with connections[using].cursor() as cursor:
            for sql in statements:
                cursor.execute(sql)


class WorkspaceMember(models.Model):
    """Which workspace a staff account (and so its API tokens and admin session) works in.

    A staff account without a membership works in the default workspace.
    """

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="engram_workspace")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="members")

    class Meta:
        db_table = "memory_workspace_member"

    def __str__(self):
        return f"{self.user} in {self.workspace}"


def workspace_of_user(user):
    """The workspace id a (staff) Django user works in: their membership's, else the default one.

    Reads the membership from the user's cache when the user was loaded with
    `select_related("engram_workspace")` (the token lookup does), so it costs no query then.
    """
    try:
        return user.engram_workspace.workspace_id
    except (WorkspaceMember.DoesNotExist, AttributeError):
        return DEFAULT_WORKSPACE_ID


class InCurrentWorkspace(models.Expression):
    """The condition "this row is of the current workspace", read when the query runs, not when the
    queryset is made: a queryset made at import time (a viewset's `queryset`, a form field's) or in
    another workspace still holds the current workspace's rows only. With no workspace current it is
    `1 = 1` (unscoped)."""

    conditional = True
    output_field = models.BooleanField()

    def __init__(self, lookup):
        super().__init__()
        self.column = models.F(lookup)

    def get_source_expressions(self):
        return [self.column]

    def set_source_expressions(self, exprs):
        (self.column,) = exprs

    def as_sql(self, compiler, connection):
        current = _current.get()
        if current is None:
            return "1 = 1", []
        sql, params = compiler.compile(self.column)
        return f"{sql} = %s", (*params, current)


class WorkspaceManager(models.Manager):
    """The default manager of a model that belongs to a workspace: the current workspace's rows only.

    A model whose workspace is that of a row it points to (a reminder's user's, a run's workflow's)
    names that foreign key in its class attribute `workspace_through`. It is read from the model, not
    given to the manager, because Django builds the related managers (`workflow.runs`) from this class
    without its constructor's arguments.
    """

    @property
    def workspace_lookup(self):
        through = getattr(self.model, "workspace_through", "")
        return f"{through}__workspace_id" if through else "workspace_id"

    def _scoped(self):
        return super().get_queryset().filter(InCurrentWorkspace(self.workspace_lookup))

    def get_queryset(self):
        if self._hints:  # a related manager (`workflow.runs`): made per access, nothing to keep
            return self._scoped()
        # The scoped queryset is built once per database and copied (`all()`) for each query: the
        # condition reads the current workspace when the query runs, so one built earlier is as good,
        # and building it (resolving the condition into the query) was a twentieth of a webhook update.
        # A copy of this manager (`db_manager`) shares the dict, hence the key.
        templates = self.__dict__.setdefault("_scoped_querysets", {})
        template = templates.get(self._db)
        if template is None:
            template = templates[self._db] = self._scoped()
        return template.all()

    def in_workspace(self, workspace):
        """The rows of `workspace` (a Workspace or its id), whatever workspace is current."""
        return super().get_queryset().filter(**{self.workspace_lookup: getattr(workspace, "pk", workspace)})


class UniqueInWorkspace:
    """Mixed into a model whose unique keys end with its workspace. A form (the admin's) never shows
    the workspace, and Django skips a constraint naming a field the form leaves out; the workspace
    is always set (a field default), so it is checked all the same: a name taken in this workspace
    is a form error, not a database error."""

    def validate_constraints(self, exclude=None):
        super().validate_constraints(exclude=None if exclude is None else set(exclude) - {"workspace"})


def workspace_field(related_name):
    """The `workspace` column of a model that belongs to a workspace."""
    return models.ForeignKey(
        Workspace, on_delete=models.PROTECT, default=workspace_default, related_name=related_name, editable=False
    )


def scoped(queryset, condition):
    """`queryset` narrowed to the current workspace by `condition(workspace_id)` (a Q), for a model
    that belongs to a workspace through others (a reminder through its user, an edge of the memory
    graph through its memories); unchanged while no workspace is current."""
    current = _current.get()
    return queryset if current is None else queryset.filter(condition(current))
